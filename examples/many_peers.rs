//! One server thread serving many clients from one ring: one completion
//! queue and one shared receive queue (topped up from a buffer pool) for
//! every connection, found from each completion's queue pair.
//!
//! Each client, every round, WRITEs a 4 KiB pattern into its own slice of
//! the server's memory and SENDs "written" in the same doorbell; the
//! server, woken by that receive, checks the slice byte for byte and SENDs
//! an acknowledgement; the client then READs its slice back and checks it.
//! The clients all live on a second ring (one completion queue for them
//! all too). At the end the example prints what each connection did and
//! the doorbells each side rang.
//!
//! ```text
//! cargo run --example many_peers [-- --device soft|NAME] [--clients N] [--rounds R]
//! ```

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

mod one_process;

use rdma_ring::backend::soft::SoftDevice;
use rdma_ring::backend::{ProtectionDomain, QpConfig, QueuePair, SrqConfig};
use rdma_ring::buf::{BaseBuf, BufferPool, ExposedBuf, RegisteredBuf, RemoteAccess, RemoteSlice};
use rdma_ring::op::{OpKind, Read, Recv, SendImm, Write};
use rdma_ring::ring::{Completion, QpHandle, Ring, RingConfig, SrqRefill};

const SLICE: usize = 4096;
const USAGE: &str = "usage: many_peers [--device soft|NAME] [--clients N] [--rounds R]";

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + std::marker::Send + Sync>>;
type CqOf<F> = <<F as Fabric>::Qp as QueuePair>::Cq;
type SrqOf<F> = <<F as Fabric>::Qp as QueuePair>::Srq;

fn main() -> ExitCode {
    match run() {
        Ok(()) => {
            println!("many_peers: all checks passed");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("many_peers: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

struct Options {
    device: Option<String>,
    clients: usize,
    rounds: u32,
}

fn options() -> Result<Options> {
    let mut options = Options {
        device: None,
        clients: 64,
        rounds: 4,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| {
            args.next()
                .ok_or_else(|| format!("{flag} needs a value; {USAGE}"))
        };
        match arg.as_str() {
            "--device" => options.device = Some(value("--device")?),
            "--clients" => {
                options.clients = value("--clients")?
                    .parse()
                    .map_err(|e| format!("--clients: {e}"))?
            }
            "--rounds" => {
                options.rounds = value("--rounds")?
                    .parse()
                    .map_err(|e| format!("--rounds: {e}"))?
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}; {USAGE}").into()),
        }
    }
    if options.clients == 0 || options.clients > 4096 || options.rounds == 0 {
        return Err(format!("--clients must be 1..=4096 and --rounds at least 1; {USAGE}").into());
    }
    Ok(options)
}

fn run() -> Result<()> {
    let options = options()?;
    let device = match options.device.clone() {
        Some(name) => name,
        None => match hardware_devices().first() {
            Some(first) => {
                println!("no --device given: using {first}, the first RDMA device");
                first.clone()
            }
            None => {
                println!("no --device given and no RDMA device found: using the soft device");
                "soft".into()
            }
        },
    };
    if device == "soft" {
        println!("device: soft (the in-process software RC device)");
        let dev = SoftDevice::new();
        let pd = dev.alloc_pd();
        return serve(&Soft { dev, pd }, &options);
    }
    verbs(&device, &options)
}

/// What the example needs from a device: completion and shared receive
/// queues, and a server queue pair connected to a client queue pair.
trait Fabric {
    type Qp: QueuePair + std::marker::Send + 'static;
    type Pd: ProtectionDomain;
    fn pd(&self) -> &Self::Pd;
    fn cq(&self, entries: u32) -> Result<CqOf<Self>>;
    fn srq(&self, config: SrqConfig) -> Result<SrqOf<Self>>;
    fn connect(
        &self,
        server_cq: &CqOf<Self>,
        srq: &SrqOf<Self>,
        client_cq: &CqOf<Self>,
        config: QpConfig,
    ) -> Result<(Self::Qp, Self::Qp)>;
}

struct Soft {
    dev: SoftDevice,
    pd: rdma_ring::backend::soft::SoftPd,
}

impl Fabric for Soft {
    type Qp = rdma_ring::backend::soft::SoftQp;
    type Pd = rdma_ring::backend::soft::SoftPd;
    fn pd(&self) -> &Self::Pd {
        &self.pd
    }
    fn cq(&self, entries: u32) -> Result<CqOf<Self>> {
        Ok(self.dev.create_cq(entries)?)
    }
    fn srq(&self, config: SrqConfig) -> Result<SrqOf<Self>> {
        Ok(self.dev.create_srq(&self.pd, config)?)
    }
    fn connect(
        &self,
        server_cq: &CqOf<Self>,
        srq: &SrqOf<Self>,
        client_cq: &CqOf<Self>,
        config: QpConfig,
    ) -> Result<(Self::Qp, Self::Qp)> {
        let server = self
            .dev
            .create_qp_on(&self.pd, server_cq, Some(srq), config)?;
        let client = self.dev.create_qp_on(&self.pd, client_cq, None, config)?;
        self.dev.connect(&server, &client)?;
        Ok((server, client))
    }
}

#[cfg(feature = "verbs")]
fn hardware_devices() -> Vec<String> {
    rdma_ring::backend::verbs::device_names().unwrap_or_else(|e| {
        println!("could not list RDMA devices ({e})");
        Vec::new()
    })
}

#[cfg(not(feature = "verbs"))]
fn hardware_devices() -> Vec<String> {
    Vec::new()
}

#[cfg(feature = "verbs")]
fn verbs(name: &str, options: &Options) -> Result<()> {
    use rdma_ring::backend::verbs::{VerbsCq, VerbsDevice, VerbsPd, VerbsQp, VerbsSrq};

    struct Verbs {
        dev: VerbsDevice,
        pd: VerbsPd,
    }
    impl Fabric for Verbs {
        type Qp = VerbsQp;
        type Pd = VerbsPd;
        fn pd(&self) -> &VerbsPd {
            &self.pd
        }
        fn cq(&self, entries: u32) -> Result<VerbsCq> {
            Ok(self.dev.create_cq(entries)?)
        }
        fn srq(&self, config: SrqConfig) -> Result<VerbsSrq> {
            Ok(self.dev.create_srq(&self.pd, config)?)
        }
        fn connect(
            &self,
            server_cq: &VerbsCq,
            srq: &VerbsSrq,
            client_cq: &VerbsCq,
            config: QpConfig,
        ) -> Result<(VerbsQp, VerbsQp)> {
            let server = self
                .dev
                .create_qp_on(&self.pd, server_cq, Some(srq), config)?;
            let client = self.dev.create_qp_on(&self.pd, client_cq, None, config)?;
            // Endpoints handed over in memory: both ends are in this process.
            let (es, ec) = (server.endpoint(), client.endpoint());
            server.connect(&ec)?;
            client.connect(&es)?;
            Ok((server, client))
        }
    }

    let dev = VerbsDevice::open(name)?;
    println!(
        "device: {name} (libibverbs; port {}, GID index {})",
        dev.port(),
        dev.gid_index()
    );
    let pd = dev.alloc_pd()?;
    serve(&Verbs { dev, pd }, options)
}

#[cfg(not(feature = "verbs"))]
fn verbs(name: &str, _options: &Options) -> Result<()> {
    Err(format!("device {name:?}: this build has no verbs backend; use --device soft").into())
}

fn pattern(client: usize, round: u32, at: usize) -> u8 {
    (client as u32 * 7 + round * 13 + at as u32) as u8 | 1
}

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(what().into())
    }
}

/// How long either side waits for a completion before giving up.
const PATIENCE: Duration = Duration::from_secs(60);
/// How often a waiting side looks whether the other side failed.
const TICK: Duration = Duration::from_millis(50);

fn ring_config() -> RingConfig {
    RingConfig {
        wait_timeout: TICK,
        ..RingConfig::default()
    }
}

/// Waits for at least one completion into `out`, up to `PATIENCE`; gives
/// up within a tick once `other_failed` is set, since what this side waits
/// for will then never come.
fn wait_some<Q: QueuePair>(
    ring: &mut Ring<Q>,
    out: &mut Vec<Completion>,
    other_failed: &AtomicBool,
    other: &str,
) -> Result<()> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match ring.completion().wait_into(1, out) {
            Ok(_) => return Ok(()),
            Err(rdma_ring::Error::Timeout(_)) => {
                if other_failed.load(Ordering::Acquire) {
                    return Err(format!("stopped waiting: the {other} failed").into());
                }
                if Instant::now() >= deadline {
                    return Err(format!("no completion in {PATIENCE:?}").into());
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Per connection, what the server saw.
#[derive(Clone, Copy, Default)]
struct ServerCounts {
    received: u32,
    checked_bytes: usize,
    acks: u32,
}

fn serve<F: Fabric>(fabric: &F, options: &Options) -> Result<()> {
    let n = options.clients;
    let config = QpConfig {
        max_send_wr: 16,
        max_recv_wr: 4,
        ..QpConfig::default()
    };
    let entries = (8 * n + 64) as u32;
    let mut server = Ring::with_cq(fabric.cq(entries)?, ring_config());
    let srq = server
        .add_srq(fabric.srq(SrqConfig {
            max_wr: 2 * n as u32,
            max_sge: 1,
        })?)
        .map_err(|r| r.into_parts().0)?;
    let mut client = Ring::with_cq(fabric.cq(entries)?, ring_config());
    let (mut server_qps, mut client_qps) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let (s, c) = fabric.connect(
            server.cq(),
            server.srq(srq).expect("held"),
            client.cq(),
            config,
        )?;
        server_qps.push(server.attach(s).map_err(|r| r.into_parts().0)?);
        client_qps.push(client.attach(c).map_err(|r| r.into_parts().0)?);
    }
    println!("{n} connections: one server ring (one CQ, one SRQ) and one client ring");

    // The server's memory, one slice per client, and the receives of the
    // shared queue, topped up from a pool whenever fewer than n are posted.
    let memory = ExposedBuf::new(
        fabric.pd(),
        vec![0u8; n * SLICE],
        RemoteAccess::READ | RemoteAccess::WRITE,
    )
    .map_err(|r| r.into_parts().0)?;
    let slices: Vec<RemoteSlice> = (0..n)
        .map(|i| {
            memory
                .remote()
                .slice((i * SLICE) as u64..((i + 1) * SLICE) as u64)
        })
        .collect::<std::result::Result<_, _>>()?;
    let recv_pool = BufferPool::new(fabric.pd(), 64, 4 * n)?;
    server.set_srq_refill(
        srq,
        Some(SrqRefill {
            pool: recv_pool,
            low: n,
            target: 2 * n,
            user_data: 0,
        }),
    )?;
    let server_pd_pool = BufferPool::new(fabric.pd(), 64, 2 * n)?;
    let client_pool = BufferPool::new(fabric.pd(), SLICE, 3 * n)?;

    let rounds = options.rounds;
    let qps = server_qps.clone();
    let memory = &memory;
    // The server keeps its queue pairs up until the clients are done.
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    // Set by a side that failed, so that the other stops waiting for it.
    let (server_failed, clients_failed) = (AtomicBool::new(false), AtomicBool::new(false));
    let (server_failed, clients_failed) = (&server_failed, &clients_failed);
    let ((counts, server_doorbells, per_qp), ()) = std::thread::scope(|scope| {
        let server_handle = scope.spawn(move || {
            let mut serve = || -> Result<(Vec<ServerCounts>, u64, Vec<u64>)> {
                let index_of = |h: QpHandle| qps.iter().position(|&q| q == h);
                let mut counts = vec![ServerCounts::default(); n];
                let mut expected = n * rounds as usize;
                let mut done = Vec::new();
                while expected > 0 {
                    done.clear();
                    wait_some(&mut server, &mut done, clients_failed, "clients")?;
                    for c in done.drain(..) {
                        c.result()?;
                        if c.kind() != OpKind::Recv {
                            continue; // an acknowledgement went out
                        }
                        let i = c
                            .qp()
                            .and_then(index_of)
                            .ok_or("a receive from an unknown queue pair")?;
                        let (round, from) =
                            (c.imm().unwrap_or(0) >> 16, c.imm().unwrap_or(0) & 0xffff);
                        check(from as usize == i, || {
                            format!("qp {i} got client {from}'s message")
                        })?;
                        // SAFETY: client i wrote its slice before sending this
                        // message on the same queue pair (RC delivers in order),
                        // and writes again only after our acknowledgement.
                        let bytes = unsafe { &memory.as_slice()[i * SLICE..(i + 1) * SLICE] };
                        let bad = (0..SLICE).find(|&at| bytes[at] != pattern(i, round, at));
                        check(bad.is_none(), || {
                            format!("client {i} round {round}: byte {bad:?} differs")
                        })?;
                        counts[i].received += 1;
                        counts[i].checked_bytes += SLICE;
                        let ack = server_pd_pool.take()?;
                        server
                            .submission_on(qps[i])
                            .push(SendImm::new(ack.slice(0..8), c.imm().unwrap_or(0)))
                            .map_err(|r| r.into_parts().0)?;
                        counts[i].acks += 1;
                        expected -= 1;
                    }
                    // One doorbell per connection that has acknowledgements.
                    server.submit()?;
                }
                // The last acknowledgements complete before the ring goes,
                // and each must have succeeded; every message has arrived,
                // so a receive now is one too many.
                while server.in_flight() > server.srq_posted(srq).unwrap_or(0) {
                    done.clear();
                    wait_some(&mut server, &mut done, clients_failed, "clients")?;
                    for c in done.drain(..) {
                        c.result()?;
                        check(c.kind() != OpKind::Recv, || {
                            "a message after the last round".into()
                        })?;
                    }
                }
                let _ = stopped.recv();
                let doorbells = server.stats().doorbells;
                let per_qp = qps
                    .iter()
                    .map(|&h| server.qp_stats(h).map_or(0, |s| s.doorbells))
                    .collect();
                Ok((counts, doorbells, per_qp))
            };
            let result = serve();
            // Told before the ring (and its queue pairs) goes, which can
            // take a while when operations are still in flight.
            if result.is_err() {
                server_failed.store(true, Ordering::Release);
            }
            result
        });

        // The clients, all on one ring, as a state machine per connection.
        let mut clients = || -> Result<()> {
            for round in 0..rounds {
                for (i, &h) in client_qps.iter().enumerate() {
                    let mut data = client_pool.take()?;
                    for (at, b) in data.iter_mut().enumerate() {
                        *b = pattern(i, round, at);
                    }
                    let mut ack = client_pool.take()?;
                    ack.fill(0);
                    let mut sq = client.submission_on(h);
                    sq.push(Recv::new(ack).user_data(u64::from(round)))
                        .map_err(|r| r.into_parts().0)?;
                    sq.push(Write::new(data, slices[i]).user_data(1))
                        .map_err(|r| r.into_parts().0)?;
                    let msg = RegisteredBuf::new(fabric.pd(), b"written".to_vec())
                        .map_err(|r| r.into_parts().0)?;
                    sq.push(SendImm::new(msg, (round << 16) | i as u32).user_data(2))
                        .map_err(|r| r.into_parts().0)?;
                }
                // One submit: one doorbell per connection (receive queue and
                // send queue each).
                client.submit()?;
                let mut acked = vec![false; n];
                let mut outstanding = 3 * n;
                let mut done = Vec::new();
                while outstanding > 0 {
                    done.clear();
                    wait_some(&mut client, &mut done, server_failed, "server")?;
                    for c in done.drain(..) {
                        c.result()?;
                        outstanding -= 1;
                        let i = c
                            .qp()
                            .and_then(|h| client_qps.iter().position(|&q| q == h))
                            .ok_or("unknown qp")?;
                        if c.kind() == OpKind::Recv {
                            check(c.imm() == Some((round << 16) | i as u32), || {
                                format!("client {i}: wrong acknowledgement")
                            })?;
                            acked[i] = true;
                            // Read the slice back.
                            client
                                .submission_on(client_qps[i])
                                .push(Read::new(client_pool.take()?, slices[i]).user_data(3))
                                .map_err(|r| r.into_parts().0)?;
                            client.submit()?;
                            outstanding += 1;
                        } else if c.kind() == OpKind::Read {
                            let bad = (0..SLICE).find(|&at| c.buf()[at] != pattern(i, round, at));
                            check(bad.is_none(), || {
                                format!("client {i} read back byte {bad:?} wrong")
                            })?;
                        }
                    }
                }
                check(acked.iter().all(|&a| a), || {
                    format!("round {round}: a client missed its acknowledgement")
                })?;
            }
            Ok(())
        };
        let clients_result = clients();
        if clients_result.is_err() {
            clients_failed.store(true, Ordering::Release);
        }
        drop(stop);
        one_process::verdict(
            ("server", server_handle.join()),
            ("clients", clients_result),
        )
    })?;
    let client_doorbells = client.stats().doorbells;
    println!(
        "connection  server received  bytes checked  acks  server doorbells  client doorbells"
    );
    for (i, c) in counts.iter().enumerate() {
        let client_rung = client.qp_stats(client_qps[i]).map_or(0, |s| s.doorbells);
        println!(
            "{i:>10}  {:>15}  {:>13}  {:>4}  {:>16}  {:>16}",
            c.received, c.checked_bytes, c.acks, per_qp[i], client_rung
        );
        check(c.received == rounds && c.acks == rounds, || {
            format!("connection {i} did {} rounds", c.received)
        })?;
    }
    println!(
        "doorbells: server {server_doorbells} (acknowledgements and shared-queue refills), client {client_doorbells}; \
         {} operations over {n} connections",
        (n as u64) * u64::from(rounds) * 6
    );
    drop(client);
    check(client_pool.available() == client_pool.capacity(), || {
        "a client buffer is still out".into()
    })?;
    Ok(())
}
