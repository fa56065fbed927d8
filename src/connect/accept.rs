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
    running: Arc<AtomicUsize>,
}

impl<T: Send + 'static> HandshakeListener<T> {
    pub(crate) fn new(tcp: TcpListener) -> io::Result<Self> {
        tcp.set_nonblocking(true)?;
        let (finish, finished) = mpsc::channel();
        Ok(HandshakeListener {
            tcp,
            finished: Mutex::new(finished),
            finish,
            running: Arc::new(AtomicUsize::new(0)),
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
        let finished = self.finished.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Ok(done) = finished.try_recv() {
                return Ok(done);
            }
            if self.running.load(Ordering::Acquire) < MAX_HANDSHAKES {
                match self.tcp.accept() {
                    Ok((socket, peer)) => {
                        self.start(socket, peer, handshake.clone())?;
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            }
            match finished.recv_timeout(ACCEPT_TICK) {
                Ok(done) => return Ok(done),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => unreachable!("the listener holds a sender"),
            }
        }
    }

    fn start<F>(&self, socket: TcpStream, peer: SocketAddr, handshake: F) -> io::Result<()>
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
        self.running.fetch_add(1, Ordering::AcqRel);
        let running = Arc::clone(&self.running);
        let finish = self.finish.clone();
        let started = std::thread::Builder::new()
            .name("rdma-ring-handshake".into())
            .spawn(move || {
                // Counted down however the handshake ends, a panic included.
                let _slot = Slot(running);
                // A listener dropped meanwhile drops what it would have
                // handed out.
                let _ = finish.send(handshake(socket, peer));
            });
        if let Err(e) = started {
            self.running.fetch_sub(1, Ordering::AcqRel);
            return Err(e);
        }
        Ok(())
    }
}

/// A handshake in progress, counted while it lives.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl<T> std::fmt::Debug for HandshakeListener<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandshakeListener")
            .field("tcp", &self.tcp)
            .field("running", &self.running.load(Ordering::Relaxed))
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
}
