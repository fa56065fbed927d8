//! The async quickstart on tokio, woken by the reactor: the completion
//! channel's descriptor goes to `AsyncFd`, and a small task drives the
//! ring whenever it is readable.
//!
//! ```text
//! cargo run --example async_tokio
//! ```

mod async_common;

use rdma_ring::backend::soft::SoftQp;
use rdma_ring::future::{AsyncRing, Wakeup};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

fn spawn_driver(ring: &AsyncRing<SoftQp>) -> tokio::task::JoinHandle<()> {
    let driver = ring.driver();
    let channel = driver
        .completion_fd()
        .expect("the soft device has a completion channel");
    // SAFETY: a `CompletionFd` keeps its channel (and so the descriptor)
    // open for as long as it lives, and always reports the same descriptor.
    let fd = unsafe { AsyncFd::register_with_interest(channel, Interest::READABLE) }
        .map_err(|e| e.to_string())
        .expect("registering the completion channel with tokio");
    tokio::spawn(async move {
        loop {
            let Ok(mut ready) = fd.readable().await else {
                return;
            };
            if driver.drive().is_err() {
                return;
            }
            ready.clear_ready();
        }
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    println!(
        "device: soft (in-process software RC device); executor: tokio, woken through AsyncFd"
    );
    let endpoints = match async_common::endpoints(Wakeup::Reactor) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("async_tokio: FAILED: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let drivers = [spawn_driver(&endpoints.a), spawn_driver(&endpoints.b)];
    let result = async_common::exercise(&endpoints).await;
    for d in drivers {
        d.abort();
    }
    match result {
        Ok(()) => {
            println!("async_tokio: all checks passed");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("async_tokio: FAILED: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
