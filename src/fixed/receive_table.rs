//! A shared receive queue's receives, in a table of entries rather than a
//! ring: they complete in any order across the queue's queue pairs, and
//! one the device never reports (taken by a queue pair destroyed before
//! its completion was read) must hold one place, not the whole queue.

use super::queue::{RecvEntry, NO_SLOT, SEQ_MASK};

/// Bits of a receive's `wr_id` sequence field that name its entry; the
/// bits above carry the low bits of its sequence number, so a completion
/// of an earlier receive in the same entry names nothing.
const ENTRY_BITS: u32 = 20;
const ENTRY_MASK: u64 = (1 << ENTRY_BITS) - 1;
/// The deepest queue a table serves.
pub(super) const MAX_DEPTH: u32 = 1 << ENTRY_BITS;

#[derive(Clone, Copy)]
struct Entry {
    receive: RecvEntry,
    seq: u64,
    posted: bool,
    /// Pushed by the ring's refill, not by its owner.
    refill: bool,
}

const FREE: Entry = Entry {
    receive: RecvEntry::TAKEN,
    seq: 0,
    posted: false,
    refill: false,
};

/// One queue's receives from push until they are handed back.
pub(super) struct ReceiveTable {
    entries: Box<[Entry]>,
    free: Vec<u32>,
    /// Entries pushed and not posted, in push (and so posting) order.
    pending: Vec<u32>,
    posted: usize,
    /// Refill receives pushed and not handed back.
    refills: usize,
    next_seq: u64,
}

impl ReceiveTable {
    /// A table for `depth` receives (at most [`MAX_DEPTH`]) whose first
    /// has sequence number `start`.
    pub(super) fn new(depth: u32, start: u64) -> Self {
        ReceiveTable {
            entries: vec![FREE; depth as usize].into_boxed_slice(),
            free: (0..depth).rev().collect(),
            pending: Vec::with_capacity(depth as usize),
            posted: 0,
            refills: 0,
            next_seq: start,
        }
    }

    pub(super) fn depth(&self) -> usize {
        self.entries.len()
    }

    /// Receives pushed and not handed back.
    pub(super) fn in_use(&self) -> usize {
        self.entries.len() - self.free.len()
    }

    /// Receives posted and not handed back.
    pub(super) fn posted(&self) -> usize {
        self.posted
    }

    /// Refill receives pushed or posted, and not handed back.
    pub(super) fn refills(&self) -> usize {
        self.refills
    }

    /// The sequence number the queue's next receive would take: where a
    /// later queue in the ring's slot starts, so a late completion of this
    /// one never matches its receives.
    pub(super) fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Takes an entry for `receive` (the refill's, if `refill`) and
    /// returns the sequence field of its `wr_id`; `None` if the table is
    /// full.
    pub(super) fn push(&mut self, receive: RecvEntry, refill: bool) -> Option<u64> {
        let at = self.free.pop()?;
        let seq = self.next_seq;
        self.next_seq += 1;
        self.entries[at as usize] = Entry {
            receive,
            seq,
            posted: false,
            refill,
        };
        self.refills += usize::from(refill);
        self.pending.push(at);
        Some(wr_bits(seq, at))
    }

    /// The first `n` pending receives were posted.
    pub(super) fn mark_posted(&mut self, n: usize) {
        for &at in &self.pending[..n] {
            self.entries[at as usize].posted = true;
        }
        self.pending.drain(..n);
        self.posted += n;
    }

    /// Frees the pending receives, handing each to `f`; how many.
    pub(super) fn take_pending(&mut self, mut f: impl FnMut(RecvEntry)) -> usize {
        let n = self.pending.len();
        for at in std::mem::take(&mut self.pending) {
            f(self.free_entry(at));
        }
        n
    }

    /// Frees every posted receive (its queue is destroyed), handing each
    /// to `f`; how many.
    pub(super) fn take_posted(&mut self, mut f: impl FnMut(RecvEntry)) -> usize {
        let n = self.posted;
        for at in 0..self.entries.len() as u32 {
            if self.entries[at as usize].posted {
                f(self.free_entry(at));
            }
        }
        self.posted = 0;
        n
    }

    /// Takes the posted receive a completion's `wr_id` sequence field
    /// names, once; `None` if it names none.
    #[inline]
    pub(super) fn take(&mut self, bits: u64) -> Option<RecvEntry> {
        let at = (bits & ENTRY_MASK) as u32;
        let entry = self.entries.get(at as usize)?;
        if !entry.posted || wr_bits(entry.seq, at) != bits {
            return None;
        }
        self.posted -= 1;
        Some(self.free_entry(at))
    }

    fn free_entry(&mut self, at: u32) -> RecvEntry {
        let entry = std::mem::replace(&mut self.entries[at as usize], FREE);
        debug_assert_ne!(entry.receive.index, NO_SLOT, "a free entry freed");
        self.free.push(at);
        self.refills -= usize::from(entry.refill);
        entry.receive
    }
}

fn wr_bits(seq: u64, at: u32) -> u64 {
    ((seq << ENTRY_BITS) | u64::from(at)) & SEQ_MASK
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receive(n: u32) -> RecvEntry {
        RecvEntry {
            user_data: u64::from(n),
            index: n,
        }
    }

    #[test]
    fn receives_complete_in_any_order_and_once() {
        let mut table = ReceiveTable::new(3, 0);
        let ids: Vec<u64> = (0..3)
            .map(|n| table.push(receive(n), false).unwrap())
            .collect();
        assert!(table.push(receive(9), false).is_none(), "full");
        assert!(table.take(ids[0]).is_none(), "not posted yet");
        table.mark_posted(3);
        assert_eq!(table.take(ids[2]).unwrap().index, 2);
        assert!(table.take(ids[2]).is_none(), "taken once");
        assert_eq!(table.take(ids[0]).unwrap().index, 0);
        assert_eq!((table.posted(), table.in_use()), (1, 1));
        // A receive that never completes holds one place, not the queue.
        for round in 0..10 {
            let id = table.push(receive(10 + round), false).unwrap();
            table.mark_posted(1);
            assert_eq!(table.take(id).unwrap().index, 10 + round);
        }
        // The entry of a receive taken earlier, reused: its old id names
        // nothing.
        let reused = table.push(receive(30), false).unwrap();
        table.mark_posted(1);
        assert!(table.take(ids[0]).is_none());
        assert_eq!(table.take(reused).unwrap().index, 30);
        let mut left = Vec::new();
        assert_eq!(table.take_posted(|r| left.push(r.index)), 1);
        assert_eq!(left, [1]);
        assert_eq!(table.in_use(), 0);
    }

    #[test]
    fn pending_receives_are_freed_unposted() {
        let mut table = ReceiveTable::new(4, 7);
        for n in 0..4 {
            table.push(receive(n), false).unwrap();
        }
        table.mark_posted(1);
        let mut back = Vec::new();
        assert_eq!(table.take_pending(|r| back.push(r.index)), 3);
        assert_eq!(back, [1, 2, 3]);
        assert_eq!(
            (table.posted(), table.in_use(), table.next_seq()),
            (1, 1, 11)
        );
    }

    #[test]
    fn refill_receives_are_counted_until_handed_back_every_way() {
        let mut table = ReceiveTable::new(8, 0);
        let ids: Vec<u64> = (0..6)
            .map(|n| table.push(receive(n), n % 2 == 0).unwrap())
            .collect();
        assert_eq!(table.refills(), 3);
        table.mark_posted(4);
        table.take(ids[0]).unwrap();
        table.take(ids[1]).unwrap();
        assert_eq!(table.refills(), 2, "a completed refill receive");
        table.take_pending(|_| {});
        assert_eq!(table.refills(), 1, "an unposted one");
        table.take_posted(|_| {});
        assert_eq!((table.refills(), table.in_use()), (0, 0), "the posted one");
    }
}
