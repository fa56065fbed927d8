//! The send queue slots a session's messages hold.
//!
//! A session's queue pair has `max_send_wr` send slots for data
//! operations, [`message_slots`] more for messages (SENDs and WRITEs with
//! immediate), and one for the ring's teardown marker. Flow control bounds the messages the peer has not
//! reported processed; but a message's slot comes back only when its own
//! completion is reaped, and on a NIC the peer's report can overtake it:
//! an ACK may come late, coalesced, or lost and covered by a later one.
//! Counted by flow control alone, messages could then take the slots
//! promised to data operations, which the ring would refuse with
//! `SendQueueFull` below `max_send_wr`. So each message is also counted
//! here until its completion is reaped.
//!
//! Whose future a message's completion goes to does not matter (a user
//! may drop it): the ring counts every send pushed and finished per queue
//! pair ([`QpStats`](crate::ring::QpStats)), and RC finishes them in
//! order, so a message is done once the finished count reaches its
//! position among the pushes.

use std::collections::VecDeque;

/// Send queue slots kept for the messages of a session that keeps
/// `recv_depth` receives posted: flow control lets at most that many go
/// unreported (both sides count with the smaller depth), and one more is
/// spare.
pub(super) fn message_slots(recv_depth: u16) -> u32 {
    u32::from(recv_depth) + 1
}

/// The messages of one session that may still hold a send slot.
#[derive(Debug)]
pub(super) struct MessageSlots {
    /// Each message's position among its queue pair's pushed sends
    /// (`sends_pushed` just after it went: later pushes by others can only
    /// make it later, which errs on the safe side), oldest first.
    held: VecDeque<u64>,
    /// Slots kept for messages.
    reserved: usize,
    /// A user message waits for a slot: the pump looks again each turn.
    pub(super) waited: bool,
}

impl MessageSlots {
    /// Room for `reserved` messages at once.
    pub(super) fn new(reserved: usize) -> Self {
        MessageSlots {
            held: VecDeque::with_capacity(reserved),
            reserved,
            waited: false,
        }
    }

    /// Whether a message may take a slot now. `sends_done` (the queue
    /// pair's finished sends) is asked for only when every slot looks
    /// taken: it costs a look at the ring.
    pub(super) fn free(&mut self, sends_done: impl FnOnce() -> Option<u64>) -> bool {
        if self.held.len() < self.reserved {
            return true;
        }
        // A queue pair the ring no longer has holds no slot.
        let done = sends_done().unwrap_or(u64::MAX);
        while self.held.front().is_some_and(|&at| at <= done) {
            self.held.pop_front();
        }
        self.held.len() < self.reserved
    }

    /// A message went, at position `at` among the pushed sends.
    pub(super) fn took(&mut self, at: u64) {
        self.held.push_back(at);
    }
}

#[cfg(test)]
mod tests {
    use super::MessageSlots;

    #[test]
    fn a_message_holds_its_slot_until_the_sends_up_to_it_finished() {
        let mut slots = MessageSlots::new(2);
        assert!(slots.free(|| panic!("no need to ask the ring")));
        slots.took(1);
        slots.took(3); // a data operation went between them
        assert!(!slots.free(|| Some(0)));
        assert!(slots.free(|| Some(2)), "the first message's slot is back");
        slots.took(4);
        assert!(!slots.free(|| Some(2)));
        assert!(slots.free(|| Some(4)));
        slots.took(5);
        slots.took(6);
        assert!(slots.free(|| None), "a detached queue pair holds nothing");
    }
}
