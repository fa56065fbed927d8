//! The async quickstart on smol, woken by async-io's reactor: the
//! completion channel's descriptor goes to `Async`, and a small task
//! drives the ring whenever it is readable.
//!
//! ```text
//! cargo run --example async_smol
//! ```

mod async_common;

use rdma_ring::backend::soft::SoftQp;
use rdma_ring::future::{AsyncRing, Wakeup};
use smol::Async;

fn spawn_driver(ring: &AsyncRing<SoftQp>) -> smol::Task<()> {
    let driver = ring.driver();
    let fd = Async::new(
        driver
            .completion_fd()
            .expect("the soft device has a completion channel"),
    )
    .expect("registering the completion channel with async-io");
    smol::spawn(async move {
        loop {
            if fd.readable().await.is_err() || driver.drive().is_err() {
                return;
            }
        }
    })
}

fn main() -> std::process::ExitCode {
    println!("device: soft (in-process software RC device); executor: smol, woken through async-io's Async");
    let result = smol::block_on(async {
        let endpoints = async_common::endpoints(Wakeup::Reactor)?;
        let drivers = [spawn_driver(&endpoints.a), spawn_driver(&endpoints.b)];
        let result = async_common::exercise(&endpoints).await;
        drop(drivers); // cancels the driver tasks
        result
    });
    match result {
        Ok(()) => {
            println!("async_smol: all checks passed");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("async_smol: FAILED: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
