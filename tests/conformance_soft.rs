//! The conformance suite on the soft device.

mod conformance;

use conformance::Fabric;
use rdma_ring::backend::soft::{SoftDevice, SoftPd, SoftQp};
use rdma_ring::backend::QpConfig;

struct Soft {
    dev: SoftDevice,
    pd: SoftPd,
}

impl Soft {
    fn new() -> Soft {
        let dev = SoftDevice::new();
        let pd = dev.alloc_pd();
        Soft { dev, pd }
    }
}

impl Fabric for Soft {
    type Qp = SoftQp;
    type Pd = SoftPd;
    fn pd(&self) -> &SoftPd {
        &self.pd
    }
    fn pair(&self, config: QpConfig) -> (SoftQp, SoftQp) {
        self.dev.connected_pair(&self.pd, &self.pd, config).unwrap()
    }
}

conformance_tests!(Soft::new());
