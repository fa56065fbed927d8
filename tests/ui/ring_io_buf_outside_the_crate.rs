// IoBuf is sealed: memory of your own comes in through StableBufMut and a
// registration, never as a type that names its own address and key.
use rdma_ring::buf::IoBuf;

struct Mine;

impl IoBuf for Mine {}

fn main() {}
