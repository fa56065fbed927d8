//! The tcp-style RDMA client and server this stream replaces, ported:
//! the server accepts, reads up to 40 bytes and answers; the client
//! connects, writes "hello from client!" and reads the answer. Nothing is
//! registered per call: each side registers its buffers once, when it
//! connects.
//!
//! ```text
//! cargo run --example stream_hello                                       # soft device, one process
//! cargo run --example stream_hello -- --device rxe0 --listen 127.0.0.1:7482    # server
//! cargo run --example stream_hello -- --device rxe0 --connect 127.0.0.1:7482   # client
//! ```

mod device_choice;
mod one_process;

use std::io::{Read, Write};
use std::process::ExitCode;

use rdma_ring::backend::soft::SoftDevice;
use rdma_ring::backend::QueuePair;
use rdma_ring::stream::{RdmaStream, StreamConfig};

const USAGE: &str = "usage: stream_hello [--device soft|NAME] [--listen ADDR | --connect ADDR]";
const CLIENT_SAYS: &[u8] = b"hello from client!";
const SERVER_SAYS: &[u8] = b"hello from server!";

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() -> ExitCode {
    match run() {
        Ok(()) => {
            println!("stream_hello: all checks passed");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("stream_hello: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut device, mut listen_at, mut connect_to) = (None::<String>, None, None);
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| {
            args.next()
                .ok_or_else(|| format!("{flag} needs a value; {USAGE}"))
        };
        match arg.as_str() {
            "--device" => device = Some(value("--device")?),
            "--listen" => listen_at = Some(value("--listen")?),
            "--connect" => connect_to = Some(value("--connect")?),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}; {USAGE}").into()),
        }
    }
    match (listen_at, connect_to) {
        (None, None) => {
            if let Some(name) = device.as_deref().filter(|&d| d != "soft") {
                return Err(format!(
                    "one process runs on the soft device only; for {name} use --listen and --connect"
                )
                .into());
            }
            println!("device: soft (in-process)");
            let (client, server) =
                RdmaStream::soft_pair(&SoftDevice::new(), StreamConfig::default())?;
            // Each side owns its end, so a side that fails closes it on the
            // way out and the other's read fails at once.
            let server = std::thread::spawn(move || server_main(server));
            let client = client_main(client);
            one_process::verdict(("server", server.join()), ("client", client)).map(|_| ())
        }
        (Some(addr), None) => listen(device.as_deref(), &addr),
        (None, Some(addr)) => connect(device.as_deref(), &addr),
        _ => Err(format!("--listen and --connect exclude each other; {USAGE}").into()),
    }
}

/// `device`, or without one the first RDMA device, saying so.
#[cfg(feature = "verbs")]
fn open(device: Option<&str>) -> Result<rdma_ring::backend::verbs::VerbsDevice> {
    let name = device_choice::for_address(device, USAGE, "")?;
    Ok(rdma_ring::backend::verbs::VerbsDevice::open(&name)?)
}

#[cfg(feature = "verbs")]
fn listen(device: Option<&str>, addr: &str) -> Result<()> {
    let dev = open(device)?;
    let listener = rdma_ring::stream::RdmaListener::bind_with(addr, &dev, StreamConfig::default())?;
    println!("device: {}; server listening on {addr}", dev.name());
    server_main(listener.accept()?)
}

#[cfg(feature = "verbs")]
fn connect(device: Option<&str>, addr: &str) -> Result<()> {
    let dev = open(device)?;
    println!("device: {}; client connecting to {addr}", dev.name());
    client_main(RdmaStream::connect_with(
        addr,
        &dev,
        StreamConfig::default(),
    )?)
}

#[cfg(not(feature = "verbs"))]
fn listen(_: Option<&str>, _: &str) -> Result<()> {
    Err("built without the verbs feature: only the soft device".into())
}

#[cfg(not(feature = "verbs"))]
fn connect(_: Option<&str>, _: &str) -> Result<()> {
    Err("built without the verbs feature: only the soft device".into())
}

fn server_main<Q: QueuePair>(mut stream: RdmaStream<Q>) -> Result<()> {
    let mut buf = [0u8; 40];
    let n = stream.read(&mut buf)?;
    println!(
        "server read {n} bytes: {:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    if &buf[..n] != CLIENT_SAYS {
        return Err("the server read something else".into());
    }
    stream.write_all(SERVER_SAYS)?;
    stream.flush()?;
    Ok(())
}

fn client_main<Q: QueuePair>(mut stream: RdmaStream<Q>) -> Result<()> {
    stream.write_all(CLIENT_SAYS)?;
    stream.flush()?;
    let mut buf = [0u8; 40];
    let n = stream.read(&mut buf)?;
    println!(
        "client read {n} bytes: {:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    if &buf[..n] != SERVER_SAYS {
        return Err("the client read something else".into());
    }
    Ok(())
}
