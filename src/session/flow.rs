//! Flow control of one session: no message ever meets an empty receive
//! queue (no RNR), and a user who does not read holds up only the peer's
//! user messages, never the control channel.
//!
//! # Rules
//!
//! Each side keeps `depth` receives posted and reposts one (with fresh
//! memory) as soon as its pump has processed a message; two sides of
//! different depths both count with the smaller one (more receives
//! posted than counted do no harm), so the rules below hold as for equal
//! depths. A user message then waits in a queue until the user takes
//! it. Every trailer reports, cumulatively, how many of the peer's
//! messages the sender has *processed* and how many of its user
//! messages the sender's user has *taken*. So a sender knows:
//!
//! * `in_flight` = messages sent − processed reported: at most `depth`,
//!   since that many receives are posted;
//! * user messages sent − taken reported: at most `window`, which bounds
//!   the memory of unread messages.
//!
//! A WRITE with immediate consumes a receive too, and counts as a user
//! message (its immediate waits for [`receive_write_imm`]).
//!
//! An explicit ack (a trailer alone) goes when nothing else is leaving to
//! carry the counts, and either a quarter of our `depth` of the peer's
//! other messages, or half of it counting the peer's acks, went unreported
//! (at least 2 either way), or our user took half the window. An ack thus
//! answers at least two acks: acks answering acks die out.
//!
//! # Why it cannot deadlock
//!
//! Ordinary messages use at most `depth − 1` receives; the last is kept
//! for an ack that reports processed messages. Suppose both sides are
//! stuck with everything delivered and processed. A side stuck on
//! `in_flight` has at least `depth − 1 ≥ 3` messages its peer processed
//! and did not report, so the peer's ack is due; the peer can be stopped
//! only by its own `in_flight = depth`, whose last message must then be an
//! ack — which reported at least two messages the other side had not seen
//! reported, so processing it left that side's `in_flight` below
//! `depth − 1`: not both can be stuck. A user window that stays shut is
//! the reader's choice, and it shuts user messages only. A message may
//! also wait for a send queue slot of its own (`send_slots`), which comes
//! back with an earlier message's completion whatever the peer does. The tests below
//! flood both sides at random and check that no receive queue runs dry
//! and that both sides can send again once everything is delivered.
//!
//! [`receive_write_imm`]: super::Session::receive_write_imm

/// The counts of one session.
///
/// ```
/// use rdma_ring::session::flow::Flow;
/// let mut flow = Flow::new(8, 2, 8, 2);
/// assert!(flow.can_send_user());
/// flow.sent(true);
/// flow.sent(true);
/// assert!(!flow.can_send_user()); // the window of 2 is full
/// flow.on_report(2, 1).unwrap(); // the peer processed both, took one
/// assert!(flow.can_send_user());
/// ```
#[derive(Clone, Debug)]
pub struct Flow {
    depth: u32,
    window: u32,
    own_depth: u32,
    own_window: u32,
    sent: u32,
    user_sent: u32,
    peer_processed: u32,
    peer_taken: u32,
    processed: u32,
    /// Of `processed`, those that were not acks.
    processed_data: u32,
    taken: u32,
    /// The peer's messages that arrived (processed or not yet).
    arrived: u32,
    reported_processed: u32,
    reported_data: u32,
    reported_taken: u32,
}

impl Flow {
    /// Counts for a peer keeping `depth` receives posted with a user
    /// window of `window`, while we keep `own_depth` and `own_window`
    /// (each window below its depth, each depth at least 4).
    ///
    /// ```
    /// use rdma_ring::session::flow::Flow;
    /// // The peer keeps 32 receives posted and lets 16 messages wait unread.
    /// let flow = Flow::new(32, 16, 8, 4);
    /// assert_eq!((flow.in_flight(), flow.counts()), (0, (0, 0)));
    /// assert!(flow.can_send_user());
    /// ```
    pub fn new(depth: u32, window: u32, own_depth: u32, own_window: u32) -> Flow {
        debug_assert!(depth >= 4 && window >= 1 && window < depth);
        debug_assert!(own_depth >= 4 && own_window >= 1 && own_window < own_depth);
        Flow {
            depth,
            window,
            own_depth,
            own_window,
            sent: 0,
            user_sent: 0,
            peer_processed: 0,
            peer_taken: 0,
            processed: 0,
            processed_data: 0,
            taken: 0,
            arrived: 0,
            reported_processed: 0,
            reported_data: 0,
            reported_taken: 0,
        }
    }

    /// User messages the peer may leave with our user, untaken: our
    /// window as both sides count it (below the smaller depth).
    ///
    /// ```
    /// use rdma_ring::session::flow::Flow;
    /// assert_eq!(Flow::new(8, 4, 16, 6).own_window(), 6);
    /// ```
    pub fn own_window(&self) -> u32 {
        self.own_window
    }

    /// Messages sent that the peer has not reported processed.
    ///
    /// ```
    /// use rdma_ring::session::flow::Flow;
    /// let mut flow = Flow::new(8, 4, 8, 4);
    /// flow.sent(false);
    /// flow.sent(true);
    /// assert_eq!(flow.in_flight(), 2);
    /// flow.on_report(1, 0).unwrap();
    /// assert_eq!(flow.in_flight(), 1);
    /// ```
    pub fn in_flight(&self) -> u32 {
        self.sent.wrapping_sub(self.peer_processed)
    }

    /// Whether a control message may go now.
    ///
    /// ```
    /// use rdma_ring::session::flow::Flow;
    /// let mut flow = Flow::new(4, 2, 4, 2);
    /// for _ in 0..3 {
    ///     flow.sent(false);
    /// }
    /// // The peer's last receive is kept for an ack.
    /// assert!(!flow.can_send());
    /// flow.on_report(1, 0).unwrap();
    /// assert!(flow.can_send());
    /// ```
    pub fn can_send(&self) -> bool {
        self.in_flight() < self.depth - 1
    }

    /// Whether a user message (SEND or WRITE with immediate) may go now.
    ///
    /// ```
    /// use rdma_ring::session::flow::Flow;
    /// let mut flow = Flow::new(8, 1, 8, 1);
    /// flow.sent(true);
    /// flow.on_report(1, 0).unwrap(); // processed, but the peer's user has not read it
    /// assert!(!flow.can_send_user());
    /// assert!(flow.can_send()); // control messages still go
    /// ```
    pub fn can_send_user(&self) -> bool {
        self.can_send() && self.user_sent.wrapping_sub(self.peer_taken) < self.window
    }

    /// Whether an explicit ack should go (when nothing else is leaving),
    /// and may. It is due once a quarter of our depth (the peer's
    /// in-flight limit) of the peer's other messages, or half of it
    /// counting its acks, went unreported — at least 2 either way, so
    /// acks answering acks die out instead of bouncing — or once our user
    /// took half our window.
    ///
    /// ```
    /// use rdma_ring::session::flow::Flow;
    /// let mut flow = Flow::new(8, 4, 8, 4);
    /// flow.on_arrival().unwrap();
    /// flow.processed_one(false);
    /// assert!(!flow.wants_ack());
    /// flow.on_arrival().unwrap();
    /// flow.processed_one(false);
    /// assert!(flow.wants_ack());
    /// flow.sent(false); // any message leaving carries the counts
    /// assert!(!flow.wants_ack());
    /// ```
    pub fn wants_ack(&self) -> bool {
        let data = self.processed_data.wrapping_sub(self.reported_data);
        let all = self.processed.wrapping_sub(self.reported_processed);
        if data >= (self.own_depth / 4).max(2) || all >= (self.own_depth / 2).max(2) {
            return self.in_flight() < self.depth;
        }
        let taken = self.taken.wrapping_sub(self.reported_taken);
        taken >= (self.own_window / 2).max(1) && self.can_send()
    }

    /// The counts a trailer leaving now carries: the peer's messages we
    /// processed, and its user messages our user took.
    ///
    /// ```
    /// use rdma_ring::session::flow::Flow;
    /// let mut flow = Flow::new(8, 4, 8, 4);
    /// flow.on_arrival().unwrap();
    /// flow.processed_one(false);
    /// flow.taken_one();
    /// assert_eq!(flow.counts(), (1, 1));
    /// ```
    pub fn counts(&self) -> (u32, u32) {
        (self.processed, self.taken)
    }

    /// Records a message leaving; returns the counts its trailer carries.
    /// `user` for user messages (SEND and WRITE with immediate).
    ///
    /// ```
    /// use rdma_ring::session::flow::Flow;
    /// let mut flow = Flow::new(8, 4, 8, 4);
    /// flow.on_arrival().unwrap();
    /// flow.processed_one(false);
    /// assert_eq!(flow.sent(true), (1, 0));
    /// assert_eq!((flow.in_flight(), flow.user_outstanding()), (1, 1));
    /// ```
    pub fn sent(&mut self, user: bool) -> (u32, u32) {
        self.sent = self.sent.wrapping_add(1);
        if user {
            self.user_sent = self.user_sent.wrapping_add(1);
        }
        self.reported_processed = self.processed;
        self.reported_data = self.processed_data;
        self.reported_taken = self.taken;
        (self.processed, self.taken)
    }

    /// Records a WRITE with immediate leaving: it uses a receive and the
    /// user window, and carries no counts.
    ///
    /// ```
    /// use rdma_ring::session::flow::Flow;
    /// let mut flow = Flow::new(8, 1, 8, 1);
    /// flow.sent_write_imm();
    /// assert_eq!((flow.in_flight(), flow.user_outstanding()), (1, 1));
    /// // Its immediate waits for the peer's user, as a SEND would.
    /// assert!(!flow.can_send_user());
    /// ```
    pub fn sent_write_imm(&mut self) {
        self.sent = self.sent.wrapping_add(1);
        self.user_sent = self.user_sent.wrapping_add(1);
    }

    /// Applies a trailer's counts; refuses counts of messages never sent.
    ///
    /// ```
    /// use rdma_ring::session::flow::Flow;
    /// let mut flow = Flow::new(8, 4, 8, 4);
    /// flow.sent(true);
    /// let err = flow.on_report(2, 0).unwrap_err();
    /// assert!(err.contains("only 1 are in flight"), "{err}");
    /// flow.on_report(1, 1).unwrap();
    /// assert_eq!((flow.in_flight(), flow.user_outstanding()), (0, 0));
    /// ```
    pub fn on_report(&mut self, processed: u32, taken: u32) -> Result<(), String> {
        let newly = processed.wrapping_sub(self.peer_processed);
        if newly > self.in_flight() {
            return Err(format!(
                "the peer reports {newly} more messages processed, but only {} are in flight",
                self.in_flight()
            ));
        }
        let outstanding = self.user_sent.wrapping_sub(self.peer_taken);
        let newly_taken = taken.wrapping_sub(self.peer_taken);
        if newly_taken > outstanding {
            return Err(format!(
                "the peer reports {newly_taken} more user messages taken, but only {outstanding} are outstanding"
            ));
        }
        self.peer_processed = processed;
        self.peer_taken = taken;
        Ok(())
    }

    /// Records one of the peer's messages arriving (any kind, a WRITE
    /// with immediate too); refuses one the peer had no room for. A peer
    /// sends only while its messages we have not reported processed are
    /// fewer than our depth, so more than our depth of them arrived past
    /// our last report is a peer ignoring flow control: our receives are
    /// posted again as we process, whatever the peer knows, so it would
    /// not meet an empty queue, and our answers would pile up unsent.
    ///
    /// ```
    /// use rdma_ring::session::flow::Flow;
    /// let mut flow = Flow::new(4, 2, 4, 2);
    /// for _ in 0..4 {
    ///     flow.on_arrival().unwrap();
    /// }
    /// // A fifth before we reported any: the peer ignored flow control.
    /// assert!(flow.on_arrival().is_err());
    /// ```
    pub fn on_arrival(&mut self) -> Result<(), String> {
        self.arrived = self.arrived.wrapping_add(1);
        let unreported = self.arrived.wrapping_sub(self.reported_processed);
        if unreported > self.own_depth {
            return Err(format!(
                "{unreported} messages arrived past our last report, beyond our depth of {}",
                self.own_depth
            ));
        }
        Ok(())
    }

    /// Records one of the peer's messages processed (its receive
    /// reposted); `ack` if it was an explicit ack.
    ///
    /// ```
    /// use rdma_ring::session::flow::Flow;
    /// let mut flow = Flow::new(8, 4, 8, 4);
    /// for _ in 0..2 {
    ///     flow.on_arrival().unwrap();
    ///     flow.processed_one(true);
    /// }
    /// assert_eq!(flow.counts(), (2, 0));
    /// // Two acks do not call for an ack back (two other messages would), so acks die out.
    /// assert!(!flow.wants_ack());
    /// ```
    pub fn processed_one(&mut self, ack: bool) {
        self.processed = self.processed.wrapping_add(1);
        if !ack {
            self.processed_data = self.processed_data.wrapping_add(1);
        }
    }

    /// Records one of the peer's user messages taken by our user.
    ///
    /// ```
    /// use rdma_ring::session::flow::Flow;
    /// let mut flow = Flow::new(8, 4, 32, 4);
    /// for _ in 0..2 {
    ///     flow.on_arrival().unwrap();
    ///     flow.processed_one(false);
    /// }
    /// assert!(!flow.wants_ack());
    /// flow.taken_one();
    /// flow.taken_one();
    /// // Our user freed half our window: the peer should hear of it.
    /// assert!(flow.wants_ack());
    /// ```
    pub fn taken_one(&mut self) {
        self.taken = self.taken.wrapping_add(1);
    }

    /// Our user messages the peer's user has not taken.
    ///
    /// ```
    /// use rdma_ring::session::flow::Flow;
    /// let mut flow = Flow::new(8, 4, 8, 4);
    /// flow.sent(true);
    /// flow.sent(false);
    /// assert_eq!(flow.user_outstanding(), 1);
    /// flow.on_report(2, 1).unwrap();
    /// assert_eq!(flow.user_outstanding(), 0);
    /// ```
    pub fn user_outstanding(&self) -> u32 {
        self.user_sent.wrapping_sub(self.peer_taken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message on the wire: user (`Some(true)`), control (`Some(false)`)
    /// or ack (`None`), with the counts it carries.
    type OnWire = (Option<bool>, Option<(u32, u32)>);

    /// Two sides exchanging messages, delivered in order per direction.
    /// Control messages wait in an outbox while flow control holds them,
    /// as the pump's do; the outbox is flushed and the ack rule applied
    /// after each step.
    struct Pair {
        flows: [Flow; 2],
        // Messages on the wire towards side i.
        wire: [std::collections::VecDeque<OnWire>; 2],
        outbox: [u32; 2],
        unread: [u32; 2],
        posted: [u32; 2],
    }

    impl Pair {
        fn new(depth: u32, window: u32) -> Pair {
            Pair {
                flows: [
                    Flow::new(depth, window, depth, window),
                    Flow::new(depth, window, depth, window),
                ],
                wire: Default::default(),
                outbox: [0; 2],
                unread: [0; 2],
                posted: [depth; 2],
            }
        }

        /// A user message if the window allows (`false` if not); a
        /// control message always (queued if it cannot go yet).
        fn send(&mut self, from: usize, user: bool) -> bool {
            if !user {
                self.outbox[from] += 1;
                self.flush(from);
                return true;
            }
            let ok = self.flows[from].can_send_user();
            if ok {
                let counts = self.flows[from].sent(true);
                self.push(from, Some(true), Some(counts));
            }
            ok
        }

        /// What the pump does each pass: the outbox, then an ack if due.
        fn flush(&mut self, side: usize) {
            while self.outbox[side] > 0 && self.flows[side].can_send() {
                self.outbox[side] -= 1;
                let counts = self.flows[side].sent(false);
                self.push(side, Some(false), Some(counts));
            }
            let idle = self.outbox[side] == 0 || !self.flows[side].can_send();
            if idle && self.flows[side].wants_ack() {
                let counts = self.flows[side].sent(false);
                self.push(side, None, Some(counts));
            }
        }

        /// `user`: `None` for an ack.
        fn push(&mut self, from: usize, user: Option<bool>, counts: Option<(u32, u32)>) {
            let to = 1 - from;
            assert!(self.posted[to] > 0, "RNR: a message met no receive");
            self.posted[to] -= 1;
            self.wire[to].push_back((user, counts));
        }

        fn deliver(&mut self, to: usize) -> bool {
            let Some((user, counts)) = self.wire[to].pop_front() else {
                return false;
            };
            self.flows[to].on_arrival().unwrap();
            if let Some((p, t)) = counts {
                self.flows[to].on_report(p, t).unwrap();
            }
            self.flows[to].processed_one(user.is_none());
            self.posted[to] += 1;
            if user == Some(true) {
                self.unread[to] += 1;
                assert!(
                    self.unread[to] <= self.flows[to].window,
                    "unread beyond the window"
                );
            }
            self.flush(to);
            true
        }

        fn read(&mut self, side: usize) {
            if self.unread[side] > 0 {
                self.unread[side] -= 1;
                self.flows[side].taken_one();
                self.flush(side);
            }
        }
    }

    #[test]
    fn both_sides_flooding_never_meet_an_empty_queue_nor_stick() {
        for depth in [4u32, 5, 8, 32] {
            let mut pair = Pair::new(depth, depth / 2);
            let mut seed = 0x9e37_79b9_u32;
            let mut sent = 0;
            for _ in 0..20_000 {
                seed ^= seed << 13;
                seed ^= seed >> 17;
                seed ^= seed << 5;
                let side = (seed & 1) as usize;
                match (seed >> 1) % 5 {
                    0 | 1 => sent += usize::from(pair.send(side, (seed >> 4) & 1 == 0)),
                    2 | 3 => {
                        pair.deliver(side);
                    }
                    _ => pair.read(side),
                }
            }
            // Drain: deliver and read everything; then both may send again.
            for _ in 0..10_000 {
                for side in 0..2 {
                    pair.flush(side);
                    while pair.deliver(side) {}
                    pair.read(side);
                }
            }
            assert_eq!(pair.outbox, [0, 0], "depth {depth}: control messages stuck");
            assert!(
                sent > 1000,
                "depth {depth}: only {sent} sent; {:?} {:?} wire {:?} unread {:?} posted {:?}",
                pair.flows[0],
                pair.flows[1],
                pair.wire,
                pair.unread,
                pair.posted
            );
            for side in 0..2 {
                assert!(
                    pair.flows[side].can_send_user(),
                    "depth {depth}: side {side} stuck"
                );
            }
        }
    }

    #[test]
    fn crossing_bursts_of_control_messages_drain() {
        for depth in [4u32, 5, 8] {
            let mut pair = Pair::new(depth, 2);
            // Both sides queue more than the window before anything is
            // delivered: every message carries stale counts.
            for _ in 0..3 * depth {
                pair.send(0, false);
                pair.send(1, false);
            }
            for _ in 0..100 {
                for side in 0..2 {
                    pair.flush(side);
                    while pair.deliver(side) {}
                }
            }
            assert_eq!(pair.outbox, [0, 0], "depth {depth}: stuck");
        }
    }

    #[test]
    fn a_reader_that_never_reads_stops_user_messages_only() {
        let mut pair = Pair::new(8, 3);
        for _ in 0..3 {
            assert!(pair.send(0, true));
        }
        while pair.deliver(1) {}
        while pair.deliver(0) {}
        assert!(!pair.flows[0].can_send_user());
        for _ in 0..50 {
            assert!(pair.send(0, false), "control still flows");
            while pair.deliver(1) {}
            while pair.deliver(0) {}
        }
    }

    #[test]
    fn reports_of_messages_never_sent_are_refused() {
        let mut flow = Flow::new(8, 4, 8, 4);
        flow.sent(true);
        assert!(flow.on_report(2, 0).is_err());
        assert!(flow.on_report(1, 2).is_err());
        assert!(flow.on_report(1, 1).is_ok());
        assert!(
            flow.on_report(0, 1).is_err(),
            "going backwards is a huge jump"
        );
    }
}
