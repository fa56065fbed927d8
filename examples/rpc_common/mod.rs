//! What the RPC examples share: the handlers (echo and a key-value
//! store), the checked client workload, the latency benchmark, and the
//! same handlers served over plain TCP for comparison.

#![allow(dead_code)] // each example uses part of it

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_ring::backend::QueuePair;
use rdma_ring::rpc::{Caller, HandlerError, RpcClient, RpcError, Service};

pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Which handler a server runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandlerKind {
    Echo,
    Kv,
}

impl std::str::FromStr for HandlerKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "echo" => Ok(HandlerKind::Echo),
            "kv" => Ok(HandlerKind::Kv),
            other => Err(format!("unknown handler {other:?} (echo or kv)")),
        }
    }
}

/// The echo handler: the response is the request.
pub fn echo(_: &Caller, req: &[u8], resp: &mut Vec<u8>) -> std::result::Result<(), HandlerError> {
    resp.extend_from_slice(req);
    Ok(())
}

/// A key-value store: `P<key>\0<value>` stores, `G<key>` fetches, `D<key>`
/// deletes.
#[derive(Default)]
pub struct KvStore {
    map: HashMap<Vec<u8>, Vec<u8>>,
}

impl KvStore {
    pub fn apply(
        &mut self,
        req: &[u8],
        resp: &mut Vec<u8>,
    ) -> std::result::Result<(), HandlerError> {
        let (op, rest) = req
            .split_first()
            .ok_or_else(|| HandlerError::new("empty request"))?;
        match op {
            b'P' => {
                let split = rest
                    .iter()
                    .position(|&b| b == 0)
                    .ok_or_else(|| HandlerError::new("PUT without a value"))?;
                self.map
                    .insert(rest[..split].to_vec(), rest[split + 1..].to_vec());
                resp.extend_from_slice(b"OK");
                Ok(())
            }
            b'G' => match self.map.get(rest) {
                Some(v) => {
                    resp.extend_from_slice(v);
                    Ok(())
                }
                None => Err(HandlerError::new("no such key")),
            },
            b'D' => match self.map.remove(rest) {
                Some(_) => {
                    resp.extend_from_slice(b"OK");
                    Ok(())
                }
                None => Err(HandlerError::new("no such key")),
            },
            _ => Err(HandlerError::new("unknown operation")),
        }
    }
}

/// The RDMA service for `kind`.
pub fn service(kind: HandlerKind) -> Service {
    match kind {
        HandlerKind::Echo => Service::handler(echo),
        HandlerKind::Kv => {
            let mut store = KvStore::default();
            Service::handler(move |_: &Caller, req: &[u8], resp: &mut Vec<u8>| {
                store.apply(req, resp)
            })
        }
    }
}

/// Bytes a call's request carries: a pattern no two calls share.
pub fn pattern(len: usize, client: usize, call: usize) -> Vec<u8> {
    let seed = (client * 7919 + call * 31) as u32;
    (0..len)
        .map(|i| (seed.wrapping_add(i as u32).wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect()
}

/// Request sizes of the checked echo workload: inline ones, the largest
/// inline one (4 KiB with the default config), and larger ones that go
/// by rendezvous.
const SIZES: [usize; 7] = [1, 64, 1000, 4096, 4097, 20_000, 300_000];

/// What one client did.
pub struct ClientReport {
    pub calls: usize,
    pub bytes: usize,
}

/// Runs `calls` checked calls with up to `depth` in flight, against the
/// handler `kind`; every response is compared with what it must be.
pub fn checked_workload<Q: QueuePair + Send + 'static>(
    client: &RpcClient<Q>,
    kind: HandlerKind,
    index: usize,
    calls: usize,
    depth: usize,
) -> Result<ClientReport> {
    let mut report = ClientReport { calls: 0, bytes: 0 };
    match kind {
        HandlerKind::Echo => {
            let mut i = 0;
            while i < calls {
                let batch: Vec<Vec<u8>> = (i..(i + depth).min(calls))
                    .map(|c| pattern(SIZES[c % SIZES.len()], index, c))
                    .collect();
                let futures: Vec<_> = batch.iter().map(|r| client.call_async(r)).collect();
                let got = futures::executor::block_on(futures::future::join_all(futures));
                for (k, (req, resp)) in batch.iter().zip(got).enumerate() {
                    let resp = resp.map_err(|e| format!("client {index} call {}: {e}", i + k))?;
                    if &resp != req {
                        return Err(format!(
                            "client {index} call {}: the echo of {} bytes differs",
                            i + k,
                            req.len()
                        )
                        .into());
                    }
                    report.calls += 1;
                    report.bytes += req.len();
                }
                i += batch.len();
            }
        }
        HandlerKind::Kv => {
            let key = |c: usize| format!("client{index}/key{c}").into_bytes();
            let value = |c: usize| pattern(16 + (c % 5) * 1500, index, c);
            let mut i = 0;
            while i < calls {
                let end = (i + depth).min(calls);
                let puts: Vec<Vec<u8>> = (i..end)
                    .map(|c| {
                        let mut req = b"P".to_vec();
                        req.extend_from_slice(&key(c));
                        req.push(0);
                        req.extend_from_slice(&value(c));
                        req
                    })
                    .collect();
                let got = futures::executor::block_on(futures::future::join_all(
                    puts.iter().map(|r| client.call_async(r)),
                ));
                for r in got {
                    if r? != b"OK" {
                        return Err("a PUT was not acknowledged".into());
                    }
                }
                let gets: Vec<Vec<u8>> = (i..end)
                    .map(|c| [b"G".as_slice(), &key(c)].concat())
                    .collect();
                let got = futures::executor::block_on(futures::future::join_all(
                    gets.iter().map(|r| client.call_async(r)),
                ));
                for (c, r) in (i..end).zip(got) {
                    if r? != value(c) {
                        return Err(format!(
                            "client {index}: GET of key {c} returned another value"
                        )
                        .into());
                    }
                    report.bytes += value(c).len();
                }
                report.calls += 2 * (end - i);
                i = end;
            }
            let missing = client.call(format!("Gclient{index}/missing").as_bytes());
            if missing != Err(RpcError::Handler("no such key".into())) {
                return Err(format!("a GET of a missing key gave {missing:?}").into());
            }
            report.calls += 1;
        }
    }
    Ok(report)
}

/// Latencies of `calls` one-at-a-time calls of `size` bytes.
pub fn latencies(
    mut call: impl FnMut(&[u8]) -> Result<Vec<u8>>,
    size: usize,
    calls: usize,
) -> Result<Vec<Duration>> {
    let req = pattern(size, 0, 0);
    // Warm up (registration caches, branch predictors, the peer's pages).
    for _ in 0..calls.min(100) {
        call(&req)?;
    }
    let mut out = Vec::with_capacity(calls);
    for _ in 0..calls {
        let t = Instant::now();
        let resp = call(&req)?;
        out.push(t.elapsed());
        if resp.len() != req.len() {
            return Err("a benchmark echo came back short".into());
        }
    }
    Ok(out)
}

/// Runs `clients` threads each making `calls` calls of `size` bytes,
/// and prints one line: requests per second and the latency
/// percentiles over all calls.
pub fn bench<C: Send + 'static>(
    label: &str,
    clients: Vec<C>,
    size: usize,
    calls: usize,
    call: fn(&mut C, &[u8]) -> Result<Vec<u8>>,
) -> Result<()> {
    let n = clients.len();
    let start = Arc::new(std::sync::Barrier::new(n + 1));
    let threads: Vec<_> = clients
        .into_iter()
        .map(|mut c| {
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                start.wait();
                latencies(|req| call(&mut c, req), size, calls)
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    let mut all = Vec::new();
    for t in threads {
        all.extend(t.join().map_err(|_| "a client thread panicked")??);
    }
    let elapsed = t0.elapsed();
    if all.is_empty() {
        return Err("no call was measured: --calls must be at least 1".into());
    }
    all.sort();
    let pct =
        |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)].as_secs_f64() * 1e6;
    // Warm-up calls are inside `elapsed`; count them in the rate too.
    let total = n * (calls + calls.min(100));
    println!(
        "BENCH transport={label} clients={n} size={size} calls={} rps={:.0} p50_us={:.1} p99_us={:.1}",
        all.len(),
        total as f64 / elapsed.as_secs_f64(),
        pct(0.50),
        pct(0.99)
    );
    Ok(())
}

/// The same handlers over TCP: a thread per connection, frames of a
/// 4-byte little-endian length and the bytes; the handler behind a lock,
/// as one poller would run it. Returns when `exit_after` connections
/// came and went (or never, without it).
pub fn serve_tcp(
    listener: TcpListener,
    kind: HandlerKind,
    exit_after: Option<usize>,
) -> Result<()> {
    let store = Arc::new(std::sync::Mutex::new(KvStore::default()));
    let mut conns = Vec::new();
    let caller = Caller {
        client_id: 0,
        peer: None,
        qp_num: 0,
    };
    for (accepted, stream) in listener.incoming().enumerate() {
        let mut stream = stream?;
        stream.set_nodelay(true)?;
        let store = Arc::clone(&store);
        conns.push(std::thread::spawn(move || {
            let mut resp = Vec::new();
            while let Ok(req) = read_frame(&mut stream) {
                resp.clear();
                let result = match kind {
                    HandlerKind::Echo => echo(&caller, &req, &mut resp),
                    HandlerKind::Kv => store.lock().unwrap().apply(&req, &mut resp),
                };
                if result.is_err() {
                    resp.clear();
                }
                if write_frame(&mut stream, &resp).is_err() {
                    break;
                }
            }
        }));
        if exit_after.is_some_and(|n| accepted + 1 >= n) {
            break;
        }
    }
    for c in conns {
        let _ = c.join();
    }
    Ok(())
}

/// The largest frame `read_frame` takes: the length comes from the peer,
/// and is allocated before the bytes arrive.
pub const MAX_FRAME: usize = 64 << 20;

pub fn read_frame(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes: more than the {MAX_FRAME}-byte cap"),
        ));
    }
    let mut buf = vec![0u8; len];
    stream.read_exact(&mut buf)?;
    Ok(buf)
}

pub fn write_frame(stream: &mut TcpStream, bytes: &[u8]) -> std::io::Result<()> {
    let mut frame = Vec::with_capacity(4 + bytes.len());
    frame.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    frame.extend_from_slice(bytes);
    stream.write_all(&frame)
}

/// One call over the TCP baseline.
pub fn tcp_call(stream: &mut TcpStream, req: &[u8]) -> Result<Vec<u8>> {
    write_frame(stream, req)?;
    Ok(read_frame(stream)?)
}

/// A simple flag parser: `--name value` pairs and bare `--switch`es.
pub struct Flags {
    /// Each flag given, in order, with its value if it took one.
    given: Vec<(String, Option<String>)>,
    usage: &'static str,
}

impl Flags {
    /// Parses the command line: `switches` stand alone, `valued` flags
    /// take a value, and a flag in both takes the next argument as its
    /// value unless that is a flag itself; anything else is refused, and
    /// so is a flag given twice.
    /// `--help` prints the usage and exits.
    pub fn parse(usage: &'static str, switches: &[&str], valued: &[&str]) -> Result<Flags> {
        let args: Vec<String> = std::env::args().skip(1).collect();
        if args.iter().any(|a| a == "-h" || a == "--help") {
            println!("{usage}");
            std::process::exit(0);
        }
        let mut given = Vec::new();
        let mut args = args.into_iter().peekable();
        while let Some(flag) = args.next() {
            if !flag.starts_with("--") {
                return Err(format!("unexpected argument {flag:?}; {usage}").into());
            }
            let (switch, takes_value) = (
                switches.contains(&flag.as_str()),
                valued.contains(&flag.as_str()),
            );
            let value = match (switch, takes_value) {
                (false, false) => return Err(format!("unknown flag {flag:?}; {usage}").into()),
                (true, false) => None,
                (false, true) => Some(
                    args.next()
                        .ok_or_else(|| format!("{flag} needs a value; {usage}"))?,
                ),
                (true, true) => args.next_if(|next| !next.starts_with("--")),
            };
            if given.iter().any(|(seen, _)| *seen == flag) {
                return Err(format!("{flag} given twice; {usage}").into());
            }
            given.push((flag, value));
        }
        Ok(Flags { given, usage })
    }

    pub fn has(&self, name: &str) -> bool {
        self.given.iter().any(|(flag, _)| flag == name)
    }

    pub fn value(&self, name: &str) -> Option<&str> {
        self.given
            .iter()
            .find(|(flag, _)| flag == name)
            .and_then(|(_, value)| value.as_deref())
    }

    pub fn parsed<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T>
    where
        T::Err: std::fmt::Display,
    {
        match self.value(name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|e| format!("{name} {v:?}: {e}; {}", self.usage).into()),
        }
    }
}
