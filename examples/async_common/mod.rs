//! The async quickstart's body, shared by the tokio, smol and
//! `futures::executor` examples: only how tasks are woken differs.

#![allow(dead_code)]

use futures::future::join_all;
use rdma_ring::backend::soft::{SoftDevice, SoftPd, SoftQp};
use rdma_ring::backend::{ProtectionDomain, QpConfig, QueuePair};
use rdma_ring::buf::{BaseBuf, BufferPool, ExposedBuf, RegisteredBuf, RemoteAccess};
use rdma_ring::future::{AsyncRing, Wakeup};
use rdma_ring::ring::{Ring, RingConfig};

pub const CHUNKS: usize = 32;
pub const CHUNK: usize = 4096;
const IMM: u32 = 0x00C0_FFEE;

/// Two connected async rings and their protection domains.
pub struct Endpoints<P, Q: QueuePair + Send + 'static> {
    pub pd_a: P,
    pub pd_b: P,
    pub a: AsyncRing<Q>,
    pub b: AsyncRing<Q>,
}

/// `--device soft|NAME` from `example`'s command line (default: soft);
/// `--help` prints the usage and exits.
pub fn device_arg(example: &str) -> Result<String, String> {
    let usage = format!("usage: {example} [--device soft|NAME]");
    let mut args = std::env::args().skip(1);
    let mut device = "soft".to_string();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--device" => {
                device = args.next().ok_or_else(|| {
                    format!("--device needs a value: soft or a device name; {usage}")
                })?
            }
            "-h" | "--help" => {
                println!("{usage}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}; {usage}")),
        }
    }
    Ok(device)
}

/// Two connected async rings on the soft device.
pub fn endpoints(wakeup: Wakeup) -> Result<Endpoints<SoftPd, SoftQp>, String> {
    endpoints_on(SoftDevice::new(), wakeup)
}

/// Two connected async rings on `dev` (whatever its progress mode).
pub fn endpoints_on(dev: SoftDevice, wakeup: Wakeup) -> Result<Endpoints<SoftPd, SoftQp>, String> {
    let (pd_a, pd_b) = (dev.alloc_pd(), dev.alloc_pd());
    let (qa, qb) = dev
        .connected_pair(&pd_a, &pd_b, QpConfig::default())
        .map_err(|e| e.to_string())?;
    let a =
        AsyncRing::new(Ring::new(qa, RingConfig::default()), wakeup).map_err(|e| e.to_string())?;
    let b =
        AsyncRing::new(Ring::new(qb, RingConfig::default()), wakeup).map_err(|e| e.to_string())?;
    Ok(Endpoints { pd_a, pd_b, a, b })
}

/// Two connected async rings on the verbs device `name`.
#[cfg(feature = "verbs")]
pub fn verbs_endpoints(
    name: &str,
    wakeup: Wakeup,
) -> Result<Endpoints<rdma_ring::backend::verbs::VerbsPd, rdma_ring::backend::verbs::VerbsQp>, String>
{
    let e = |e: rdma_ring::Error| e.to_string();
    let dev = rdma_ring::backend::verbs::VerbsDevice::open(name).map_err(e)?;
    let pd = dev.alloc_pd().map_err(e)?;
    let qa = dev.create_qp(&pd, QpConfig::default()).map_err(e)?;
    let qb = dev.create_qp(&pd, QpConfig::default()).map_err(e)?;
    let (ea, eb) = (qa.endpoint(), qb.endpoint());
    qa.connect(&eb).map_err(e)?;
    qb.connect(&ea).map_err(e)?;
    let a = AsyncRing::new(Ring::new(qa, RingConfig::default()), wakeup).map_err(e)?;
    let b = AsyncRing::new(Ring::new(qb, RingConfig::default()), wakeup).map_err(e)?;
    Ok(Endpoints {
        pd_a: pd.clone(),
        pd_b: pd,
        a,
        b,
    })
}

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(what())
    }
}

fn pattern(chunk: usize, offset: usize) -> u8 {
    (chunk * 31 + offset * 7 + 1) as u8
}

/// Writes, reads back, sends with immediate data, runs both atomics and
/// drops a future mid-flight; checks everything; prints op by op.
pub async fn exercise<P: ProtectionDomain, Q: QueuePair + Send + 'static>(
    e: &Endpoints<P, Q>,
) -> Result<(), String> {
    let err = |e: rdma_ring::Error| e.to_string();
    let data = ExposedBuf::new(
        &e.pd_b,
        vec![0u8; CHUNKS * CHUNK],
        RemoteAccess::READ | RemoteAccess::WRITE,
    )
    .map_err(|r| r.to_string())?;
    let counters = ExposedBuf::new(
        &e.pd_b,
        vec![0u64, 100].into_boxed_slice(),
        RemoteAccess::ATOMIC,
    )
    .map_err(|r| r.to_string())?;
    let (remote, remote_counters) = (data.remote(), counters.remote());
    let pool = BufferPool::new(&e.pd_a, CHUNK, 2 * CHUNKS).map_err(err)?;

    // 32 writes pushed, one submit (one doorbell), awaited together.
    let mut writes = Vec::with_capacity(CHUNKS);
    for i in 0..CHUNKS {
        let mut chunk = pool.take().map_err(err)?;
        for (off, byte) in chunk.iter_mut().enumerate() {
            *byte = pattern(i, off);
        }
        let target = remote
            .slice((i * CHUNK) as u64..((i + 1) * CHUNK) as u64)
            .map_err(err)?;
        writes.push(e.a.push(rdma_ring::op::Write::new(chunk, target)));
    }
    let doorbells = e.a.with_ring(|r| r.stats().doorbells);
    e.a.submit().map_err(|s| s.to_string())?;
    let rung = e.a.with_ring(|r| r.stats().doorbells) - doorbells;
    check(rung == 1, || {
        format!("pushed {CHUNKS} writes with {rung} doorbells, not one")
    })?;
    for (result, chunk) in join_all(writes).await {
        result.map_err(err)?;
        drop(chunk);
    }
    println!("write x{CHUNKS}: awaited together, pushed with {rung} doorbell, all succeeded");

    // 32 reads, awaited together; every byte checked.
    let reads: Vec<_> = (0..CHUNKS)
        .map(|i| {
            let source = remote
                .slice((i * CHUNK) as u64..((i + 1) * CHUNK) as u64)
                .unwrap();
            e.a.read(pool.take().unwrap(), source)
        })
        .collect();
    for (i, (result, chunk)) in join_all(reads).await.into_iter().enumerate() {
        check(result.map_err(err)? == CHUNK, || {
            format!("read {i} was short")
        })?;
        let bad = chunk
            .iter()
            .enumerate()
            .position(|(off, &b)| b != pattern(i, off));
        check(bad.is_none(), || {
            format!("read {i} differs at byte {bad:?}")
        })?;
    }
    println!("read x{CHUNKS}: every byte matches what was written");

    // B awaits a receive; A sends with immediate data.
    let recv =
        e.b.recv(RegisteredBuf::new(&e.pd_b, vec![0u8; 64]).map_err(|r| r.to_string())?);
    let send = e.a.send_imm(
        RegisteredBuf::new(&e.pd_a, b"chunks written".to_vec()).map_err(|r| r.to_string())?,
        IMM,
    );
    let ((sent, _), (got, buf)) = futures::join!(send, recv);
    sent.map_err(err)?;
    let got = got.map_err(err)?;
    check(
        got.imm == Some(IMM) && &buf[..got.len] == b"chunks written",
        || format!("received {got:?}"),
    )?;
    println!("send with imm: B's awaited receive got \"chunks written\" and imm {IMM:#x}");

    // Both atomics, awaited.
    let cas_word = RegisteredBuf::new(&e.pd_a, Box::new(u64::MAX))
        .map_err(|r| r.to_string())?
        .word(0)
        .map_err(|r| r.to_string())?;
    let faa_word = RegisteredBuf::new(&e.pd_a, Box::new(u64::MAX))
        .map_err(|r| r.to_string())?
        .word(0)
        .map_err(|r| r.to_string())?;
    let cas =
        e.a.compare_swap(cas_word, remote_counters.word(0).map_err(err)?, 0, 42);
    let faa =
        e.a.fetch_add(faa_word, remote_counters.word(8).map_err(err)?, 5);
    let ((cas_result, cas_word), (faa_result, faa_word)) = futures::join!(cas, faa);
    cas_result.map_err(err)?;
    faa_result.map_err(err)?;
    check(cas_word.get() == 0 && faa_word.get() == 100, || {
        format!("atomics returned {} and {}", cas_word.get(), faa_word.get())
    })?;
    println!(
        "compare-and-swap: counter 0 was 0, now 42; fetch-and-add: counter 1 was 100, now 105"
    );

    // Cancel safety: a receive nobody answers, dropped mid-flight. Its chunk
    // stays with the ring until the receive is flushed at close.
    let orphan = e.a.recv(pool.take().map_err(err)?);
    drop(orphan);
    check(pool.available() == pool.capacity() - 1, || {
        "the dropped receive's chunk was released early".into()
    })?;
    e.a.close();
    check(pool.available() == pool.capacity(), || {
        "the dropped receive's chunk never came back".into()
    })?;
    println!("dropped a pending receive: its chunk came back only after the ring flushed it");

    // B is done too: closed as A was, so that no queue pair is left open
    // on its memory when that memory is taken back and checked.
    e.b.close();
    let counters = counters.into_inner().map_err(|r| r.to_string())?;
    check(counters[..] == [42, 105], || {
        format!("counters are {counters:?}")
    })?;
    let data = data.into_inner().map_err(|r| r.to_string())?;
    let bad = (0..CHUNKS * CHUNK).find(|&n| data[n] != pattern(n / CHUNK, n % CHUNK));
    check(bad.is_none(), || {
        format!("B's memory differs at byte {bad:?}")
    })?;
    println!("B: its memory holds all {CHUNKS} chunks; counters are [42, 105]");
    Ok(())
}
