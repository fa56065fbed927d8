//! The async quickstart on `futures::executor::block_on`, which has no
//! reactor: a small notifier thread per ring blocks on the completion
//! channel and wakes the tasks.
//!
//! ```text
//! cargo run --example async_block_on [-- --device soft|NAME]
//! ```

mod async_common;

use std::process::ExitCode;

use rdma_ring::future::Wakeup;

async fn main_async() -> Result<(), String> {
    let device = async_common::device_arg("async_block_on")?;
    println!("device: {device}; executor: futures::executor::block_on, woken by a notifier thread");
    if device == "soft" {
        return async_common::exercise(&async_common::endpoints(Wakeup::Thread)?).await;
    }
    #[cfg(feature = "verbs")]
    return async_common::exercise(&async_common::verbs_endpoints(&device, Wakeup::Thread)?).await;
    #[cfg(not(feature = "verbs"))]
    Err(format!(
        "device {device:?}: this build has no verbs backend"
    ))
}

fn main() -> ExitCode {
    match futures::executor::block_on(main_async()) {
        Ok(()) => {
            println!("async_block_on: all checks passed");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("async_block_on: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
