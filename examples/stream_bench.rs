//! The byte stream's transfer test, shaped like librdmacm's `rstream`, so
//! the two compare side by side: for each of `-C` transfers the client
//! writes `-S` bytes, the server reads them and writes them back, the
//! client reads them. It prints rstream's columns (Gb/s counts both
//! directions, µs per one-way transfer). `--tcp` runs the same loop over
//! `std::net::TcpStream`.
//!
//! ```text
//! stream_bench --cm --listen 10.99.0.1:7490 -S 65536 -C 1000     # server
//! stream_bench --cm --connect 10.99.0.1:7490 -S 65536 -C 1000    # client
//! stream_bench --device rxe0 --listen 127.0.0.1:7491 ...          # TCP handshake
//! stream_bench --tcp --listen 127.0.0.1:7492 ...                  # plain TCP
//! stream_bench -S 64 -C 10000                                     # soft device, one process
//! ```

mod device_choice;
mod one_process;

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Instant;

use rdma_ring::backend::soft::SoftDevice;
use rdma_ring::stream::{RdmaStream, StreamConfig};

const USAGE: &str = "usage: stream_bench [--device soft|NAME | --cm | --tcp] \
                     [--listen ADDR | --connect ADDR] [-S BYTES] [-C TRANSFERS]";

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stream_bench: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Clone)]
struct Args {
    /// `None`: the soft device without an address, the first RDMA device
    /// with one.
    device: Option<String>,
    cm: bool,
    tcp: bool,
    listen: Option<String>,
    connect: Option<String>,
    size: usize,
    count: usize,
}

fn parse() -> Result<Args> {
    let mut args = std::env::args().skip(1);
    let mut parsed = Args {
        device: None,
        cm: false,
        tcp: false,
        listen: None,
        connect: None,
        size: 65536,
        count: 1000,
    };
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| {
            args.next()
                .ok_or_else(|| format!("{flag} needs a value; {USAGE}"))
        };
        match arg.as_str() {
            "--device" => parsed.device = Some(value("--device")?),
            "--cm" => parsed.cm = true,
            "--tcp" => parsed.tcp = true,
            "--listen" => parsed.listen = Some(value("--listen")?),
            "--connect" => parsed.connect = Some(value("--connect")?),
            "-S" => parsed.size = value("-S")?.parse().map_err(|e| format!("-S: {e}"))?,
            "-C" => parsed.count = value("-C")?.parse().map_err(|e| format!("-C: {e}"))?,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}; {USAGE}").into()),
        }
    }
    if parsed.size == 0 || parsed.count == 0 {
        return Err("-S and -C must be at least 1".into());
    }
    // Every transport flag must be heard: a run that silently fell back to
    // another transport would print figures for the wrong one.
    let addressed = parsed.listen.is_some() || parsed.connect.is_some();
    let device = parsed.device.as_deref();
    if parsed.tcp && (parsed.cm || device.is_some()) {
        return Err(format!("--tcp excludes --cm and --device; {USAGE}").into());
    }
    if parsed.cm && device.is_some() {
        return Err(format!(
            "--device does not apply to --cm: rdma_cm uses the device that routes to the address; {USAGE}"
        )
        .into());
    }
    if !addressed && (parsed.tcp || parsed.cm || device.is_some_and(|d| d != "soft")) {
        return Err(format!(
            "--tcp, --cm and --device NAME need --listen or --connect: one process runs on the soft device only; {USAGE}"
        )
        .into());
    }
    Ok(parsed)
}

fn run() -> Result<()> {
    let args = parse()?;
    let name = if args.tcp {
        "tcp"
    } else if args.cm {
        "rdma-ring/cm"
    } else {
        "rdma-ring"
    };
    match (&args.listen, &args.connect) {
        (None, None) => {
            let (client, server) =
                RdmaStream::soft_pair(&SoftDevice::new(), StreamConfig::default())?;
            let server_args = args.clone();
            // Each side owns its end, so a side that fails closes it on the
            // way out and the other's read fails at once.
            let server = std::thread::spawn(move || serve(server, &server_args));
            let client = client_loop(client, &args, "rdma-ring/soft");
            one_process::verdict(("server", server.join()), ("client", client)).map(|_| ())
        }
        (Some(addr), None) if args.tcp => {
            let listener = std::net::TcpListener::bind(addr)?;
            let (stream, _) = listener.accept()?;
            stream.set_nodelay(true)?;
            serve(stream, &args)
        }
        (None, Some(addr)) if args.tcp => {
            let stream = std::net::TcpStream::connect(addr)?;
            stream.set_nodelay(true)?;
            client_loop(stream, &args, name)
        }
        (Some(addr), None) => verbs::listen(&args, addr),
        (None, Some(addr)) => verbs::connect(&args, addr, name),
        _ => Err(format!("--listen and --connect exclude each other; {USAGE}").into()),
    }
}

#[cfg(feature = "verbs")]
mod verbs {
    use super::*;
    use rdma_ring::backend::verbs::VerbsDevice;
    use rdma_ring::stream::{RdmaCmListener, RdmaListener};

    /// `--device`, or without it the first RDMA device, saying so.
    fn open(args: &Args) -> Result<VerbsDevice> {
        let name =
            device_choice::for_address(args.device.as_deref(), USAGE, "use --cm or --tcp, ")?;
        Ok(VerbsDevice::open(&name)?)
    }

    pub fn listen(args: &Args, addr: &str) -> Result<()> {
        if args.cm {
            let listener = RdmaCmListener::bind(addr.parse()?, StreamConfig::default())?;
            serve(listener.accept()?, args)
        } else {
            let dev = open(args)?;
            let listener = RdmaListener::bind_with(addr, &dev, StreamConfig::default())?;
            serve(listener.accept()?, args)
        }
    }

    pub fn connect(args: &Args, addr: &str, name: &str) -> Result<()> {
        if args.cm {
            let stream = RdmaStream::connect_cm(addr.parse()?, StreamConfig::default())?;
            client_loop(stream, args, name)
        } else {
            let dev = open(args)?;
            let stream = RdmaStream::connect_with(addr, &dev, StreamConfig::default())?;
            client_loop(stream, args, name)
        }
    }
}

#[cfg(not(feature = "verbs"))]
mod verbs {
    use super::*;

    pub fn listen(_: &Args, _: &str) -> Result<()> {
        Err("built without the verbs feature: only the soft device and --tcp".into())
    }

    pub fn connect(_: &Args, _: &str, _: &str) -> Result<()> {
        Err("built without the verbs feature: only the soft device and --tcp".into())
    }
}

/// The run's shape, sent by the client first: both sides must agree on
/// it, or each would wait for bytes the other never sends.
fn plan(args: &Args) -> [u8; 16] {
    let mut plan = [0u8; 16];
    plan[..8].copy_from_slice(&(args.size as u64).to_le_bytes());
    plan[8..].copy_from_slice(&(args.count as u64).to_le_bytes());
    plan
}

/// Reads each transfer and writes it back, once the client's plan is
/// found to be ours.
fn serve(mut stream: impl Read + Write, args: &Args) -> Result<()> {
    let mut theirs = [0u8; 16];
    stream.read_exact(&mut theirs)?;
    let agreed = theirs == plan(args);
    stream.write_all(&[u8::from(agreed)])?;
    stream.flush()?;
    if !agreed {
        let size = u64::from_le_bytes(theirs[..8].try_into().expect("8 bytes"));
        let count = u64::from_le_bytes(theirs[8..].try_into().expect("8 bytes"));
        return Err(format!(
            "the client asked for -S {size} -C {count}, this server runs -S {} -C {}",
            args.size, args.count
        )
        .into());
    }
    let mut buf = vec![0u8; args.size];
    for _ in 0..args.count {
        stream.read_exact(&mut buf)?;
        stream.write_all(&buf)?;
        stream.flush()?;
    }
    Ok(())
}

fn client_loop(mut stream: impl Read + Write, args: &Args, name: &str) -> Result<()> {
    let out: Vec<u8> = (0..args.size).map(|i| i as u8).collect();
    let mut back = vec![0u8; args.size];
    stream.write_all(&plan(args))?;
    stream.flush()?;
    let mut verdict = [0u8; 1];
    stream.read_exact(&mut verdict)?;
    if verdict[0] != 1 {
        return Err("the server runs another -S or -C: give both sides the same".into());
    }
    let started = Instant::now();
    for i in 0..args.count {
        stream.write_all(&out)?;
        stream.flush()?;
        stream.read_exact(&mut back)?;
        if i == 0 && back != out {
            return Err("the first transfer came back different".into());
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let total = 2.0 * args.size as f64 * args.count as f64;
    println!("name      bytes   xfers   total       time     Gb/sec    usec/xfer");
    println!(
        "{name:<9} {:<7} {:<7} {:<11} {:<8} {:<9.2} {:.2}",
        args.size,
        args.count,
        total as u64,
        format!("{secs:.2}s"),
        total * 8.0 / secs / 1e9,
        secs * 1e6 / (2.0 * args.count as f64)
    );
    Ok(())
}
