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

mod lab_common;

use std::process::ExitCode;

use lab_common::Result;

fn main() -> ExitCode {
    lab_common::finish("lab_server", run())
}

fn run() -> Result<()> {
    let Some(args) = lab_common::args()? else {
        return Ok(());
    };
    match &args.listen {
        None if args.device == "soft" => lab_common::both_on_soft(),
        None => Err(format!(
            "--listen ADDR is needed with a device; {}",
            lab_common::USAGE
        )
        .into()),
        Some(addr) => {
            let builder = lab_common::builder(&args);
            if args.cm {
                let listener = builder.bind_cm(addr.parse()?)?;
                println!("rdma_cm: listening on {addr}");
                let session = listener.accept()?;
                futures::executor::block_on(lab_common::server(&session))
            } else {
                println!("device: {}; listening on {addr}", args.device);
                let session = builder.listen(addr.as_str())?;
                futures::executor::block_on(lab_common::server(&session))
            }
        }
    }
}
