//! Accepting TCP handshakes side by side.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Handshakes in progress at most: beyond, connections wait in the
/// kernel's backlog, so a flood of them costs a bounded number of threads
/// and queue pairs.
const MAX_HANDSHAKES: usize = 64;
/// How often a waiting accept looks for new connections.
const ACCEPT_TICK: Duration = Duration::from_millis(20);

/// A TCP listener whose handshakes run on threads of their own, so a peer
/// that stalls (for as long as the handshake's timeout) holds up none of
/// the peers behind it. An accept hands out the next handshake to finish,
/// whoever's it is: a connection made, or the error of a peer that failed.
pub(crate) struct HandshakeListener<T> {
    tcp: TcpListener,
    finished: Mutex<Receiver<T>>,
    finish: Sender<T>,
    slots: HandshakeSlots,
}

/// Counts the handshakes in progress, up to [`MAX_HANDSHAKES`].
#[derive(Clone, Default)]
pub(crate) struct HandshakeSlots(Arc<AtomicUsize>);

impl HandshakeSlots {
    /// A slot for one more handshake, unless all are taken.
    pub(crate) fn take(&self) -> Option<HandshakeSlot> {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_HANDSHAKES).then_some(n + 1)
            })
            .ok()
            .map(|_| HandshakeSlot(Arc::clone(&self.0)))
    }

    fn running(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

/// A handshake in progress, counted while it lives (however it ends, a
/// panic included).
pub(crate) struct HandshakeSlot(Arc<AtomicUsize>);

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl<T: Send + 'static> HandshakeListener<T> {
    pub(crate) fn new(tcp: TcpListener) -> io::Result<Self> {
        tcp.set_nonblocking(true)?;
        let (finish, finished) = mpsc::channel();
        Ok(HandshakeListener {
            tcp,
            finished: Mutex::new(finished),
            finish,
            slots: HandshakeSlots::default(),
        })
    }

    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// Waits for the next handshake to finish, starting `handshake` on a
    /// thread of its own for each connection that comes meanwhile. An
    /// error of the listener itself (out of descriptors, say) is returned
    /// as is.
    pub(crate) fn accept<F>(&self, handshake: F) -> io::Result<T>
    where
        F: Fn(TcpStream, SocketAddr) -> T + Clone + Send + 'static,
    {
        loop {
            if let Some(done) = self.accept_until(handshake.clone(), || false)? {
                return Ok(done);
            }
        }
    }

    /// Like [`accept`](Self::accept), giving up with `None` once `stop`
    /// says so (asked every [`ACCEPT_TICK`]); handshakes in progress go
    /// on, and what they return is handed out by later calls.
    pub(crate) fn accept_until<F>(
        &self,
        handshake: F,
        stop: impl Fn() -> bool,
    ) -> io::Result<Option<T>>
    where
        F: Fn(TcpStream, SocketAddr) -> T + Clone + Send + 'static,
    {
        let finished = self.finished.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Ok(done) = finished.try_recv() {
                return Ok(Some(done));
            }
            // Beyond the slots, connections wait in the kernel's backlog.
            if let Some(slot) = self.slots.take() {
                match self.tcp.accept() {
                    Ok((socket, peer)) => {
                        self.start(socket, peer, handshake.clone(), slot)?;
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            }
            if stop() {
                return Ok(None);
            }
            match finished.recv_timeout(ACCEPT_TICK) {
                Ok(done) => return Ok(Some(done)),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => unreachable!("the listener holds a sender"),
            }
        }
    }

    fn start<F>(
        &self,
        socket: TcpStream,
        peer: SocketAddr,
        handshake: F,
        slot: HandshakeSlot,
    ) -> io::Result<()>
    where
        F: FnOnce(TcpStream, SocketAddr) -> T + Send + 'static,
    {
        // Accepted sockets need not inherit the listener's non-blocking
        // mode on every platform: the handshake's timeouts assume blocking.
        // A socket that cannot be set so is that peer's failure alone: it
        // is dropped, and the peer sees its connection close.
        if socket.set_nonblocking(false).is_err() {
            return Ok(());
        }
        let finish = self.finish.clone();
        std::thread::Builder::new()
            .name("rdma-ring-handshake".into())
            .spawn(move || {
                let _slot = slot;
                // A listener dropped meanwhile drops what it would have
                // handed out.
                let _ = finish.send(handshake(socket, peer));
            })
            .map(drop)
    }
}

impl<T> std::fmt::Debug for HandshakeListener<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandshakeListener")
            .field("tcp", &self.tcp)
            .field("running", &self.slots.running())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::time::Instant;

    /// A peer that connects and says nothing holds up no peer behind it:
    /// the handshake of the one that speaks finishes first and comes out.
    #[test]
    fn a_silent_peer_holds_up_nobody_behind_it() {
        let listener = HandshakeListener::new(TcpListener::bind("127.0.0.1:0").unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let _silent = TcpStream::connect(addr).unwrap();
        let mut speaking = TcpStream::connect(addr).unwrap();
        speaking.write_all(b"hi").unwrap();
        let handshake = |mut socket: TcpStream, _peer: SocketAddr| {
            socket
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            let mut word = [0u8; 2];
            socket.read_exact(&mut word).map(|()| word)
        };
        let started = Instant::now();
        let first = listener.accept(handshake).unwrap();
        assert_eq!(first.unwrap(), *b"hi");
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{:?}",
            started.elapsed()
        );
        // The silent one times out in its own thread, and comes out next.
        let second = listener.accept(handshake).unwrap();
        assert_eq!(second.unwrap_err().kind(), io::ErrorKind::WouldBlock);
    }

    /// Told to stop, an accept gives up; the handshake it started goes on,
    /// and what it returns comes out of the next accept.
    #[test]
    fn a_stopped_accept_leaves_its_handshakes_to_the_next() {
        let listener = HandshakeListener::new(TcpListener::bind("127.0.0.1:0").unwrap()).unwrap();
        let mut peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let handshake = |mut socket: TcpStream, _peer: SocketAddr| {
            let mut word = [0u8; 2];
            socket.read_exact(&mut word).map(|()| word)
        };
        // The connection may reach the listener's queue a moment after
        // `connect` returns: stopped accepts until one took it.
        for _ in 0..100 {
            let stopped = listener.accept_until(handshake, || true).unwrap();
            assert!(stopped.is_none(), "nothing has finished yet");
            if listener.slots.running() == 1 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(listener.slots.running(), 1, "the peer's handshake goes on");
        peer.write_all(b"hi").unwrap();
        assert_eq!(listener.accept(handshake).unwrap().unwrap(), *b"hi");
    }
}
