//! Rendezvous requests waiting for memory to read them, served fairly:
//! each client's in its arrival order, the clients in turn.

use std::collections::{HashMap, VecDeque};

use crate::buf::RemoteSlice;
use crate::ring::QpHandle;

/// Requests waiting to be read, by client. One client queueing a whole
/// window of large requests must not make the others wait for all of them:
/// after one of a client's requests starts, that client goes to the back
/// of the turns. The client whose turn it is is never overtaken, though,
/// even by a smaller request that would fit now, so no large request
/// starves behind a stream of small ones.
#[derive(Default)]
pub(super) struct WaitingReads {
    by_client: HashMap<QpHandle, VecDeque<(u64, RemoteSlice)>>,
    /// Clients with requests waiting, the one whose turn it is first.
    turns: VecDeque<QpHandle>,
}

impl WaitingReads {
    pub(super) fn is_empty(&self) -> bool {
        self.turns.is_empty()
    }

    /// Queues call `id` of client `qp`, after that client's others.
    pub(super) fn push(&mut self, qp: QpHandle, id: u64, remote: RemoteSlice) {
        let queue = self.by_client.entry(qp).or_default();
        if queue.is_empty() {
            self.turns.push_back(qp);
        }
        queue.push_back((id, remote));
    }

    /// The request whose turn it is.
    pub(super) fn next(&self) -> Option<(QpHandle, u64, RemoteSlice)> {
        let qp = *self.turns.front()?;
        let &(id, remote) = self.by_client.get(&qp)?.front()?;
        Some((qp, id, remote))
    }

    /// Takes the request whose turn it is; its client goes to the back of
    /// the turns if it has more waiting.
    pub(super) fn take_next(&mut self) -> Option<(QpHandle, u64, RemoteSlice)> {
        let qp = self.turns.pop_front()?;
        let queue = self.by_client.get_mut(&qp)?;
        let (id, remote) = queue.pop_front()?;
        if queue.is_empty() {
            self.by_client.remove(&qp);
        } else {
            self.turns.push_back(qp);
        }
        Some((qp, id, remote))
    }

    /// Forgets every request of client `qp`.
    pub(super) fn remove_client(&mut self, qp: QpHandle) {
        if self.by_client.remove(&qp).is_some() {
            self.turns.retain(|q| *q != qp);
        }
    }

    pub(super) fn clear(&mut self) {
        self.by_client.clear();
        self.turns.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::soft::SoftDevice;
    use crate::backend::QpConfig;
    use crate::buf::RemoteAccess;
    use crate::ring::{Ring, RingConfig};

    /// Three queue pairs' handles in one ring.
    fn clients() -> [QpHandle; 3] {
        let dev = SoftDevice::new();
        let pd = dev.alloc_pd();
        let cq = dev.create_cq(64).unwrap();
        let mut ring = Ring::with_cq(cq, RingConfig::default());
        [0, 1, 2].map(|_| {
            let qp = dev
                .create_qp_on(&pd, ring.cq(), None, QpConfig::default())
                .unwrap();
            ring.attach(qp).unwrap()
        })
    }

    fn remote(len: u64) -> RemoteSlice {
        RemoteSlice::new(0x1000, len, 7, RemoteAccess::READ)
    }

    fn drain(waiting: &mut WaitingReads) -> Vec<u64> {
        std::iter::from_fn(|| waiting.take_next().map(|(_, id, _)| id)).collect()
    }

    #[test]
    fn clients_take_turns_each_in_its_own_order() {
        let [a, b, c] = clients();
        let mut waiting = WaitingReads::default();
        for id in [1, 2, 3] {
            waiting.push(a, id, remote(10));
        }
        waiting.push(b, 11, remote(10));
        waiting.push(c, 21, remote(10));
        waiting.push(b, 12, remote(10));
        assert_eq!(waiting.next().map(|(qp, id, _)| (qp, id)), Some((a, 1)));
        assert_eq!(drain(&mut waiting), [1, 11, 21, 2, 12, 3]);
        assert!(waiting.is_empty());
    }

    #[test]
    fn a_client_that_empties_joins_the_back_when_it_queues_again() {
        let [a, b, _] = clients();
        let mut waiting = WaitingReads::default();
        waiting.push(a, 1, remote(10));
        waiting.push(b, 11, remote(10));
        waiting.push(b, 12, remote(10));
        assert_eq!(waiting.take_next().map(|(_, id, _)| id), Some(1));
        waiting.push(a, 2, remote(10));
        assert_eq!(drain(&mut waiting), [11, 2, 12]);
    }

    #[test]
    fn a_removed_client_loses_its_requests_and_its_turn() {
        let [a, b, c] = clients();
        let mut waiting = WaitingReads::default();
        waiting.push(a, 1, remote(10));
        waiting.push(b, 11, remote(10));
        waiting.push(c, 21, remote(10));
        waiting.remove_client(a);
        waiting.remove_client(a);
        assert_eq!(drain(&mut waiting), [11, 21]);
        waiting.push(a, 2, remote(10));
        waiting.clear();
        assert!(waiting.is_empty());
        assert_eq!(waiting.next(), None);
    }
}
