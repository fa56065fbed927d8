//! The crate end to end: two connected endpoints; B exposes memory and
//! sends its descriptors; A writes 32 chunks in one submit (one doorbell),
//! reads them back, sends with immediate data to B's posted receive, and
//! runs a compare-and-swap and a fetch-and-add. Every result is checked.
//!
//! ```text
//! cargo run --example quickstart [-- --device soft|NAME]
//! ```
//!
//! With no flag it uses the first RDMA device, or the soft device when the
//! host has none, and says which.

use std::process::ExitCode;

use rdma_ring::backend::soft::SoftDevice;
use rdma_ring::backend::{QpConfig, QueuePair};
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

fn run() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let mut device = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--device" => {
                device = Some(
                    args.next()
                        .ok_or("--device needs a value: soft or a device name")?,
                )
            }
            "-h" | "--help" => {
                println!("usage: quickstart [--device soft|NAME]");
                return Ok(());
            }
            other => {
                return Err(format!(
                    "unknown argument {other:?}; usage: quickstart [--device soft|NAME]"
                )
                .into())
            }
        }
    }
    let hardware = hardware_devices();
    match device.as_deref() {
        Some("soft") => println!("device: soft (in-process software RC device, as asked)"),
        Some(name) => {
            return Err(format!(
                "device {name:?}: this build drives only the soft device so far (the verbs queue-pair backend is not built yet); \
                 RDMA devices seen: {hardware:?}; run with --device soft"
            )
            .into())
        }
        None if hardware.is_empty() => {
            println!("device: soft (no RDMA device found on this host, so using the in-process software RC device)")
        }
        None => println!(
            "device: soft (RDMA devices {hardware:?} found, but this build drives only the soft device so far; using it)"
        ),
    }
    let dev = SoftDevice::new();
    demo(&dev)
}

#[cfg(feature = "verbs")]
fn hardware_devices() -> Vec<String> {
    rdma_ring::backend::verbs::device_names().unwrap_or_else(|e| {
        println!("note: could not list RDMA devices ({e})");
        Vec::new()
    })
}

#[cfg(not(feature = "verbs"))]
fn hardware_devices() -> Vec<String> {
    Vec::new()
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

fn demo(dev: &SoftDevice) -> Result<()> {
    let (pd_a, pd_b) = (dev.alloc_pd(), dev.alloc_pd());
    let config = QpConfig {
        max_send_wr: 128,
        max_recv_wr: 16,
        ..QpConfig::default()
    };
    let (qp_a, qp_b) = dev.connected_pair(&pd_a, &pd_b, config)?;
    let mut a = Ring::new(qp_a, RingConfig::default());
    let mut b = Ring::new(qp_b, RingConfig::default());
    println!(
        "connected: A (qp {}) <-> B (qp {})",
        a.qp().qpn(),
        b.qp().qpn()
    );

    // B exposes a data region and a region of atomic counters.
    let data = ExposedBuf::new(
        &pd_b,
        vec![0u8; CHUNKS * CHUNK],
        RemoteAccess::READ | RemoteAccess::WRITE,
    )?;
    let counters: Box<[u64]> = vec![0, 100, 0, 0].into_boxed_slice();
    let counters = ExposedBuf::new(&pd_b, counters, RemoteAccess::ATOMIC)?;

    // B sends both descriptors to A over SEND/RECV, in their wire format.
    for i in 0..2 {
        let buf = RegisteredBuf::new(&pd_a, vec![0u8; 64])?;
        a.submission().push(Recv::new(buf).user_data(i))?;
    }
    submit(&mut a)?;
    for (i, remote) in [data.remote(), counters.remote()].iter().enumerate() {
        let record = RegisteredBuf::new(&pd_b, remote.encode().to_vec())?;
        b.submission().push(Send::new(record).user_data(i as u64))?;
    }
    submit(&mut b)?;
    wait(&mut b, 2)?;
    let mut received = wait(&mut a, 2)?;
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

    // A writes 32 chunks with one submit: one doorbell.
    let pool = BufferPool::new(&pd_a, CHUNK, 2 * CHUNKS)?;
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
    let posted = submit(&mut a)?;
    let rung = a.stats().doorbells - doorbells;
    check(posted == CHUNKS && rung == 1, || {
        format!("posted {posted} writes with {rung} doorbells")
    })?;
    let writes = wait(&mut a, CHUNKS)?;
    check(writes.len() == CHUNKS, || {
        format!("{} write completions", writes.len())
    })?;
    let signaled = a.stats().signaled;
    println!(
        "write x{CHUNKS}: {posted} WRs, 1 doorbell, {} CQEs asked for ({} completed implicitly), all succeeded",
        signaled,
        a.stats().implicit
    );
    drop(writes); // chunks back to the pool

    // A reads them back into fresh chunks, again in one submit.
    for i in 0..CHUNKS {
        let source = remote_data.slice((i * CHUNK) as u64..((i + 1) * CHUNK) as u64)?;
        a.submission()
            .push(Read::new(pool.take()?, source).user_data(i as u64))?;
    }
    submit(&mut a)?;
    let reads = wait(&mut a, CHUNKS)?;
    for c in &reads {
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
            format!("read {i}: byte {:?} differs from what was written", bad)
        })?;
    }
    println!("read x{CHUNKS}: every byte matches what was written");
    drop(reads);

    // A sends with immediate data to a receive B posted.
    b.submission()
        .push(Recv::new(RegisteredBuf::new(&pd_b, vec![0u8; 64])?).user_data(77))?;
    submit(&mut b)?;
    a.submission().push(
        SendImm::new(RegisteredBuf::new(&pd_a, b"chunks written".to_vec())?, IMM).user_data(78),
    )?;
    submit(&mut a)?;
    wait(&mut a, 1)?;
    let got = wait(&mut b, 1)?.pop().ok_or("no receive completion")?;
    check(got.imm() == Some(IMM), || {
        format!("immediate {:?}, wanted {IMM:#x}", got.imm())
    })?;
    check(
        &got.buf()[..got.byte_len() as usize] == b"chunks written",
        || "payload differs".into(),
    )?;
    println!(
        "send with imm: B's receive got {} bytes \"chunks written\" and imm {IMM:#x}",
        got.byte_len()
    );

    // A runs a compare-and-swap on counter 0 and a fetch-and-add on counter 1.
    let cas_word = RegisteredBuf::new(&pd_a, Box::new(u64::MAX))?.word(0)?;
    let faa_word = RegisteredBuf::new(&pd_a, Box::new(u64::MAX))?.word(0)?;
    a.submission()
        .push(CompareSwap::new(cas_word, remote_counters.word(0)?, 0, 42).user_data(1))?;
    a.submission()
        .push(FetchAdd::new(faa_word, remote_counters.word(8)?, 5).user_data(2))?;
    submit(&mut a)?;
    let mut atomics = wait(&mut a, 2)?;
    atomics.sort_by_key(|c| c.user_data());
    let old: Vec<u64> = atomics
        .into_iter()
        .map(|c| {
            let word = c.into_buf();
            u64::from_ne_bytes(word[..8].try_into().expect("a word is 8 bytes"))
        })
        .collect();
    check(old == [0, 100], || {
        format!("atomics returned old values {old:?}, wanted [0, 100]")
    })?;
    println!("compare-and-swap: counter 0 was 0, swapped to 42");
    println!("fetch-and-add: counter 1 was 100, added 5");

    // B takes its memory back (revoking A's access) and checks it.
    let counters = counters.into_inner();
    check(counters[..2] == [42, 105], || {
        format!("counters are {:?}, wanted [42, 105]", &counters[..2])
    })?;
    let data = data.into_inner();
    let bad = (0..CHUNKS * CHUNK).find(|&n| data[n] != pattern(n / CHUNK, n % CHUNK));
    check(bad.is_none(), || {
        format!("B's memory differs at byte {bad:?}")
    })?;
    println!("B: its memory holds all {CHUNKS} chunks; counters are [42, 105]");

    // A wrong rkey: the op comes back with a remote access error and its buffer.
    let forged = RemoteSlice::new(
        remote_data.addr(),
        64,
        remote_data.rkey() ^ 0x55,
        RemoteAccess::WRITE,
    );
    let chunk = pool.take()?.slice(0..64);
    a.submission()
        .push(Write::new(chunk, forged).user_data(99))?;
    submit(&mut a)?;
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
    let (a_stats, returned) = (a.stats(), a.close().len());
    println!(
        "closed A: {returned} ops handed back at close; {} doorbells, {} send WRs, {} recv WRs in all; pool has {} of {} chunks free",
        a_stats.doorbells,
        a_stats.send_wrs,
        a_stats.recv_wrs,
        pool.available(),
        pool.capacity()
    );
    check(pool.available() == pool.capacity(), || {
        "a pool chunk was lost".into()
    })?;
    Ok(())
}
