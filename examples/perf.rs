//! Throughput of RDMA WRITE, READ, SEND or fetch-and-add through the ring,
//! with perftest's knobs:
//! message size, WRs per post (batch), WRs outstanding (depth), and CQE
//! every N WRs (signaling). Two queue pairs of one device, connected to
//! each other, like perftest against 127.0.0.1.
//!
//! ```text
//! cargo run --release --example perf -- [--device soft|noop|NAME] [--op write|read|send|fetch_add]
//!     [--size 64] [--batch 32] [--depth 128] [--signal 32] [--iters 100000]
//!     [--inline 220]
//! ```
//!
//! WRITEs of at most `--inline` bytes are posted inline, as perftest does
//! by default (its `-I`); 0 turns that off.
//!
//! `--device noop` runs the soft device in its no-op mode: the device costs
//! next to nothing, so the figure is the software path alone. It prints one
//! line: `perf: <device> <op> size=.. batch=.. depth=.. signal=..: <ops> ops
//! in <secs> s = <Mops> Mops/s <MB/s> MB/s`. Compare figures only within
//! one run on one machine (`scripts/perf` puts it beside perftest).

use std::process::ExitCode;
use std::time::Instant;

use rdma_ring::backend::soft::{Progress, SoftDevice};
use rdma_ring::backend::{ProtectionDomain, QpConfig, QueuePair};
use rdma_ring::buf::{BaseBuf, BufferPool, ExposedBuf, PoolChunk, RemoteAccess};
use rdma_ring::op::{FetchAdd, Read, Recv, Send, Write};
use rdma_ring::ring::{Completion, Ring, RingConfig};

struct Params {
    device: String,
    op: String,
    size: usize,
    batch: usize,
    depth: usize,
    signal: usize,
    iters: u64,
    inline: usize,
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn params() -> Result<Params> {
    let mut p = Params {
        device: "noop".into(),
        op: "write".into(),
        size: 64,
        batch: 32,
        depth: 128,
        signal: 32,
        iters: 100_000,
        inline: 220,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--device" => p.device = value,
            "--op" => p.op = value,
            "--size" => p.size = value.parse()?,
            "--batch" => p.batch = value.parse()?,
            "--depth" => p.depth = value.parse()?,
            "--signal" => p.signal = value.parse()?,
            "--iters" => p.iters = value.parse()?,
            "--inline" => p.inline = value.parse()?,
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    if p.batch == 0 || p.depth < p.batch || p.size == 0 {
        return Err("need size > 0 and 0 < batch <= depth".into());
    }
    if !["write", "read", "send", "fetch_add"].contains(&p.op.as_str()) {
        return Err(format!("--op {}: write, read, send or fetch_add", p.op).into());
    }
    if p.op == "fetch_add" {
        p.size = 8;
    }
    Ok(p)
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("perf: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn rx_depth(p: &Params) -> usize {
    (4 * p.depth).max(512)
}

fn config(p: &Params) -> QpConfig {
    QpConfig {
        max_send_wr: p.depth as u32 + 1,
        // Like perftest's receiver (rx-depth 512): enough receives posted
        // that a SEND rarely meets an empty queue (an RNR NAK stalls it).
        max_recv_wr: rx_depth(p) as u32,
        max_inline_data: p.inline as u32,
        ..QpConfig::default()
    }
}

fn run() -> Result<()> {
    let p = params()?;
    match p.device.as_str() {
        "soft" | "noop" => {
            let mode = if p.device == "noop" {
                Progress::NoOp
            } else {
                Progress::Auto
            };
            let dev = SoftDevice::with_progress(mode);
            let pd = dev.alloc_pd();
            let (qa, qb) = dev.connected_pair(&pd, &pd, config(&p))?;
            measure(&p, &pd, qa, qb)
        }
        name => verbs(&p, name),
    }
}

#[cfg(feature = "verbs")]
fn verbs(p: &Params, name: &str) -> Result<()> {
    let dev = rdma_ring::backend::verbs::VerbsDevice::open(name)?;
    let pd = dev.alloc_pd()?;
    let qa = dev.create_qp(&pd, config(p))?;
    let qb = dev.create_qp(&pd, config(p))?;
    let (ea, eb) = (qa.endpoint(), qb.endpoint());
    qa.connect(&eb)?;
    qb.connect(&ea)?;
    measure(p, &pd, qa, qb)
}

#[cfg(not(feature = "verbs"))]
fn verbs(_p: &Params, name: &str) -> Result<()> {
    Err(format!("device {name:?}: this build has no verbs backend").into())
}

/// Reposts receives as they complete, on its own thread, until stopped.
struct Receiver {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<std::result::Result<(), String>>,
}

impl Receiver {
    fn spawn<Q: QueuePair + std::marker::Send + 'static>(
        mut rx: Ring<Q>,
        depth: usize,
    ) -> Receiver {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut got = Vec::with_capacity(depth);
            while !flag.load(Ordering::Relaxed) {
                rx.completion().reap(&mut got).map_err(|e| e.to_string())?;
                if got.is_empty() {
                    continue;
                }
                let mut sq = rx.submission();
                for c in got.drain(..) {
                    if !c.status().is_success() {
                        return Err(format!("receive failed: {}", c.status()));
                    }
                    let chunk: PoolChunk = c
                        .into_buf()
                        .downcast()
                        .map_err(|_| "a receive buffer came back as another type")?;
                    sq.push(Recv::new(chunk)).map_err(|r| r.to_string())?;
                }
                sq.submit().map_err(|e| e.to_string())?;
            }
            Ok(())
        });
        Receiver { stop, thread }
    }

    fn stop(self) -> Result<()> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| "the receiver thread panicked")??;
        Ok(())
    }
}

fn measure<P: ProtectionDomain, Q: QueuePair + std::marker::Send + 'static>(
    p: &Params,
    pd: &P,
    qa: Q,
    qb: Q,
) -> Result<()> {
    let rights = match p.op.as_str() {
        "write" => RemoteAccess::WRITE,
        "read" => RemoteAccess::READ,
        _ => RemoteAccess::ATOMIC,
    };
    let target = ExposedBuf::new(pd, vec![0u8; p.size.max(8) * p.depth], rights)?;
    let remote = target.remote();
    let pool = BufferPool::new(pd, p.size.max(8), p.depth)?;
    let mut bufs: Vec<PoolChunk> = (0..p.depth)
        .map(|_| pool.take())
        .collect::<std::result::Result<_, _>>()?;
    let ring_config = RingConfig {
        signal_interval: p.signal,
        ..RingConfig::default()
    };
    let mut ring = Ring::new(qa, ring_config);
    // SENDs need receives at the peer: a receiver thread keeps its receive
    // queue full, as perftest's server process does on its own core. For
    // the other operations the peer only has to stay connected.
    let (receiver, _peer) = if p.op == "send" && p.device != "noop" {
        let pool = BufferPool::new(pd, p.size, rx_depth(p))?;
        let mut rx = Ring::new(qb, ring_config);
        for _ in 0..rx_depth(p) {
            rx.submission()
                .push(Recv::new(pool.take()?))
                .map_err(|r| r.to_string())?;
        }
        rx.submission().submit().map_err(|e| e.to_string())?;
        (Some(Receiver::spawn(rx, rx_depth(p))), None)
    } else {
        (None, Some(qb))
    };
    let mut done: Vec<Completion> = Vec::with_capacity(p.depth);
    let (mut posted, mut completed) = (0u64, 0u64);
    let stride = p.size.max(8) as u64;
    let slices: Vec<_> = (0..p.depth as u64)
        .map(|i| remote.slice(i * stride..i * stride + p.size as u64))
        .collect::<std::result::Result<_, _>>()?;
    let words: Vec<_> = (0..p.depth as u64)
        .map(|i| remote.word(i * stride))
        .filter_map(|w| w.ok())
        .collect();
    let inline = p.size <= p.inline;
    let start = Instant::now();
    while completed < p.iters {
        // Top the queue up in batches of `batch` WRs, one doorbell each.
        while bufs.len() >= p.batch && posted < p.iters {
            let n = p.batch.min((p.iters - posted) as usize);
            let mut sq = ring.submission();
            for _ in 0..n {
                let buf = bufs.pop().expect("counted above");
                let slot = (posted as usize) % p.depth;
                let pushed = match p.op.as_str() {
                    "write" if inline => sq
                        .push(Write::new(buf, slices[slot]).inline())
                        .map_err(|r| r.to_string()),
                    "write" => sq
                        .push(Write::new(buf, slices[slot]))
                        .map_err(|r| r.to_string()),
                    "read" => sq
                        .push(Read::new(buf, slices[slot]))
                        .map_err(|r| r.to_string()),
                    "send" if inline => sq
                        .push(Send::new(buf.slice(..p.size)).inline())
                        .map_err(|r| r.to_string()),
                    "send" => sq
                        .push(Send::new(buf.slice(..p.size)))
                        .map_err(|r| r.to_string()),
                    _ => {
                        let word = buf.word(0).map_err(|r| r.to_string())?;
                        sq.push(FetchAdd::new(word, words[slot], 1))
                            .map_err(|r| r.to_string())
                    }
                };
                pushed?;
                posted += 1;
            }
            sq.submit().map_err(|e| e.to_string())?;
        }
        ring.completion().reap(&mut done)?;
        for c in done.drain(..) {
            if !c.status().is_success() {
                return Err(format!("completion failed: {}", c.status()).into());
            }
            completed += 1;
            let base = c.into_buf();
            let chunk = match base.downcast::<PoolChunk>() {
                Ok(chunk) => chunk,
                Err(base) => match base.downcast::<rdma_ring::buf::Slice<PoolChunk>>() {
                    Ok(slice) => slice.into_inner(),
                    Err(base) => base
                        .downcast::<rdma_ring::buf::Word<PoolChunk>>()
                        .map_err(|_| "a buffer came back as another type")?
                        .into_inner(),
                },
            };
            bufs.push(chunk);
        }
    }
    if let Some(receiver) = receiver {
        receiver.stop()?;
    }
    let secs = start.elapsed().as_secs_f64();
    let mops = completed as f64 / secs / 1e6;
    let mbps = completed as f64 * p.size as f64 / secs / 1e6;
    println!(
        "perf: {} {} size={} batch={} depth={} signal={} inline={}: {completed} ops in {secs:.3} s = {mops:.4} Mops/s {mbps:.2} MB/s ({} doorbells, {} CQEs)",
        p.device,
        p.op,
        p.size,
        p.batch,
        p.depth,
        p.signal,
        p.inline,
        ring.stats().doorbells,
        ring.stats().cqes
    );
    Ok(())
}
