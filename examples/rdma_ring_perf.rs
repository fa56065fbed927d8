//! `rdma-ring-perf`: perftest's bandwidth and latency tests, through the
//! ring — the sync path (batched posts, moderated completions), the
//! awaited one (`--async`: `--tx-depth` tasks awaiting one operation at a
//! time), or the fixed-buffer ring (`--fixed`: the same loop as the sync
//! path over slots of one registration; with `--async`, awaited through
//! `AsyncFixedRing`). Server and client as two processes (endpoints over a TCP
//! handshake, the client's plan first, which the server checks against its
//! own), or both in one process (`--loopback`, also on the soft device).
//!
//! ```text
//! rdma-ring-perf write bw -d rxe0 -x 1                 # server
//! rdma-ring-perf write bw -d rxe0 -x 1 127.0.0.1       # client: prints the table
//! rdma-ring-perf read lat --loopback -d soft -a --json
//! rdma-ring-perf send bw --loopback -d rxe0 -a --max-size 65536 --plot bw.svg
//! ```
//!
//! Latency: READ and atomics are round trips by nature; a WRITE's and a
//! SEND's are half the round trip of a ping-pong, as `ib_write_lat` and
//! `ib_send_lat` report: the server WRITEs each WRITE back (seen by
//! polling the last byte of the client's memory, as perftest does) or
//! sends each SEND back.

use std::cell::Cell;
// The control connection of two processes, which need the verbs backend.
#[cfg(feature = "verbs")]
use std::io::{Read as _, Write as _};
#[cfg(feature = "verbs")]
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use rdma_ring::backend::soft::{Progress, SoftDevice};
use rdma_ring::backend::{
    PostError, ProtectionDomain, QpCaps, QpConfig, QueuePair, RecvWr, SendFlags, SendWr, Sge,
};
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

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::Read => "read",
            Op::Send => "send",
            Op::Atomic => "atomic",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Bandwidth and message rate.
    Bw,
    /// Latency percentiles, one operation at a time (so -t, -l and -Q do
    /// not apply); WRITE and SEND as half a ping-pong's round trip (the
    /// server echoes), READ and atomics as round trips.
    Lat,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Bw => "bw",
            Mode::Lat => "lat",
        }
    }
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
    /// --loopback, this process is the server. Server and client must be
    /// given the same op, mode, sizes, -t and -I: the server refuses a
    /// client whose plan differs.
    host: Option<String>,
    /// Message size in bytes (default 65536 for bw, 2 for lat; atomics
    /// always move 8).
    #[arg(short = 's', long, conflicts_with = "all")]
    size: Option<usize>,
    /// Every size from 2 bytes to 8 MiB (or --max-size), doubling.
    #[arg(short = 'a', long)]
    all: bool,
    /// Largest size of --all, from 2 to 8388608 [default: 8388608].
    #[arg(long, requires = "all")]
    max_size: Option<usize>,
    /// Operations per size, at least 1 (default 5000 for bw, 1000 for lat).
    #[arg(short = 'n', long)]
    iters: Option<u64>,
    /// Operations outstanding at once (tasks with --async); bw only, as
    /// latency runs one at a time [default: 128]. Lowered, and the header
    /// says so, to keep each side's buffers within 256 MiB (all of the
    /// largest size), and for SEND to half the receives the server keeps
    /// posted.
    #[arg(short = 't', long)]
    tx_depth: Option<usize>,
    /// Work requests per post (one doorbell each); bw only, and not with
    /// --async, where each task posts its own operation (--coalesce
    /// shares doorbells) [default: 1].
    #[arg(short = 'l', long)]
    post_list: Option<usize>,
    /// CQ moderation: ask for a CQE every this many work requests; bw only
    /// [default: 100]. The ring also asks one for the last work request of
    /// every post, so a CQE is asked at least every min(Q, l) operations
    /// (--fixed first rounds Q down to a power of two; --async posts each
    /// operation alone, so asks one for each, unless --coalesce). The
    /// header and the JSON (`cqe_per_op`) give the CQEs actually asked per
    /// operation.
    #[arg(short = 'Q', long)]
    cq_mod: Option<usize>,
    /// Largest message posted inline (WRITE and SEND, and the echo of a
    /// SEND latency server) [default, as perftest's: 220 for write lat,
    /// 236 for send lat, 0 otherwise].
    #[arg(short = 'I', long)]
    inline_size: Option<usize>,
    /// Device: a verbs device name, `soft` or `noop` (the soft device with
    /// no execution cost; both --loopback only); default: the first
    /// device, else soft.
    #[arg(short = 'd', long)]
    ib_dev: Option<String>,
    /// GID index (verbs).
    #[arg(short = 'x', long)]
    gid_index: Option<u8>,
    /// RDMA READs and atomics in flight at once (each side asks; the
    /// device's limits and the peer's answer bound it) [default, as
    /// perftest's: the device's limit].
    #[arg(short = 'o', long = "outs")]
    outs: Option<u8>,
    /// Traffic class of this side's packets (RoCE: DSCP << 2), as
    /// perftest's --tclass.
    #[arg(long = "tclass", default_value_t = 0)]
    traffic_class: u8,
    /// Service level of this side's packets, 0 to 15, as perftest's -S.
    #[arg(short = 'S', long = "sl", default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=15))]
    service_level: u8,
    /// TCP port of the handshake.
    #[arg(short = 'p', long, default_value_t = 18515)]
    port: u16,
    /// Both sides in this process (two queue pairs of one device).
    #[arg(long, conflicts_with = "host")]
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

/// Receives a SEND server keeps posted at most, as perftest's rx-depth.
const RX_DEPTH: usize = 512;
/// The deepest `-t` (the send queue holds one more).
const MAX_TX_DEPTH: usize = 16383;
/// The most `-I` may ask for inline (far past any device's room).
const MAX_INLINE: usize = 1 << 16;

/// Each side's buffers (all of the largest size, since a posted receive
/// cannot be taken back to post a larger one) stay within this, so `-a`
/// up to 8 MiB fits a 2 GiB VM with both sides in one process.
const BUF_BUDGET: usize = 256 << 20;

/// The largest message: RDMA's limit (and the fixed-buffer ring's slots).
const MAX_MESSAGE: usize = 1 << 31;

/// The largest size of `-a`, as perftest's.
const MAX_ALL: usize = 8 << 20;

impl Args {
    fn sizes(&self) -> Vec<usize> {
        if self.op == Op::Atomic {
            return vec![8];
        }
        if self.all {
            let mut sizes = Vec::new();
            let mut s = 2;
            while s <= self.max_size.unwrap_or(MAX_ALL) {
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

    /// Every buffer's size: the largest message, and room for an atomic's
    /// word.
    fn largest(&self) -> usize {
        self.sizes().into_iter().max().unwrap_or(8).max(8)
    }

    /// The largest message posted inline: `-I`, else perftest's default
    /// for the test.
    fn inline(&self) -> usize {
        self.inline_size.unwrap_or(match (self.mode, self.op) {
            (Mode::Lat, Op::Write) => 220,
            (Mode::Lat, Op::Send) => 236,
            _ => 0,
        })
    }

    fn iters(&self) -> u64 {
        self.iters.unwrap_or(match self.mode {
            Mode::Bw => 5000,
            Mode::Lat => 1000,
        })
    }

    fn tx_depth(&self) -> usize {
        self.tx_depth.unwrap_or(128)
    }

    fn cq_mod(&self) -> usize {
        self.cq_mod.unwrap_or(100)
    }

    /// Operations outstanding at once: `-t` in bw mode within the memory
    /// budget (and, for SEND, half the server's receives, so a server a
    /// little behind in reposting does not starve the sender), 1 for
    /// latency.
    fn depth(&self) -> usize {
        match self.mode {
            Mode::Lat => 1,
            Mode::Bw if self.op == Op::Send => self.tx_depth().min((self.recv_depth() / 2).max(1)),
            Mode::Bw => self.tx_depth().min((BUF_BUDGET / self.largest()).max(1)),
        }
    }

    /// Work requests per post, within the depth.
    fn post_list(&self) -> usize {
        self.post_list.unwrap_or(1).min(self.depth())
    }

    /// Receives a SEND server keeps posted, all of the largest size.
    fn recv_depth(&self) -> usize {
        (BUF_BUDGET / self.largest()).clamp(1, RX_DEPTH)
    }

    /// Buffers the client holds at once: one per outstanding operation,
    /// and in a SEND ping-pong the echo's receive too.
    fn client_bufs(&self) -> usize {
        let per_op = if self.op == Op::Send && self.mode == Mode::Lat {
            2
        } else {
            1
        };
        self.depth() * per_op
    }

    /// Refuses a queue pair that cannot post inline what `-I` asks (a
    /// device that takes less is given less): perftest stops there too,
    /// before anything runs.
    fn granted(&self, caps: QpCaps) -> Result<()> {
        let inline = self.inline();
        if (caps.max_inline_data as usize) < inline {
            return Err(format!(
                "-I {inline}: the device refused that much inline, and the queue pair was \
                 given {} bytes; ask for that or less",
                caps.max_inline_data
            )
            .into());
        }
        Ok(())
    }

    fn qp_config(&self) -> QpConfig {
        QpConfig {
            max_send_wr: self.tx_depth() as u32 + 1,
            max_recv_wr: RX_DEPTH as u32,
            max_inline_data: self.inline() as u32,
            // A SEND that finds the receiver momentarily without a receive
            // (a server thread descheduled under TCG) waits for it, as
            // perftest's do, rather than failing the run; the watchdog
            // still fails a receiver that never comes back.
            rnr_retry: if self.op == Op::Send && self.mode == Mode::Bw {
                7
            } else {
                QpConfig::default().rnr_retry
            },
            max_rd_atomic: self.outs.unwrap_or(u8::MAX),
            traffic_class: self.traffic_class,
            service_level: self.service_level,
            ..QpConfig::default()
        }
    }

    fn check(&self) -> Result<()> {
        if self.iters == Some(0) {
            return Err("-n/--iters must be at least 1".into());
        }
        if self.mode == Mode::Lat {
            // Latency runs one operation at a time, each its own post with
            // its own CQE: these would change nothing.
            for (given, flag) in [
                (self.tx_depth.is_some(), "-t/--tx-depth"),
                (self.post_list.is_some(), "-l/--post-list"),
                (self.cq_mod.is_some(), "-Q/--cq-mod"),
            ] {
                if given {
                    return Err(format!(
                        "{flag} applies to bandwidth only: latency runs one operation at a time"
                    )
                    .into());
                }
            }
        }
        if self.awaited && self.post_list.is_some_and(|l| l > 1) {
            let why = "-l/--post-list does nothing with --async: each task posts its own \
                       operation (--coalesce shares doorbells among them)";
            return Err(why.into());
        }
        let post_list = self.post_list.unwrap_or(1);
        if self.tx_depth() == 0 || post_list == 0 || post_list > self.tx_depth() {
            return Err("need 0 < --post-list <= --tx-depth".into());
        }
        // The send queue holds one more, for the ring's teardown marker;
        // a device may allow less (it says so when the queue pair is
        // made).
        if self.tx_depth() > MAX_TX_DEPTH {
            return Err(format!("-t/--tx-depth must be at most {MAX_TX_DEPTH}").into());
        }
        if self.inline() > MAX_INLINE {
            return Err(format!("-I/--inline-size must be at most {MAX_INLINE}").into());
        }
        if self.cq_mod() == 0 {
            return Err("--cq-mod must be positive".into());
        }
        if self.op == Op::Atomic && (self.all || self.size.is_some_and(|s| s != 8)) {
            return Err("atomics move 8 bytes: -s and -a do not apply".into());
        }
        if let Some(max) = self.max_size {
            if !(2..=MAX_ALL).contains(&max) {
                return Err(
                    format!("--max-size must be from 2 to {MAX_ALL} (8 MiB), not {max}").into(),
                );
            }
        }
        if let Some(size) = self.size {
            if size == 0 || size > MAX_MESSAGE {
                return Err(
                    format!("--size must be from 1 to {MAX_MESSAGE} (2 GiB), not {size}").into(),
                );
            }
        }
        if self.mode == Mode::Lat {
            // Every latency sample is kept, for the percentiles.
            let samples = usize::try_from(self.iters())
                .ok()
                .and_then(|n| n.checked_mul(std::mem::size_of::<f64>()));
            if samples.is_none_or(|bytes| bytes > 1 << 30) {
                return Err(format!(
                    "-n {}: latency keeps every sample; at most {} per size",
                    self.iters(),
                    (1usize << 30) / std::mem::size_of::<f64>()
                )
                .into());
            }
        }
        Ok(())
    }
}

/// One size's figures.
#[derive(Clone, Debug)]
struct Row {
    bytes: usize,
    iters: u64,
    secs: f64,
    /// Send work requests posted with a CQE asked for.
    signaled: u64,
    /// Latencies in µs, sorted (lat mode).
    lat: Vec<f64>,
}

/// perftest's MB: 2^20 bytes.
const MB: f64 = 1048576.0;

impl Row {
    fn mbps(&self) -> f64 {
        self.iters as f64 * self.bytes as f64 / self.secs / MB
    }
    fn mpps(&self) -> f64 {
        self.iters as f64 / self.secs / 1e6
    }
    fn cqe_per_op(&self) -> f64 {
        self.signaled as f64 / self.iters as f64
    }
    /// The median as perftest's `get_median` takes it: the mean of the
    /// two middle samples when there is an even number.
    fn median(&self) -> f64 {
        let n = self.lat.len();
        (self.lat[(n - 1) / 2] + self.lat[n / 2]) / 2.0
    }
    /// The nearest-rank percentile: the smallest sample at or above
    /// which `p` of them lie.
    fn pct(&self, p: f64) -> f64 {
        let n = self.lat.len();
        // Less a hair: 0.99 and 0.999 are not exact in binary, and a
        // product a hair above a whole number would take a rank too many.
        let rank = (n as f64 * p - 1e-9).ceil() as usize;
        self.lat[rank.clamp(1, n) - 1]
    }
    /// The `p` percentile, if there are samples enough for it to be more
    /// than the maximum (100 for p99, 1000 for p99.9).
    fn tail(&self, p: f64) -> Option<f64> {
        let needed = (1.0 / (1.0 - p)).round() as usize;
        (self.lat.len() >= needed).then(|| self.pct(p))
    }
    fn min(&self) -> f64 {
        self.lat[0]
    }
    fn max(&self) -> f64 {
        self.lat[self.lat.len() - 1]
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
    let in_process = matches!(device.as_str(), "soft" | "noop");
    if in_process && !args.loopback {
        return Err(format!(
            "the {device} device lives in one process: add --loopback, or name a verbs device \
             with -d for a server and a client"
        )
        .into());
    }
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
            if device == "noop" && (args.op, args.mode) == (Op::Write, Mode::Lat) {
                return Err(
                    "the noop device moves no data, so no echo is ever seen: write lat needs `-d soft`"
                        .into(),
                );
            }
            let dev = SoftDevice::with_progress(progress);
            let pd = dev.alloc_pd();
            let (qa, qb) = dev.connected_pair(&pd, &pd, args.qp_config())?;
            args.granted(qa.caps())?;
            loopback_pair(args, &pd, qa, qb)
        }
        name => verbs::loopback(args, name),
    }
}

/// The memory the client targets: a slot of the largest size for each
/// outstanding operation, up to 16 (they may share). A SEND targets none,
/// so it gets one word (its receives are the server's memory).
fn expose<P: ProtectionDomain>(pd: &P, args: &Args) -> Result<ExposedBuf<Vec<u8>>> {
    let bytes = if args.op == Op::Send {
        8
    } else {
        args.largest() * args.depth().min(16)
    };
    let rights = RemoteAccess::READ | RemoteAccess::WRITE | RemoteAccess::ATOMIC;
    Ok(ExposedBuf::new(pd, vec![0u8; bytes], rights)?)
}

/// The memory a `write lat` client's echoes land in (none for other
/// runs): one message of the largest size.
fn echoed<P: ProtectionDomain>(pd: &P, args: &Args) -> Result<Option<ExposedBuf<Vec<u8>>>> {
    if (args.op, args.mode) != (Op::Write, Mode::Lat) {
        return Ok(None);
    }
    let memory = vec![0u8; args.largest()];
    Ok(Some(ExposedBuf::new(pd, memory, RemoteAccess::WRITE)?))
}

/// What the server must agree to before anything is set up: what it
/// sizes its memory and queue pair from, and what makes the two sides'
/// loops match (a `send lat` client waits for echoes a `send bw` server
/// never sends).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Plan {
    op: Op,
    mode: Mode,
    sizes: Vec<usize>,
    depth: usize,
    inline: usize,
}

/// The first word of a plan, so that another program (or another version)
/// on the port is told apart from a plan that differs.
#[cfg_attr(not(feature = "verbs"), allow(dead_code))]
const PLAN_MAGIC: &str = "rdma-ring-perf/2";

#[cfg_attr(not(feature = "verbs"), allow(dead_code))]
impl Plan {
    fn of(args: &Args) -> Plan {
        Plan {
            op: args.op,
            mode: args.mode,
            sizes: args.sizes(),
            depth: args.depth(),
            inline: args.inline(),
        }
    }

    fn encode(&self) -> String {
        let sizes: Vec<String> = self.sizes.iter().map(usize::to_string).collect();
        format!(
            "{PLAN_MAGIC} op={} mode={} sizes={} depth={} inline={}",
            self.op.name(),
            self.mode.name(),
            sizes.join(","),
            self.depth,
            self.inline
        )
    }

    fn decode(line: &str) -> Result<Plan> {
        let mut words = line.split(' ');
        if words.next() != Some(PLAN_MAGIC) {
            return Err("not an rdma-ring-perf client of this version".into());
        }
        let (mut op, mut mode, mut sizes, mut depth, mut inline) = (None, None, None, None, None);
        for word in words {
            let (key, value) = word
                .split_once('=')
                .ok_or_else(|| format!("a plan with {word:?} in it"))?;
            let number = || {
                value
                    .parse::<usize>()
                    .map_err(|_| format!("a plan with {key}={value:?}"))
            };
            match key {
                "op" => op = Op::from_str(value, false).ok(),
                "mode" => mode = Mode::from_str(value, false).ok(),
                "sizes" => {
                    sizes = Some(
                        value
                            .split(',')
                            .map(|s| s.parse::<usize>())
                            .collect::<std::result::Result<Vec<_>, _>>()
                            .map_err(|_| format!("a plan with sizes={value:?}"))?,
                    )
                }
                "depth" => depth = Some(number()?),
                "inline" => inline = Some(number()?),
                _ => {} // something a later version adds
            }
        }
        match (op, mode, sizes, depth, inline) {
            (Some(op), Some(mode), Some(sizes), Some(depth), Some(inline)) => Ok(Plan {
                op,
                mode,
                sizes,
                depth,
                inline,
            }),
            _ => Err(format!("an incomplete plan: {line:?}").into()),
        }
    }

    fn describe(&self) -> String {
        let sizes = match self.sizes.as_slice() {
            [one] => format!("size {one}"),
            [first, .., last] => format!("sizes {first} to {last}"),
            [] => "no sizes".into(),
        };
        format!(
            "{} {}, {sizes}, depth {}, inline {}",
            self.op.name(),
            self.mode.name(),
            self.depth,
            self.inline
        )
    }
}

/// How the client tells the server where it is in the plan.
trait Handoff {
    /// Before a size: the server gets ready for it.
    fn begin(&mut self, size: usize) -> Result<()>;
    /// After it: the server has seen everything.
    fn end(&mut self) -> Result<()>;
    /// Fails if the other side has stopped (called now and then while a
    /// size waits for completions, so that a dead server is named rather
    /// than waited out).
    fn check(&mut self) -> Result<()> {
        Ok(())
    }
    /// Where the server's WRITE echoes land, in a `write lat` run.
    fn echoes(&self) -> Option<EchoWatch> {
        None
    }
}

/// Memory of ours a peer's WRITEs land in, watched for their last byte:
/// how both sides of a `write lat` ping-pong (as `ib_write_lat`'s) see
/// the other's WRITE arrive, with no completion on the receiving side.
#[derive(Clone, Copy)]
struct EchoWatch {
    /// The address of an `ExposedBuf`'s first byte; the buffer outlives
    /// every watch of it (see where each is made).
    addr: usize,
    len: usize,
}

impl EchoWatch {
    /// # Safety
    ///
    /// `buf` must outlive the watch and every copy of it.
    unsafe fn of(buf: &ExposedBuf<Vec<u8>>) -> EchoWatch {
        // The address the device writes at, taken with no reference to
        // the bytes (which the peer may be writing).
        let remote = buf.remote();
        EchoWatch {
            addr: remote.addr() as usize,
            len: buf.len(),
        }
    }

    /// The byte at `at`, as it is now.
    fn byte(&self, at: usize) -> u8 {
        assert!(at < self.len, "a watch reads within its buffer");
        // SAFETY: within the buffer, which outlives the watch (the
        // contract of `of`), and a byte is always aligned; read as an
        // atomic, through no Rust reference, since the peer's WRITE
        // changes it behind the compiler's back.
        let byte = unsafe { std::sync::atomic::AtomicU8::from_ptr((self.addr + at) as *mut u8) };
        byte.load(Ordering::Acquire)
    }
}

/// The tag of iteration `i` of a ping-pong: never 0 (what memory holds
/// before any WRITE), and never the previous iteration's.
fn tag(i: u64) -> u8 {
    (i % 255) as u8 + 1
}

/// How long a size may go without a completion before the run fails.
const STALL: Duration = Duration::from_secs(30);
/// How often a waiting loop asks whether the other side is still there.
const PEER_CHECK: Duration = Duration::from_secs(1);

/// Fails a measurement loop that stops making progress: a peer gone or a
/// queue pair stuck would otherwise spin for ever.
struct Watchdog<'a> {
    sync: &'a mut dyn Handoff,
    size: usize,
    total: u64,
    idle: u32,
    done: u64,
    since: Instant,
    peer_checked: Instant,
}

impl<'a> Watchdog<'a> {
    fn new(sync: &'a mut dyn Handoff, size: usize, total: u64) -> Self {
        let now = Instant::now();
        Watchdog {
            sync,
            size,
            total,
            idle: 0,
            done: 0,
            since: now,
            peer_checked: now,
        }
    }

    /// A poll found nothing, with `done` operations complete so far.
    fn idle(&mut self, done: u64) -> Result<()> {
        self.idle = self.idle.wrapping_add(1);
        // The clock only every so many empty polls: they are the loop's
        // fast path.
        if self.idle % 1024 != 0 {
            return Ok(());
        }
        let now = Instant::now();
        if done != self.done {
            self.done = done;
            self.since = now;
        } else if now.duration_since(self.since) >= STALL {
            return Err(format!(
                "no completion for {} s at {} B ({done} of {} operations done): the peer \
                 stopped answering, or the queue pair is stuck",
                STALL.as_secs(),
                self.size,
                self.total
            )
            .into());
        }
        if now.duration_since(self.peer_checked) >= PEER_CHECK {
            self.peer_checked = now;
            self.sync.check()?;
        }
        Ok(())
    }
}

/// The server side of SEND tests: receives posted (before the peer may
/// send), then kept posted on a thread of its own, echoing each message
/// for latency.
struct SendServer<Q: QueuePair> {
    ring: Ring<Q>,
    pool: BufferPool,
    rx_depth: usize,
    /// Largest echo posted inline; `None` without echoes.
    echo: Option<usize>,
}

impl<Q: QueuePair + std::marker::Send + 'static> SendServer<Q> {
    fn new<P: ProtectionDomain>(args: &Args, pd: &P, qp: Q) -> Result<Self> {
        let rx_depth = args.recv_depth();
        let echo = (args.mode == Mode::Lat).then_some(args.inline());
        // An echoed buffer is out of the pool until its send completes (a
        // fresh one takes its place in the receive queue): one at a time,
        // with one to spare.
        let spare = if echo.is_some() { 2 } else { 0 };
        let pool = BufferPool::new(pd, args.largest(), rx_depth + spare)?;
        let mut ring = Ring::new(qp, RingConfig::default());
        for _ in 0..rx_depth {
            ring.submission()
                .push(Recv::new(pool.take()?))
                .map_err(|r| r.to_string())?;
        }
        ring.submit().map_err(|e| e.error)?;
        Ok(SendServer {
            ring,
            pool,
            rx_depth,
            echo,
        })
    }

    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    fn qp(&self) -> &Q {
        self.ring.qp()
    }

    fn start(self) -> Running {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || serve_sends(self, &flag));
        Running::new(stop, thread)
    }
}

/// A running [`SendServer`] or [`WriteEcho`]: stopped and joined when
/// dropped too, so that nothing it reads (a [`WriteEcho`] reads memory of
/// its caller's) is freed under it, however the caller leaves.
struct Running {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl Running {
    fn new(stop: Arc<AtomicBool>, thread: std::thread::JoinHandle<Result<()>>) -> Running {
        Running {
            stop,
            thread: Some(thread),
        }
    }

    /// Whether the thread has stopped by itself (it only does on an
    /// error, which [`stop`](Self::stop) returns).
    fn failed(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    fn stop(mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.take().expect("joined once");
        thread
            .join()
            .map_err(|_| "the server's thread panicked")?
            .map_err(|e| format!("the server's thread: {e}").into())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.stop.store(true, Ordering::Relaxed);
            let _ = thread.join();
        }
    }
}

/// The server's thread, seen from the client's loops in this process:
/// for `write lat`, also where its echoes land and the size it echoes.
struct Local<'a>(Option<&'a Running>, Option<(EchoWatch, Arc<AtomicUsize>)>);

impl Local<'_> {
    fn alive(&self) -> Result<()> {
        match self.0 {
            Some(running) if running.failed() => Err("the server's thread stopped".into()),
            _ => Ok(()),
        }
    }
}

impl Handoff for Local<'_> {
    fn begin(&mut self, size: usize) -> Result<()> {
        if let Some((_, echoed)) = &self.1 {
            echoed.store(size, Ordering::Release);
        }
        self.alive()
    }
    fn end(&mut self) -> Result<()> {
        self.alive()
    }
    fn check(&mut self) -> Result<()> {
        self.alive()
    }
    fn echoes(&self) -> Option<EchoWatch> {
        self.1.as_ref().map(|(watch, _)| *watch)
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
    let mine = echoed(pd, args)?;
    let echo_size = Arc::new(AtomicUsize::new(0));
    let (server, _idle) = if args.op == Op::Send {
        (Some(SendServer::new(args, pd, qb)?.start()), None)
    } else if let Some(mine) = &mine {
        // SAFETY: `target` outlives the thread, which `stop` below joins.
        let watch = unsafe { EchoWatch::of(&target) };
        let echo = WriteEcho::new(args, pd, qb, watch, mine.remote())?;
        (Some(echo.start(Arc::clone(&echo_size))), None)
    } else {
        (None, Some(qb))
    };
    // SAFETY: `mine` outlives the measurement, the watch's only user.
    let echoes = mine
        .as_ref()
        .map(|m| (unsafe { EchoWatch::of(m) }, echo_size));
    let rows = measure_all(
        args,
        pd,
        qa,
        target.remote(),
        &mut Local(server.as_ref(), echoes),
    );
    // The server's own error first: the client mostly sees only what it
    // caused. Both when both failed, since either may be the cause.
    match (server.map_or(Ok(()), Running::stop), rows) {
        (Ok(()), rows) => rows,
        (Err(s), Ok(_)) => Err(format!("server: {s}").into()),
        (Err(s), Err(c)) => Err(format!("server: {s}; client: {c}").into()),
    }
}

/// Keeps `rx_depth` receives posted; with an echo, sends each message back
/// in the buffer it arrived in (a fresh buffer takes its place in the
/// receive queue, and the echoed one returns to the pool when its send
/// completes), so no reply ever waits for a buffer.
fn serve_sends<Q: QueuePair>(server: SendServer<Q>, stop: &AtomicBool) -> Result<()> {
    let SendServer {
        mut ring,
        pool,
        rx_depth,
        echo,
    } = server;
    let mut got = Vec::new();
    let mut posted = rx_depth;
    while !stop.load(Ordering::Relaxed) {
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
            match echo {
                // As perftest's echo, inline when the client's sends are.
                Some(inline) if len <= inline => {
                    sq.push(Send::new(chunk.slice(..len)).inline().signaled())
                        .map_err(|r| r.to_string())?;
                }
                Some(_) => {
                    sq.push(Send::new(chunk.slice(..len)).signaled())
                        .map_err(|r| r.to_string())?;
                }
                None => {}
            }
        }
        while posted < rx_depth {
            let Ok(chunk) = pool.take() else { break };
            sq.push(Recv::new(chunk)).map_err(|r| r.to_string())?;
            posted += 1;
        }
        sq.submit().map_err(|e| e.error)?;
    }
    Ok(())
}

/// The server side of `write lat`: watches the last byte of the size
/// being run in its exposed memory (`target`), and when a new tag lands
/// there, WRITEs the same size back to the client's memory (`client`)
/// with that tag last, as `ib_write_lat`'s server does.
struct WriteEcho<Q: QueuePair> {
    ring: Ring<Q>,
    pool: BufferPool,
    target: EchoWatch,
    client: RemoteSlice,
    inline: usize,
}

impl<Q: QueuePair + std::marker::Send + 'static> WriteEcho<Q> {
    /// `target` watches the memory the client WRITEs to.
    fn new<P: ProtectionDomain>(
        args: &Args,
        pd: &P,
        qp: Q,
        target: EchoWatch,
        client: RemoteSlice,
    ) -> Result<Self> {
        Ok(WriteEcho {
            ring: Ring::new(qp, RingConfig::default()),
            // An echo's buffer is back once its completion is: two, so
            // the next echo never waits for the last one's.
            pool: BufferPool::new(pd, args.largest(), 2)?,
            target,
            client,
            inline: args.inline(),
        })
    }

    /// Runs on a thread of its own, echoing the size `size` holds (0:
    /// none yet).
    fn start(self, size: Arc<AtomicUsize>) -> Running {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || serve_writes(self, &flag, &size));
        Running::new(stop, thread)
    }
}

fn serve_writes<Q: QueuePair>(
    echo: WriteEcho<Q>,
    stop: &AtomicBool,
    size: &AtomicUsize,
) -> Result<()> {
    let WriteEcho {
        mut ring,
        pool,
        target,
        client,
        inline,
    } = echo;
    let (mut running, mut last) = (0, 0u8);
    let mut done = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let now = size.load(Ordering::Acquire);
        if now != running {
            (running, last) = (now, 0);
        }
        if running == 0 {
            // Between plans: nothing to watch yet.
            std::thread::yield_now();
            continue;
        }
        let tag = target.byte(running - 1);
        if tag == 0 || tag == last {
            // The buffers of echoes done go back to the pool.
            ring.completion().reap(&mut done)?;
            for c in done.drain(..) {
                if !c.status().is_success() {
                    return Err(format!("an echo failed: {}", c.status()).into());
                }
            }
            std::hint::spin_loop();
            continue;
        }
        last = tag;
        let mut chunk = loop {
            if let Ok(chunk) = pool.take() {
                break chunk;
            }
            ring.completion().reap(&mut done)?;
            for c in done.drain(..) {
                if !c.status().is_success() {
                    return Err(format!("an echo failed: {}", c.status()).into());
                }
            }
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
        };
        chunk[running - 1] = tag;
        let to = client.slice(0..running as u64)?;
        let write = Write::new(chunk.slice(..running), to).signaled();
        let mut sq = ring.submission();
        if running <= inline {
            sq.push(write.inline()).map_err(|r| r.to_string())?;
        } else {
            sq.push(write).map_err(|r| r.to_string())?;
        }
        sq.submit().map_err(|e| e.error)?;
    }
    Ok(())
}

/// A queue pair that counts the send work requests posted with a CQE
/// asked for: the fixed-buffer rings keep no such count (the owned ring
/// does, in its stats), and the header should say what was asked, not
/// what `-Q` hoped for.
struct Counted<Q> {
    qp: Q,
    signaled: Arc<AtomicU64>,
}

// SAFETY: every call goes to the wrapped queue pair unchanged, and what
// the wrapper adds (counting flags of work requests already posted)
// touches no memory a work request names, so the wrapped queue pair's
// promises are this one's.
unsafe impl<Q: QueuePair> QueuePair for Counted<Q> {
    type Cq = Q::Cq;
    type Srq = Q::Srq;

    fn caps(&self) -> QpCaps {
        self.qp.caps()
    }

    unsafe fn post_send(
        &mut self,
        wrs: &[SendWr],
        sges: &[Sge],
    ) -> std::result::Result<(), PostError> {
        // SAFETY: the caller's promises, passed on whole.
        let posted = unsafe { self.qp.post_send(wrs, sges) };
        let accepted = match &posted {
            Ok(()) => wrs.len(),
            Err(e) => e.accepted.min(wrs.len()),
        };
        let signaled = wrs[..accepted]
            .iter()
            .filter(|wr| wr.flags.contains(SendFlags::SIGNALED))
            .count() as u64;
        // One writer, the ring's thread: no locked add on the post path.
        let count = self.signaled.load(Ordering::Relaxed);
        self.signaled.store(count + signaled, Ordering::Relaxed);
        posted
    }

    unsafe fn post_recv(
        &mut self,
        wrs: &[RecvWr],
        sges: &[Sge],
    ) -> std::result::Result<(), PostError> {
        // SAFETY: as for `post_send`.
        unsafe { self.qp.post_recv(wrs, sges) }
    }

    fn set_error(&mut self) -> std::result::Result<(), rdma_ring::Error> {
        self.qp.set_error()
    }

    fn take_cq(&mut self) -> Option<Self::Cq> {
        self.qp.take_cq()
    }

    fn peer_disconnected(&mut self) -> std::result::Result<bool, rdma_ring::Error> {
        self.qp.peer_disconnected()
    }
}

fn measure_all<P: ProtectionDomain, Q: QueuePair + std::marker::Send + 'static>(
    args: &Args,
    pd: &P,
    qp: Q,
    remote: RemoteSlice,
    sync: &mut dyn Handoff,
) -> Result<Vec<Row>> {
    if args.fixed {
        return measure_fixed(args, pd, qp, remote, sync);
    }
    let ring_config = RingConfig {
        signal_interval: args.cq_mod().min(args.depth()),
        ..RingConfig::default()
    };
    let pool = BufferPool::new(pd, args.largest(), args.client_bufs())?;
    let mut rows = Vec::new();
    if args.awaited {
        let ring = AsyncRing::new(Ring::new(qp, ring_config), Wakeup::Busy)?;
        ring.coalesce_doorbells(args.coalesce);
        for size in args.sizes() {
            sync.begin(size)?;
            let before = ring.with_ring(|r| r.stats().signaled);
            let mut row = measure_async(args, &ring, &pool, remote, size, sync)?;
            row.signaled = ring.with_ring(|r| r.stats().signaled) - before;
            rows.push(row);
            sync.end()?;
        }
    } else {
        let mut ring = Ring::new(qp, ring_config);
        let mut perf = SyncRing {
            ring: &mut ring,
            pool: &pool,
            done: Vec::with_capacity(args.depth()),
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
        let before = ring.signaled();
        let mut row = match args.mode {
            Mode::Bw => bw(args, ring, remote, size, sync)?,
            Mode::Lat => lat(args, ring, remote, size, sync)?,
        };
        row.signaled = ring.signaled() - before;
        rows.push(row);
        sync.end()?;
    }
    Ok(rows)
}

/// Targets of `size` bytes within `remote`, one per outstanding slot
/// (for a SEND, which names no remote memory, `remote` alone).
fn slots(args: &Args, remote: RemoteSlice, size: usize) -> Result<Vec<RemoteSlice>> {
    if args.op == Op::Send {
        return Ok(vec![remote]);
    }
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
    /// Sets byte `at` of `buf` (a ping-pong's tag).
    fn set_byte(&mut self, buf: &mut Self::Buf, at: usize, value: u8);
    /// Send work requests posted so far with a CQE asked for.
    fn signaled(&self) -> u64;
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
        let inline = size <= args.inline();
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
    fn set_byte(&mut self, buf: &mut PoolChunk, at: usize, value: u8) {
        buf[at] = value;
    }
    fn give_back(&mut self, _buf: PoolChunk) -> Result<()> {
        // Dropped, a chunk goes back to its pool.
        Ok(())
    }
    fn signaled(&self) -> u64 {
        self.ring.stats().signaled
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
    ring: &'a mut FixedRing<Counted<Q>>,
    qp: FixedQp,
    signaled: &'a AtomicU64,
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
    fn set_byte(&mut self, buf: &mut FixedBuf, at: usize, value: u8) {
        self.ring.bufs().bytes_mut(buf)[at] = value;
    }
    fn signaled(&self) -> u64 {
        self.signaled.load(Ordering::Relaxed)
    }
}

/// Bandwidth: the depth's operations outstanding, pushed `--post-list`
/// to a doorbell.
fn bw<R: PerfRing>(
    args: &Args,
    ring: &mut R,
    remote: RemoteSlice,
    size: usize,
    sync: &mut dyn Handoff,
) -> Result<Row> {
    let iters = args.iters();
    let post_list = args.post_list();
    let slots = slots(args, remote, size)?;
    let mut bufs = (0..args.depth())
        .map(|_| ring.take())
        .collect::<Result<Vec<_>>>()?;
    let mut watchdog = Watchdog::new(sync, size, iters);
    let (mut posted, mut completed) = (0u64, 0u64);
    let start = Instant::now();
    while completed < iters {
        while bufs.len() >= post_list && posted < iters {
            let n = post_list.min((iters - posted) as usize);
            for _ in 0..n {
                let buf = bufs.pop().ok_or("a buffer short")?;
                ring.push(args, buf, slots[posted as usize % slots.len()], size)?;
                posted += 1;
            }
            ring.submit()?;
        }
        match ring.reap(&mut bufs)? {
            0 => watchdog.idle(completed)?,
            n => completed += n as u64,
        }
    }
    let secs = start.elapsed().as_secs_f64();
    for buf in bufs {
        ring.give_back(buf)?;
    }
    Ok(Row {
        bytes: size,
        iters,
        secs,
        signaled: 0,
        lat: Vec::new(),
    })
}

/// Latency: one operation at a time (a SEND with the receive for its
/// echo), busy polling, as perftest does.
fn lat<R: PerfRing>(
    args: &Args,
    ring: &mut R,
    remote: RemoteSlice,
    size: usize,
    sync: &mut dyn Handoff,
) -> Result<Row> {
    let iters = args.iters();
    let slot = slots(args, remote, size)?[0];
    let mut lat = Vec::new();
    lat.try_reserve_exact(iters as usize)
        .map_err(|_| format!("no memory for {iters} latency samples"))?;
    let mut back = Vec::with_capacity(2);
    // A WRITE's ping-pong: the server WRITEs each back, its tag last.
    let echoes = sync.echoes();
    let ping_pong = args.op == Op::Send || echoes.is_some();
    let mut watchdog = Watchdog::new(sync, size, iters);
    let start = Instant::now();
    for i in 0..iters {
        let t = Instant::now();
        let mut expect = 1;
        if args.op == Op::Send {
            let echo = ring.take()?;
            ring.push_recv(echo)?;
            expect = 2;
        }
        let mut buf = ring.take()?;
        if echoes.is_some() {
            ring.set_byte(&mut buf, size - 1, tag(i));
        }
        ring.push(args, buf, slot, size)?;
        ring.submit()?;
        let mut seen = 0;
        while seen < expect {
            match ring.reap(&mut back)? {
                0 => watchdog.idle(i)?,
                n => seen += n,
            }
        }
        if let Some(echoes) = echoes {
            while echoes.byte(size - 1) != tag(i) {
                watchdog.idle(i)?;
            }
        }
        for buf in back.drain(..) {
            ring.give_back(buf)?;
        }
        let us = t.elapsed().as_secs_f64() * 1e6;
        // Half the round trip of a ping-pong, as perftest reports it.
        lat.push(if ping_pong { us / 2.0 } else { us });
    }
    let secs = start.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    Ok(Row {
        bytes: size,
        iters,
        secs,
        signaled: 0,
        lat,
    })
}

fn measure_fixed<P: ProtectionDomain, Q: QueuePair + std::marker::Send + 'static>(
    args: &Args,
    pd: &P,
    qp: Q,
    remote: RemoteSlice,
    sync: &mut dyn Handoff,
) -> Result<Vec<Row>> {
    let signaled = Arc::new(AtomicU64::new(0));
    let mut qp = Counted {
        qp,
        signaled: Arc::clone(&signaled),
    };
    let cq = qp
        .take_cq()
        .ok_or("the queue pair has no completion queue of its own")?;
    let slot_len = u32::try_from(args.largest()).map_err(|_| "the largest size is too large")?;
    let slots = u32::try_from(args.client_bufs()).map_err(|_| "--tx-depth too large")?;
    let bufs = FixedBufs::new(pd, slots, slot_len)?;
    let config = FixedRingConfig {
        signal_interval: args.cq_mod().min(args.depth()) as u32,
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
            let before = signaled.load(Ordering::Relaxed);
            let mut row = measure_fixed_async(args, &ring, qp, remote, size, sync)?;
            row.signaled = signaled.load(Ordering::Relaxed) - before;
            rows.push(row);
            sync.end()?;
        }
        return Ok(rows);
    }
    let qp = ring.attach(qp).map_err(|r| r.error().to_string())?;
    let mut perf = FixedPerf {
        ring: &mut ring,
        qp,
        signaled: &signaled,
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
    let inline = size <= args.inline();
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

/// The awaited path over the fixed-buffer ring: the depth's tasks, each
/// with its own slot, awaiting one operation at a time.
fn measure_fixed_async<Q: QueuePair + std::marker::Send + 'static>(
    args: &Args,
    ring: &AsyncFixedRing<Q>,
    qp: FixedQp,
    remote: RemoteSlice,
    size: usize,
    sync: &mut dyn Handoff,
) -> Result<Row> {
    let done = Cell::new(0u64);
    let done = &done;
    let echoes = sync.echoes();
    run_tasks(args, remote, size, sync, done, |slot, mine| async move {
        let mut lat = Vec::new();
        let mut buf = ring.take_buf().ok_or("the slots are all taken")?;
        let ping_pong = args.op == Op::Send && args.mode == Mode::Lat;
        let mut echo_buf = if ping_pong {
            Some(ring.take_buf().ok_or("the slots are all taken")?)
        } else {
            None
        };
        for i in 0..mine {
            let t = (args.mode == Mode::Lat).then(Instant::now);
            // The echo's receive goes first.
            let echo = match echo_buf.take() {
                Some(b) => Some(ring.push(qp, RecvFixed::new(b)).map_err(text)?),
                None => None,
            };
            if echoes.is_some() {
                ring.with_bufs(|b| b.bytes_mut(&mut buf)[size - 1] = tag(i))?;
            }
            buf = succeeded(push_fixed(args, ring, qp, buf, slot, size)?.await?)?;
            if let Some(echo) = echo {
                echo_buf = Some(succeeded(echo.await?)?);
            }
            if let Some(echoes) = echoes {
                echo_of(echoes, size, i).await;
            }
            if let Some(t) = t {
                let us = t.elapsed().as_secs_f64() * 1e6;
                // Half the round trip of a ping-pong, as perftest reports.
                let half = ping_pong || echoes.is_some();
                lat.push(if half { us / 2.0 } else { us });
            }
            done.set(done.get() + 1);
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
    sync: &mut dyn Handoff,
) -> Result<Row> {
    let done = Cell::new(0u64);
    let done = &done;
    let echoes = sync.echoes();
    run_tasks(args, remote, size, sync, done, |slot, mine| async move {
        let mut lat = Vec::new();
        for i in 0..mine {
            // Timed only for latency: bandwidth runs read no clock per
            // operation (the sync path reads none either).
            let t = (args.mode == Mode::Lat).then(Instant::now);
            let mut buf = pool.take()?;
            if echoes.is_some() {
                buf[size - 1] = tag(i);
            }
            // Inline as the sync path and perftest's -I send it.
            let inline = size <= args.inline();
            let write = |buf: PoolChunk| {
                let op = Write::new(buf.slice(..size), slot);
                ring.op(if inline { op.inline() } else { op })
            };
            let send = |buf: PoolChunk| {
                let op = Send::new(buf.slice(..size));
                ring.op(if inline { op.inline() } else { op })
            };
            let result = match args.op {
                Op::Write => write(buf).await.0,
                Op::Read => ring.read(buf.slice(..size), slot).await.0,
                Op::Send if args.mode == Mode::Lat => {
                    // The echo's receive goes first.
                    let echo = ring.recv(pool.take()?);
                    let sent = send(buf).await.0;
                    echo.await.0.map(|r| r.len).and(sent)
                }
                Op::Send => send(buf).await.0,
                Op::Atomic => {
                    let word = buf.word(0).map_err(|r| r.to_string())?;
                    ring.fetch_add(word, slot.word(0)?, 1).await.0
                }
            };
            result?;
            if let Some(echoes) = echoes {
                echo_of(echoes, size, i).await;
            }
            if let Some(t) = t {
                let us = t.elapsed().as_secs_f64() * 1e6;
                // Half the round trip of a ping-pong, as perftest reports.
                let half = args.op == Op::Send || echoes.is_some();
                lat.push(if half { us / 2.0 } else { us });
            }
            done.set(done.get() + 1);
        }
        Ok(lat)
    })
}

/// Until the peer's WRITE echo of iteration `i` lands (its tag in the
/// last byte of `size`): busy polled, as the operations are, so that the
/// watchdog beside the tasks (see [`run_tasks`]) runs between looks.
async fn echo_of(echoes: EchoWatch, size: usize, i: u64) {
    std::future::poll_fn(|cx| {
        if echoes.byte(size - 1) == tag(i) {
            std::task::Poll::Ready(())
        } else {
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
    .await
}

/// Runs the depth's tasks (one for latency) on one executor thread, each
/// `one_task(slot, operations)` returning its latencies and counting its
/// operations into `done`, with the run's operations shared out, and
/// makes the size's row.
fn run_tasks<F: std::future::Future<Output = Result<Vec<f64>>>>(
    args: &Args,
    remote: RemoteSlice,
    size: usize,
    sync: &mut dyn Handoff,
    done: &Cell<u64>,
    one_task: impl Fn(RemoteSlice, u64) -> F,
) -> Result<Row> {
    use futures::future::Either;
    let iters = args.iters();
    let slots = slots(args, remote, size)?;
    let tasks = args.depth() as u64;
    let mut watchdog = Watchdog::new(sync, size, iters);
    // Polled beside the tasks on every round of the executor (it wakes
    // itself, as the busy-polled operations do), to fail a run that
    // stops.
    let watch = std::future::poll_fn(|cx| match watchdog.idle(done.get()) {
        Ok(()) => {
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
        Err(e) => std::task::Poll::Ready(e),
    });
    let start = Instant::now();
    let work = futures::future::join_all((0..tasks).map(|task| {
        let mine = iters / tasks + u64::from(task < iters % tasks);
        one_task(slots[task as usize % slots.len()], mine)
    }));
    let all = match futures::executor::block_on(futures::future::select(
        std::pin::pin!(work),
        std::pin::pin!(watch),
    )) {
        Either::Left((all, _)) => all,
        Either::Right((stalled, _)) => return Err(stalled),
    };
    let secs = start.elapsed().as_secs_f64();
    let mut lat = Vec::new();
    for task in all {
        lat.extend(task?);
    }
    lat.sort_by(f64::total_cmp);
    Ok(Row {
        bytes: size,
        iters,
        secs,
        signaled: 0,
        lat: if args.mode == Mode::Lat {
            lat
        } else {
            Vec::new()
        },
    })
}

/// CQEs asked per operation over the whole run.
fn cqe_per_op(rows: &[Row]) -> f64 {
    let ops: u64 = rows.iter().map(|r| r.iters).sum();
    rows.iter().map(|r| r.signaled).sum::<u64>() as f64 / ops.max(1) as f64
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
    let knobs = match args.mode {
        Mode::Bw if args.awaited => format!("tasks {}", args.depth()),
        Mode::Bw => format!("tx depth {} | post list {}", args.depth(), args.post_list()),
        Mode::Lat => "one at a time".into(),
    };
    let asked = match args.mode {
        Mode::Bw => format!(" (-Q {})", args.cq_mod()),
        Mode::Lat => String::new(),
    };
    let outs = match (args.op, args.outs) {
        (Op::Read | Op::Atomic, Some(n)) => format!(" | reads/atomics in flight up to {n}"),
        (Op::Read | Op::Atomic, None) => {
            " | reads/atomics in flight up to the device's limit".into()
        }
        _ => String::new(),
    };
    println!(
        " rdma-ring-perf {} {} | device {device} | {path} path | {knobs} | CQEs asked per op {:.3}{asked} | inline {}{outs}",
        args.op.name(),
        args.mode.name(),
        cqe_per_op(rows),
        args.inline()
    );
    if args.mode == Mode::Bw && args.depth() < args.tx_depth() {
        // The server keeps at most RX_DEPTH receives posted, whatever
        // their size: below the memory budget, that is the bound.
        let by_receives = args.op == Op::Send && args.recv_depth() == RX_DEPTH;
        let why = if args.op == Op::Send {
            format!(
                "half the {} receives of {} B the server keeps posted",
                args.recv_depth(),
                args.largest()
            )
        } else {
            format!("buffers of {} B", args.largest())
        };
        let post_list = match args.post_list {
            Some(l) if l > args.post_list() => {
                format!(", and post list {} with it", args.post_list())
            }
            _ => String::new(),
        };
        if by_receives {
            println!(
                " depth {} rather than -t {}{post_list}: a SEND keeps within half the {RX_DEPTH} \
                 receives the server keeps posted",
                args.depth(),
                args.tx_depth(),
            );
        } else {
            println!(
                " depth {} rather than -t {}{post_list}: each side's buffers are kept within {} MiB \
                 ({why}); a smaller --max-size or -s allows more",
                args.depth(),
                args.tx_depth(),
                BUF_BUDGET >> 20
            );
        }
    }
    println!("{line}");
    match args.mode {
        Mode::Bw => {
            println!(
                " {:>10} {:>12} {:>18} {:>14}",
                "#bytes", "#iterations", "BW average[MB/sec]", "MsgRate[Mpps]"
            );
            for r in rows {
                println!(
                    " {:>10} {:>12} {:>18.2} {:>14.6}",
                    r.bytes,
                    r.iters,
                    r.mbps(),
                    r.mpps()
                );
            }
        }
        Mode::Lat => {
            println!(
                " {:>10} {:>12} {:>10} {:>10} {:>10} {:>11} {:>10}",
                "#bytes",
                "#iterations",
                "t_min[us]",
                "t_p50[us]",
                "t_p99[us]",
                "t_p99.9[us]",
                "t_max[us]"
            );
            // A tail percentile of too few samples is only the maximum
            // again.
            let tail = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
            for r in rows {
                println!(
                    " {:>10} {:>12} {:>10.2} {:>10.2} {:>10} {:>11} {:>10.2}",
                    r.bytes,
                    r.iters,
                    r.min(),
                    r.median(),
                    tail(r.tail(0.99)),
                    tail(r.tail(0.999)),
                    r.max()
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

/// A JSON string, escaped.
fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A JSON number with `decimals`, or `null` for what JSON cannot hold
/// (infinity after a run too short for the clock).
fn json_num(v: Option<f64>, decimals: usize) -> String {
    match v {
        Some(v) if v.is_finite() => format!("{v:.decimals$}"),
        _ => "null".into(),
    }
}

fn json(args: &Args, device: &str, rows: &[Row]) -> String {
    let results: Vec<String> = rows
        .iter()
        .map(|r| {
            let lat = if r.lat.is_empty() {
                String::new()
            } else {
                format!(
                    ",\"t_min_us\":{},\"t_p50_us\":{},\"t_p99_us\":{},\"t_p999_us\":{},\"t_max_us\":{}",
                    json_num(Some(r.min()), 3),
                    json_num(Some(r.median()), 3),
                    json_num(r.tail(0.99), 3),
                    json_num(r.tail(0.999), 3),
                    json_num(Some(r.max()), 3)
                )
            };
            format!(
                "{{\"bytes\":{},\"iterations\":{},\"seconds\":{},\"mb_per_s\":{},\"mpps\":{},\"cqe_per_op\":{}{lat}}}",
                r.bytes,
                r.iters,
                json_num(Some(r.secs), 6),
                json_num(Some(r.mbps()), 3),
                json_num(Some(r.mpps()), 6),
                json_num(Some(r.cqe_per_op()), 4)
            )
        })
        .collect();
    let path = match (args.fixed, args.awaited) {
        (true, true) => "fixed-awaited",
        (true, false) => "fixed",
        (false, true) => "awaited",
        (false, false) => "sync",
    };
    // `mb_per_s` is in perftest's MB (`mb_bytes`), `tx_depth` and
    // `post_list` are what ran (`tx_depth_asked` what -t said), `cq_mod`
    // is -Q and `cqe_per_op` what it came to; a latency run (one
    // operation at a time) has no depth, post list or moderation to ask
    // for. `coalesce` is --coalesce (shared doorbells, awaited paths);
    // `outs` is -o (null: the device's limit).
    let bw = |v: usize| match args.mode {
        Mode::Bw => v.to_string(),
        Mode::Lat => "null".into(),
    };
    format!(
        "{{\"tool\":\"rdma-ring-perf\",\"op\":{},\"mode\":{},\"device\":{},\"path\":{},\"coalesce\":{},\"tx_depth\":{},\"tx_depth_asked\":{},\"post_list\":{},\"cq_mod\":{},\"cqe_per_op\":{},\"inline\":{},\"outs\":{},\"mb_bytes\":{},\"results\":[{}]}}",
        json_str(args.op.name()),
        json_str(args.mode.name()),
        json_str(device),
        json_str(path),
        args.awaited && args.coalesce,
        args.depth(),
        bw(args.tx_depth()),
        bw(args.post_list()),
        bw(args.cq_mod()),
        json_num(Some(cqe_per_op(rows)), 4),
        args.inline(),
        args.outs.map_or("null".into(), |n| n.to_string()),
        MB as u64,
        results.join(",")
    )
}

fn plot(args: &Args, rows: &[Row], file: &str) -> Result<()> {
    use plotters::prelude::*;
    if rows.is_empty() {
        return Err("nothing to plot".into());
    }
    let root = SVGBackend::new(file, (900, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(350);
    let xs: Vec<f64> = rows.iter().map(|r| (r.bytes as f64).log2()).collect();
    let (x0, x1) = (
        xs.iter().copied().fold(f64::MAX, f64::min),
        xs.iter().copied().fold(f64::MIN, f64::max),
    );
    let x1 = if x1 > x0 { x1 } else { x0 + 1.0 };
    let title = format!("rdma-ring-perf {} {}", args.op.name(), args.mode.name());
    for (area, name, value) in [
        (&top, "message rate [Mpps]", Row::mpps as fn(&Row) -> f64),
        (&bottom, "bandwidth [MB/sec]", Row::mbps as fn(&Row) -> f64),
    ] {
        let ys: Vec<f64> = rows
            .iter()
            .map(|r| Some(value(r)).filter(|v| v.is_finite()).unwrap_or(0.0))
            .collect();
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
    use std::io::ErrorKind;
    use std::net::SocketAddr;

    const TIMEOUT: Duration = Duration::from_secs(30);
    /// How often a server waiting on its client looks at its receiving
    /// thread.
    const TICK: Duration = Duration::from_secs(1);
    /// What the client tells the server before each size, and after.
    const BEGIN: u8 = b'B';
    const END: u8 = b'E';
    const READY: u8 = b'R';
    const BYE: u8 = b'Q';
    /// Either side, failing: this byte, then the error on one line.
    const FAIL: u8 = b'F';
    /// The longest line either side reads.
    const MAX_LINE: usize = 4096;

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
        args.granted(qa.caps())?;
        args.granted(qb.caps())?;
        let (ea, eb) = (qa.endpoint(), qb.endpoint());
        qa.connect(&eb)?;
        qb.connect(&ea)?;
        loopback_pair(args, &pd, qa, qb)
    }

    /// One byte, `None` at the end of the stream.
    fn read_byte(stream: &mut TcpStream) -> std::io::Result<Option<u8>> {
        let mut byte = [0u8; 1];
        loop {
            match stream.read(&mut byte) {
                Ok(0) => return Ok(None),
                Ok(_) => return Ok(Some(byte[0])),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn timed_out(e: &std::io::Error) -> bool {
        matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
    }

    /// A line within `TIMEOUT`, read a byte at a time so that nothing of
    /// what follows it (the endpoint records) is taken with it.
    fn read_line(stream: &mut TcpStream) -> Result<String> {
        let deadline = Instant::now() + TIMEOUT;
        let mut line = Vec::new();
        loop {
            match read_byte(stream) {
                Ok(None) => return Err("the connection closed".into()),
                Ok(Some(b'\n')) => break,
                Ok(Some(_)) if line.len() >= MAX_LINE => {
                    return Err(format!("a line longer than {MAX_LINE} bytes").into())
                }
                Ok(Some(byte)) => line.push(byte),
                Err(e) if timed_out(&e) && Instant::now() < deadline => {}
                Err(e) if timed_out(&e) => {
                    return Err(format!("nothing for {} s", TIMEOUT.as_secs()).into())
                }
                Err(e) => return Err(e.into()),
            }
        }
        String::from_utf8(line).map_err(|_| "a line that is not text".into())
    }

    /// Tells the peer this side failed, if it still listens.
    fn tell_failure(stream: &mut TcpStream, e: &dyn std::fmt::Display) {
        let text = e.to_string().replace(['\n', '\r'], " ");
        let mut line = vec![FAIL];
        line.extend_from_slice(text.as_bytes());
        line.push(b'\n');
        // The peer may be gone already: this is only a courtesy.
        let _ = stream.write_all(&line);
    }

    /// Reads the client's plan and accepts it if it is this server's.
    fn agree(stream: &mut TcpStream, args: &Args, peer: SocketAddr) -> Result<()> {
        stream.set_read_timeout(Some(TIMEOUT))?;
        stream.set_write_timeout(Some(TIMEOUT))?;
        let line = read_line(stream)
            .map_err(|e| format!("reading the plan of the client at {peer}: {e}"))?;
        let theirs = match Plan::decode(&line) {
            Ok(plan) => plan,
            Err(e) => {
                let _ = writeln!(stream, "ERR {e}");
                return Err(format!("the client at {peer}: {e}").into());
            }
        };
        let ours = Plan::of(args);
        if theirs != ours {
            let why = format!(
                "the client asks for {}, the server was started for {}: give both sides \
                 the same op, mode, -s/-a/--max-size, -t and -I",
                theirs.describe(),
                ours.describe()
            );
            let _ = writeln!(stream, "ERR {why}");
            return Err(format!("refused the client at {peer}: {why}").into());
        }
        writeln!(stream, "OK")?;
        Ok(())
    }

    /// The server: waits for one client, checks its plan, then follows
    /// it. Its receives (for SEND) are posted before the handshake.
    pub fn server(args: &Args, name: &str) -> Result<()> {
        let (dev, pd) = open(args, name)?;
        let listener = TcpListener::bind(("0.0.0.0", args.port))
            .map_err(|e| format!("port {}: {e}", args.port))?;
        println!(
            "rdma-ring-perf: server on {name}, waiting on port {}",
            args.port
        );
        let (mut stream, peer_addr) = listener.accept()?;
        agree(&mut stream, args, peer_addr)?;
        let qp = dev.create_qp(&pd, args.qp_config())?;
        args.granted(qp.caps())?;
        let target = expose(&pd, args)?;
        // A SEND server's receives go in before the handshake, so no SEND
        // meets an empty queue; otherwise the queue pair only has to stay.
        let (server, idle) = if args.op == Op::Send {
            let server = SendServer::new(args, &pd, qp)?;
            tcp::handshake(&mut stream, server.qp(), TIMEOUT)?;
            (Some(server), None)
        } else {
            tcp::handshake(&mut stream, &qp, TIMEOUT)?;
            (None, Some(qp))
        };
        stream.write_all(&target.remote().encode())?;
        // A `write lat` client sends where its echoes go; the queue pair
        // then goes to the thread that echoes.
        let echo_size = Arc::new(AtomicUsize::new(0));
        let write_lat = (args.op, args.mode) == (Op::Write, Mode::Lat);
        let (running, _idle) = match (server, idle) {
            (Some(server), _) => (Some(server.start()), None),
            (None, Some(qp)) if write_lat => {
                let mut record = [0u8; rdma_ring::buf::REMOTE_SLICE_WIRE_LEN];
                stream.set_read_timeout(Some(TIMEOUT))?;
                stream.read_exact(&mut record)?;
                let client = RemoteSlice::decode(&record)?;
                // SAFETY: `target` outlives the thread, which `stop` below
                // joins.
                let watch = unsafe { EchoWatch::of(&target) };
                let echo = WriteEcho::new(args, &pd, qp, watch, client)?;
                (Some(echo.start(Arc::clone(&echo_size))), None)
            }
            (None, idle) => (None, idle),
        };
        let sizes = args.sizes();
        let echoed = write_lat.then_some((&sizes[..], &*echo_size));
        let served = serve_plan(&mut stream, running.as_ref(), echoed);
        // The receiving thread's own error, if it had one, says more than
        // what the plan ran into because of it.
        let stopped = running.map_or(Ok(()), Running::stop);
        let result = stopped.and(served);
        if let Err(e) = &result {
            tell_failure(&mut stream, e);
        }
        result?;
        println!("rdma-ring-perf: client {peer_addr} done");
        Ok(())
    }

    /// Answers BEGIN with READY and END with READY until BYE, watching the
    /// receiving thread (if any) all the while. Between sizes the client
    /// has `TIMEOUT` to go on; during one, as long as it makes progress
    /// (it fails itself, and tells, after `STALL` without).
    fn serve_plan(
        stream: &mut TcpStream,
        receiving: Option<&Running>,
        echoed: Option<(&[usize], &AtomicUsize)>,
    ) -> Result<()> {
        stream.set_read_timeout(Some(TICK))?;
        let mut in_size = false;
        let mut begun = 0;
        let mut heard = Instant::now();
        loop {
            let byte = match read_byte(stream) {
                Ok(Some(byte)) => byte,
                Ok(None) => {
                    let why = "the client closed the connection before it was done (see its \
                               output)";
                    return Err(why.into());
                }
                Err(e) if timed_out(&e) => {
                    if receiving.is_some_and(Running::failed) {
                        return Err("the receiving thread stopped".into());
                    }
                    if !in_size && heard.elapsed() >= TIMEOUT {
                        return Err(format!(
                            "the client said nothing for {} s between sizes",
                            TIMEOUT.as_secs()
                        )
                        .into());
                    }
                    continue;
                }
                Err(e) => return Err(format!("the connection to the client: {e}").into()),
            };
            heard = Instant::now();
            if receiving.is_some_and(Running::failed) {
                return Err("the receiving thread stopped".into());
            }
            match byte {
                BEGIN => {
                    in_size = true;
                    // The echo thread watches the size about to run.
                    if let Some((sizes, size)) = echoed {
                        size.store(sizes.get(begun).copied().unwrap_or(0), Ordering::Release);
                    }
                    begun += 1;
                }
                END => in_size = false,
                BYE => return Ok(()),
                FAIL => {
                    stream.set_read_timeout(Some(TIMEOUT))?;
                    let why = read_line(stream).unwrap_or_else(|e| format!("(unreadable: {e})"));
                    return Err(format!("the client failed: {why}").into());
                }
                other => return Err(format!("unexpected byte {other:#04x} from the client").into()),
            }
            stream.write_all(&[READY])?;
        }
    }

    /// The connection to the server, and where its echoes land in a
    /// `write lat` run.
    struct RemoteSync<'a>(&'a mut TcpStream, Option<EchoWatch>);

    impl RemoteSync<'_> {
        fn say(&mut self, byte: u8) -> Result<()> {
            self.0
                .write_all(&[byte])
                .map_err(|e| format!("the connection to the server: {e}"))?;
            match read_byte(self.0) {
                Ok(Some(READY)) => Ok(()),
                Ok(Some(FAIL)) => Err(self.failure()),
                Ok(Some(other)) => {
                    Err(format!("the server answered with byte {other:#04x}").into())
                }
                Ok(None) => Err(Self::gone()),
                Err(e) if timed_out(&e) => {
                    Err(format!("the server did not answer within {} s", TIMEOUT.as_secs()).into())
                }
                Err(e) => Err(format!("the connection to the server: {e}").into()),
            }
        }

        fn gone() -> Box<dyn std::error::Error + std::marker::Send + Sync> {
            "the server closed the connection (see its output)".into()
        }

        /// The server's error, after its FAIL byte.
        fn failure(&mut self) -> Box<dyn std::error::Error + std::marker::Send + Sync> {
            match read_line(self.0) {
                Ok(why) => format!("the server failed: {why}").into(),
                Err(e) => format!("the server failed (its reason unreadable: {e})").into(),
            }
        }
    }

    impl Handoff for RemoteSync<'_> {
        fn begin(&mut self, _size: usize) -> Result<()> {
            self.say(BEGIN)
        }
        fn end(&mut self) -> Result<()> {
            self.say(END)
        }
        /// The server says nothing unasked unless it failed (or left):
        /// look without waiting.
        fn check(&mut self) -> Result<()> {
            let mut byte = [0u8; 1];
            self.0.set_nonblocking(true)?;
            let peeked = self.0.peek(&mut byte);
            self.0.set_nonblocking(false)?;
            match peeked {
                Ok(0) => Err(Self::gone()),
                Ok(_) if byte[0] == FAIL => {
                    let _ = read_byte(self.0);
                    Err(self.failure())
                }
                Ok(_) => Err(format!("the server sent byte {:#04x} unasked", byte[0]).into()),
                Err(e) if timed_out(&e) || e.kind() == ErrorKind::Interrupted => Ok(()),
                Err(e) => Err(format!("the connection to the server: {e}").into()),
            }
        }
        fn echoes(&self) -> Option<EchoWatch> {
            self.1
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
        stream.set_read_timeout(Some(TIMEOUT))?;
        stream.set_write_timeout(Some(TIMEOUT))?;
        writeln!(stream, "{}", Plan::of(args).encode())?;
        let verdict = read_line(&mut stream).map_err(|e| {
            format!(
                "the server did not answer the plan ({e}): is it rdma-ring-perf of this version?"
            )
        })?;
        if let Some(why) = verdict.strip_prefix("ERR ") {
            return Err(format!("the server refused: {why}").into());
        }
        if verdict != "OK" {
            return Err(format!(
                "the server answered the plan with {verdict:?}: is it rdma-ring-perf of this version?"
            )
            .into());
        }
        let qp = dev.create_qp(&pd, args.qp_config())?;
        args.granted(qp.caps())?;
        // SEND latency's echoes find receives posted by the measurement
        // itself, each before its send.
        tcp::handshake(&mut stream, &qp, TIMEOUT)?;
        let mut record = [0u8; rdma_ring::buf::REMOTE_SLICE_WIRE_LEN];
        stream.set_read_timeout(Some(TIMEOUT))?;
        stream.read_exact(&mut record)?;
        let remote = RemoteSlice::decode(&record)?;
        // Where a `write lat` server's echoes go.
        let mine = echoed(&pd, args)?;
        if let Some(mine) = &mine {
            stream.write_all(&mine.remote().encode())?;
        }
        // SAFETY: `mine` outlives the measurement, the watch's only user.
        let echoes = mine.as_ref().map(|m| unsafe { EchoWatch::of(m) });
        let rows = measure_all(args, &pd, qp, remote, &mut RemoteSync(&mut stream, echoes));
        match &rows {
            Ok(_) => stream.write_all(&[BYE])?,
            Err(e) => tell_failure(&mut stream, e),
        }
        rows
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row_of(samples: usize) -> Row {
        Row {
            bytes: 8,
            iters: samples as u64,
            secs: 1.0,
            signaled: samples as u64,
            lat: (1..=samples).map(|x| x as f64).collect(),
        }
    }

    /// Percentiles are nearest-rank: the smallest sample at or above
    /// which that share of the samples lie.
    #[test]
    fn percentiles_are_nearest_rank() {
        assert_eq!(row_of(160).tail(0.99), Some(159.0));
        assert_eq!(row_of(1000).tail(0.99), Some(990.0));
        assert_eq!(row_of(2000).tail(0.999), Some(1998.0));
        assert_eq!(row_of(1700).tail(0.999), Some(1699.0));
        assert_eq!(row_of(99).tail(0.99), None, "too few samples");
        assert_eq!(row_of(1).pct(0.5), 1.0);
    }

    /// A queue pair given less inline room than `-I` asks is refused
    /// before anything runs, saying what the device gives; depths and
    /// inline sizes past any device's are refused as arguments.
    #[test]
    fn inline_and_depth_beyond_what_can_be_had_are_refused() {
        let args = Args::try_parse_from(["rdma-ring-perf", "write", "lat", "-I", "512"]).unwrap();
        let dev = SoftDevice::new();
        let pd = dev.alloc_pd();
        let (qp, _peer) = dev.connected_pair(&pd, &pd, args.qp_config()).unwrap();
        let err = args.granted(qp.caps()).unwrap_err().to_string();
        assert!(err.contains("given 256 bytes"), "{err}");
        for (flag, value) in [("-t", "4294967295"), ("-I", "4294967296")] {
            let args =
                Args::try_parse_from(["rdma-ring-perf", "write", "bw", flag, value]).unwrap();
            let err = args.check().unwrap_err().to_string();
            assert!(err.contains("at most"), "{flag} {value}: {err}");
        }
    }
}
