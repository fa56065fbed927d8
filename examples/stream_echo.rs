//! An echo server and client over the RDMA byte stream: the client sends
//! messages of many sizes (1 byte to 256 KiB, about 4 MB in all), the
//! server writes every byte back, and the client checks each echo. Then
//! the client ends its half of the stream and checks that the server's
//! end follows.
//!
//! ```text
//! cargo run --example stream_echo                                   # soft device, one process
//! cargo run --example stream_echo -- --device rxe0 --listen 127.0.0.1:7480    # server
//! cargo run --example stream_echo -- --device rxe0 --connect 127.0.0.1:7480   # client
//! cargo run --example stream_echo -- --cm --listen 10.99.0.1:7481             # over rdma_cm
//! cargo run --example stream_echo -- --cm --connect 10.99.0.1:7481
//! ```

mod device_choice;
mod one_process;

use std::io::{Read, Write};
use std::net::Shutdown;
use std::process::ExitCode;
use std::time::Instant;

use rdma_ring::backend::soft::SoftDevice;
use rdma_ring::stream::{RdmaStream, StreamConfig};

const USAGE: &str =
    "usage: stream_echo [--device soft|NAME] [--cm] [--listen ADDR | --connect ADDR]";

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() -> ExitCode {
    match run() {
        Ok(()) => {
            println!("stream_echo: all checks passed");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("stream_echo: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

struct Args {
    /// `None`: the soft device without an address, the first RDMA device
    /// with one.
    device: Option<String>,
    cm: bool,
    listen: Option<String>,
    connect: Option<String>,
}

fn parse() -> Result<Args> {
    let mut args = std::env::args().skip(1);
    let mut parsed = Args {
        device: None,
        cm: false,
        listen: None,
        connect: None,
    };
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| {
            args.next()
                .ok_or_else(|| format!("{flag} needs a value; {USAGE}"))
        };
        match arg.as_str() {
            "--device" => parsed.device = Some(value("--device")?),
            "--cm" => parsed.cm = true,
            "--listen" => parsed.listen = Some(value("--listen")?),
            "--connect" => parsed.connect = Some(value("--connect")?),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}; {USAGE}").into()),
        }
    }
    match (&parsed.listen, &parsed.connect, parsed.device.as_deref()) {
        (None, None, Some(name)) if name != "soft" => Err(format!(
            "one process runs on the soft device only; for {name} use --listen and --connect"
        )
        .into()),
        (None, None, _) if parsed.cm => {
            Err(format!("--cm needs --listen or --connect; {USAGE}").into())
        }
        (_, _, Some(name)) if parsed.cm => Err(format!(
            "--device {name} does not apply to --cm: rdma_cm uses the device that routes to the address; {USAGE}"
        )
        .into()),
        _ => Ok(parsed),
    }
}

fn run() -> Result<()> {
    let args = parse()?;
    let config = StreamConfig::default();
    match (&args.listen, &args.connect) {
        (None, None) => {
            println!("device: soft (in-process); server and client in one process");
            let (client, server) = RdmaStream::soft_pair(&SoftDevice::new(), config)?;
            // Each side owns its end, so a side that fails closes it on the
            // way out and the other's read fails at once.
            let server = std::thread::spawn(move || serve(server));
            let client = client_session(client);
            one_process::verdict(("server", server.join()), ("client", client)).map(|_| ())
        }
        (Some(addr), None) => listen(&args, addr, config),
        (None, Some(addr)) => connect(&args, addr, config),
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
fn listen(args: &Args, addr: &str, config: StreamConfig) -> Result<()> {
    use rdma_ring::stream::{RdmaCmListener, RdmaListener};
    if args.cm {
        let listener = RdmaCmListener::bind(addr.parse()?, config)?;
        println!("listening over rdma_cm on {addr}");
        serve(listener.accept()?)
    } else {
        let dev = open(args.device.as_deref())?;
        let listener = RdmaListener::bind_with(addr, &dev, config)?;
        println!(
            "device: {}; listening on {addr} (TCP handshake)",
            dev.name()
        );
        serve(listener.accept()?)
    }
}

#[cfg(feature = "verbs")]
fn connect(args: &Args, addr: &str, config: StreamConfig) -> Result<()> {
    if args.cm {
        println!("connecting over rdma_cm to {addr}");
        client_session(RdmaStream::connect_cm(addr.parse()?, config)?)
    } else {
        let dev = open(args.device.as_deref())?;
        println!(
            "device: {}; connecting to {addr} (TCP handshake)",
            dev.name()
        );
        client_session(RdmaStream::connect_with(addr, &dev, config)?)
    }
}

#[cfg(not(feature = "verbs"))]
fn listen(_: &Args, _: &str, _: StreamConfig) -> Result<()> {
    Err("built without the verbs feature: only the soft device".into())
}

#[cfg(not(feature = "verbs"))]
fn connect(_: &Args, _: &str, _: StreamConfig) -> Result<()> {
    Err("built without the verbs feature: only the soft device".into())
}

/// Echoes every byte until the client ends its half, then ends ours.
fn serve<Q: rdma_ring::backend::QueuePair>(mut stream: RdmaStream<Q>) -> Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        stream.write_all(&buf[..n])?;
        stream.flush()?;
        total += n as u64;
    }
    stream.shutdown(Shutdown::Write)?;
    println!("server: echoed {total} bytes, then the end of stream");
    Ok(())
}

fn client_session<Q: rdma_ring::backend::QueuePair>(mut stream: RdmaStream<Q>) -> Result<()> {
    let started = Instant::now();
    let mut total = 0usize;
    let mut sizes = vec![1usize, 2, 7, 64, 100, 1000, 4096, 65535, 65536, 65537];
    sizes.extend((0..6).map(|i| 256 * 1024 - i * 1000));
    sizes.extend((1..=64).map(|i| i * 1013));
    for (i, &size) in sizes.iter().enumerate() {
        let message: Vec<u8> = (0..size)
            .map(|j| (j as u8).wrapping_mul(13).wrapping_add(i as u8))
            .collect();
        stream.write_all(&message)?;
        stream.flush()?;
        let mut echo = vec![0u8; size];
        stream.read_exact(&mut echo)?;
        if echo != message {
            return Err(format!("message {i} of {size} bytes came back different").into());
        }
        total += size;
    }
    stream.shutdown(Shutdown::Write)?;
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest)?;
    if !rest.is_empty() {
        return Err(format!("{} unexpected bytes after the last echo", rest.len()).into());
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "client: {} messages, {total} bytes echoed intact in {secs:.2} s ({:.1} MB/s each way); \
         the server's end of stream arrived; doorbells {}",
        sizes.len(),
        total as f64 / secs / 1e6,
        stream.ring_stats().doorbells
    );
    Ok(())
}
