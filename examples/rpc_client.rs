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
//! cargo run --example rpc_client -- --cm --connect 10.99.0.1:7491 --handler kv   # or --cm ADDR
//! cargo run --example rpc_client -- --connect 127.0.0.1:7490 --bench --clients 4 --size 64
//! ```

mod one_process;
#[path = "rpc_common/mod.rs"]
mod rpc_common;

use std::process::ExitCode;
use std::time::Instant;

use rdma_ring::backend::soft::SoftDevice;
use rdma_ring::backend::QueuePair;
use rdma_ring::future::Wakeup;
use rdma_ring::rpc::{RpcClient, RpcConfig, RpcServer};
use rpc_common::{Flags, HandlerKind, Result};

const USAGE: &str = "usage: rpc_client [--connect ADDR [--device NAME] | --cm --connect ADDR | --cm ADDR | --tcp ADDR] \
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

/// Where the clients connect.
enum Target<'a> {
    /// A server in this process, on the soft device.
    Soft,
    /// Plain TCP, the benchmark's baseline.
    Tcp(&'a str),
    /// A server on an RDMA device.
    Remote(Remote<'a>),
}

// Without the verbs backend nothing reads the addresses.
#[cfg_attr(not(feature = "verbs"), allow(dead_code))]
enum Remote<'a> {
    /// rdma_cm, on the device that routes to the address.
    Cm(&'a str),
    /// A TCP handshake, on the device named or the first one.
    Verbs(&'a str, Option<&'a str>),
}

/// The one target the flags name; flags that would be ignored are refused.
fn target(flags: &Flags) -> Result<Target<'_>> {
    let (connect, tcp, device) = (
        flags.value("--connect"),
        flags.value("--tcp"),
        flags.value("--device"),
    );
    // `--cm ADDR` (what scripts/lib/vm-suite.sh runs) and `--cm --connect
    // ADDR` (as the other examples take it) both work.
    let cm = match (flags.has("--cm"), flags.value("--cm"), connect) {
        (false, _, _) => None,
        (true, Some(_), Some(_)) => {
            return Err(format!(
                "give rdma_cm's address once: --cm ADDR or --cm --connect ADDR; {USAGE}"
            )
            .into())
        }
        (true, Some(addr), None) | (true, None, Some(addr)) => Some(addr),
        (true, None, None) => {
            return Err(format!("--cm needs an address: --cm --connect ADDR; {USAGE}").into())
        }
    };
    match (tcp, cm, connect, device) {
        (Some(_), _, _, _) if cm.is_some() || connect.is_some() => {
            Err(format!("--tcp ADDR excludes --connect and --cm; {USAGE}").into())
        }
        (Some(_), _, _, Some(_)) | (None, Some(_), _, Some(_)) => Err(format!(
            "--device applies to --connect only: --tcp uses no RDMA device, and rdma_cm uses the one that routes to the address; {USAGE}"
        )
        .into()),
        (Some(addr), _, _, None) => Ok(Target::Tcp(addr)),
        (None, Some(addr), _, None) => Ok(Target::Remote(Remote::Cm(addr))),
        (None, None, Some(_), Some("soft")) => {
            Err("the soft device has no network: leave out --connect for one process".into())
        }
        (None, None, Some(addr), device) => Ok(Target::Remote(Remote::Verbs(addr, device))),
        (None, None, None, Some(name)) if name != "soft" => Err(format!(
            "--device {name} needs --connect ADDR: without an address the server and clients run in this process on the soft device; {USAGE}"
        )
        .into()),
        (None, None, None, _) => Ok(Target::Soft),
    }
}

fn run() -> Result<()> {
    let flags = Flags::parse(
        USAGE,
        &["--bench", "--cm"],
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
    if options.clients == 0 || options.calls == 0 || options.depth == 0 {
        return Err(format!("--clients, --calls and --depth must be at least 1; {USAGE}").into());
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
    match target(&flags)? {
        Target::Tcp(addr) => {
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
        Target::Remote(to) => remote(to, config, &options)?,
        Target::Soft => soft(config, &options)?,
    }
    if !options.bench {
        println!("rpc_client: all checks passed");
    }
    Ok(())
}

/// The server and the clients in this process, on the soft device.
fn soft(config: RpcConfig, options: &Options) -> Result<()> {
    println!(
        "device: soft (the in-process software RC device; server and clients in this process)"
    );
    let dev = SoftDevice::new();
    let server = RpcServer::soft(&dev, rpc_common::service(options.kind), config)?;
    let clients = run_clients("rdma-soft", || Ok(server.connect_soft()?), options);
    // The server is shut down and checked whatever the clients did: when
    // it broke, what the clients saw is only the consequence.
    let shutdown = server.shutdown();
    let stats = server.stats();
    println!(
        "server: {} requests, {} answers in {} doorbells, {} errors, {} protocol violations",
        stats.requests, stats.answers, stats.doorbells, stats.errors, stats.protocol_errors
    );
    let server_result: Result<()> = match shutdown {
        Err(e) => Err(format!("shutting down: {e}").into()),
        Ok(()) if stats.protocol_errors > 0 => Err(format!(
            "{} protocol violations: a client broke the protocol",
            stats.protocol_errors
        )
        .into()),
        Ok(()) => Ok(()),
    };
    one_process::verdict(("server", Ok(server_result)), ("clients", clients)).map(|_| ())
}

#[cfg(feature = "verbs")]
fn remote(to: Remote<'_>, config: RpcConfig, options: &Options) -> Result<()> {
    use rdma_ring::backend::verbs::VerbsDevice;
    match to {
        Remote::Cm(addr) => {
            let addr: std::net::SocketAddr = addr
                .parse()
                .map_err(|e| format!("--cm address {addr:?}: {e}"))?;
            println!("connecting over rdma_cm to {addr}");
            run_clients(
                "rdma-cm",
                || Ok(RpcClient::connect_cm(addr, config)?),
                options,
            )
        }
        Remote::Verbs(addr, device) => {
            let dev = match device {
                Some(name) => VerbsDevice::open(name)?,
                None => VerbsDevice::open_first()?.ok_or("no RDMA device on this machine")?,
            };
            println!(
                "device: {} (connecting to {addr} over a TCP handshake)",
                dev.name()
            );
            run_clients(
                "rdma",
                || Ok(RpcClient::connect_with(addr, &dev, config)?),
                options,
            )
        }
    }
}

#[cfg(not(feature = "verbs"))]
fn remote(_: Remote<'_>, _: RpcConfig, _: &Options) -> Result<()> {
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
        "rpc_client: {} clients, {total_calls} calls checked ({kind:?}, up to {depth} in flight each), {:.0} calls/s, {:.1} MB/s",
        options.clients,
        total_calls as f64 / secs,
        total_bytes as f64 / secs / 1e6
    );
    Ok(())
}
