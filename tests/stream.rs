//! The byte stream on the soft device.

use rdma_ring::backend::soft::SoftDevice;
use rdma_ring::stream::{RdmaStream, StreamConfig};
use std::io::{Read, Write};

#[test]
fn smoke() {
    let dev = SoftDevice::new();
    let (mut a, mut b) = RdmaStream::soft_pair(&dev, StreamConfig::default()).unwrap();
    a.write_all(b"hello from client!").unwrap();
    let mut got = [0u8; 18];
    b.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"hello from client!");
}
