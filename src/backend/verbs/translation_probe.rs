//! What the verbs backend itself does per operation, around the provider's
//! post and poll: filling `ibv_send_wr`s from the ring's work requests and
//! reading `ibv_wc`s into the ring's completions. No device is needed, so
//! `scripts/instructions` counts it under callgrind on any machine (the
//! soft device's figures leave it out), and the test checks what it fills.

use std::hint::black_box;

use rdma_sys::{ibv_send_wr, ibv_wc};

use super::cq::raw_completion;
use super::qp::fill_send_list;
use super::zeroed;
use crate::backend::{RawCompletion, SendFlags, SendOpcode, SendWr, Sge, SgeSpan, WcStatus};

/// One round as the ring makes it: `wrs.len()` WRITEs of one element each
/// in one post, the last signaled, and its one completion read. Kept out
/// of line so that callgrind can count inside it alone.
#[inline(never)]
fn translate_round(
    list: &mut [ibv_send_wr],
    wrs: &[SendWr],
    sges: &[Sge],
    wc: &ibv_wc,
) -> RawCompletion {
    fill_send_list(list, black_box(wrs), black_box(sges)).expect("spans in range");
    raw_completion(black_box(wc))
}

/// A round of `batch` WRITEs, as the ring would post them.
fn round(batch: usize) -> (Vec<SendWr>, Vec<Sge>) {
    let sges: Vec<Sge> = (0..batch as u64)
        .map(|i| Sge {
            addr: 0x10_0000 + i * 64,
            len: 64,
            lkey: 7,
        })
        .collect();
    let wrs = (0..batch as u32)
        .map(|i| {
            let mut wr = SendWr::new(
                u64::from(i),
                SendOpcode::Write,
                SgeSpan { start: i, len: 1 },
            );
            wr.remote_addr = 0x20_0000 + u64::from(i) * 64;
            wr.rkey = 9;
            if i + 1 == batch as u32 {
                wr.flags = SendFlags::SIGNALED;
            }
            wr
        })
        .collect();
    (wrs, sges)
}

/// Runs `RDMA_RING_PROBE_ROUNDS` rounds (default 4) of
/// `RDMA_RING_PROBE_BATCH` WRITEs (default 16), and checks what the last
/// round filled and read.
#[test]
fn the_verbs_translation_fills_what_the_ring_asked() {
    let env = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (rounds, batch) = (
        env("RDMA_RING_PROBE_ROUNDS", 4),
        env("RDMA_RING_PROBE_BATCH", 16),
    );
    let (wrs, sges) = round(batch);
    let mut list: Vec<ibv_send_wr> = zeroed(batch);
    let mut wc: ibv_wc = zeroed::<ibv_wc>(1).remove(0);
    wc.wr_id = (batch - 1) as u64;
    wc.qp_num = 0x1234;
    wc.status = rdma_sys::ibv_wc_status::IBV_WC_SUCCESS;
    wc.opcode = rdma_sys::ibv_wc_opcode::IBV_WC_RDMA_WRITE;
    let mut last = RawCompletion::default();
    for _ in 0..rounds {
        last = translate_round(&mut list, &wrs, &sges, &wc);
    }
    assert_eq!(
        (
            last.wr_id,
            last.qp_num,
            last.status,
            last.byte_len,
            last.imm
        ),
        ((batch - 1) as u64, 0x1234, WcStatus::Success, 0, None)
    );
    let base = list.as_ptr();
    for (i, out) in list.iter().enumerate() {
        assert_eq!(out.wr_id, i as u64);
        assert_eq!(out.num_sge, 1);
        // SAFETY: `sg_list` points into `sges`, alive here.
        let sge = unsafe { &*out.sg_list };
        assert_eq!((sge.addr, sge.length, sge.lkey), (sges[i].addr, 64, 7));
        // SAFETY: a WRITE's union holds `rdma`.
        let rdma = unsafe { out.wr.rdma };
        assert_eq!((rdma.remote_addr, rdma.rkey), (wrs[i].remote_addr, 9));
        let signaled = out.send_flags & SendFlags::SIGNALED.bits() != 0;
        assert_eq!(signaled, i + 1 == batch);
        let next = if i + 1 < batch {
            base.wrapping_add(i + 1)
        } else {
            std::ptr::null()
        };
        assert_eq!(out.next.cast_const(), next);
    }
}
