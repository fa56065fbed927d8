//! An RPC server: one poller thread serves every client over one
//! completion queue and one shared receive queue, with an echo or a
//! key-value handler. Clients come over a TCP handshake (default) or
//! rdma_cm (`--cm`); `--tcp` serves the same handler over plain TCP, the
//! baseline the benchmark compares with. Pair it with `rpc_client`.
//!
//! ```text
//! cargo run --example rpc_server -- --device rxe0 --listen 0.0.0.0:7490 --exit-after 16
//! cargo run --example rpc_server -- --cm --listen 10.99.0.1:7491 --handler kv
//! cargo run --example rpc_server -- --tcp --listen 127.0.0.1:7492
//! ```
//!
//! For a server and clients in one process on the soft device, run
//! `rpc_client` without an address.

#[path = "rpc_common/mod.rs"]
mod rpc_common;

use std::process::ExitCode;
use std::sync::{Arc, Mutex};

#[cfg(feature = "verbs")]
use rdma_ring::rpc::RpcServer;
use rdma_ring::rpc::{AsyncHandler, Caller, ResponseFuture, RpcConfig, Service};
use rpc_common::{echo, Flags, HandlerKind, KvStore, Result};

const USAGE: &str = "usage: rpc_server [--listen ADDR] [--device NAME] [--cm | --tcp] \
    [--handler echo|kv] [--async] [--exit-after N] [--max-clients N] [--window W] [--spin POLLS]";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rpc_server: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The handlers as futures: what an async service looks like (here they
/// finish at once; a real one would await storage or other services).
struct AsyncService {
    kind: HandlerKind,
    store: Arc<Mutex<KvStore>>,
}

impl AsyncHandler for AsyncService {
    fn call(&mut self, caller: Caller, request: Vec<u8>) -> ResponseFuture {
        let (kind, store) = (self.kind, Arc::clone(&self.store));
        Box::pin(async move {
            let mut resp = Vec::new();
            match kind {
                HandlerKind::Echo => echo(&caller, &request, &mut resp)?,
                HandlerKind::Kv => store.lock().unwrap().apply(&request, &mut resp)?,
            }
            Ok(resp)
        })
    }
}

fn run() -> Result<()> {
    let flags = Flags::parse(
        USAGE,
        &["--cm", "--tcp", "--async"],
        &[
            "--listen",
            "--device",
            "--handler",
            "--exit-after",
            "--max-clients",
            "--window",
            "--spin",
        ],
    )?;
    let listen = flags
        .value("--listen")
        .unwrap_or("0.0.0.0:7490")
        .to_string();
    let kind: HandlerKind = flags.parsed("--handler", HandlerKind::Echo)?;
    let exit_after: Option<usize> = flags
        .value("--exit-after")
        .map(|v| v.parse().map_err(|e| format!("--exit-after {v:?}: {e}")))
        .transpose()?;
    if exit_after == Some(0) {
        return Err("--exit-after 0 would serve nobody: give at least 1".into());
    }
    // A flag the chosen transport would ignore is refused.
    let ignored_by_tcp = [
        "--cm",
        "--device",
        "--async",
        "--window",
        "--max-clients",
        "--spin",
    ];
    let ignored = ignored_by_tcp
        .iter()
        .map(|&flag| ("--tcp", flag))
        .chain([("--cm", "--device")]);
    for (transport, flag) in ignored {
        if flags.has(transport) && flags.has(flag) {
            return Err(format!("{flag} does not go with {transport}").into());
        }
    }
    let config = RpcConfig {
        max_clients: flags.parsed("--max-clients", 64)?,
        window: flags.parsed("--window", 16)?,
        spin_polls: flags.parsed("--spin", RpcConfig::default().spin_polls)?,
        ..RpcConfig::default()
    };
    if flags.has("--tcp") {
        let listener = std::net::TcpListener::bind(&listen)?;
        println!(
            "rpc_server: serving {kind:?} over plain TCP on {}",
            listener.local_addr()?
        );
        return rpc_common::serve_tcp(listener, kind, exit_after);
    }
    let service = if flags.has("--async") {
        Service::async_handler(AsyncService {
            kind,
            store: Arc::default(),
        })
    } else {
        rpc_common::service(kind)
    };
    serve(&flags, &listen, service, config, kind, exit_after)
}

#[cfg(feature = "verbs")]
fn serve(
    flags: &Flags,
    listen: &str,
    service: Service,
    config: RpcConfig,
    kind: HandlerKind,
    exit_after: Option<usize>,
) -> Result<()> {
    use rdma_ring::backend::verbs::VerbsDevice;
    if flags.has("--cm") {
        let server = RpcServer::bind_cm(listen.parse()?, service, config)?;
        println!("rpc_server: serving {kind:?} over rdma_cm on {listen}");
        return wait(&server, exit_after);
    }
    let dev = match flags.value("--device") {
        Some("soft") => {
            return Err("the soft device lives inside one process: run `rpc_client --device soft` \
                 for a server and clients in one process"
                .into())
        }
        Some(name) => VerbsDevice::open(name)?,
        None => VerbsDevice::open_first()?
            .ok_or("no RDMA device on this machine: use --tcp, or run rpc_client alone for the soft device")?,
    };
    let server = RpcServer::bind_with(listen, &dev, service, config)?;
    println!(
        "rpc_server: serving {kind:?} on {} (TCP handshake), device {}",
        server.local_addr().expect("bound"),
        dev.name()
    );
    wait(&server, exit_after)
}

#[cfg(not(feature = "verbs"))]
fn serve(
    _: &Flags,
    _: &str,
    _: Service,
    _: RpcConfig,
    _: HandlerKind,
    _: Option<usize>,
) -> Result<()> {
    Err(
        "built without the verbs feature: use --tcp, or run rpc_client alone for the soft device"
            .into(),
    )
}

/// Serves until `exit_after` clients came and went (or forever), then
/// shuts down and prints what the server did.
#[cfg(feature = "verbs")]
fn wait<Q: rdma_ring::backend::QueuePair + Send + 'static>(
    server: &RpcServer<Q>,
    exit_after: Option<usize>,
) -> Result<()> {
    loop {
        std::thread::sleep(std::time::Duration::from_millis(50));
        if let Some(why) = server.failure() {
            return Err(format!("the server failed: {why}").into());
        }
        let stats = server.stats();
        if let Some(n) = exit_after {
            if stats.clients_accepted >= n as u64 && stats.clients_open == 0 {
                break;
            }
        }
        if !server.accepting() && stats.clients_open == 0 {
            return Err("the listener hears no more clients (its device went away)".into());
        }
    }
    server.shutdown()?;
    let stats = server.stats();
    println!(
        "rpc_server: {} clients served, {} requests, {} answers in {} doorbells, {} errors, {} protocol violations",
        stats.clients_accepted, stats.requests, stats.answers, stats.doorbells, stats.errors, stats.protocol_errors
    );
    if stats.protocol_errors > 0 {
        return Err("a client broke the protocol".into());
    }
    Ok(())
}
