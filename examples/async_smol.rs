//! The async quickstart on smol, woken by async-io's reactor: the
//! completion channel's descriptor goes to `Async`, and a small task
//! drives each ring whenever it is readable (and ticks it on a timer).
//!
//! ```text
//! cargo run --example async_smol [-- --device soft|NAME]
//! ```

mod async_common;

use std::process::ExitCode;
use std::time::Duration;

use async_common::Endpoints;
use rdma_ring::backend::{ProtectionDomain, QueuePair};
use rdma_ring::future::{AsyncRing, Wakeup};
use smol::stream::StreamExt;
use smol::Async;

fn spawn_driver<Q: QueuePair + Send + 'static>(ring: &AsyncRing<Q>) -> smol::Task<()> {
    let driver = ring.driver();
    let fd = Async::new(
        driver
            .completion_fd()
            .expect("the backend has a completion channel"),
    )
    .expect("registering the completion channel with async-io");
    smol::spawn(async move {
        // The ring's idle-time work raises no completion event: a timer
        // runs it (see `AsyncRing::tick`).
        let mut ticks = smol::Timer::interval(Duration::from_millis(100));
        loop {
            let readable = async { Some(fd.readable().await) };
            let tick = async {
                ticks.next().await;
                None
            };
            match smol::future::or(readable, tick).await {
                Some(Ok(())) => {
                    // An error is reported, not the end: a driver that
                    // stopped would strand every pending future. A pause
                    // keeps a channel that stays readable (its device
                    // gone) from spinning.
                    if let Err(e) = driver.drive() {
                        eprintln!("driving the ring: {e}");
                        smol::Timer::after(Duration::from_millis(10)).await;
                    }
                }
                // The reactor lost the descriptor: the ring is still
                // driven, on the timer alone, so no future is stranded.
                Some(Err(e)) => {
                    eprintln!("watching the completion channel: {e}; driving on a timer");
                    loop {
                        ticks.next().await;
                        if let Err(e) = driver.drive() {
                            eprintln!("driving the ring: {e}");
                        }
                        driver.tick();
                    }
                }
                None => driver.tick(),
            }
        }
    })
}

async fn run<P: ProtectionDomain, Q: QueuePair + Send + 'static>(
    e: Endpoints<P, Q>,
) -> Result<(), String> {
    let drivers = [spawn_driver(&e.a), spawn_driver(&e.b)];
    let result = async_common::exercise(&e).await;
    drop(drivers); // cancels the driver tasks
    result
}

async fn main_async() -> Result<(), String> {
    let device = async_common::device_arg("async_smol")?;
    println!("device: {device}; executor: smol, woken through async-io's Async");
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

fn main() -> ExitCode {
    match smol::block_on(main_async()) {
        Ok(()) => {
            println!("async_smol: all checks passed");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("async_smol: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
