//! The granter: a host's thread that makes the regions peers ask for —
//! allocated, zeroed and registered, up to `max_remote_region` each — so
//! that a peer asking for large regions in a loop keeps the pump, which
//! serves every session of the host, no busier than its messages do. The
//! sessions take turns, one grant each, so one peer's queue of large
//! grants delays another's by one grant, not by all of them.

use std::alloc::Layout;
use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};

use super::host::HostShared;
use super::state::{SessionShared, SessionState};
use super::wire::{Control, RefuseReason};
use crate::backend::QueuePair;
use crate::buf::{ExposedBuf, Region, RemoteAccess};

/// A region a peer asked for, admitted against its quota (counted in
/// `granting` until it is made), to be made and answered.
pub(super) struct Wanted {
    pub(super) request: u64,
    pub(super) layout: Layout,
    pub(super) rights: RemoteAccess,
    pub(super) charge: u64,
}

struct Job<Q: QueuePair + Send + 'static> {
    session: Arc<SessionShared<Q>>,
    wanted: Wanted,
}

/// The host's granter thread, started at the first grant. It ends when the
/// host does (its channel closes).
pub(super) struct Granter<Q: QueuePair + Send + 'static> {
    /// The thread's queue, once started; `Err` if it could not be (the
    /// pump then makes every grant itself, without trying again).
    jobs: Mutex<Option<Result<Sender<Job<Q>>, ()>>>,
    /// Held by a test to keep grants from being made.
    #[cfg(test)]
    pub(super) hold: Arc<Mutex<()>>,
    /// The sessions (their tokens) grants were made for, in order, for
    /// tests.
    #[cfg(test)]
    pub(super) made: Arc<Mutex<Vec<u64>>>,
}

impl<Q: QueuePair + Send + 'static> Granter<Q> {
    pub(super) fn new() -> Self {
        Granter {
            jobs: Mutex::new(None),
            #[cfg(test)]
            hold: Arc::default(),
            #[cfg(test)]
            made: Arc::default(),
        }
    }

    /// Hands `wanted` of `session` to the granter thread; if there is
    /// none and none can be started, makes it here, answering into `st`
    /// (the session's state, which the caller holds).
    pub(super) fn grant(
        &self,
        session: &Arc<SessionShared<Q>>,
        st: &mut SessionState,
        wanted: Wanted,
    ) {
        let job = Job {
            session: Arc::clone(session),
            wanted,
        };
        let Err(job) = self.send(job) else {
            return;
        };
        let made = make(&session.host, &job.wanted);
        answer(&session.host, st, job.wanted, made);
    }

    fn send(&self, job: Job<Q>) -> Result<(), Job<Q>> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let jobs = jobs.get_or_insert_with(|| self.start());
        match jobs {
            Ok(tx) => tx.send(job).map_err(|refused| refused.0),
            Err(()) => Err(job),
        }
    }

    /// Starts the granter thread; `Err` if it cannot be.
    fn start(&self) -> Result<Sender<Job<Q>>, ()> {
        let (tx, rx) = channel::<Job<Q>>();
        #[cfg(test)]
        let (hold, made) = (Arc::clone(&self.hold), Arc::clone(&self.made));
        std::thread::Builder::new()
            .name("rdma-ring-session-granter".into())
            .spawn(move || {
                let mut turns = Turns::default();
                while turns.take_from(&rx) {
                    #[cfg(test)]
                    drop(hold.lock().unwrap_or_else(|p| p.into_inner()));
                    turns.take_waiting(&rx);
                    let Some(job) = turns.next() else { continue };
                    #[cfg(test)]
                    made.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(job.session.token);
                    let host = &job.session.host;
                    let made = make(host, &job.wanted);
                    answer(host, &mut job.session.lock(), job.wanted, made);
                    host.nudge();
                }
            })
            .map(|_| tx)
            .map_err(|_| ())
    }
}

/// The grants waiting to be made, by session; the sessions with some take
/// turns.
struct Turns<Q: QueuePair + Send + 'static> {
    waiting: HashMap<u64, VecDeque<Job<Q>>>,
    /// Sessions with grants waiting, the next to be served first.
    order: VecDeque<u64>,
}

impl<Q: QueuePair + Send + 'static> Default for Turns<Q> {
    fn default() -> Self {
        Turns {
            waiting: HashMap::new(),
            order: VecDeque::new(),
        }
    }
}

impl<Q: QueuePair + Send + 'static> Turns<Q> {
    fn push(&mut self, job: Job<Q>) {
        let token = job.session.token;
        let queue = self.waiting.entry(token).or_default();
        if queue.is_empty() {
            self.order.push_back(token);
        }
        queue.push_back(job);
    }

    /// Waits for a grant if none is waiting; false once the host has gone
    /// and none is left.
    fn take_from(&mut self, rx: &Receiver<Job<Q>>) -> bool {
        if !self.order.is_empty() {
            return true;
        }
        match rx.recv() {
            Ok(job) => {
                self.push(job);
                true
            }
            Err(_) => false,
        }
    }

    /// Takes every grant already asked for, so that their sessions are in
    /// the turns.
    fn take_waiting(&mut self, rx: &Receiver<Job<Q>>) {
        while let Ok(job) = rx.try_recv() {
            self.push(job);
        }
    }

    /// The next session's oldest grant; that session goes to the back.
    fn next(&mut self) -> Option<Job<Q>> {
        let token = self.order.pop_front()?;
        let queue = self.waiting.get_mut(&token)?;
        let job = queue.pop_front();
        if queue.is_empty() {
            self.waiting.remove(&token);
        } else {
            self.order.push_back(token);
        }
        job
    }
}

/// The region for `wanted`, zeroed (a freed region's old bytes must not
/// reach the peer) and exposed with exactly its rights. A panic while it
/// is made (the device's, say) refuses it: the granter goes on, and the
/// request is answered.
fn make<Q: QueuePair + Send + 'static>(
    host: &HostShared<Q>,
    wanted: &Wanted,
) -> Result<ExposedBuf<Region>, RefuseReason> {
    let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let region = host
            .regions
            .alloc_zeroed(wanted.layout)
            .map_err(|_| RefuseReason::OutOfMemory)?;
        ExposedBuf::new(&*host.pd, region, wanted.rights).map_err(|_| RefuseReason::OutOfMemory)
    }));
    made.unwrap_or(Err(RefuseReason::OutOfMemory))
}

/// Answers `wanted` with what was `made`: lent to the peer and granted, or
/// refused. A session our user closed meanwhile refuses; one that failed,
/// or whose peer closed it (nothing of ours is the peer's any more),
/// answers nothing. Either way its admission leaves the quota.
fn answer<Q: QueuePair + Send + 'static>(
    host: &HostShared<Q>,
    st: &mut SessionState,
    wanted: Wanted,
    made: Result<ExposedBuf<Region>, RefuseReason>,
) {
    st.granting -= 1;
    st.granting_bytes -= wanted.charge;
    if st.failure.is_some() || st.peer_closed {
        host.report_held(st);
        return; // `made` goes: deregistered and freed
    }
    let request = wanted.request;
    let control = match made {
        Ok(_) if st.closing => Control::AllocRefuse {
            request,
            reason: RefuseReason::Closing,
        },
        Ok(exposed) => Control::AllocGrant {
            request,
            region: super::pump::lend(st, exposed, host.config.lease, true, wanted.charge),
        },
        Err(reason) => Control::AllocRefuse { request, reason },
    };
    // Granted, the admission's charge moved to what is lent: reported
    // once both are done, so the host's count never dips between.
    host.report_held(st);
    st.outbox.push_back(control);
}

#[cfg(test)]
mod tests {
    use std::alloc::Layout;
    use std::sync::Arc;
    use std::time::Duration;

    use crate::backend::soft::SoftDevice;
    use crate::buf::BaseBuf;
    use crate::session::{SessionConfig, SessionHost};

    /// Waits (ten seconds at most) until `done`.
    fn wait_for(what: &str, done: &dyn Fn() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "never {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// While a region one peer asked for is being made, the host's other
    /// sessions go on: the pump, which serves them all, does not make it.
    #[test]
    fn a_grant_being_made_holds_up_no_other_session() {
        let dev = SoftDevice::new();
        let host = SessionHost::soft(&dev, SessionConfig::default()).unwrap();
        let (asking, granting_side) = host.connect_soft(&host).unwrap();
        let (b, b_peer) = host.connect_soft(&host).unwrap();
        let held = host.shared.granter.hold.lock().unwrap();
        let granting = Arc::clone(&granting_side.shared);
        let (got, granted) = std::sync::mpsc::channel();
        let asker = std::thread::spawn(move || {
            let layout = Layout::from_size_align(1 << 20, 64).unwrap();
            let region = futures::executor::block_on(asking.request_remote_mr(layout));
            got.send(region.map(|r| r.remote().len())).unwrap();
        });
        // Once the grant is being made (admitted, and not answered)...
        wait_for("asked", &|| granting.lock().granting > 0);
        // ... the other session's message goes and comes, the grant held.
        let mut msg = b
            .alloc_local_mr(Layout::from_size_align(8, 8).unwrap())
            .unwrap();
        msg.fill(9);
        let (sent, _) = futures::executor::block_on(b.send(msg.slice(..)));
        sent.unwrap();
        let got_msg = futures::executor::block_on(b_peer.receive()).unwrap();
        assert_eq!(*got_msg, [9u8; 8]);
        assert!(
            granted.recv_timeout(Duration::from_millis(100)).is_err(),
            "granted while held"
        );
        drop(held);
        let len = granted.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(len.unwrap(), 1 << 20);
        asker.join().unwrap();
    }

    /// Sessions take turns at the granter: one peer's queue of grants
    /// delays another's single grant by one grant, not by all of them.
    #[test]
    fn sessions_take_turns_at_the_granter() {
        let dev = SoftDevice::new();
        let host = SessionHost::soft(&dev, SessionConfig::default()).unwrap();
        let (a, a_granting) = host.connect_soft(&host).unwrap();
        let (b, b_granting) = host.connect_soft(&host).unwrap();
        let held = host.shared.granter.hold.lock().unwrap();
        let layout = Layout::from_size_align(64 << 10, 64).unwrap();
        let ask = |session: crate::session::Session<_>, n: usize| {
            std::thread::spawn(move || {
                let asks = (0..n).map(|_| session.request_remote_mr(layout));
                let got = futures::executor::block_on(futures::future::join_all(asks));
                assert!(got.iter().all(|r| r.is_ok()));
            })
        };
        // Six from one session, then one from the other, all waiting.
        let asker_a = ask(a, 6);
        wait_for("a's six", &|| a_granting.shared.lock().granting == 6);
        let asker_b = ask(b, 1);
        wait_for("b's one", &|| b_granting.shared.lock().granting == 1);
        drop(held);
        asker_a.join().unwrap();
        asker_b.join().unwrap();
        let (a, b) = (a_granting.shared.token, b_granting.shared.token);
        let made = host.shared.granter.made.lock().unwrap().clone();
        assert_eq!(made, [a, b, a, a, a, a, a]);
    }

    /// A grant made after the peer closed the session is not lent: nothing
    /// of ours is the peer's once it closed.
    #[test]
    fn a_grant_made_after_the_peer_closed_is_not_lent() {
        let dev = SoftDevice::new();
        let config = SessionConfig {
            request_timeout: Duration::from_millis(300),
            ..SessionConfig::default()
        };
        let host = SessionHost::soft(&dev, config).unwrap();
        let (asking, granting) = host.connect_soft(&host).unwrap();
        let held = host.shared.granter.hold.lock().unwrap();
        let shared = Arc::clone(&granting.shared);
        let asker = std::thread::spawn(move || {
            let layout = Layout::from_size_align(4096, 64).unwrap();
            // Ends once the session does.
            let _ = futures::executor::block_on(asking.request_remote_mr(layout));
        });
        wait_for("asked", &|| shared.lock().granting == 1);
        // The asking side closes (its request fails with it).
        asker.join().unwrap();
        wait_for("closed", &|| shared.lock().peer_closed);
        drop(held);
        wait_for("made", &|| shared.lock().granting == 0);
        assert_eq!(*host.shared.granter.made.lock().unwrap(), [shared.token]);
        assert!(shared.lock().lent.is_empty(), "lent after the peer closed");
        drop(granting);
    }
}
