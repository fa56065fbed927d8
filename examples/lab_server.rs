//! The server of the lab manual's exercises 4.1–4.5 on sessions: it
//! receives a message, a message with immediate data, reads a region the
//! client lent it, and checks the regions the client wrote — each step
//! checked and printed.
//!
//! ```text
//! cargo run --example lab_server                                            # soft device, both sides
//! cargo run --example lab_server -- --device rxe0 --listen 127.0.0.1:7500   # TCP handshake
//! cargo run --example lab_server -- --cm --listen 10.99.0.1:7501            # rdma_cm
//! ```
//! and [`lab_client`](lab_client.rs) on the other side.

mod device_choice;
mod lab_common;
mod one_process;

use std::process::ExitCode;

use lab_common::{Result, Side};

fn main() -> ExitCode {
    lab_common::finish("lab_server", run())
}

fn run() -> Result<()> {
    let args = lab_common::args(Side::Server)?;
    let Some(addr) = &args.addr else {
        return lab_common::both_on_soft();
    };
    if args.cm {
        let listener = lab_common::cm_builder(&args).bind_cm(addr.parse()?)?;
        println!("rdma_cm: listening on {addr}");
        // A peer that fails its handshake is dropped; a fault of ours
        // (the device went away) ends the run.
        let session = loop {
            match listener.accept() {
                Err(e) if e.is_peer_failure() => println!("a peer failed its handshake: {e}"),
                done => break done?,
            }
        };
        futures::executor::block_on(lab_common::server(&session))
    } else {
        let (builder, device) = lab_common::device_builder(&args)?;
        println!("device: {device}; listening on {addr}");
        let session = builder.listen(addr.as_str())?;
        futures::executor::block_on(lab_common::server(&session))
    }
}
