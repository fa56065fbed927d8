//! The client of the lab manual's exercises 4.1–4.5 on sessions: it sends
//! a message, a message with immediate data, lends a region for the
//! server to read, writes a region it requested, and writes one with
//! immediate data — each step checked and printed.
//!
//! ```text
//! cargo run --example lab_client                                             # soft device, both sides
//! cargo run --example lab_client -- --device rxe0 --connect 127.0.0.1:7500   # TCP handshake
//! cargo run --example lab_client -- --cm --connect 10.99.0.1:7501            # rdma_cm
//! ```

mod device_choice;
mod lab_common;
mod one_process;

use std::process::ExitCode;

use lab_common::{Result, Side};

fn main() -> ExitCode {
    lab_common::finish("lab_client", run())
}

fn run() -> Result<()> {
    let args = lab_common::args(Side::Client)?;
    let Some(addr) = &args.addr else {
        return lab_common::both_on_soft();
    };
    if args.cm {
        println!("rdma_cm: connecting to {addr}");
        let session = lab_common::cm_builder(&args).connect_cm(addr.parse()?)?;
        futures::executor::block_on(lab_common::client(&session))
    } else {
        let (builder, device) = lab_common::device_builder(&args)?;
        println!("device: {device}; connecting to {addr}");
        let session = builder.connect(addr.as_str())?;
        futures::executor::block_on(lab_common::client(&session))
    }
}
