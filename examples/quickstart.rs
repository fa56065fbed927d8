//! The crate end to end: two connected endpoints. B exposes memory and
//! sends its descriptors; A writes 32 chunks in one submit (one doorbell),
//! reads them back, runs a compare-and-swap and a fetch-and-add, and sends
//! with immediate data to B's posted receive; B then checks its memory.
//! Every result is checked.
//!
//! ```text
//! cargo run --example quickstart [-- --device soft|NAME]
//! cargo run --example quickstart -- --device NAME --listen 0.0.0.0:7471   # B, one process
//! cargo run --example quickstart -- --device NAME --connect HOST:7471     # A, another
//! ```
//!
//! With no `--device` it uses the first RDMA device, or the soft device
//! when the host has none, and says which.

use std::process::ExitCode;

use rdma_ring::backend::soft::SoftDevice;
use rdma_ring::backend::{ProtectionDomain, QpConfig, QueuePair};
use rdma_ring::buf::{
    BaseBuf, BufferPool, ExposedBuf, RegisteredBuf, RemoteAccess, RemoteSlice,
    REMOTE_SLICE_WIRE_LEN,
};
use rdma_ring::op::{CompareSwap, FetchAdd, Read, Recv, Send, SendImm, Write};
use rdma_ring::ring::{Completion, Ring, RingConfig};
use rdma_ring::Error;

const CHUNKS: usize = 32;
const CHUNK: usize = 4096;
const IMM: u32 = 0x00C0_FFEE;
const USAGE: &str = "usage: quickstart [--device soft|NAME] [--listen ADDR | --connect ADDR]";

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    match run() {
        Ok(()) => {
            println!("quickstart: all checks passed");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("quickstart: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

// Without the verbs backend nothing reads the addresses.
#[cfg_attr(not(feature = "verbs"), allow(dead_code))]
enum Role {
    Both,
    Listen(String),
    Connect(String),
}

fn run() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut device, mut role) = (None, Role::Both);
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| {
            args.next()
                .ok_or_else(|| format!("{flag} needs a value; {USAGE}"))
        };
        match arg.as_str() {
            "--device" => device = Some(value("--device")?),
            "--listen" | "--connect" if !matches!(role, Role::Both) => {
                return Err(format!("give one of --listen and --connect; {USAGE}").into());
            }
            "--listen" => role = Role::Listen(value("--listen")?),
            "--connect" => role = Role::Connect(value("--connect")?),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}; {USAGE}").into()),
        }
    }
    let device = match device {
        Some(name) => name,
        None => match usable_device() {
            Some(name) => name,
            None => {
                println!("no --device given and no usable RDMA device: using the soft device");
                "soft".into()
            }
        },
    };
    if device == "soft" {
        if !matches!(role, Role::Both) {
            return Err(
                "--listen/--connect need a real device: the soft device lives in one process"
                    .into(),
            );
        }
        println!("device: soft (the in-process software RC device)");
        return soft(&SoftDevice::new());
    }
    verbs(&device, role)
}

/// The first RDMA device that opens (its port active), saying why each
/// one before it was passed over.
#[cfg(feature = "verbs")]
fn usable_device() -> Option<String> {
    let names = match rdma_ring::backend::verbs::device_names() {
        Ok(names) => names,
        Err(e) => {
            println!("could not list RDMA devices ({e})");
            return None;
        }
    };
    for name in &names {
        match rdma_ring::backend::verbs::VerbsDevice::open(name) {
            Ok(_) => {
                println!(
                    "no --device given: using {name}, the first usable RDMA device of {names:?}"
                );
                return Some(name.clone());
            }
            Err(e) => println!("passing over {name}: {e}"),
        }
    }
    None
}

#[cfg(not(feature = "verbs"))]
fn usable_device() -> Option<String> {
    None
}

fn config() -> QpConfig {
    QpConfig {
        max_send_wr: 128,
        max_recv_wr: 16,
        ..QpConfig::default()
    }
}

fn soft(dev: &SoftDevice) -> Result<()> {
    let (pd_a, pd_b) = (dev.alloc_pd(), dev.alloc_pd());
    let (qp_a, qp_b) = dev.connected_pair(&pd_a, &pd_b, config())?;
    println!("connected: A (qp {}) <-> B (qp {})", qp_a.qpn(), qp_b.qpn());
    both(&pd_a, &pd_b, qp_a, qp_b)
}

#[cfg(feature = "verbs")]
fn verbs(name: &str, role: Role) -> Result<()> {
    use rdma_ring::backend::verbs::VerbsDevice;
    use rdma_ring::connect::tcp;
    use std::time::Duration;

    let dev = VerbsDevice::open(name)?;
    println!(
        "device: {name} (libibverbs; port 1, GID index {}, limits {:?})",
        dev.gid_index(),
        dev.limits()
    );
    let pd = dev.alloc_pd()?;
    let timeout = Duration::from_secs(30);
    match role {
        Role::Both => {
            let qp_a = dev.create_qp(&pd, config())?;
            let qp_b = dev.create_qp(&pd, config())?;
            let (ea, eb) = (qp_a.endpoint(), qp_b.endpoint());
            qp_a.connect(&eb)?;
            qp_b.connect(&ea)?;
            println!(
                "connected: A (qp {}) <-> B (qp {}), endpoints exchanged in memory",
                ea.qpn, eb.qpn
            );
            both(&pd, &pd, qp_a, qp_b)
        }
        Role::Listen(addr) => {
            let listener = std::net::TcpListener::bind(&addr)?;
            println!("B: waiting for A on {addr}");
            let (mut stream, peer) = listener.accept()?;
            let qp = dev.create_qp(&pd, config())?;
            let remote = tcp::exchange(&mut stream, &qp.endpoint(), timeout)?;
            qp.connect(&remote)?;
            println!(
                "B: connected to A at {peer} (qp {} <-> qp {})",
                qp.qpn(),
                remote.qpn
            );
            let mut b = Ring::new(qp, RingConfig::default());
            let state = b_prepare(&pd, &mut b)?;
            tcp::ready(&mut stream, timeout)?;
            b_share(&pd, &mut b, &state)?;
            b_finish(&mut b, state)
        }
        Role::Connect(addr) => {
            let mut stream = std::net::TcpStream::connect(&addr)?;
            let qp = dev.create_qp(&pd, config())?;
            let remote = tcp::exchange(&mut stream, &qp.endpoint(), timeout)?;
            qp.connect(&remote)?;
            println!(
                "A: connected to B at {addr} (qp {} <-> qp {})",
                qp.qpn(),
                remote.qpn
            );
            let mut a = Ring::new(qp, RingConfig::default());
            a_prepare(&pd, &mut a)?;
            tcp::ready(&mut stream, timeout)?;
            a_work(&pd, &mut a)
        }
    }
}

#[cfg(not(feature = "verbs"))]
fn verbs(name: &str, _role: Role) -> Result<()> {
    Err(format!(
        "device {name:?}: this build has no verbs backend (feature `verbs`); use --device soft"
    )
    .into())
}

/// Both roles in one process, in the order two processes would run them.
fn both<P: ProtectionDomain, Q: QueuePair>(pd_a: &P, pd_b: &P, qp_a: Q, qp_b: Q) -> Result<()> {
    let mut a = Ring::new(qp_a, RingConfig::default());
    let mut b = Ring::new(qp_b, RingConfig::default());
    a_prepare(pd_a, &mut a)?;
    let state = b_prepare(pd_b, &mut b)?;
    b_share(pd_b, &mut b, &state)?;
    a_work(pd_a, &mut a)?;
    b_finish(&mut b, state)
}

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(what().into())
    }
}

fn wait<Q: QueuePair>(ring: &mut Ring<Q>, n: usize) -> Result<Vec<Completion>> {
    let done = ring.completion().wait(n)?;
    for c in &done {
        c.result()?;
    }
    Ok(done)
}

fn submit<Q: QueuePair>(ring: &mut Ring<Q>) -> Result<usize> {
    ring.submission()
        .submit()
        .map_err(|e| Box::new(e) as Box<dyn std::error::Error>)
}

fn pattern(chunk: usize, offset: usize) -> u8 {
    (chunk * 31 + offset * 7 + 1) as u8
}

/// A: post the receives B's descriptors will land in.
fn a_prepare<P: ProtectionDomain, Q: QueuePair>(pd: &P, a: &mut Ring<Q>) -> Result<()> {
    for i in 0..2 {
        let buf = RegisteredBuf::new(pd, vec![0u8; 64])?;
        a.submission().push(Recv::new(buf).user_data(i))?;
    }
    submit(a)?;
    Ok(())
}

/// B's exposed memory, and the receive that will get A's "done".
struct BState {
    data: ExposedBuf<Vec<u8>>,
    counters: ExposedBuf<Box<[u64]>>,
}

/// B: expose a data region and atomic counters; post a receive for A's
/// final message.
fn b_prepare<P: ProtectionDomain, Q: QueuePair>(pd: &P, b: &mut Ring<Q>) -> Result<BState> {
    let data = ExposedBuf::new(
        pd,
        vec![0u8; CHUNKS * CHUNK],
        RemoteAccess::READ | RemoteAccess::WRITE,
    )?;
    let counters = ExposedBuf::new(pd, vec![0u64, 100].into_boxed_slice(), RemoteAccess::ATOMIC)?;
    b.submission()
        .push(Recv::new(RegisteredBuf::new(pd, vec![0u8; 64])?).user_data(77))?;
    submit(b)?;
    Ok(BState { data, counters })
}

/// B: send both descriptors to A over SEND, in their wire format.
fn b_share<P: ProtectionDomain, Q: QueuePair>(
    pd: &P,
    b: &mut Ring<Q>,
    state: &BState,
) -> Result<()> {
    for (i, remote) in [state.data.remote(), state.counters.remote()]
        .iter()
        .enumerate()
    {
        let record = RegisteredBuf::new(pd, remote.encode().to_vec())?;
        b.submission().push(Send::new(record).user_data(i as u64))?;
    }
    submit(b)?;
    wait(b, 2)?;
    println!("send x2: B sent its two descriptors");
    Ok(())
}

/// A: everything that uses B's memory.
fn a_work<P: ProtectionDomain, Q: QueuePair>(pd: &P, a: &mut Ring<Q>) -> Result<()> {
    let mut received = wait(a, 2)?;
    received.sort_by_key(|c| c.user_data());
    let mut remotes = Vec::new();
    for c in received {
        check(c.byte_len() as usize == REMOTE_SLICE_WIRE_LEN, || {
            format!("descriptor of {} bytes", c.byte_len())
        })?;
        let buf = c.into_buf();
        remotes.push(RemoteSlice::decode(&buf[..REMOTE_SLICE_WIRE_LEN])?);
    }
    let (remote_data, remote_counters) = (remotes[0], remotes[1]);
    println!(
        "recv x2: A got B's descriptors: data {} bytes rkey {:#x} {:?}; counters {} bytes rkey {:#x} {:?}",
        remote_data.len(),
        remote_data.rkey(),
        remote_data.rights(),
        remote_counters.len(),
        remote_counters.rkey(),
        remote_counters.rights()
    );

    // 32 writes with one submit: one doorbell.
    let pool = BufferPool::new(pd, CHUNK, 2 * CHUNKS)?;
    for i in 0..CHUNKS {
        let mut chunk = pool.take()?;
        for (off, byte) in chunk.iter_mut().enumerate() {
            *byte = pattern(i, off);
        }
        let target = remote_data.slice((i * CHUNK) as u64..((i + 1) * CHUNK) as u64)?;
        a.submission()
            .push(Write::new(chunk, target).user_data(i as u64))?;
    }
    let doorbells = a.stats().doorbells;
    let posted = submit(a)?;
    let rung = a.stats().doorbells - doorbells;
    check(posted == CHUNKS && rung == 1, || {
        format!("posted {posted} writes with {rung} doorbells")
    })?;
    let writes = wait(a, CHUNKS)?;
    check(writes.len() == CHUNKS, || {
        format!("{} write completions", writes.len())
    })?;
    println!(
        "write x{CHUNKS}: {posted} WRs, 1 doorbell, {} CQE(s) asked for ({} ops completed implicitly), all succeeded",
        a.stats().signaled,
        a.stats().implicit
    );
    drop(writes);

    // 32 reads into fresh chunks, one submit; every byte checked.
    for i in 0..CHUNKS {
        let source = remote_data.slice((i * CHUNK) as u64..((i + 1) * CHUNK) as u64)?;
        a.submission()
            .push(Read::new(pool.take()?, source).user_data(i as u64))?;
    }
    submit(a)?;
    for c in &wait(a, CHUNKS)? {
        let i = c.user_data() as usize;
        check(c.byte_len() as usize == CHUNK, || {
            format!("read {i} moved {} bytes", c.byte_len())
        })?;
        let bad = c
            .buf()
            .iter()
            .enumerate()
            .find(|(off, &b)| b != pattern(i, *off));
        check(bad.is_none(), || {
            format!("read {i}: byte {bad:?} differs from what was written")
        })?;
    }
    println!("read x{CHUNKS}: every byte matches what was written");

    // Compare-and-swap on counter 0, fetch-and-add on counter 1.
    let cas_word = RegisteredBuf::new(pd, Box::new(u64::MAX))?.word(0)?;
    let faa_word = RegisteredBuf::new(pd, Box::new(u64::MAX))?.word(0)?;
    a.submission()
        .push(CompareSwap::new(cas_word, remote_counters.word(0)?, 0, 42).user_data(1))?;
    a.submission()
        .push(FetchAdd::new(faa_word, remote_counters.word(8)?, 5).user_data(2))?;
    submit(a)?;
    let mut atomics = wait(a, 2)?;
    atomics.sort_by_key(|c| c.user_data());
    let old: Vec<u64> = atomics
        .into_iter()
        .map(|c| u64::from_ne_bytes(c.into_buf()[..8].try_into().expect("a word is 8 bytes")))
        .collect();
    check(old == [0, 100], || {
        format!("atomics returned old values {old:?}, wanted [0, 100]")
    })?;
    println!("compare-and-swap: counter 0 was 0, swapped to 42");
    println!("fetch-and-add: counter 1 was 100, added 5");

    // Tell B we are done: SEND with immediate data to its posted receive.
    let done = RegisteredBuf::new(pd, b"chunks written".to_vec())?;
    a.submission().push(SendImm::new(done, IMM).user_data(78))?;
    submit(a)?;
    wait(a, 1)?;
    println!("send with imm: A told B it is done (imm {IMM:#x})");

    // A wrong rkey: the op comes back with a remote access error and its buffer.
    let forged = RemoteSlice::new(
        remote_data.addr(),
        64,
        remote_data.rkey() ^ 0x0101_0000,
        RemoteAccess::WRITE,
    );
    a.submission()
        .push(Write::new(pool.take()?.slice(0..64), forged).user_data(99))?;
    submit(a)?;
    let failed = a
        .completion()
        .wait(1)?
        .pop()
        .ok_or("no completion for the bad write")?;
    check(!failed.status().is_success(), || {
        "a forged rkey succeeded".into()
    })?;
    println!(
        "write with a wrong rkey: came back with \"{}\" and its buffer",
        failed.status()
    );
    drop(failed);
    let refused = a.submission().push(Write::new(
        pool.take()?,
        remote_data.slice(0..CHUNK as u64)?,
    ));
    check(
        matches!(
            refused.as_ref().map_err(|r| r.error()),
            Err(Error::QpInError(_))
        ),
        || "push after the error was not refused".into(),
    )?;
    println!(
        "push after the error: refused with \"{}\", op handed back",
        refused.unwrap_err().error()
    );
    let stats = a.stats();
    println!(
        "A: {} doorbells, {} send WRs, {} recv WRs in all; pool has {} of {} chunks free",
        stats.doorbells,
        stats.send_wrs,
        stats.recv_wrs,
        pool.available(),
        pool.capacity()
    );
    check(pool.available() == pool.capacity(), || {
        "a pool chunk was lost".into()
    })
}

/// B: wait for A's "done", then take the memory back and check it.
fn b_finish<Q: QueuePair>(b: &mut Ring<Q>, state: BState) -> Result<()> {
    let got = wait(b, 1)?.pop().ok_or("no receive completion")?;
    check(got.imm() == Some(IMM), || {
        format!("immediate {:?}, wanted {IMM:#x}", got.imm())
    })?;
    check(
        &got.buf()[..got.byte_len() as usize] == b"chunks written",
        || "payload differs".into(),
    )?;
    println!("recv with imm: B's receive got \"chunks written\" and imm {IMM:#x}");
    let counters = state.counters.into_inner()?;
    check(counters[..] == [42, 105], || {
        format!("counters are {counters:?}, wanted [42, 105]")
    })?;
    let data = state.data.into_inner()?;
    let bad = (0..CHUNKS * CHUNK).find(|&n| data[n] != pattern(n / CHUNK, n % CHUNK));
    check(bad.is_none(), || {
        format!("B's memory differs at byte {bad:?}")
    })?;
    println!("B: its memory holds all {CHUNKS} chunks; counters are [42, 105]");
    Ok(())
}
