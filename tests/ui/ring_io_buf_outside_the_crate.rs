// IoBuf is sealed: memory of your own comes in through StableBufMut and a
// registration, never as a type that names its own address and key. Its
// supertrait is out of reach, so no type outside the crate can be one.
struct Mine;

impl rdma_ring::buf::sealed::Sealed for Mine {}

fn main() {}
