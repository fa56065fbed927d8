//! The async quickstart on `futures::executor::block_on`, which has no
//! reactor: a small notifier thread per ring blocks on the completion
//! channel and wakes the tasks.
//!
//! ```text
//! cargo run --example async_block_on
//! ```

mod async_common;

use rdma_ring::future::Wakeup;

fn main() -> std::process::ExitCode {
    println!("device: soft (in-process software RC device); executor: futures::executor::block_on, woken by a notifier thread");
    let result = futures::executor::block_on(async {
        let endpoints = async_common::endpoints(Wakeup::Thread)?;
        async_common::exercise(&endpoints).await
    });
    match result {
        Ok(()) => {
            println!("async_block_on: all checks passed");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("async_block_on: FAILED: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
