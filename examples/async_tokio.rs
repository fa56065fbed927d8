//! The async quickstart on tokio, woken by the reactor: the completion
//! channel's descriptor goes to `AsyncFd`, and a small task drives each
//! ring whenever it is readable (and ticks it on a timer).
//!
//! ```text
//! cargo run --example async_tokio [-- --device soft|NAME]
//! ```

mod async_common;

use std::process::ExitCode;
use std::time::Duration;

use async_common::Endpoints;
use rdma_ring::backend::{ProtectionDomain, QueuePair};
use rdma_ring::future::{AsyncRing, Wakeup};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

fn spawn_driver<Q: QueuePair + Send + 'static>(ring: &AsyncRing<Q>) -> tokio::task::JoinHandle<()> {
    let driver = ring.driver();
    let channel = driver
        .completion_fd()
        .expect("the backend has a completion channel");
    // SAFETY: a `CompletionFd` keeps its channel (and so the descriptor)
    // open for as long as it lives, and always reports the same descriptor.
    let fd = unsafe { AsyncFd::register_with_interest(channel, Interest::READABLE) }
        .map_err(|e| e.to_string())
        .expect("registering the completion channel with tokio");
    tokio::spawn(async move {
        // The ring's idle-time work raises no completion event: a timer
        // runs it (see `AsyncRing::tick`).
        let mut timer = tokio::time::interval(Duration::from_millis(100));
        loop {
            tokio::select! {
                ready = fd.readable() => {
                    let mut ready = match ready {
                        Ok(ready) => ready,
                        // The reactor lost the descriptor: the ring is
                        // still driven, on the timer alone, so no future
                        // is stranded.
                        Err(e) => {
                            eprintln!("watching the completion channel: {e}; driving on a timer");
                            loop {
                                timer.tick().await;
                                if let Err(e) = driver.drive() {
                                    eprintln!("driving the ring: {e}");
                                }
                                driver.tick();
                            }
                        }
                    };
                    // An error is reported, not the end: a driver that
                    // stopped would strand every pending future. A pause
                    // keeps a channel that stays readable (its device
                    // gone) from spinning.
                    if let Err(e) = driver.drive() {
                        eprintln!("driving the ring: {e}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    ready.clear_ready();
                }
                _ = timer.tick() => driver.tick(),
            }
        }
    })
}

async fn run<P: ProtectionDomain, Q: QueuePair + Send + 'static>(
    e: Endpoints<P, Q>,
) -> Result<(), String> {
    let drivers = [spawn_driver(&e.a), spawn_driver(&e.b)];
    let result = async_common::exercise(&e).await;
    for d in drivers {
        d.abort();
    }
    result
}

async fn main_async() -> Result<(), String> {
    let device = async_common::device_arg("async_tokio")?;
    println!("device: {device}; executor: tokio, woken through AsyncFd");
    if device == "soft" {
        return run(async_common::endpoints(Wakeup::Reactor)?).await;
    }
    #[cfg(feature = "verbs")]
    return run(async_common::verbs_endpoints(&device, Wakeup::Reactor)?).await;
    #[cfg(not(feature = "verbs"))]
    Err(format!(
        "device {device:?}: this build has no verbs backend"
    ))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match main_async().await {
        Ok(()) => {
            println!("async_tokio: all checks passed");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("async_tokio: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
