//! RPC clients: `--clients N` connections from one process, each making
//! `--calls M` calls with up to `--depth D` in flight, every response
//! checked (echo: each byte; key-value: each value read back, and a
//! missing key's error). Requests range from 1 byte to 300 KB, so both
//! inline messages and rendezvous transfers are exercised.
//!
//! Without an address, a server runs in this process on the soft device.
//! `--bench` measures instead: one call at a time per client, of `--size`
//! bytes, printing requests per second and latency percentiles (also over
//! plain TCP with `--tcp ADDR`, against `rpc_server --tcp`).
//!
//! ```text
//! cargo run --example rpc_client                                    # soft device, one process
//! cargo run --example rpc_client -- --device rxe0 --connect 127.0.0.1:7490 --clients 16
//! cargo run --example rpc_client -- --cm 10.99.0.1:7491 --handler kv
//! cargo run --example rpc_client -- --connect 127.0.0.1:7490 --bench --clients 4 --size 64
//! ```

#[path = "rpc_common/mod.rs"]
mod rpc_common;

use std::process::ExitCode;
use std::time::Instant;

use rdma_ring::backend::soft::SoftDevice;
use rdma_ring::backend::QueuePair;
use rdma_ring::future::Wakeup;
use rdma_ring::rpc::{RpcClient, RpcConfig, RpcServer};
use rpc_common::{Flags, HandlerKind, Result};

const USAGE: &str = "usage: rpc_client [--connect ADDR [--device NAME] | --cm ADDR | --tcp ADDR] \
    [--clients N] [--calls M] [--depth D] [--handler echo|kv] [--bench [--size S]] [--spin POLLS] [--wakeup thread|busy]";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rpc_client: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

struct Options {
    clients: usize,
    calls: usize,
    depth: usize,
    kind: HandlerKind,
    bench: bool,
    size: usize,
}

fn run() -> Result<()> {
    let flags = Flags::parse(
        USAGE,
        &["--bench"],
        &[
            "--connect",
            "--device",
            "--cm",
            "--tcp",
            "--clients",
            "--calls",
            "--depth",
            "--handler",
            "--size",
            "--spin",
            "--wakeup",
        ],
    )?;
    let options = Options {
        clients: flags.parsed("--clients", 4)?,
        calls: flags.parsed("--calls", 200)?,
        depth: flags.parsed("--depth", 8)?,
        kind: flags.parsed("--handler", HandlerKind::Echo)?,
        bench: flags.has("--bench"),
        size: flags.parsed("--size", 64)?,
    };
    if options.clients == 0 || options.depth == 0 {
        return Err(format!("--clients and --depth must be at least 1; {USAGE}").into());
    }
    let config = RpcConfig {
        spin_polls: flags.parsed("--spin", RpcConfig::default().spin_polls)?,
        wakeup: match flags.value("--wakeup") {
            None | Some("thread") => Wakeup::Thread,
            Some("busy") => Wakeup::Busy,
            Some(other) => return Err(format!("--wakeup {other:?}: thread or busy").into()),
        },
        ..RpcConfig::default()
    };
    if let Some(addr) = flags.value("--tcp") {
        if !options.bench {
            return Err("--tcp is the benchmark baseline: add --bench".into());
        }
        let clients = (0..options.clients)
            .map(|_| {
                let s = std::net::TcpStream::connect(addr)?;
                s.set_nodelay(true)?;
                Ok(s)
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        return rpc_common::bench(
            "tcp",
            clients,
            options.size,
            options.calls,
            rpc_common::tcp_call,
        );
    }
    if flags.value("--connect").is_some() || flags.value("--cm").is_some() {
        return remote(&flags, config, &options);
    }
    println!(
        "device: soft (the in-process software RC device; server and clients in this process)"
    );
    let dev = SoftDevice::new();
    let server = RpcServer::soft(&dev, rpc_common::service(options.kind), config)?;
    run_clients("rdma-soft", || Ok(server.connect_soft()?), &options)?;
    server.shutdown()?;
    let stats = server.stats();
    println!(
        "server: {} requests, {} answers in {} doorbells",
        stats.requests, stats.answers, stats.doorbells
    );
    Ok(())
}

#[cfg(feature = "verbs")]
fn remote(flags: &Flags, config: RpcConfig, options: &Options) -> Result<()> {
    use rdma_ring::backend::verbs::VerbsDevice;
    if let Some(addr) = flags.value("--cm") {
        let addr: std::net::SocketAddr = addr.parse()?;
        println!("connecting over rdma_cm to {addr}");
        return run_clients(
            "rdma-cm",
            || Ok(RpcClient::connect_cm(addr, config)?),
            options,
        );
    }
    let addr = flags.value("--connect").expect("checked").to_string();
    if flags.value("--device") == Some("soft") {
        return Err("the soft device has no network: leave out --connect for one process".into());
    }
    let dev = match flags.value("--device") {
        Some(name) => VerbsDevice::open(name)?,
        None => VerbsDevice::open_first()?.ok_or("no RDMA device on this machine")?,
    };
    println!(
        "device: {} (connecting to {addr} over a TCP handshake)",
        dev.name()
    );
    run_clients(
        "rdma",
        || Ok(RpcClient::connect_with(addr.as_str(), &dev, config)?),
        options,
    )
}

#[cfg(not(feature = "verbs"))]
fn remote(_: &Flags, _: RpcConfig, _: &Options) -> Result<()> {
    Err("built without the verbs feature: run without an address for the soft device".into())
}

fn rpc_call<Q: QueuePair + Send + 'static>(
    client: &mut RpcClient<Q>,
    req: &[u8],
) -> Result<Vec<u8>> {
    Ok(client.call(req)?)
}

/// Connects `clients` clients with `connect` and runs the checked
/// workload (or the benchmark) on each, from a thread each.
fn run_clients<Q: QueuePair + Send + 'static>(
    label: &str,
    connect: impl Fn() -> Result<RpcClient<Q>>,
    options: &Options,
) -> Result<()> {
    let clients = (0..options.clients)
        .map(|_| connect())
        .collect::<Result<Vec<_>>>()?;
    if options.bench {
        return rpc_common::bench(label, clients, options.size, options.calls, rpc_call::<Q>);
    }
    let t0 = Instant::now();
    let (calls, depth, kind) = (options.calls, options.depth, options.kind);
    let threads: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(index, client)| {
            std::thread::spawn(move || {
                let report = rpc_common::checked_workload(&client, kind, index, calls, depth)?;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>((client.client_id(), report))
            })
        })
        .collect();
    let (mut total_calls, mut total_bytes) = (0, 0);
    for t in threads {
        let (id, report) = t.join().map_err(|_| "a client thread panicked")??;
        println!(
            "client {id}: {} calls checked, {} request bytes",
            report.calls, report.bytes
        );
        total_calls += report.calls;
        total_bytes += report.bytes;
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "rpc_client: {} clients, {total_calls} calls checked ({kind:?}, up to {depth} in flight each), {:.0} calls/s, {:.1} MB/s: all checks passed",
        options.clients,
        total_calls as f64 / secs,
        total_bytes as f64 / secs / 1e6
    );
    Ok(())
}
