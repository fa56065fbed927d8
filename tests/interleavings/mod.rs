//! The fixed-buffer ring awaited, in any interleaving: pushes, polls and
//! drops of futures, submits, drives and device steps decoded from bytes
//! (a property test's, or a fuzzer's). Every future that resolves must get
//! its own operation's completion, and once the queue pair is detached
//! every slot — dropped futures' too — must be back.

use rdma_ring::backend::soft::{Progress, SoftDevice, SoftQp};
use rdma_ring::backend::{QpConfig, QueuePair};
use rdma_ring::buf::{ExposedBuf, RemoteAccess};
use rdma_ring::fixed::{
    FixedBufs, FixedCompletion, FixedRing, FixedRingConfig, RecvFixed, WriteFixed,
};
use rdma_ring::future::{AsyncFixedRing, FixedOpFuture, Wakeup};
use rdma_ring::Error;

/// One step of a run.
#[derive(Clone, Copy, Debug)]
enum Step {
    PushWrite,
    PushRecv,
    Poll(usize),
    Drop(usize),
    Submit,
    Progress,
    Drive,
}

fn step(byte: u8) -> Step {
    match byte % 8 {
        0 | 1 => Step::PushWrite,
        2 => Step::PushRecv,
        3 => Step::Poll(usize::from(byte >> 3)),
        4 => Step::Drop(usize::from(byte >> 3)),
        5 => Step::Submit,
        6 => Step::Progress,
        _ => Step::Drive,
    }
}

/// Polls `future` once, with a waker that does nothing.
fn poll_once(
    future: &mut FixedOpFuture<SoftQp>,
) -> std::task::Poll<Result<FixedCompletion, Error>> {
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    std::future::Future::poll(std::pin::Pin::new(future), &mut cx)
}

/// Runs the steps `bytes` decode to, and checks what the module says.
pub fn run(bytes: &[u8]) {
    let dev = SoftDevice::with_progress(Progress::Manual);
    let pd = dev.alloc_pd();
    let (mut qa, _qb) = dev.connected_pair(&pd, &pd, QpConfig::default()).unwrap();
    let target = ExposedBuf::new(&pd, vec![0u8; 64], RemoteAccess::WRITE).unwrap();
    let ring = AsyncFixedRing::new(
        FixedRing::new(
            qa.take_cq().unwrap(),
            FixedBufs::new(&pd, 8, 64).unwrap(),
            FixedRingConfig::default(),
        ),
        Wakeup::Busy,
    )
    .unwrap();
    let h = ring.attach(qa).unwrap();
    let mut pending: Vec<(FixedOpFuture<SoftQp>, u64)> = Vec::new();
    let mut tag = 0u64;
    let check = |ring: &AsyncFixedRing<SoftQp>, c: FixedCompletion, want: u64| {
        assert_eq!(c.user_data(), want, "a completion reached the wrong future");
        ring.put_buf(c.into_buf()).unwrap();
    };
    for &byte in bytes {
        match step(byte) {
            Step::PushWrite | Step::PushRecv => {
                let Some(slot) = ring.take_buf() else {
                    continue;
                };
                tag += 1;
                let pushed = if matches!(step(byte), Step::PushWrite) {
                    ring.push(h, WriteFixed::new(slot, 64, target.remote()).user_data(tag))
                        .map_err(|r| r.into_parts().1.into_buf())
                } else {
                    ring.push(h, RecvFixed::new(slot).user_data(tag))
                        .map_err(|r| r.into_parts().1.into_buf())
                };
                match pushed {
                    Ok(future) => pending.push((future, tag)),
                    // A full queue: the slot comes back with the refusal.
                    Err(slot) => ring.put_buf(slot).unwrap(),
                }
            }
            Step::Poll(i) if !pending.is_empty() => {
                let i = i % pending.len();
                if let std::task::Poll::Ready(done) = poll_once(&mut pending[i].0) {
                    let (_, want) = pending.swap_remove(i);
                    check(&ring, done.unwrap(), want);
                }
            }
            Step::Drop(i) if !pending.is_empty() => {
                let i = i % pending.len();
                drop(pending.swap_remove(i));
            }
            Step::Submit => {
                ring.submit().unwrap();
            }
            Step::Progress => {
                dev.progress();
            }
            Step::Drive => {
                ring.drive().unwrap();
            }
            Step::Poll(_) | Step::Drop(_) => {}
        }
    }
    // Detaching flushes what is left: every future resolves.
    let qp = ring.detach(h).unwrap();
    for (mut future, want) in pending {
        match poll_once(&mut future) {
            std::task::Poll::Ready(done) => check(&ring, done.unwrap(), want),
            std::task::Poll::Pending => panic!("operation {want} still pending after the detach"),
        }
    }
    assert_eq!(
        ring.with_bufs(|bufs| bufs.free()).unwrap(),
        8,
        "every slot is back, dropped futures' too"
    );
    drop(qp);
}
