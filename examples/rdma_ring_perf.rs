//! `rdma-ring-perf`: perftest's bandwidth and latency tests, through the
//! ring — the sync path (batched posts, moderated completions), the
//! awaited one (`--async`: `--tx-depth` tasks awaiting one operation at a
//! time), or the fixed-buffer ring (`--fixed`: the same loop as the sync
//! path over slots of one registration; with `--async`, awaited through
//! `AsyncFixedRing`). Server and client as two processes (endpoints over a TCP
//! handshake), or both in one process (`--loopback`, also on the soft
//! device).
//!
//! ```text
//! rdma-ring-perf write bw -d rxe0 -x 1                 # server
//! rdma-ring-perf write bw -d rxe0 -x 1 127.0.0.1       # client: prints the table
//! rdma-ring-perf read lat --loopback -d soft -a --json
//! rdma-ring-perf send bw --loopback -d rxe0 -a --max-size 65536 --plot bw.svg
//! ```
//!
//! Latency: READ and atomics are round trips by nature; a WRITE's latency
//! is the time to its completion (the responder's ACK), a SEND's half the
//! round trip of a ping-pong (the server echoes), as `ib_send_lat` reports.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use rdma_ring::backend::soft::{Progress, SoftDevice};
use rdma_ring::backend::{ProtectionDomain, QpConfig, QueuePair};
use rdma_ring::buf::{BaseBuf, BufferPool, ExposedBuf, PoolChunk, RemoteAccess, RemoteSlice};
use rdma_ring::fixed::{
    FetchAddFixed, FixedBuf, FixedBufs, FixedCompletion, FixedOp, FixedQp, FixedRing,
    FixedRingConfig, ReadFixed, RecvFixed, SendFixed, WriteFixed,
};
use rdma_ring::future::{AsyncFixedRing, AsyncRing, FixedOpFuture, Wakeup};
use rdma_ring::op::{FetchAdd, Read, Recv, Send, Write};
use rdma_ring::ring::{Completion, Ring, RingConfig};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + std::marker::Send + Sync>>;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Op {
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
    /// SEND (the peer keeps receives posted).
    Send,
    /// Fetch-and-add on 8 bytes.
    Atomic,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Bandwidth and message rate.
    Bw,
    /// Latency percentiles, one operation at a time.
    Lat,
}

/// perftest's bandwidth and latency tests through rdma-ring.
#[derive(Parser, Debug, Clone)]
#[command(name = "rdma-ring-perf", version)]
struct Args {
    /// The verb to measure.
    #[arg(value_enum)]
    op: Op,
    /// What to measure.
    #[arg(value_enum)]
    mode: Mode,
    /// The server to connect to (client side); without it, and without
    /// --loopback, this process is the server.
    host: Option<String>,
    /// Message size in bytes (default 65536 for bw, 2 for lat; atomics: 8).
    #[arg(short = 's', long)]
    size: Option<usize>,
    /// Every size from 2 bytes to 8 MiB (or --max-size), doubling.
    #[arg(short = 'a', long)]
    all: bool,
    /// Largest size of --all.
    #[arg(long, default_value_t = 8 << 20)]
    max_size: usize,
    /// Operations per size (default 5000 for bw, 1000 for lat).
    #[arg(short = 'n', long)]
    iters: Option<u64>,
    /// Operations outstanding at once (tasks with --async).
    #[arg(short = 't', long, default_value_t = 128)]
    tx_depth: usize,
    /// Work requests per post (one doorbell each).
    #[arg(short = 'l', long, default_value_t = 1)]
    post_list: usize,
    /// A completion every this many work requests.
    #[arg(short = 'Q', long, default_value_t = 100)]
    cq_mod: usize,
    /// Largest message posted inline (WRITE and SEND).
    #[arg(short = 'I', long, default_value_t = 220)]
    inline_size: usize,
    /// Device: a verbs device name, `soft` or `noop` (the soft device with
    /// no execution cost, --loopback only); default: the first device,
    /// else soft.
    #[arg(short = 'd', long)]
    ib_dev: Option<String>,
    /// GID index (verbs).
    #[arg(short = 'x', long)]
    gid_index: Option<u8>,
    /// TCP port of the handshake.
    #[arg(short = 'p', long, default_value_t = 18515)]
    port: u16,
    /// Both sides in this process (two queue pairs of one device).
    #[arg(long)]
    loopback: bool,
    /// The awaited path: --tx-depth tasks, each awaiting one operation at
    /// a time (futures adapter, busy polling; with --fixed, the
    /// fixed-buffer ring's adapter).
    #[arg(long = "async")]
    awaited: bool,
    /// With --async: tasks that each push an operation and await it share
    /// doorbells (`coalesce_doorbells`, of either ring's adapter).
    #[arg(long, requires = "awaited")]
    coalesce: bool,
    /// The fixed-buffer ring (`rdma_ring::fixed`): the sync path's loop,
    /// with buffers that are slots of one registration (with --async:
    /// awaited, `AsyncFixedRing`).
    #[arg(long)]
    fixed: bool,
    /// Print the results as JSON too.
    #[arg(long)]
    json: bool,
    /// Draw message rate and bandwidth against size into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<String>,
}

impl Args {
    fn sizes(&self) -> Vec<usize> {
        if self.op == Op::Atomic {
            return vec![8];
        }
        if self.all {
            let mut sizes = Vec::new();
            let mut s = 2;
            while s <= self.max_size.min(8 << 20) {
                sizes.push(s);
                s *= 2;
            }
            return sizes;
        }
        vec![self.size.unwrap_or(match self.mode {
            Mode::Bw => 65536,
            Mode::Lat => 2,
        })]
    }

    fn iters(&self) -> u64 {
        self.iters.unwrap_or(match self.mode {
            Mode::Bw => 5000,
            Mode::Lat => 1000,
        })
    }

    fn depth(&self) -> usize {
        match self.mode {
            Mode::Bw => self.tx_depth,
            Mode::Lat => 1,
        }
    }

    fn qp_config(&self) -> QpConfig {
        QpConfig {
            max_send_wr: self.tx_depth as u32 + 1,
            max_recv_wr: RX_DEPTH as u32,
            max_inline_data: self.inline_size as u32,
            ..QpConfig::default()
        }
    }

    fn check(&self) -> Result<()> {
        if self.tx_depth == 0 || self.post_list == 0 || self.post_list > self.tx_depth {
            return Err("need 0 < --post-list <= --tx-depth".into());
        }
        if self.cq_mod == 0 {
            return Err("--cq-mod must be positive".into());
        }
        if self.sizes().contains(&0) {
            return Err("--size must be positive".into());
        }
        Ok(())
    }
}

/// Receives a SEND server keeps posted, as perftest's rx-depth.
const RX_DEPTH: usize = 512;

/// One size's figures.
#[derive(Clone, Debug)]
struct Row {
    bytes: usize,
    iters: u64,
    secs: f64,
    /// Latencies in µs, sorted (lat mode).
    lat: Vec<f64>,
}

impl Row {
    fn mbps(&self) -> f64 {
        self.iters as f64 * self.bytes as f64 / self.secs / 1e6
    }
    fn mpps(&self) -> f64 {
        self.iters as f64 / self.secs / 1e6
    }
    fn pct(&self, p: f64) -> f64 {
        let i = ((self.lat.len() as f64 - 1.0) * p).round() as usize;
        self.lat[i]
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rdma-ring-perf: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<()> {
    args.check()?;
    let device = args.ib_dev.clone().unwrap_or_else(default_device);
    let rows = if args.loopback {
        loopback(args, &device)?
    } else {
        match &args.host {
            Some(host) => verbs::client(args, &device, host)?,
            None => return verbs::server(args, &device),
        }
    };
    report(args, &device, &rows)
}

fn default_device() -> String {
    #[cfg(feature = "verbs")]
    if let Ok(names) = rdma_ring::backend::verbs::device_names() {
        if let Some(first) = names.into_iter().next() {
            return first;
        }
    }
    "soft".into()
}

/// Both queue pairs in this process.
fn loopback(args: &Args, device: &str) -> Result<Vec<Row>> {
    match device {
        "soft" | "noop" => {
            let progress = if device == "noop" {
                Progress::NoOp
            } else {
                Progress::Auto
            };
            if device == "noop" && args.op == Op::Send {
                return Err("the noop device delivers nothing: SEND needs `-d soft`".into());
            }
            let dev = SoftDevice::with_progress(progress);
            let pd = dev.alloc_pd();
            let (qa, qb) = dev.connected_pair(&pd, &pd, args.qp_config())?;
            loopback_pair(args, &pd, qa, qb)
        }
        name => verbs::loopback(args, name),
    }
}

/// The memory the client targets: room for `tx_depth` of the largest size.
fn expose<P: ProtectionDomain>(pd: &P, args: &Args) -> Result<ExposedBuf<Vec<u8>>> {
    let largest = args.sizes().into_iter().max().unwrap_or(8).max(8);
    let bytes = largest * args.depth().min(16);
    let rights = RemoteAccess::READ | RemoteAccess::WRITE | RemoteAccess::ATOMIC;
    Ok(ExposedBuf::new(pd, vec![0u8; bytes], rights)?)
}

/// How the client tells the server where it is in the plan.
trait Handoff {
    /// Before a size: the server gets ready for it.
    fn begin(&mut self, size: usize) -> Result<()>;
    /// After it: the server has seen everything.
    fn end(&mut self) -> Result<()>;
}

/// The server side of SEND tests: receives posted (before the peer may
/// send), then kept posted on a thread of its own, echoing each message
/// for latency.
struct SendServer<Q: QueuePair> {
    ring: Ring<Q>,
    pool: BufferPool,
    echo: bool,
}

impl<Q: QueuePair + std::marker::Send + 'static> SendServer<Q> {
    fn new<P: ProtectionDomain>(args: &Args, pd: &P, qp: Q) -> Result<Self> {
        let largest = args.sizes().into_iter().max().unwrap_or(8);
        // Echoed buffers are out of the pool until their sends complete.
        let pool = BufferPool::new(pd, largest, RX_DEPTH + 64)?;
        let mut ring = Ring::new(qp, RingConfig::default());
        for _ in 0..RX_DEPTH {
            ring.submission()
                .push(Recv::new(pool.take()?))
                .map_err(|r| r.to_string())?;
        }
        ring.submit().map_err(|e| e.error)?;
        Ok(SendServer {
            ring,
            pool,
            echo: args.mode == Mode::Lat,
        })
    }

    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    fn qp(&self) -> &Q {
        self.ring.qp()
    }

    fn start(self) -> Running {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&stop);
        let SendServer { ring, pool, echo } = self;
        let thread = std::thread::spawn(move || serve_sends(ring, &pool, echo, &flag));
        Running { stop, thread }
    }
}

/// A running [`SendServer`].
struct Running {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Result<()>>,
}

impl Running {
    fn stop(self) -> Result<()> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().map_err(|_| "the receiver panicked")?
    }
}

/// Runs the client over `qa` while `qb` plays the server, in this process.
fn loopback_pair<P: ProtectionDomain, Q: QueuePair + std::marker::Send + 'static>(
    args: &Args,
    pd: &P,
    qa: Q,
    qb: Q,
) -> Result<Vec<Row>> {
    let target = expose(pd, args)?;
    let (server, _idle) = if args.op == Op::Send {
        (Some(SendServer::new(args, pd, qb)?.start()), None)
    } else {
        (None, Some(qb))
    };
    let rows = measure_all(args, pd, qa, target.remote(), &mut NoSync);
    if let Some(server) = server {
        server.stop()?;
    }
    rows
}

/// Keeps `RX_DEPTH` receives posted; with `echo`, sends each message back
/// in the buffer it arrived in (a fresh buffer takes its place in the
/// receive queue, and the echoed one returns to the pool when its send
/// completes), so no reply ever waits for a buffer.
fn serve_sends<Q: QueuePair>(
    mut ring: Ring<Q>,
    pool: &BufferPool,
    echo: bool,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<()> {
    let mut got = Vec::new();
    let mut posted = RX_DEPTH;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        ring.completion().reap(&mut got)?;
        if got.is_empty() {
            continue;
        }
        let mut sq = ring.submission();
        for c in got.drain(..) {
            if !c.status().is_success() {
                return Err(format!("a completion failed: {}", c.status()).into());
            }
            if c.kind() != rdma_ring::op::OpKind::Recv {
                continue; // an echo sent: its buffer goes back to the pool
            }
            posted -= 1;
            let len = c.byte_len() as usize;
            let chunk: PoolChunk = c.into_buf().downcast().map_err(|_| "a foreign buffer")?;
            if echo {
                sq.push(Send::new(chunk.slice(..len)).signaled())
                    .map_err(|r| r.to_string())?;
            }
        }
        while posted < RX_DEPTH {
            let Ok(chunk) = pool.take() else { break };
            sq.push(Recv::new(chunk)).map_err(|r| r.to_string())?;
            posted += 1;
        }
        sq.submit().map_err(|e| e.error)?;
    }
    Ok(())
}

/// In one process the server's thread needs no telling.
struct NoSync;

impl Handoff for NoSync {
    fn begin(&mut self, _size: usize) -> Result<()> {
        Ok(())
    }
    fn end(&mut self) -> Result<()> {
        Ok(())
    }
}

fn measure_all<P: ProtectionDomain, Q: QueuePair + std::marker::Send + 'static>(
    args: &Args,
    pd: &P,
    qp: Q,
    remote: RemoteSlice,
    sync: &mut dyn Handoff,
) -> Result<Vec<Row>> {
    let ring_config = RingConfig {
        signal_interval: args.cq_mod.min(args.tx_depth),
        ..RingConfig::default()
    };
    let largest = args.sizes().into_iter().max().unwrap_or(8).max(8);
    if args.fixed {
        return measure_fixed(args, pd, qp, remote, largest, sync);
    }
    let pool = BufferPool::new(pd, largest, args.tx_depth.max(2) + 1)?;
    let mut rows = Vec::new();
    if args.awaited {
        let ring = AsyncRing::new(Ring::new(qp, ring_config), Wakeup::Busy)?;
        ring.coalesce_doorbells(args.coalesce);
        for size in args.sizes() {
            sync.begin(size)?;
            rows.push(measure_async(args, &ring, &pool, remote, size)?);
            sync.end()?;
        }
    } else {
        let mut ring = Ring::new(qp, ring_config);
        let mut perf = SyncRing {
            ring: &mut ring,
            pool: &pool,
            done: Vec::with_capacity(args.tx_depth),
        };
        rows = measure_sizes(args, &mut perf, remote, sync)?;
    }
    Ok(rows)
}

/// Every size of the run through `ring`, in step with the peer.
fn measure_sizes<R: PerfRing>(
    args: &Args,
    ring: &mut R,
    remote: RemoteSlice,
    sync: &mut dyn Handoff,
) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for size in args.sizes() {
        sync.begin(size)?;
        rows.push(match args.mode {
            Mode::Bw => bw(args, ring, remote, size)?,
            Mode::Lat => lat(args, ring, remote, size)?,
        });
        sync.end()?;
    }
    Ok(rows)
}

/// Targets of `size` bytes within `remote`, one per outstanding slot.
fn slots(args: &Args, remote: RemoteSlice, size: usize) -> Result<Vec<RemoteSlice>> {
    let stride = size.max(8) as u64;
    let n = (remote.len() / stride).clamp(1, args.depth() as u64);
    (0..n)
        .map(|i| Ok(remote.slice(i * stride..i * stride + size as u64)?))
        .collect()
}

/// What the bandwidth and latency loops need of a ring: buffers to take,
/// operations and receives to push, submit, and reaping that hands the
/// completed operations' buffers back.
trait PerfRing {
    type Buf;
    fn take(&mut self) -> Result<Self::Buf>;
    fn push(&mut self, args: &Args, buf: Self::Buf, slot: RemoteSlice, size: usize) -> Result<()>;
    fn push_recv(&mut self, buf: Self::Buf) -> Result<()>;
    fn submit(&mut self) -> Result<()>;
    /// Reaps what is ready into `bufs`, failing on a failed completion;
    /// returns how many.
    fn reap(&mut self, bufs: &mut Vec<Self::Buf>) -> Result<usize>;
    /// A buffer the loop is done with.
    fn give_back(&mut self, buf: Self::Buf) -> Result<()>;
}

fn text<T>(r: rdma_ring::Rejected<T>) -> String {
    r.to_string()
}

/// The sync ring over pool chunks.
struct SyncRing<'a, Q: QueuePair> {
    ring: &'a mut Ring<Q>,
    pool: &'a BufferPool,
    done: Vec<Completion>,
}

impl<Q: QueuePair> PerfRing for SyncRing<'_, Q> {
    type Buf = PoolChunk;
    fn take(&mut self) -> Result<PoolChunk> {
        Ok(self.pool.take()?)
    }
    fn push(&mut self, args: &Args, buf: PoolChunk, slot: RemoteSlice, size: usize) -> Result<()> {
        let inline = size <= args.inline_size;
        let mut sq = self.ring.submission();
        let pushed = match args.op {
            Op::Write if inline => sq
                .push(Write::new(buf.slice(..size), slot).inline())
                .map(|_| ())
                .map_err(text),
            Op::Write => sq
                .push(Write::new(buf.slice(..size), slot))
                .map(|_| ())
                .map_err(text),
            Op::Read => sq
                .push(Read::new(buf.slice(..size), slot))
                .map(|_| ())
                .map_err(text),
            Op::Send if inline => sq
                .push(Send::new(buf.slice(..size)).inline())
                .map(|_| ())
                .map_err(text),
            Op::Send => sq
                .push(Send::new(buf.slice(..size)))
                .map(|_| ())
                .map_err(text),
            Op::Atomic => {
                let word = buf.word(0).map_err(|r| r.to_string())?;
                sq.push(FetchAdd::new(word, slot.word(0)?, 1))
                    .map(|_| ())
                    .map_err(text)
            }
        };
        Ok(pushed?)
    }
    fn push_recv(&mut self, buf: PoolChunk) -> Result<()> {
        self.ring
            .submission()
            .push(Recv::new(buf))
            .map_err(|r| r.to_string())?;
        Ok(())
    }
    fn submit(&mut self) -> Result<()> {
        self.ring.submission().submit().map_err(|e| e.error)?;
        Ok(())
    }
    fn reap(&mut self, bufs: &mut Vec<PoolChunk>) -> Result<usize> {
        let n = self.ring.completion().reap(&mut self.done)?;
        for c in self.done.drain(..) {
            if !c.status().is_success() {
                return Err(format!("a completion failed: {}", c.status()).into());
            }
            bufs.push(chunk_of(c)?);
        }
        Ok(n)
    }
    fn give_back(&mut self, _buf: PoolChunk) -> Result<()> {
        // Dropped, a chunk goes back to its pool.
        Ok(())
    }
}

/// The pool chunk inside a completed operation's buffer.
fn chunk_of(c: Completion) -> Result<PoolChunk> {
    let base = c.into_buf();
    let chunk = match base.downcast::<rdma_ring::buf::Slice<PoolChunk>>() {
        Ok(slice) => slice.into_inner(),
        Err(base) => base
            .downcast::<rdma_ring::buf::Word<PoolChunk>>()
            .map_err(|_| "a buffer came back as another type")?
            .into_inner(),
    };
    Ok(chunk)
}

/// The fixed-buffer ring over its slots.
struct FixedPerf<'a, Q: QueuePair> {
    ring: &'a mut FixedRing<Q>,
    qp: FixedQp,
}

impl<Q: QueuePair> PerfRing for FixedPerf<'_, Q> {
    type Buf = FixedBuf;
    fn take(&mut self) -> Result<FixedBuf> {
        Ok(self.ring.take_buf().ok_or("the slots are all taken")?)
    }
    fn push(&mut self, args: &Args, buf: FixedBuf, slot: RemoteSlice, size: usize) -> Result<()> {
        push_fixed(args, &mut *self.ring, self.qp, buf, slot, size)
    }
    fn push_recv(&mut self, buf: FixedBuf) -> Result<()> {
        self.ring.push(self.qp, RecvFixed::new(buf)).map_err(text)?;
        Ok(())
    }
    fn submit(&mut self) -> Result<()> {
        self.ring.submit()?;
        Ok(())
    }
    fn reap(&mut self, bufs: &mut Vec<FixedBuf>) -> Result<usize> {
        // Each completion as it is made: no list to fill and drain.
        let mut failed = None;
        let n = self.ring.reap_each(|c| {
            if !c.status().is_success() {
                failed.get_or_insert(c.status());
            }
            bufs.push(c.into_buf());
        })?;
        if let Some(status) = failed {
            return Err(format!("a completion failed: {status}").into());
        }
        Ok(n)
    }
    fn give_back(&mut self, buf: FixedBuf) -> Result<()> {
        self.ring.put_buf(buf).map_err(text)?;
        Ok(())
    }
}

/// Bandwidth: `--tx-depth` operations outstanding, pushed `--post-list`
/// to a doorbell.
fn bw<R: PerfRing>(args: &Args, ring: &mut R, remote: RemoteSlice, size: usize) -> Result<Row> {
    let iters = args.iters();
    let slots = slots(args, remote, size)?;
    let mut bufs = (0..args.tx_depth)
        .map(|_| ring.take())
        .collect::<Result<Vec<_>>>()?;
    let (mut posted, mut completed) = (0u64, 0u64);
    let start = Instant::now();
    while completed < iters {
        while bufs.len() >= args.post_list && posted < iters {
            let n = args.post_list.min((iters - posted) as usize);
            for _ in 0..n {
                let buf = bufs.pop().expect("counted");
                ring.push(args, buf, slots[posted as usize % slots.len()], size)?;
                posted += 1;
            }
            ring.submit()?;
        }
        completed += ring.reap(&mut bufs)? as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    for buf in bufs {
        ring.give_back(buf)?;
    }
    Ok(Row {
        bytes: size,
        iters,
        secs,
        lat: Vec::new(),
    })
}

/// Latency: one operation at a time (a SEND with the receive for its
/// echo), busy polling, as perftest does.
fn lat<R: PerfRing>(args: &Args, ring: &mut R, remote: RemoteSlice, size: usize) -> Result<Row> {
    let iters = args.iters();
    let slot = slots(args, remote, size)?[0];
    let mut lat = Vec::with_capacity(iters as usize);
    let mut back = Vec::with_capacity(2);
    let start = Instant::now();
    for _ in 0..iters {
        let t = Instant::now();
        let mut expect = 1;
        if args.op == Op::Send {
            let echo = ring.take()?;
            ring.push_recv(echo)?;
            expect = 2;
        }
        let buf = ring.take()?;
        ring.push(args, buf, slot, size)?;
        ring.submit()?;
        let mut seen = 0;
        while seen < expect {
            seen += ring.reap(&mut back)?;
        }
        for buf in back.drain(..) {
            ring.give_back(buf)?;
        }
        let us = t.elapsed().as_secs_f64() * 1e6;
        lat.push(if args.op == Op::Send { us / 2.0 } else { us });
    }
    let secs = start.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    Ok(Row {
        bytes: size,
        iters,
        secs,
        lat,
    })
}

fn measure_fixed<P: ProtectionDomain, Q: QueuePair + std::marker::Send + 'static>(
    args: &Args,
    pd: &P,
    mut qp: Q,
    remote: RemoteSlice,
    largest: usize,
    sync: &mut dyn Handoff,
) -> Result<Vec<Row>> {
    let cq = qp
        .take_cq()
        .ok_or("the queue pair has no completion queue of its own")?;
    let slot_len = u32::try_from(largest).map_err(|_| "--max-size too large")?;
    let bufs = FixedBufs::new(pd, args.tx_depth as u32 + 2, slot_len)?;
    let config = FixedRingConfig {
        signal_interval: args.cq_mod.min(args.tx_depth) as u32,
        ..FixedRingConfig::default()
    };
    let mut ring = FixedRing::new(cq, bufs, config);
    if args.awaited {
        let ring = AsyncFixedRing::new(ring, Wakeup::Busy).map_err(rdma_ring::Error::from)?;
        ring.coalesce_doorbells(args.coalesce);
        let qp = ring.attach(qp).map_err(|r| r.error().to_string())?;
        let mut rows = Vec::new();
        for size in args.sizes() {
            sync.begin(size)?;
            rows.push(measure_fixed_async(args, &ring, qp, remote, size)?);
            sync.end()?;
        }
        return Ok(rows);
    }
    let qp = ring.attach(qp).map_err(|r| r.error().to_string())?;
    let mut perf = FixedPerf {
        ring: &mut ring,
        qp,
    };
    measure_sizes(args, &mut perf, remote, sync)
}

/// Either fixed-buffer ring, to push to: the sync one (nothing comes
/// back) or the awaited one (the operation's future).
trait PushFixed {
    type Pushed;
    fn push_op<O: FixedOp>(self, qp: FixedQp, op: O) -> Result<Self::Pushed>;
}

impl<Q: QueuePair> PushFixed for &mut FixedRing<Q> {
    type Pushed = ();
    fn push_op<O: FixedOp>(self, qp: FixedQp, op: O) -> Result<()> {
        Ok(self.push(qp, op).map_err(text)?)
    }
}

impl<Q: QueuePair + std::marker::Send + 'static> PushFixed for &AsyncFixedRing<Q> {
    type Pushed = FixedOpFuture<Q>;
    fn push_op<O: FixedOp>(self, qp: FixedQp, op: O) -> Result<FixedOpFuture<Q>> {
        Ok(self.push(qp, op).map_err(text)?)
    }
}

/// Pushes the run's operation on `buf` through either fixed-buffer ring.
fn push_fixed<P: PushFixed>(
    args: &Args,
    ring: P,
    qp: FixedQp,
    buf: FixedBuf,
    slot: RemoteSlice,
    size: usize,
) -> Result<P::Pushed> {
    let inline = size <= args.inline_size;
    let len = size as u32;
    match args.op {
        Op::Write if inline => ring.push_op(qp, WriteFixed::new(buf, len, slot).inline()),
        Op::Write => ring.push_op(qp, WriteFixed::new(buf, len, slot)),
        Op::Read => ring.push_op(qp, ReadFixed::new(buf, len, slot)),
        Op::Send if inline => ring.push_op(qp, SendFixed::new(buf, len).inline()),
        Op::Send => ring.push_op(qp, SendFixed::new(buf, len)),
        Op::Atomic => ring.push_op(qp, FetchAddFixed::new(buf, slot.word(0)?, 1)),
    }
}

/// A completion's slot, if it succeeded.
fn succeeded(c: FixedCompletion) -> Result<FixedBuf> {
    if !c.status().is_success() {
        return Err(format!("a completion failed: {}", c.status()).into());
    }
    Ok(c.into_buf())
}

/// The awaited path over the fixed-buffer ring: `--tx-depth` tasks, each
/// with its own slot, awaiting one operation at a time.
fn measure_fixed_async<Q: QueuePair + std::marker::Send + 'static>(
    args: &Args,
    ring: &AsyncFixedRing<Q>,
    qp: FixedQp,
    remote: RemoteSlice,
    size: usize,
) -> Result<Row> {
    run_tasks(args, remote, size, |slot, mine| async move {
        let mut lat = Vec::new();
        let mut buf = ring.take_buf().ok_or("the slots are all taken")?;
        let ping_pong = args.op == Op::Send && args.mode == Mode::Lat;
        let mut echo_buf = if ping_pong {
            Some(ring.take_buf().ok_or("the slots are all taken")?)
        } else {
            None
        };
        for _ in 0..mine {
            let t = (args.mode == Mode::Lat).then(Instant::now);
            // The echo's receive goes first.
            let echo = match echo_buf.take() {
                Some(b) => Some(ring.push(qp, RecvFixed::new(b)).map_err(text)?),
                None => None,
            };
            buf = succeeded(push_fixed(args, ring, qp, buf, slot, size)?.await?)?;
            if let Some(echo) = echo {
                echo_buf = Some(succeeded(echo.await?)?);
            }
            if let Some(t) = t {
                let us = t.elapsed().as_secs_f64() * 1e6;
                lat.push(if args.op == Op::Send { us / 2.0 } else { us });
            }
        }
        ring.put_buf(buf).map_err(text)?;
        if let Some(b) = echo_buf {
            ring.put_buf(b).map_err(text)?;
        }
        Ok(lat)
    })
}

fn measure_async<Q: QueuePair + std::marker::Send + 'static>(
    args: &Args,
    ring: &AsyncRing<Q>,
    pool: &BufferPool,
    remote: RemoteSlice,
    size: usize,
) -> Result<Row> {
    run_tasks(args, remote, size, |slot, mine| async move {
        let mut lat = Vec::new();
        for _ in 0..mine {
            // Timed only for latency: bandwidth runs read no clock per
            // operation (the sync path reads none either).
            let t = (args.mode == Mode::Lat).then(Instant::now);
            let buf = pool.take()?;
            let result = match args.op {
                Op::Write => ring.write(buf.slice(..size), slot).await.0,
                Op::Read => ring.read(buf.slice(..size), slot).await.0,
                Op::Send if args.mode == Mode::Lat => {
                    // The echo's receive goes first.
                    let echo = ring.recv(pool.take()?);
                    let sent = ring.send(buf.slice(..size)).await.0;
                    echo.await.0.map(|r| r.len).and(sent)
                }
                Op::Send => ring.send(buf.slice(..size)).await.0,
                Op::Atomic => {
                    let word = buf.word(0).map_err(|r| r.to_string())?;
                    ring.fetch_add(word, slot.word(0)?, 1).await.0
                }
            };
            result?;
            if let Some(t) = t {
                let us = t.elapsed().as_secs_f64() * 1e6;
                lat.push(if args.op == Op::Send { us / 2.0 } else { us });
            }
        }
        Ok(lat)
    })
}

/// Runs `--tx-depth` tasks (one at a time for latency) on one executor
/// thread, each `one_task(slot, operations)` returning its latencies, with
/// the run's operations shared out, and makes the size's row.
fn run_tasks<F: std::future::Future<Output = Result<Vec<f64>>>>(
    args: &Args,
    remote: RemoteSlice,
    size: usize,
    one_task: impl Fn(RemoteSlice, u64) -> F,
) -> Result<Row> {
    let iters = args.iters();
    let slots = slots(args, remote, size)?;
    let tasks = args.depth() as u64;
    let start = Instant::now();
    let all = futures::executor::block_on(futures::future::join_all((0..tasks).map(|task| {
        let mine = iters / tasks + u64::from(task < iters % tasks);
        one_task(slots[task as usize % slots.len()], mine)
    })));
    let secs = start.elapsed().as_secs_f64();
    let mut lat = Vec::new();
    for task in all {
        lat.extend(task?);
    }
    lat.sort_by(f64::total_cmp);
    Ok(Row {
        bytes: size,
        iters: args.iters(),
        secs,
        lat: if args.mode == Mode::Lat {
            lat
        } else {
            Vec::new()
        },
    })
}

fn report(args: &Args, device: &str, rows: &[Row]) -> Result<()> {
    let path = match (args.fixed, args.awaited, args.coalesce) {
        (true, false, _) => "fixed-buffer",
        (true, true, false) => "fixed-buffer, awaited",
        (true, true, true) => "fixed-buffer, awaited, doorbells coalesced",
        (false, false, _) => "sync",
        (false, true, false) => "awaited",
        (false, true, true) => "awaited, doorbells coalesced",
    };
    let line = "-".repeat(86);
    println!("{line}");
    println!(
        " rdma-ring-perf {} | device {device} | {path} path | tx depth {} | post list {} | CQ moderation {} | inline {}",
        format!("{:?} {:?}", args.op, args.mode).to_lowercase(),
        args.tx_depth,
        args.post_list,
        args.cq_mod,
        args.inline_size
    );
    println!("{line}");
    match args.mode {
        Mode::Bw => {
            println!(
                " {:>10} {:>12} {:>16} {:>14}",
                "#bytes", "#iterations", "BW average[MB/s]", "MsgRate[Mpps]"
            );
            for r in rows {
                println!(
                    " {:>10} {:>12} {:>16.2} {:>14.6}",
                    r.bytes,
                    r.iters,
                    r.mbps(),
                    r.mpps()
                );
            }
        }
        Mode::Lat => {
            println!(
                " {:>10} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10}",
                "#bytes",
                "#iterations",
                "t_min[us]",
                "t_p50[us]",
                "t_p99[us]",
                "t_p99.9[us]",
                "t_max[us]"
            );
            for r in rows {
                println!(
                    " {:>10} {:>12} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
                    r.bytes,
                    r.iters,
                    r.lat[0],
                    r.pct(0.5),
                    r.pct(0.99),
                    r.pct(0.999),
                    r.lat[r.lat.len() - 1]
                );
            }
        }
    }
    println!("{line}");
    if args.json {
        println!("{}", json(args, device, rows));
    }
    if let Some(file) = &args.plot {
        plot(args, rows, file)?;
        println!("plot: {file}");
    }
    Ok(())
}

fn json(args: &Args, device: &str, rows: &[Row]) -> String {
    let rows: Vec<String> = rows
        .iter()
        .map(|r| {
            let lat = if r.lat.is_empty() {
                String::new()
            } else {
                format!(
                    ",\"t_min_us\":{:.3},\"t_p50_us\":{:.3},\"t_p99_us\":{:.3},\"t_p999_us\":{:.3},\"t_max_us\":{:.3}",
                    r.lat[0],
                    r.pct(0.5),
                    r.pct(0.99),
                    r.pct(0.999),
                    r.lat[r.lat.len() - 1]
                )
            };
            format!(
                "{{\"bytes\":{},\"iterations\":{},\"seconds\":{:.6},\"mb_per_s\":{:.3},\"mpps\":{:.6}{lat}}}",
                r.bytes,
                r.iters,
                r.secs,
                r.mbps(),
                r.mpps()
            )
        })
        .collect();
    format!(
        "{{\"tool\":\"rdma-ring-perf\",\"op\":\"{:?}\",\"mode\":\"{:?}\",\"device\":\"{device}\",\"path\":\"{}\",\"tx_depth\":{},\"post_list\":{},\"cq_mod\":{},\"inline\":{},\"results\":[{}]}}",
        args.op,
        args.mode,
        if args.fixed && args.awaited {
            "fixed-awaited"
        } else if args.fixed {
            "fixed"
        } else if args.awaited {
            "awaited"
        } else {
            "sync"
        },
        args.tx_depth,
        args.post_list,
        args.cq_mod,
        args.inline_size,
        rows.join(",")
    )
    .to_lowercase()
}

fn plot(args: &Args, rows: &[Row], file: &str) -> Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(file, (900, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(350);
    let xs: Vec<f64> = rows.iter().map(|r| (r.bytes as f64).log2()).collect();
    let (x0, x1) = (
        xs.iter().copied().fold(f64::MAX, f64::min),
        xs.iter().copied().fold(f64::MIN, f64::max),
    );
    let x1 = if x1 > x0 { x1 } else { x0 + 1.0 };
    let title = format!("rdma-ring-perf {:?} {:?}", args.op, args.mode).to_lowercase();
    for (area, name, value) in [
        (&top, "message rate [Mpps]", Row::mpps as fn(&Row) -> f64),
        (&bottom, "bandwidth [MB/s]", Row::mbps as fn(&Row) -> f64),
    ] {
        let ys: Vec<f64> = rows.iter().map(value).collect();
        let y1 = ys.iter().copied().fold(0.0, f64::max).max(1e-9) * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption(format!("{title}: {name}"), ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(x0..x1, 0.0..y1)?;
        chart
            .configure_mesh()
            .x_desc("message size [log2 bytes]")
            .y_desc(name)
            .draw()?;
        chart.draw_series(LineSeries::new(
            xs.iter().copied().zip(ys.iter().copied()),
            &BLUE,
        ))?;
        chart.draw_series(
            xs.iter()
                .zip(&ys)
                .map(|(&x, &y)| Circle::new((x, y), 3, BLUE.filled())),
        )?;
    }
    root.present()?;
    Ok(())
}

#[cfg(feature = "verbs")]
mod verbs {
    //! Server and client over a TCP handshake; loopback on one device.

    use super::*;
    use rdma_ring::backend::verbs::{DeviceOptions, VerbsDevice, VerbsPd};
    use rdma_ring::connect::tcp;

    const TIMEOUT: Duration = Duration::from_secs(30);
    /// What the client tells the server before each size, and after.
    const BEGIN: u8 = b'B';
    const END: u8 = b'E';
    const READY: u8 = b'R';
    const BYE: u8 = b'Q';

    fn open(args: &Args, name: &str) -> Result<(VerbsDevice, VerbsPd)> {
        let dev = VerbsDevice::open_with(
            name,
            DeviceOptions {
                gid_index: args.gid_index,
                ..DeviceOptions::default()
            },
        )?;
        let pd = dev.alloc_pd()?;
        Ok((dev, pd))
    }

    pub fn loopback(args: &Args, name: &str) -> Result<Vec<Row>> {
        let (dev, pd) = open(args, name)?;
        let qa = dev.create_qp(&pd, args.qp_config())?;
        let qb = dev.create_qp(&pd, args.qp_config())?;
        let (ea, eb) = (qa.endpoint(), qb.endpoint());
        qa.connect(&eb)?;
        qb.connect(&ea)?;
        loopback_pair(args, &pd, qa, qb)
    }

    /// The server: waits for one client, then follows its plan. Its
    /// receives (for SEND) are posted before the handshake.
    pub fn server(args: &Args, name: &str) -> Result<()> {
        let (dev, pd) = open(args, name)?;
        let listener = TcpListener::bind(("0.0.0.0", args.port))?;
        println!(
            "rdma-ring-perf: server on {name}, waiting on port {}",
            args.port
        );
        let (mut stream, peer_addr) = listener.accept()?;
        let qp = dev.create_qp(&pd, args.qp_config())?;
        let target = expose(&pd, args)?;
        // A SEND server's receives go in before the handshake, so no SEND
        // meets an empty queue; otherwise the queue pair only has to stay.
        let (server, _idle) = if args.op == Op::Send {
            let server = SendServer::new(args, &pd, qp)?;
            tcp::handshake(&mut stream, server.qp(), TIMEOUT)?;
            (Some(server), None)
        } else {
            tcp::handshake(&mut stream, &qp, TIMEOUT)?;
            (None, Some(qp))
        };
        stream.write_all(&target.remote().encode())?;
        let running = server.map(SendServer::start);
        let served = serve_plan(&mut stream);
        if let Some(running) = running {
            running.stop()?;
        }
        served?;
        println!("rdma-ring-perf: client {peer_addr} done");
        Ok(())
    }

    /// Answers BEGIN with READY and END with READY until BYE.
    fn serve_plan(stream: &mut TcpStream) -> Result<()> {
        stream.set_read_timeout(None)?;
        let mut byte = [0u8; 1];
        loop {
            if stream.read(&mut byte)? == 0 {
                return Ok(()); // the client left
            }
            match byte[0] {
                BEGIN | END => stream.write_all(&[READY])?,
                BYE => return Ok(()),
                other => return Err(format!("unexpected byte {other:#04x} from the client").into()),
            }
        }
    }

    struct RemoteSync<'a>(&'a mut TcpStream);

    impl RemoteSync<'_> {
        fn say(&mut self, byte: u8) -> Result<()> {
            self.0.write_all(&[byte])?;
            let mut answer = [0u8; 1];
            self.0.read_exact(&mut answer)?;
            if answer[0] != READY {
                return Err("the server did not answer".into());
            }
            Ok(())
        }
    }

    impl Handoff for RemoteSync<'_> {
        fn begin(&mut self, _size: usize) -> Result<()> {
            self.say(BEGIN)
        }
        fn end(&mut self) -> Result<()> {
            self.say(END)
        }
    }

    pub fn client(args: &Args, name: &str, host: &str) -> Result<Vec<Row>> {
        let (dev, pd) = open(args, name)?;
        // The server may still be starting: try for a while, as a client
        // started beside its server would want.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut stream = loop {
            match tcp::dial((host, args.port), TIMEOUT) {
                Ok(stream) => break stream,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                Err(e) => return Err(e.into()),
            }
        };
        let qp = dev.create_qp(&pd, args.qp_config())?;
        // SEND latency's echoes find receives posted by the measurement
        // itself, each before its send.
        tcp::handshake(&mut stream, &qp, TIMEOUT)?;
        let mut record = [0u8; rdma_ring::buf::REMOTE_SLICE_WIRE_LEN];
        stream.set_read_timeout(Some(TIMEOUT))?;
        stream.read_exact(&mut record)?;
        let remote = RemoteSlice::decode(&record)?;
        let rows = measure_all(args, &pd, qp, remote, &mut RemoteSync(&mut stream))?;
        stream.write_all(&[BYE])?;
        Ok(rows)
    }
}

#[cfg(not(feature = "verbs"))]
mod verbs {
    use super::*;

    pub fn loopback(_: &Args, name: &str) -> Result<Vec<Row>> {
        Err(format!("device {name:?}: this build has no verbs backend").into())
    }
    pub fn server(_: &Args, _: &str) -> Result<()> {
        Err("a server needs the verbs backend".into())
    }
    pub fn client(_: &Args, _: &str, _: &str) -> Result<Vec<Row>> {
        Err("a client needs the verbs backend".into())
    }
}
