//! The conformance suite on the soft device.

mod conformance;

use conformance::Fabric;
use rdma_ring::backend::soft::{SoftAsyncEvents, SoftCq, SoftDevice, SoftPd, SoftQp, SoftSrq};
use rdma_ring::backend::{QpConfig, SrqConfig};

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
    type Events = SoftAsyncEvents;
    fn pd(&self) -> &SoftPd {
        &self.pd
    }
    fn pair(&self, config: QpConfig) -> (SoftQp, SoftQp) {
        self.dev.connected_pair(&self.pd, &self.pd, config).unwrap()
    }
    fn cq(&self, entries: u32) -> SoftCq {
        self.dev.create_cq(entries).unwrap()
    }
    fn srq(&self, config: SrqConfig) -> SoftSrq {
        self.dev.create_srq(&self.pd, config).unwrap()
    }
    fn pair_on(&self, cq: &SoftCq, srq: Option<&SoftSrq>, config: QpConfig) -> (SoftQp, SoftQp) {
        let a = self.dev.create_qp_on(&self.pd, cq, srq, config).unwrap();
        let b = self.dev.create_qp(&self.pd, config).unwrap();
        self.dev.connect(&a, &b).unwrap();
        (a, b)
    }
    fn qp_on(
        &self,
        cq: &SoftCq,
        srq: Option<&SoftSrq>,
        config: QpConfig,
    ) -> Result<SoftQp, rdma_ring::Error> {
        self.dev.create_qp_on(&self.pd, cq, srq, config)
    }
    fn events(&self) -> SoftAsyncEvents {
        self.dev.async_events().unwrap()
    }
}

conformance_tests!(Soft::new());
