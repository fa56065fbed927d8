//! Flow control of one stream connection: who may send what, and whether
//! what the peer sent keeps to the rules. Pure logic over counters, no
//! buffers and no ring, so it is tested (and fuzzed) on its own.
//!
//! # The rules
//!
//! Each side posts `data_receives` + `answer_receives` receive buffers
//! before the connection is up. A message lands in whichever is next; the
//! counts below make sure one is always there (never an RNR NAK):
//!
//! * **Grants** (for data, FIN and hello): a side sends such a message only
//!   while it has a grant, one per receive the peer posted for it. The
//!   receiver posts a data buffer again once the reader has taken every
//!   byte of it (a FIN's or hello's at once) and grants it back in its next
//!   message. Credits count receive buffers, and a buffer is posted again
//!   only when empty, so no byte the reader still holds is ever
//!   overwritten.
//! * **Answers** (credit messages): a side has at most `answer_receives`
//!   of its own data, FIN and hello messages unacknowledged, and keeps one
//!   receive per such message for the peer's answer. A credit message is
//!   sent only when it acknowledges at least one message, so answers in
//!   flight never outnumber those receives.
//! * **No deadlock**: a message that grants nothing acknowledges all but
//!   one of the messages owed, so a side whose peer is out of grants
//!   always keeps the right to send it a grant as soon as its reader frees
//!   a buffer. (Proof sketch: a blocked sender used up the grants of the
//!   peer's last granting message, so it sent a message after it; the
//!   peer owes that message until it sends its next grant.)
//! * **Pure acknowledgements**: when the peer may be close to its answer
//!   limit (it is owed half of it), a side acknowledges without granting.
//! * **Batching**: grants ride on data messages; a credit message goes
//!   only when the peer may run short (it has at most half our data
//!   receives left) or half of them wait to be granted. A blocked peer has
//!   none left, so it is always sent one.

use super::frame::{self, Header, Hello, Kind, MAX_COUNT};

/// One side's receive buffers, as announced in its hello.
///
/// ```
/// use rdma_ring::stream::flow::{Flow, Limits};
/// let ours = Limits { chunk: 4096, data_receives: 16, answer_receives: 8 };
/// let flow = Flow::new(ours);
/// assert_eq!(flow.ours(), ours);
/// // Nothing is known of the peer's buffers before its hello.
/// assert_eq!(flow.peer(), None);
/// assert_eq!(flow.max_message(), 0);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes per receive buffer (the longest message it takes).
    pub chunk: u32,
    /// Receive buffers for the peer's data, FIN and hello.
    pub data_receives: u32,
    /// Receive buffers kept for the peer's answers.
    pub answer_receives: u32,
}

impl Limits {
    /// The limits a hello announces.
    ///
    /// ```
    /// use rdma_ring::buf::{RemoteAccess, RemoteSlice};
    /// use rdma_ring::stream::flow::Limits;
    /// use rdma_ring::stream::frame::Hello;
    /// let probe = RemoteSlice::new(0x1000, 8, 7, RemoteAccess::READ);
    /// let hello = Hello { chunk: 4096, data_receives: 16, answer_receives: 8, probe };
    /// let limits = Limits::of(&Hello::decode(&hello.encode()).unwrap());
    /// assert_eq!(limits, Limits { chunk: 4096, data_receives: 16, answer_receives: 8 });
    /// ```
    pub fn of(hello: &Hello) -> Limits {
        Limits {
            chunk: hello.chunk,
            data_receives: hello.data_receives,
            answer_receives: hello.answer_receives,
        }
    }
}

/// What a received message asks of the caller.
///
/// ```
/// use rdma_ring::buf::{RemoteAccess, RemoteSlice};
/// use rdma_ring::stream::flow::{Flow, Limits, Received};
/// use rdma_ring::stream::frame::{Header, Hello, Kind};
/// let mut flow = Flow::new(Limits { chunk: 4096, data_receives: 16, answer_receives: 8 });
/// let probe = RemoteSlice::new(0x1000, 8, 7, RemoteAccess::READ);
/// let theirs = Hello { chunk: 1024, data_receives: 4, answer_receives: 2, probe };
/// let header = Header { kind: Kind::Hello, grant: 0, ack: 0 };
/// let got = flow.receive(header, 40, &theirs.encode()).unwrap();
/// assert_eq!(got, Received::Hello(theirs));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received {
    /// `len` bytes of the stream: hand the buffer to the reader; post it
    /// again (and call [`Flow::reposted`]) once the reader took them all.
    Data(u32),
    /// A credit message: post its buffer again at once.
    Credit,
    /// The peer writes no more: post the buffer again at once and call
    /// [`Flow::reposted`]; reads end after the bytes before it.
    Fin,
    /// The peer's hello: post the buffer again at once and call
    /// [`Flow::reposted`].
    Hello(Hello),
}

/// The counters of one connection (see the module docs for the rules).
///
/// ```
/// # use rdma_ring::buf::{RemoteAccess, RemoteSlice};
/// # use rdma_ring::stream::flow::{Flow, Limits, Received};
/// # use rdma_ring::stream::frame::{encode_total, Header, Hello, Kind};
/// # let hello = |l: Limits| Hello {
/// #     chunk: l.chunk,
/// #     data_receives: l.data_receives,
/// #     answer_receives: l.answer_receives,
/// #     probe: RemoteSlice::new(0x1000, 8, 7, RemoteAccess::READ),
/// # }.encode();
/// # // a takes 4096-byte messages into 4 receives, b 1024-byte ones into 8.
/// # let la = Limits { chunk: 4096, data_receives: 4, answer_receives: 4 };
/// # let lb = Limits { chunk: 1024, data_receives: 8, answer_receives: 4 };
/// # let (mut a, mut b) = (Flow::new(la), Flow::new(lb));
/// # let (ha, hb) = (a.header(Kind::Hello), b.header(Kind::Hello));
/// # a.commit(ha, 0);
/// # b.commit(hb, 0);
/// # b.receive(ha, 40, &hello(la)).unwrap();
/// # a.receive(hb, 40, &hello(lb)).unwrap();
/// # a.reposted(1);
/// # b.reposted(1);
/// // Two flows `a` and `b` that exchanged hellos; a writes 5 bytes.
/// let data = a.header(Kind::Data);
/// a.commit(data, 5);
/// assert_eq!(b.receive(data, 5, &[]).unwrap(), Received::Data(5));
/// // b's reader took the 5 bytes: the buffer goes back to a.
/// b.reposted(1);
/// let credit = b.header(Kind::Credit);
/// b.commit(credit, 0);
/// let got = a.receive(credit, 8, &encode_total(b.bytes_sent())).unwrap();
/// assert_eq!(got, Received::Credit);
/// // b's hello granted 8; a's hello and data used 2; the credit gave both back.
/// assert_eq!(a.grants(), 8);
/// ```
#[derive(Clone, Debug)]
pub struct Flow {
    ours: Limits,
    peer: Option<Limits>,
    // What we send.
    hello_sent: bool,
    fin_sent: bool,
    /// Our data, FIN and hello messages so far.
    sent_granted: u64,
    /// Grants the peer gave back so far.
    grants_received: u64,
    /// Our data, FIN and hello messages not yet acknowledged.
    unanswered: u32,
    bytes_sent: u64,
    // What we receive.
    hello_received: bool,
    fin_received: bool,
    /// The peer's data, FIN and hello messages so far.
    received_granted: u64,
    /// Grants we gave so far (besides the `data_receives` of our hello).
    grants_given: u64,
    /// Data receives posted again and not granted yet.
    grant_pending: u32,
    /// The peer's data, FIN and hello messages not acknowledged yet.
    owed: u32,
    bytes_received: u64,
}

impl Flow {
    /// A connection whose receive buffers are `ours`.
    ///
    /// # Panics
    ///
    /// If `ours` is outside what a hello can announce (a bug of the
    /// caller: the stream's configuration is checked before).
    ///
    /// ```
    /// use rdma_ring::stream::flow::{Flow, Limits};
    /// use rdma_ring::stream::frame::Kind;
    /// let flow = Flow::new(Limits { chunk: 4096, data_receives: 16, answer_receives: 8 });
    /// assert!(flow.can_send(Kind::Hello));
    /// // Data waits for the peer's hello, which says how much it takes.
    /// assert!(!flow.can_send(Kind::Data));
    /// assert_eq!(flow.grants(), 0);
    /// ```
    pub fn new(ours: Limits) -> Flow {
        assert!(
            (1..=MAX_COUNT).contains(&ours.data_receives)
                && (2..=MAX_COUNT).contains(&ours.answer_receives)
                && (frame::MIN_CHUNK..=frame::MAX_CHUNK).contains(&ours.chunk),
            "stream limits out of range: {ours:?}"
        );
        Flow {
            ours,
            peer: None,
            hello_sent: false,
            fin_sent: false,
            sent_granted: 0,
            grants_received: 0,
            unanswered: 0,
            bytes_sent: 0,
            hello_received: false,
            fin_received: false,
            received_granted: 0,
            grants_given: 0,
            grant_pending: 0,
            owed: 0,
            bytes_received: 0,
        }
    }

    /// Our limits.
    ///
    /// ```
    /// # use rdma_ring::buf::{RemoteAccess, RemoteSlice};
    /// # use rdma_ring::stream::flow::{Flow, Limits, Received};
    /// # use rdma_ring::stream::frame::{encode_total, Header, Hello, Kind};
    /// # let hello = |l: Limits| Hello {
    /// #     chunk: l.chunk,
    /// #     data_receives: l.data_receives,
    /// #     answer_receives: l.answer_receives,
    /// #     probe: RemoteSlice::new(0x1000, 8, 7, RemoteAccess::READ),
    /// # }.encode();
    /// # let la = Limits { chunk: 4096, data_receives: 4, answer_receives: 4 };
    /// # let lb = Limits { chunk: 1024, data_receives: 8, answer_receives: 4 };
    /// # let (mut a, mut b) = (Flow::new(la), Flow::new(lb));
    /// # let (ha, hb) = (a.header(Kind::Hello), b.header(Kind::Hello));
    /// # a.commit(ha, 0);
    /// # b.commit(hb, 0);
    /// # b.receive(ha, 40, &hello(la)).unwrap();
    /// # a.receive(hb, 40, &hello(lb)).unwrap();
    /// # a.reposted(1);
    /// # b.reposted(1);
    /// assert_eq!(b.ours().chunk, 1024);
    /// // b's buffers bound what a sends.
    /// assert_eq!(a.max_message(), b.ours().chunk);
    /// ```
    pub fn ours(&self) -> Limits {
        self.ours
    }

    /// The peer's limits, once its hello arrived.
    ///
    /// ```
    /// # use rdma_ring::buf::{RemoteAccess, RemoteSlice};
    /// # use rdma_ring::stream::flow::{Flow, Limits, Received};
    /// # use rdma_ring::stream::frame::{encode_total, Header, Hello, Kind};
    /// # let hello = |l: Limits| Hello {
    /// #     chunk: l.chunk,
    /// #     data_receives: l.data_receives,
    /// #     answer_receives: l.answer_receives,
    /// #     probe: RemoteSlice::new(0x1000, 8, 7, RemoteAccess::READ),
    /// # }.encode();
    /// # let la = Limits { chunk: 4096, data_receives: 4, answer_receives: 4 };
    /// # let lb = Limits { chunk: 1024, data_receives: 8, answer_receives: 4 };
    /// # let (mut a, mut b) = (Flow::new(la), Flow::new(lb));
    /// # let (ha, hb) = (a.header(Kind::Hello), b.header(Kind::Hello));
    /// # a.commit(ha, 0);
    /// # b.commit(hb, 0);
    /// # b.receive(ha, 40, &hello(la)).unwrap();
    /// # a.receive(hb, 40, &hello(lb)).unwrap();
    /// # a.reposted(1);
    /// # b.reposted(1);
    /// assert_eq!(a.peer(), Some(b.ours()));
    /// assert_eq!(b.peer(), Some(a.ours()));
    /// ```
    pub fn peer(&self) -> Option<Limits> {
        self.peer
    }

    /// Grants we hold: messages (data or FIN) we may send now as far as the
    /// peer's receive buffers go.
    ///
    /// ```
    /// # use rdma_ring::buf::{RemoteAccess, RemoteSlice};
    /// # use rdma_ring::stream::flow::{Flow, Limits, Received};
    /// # use rdma_ring::stream::frame::{encode_total, Header, Hello, Kind};
    /// # let hello = |l: Limits| Hello {
    /// #     chunk: l.chunk,
    /// #     data_receives: l.data_receives,
    /// #     answer_receives: l.answer_receives,
    /// #     probe: RemoteSlice::new(0x1000, 8, 7, RemoteAccess::READ),
    /// # }.encode();
    /// # let la = Limits { chunk: 4096, data_receives: 4, answer_receives: 4 };
    /// # let lb = Limits { chunk: 1024, data_receives: 8, answer_receives: 4 };
    /// # let (mut a, mut b) = (Flow::new(la), Flow::new(lb));
    /// # let (ha, hb) = (a.header(Kind::Hello), b.header(Kind::Hello));
    /// # a.commit(ha, 0);
    /// # b.commit(hb, 0);
    /// # b.receive(ha, 40, &hello(la)).unwrap();
    /// # a.receive(hb, 40, &hello(lb)).unwrap();
    /// # a.reposted(1);
    /// # b.reposted(1);
    /// // b's hello granted its 8 receives; a's own hello used one.
    /// assert_eq!(a.grants(), 7);
    /// let h = a.header(Kind::Data);
    /// a.commit(h, 100);
    /// assert_eq!(a.grants(), 6);
    /// ```
    pub fn grants(&self) -> u64 {
        match self.peer {
            None => 0,
            Some(peer) => (u64::from(peer.data_receives) + self.grants_received)
                .saturating_sub(self.sent_granted),
        }
    }

    /// The longest data message the peer takes (0 before its hello).
    ///
    /// ```
    /// # use rdma_ring::buf::{RemoteAccess, RemoteSlice};
    /// # use rdma_ring::stream::flow::{Flow, Limits, Received};
    /// # use rdma_ring::stream::frame::{encode_total, Header, Hello, Kind};
    /// # let hello = |l: Limits| Hello {
    /// #     chunk: l.chunk,
    /// #     data_receives: l.data_receives,
    /// #     answer_receives: l.answer_receives,
    /// #     probe: RemoteSlice::new(0x1000, 8, 7, RemoteAccess::READ),
    /// # }.encode();
    /// # let la = Limits { chunk: 4096, data_receives: 4, answer_receives: 4 };
    /// # let lb = Limits { chunk: 1024, data_receives: 8, answer_receives: 4 };
    /// # let (mut a, mut b) = (Flow::new(la), Flow::new(lb));
    /// # let (ha, hb) = (a.header(Kind::Hello), b.header(Kind::Hello));
    /// # a.commit(ha, 0);
    /// # b.commit(hb, 0);
    /// # b.receive(ha, 40, &hello(la)).unwrap();
    /// # a.receive(hb, 40, &hello(lb)).unwrap();
    /// # a.reposted(1);
    /// # b.reposted(1);
    /// assert_eq!(a.max_message(), 1024);
    /// // A longer message would not fit b's receive buffer: b refuses it.
    /// let h = a.header(Kind::Data);
    /// let err = b.receive(h, 1025, &[]).unwrap_err();
    /// assert_eq!(err, "a data message of 1025 bytes (allowed: 1 to 1024)");
    /// ```
    pub fn max_message(&self) -> u32 {
        self.peer.map_or(0, |p| p.chunk)
    }

    /// Whether a message of `kind` may be sent now.
    ///
    /// ```
    /// # use rdma_ring::buf::{RemoteAccess, RemoteSlice};
    /// # use rdma_ring::stream::flow::{Flow, Limits, Received};
    /// # use rdma_ring::stream::frame::{encode_total, Header, Hello, Kind};
    /// # let hello = |l: Limits| Hello {
    /// #     chunk: l.chunk,
    /// #     data_receives: l.data_receives,
    /// #     answer_receives: l.answer_receives,
    /// #     probe: RemoteSlice::new(0x1000, 8, 7, RemoteAccess::READ),
    /// # }.encode();
    /// # let la = Limits { chunk: 4096, data_receives: 4, answer_receives: 4 };
    /// # let lb = Limits { chunk: 1024, data_receives: 8, answer_receives: 4 };
    /// # let (mut a, mut b) = (Flow::new(la), Flow::new(lb));
    /// # let (ha, hb) = (a.header(Kind::Hello), b.header(Kind::Hello));
    /// # a.commit(ha, 0);
    /// # b.commit(hb, 0);
    /// # b.receive(ha, 40, &hello(la)).unwrap();
    /// # a.receive(hb, 40, &hello(lb)).unwrap();
    /// # a.reposted(1);
    /// # b.reposted(1);
    /// // a keeps 4 receives for answers, so at most 4 of its messages go
    /// // unanswered: its hello and 3 data messages.
    /// let mut sent = 0;
    /// while a.can_send(Kind::Data) {
    ///     let h = a.header(Kind::Data);
    ///     a.commit(h, 1024);
    ///     b.receive(h, 1024, &[]).unwrap();
    ///     sent += 1;
    /// }
    /// assert_eq!(sent, 3);
    /// assert!(a.grants() > 0); // the answer limit stopped it, not the grants
    /// ```
    pub fn can_send(&self, kind: Kind) -> bool {
        match kind {
            Kind::Hello => !self.hello_sent,
            Kind::Credit => self.wants_credit(),
            Kind::Data | Kind::Fin => {
                self.hello_sent
                    && !self.fin_sent
                    && self.grants() >= 1
                    && self.unanswered < self.ours.answer_receives
            }
        }
    }

    /// Whether a credit message is due. It must acknowledge at least one
    /// message (so the peer kept a receive for it), and either grant
    /// buffers the peer may run short of — it has at most half of ours
    /// left, or half of ours wait to be granted — or acknowledge enough
    /// that the peer may be near its answer limit. Otherwise grants wait
    /// to ride on our next data message.
    ///
    /// ```
    /// # use rdma_ring::buf::{RemoteAccess, RemoteSlice};
    /// # use rdma_ring::stream::flow::{Flow, Limits, Received};
    /// # use rdma_ring::stream::frame::{encode_total, Header, Hello, Kind};
    /// # let hello = |l: Limits| Hello {
    /// #     chunk: l.chunk,
    /// #     data_receives: l.data_receives,
    /// #     answer_receives: l.answer_receives,
    /// #     probe: RemoteSlice::new(0x1000, 8, 7, RemoteAccess::READ),
    /// # }.encode();
    /// # let la = Limits { chunk: 4096, data_receives: 4, answer_receives: 4 };
    /// # let lb = Limits { chunk: 1024, data_receives: 8, answer_receives: 4 };
    /// # let (mut a, mut b) = (Flow::new(la), Flow::new(lb));
    /// # let (ha, hb) = (a.header(Kind::Hello), b.header(Kind::Hello));
    /// # a.commit(ha, 0);
    /// # b.commit(hb, 0);
    /// # b.receive(ha, 40, &hello(la)).unwrap();
    /// # a.receive(hb, 40, &hello(lb)).unwrap();
    /// # a.reposted(1);
    /// # b.reposted(1);
    /// // One buffer to grant and one message to acknowledge can wait for data.
    /// assert!(!b.wants_credit());
    /// let h = a.header(Kind::Data);
    /// a.commit(h, 10);
    /// b.receive(h, 10, &[]).unwrap();
    /// // a now has half of its 4 answer receives in use: b answers at once.
    /// assert!(b.wants_credit());
    /// ```
    pub fn wants_credit(&self) -> bool {
        let Some(peer) = self.peer else {
            return false;
        };
        let grant = self.grant_pending.min(MAX_COUNT);
        let half = self.ours.data_receives / 2;
        let grant_due =
            grant >= 1 && (self.peer_grants() <= u64::from(half) || grant >= half.max(1));
        self.hello_sent
            && self.ack_for(grant) >= 1
            && (grant_due || self.owed >= (peer.answer_receives / 2).max(2))
    }

    /// Our receive buffers the peer may still use, as far as we know (it
    /// may have used more: its messages in flight).
    fn peer_grants(&self) -> u64 {
        (u64::from(self.ours.data_receives) + self.grants_given)
            .saturating_sub(self.received_granted)
    }

    /// What a message granting `grant` acknowledges: everything owed if it
    /// grants, else all but one (see the module docs).
    fn ack_for(&self, grant: u32) -> u32 {
        if grant >= 1 {
            self.owed
        } else {
            self.owed.saturating_sub(1)
        }
    }

    /// The header of the next message of `kind`. Nothing changes until
    /// [`commit`](Self::commit).
    ///
    /// ```
    /// # use rdma_ring::buf::{RemoteAccess, RemoteSlice};
    /// # use rdma_ring::stream::flow::{Flow, Limits, Received};
    /// # use rdma_ring::stream::frame::{encode_total, Header, Hello, Kind};
    /// # let hello = |l: Limits| Hello {
    /// #     chunk: l.chunk,
    /// #     data_receives: l.data_receives,
    /// #     answer_receives: l.answer_receives,
    /// #     probe: RemoteSlice::new(0x1000, 8, 7, RemoteAccess::READ),
    /// # }.encode();
    /// # let la = Limits { chunk: 4096, data_receives: 4, answer_receives: 4 };
    /// # let lb = Limits { chunk: 1024, data_receives: 8, answer_receives: 4 };
    /// # let (mut a, mut b) = (Flow::new(la), Flow::new(lb));
    /// # let (ha, hb) = (a.header(Kind::Hello), b.header(Kind::Hello));
    /// # a.commit(ha, 0);
    /// # b.commit(hb, 0);
    /// # b.receive(ha, 40, &hello(la)).unwrap();
    /// # a.receive(hb, 40, &hello(lb)).unwrap();
    /// # a.reposted(1);
    /// # b.reposted(1);
    /// let h = a.header(Kind::Data);
    /// // It grants the buffer b's hello used, and acknowledges that hello.
    /// assert_eq!(h, Header { kind: Kind::Data, grant: 1, ack: 1 });
    /// assert_eq!(a.header(Kind::Data), h);
    /// a.commit(h, 100);
    /// assert_eq!(a.header(Kind::Data), Header { kind: Kind::Data, grant: 0, ack: 0 });
    /// ```
    pub fn header(&self, kind: Kind) -> Header {
        let grant = if self.peer.is_some() {
            self.grant_pending.min(MAX_COUNT)
        } else {
            0
        };
        Header {
            kind,
            grant,
            ack: self.ack_for(grant),
        }
    }

    /// Records that a message with `header` (from [`header`](Self::header),
    /// unchanged since) and `data_len` bytes of data went to the device.
    ///
    /// # Panics
    ///
    /// If `header` grants or acknowledges more than is pending (it did not
    /// come from [`header`](Self::header)).
    ///
    /// ```
    /// # use rdma_ring::buf::{RemoteAccess, RemoteSlice};
    /// # use rdma_ring::stream::flow::{Flow, Limits, Received};
    /// # use rdma_ring::stream::frame::{encode_total, Header, Hello, Kind};
    /// # let hello = |l: Limits| Hello {
    /// #     chunk: l.chunk,
    /// #     data_receives: l.data_receives,
    /// #     answer_receives: l.answer_receives,
    /// #     probe: RemoteSlice::new(0x1000, 8, 7, RemoteAccess::READ),
    /// # }.encode();
    /// # let la = Limits { chunk: 4096, data_receives: 4, answer_receives: 4 };
    /// # let lb = Limits { chunk: 1024, data_receives: 8, answer_receives: 4 };
    /// # let (mut a, mut b) = (Flow::new(la), Flow::new(lb));
    /// # let (ha, hb) = (a.header(Kind::Hello), b.header(Kind::Hello));
    /// # a.commit(ha, 0);
    /// # b.commit(hb, 0);
    /// # b.receive(ha, 40, &hello(la)).unwrap();
    /// # a.receive(hb, 40, &hello(lb)).unwrap();
    /// # a.reposted(1);
    /// # b.reposted(1);
    /// let h = a.header(Kind::Data);
    /// a.commit(h, 100);
    /// assert_eq!(a.bytes_sent(), 100);
    /// assert_eq!(a.grants(), 6);
    /// ```
    pub fn commit(&mut self, header: Header, data_len: u32) {
        self.grant_pending = self
            .grant_pending
            .checked_sub(header.grant)
            .expect("a header grants only what is pending");
        self.grants_given += u64::from(header.grant);
        self.owed = self
            .owed
            .checked_sub(header.ack)
            .expect("a header acknowledges only what is owed");
        if header.kind.needs_grant() {
            self.sent_granted += 1;
            self.unanswered += 1;
        }
        match header.kind {
            Kind::Data => self.bytes_sent += u64::from(data_len),
            Kind::Fin => self.fin_sent = true,
            Kind::Hello => self.hello_sent = true,
            Kind::Credit => {}
        }
    }

    /// Data bytes sent so far (a credit's and a FIN's payload).
    ///
    /// ```
    /// # use rdma_ring::buf::{RemoteAccess, RemoteSlice};
    /// # use rdma_ring::stream::flow::{Flow, Limits, Received};
    /// # use rdma_ring::stream::frame::{encode_total, Header, Hello, Kind};
    /// # let hello = |l: Limits| Hello {
    /// #     chunk: l.chunk,
    /// #     data_receives: l.data_receives,
    /// #     answer_receives: l.answer_receives,
    /// #     probe: RemoteSlice::new(0x1000, 8, 7, RemoteAccess::READ),
    /// # }.encode();
    /// # let la = Limits { chunk: 4096, data_receives: 4, answer_receives: 4 };
    /// # let lb = Limits { chunk: 1024, data_receives: 8, answer_receives: 4 };
    /// # let (mut a, mut b) = (Flow::new(la), Flow::new(lb));
    /// # let (ha, hb) = (a.header(Kind::Hello), b.header(Kind::Hello));
    /// # a.commit(ha, 0);
    /// # b.commit(hb, 0);
    /// # b.receive(ha, 40, &hello(la)).unwrap();
    /// # a.receive(hb, 40, &hello(lb)).unwrap();
    /// # a.reposted(1);
    /// # b.reposted(1);
    /// for len in [100, 28] {
    ///     let h = a.header(Kind::Data);
    ///     a.commit(h, len);
    ///     b.receive(h, len, &[]).unwrap();
    /// }
    /// assert_eq!(a.bytes_sent(), 128);
    /// // The FIN carries the total, which b checks against what arrived.
    /// let fin = a.header(Kind::Fin);
    /// a.commit(fin, 0);
    /// assert_eq!(b.receive(fin, 8, &encode_total(a.bytes_sent())).unwrap(), Received::Fin);
    /// ```
    pub fn bytes_sent(&self) -> u64 {
        self.bytes_sent
    }

    /// Data bytes received so far.
    ///
    /// ```
    /// # use rdma_ring::buf::{RemoteAccess, RemoteSlice};
    /// # use rdma_ring::stream::flow::{Flow, Limits, Received};
    /// # use rdma_ring::stream::frame::{encode_total, Header, Hello, Kind};
    /// # let hello = |l: Limits| Hello {
    /// #     chunk: l.chunk,
    /// #     data_receives: l.data_receives,
    /// #     answer_receives: l.answer_receives,
    /// #     probe: RemoteSlice::new(0x1000, 8, 7, RemoteAccess::READ),
    /// # }.encode();
    /// # let la = Limits { chunk: 4096, data_receives: 4, answer_receives: 4 };
    /// # let lb = Limits { chunk: 1024, data_receives: 8, answer_receives: 4 };
    /// # let (mut a, mut b) = (Flow::new(la), Flow::new(lb));
    /// # let (ha, hb) = (a.header(Kind::Hello), b.header(Kind::Hello));
    /// # a.commit(ha, 0);
    /// # b.commit(hb, 0);
    /// # b.receive(ha, 40, &hello(la)).unwrap();
    /// # a.receive(hb, 40, &hello(lb)).unwrap();
    /// # a.reposted(1);
    /// # b.reposted(1);
    /// let h = a.header(Kind::Data);
    /// a.commit(h, 100);
    /// b.receive(h, 100, &[]).unwrap();
    /// assert_eq!(b.bytes_received(), 100);
    /// // A FIN claiming bytes that never arrived is refused.
    /// let fin = a.header(Kind::Fin);
    /// let err = b.receive(fin, 8, &encode_total(150)).unwrap_err();
    /// assert_eq!(err, "says it sent 150 bytes, but 100 arrived");
    /// ```
    pub fn bytes_received(&self) -> u64 {
        self.bytes_received
    }

    /// Whether our FIN went out.
    ///
    /// ```
    /// # use rdma_ring::buf::{RemoteAccess, RemoteSlice};
    /// # use rdma_ring::stream::flow::{Flow, Limits, Received};
    /// # use rdma_ring::stream::frame::{encode_total, Header, Hello, Kind};
    /// # let hello = |l: Limits| Hello {
    /// #     chunk: l.chunk,
    /// #     data_receives: l.data_receives,
    /// #     answer_receives: l.answer_receives,
    /// #     probe: RemoteSlice::new(0x1000, 8, 7, RemoteAccess::READ),
    /// # }.encode();
    /// # let la = Limits { chunk: 4096, data_receives: 4, answer_receives: 4 };
    /// # let lb = Limits { chunk: 1024, data_receives: 8, answer_receives: 4 };
    /// # let (mut a, mut b) = (Flow::new(la), Flow::new(lb));
    /// # let (ha, hb) = (a.header(Kind::Hello), b.header(Kind::Hello));
    /// # a.commit(ha, 0);
    /// # b.commit(hb, 0);
    /// # b.receive(ha, 40, &hello(la)).unwrap();
    /// # a.receive(hb, 40, &hello(lb)).unwrap();
    /// # a.reposted(1);
    /// # b.reposted(1);
    /// assert!(!a.fin_sent());
    /// let fin = a.header(Kind::Fin);
    /// a.commit(fin, 0);
    /// assert!(a.fin_sent());
    /// // Nothing follows the end of the stream.
    /// assert!(!a.can_send(Kind::Data) && !a.can_send(Kind::Fin));
    /// ```
    pub fn fin_sent(&self) -> bool {
        self.fin_sent
    }

    /// Whether the peer's FIN arrived.
    ///
    /// ```
    /// # use rdma_ring::buf::{RemoteAccess, RemoteSlice};
    /// # use rdma_ring::stream::flow::{Flow, Limits, Received};
    /// # use rdma_ring::stream::frame::{encode_total, Header, Hello, Kind};
    /// # let hello = |l: Limits| Hello {
    /// #     chunk: l.chunk,
    /// #     data_receives: l.data_receives,
    /// #     answer_receives: l.answer_receives,
    /// #     probe: RemoteSlice::new(0x1000, 8, 7, RemoteAccess::READ),
    /// # }.encode();
    /// # let la = Limits { chunk: 4096, data_receives: 4, answer_receives: 4 };
    /// # let lb = Limits { chunk: 1024, data_receives: 8, answer_receives: 4 };
    /// # let (mut a, mut b) = (Flow::new(la), Flow::new(lb));
    /// # let (ha, hb) = (a.header(Kind::Hello), b.header(Kind::Hello));
    /// # a.commit(ha, 0);
    /// # b.commit(hb, 0);
    /// # b.receive(ha, 40, &hello(la)).unwrap();
    /// # a.receive(hb, 40, &hello(lb)).unwrap();
    /// # a.reposted(1);
    /// # b.reposted(1);
    /// let fin = a.header(Kind::Fin);
    /// a.commit(fin, 0);
    /// b.receive(fin, 8, &encode_total(0)).unwrap();
    /// assert!(b.fin_received());
    /// let late = Header { kind: Kind::Data, grant: 0, ack: 0 };
    /// assert_eq!(b.receive(late, 10, &[]).unwrap_err(), "data after the end of the stream");
    /// ```
    pub fn fin_received(&self) -> bool {
        self.fin_received
    }

    /// `n` data receives were posted again (after the reader emptied them,
    /// or at once for a FIN or hello): grant them in the next message.
    ///
    /// ```
    /// # use rdma_ring::buf::{RemoteAccess, RemoteSlice};
    /// # use rdma_ring::stream::flow::{Flow, Limits, Received};
    /// # use rdma_ring::stream::frame::{encode_total, Header, Hello, Kind};
    /// # let hello = |l: Limits| Hello {
    /// #     chunk: l.chunk,
    /// #     data_receives: l.data_receives,
    /// #     answer_receives: l.answer_receives,
    /// #     probe: RemoteSlice::new(0x1000, 8, 7, RemoteAccess::READ),
    /// # }.encode();
    /// # let la = Limits { chunk: 4096, data_receives: 4, answer_receives: 4 };
    /// # let lb = Limits { chunk: 1024, data_receives: 8, answer_receives: 4 };
    /// # let (mut a, mut b) = (Flow::new(la), Flow::new(lb));
    /// # let (ha, hb) = (a.header(Kind::Hello), b.header(Kind::Hello));
    /// # a.commit(ha, 0);
    /// # b.commit(hb, 0);
    /// # b.receive(ha, 40, &hello(la)).unwrap();
    /// # a.receive(hb, 40, &hello(lb)).unwrap();
    /// # a.reposted(1);
    /// # b.reposted(1);
    /// let h = a.header(Kind::Data);
    /// a.commit(h, 10);
    /// b.receive(h, 10, &[]).unwrap();
    /// // b's reader emptied the buffer: b's next message grants it back,
    /// // with the one a's hello used.
    /// b.reposted(1);
    /// assert_eq!(b.header(Kind::Data).grant, 2);
    /// ```
    pub fn reposted(&mut self, n: u32) {
        self.grant_pending += n;
        debug_assert!(self.grant_pending <= self.ours.data_receives);
    }

    /// Checks a message the peer sent — its header, and its payload of
    /// `payload` (its first bytes suffice for data, whose length is
    /// `len`) — against the rules, and applies it. An error says what the
    /// peer did wrong; the connection cannot go on after one.
    ///
    /// ```
    /// # use rdma_ring::buf::{RemoteAccess, RemoteSlice};
    /// # use rdma_ring::stream::flow::{Flow, Limits, Received};
    /// # use rdma_ring::stream::frame::{encode_total, Header, Hello, Kind};
    /// # let hello = |l: Limits| Hello {
    /// #     chunk: l.chunk,
    /// #     data_receives: l.data_receives,
    /// #     answer_receives: l.answer_receives,
    /// #     probe: RemoteSlice::new(0x1000, 8, 7, RemoteAccess::READ),
    /// # }.encode();
    /// # let la = Limits { chunk: 4096, data_receives: 4, answer_receives: 4 };
    /// # let lb = Limits { chunk: 1024, data_receives: 8, answer_receives: 4 };
    /// # let (mut a, mut b) = (Flow::new(la), Flow::new(lb));
    /// # let (ha, hb) = (a.header(Kind::Hello), b.header(Kind::Hello));
    /// # a.commit(ha, 0);
    /// # b.commit(hb, 0);
    /// # b.receive(ha, 40, &hello(la)).unwrap();
    /// # a.receive(hb, 40, &hello(lb)).unwrap();
    /// # a.reposted(1);
    /// # b.reposted(1);
    /// let h = a.header(Kind::Data);
    /// a.commit(h, 10);
    /// assert_eq!(b.receive(h, 10, &[]).unwrap(), Received::Data(10));
    /// // b has no message unacknowledged: a's data acknowledged b's hello.
    /// let lie = Header { kind: Kind::Data, grant: 0, ack: 3 };
    /// let err = b.receive(lie, 10, &[]).unwrap_err();
    /// assert_eq!(err, "acknowledges 3 messages, but only 0 are unacknowledged");
    /// ```
    pub fn receive(
        &mut self,
        header: Header,
        len: u32,
        payload: &[u8],
    ) -> Result<Received, String> {
        if !self.hello_received && header.kind != Kind::Hello {
            return Err(format!("a {:?} message before the hello", header.kind));
        }
        if header.ack > self.unanswered {
            return Err(format!(
                "acknowledges {} messages, but only {} are unacknowledged",
                header.ack, self.unanswered
            ));
        }
        if self.grants_received + u64::from(header.grant) > self.sent_granted {
            return Err(format!(
                "grants back {} receive buffers, but only {} of ours used one",
                self.grants_received + u64::from(header.grant),
                self.sent_granted
            ));
        }
        let received = match header.kind {
            Kind::Hello => {
                if self.hello_received {
                    return Err("a second hello".into());
                }
                Received::Hello(Hello::decode(
                    payload.get(..len as usize).unwrap_or(payload),
                )?)
            }
            Kind::Data => {
                if self.fin_received {
                    return Err("data after the end of the stream".into());
                }
                if len == 0 || len > self.ours.chunk {
                    return Err(format!(
                        "a data message of {len} bytes (allowed: 1 to {})",
                        self.ours.chunk
                    ));
                }
                Received::Data(len)
            }
            Kind::Credit | Kind::Fin => {
                if header.kind == Kind::Credit && header.ack == 0 {
                    return Err("a credit message that acknowledges nothing".into());
                }
                if header.kind == Kind::Fin && self.fin_received {
                    return Err("a second end of stream".into());
                }
                let total = frame::decode_total(payload.get(..len as usize).unwrap_or(payload))?;
                if total != self.bytes_received {
                    return Err(format!(
                        "says it sent {total} bytes, but {} arrived",
                        self.bytes_received
                    ));
                }
                if header.kind == Kind::Fin {
                    Received::Fin
                } else {
                    Received::Credit
                }
            }
        };
        if header.kind.needs_grant() {
            let answers = match received {
                Received::Hello(hello) => hello.answer_receives,
                _ => self.peer.map_or(0, |p| p.answer_receives),
            };
            if self.received_granted >= u64::from(self.ours.data_receives) + self.grants_given {
                return Err(format!(
                    "sent more than the {} receive buffers granted to it",
                    u64::from(self.ours.data_receives) + self.grants_given
                ));
            }
            if self.owed >= answers {
                return Err(format!(
                    "has more than the {answers} unacknowledged messages it announced"
                ));
            }
            self.received_granted += 1;
            self.owed += 1;
        }
        self.unanswered -= header.ack;
        self.grants_received += u64::from(header.grant);
        match received {
            Received::Hello(hello) => {
                self.hello_received = true;
                self.peer = Some(Limits::of(&hello));
            }
            Received::Data(len) => self.bytes_received += u64::from(len),
            Received::Fin => self.fin_received = true,
            Received::Credit => {}
        }
        Ok(received)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buf::{RemoteAccess, RemoteSlice};
    use std::collections::VecDeque;

    fn limits(data: u32, answers: u32) -> Limits {
        Limits {
            chunk: 64,
            data_receives: data,
            answer_receives: answers,
        }
    }

    fn hello_of(l: Limits) -> Vec<u8> {
        Hello {
            chunk: l.chunk,
            data_receives: l.data_receives,
            answer_receives: l.answer_receives,
            probe: RemoteSlice::new(0x10, 8, 1, RemoteAccess::READ),
        }
        .encode()
        .to_vec()
    }

    /// One side of a simulated connection: a flow, its posted receives,
    /// and a reader that holds data buffers until it reads them.
    struct Side {
        flow: Flow,
        posted: u32,
        held: VecDeque<u32>,
        to_write: u64,
        read: u64,
    }

    struct Msg {
        header: Header,
        len: u32,
        payload: Vec<u8>,
    }

    impl Side {
        fn new(l: Limits, to_write: u64) -> Side {
            Side {
                flow: Flow::new(l),
                posted: l.data_receives + l.answer_receives,
                held: VecDeque::new(),
                to_write,
                read: 0,
            }
        }

        /// The next message this side would send, if any.
        fn next(&mut self) -> Option<Msg> {
            let l = self.flow.ours();
            let kind = if self.flow.can_send(Kind::Hello) {
                Kind::Hello
            } else if self.to_write > 0 && self.flow.can_send(Kind::Data) {
                Kind::Data
            } else if self.to_write == 0 && self.flow.can_send(Kind::Fin) {
                Kind::Fin
            } else if self.flow.can_send(Kind::Credit) {
                Kind::Credit
            } else {
                return None;
            };
            let header = self.flow.header(kind);
            let (len, payload) = match kind {
                Kind::Hello => (frame::HELLO_LEN as u32, hello_of(l)),
                Kind::Data => {
                    let len = self.to_write.min(u64::from(self.flow.max_message())) as u32;
                    self.to_write -= u64::from(len);
                    (len, Vec::new())
                }
                _ => (8, frame::encode_total(self.flow.bytes_sent()).to_vec()),
            };
            self.flow
                .commit(header, if kind == Kind::Data { len } else { 0 });
            Some(Msg {
                header,
                len,
                payload,
            })
        }

        fn deliver(&mut self, m: Msg) {
            assert!(self.posted >= 1, "a message found no receive: RNR");
            self.posted -= 1;
            match self.flow.receive(m.header, m.len, &m.payload).unwrap() {
                Received::Data(len) => self.held.push_back(len),
                Received::Credit => self.posted += 1,
                Received::Fin | Received::Hello(_) => {
                    self.posted += 1;
                    self.flow.reposted(1);
                }
            }
        }

        fn read_one(&mut self) {
            if let Some(len) = self.held.pop_front() {
                self.read += u64::from(len);
                self.posted += 1;
                self.flow.reposted(1);
            }
        }
    }

    /// Random schedules of two sides sending, delivering and reading: no
    /// message ever finds no receive, no rule check fails, and everything
    /// written is read with both FINs delivered, whatever the order.
    #[test]
    fn random_schedules_never_deadlock_nor_overrun() {
        use proptest::prelude::*;
        use proptest::test_runner::TestRunner;
        let mut runner = TestRunner::deterministic();
        let strategy = (
            1u32..6,
            2u32..6,
            1u32..6,
            2u32..6,
            0u64..2000,
            0u64..2000,
            proptest::collection::vec(0u8..6, 1..400),
        );
        runner
            .run(&strategy, |(da, aa, db, ab, wa, wb, schedule)| {
                let mut sides = [Side::new(limits(da, aa), wa), Side::new(limits(db, ab), wb)];
                let mut wires: [VecDeque<Msg>; 2] = [VecDeque::new(), VecDeque::new()];
                let mut steps = schedule.into_iter().cycle();
                for _ in 0..100_000 {
                    let done = sides
                        .iter()
                        .all(|s| s.flow.fin_received() && s.held.is_empty())
                        && wires.iter().all(|w| w.is_empty());
                    if done {
                        break;
                    }
                    let step = steps.next().unwrap();
                    let i = usize::from(step & 1);
                    match step / 2 {
                        0 => {
                            if let Some(m) = sides[i].next() {
                                wires[i].push_back(m);
                            }
                        }
                        1 => {
                            if let Some(m) = wires[i].pop_front() {
                                sides[1 - i].deliver(m);
                            }
                        }
                        _ => sides[i].read_one(),
                    }
                }
                // Then drain fairly: every side sends, delivers and reads
                // until nothing moves; it must end complete.
                loop {
                    let mut moved = false;
                    for i in 0..2 {
                        while let Some(m) = sides[i].next() {
                            wires[i].push_back(m);
                            moved = true;
                        }
                        while let Some(m) = wires[i].pop_front() {
                            sides[1 - i].deliver(m);
                            moved = true;
                        }
                        while !sides[i].held.is_empty() {
                            sides[i].read_one();
                            moved = true;
                        }
                    }
                    if !moved {
                        break;
                    }
                }
                prop_assert_eq!(sides[0].read, wb);
                prop_assert_eq!(sides[1].read, wa);
                prop_assert!(sides[0].flow.fin_received() && sides[1].flow.fin_received());
                Ok(())
            })
            .unwrap();
    }

    fn connected() -> (Flow, Flow) {
        connected_with(limits(4, 4), limits(4, 4))
    }

    fn connected_with(la: Limits, lb: Limits) -> (Flow, Flow) {
        let mut a = Side::new(la, 0);
        let mut b = Side::new(lb, 0);
        let ha = a.next().unwrap();
        let hb = b.next().unwrap();
        b.deliver(ha);
        a.deliver(hb);
        (a.flow, b.flow)
    }

    #[test]
    fn a_peer_that_breaks_the_rules_is_named() {
        let (a, _) = connected();
        let data = |grant, ack| Header {
            kind: Kind::Data,
            grant,
            ack,
        };
        let err = a.clone().receive(data(0, 3), 8, &[]).unwrap_err();
        assert!(err.contains("acknowledges 3"), "{err}");
        let err = a.clone().receive(data(2, 0), 8, &[]).unwrap_err();
        assert!(err.contains("grants back 2"), "{err}");
        let err = a.clone().receive(data(0, 0), 0, &[]).unwrap_err();
        assert!(err.contains("0 bytes"), "{err}");
        let err = a.clone().receive(data(0, 0), 65, &[]).unwrap_err();
        assert!(err.contains("65 bytes"), "{err}");
        let credit = Header {
            kind: Kind::Credit,
            grant: 0,
            ack: 1,
        };
        let err = a
            .clone()
            .receive(Header { ack: 0, ..credit }, 8, &frame::encode_total(0))
            .unwrap_err();
        assert!(err.contains("acknowledges nothing"), "{err}");
        let err = a
            .clone()
            .receive(credit, 8, &frame::encode_total(5))
            .unwrap_err();
        assert!(err.contains("says it sent 5 bytes, but 0 arrived"), "{err}");
        let err = a.clone().receive(credit, 7, &[0; 7]).unwrap_err();
        assert!(err.contains("7 bytes"), "{err}");
        let hello = Header {
            kind: Kind::Hello,
            grant: 0,
            ack: 0,
        };
        let err = a.clone().receive(hello, 40, &[0; 40]).unwrap_err();
        assert!(err.contains("second hello"), "{err}");
        // A peer that announced 3 answer receives and sent its hello may
        // have 2 more messages unacknowledged: the third data message
        // breaks the answer rule (while grants remain).
        let (mut a, _) = connected_with(limits(4, 4), limits(4, 3));
        for _ in 0..2 {
            a.receive(data(0, 0), 8, &[]).unwrap();
        }
        let err = a.receive(data(0, 0), 8, &[]).unwrap_err();
        assert!(err.contains("more than the 3 unacknowledged"), "{err}");
        let mut fresh = Flow::new(limits(4, 4));
        let err = fresh.receive(data(0, 0), 8, &[]).unwrap_err();
        assert!(err.contains("before the hello"), "{err}");
    }

    #[test]
    fn a_grant_never_lets_the_peer_overrun_our_receives() {
        let (mut a, _) = connected();
        let data = Header {
            kind: Kind::Data,
            grant: 0,
            ack: 0,
        };
        // The peer's hello used one of our 4 data receives; 3 more data
        // messages use the rest (acknowledged as they come, so the answer
        // rule holds), and the next finds none granted.
        for _ in 0..3 {
            a.receive(data, 1, &[]).unwrap();
            a.owed = 0;
        }
        let err = a.receive(data, 1, &[]).unwrap_err();
        assert!(err.contains("more than the 4 receive buffers"), "{err}");
    }
}
