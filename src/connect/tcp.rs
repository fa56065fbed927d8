//! Exchanging endpoints over TCP.
//!
//! Each side writes its 32-byte [`Endpoint`] record and reads the peer's,
//! then (after connecting its queue pair) writes one "ready" byte and waits
//! for the peer's, so neither side sends before the other can receive. Any
//! failure — garbage, a truncated record, another version, silence past the
//! timeout, a closed connection — is a clear error, never a panic or a hang.
//!
//! [`connect_qp`] and [`accept_qp`] do all of it; [`handshake`] does it
//! for a queue pair you made (one already in a ring, with receives posted);
//! [`exchange`] and [`ready`] are the steps, for protocols of your own.
//! These take a blocking stream (as `TcpStream::connect` makes one); they
//! bound their reads and writes with the socket's timeouts, and put the
//! stream's own back when done.
//!
//! ```no_run
//! use std::time::Duration;
//! use rdma_ring::backend::verbs::VerbsDevice;
//! use rdma_ring::backend::QpConfig;
//! use rdma_ring::connect::tcp;
//! let dev = VerbsDevice::open("rxe0").unwrap();
//! let pd = dev.alloc_pd().unwrap();
//! let timeout = Duration::from_secs(10);
//! // One call ...
//! let qp = tcp::connect_qp(&dev, &pd, "192.0.2.1:7471", QpConfig::default(), timeout).unwrap();
//! // ... or the steps.
//! let qp = dev.create_qp(&pd, QpConfig::default()).unwrap();
//! let mut stream = std::net::TcpStream::connect("192.0.2.1:7472").unwrap();
//! let remote = tcp::exchange(&mut stream, &qp.endpoint(), timeout).unwrap();
//! qp.connect(&remote).unwrap();
//! tcp::ready(&mut stream, timeout).unwrap();
//! ```

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::{Endpoint, ENDPOINT_WIRE_LEN};
use crate::deadline::Deadline;
use crate::error::Error;

const READY: u8 = 0x5a;

/// A handshake step's I/O failure, saying how far it got: a timeout as
/// [`Error::HandshakeTimeout`], anything else as [`Error::Handshake`].
pub(crate) fn io_error(step: &'static str, e: std::io::Error, got: usize, want: usize) -> Error {
    let reason = match e.kind() {
        ErrorKind::UnexpectedEof => {
            format!("peer closed the connection after {got} of {want} bytes")
        }
        ErrorKind::WouldBlock | ErrorKind::TimedOut => {
            return Error::HandshakeTimeout {
                step,
                reason: format!("timed out after {got} of {want} bytes"),
            };
        }
        _ => e.to_string(),
    };
    Error::Handshake { step, reason }
}

/// Reads exactly `buf.len()` bytes by `deadline` (a deadline for the whole
/// read, so a peer trickling bytes cannot stretch it).
pub(crate) fn read_exact(
    stream: &mut TcpStream,
    buf: &mut [u8],
    deadline: Deadline,
    step: &'static str,
) -> Result<(), Error> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.remaining();
        if left.is_zero() {
            return Err(io_error(step, ErrorKind::TimedOut.into(), got, buf.len()));
        }
        stream
            .set_read_timeout(Some(left))
            .map_err(|e| io_error(step, e, got, buf.len()))?;
        match stream.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(io_error(
                    step,
                    ErrorKind::UnexpectedEof.into(),
                    got,
                    buf.len(),
                ));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(io_error(step, e, got, buf.len())),
        }
    }
    Ok(())
}

/// Bounds the writes of `step` by `deadline` (a socket refuses a zero
/// timeout, so a deadline already passed is the step's timeout).
fn set_write_deadline(
    stream: &TcpStream,
    deadline: Deadline,
    step: &'static str,
    want: usize,
) -> Result<(), Error> {
    let left = deadline.remaining();
    if left.is_zero() {
        return Err(io_error(step, ErrorKind::TimedOut.into(), 0, want));
    }
    stream
        .set_write_timeout(Some(left))
        .map_err(|e| Error::Handshake {
            step: "setting socket timeouts",
            reason: e.to_string(),
        })
}

/// Sends `local` and returns the peer's endpoint, both within `timeout`.
/// An endpoint naming our own queue pair (what an echo service sends
/// back) is refused.
///
/// ```
/// use std::net::{TcpListener, TcpStream};
/// use std::time::Duration;
/// use rdma_ring::connect::{tcp, Endpoint};
/// let ep = |qpn| Endpoint { qpn, psn: 7, lid: 0, gid: [0; 16], mtu: 5, rd_atomic: 16, init_rd_atomic: 16 };
/// // (QPNs 0 and 1 are special queue pairs', never a connected one's.)
/// # let listener = TcpListener::bind("127.0.0.1:0").unwrap();
/// # let mut ours = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
/// # let (mut theirs, _) = listener.accept().unwrap();
/// let timeout = Duration::from_secs(5);
/// let peer = std::thread::spawn(move || tcp::exchange(&mut theirs, &ep(0x12), timeout).unwrap());
/// assert_eq!(tcp::exchange(&mut ours, &ep(0x11), timeout).unwrap(), ep(0x12));
/// assert_eq!(peer.join().unwrap(), ep(0x11));
/// ```
pub fn exchange(
    stream: &mut TcpStream,
    local: &Endpoint,
    timeout: Duration,
) -> Result<Endpoint, Error> {
    keeping_timeouts(stream, |stream| {
        exchange_by(stream, local, Deadline::after(timeout))
    })
}

/// Runs a step of the public handshake on the caller's `stream` and puts
/// its read and write timeouts back as they were: the steps bound their
/// reads and writes with timeouts of their own, and the stream outlives
/// them (a connection kept to watch the peer, or for a protocol of the
/// caller's).
fn keeping_timeouts<T>(
    stream: &mut TcpStream,
    step: impl FnOnce(&mut TcpStream) -> Result<T, Error>,
) -> Result<T, Error> {
    let kept = stream
        .read_timeout()
        .and_then(|read| Ok((read, stream.write_timeout()?)))
        .map_err(|e| Error::Handshake {
            step: "reading the socket's timeouts",
            reason: e.to_string(),
        })?;
    let result = step(stream);
    // A socket that took these timeouts before takes them again; should
    // it fail now, the step's own outcome says more.
    let _ = stream.set_read_timeout(kept.0);
    let _ = stream.set_write_timeout(kept.1);
    result
}

/// [`exchange`] by `deadline`, a deadline it may share with the steps
/// around it.
pub(crate) fn exchange_by(
    stream: &mut TcpStream,
    local: &Endpoint,
    deadline: Deadline,
) -> Result<Endpoint, Error> {
    let step = "sending our endpoint";
    set_write_deadline(stream, deadline, step, ENDPOINT_WIRE_LEN)?;
    stream
        .write_all(&local.encode())
        .map_err(|e| io_error(step, e, 0, ENDPOINT_WIRE_LEN))?;
    let mut record = [0u8; ENDPOINT_WIRE_LEN];
    read_exact(stream, &mut record, deadline, "reading the peer's endpoint")?;
    let remote = Endpoint::decode(&record)?;
    if (remote.qpn, remote.lid, remote.gid) == (local.qpn, local.lid, local.gid) {
        // What an echo service sends back: connected to itself, the queue
        // pair would "work" and talk to no one.
        return Err(Error::Malformed {
            what: "endpoint record",
            reason: "the peer sent back our own queue pair's (an echo, not a peer)".into(),
        });
    }
    Ok(remote)
}

/// After both queue pairs are connected: tells the peer we are ready and
/// waits until it is too.
///
/// ```
/// use std::io::Write;
/// use std::net::{TcpListener, TcpStream};
/// use std::time::Duration;
/// use rdma_ring::connect::tcp;
/// # let listener = TcpListener::bind("127.0.0.1:0").unwrap();
/// # let mut ours = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
/// # let (mut theirs, _) = listener.accept().unwrap();
/// let timeout = Duration::from_secs(5);
/// // A peer that answers anything but the ready byte is not ready.
/// theirs.write_all(b"?").unwrap();
/// let err = tcp::ready(&mut ours, timeout).unwrap_err();
/// assert!(err.to_string().contains("expected the ready byte"), "{err}");
/// ```
pub fn ready(stream: &mut TcpStream, timeout: Duration) -> Result<(), Error> {
    keeping_timeouts(stream, |stream| ready_by(stream, Deadline::after(timeout)))
}

/// [`ready`] by `deadline`, a deadline it may share with the steps before
/// it.
pub(crate) fn ready_by(stream: &mut TcpStream, deadline: Deadline) -> Result<(), Error> {
    let step = "sending ready";
    set_write_deadline(stream, deadline, step, 1)?;
    stream
        .write_all(&[READY])
        .map_err(|e| io_error(step, e, 0, 1))?;
    let mut byte = [0u8; 1];
    read_exact(
        stream,
        &mut byte,
        deadline,
        "waiting for the peer to be ready",
    )?;
    if byte[0] != READY {
        return Err(Error::Handshake {
            step: "waiting for the peer to be ready",
            reason: format!("expected the ready byte {READY:#04x}, got {:#04x}", byte[0]),
        });
    }
    Ok(())
}

/// Over an open TCP stream: sends `qp`'s endpoint, connects `qp` to the
/// peer's (INIT → RTR → RTS), then exchanges "ready" with the peer. `qp`
/// may already be in a ring, with the receives the peer's first messages
/// need posted (through [`Ring::qp`](crate::ring::Ring::qp)): neither side
/// sends before the other said it is ready, so those receives are in place
/// in time. All of it is done within `timeout`: a peer that answers each
/// step just in time cannot stretch it.
///
/// ```no_run
/// use std::time::Duration;
/// use rdma_ring::backend::verbs::VerbsDevice;
/// use rdma_ring::backend::QpConfig;
/// use rdma_ring::buf::RegisteredBuf;
/// use rdma_ring::connect::tcp;
/// use rdma_ring::op::Recv;
/// use rdma_ring::ring::{Ring, RingConfig};
/// let dev = VerbsDevice::open("rxe0").unwrap();
/// let pd = dev.alloc_pd().unwrap();
/// let listener = std::net::TcpListener::bind("0.0.0.0:7471").unwrap();
/// let (mut stream, _) = listener.accept().unwrap();
/// let mut ring = Ring::new(dev.create_qp(&pd, QpConfig::default()).unwrap(), RingConfig::default());
/// ring.submission().push(Recv::new(RegisteredBuf::new(&pd, vec![0u8; 4096]).unwrap())).unwrap();
/// ring.submit().unwrap(); // posted in INIT, before the peer can send
/// tcp::handshake(&mut stream, ring.qp(), Duration::from_secs(10)).unwrap();
/// ```
#[cfg(feature = "verbs")]
pub fn handshake(
    stream: &mut TcpStream,
    qp: &crate::backend::verbs::VerbsQp,
    timeout: Duration,
) -> Result<(), Error> {
    keeping_timeouts(stream, |stream| {
        handshake_by(stream, qp, Deadline::after(timeout))
    })
}

/// [`handshake`] by `deadline`, a deadline it may share with the steps
/// around it (the hellos of the layers above, say).
#[cfg(feature = "verbs")]
pub(crate) fn handshake_by(
    stream: &mut TcpStream,
    qp: &crate::backend::verbs::VerbsQp,
    deadline: Deadline,
) -> Result<(), Error> {
    connect_by(stream, &qp.endpoint(), deadline, |remote| {
        qp.connect(remote)
    })
}

/// The handshake around `connect`, which connects our queue pair (whose
/// endpoint is `local`) to the peer's: every step by the one `deadline`,
/// so that a peer answering each step just in time cannot stretch the
/// whole (and hold a listener's handshake slot) to a timeout per step.
#[cfg_attr(not(feature = "verbs"), allow(dead_code))]
pub(crate) fn connect_by(
    stream: &mut TcpStream,
    local: &Endpoint,
    deadline: Deadline,
    connect: impl FnOnce(&Endpoint) -> Result<(), Error>,
) -> Result<(), Error> {
    let remote = exchange_by(stream, local, deadline)?;
    connect(&remote)?;
    ready_by(stream, deadline)
}

/// Connects a new queue pair (with a completion queue of its own) to the
/// peer listening at `addr`: TCP connect, then [`handshake`], both within
/// `timeout`. To post
/// receives before the peer may send, or to put the queue pair on a shared
/// completion queue, [`dial`] and [`handshake`] yourself.
///
/// ```no_run
/// // Needs an RDMA device, so it is compiled but not run here.
/// use std::time::Duration;
/// use rdma_ring::backend::verbs::VerbsDevice;
/// use rdma_ring::backend::QpConfig;
/// use rdma_ring::connect::tcp;
/// let dev = VerbsDevice::open("rxe0").unwrap();
/// let pd = dev.alloc_pd().unwrap();
/// let timeout = Duration::from_secs(10);
/// let qp = tcp::connect_qp(&dev, &pd, "192.0.2.1:7471", QpConfig::default(), timeout).unwrap();
/// assert!(qp.is_connected());
/// ```
#[cfg(feature = "verbs")]
pub fn connect_qp(
    dev: &crate::backend::verbs::VerbsDevice,
    pd: &crate::backend::verbs::VerbsPd,
    addr: impl std::net::ToSocketAddrs,
    config: crate::backend::QpConfig,
    timeout: Duration,
) -> Result<crate::backend::verbs::VerbsQp, Error> {
    // One deadline for the dial and the handshake.
    let deadline = Deadline::after(timeout);
    let mut stream = dial(addr, deadline.remaining())?;
    let qp = dev.create_qp(pd, config)?;
    handshake_by(&mut stream, &qp, deadline)?;
    Ok(qp)
}

/// Opens a TCP stream to the first of `addr`'s addresses that answers,
/// within `timeout` for them all, for a [`handshake`]. A host name is resolved
/// first, by the system's resolver, whose own timeouts apply (`timeout`
/// does not bound them): give an address where that matters.
///
/// ```
/// use std::net::TcpListener;
/// use std::time::Duration;
/// use rdma_ring::connect::tcp;
/// let listener = TcpListener::bind("127.0.0.1:0").unwrap();
/// let addr = listener.local_addr().unwrap();
/// let stream = tcp::dial(addr, Duration::from_secs(5)).unwrap();
/// assert_eq!(stream.peer_addr().unwrap(), addr);
/// drop(listener);
/// // Nothing listens there now: an error, not a hang.
/// assert!(tcp::dial(addr, Duration::from_secs(5)).is_err());
/// ```
pub fn dial(addr: impl std::net::ToSocketAddrs, timeout: Duration) -> Result<TcpStream, Error> {
    let failed = |e: std::io::Error| {
        let step = "connecting over TCP";
        let reason = e.to_string();
        match e.kind() {
            ErrorKind::TimedOut | ErrorKind::WouldBlock => Error::HandshakeTimeout { step, reason },
            _ => Error::Handshake { step, reason },
        }
    };
    let deadline = Deadline::after(timeout);
    let mut last = None;
    for addr in addr.to_socket_addrs().map_err(failed)? {
        let left = deadline.remaining();
        if left.is_zero() {
            last = Some(std::io::Error::new(
                ErrorKind::TimedOut,
                format!("no address answered within {timeout:?}"),
            ));
            break;
        }
        match TcpStream::connect_timeout(&addr, left) {
            Ok(stream) => return Ok(stream),
            Err(e) => last = Some(e),
        }
    }
    Err(failed(last.unwrap_or_else(|| {
        std::io::Error::other("the address resolved to nothing")
    })))
}

/// Accepts one peer on `listener` and connects a new queue pair (with a
/// completion queue of its own) to it: the other half of [`connect_qp`].
/// The accept itself waits for as long as the listener does (make it
/// non-blocking to poll: with no peer waiting, it fails at once with
/// [`Error::HandshakeTimeout`]); the handshake after that is bounded by
/// `timeout`. To post receives first, accept and [`handshake`] yourself.
///
/// ```no_run
/// // Needs an RDMA device, so it is compiled but not run here.
/// use std::net::TcpListener;
/// use std::time::Duration;
/// use rdma_ring::backend::verbs::VerbsDevice;
/// use rdma_ring::backend::QpConfig;
/// use rdma_ring::connect::tcp;
/// let dev = VerbsDevice::open("rxe0").unwrap();
/// let pd = dev.alloc_pd().unwrap();
/// let listener = TcpListener::bind("0.0.0.0:7471").unwrap();
/// let qp = tcp::accept_qp(&listener, &dev, &pd, QpConfig::default(), Duration::from_secs(10)).unwrap();
/// assert!(qp.is_connected());
/// ```
#[cfg(feature = "verbs")]
pub fn accept_qp(
    listener: &std::net::TcpListener,
    dev: &crate::backend::verbs::VerbsDevice,
    pd: &crate::backend::verbs::VerbsPd,
    config: crate::backend::QpConfig,
    timeout: Duration,
) -> Result<crate::backend::verbs::VerbsQp, Error> {
    let (mut stream, _) = listener.accept().map_err(accept_failure)?;
    let qp = dev.create_qp(pd, config)?;
    handshake(&mut stream, &qp, timeout)?;
    Ok(qp)
}

/// What a failed TCP `accept` means: no peer waiting (a non-blocking
/// listener), one peer's failure (a handshake error: accept again), or
/// the listener's own (out of descriptors, say: accepting again would
/// spin on it).
#[cfg(feature = "verbs")]
fn accept_failure(e: std::io::Error) -> Error {
    let step = "accepting over TCP";
    if e.kind() == std::io::ErrorKind::WouldBlock {
        Error::HandshakeTimeout {
            step,
            reason: "no peer is waiting (the listener does not block)".into(),
        }
    } else if super::accept::one_peer_s_failure(&e) {
        Error::Handshake {
            step,
            reason: e.to_string(),
        }
    } else {
        Error::Verbs {
            verb: "accept (the TCP listener)",
            source: e,
        }
    }
}

/// Whether the peer's end of a (non-blocking) handshake socket closed: the
/// peer's process died, or it let the connection go. Both sides keep the
/// socket open for the connection's life to learn this. Nothing more is
/// said on it after the handshake: bytes the peer sends anyway are read
/// and dropped, so that they cannot hide its end.
///
/// ```
/// use std::io::Write;
/// use std::net::{TcpListener, TcpStream};
/// use rdma_ring::connect::tcp::peer_closed;
/// let listener = TcpListener::bind("127.0.0.1:0").unwrap();
/// let ours = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
/// ours.set_nonblocking(true).unwrap();
/// let (mut theirs, _) = listener.accept().unwrap();
/// assert!(!peer_closed(&ours));
/// theirs.write_all(b"stray").unwrap(); // said, then gone
/// drop(theirs);
/// # std::thread::sleep(std::time::Duration::from_millis(50));
/// assert!(peer_closed(&ours));
/// ```
pub fn peer_closed(socket: &std::net::TcpStream) -> bool {
    use std::io::Read;
    let mut dropped = [0u8; 256];
    // Bounded, so that a peer that never stops sending cannot hold the
    // caller here: what is left is read at the next look.
    for _ in 0..16 {
        match (&*socket).read(&mut dropped) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return e.kind() != std::io::ErrorKind::WouldBlock,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A failed accept is a peer's failure only when a peer caused it:
    /// the listener out of descriptors is its own, so that a caller that
    /// accepts again after a peer's failure does not spin on it.
    #[cfg(feature = "verbs")]
    #[test]
    fn a_listener_out_of_descriptors_is_not_a_peer_s_failure() {
        let own = accept_failure(std::io::Error::from_raw_os_error(libc::EMFILE));
        assert!(matches!(own, Error::Verbs { .. }), "{own:?}");
        let peer = accept_failure(std::io::Error::from_raw_os_error(libc::ECONNABORTED));
        assert!(matches!(peer, Error::Handshake { .. }), "{peer:?}");
        let none = accept_failure(std::io::ErrorKind::WouldBlock.into());
        assert!(matches!(none, Error::HandshakeTimeout { .. }), "{none:?}");
    }

    /// An endpoint told apart by `n` (its QPN, 0x10 + `n`).
    fn endpoint(n: u32) -> Endpoint {
        Endpoint {
            qpn: 0x10 + n,
            psn: 7,
            lid: 0,
            gid: [1; 16],
            mtu: 5,
            rd_atomic: 16,
            init_rd_atomic: 16,
        }
    }

    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        (client, server)
    }

    /// A service that echoes what it reads (a wrong port) sends back our
    /// own endpoint: refused, rather than connecting the queue pair to
    /// itself.
    #[test]
    fn an_echo_is_not_a_peer() {
        let (mut a, b) = pair();
        std::thread::spawn(move || {
            let mut reader = b.try_clone().unwrap();
            let mut writer = b;
            let _ = std::io::copy(&mut reader, &mut writer);
        });
        let err = exchange(&mut a, &endpoint(1), Duration::from_secs(5)).unwrap_err();
        assert!(err.to_string().contains("echo"), "{err}");
    }

    #[test]
    fn both_sides_learn_each_other() {
        let (mut a, mut b) = pair();
        let t = std::thread::spawn(move || {
            let got = exchange(&mut b, &endpoint(2), Duration::from_secs(5)).unwrap();
            ready(&mut b, Duration::from_secs(5)).unwrap();
            got
        });
        let got = exchange(&mut a, &endpoint(1), Duration::from_secs(5)).unwrap();
        ready(&mut a, Duration::from_secs(5)).unwrap();
        assert_eq!(got, endpoint(2));
        assert_eq!(t.join().unwrap(), endpoint(1));
    }

    fn peer_sends(bytes: &'static [u8], then_close: bool) -> Error {
        let (mut a, mut b) = pair();
        let t = std::thread::spawn(move || {
            // A peer that reads our record, then answers with `bytes`.
            let mut ours = [0u8; ENDPOINT_WIRE_LEN];
            b.read_exact(&mut ours).unwrap();
            b.write_all(bytes).unwrap();
            if !then_close {
                std::thread::sleep(Duration::from_millis(500));
            }
        });
        let err = exchange(&mut a, &endpoint(1), Duration::from_millis(200)).unwrap_err();
        t.join().unwrap();
        err
    }

    #[test]
    fn a_peer_trickling_bytes_cannot_stretch_the_deadline() {
        let (mut a, mut b) = pair();
        let t = std::thread::spawn(move || {
            // A byte every 100 ms: each read would be in time, the whole
            // (3.2 s) never.
            for _ in 0..32 {
                if b.write_all(&[7]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let start = std::time::Instant::now();
        let mut buf = [0u8; 32];
        let err = read_exact(
            &mut a,
            &mut buf,
            Deadline::after(Duration::from_millis(200)),
            "reading a hello",
        )
        .unwrap_err();
        assert!(matches!(err, Error::HandshakeTimeout { .. }), "{err:?}");
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "the deadline stretched to {:?}",
            start.elapsed()
        );
        drop(a);
        t.join().unwrap();
    }

    /// A peer that answers each step of the handshake just in time for a
    /// deadline per step runs out of the one deadline of the whole.
    #[test]
    fn a_peer_answering_each_step_just_in_time_cannot_stretch_the_handshake() {
        let (mut a, mut b) = pair();
        // Each step in time for 2 s; the two of them are not.
        let (first, second) = (Duration::from_millis(300), Duration::from_millis(1800));
        let t = std::thread::spawn(move || {
            let mut theirs = [0u8; ENDPOINT_WIRE_LEN];
            b.read_exact(&mut theirs).unwrap();
            std::thread::sleep(first);
            b.write_all(&endpoint(2).encode()).unwrap();
            let mut ready = [0u8; 1];
            // Our ready byte: we send it, then wait for the peer's.
            if b.read_exact(&mut ready).is_ok() {
                std::thread::sleep(second);
                let _ = b.write_all(&[READY]);
            }
        });
        let mut connected = None;
        let err = connect_by(
            &mut a,
            &endpoint(1),
            Deadline::after(Duration::from_secs(2)),
            |remote| {
                connected = Some(*remote);
                Ok(())
            },
        )
        .unwrap_err();
        assert_eq!(connected, Some(endpoint(2)));
        assert!(matches!(err, Error::HandshakeTimeout { .. }), "{err:?}");
        assert!(err.to_string().contains("ready"), "{err}");
        drop(a);
        t.join().unwrap();
    }

    /// The public steps leave the caller's stream with the timeouts it
    /// had, whatever their outcome.
    #[test]
    fn the_steps_put_the_stream_s_timeouts_back() {
        let (mut a, mut b) = pair();
        a.set_read_timeout(Some(Duration::from_secs(7))).unwrap();
        let t = std::thread::spawn(move || {
            let theirs = exchange(&mut b, &endpoint(2), Duration::from_secs(10)).unwrap();
            ready(&mut b, Duration::from_secs(10)).unwrap();
            (b, theirs)
        });
        assert_eq!(
            exchange(&mut a, &endpoint(1), Duration::from_secs(10)).unwrap(),
            endpoint(2)
        );
        let kept = |s: &TcpStream| (s.read_timeout().unwrap(), s.write_timeout().unwrap());
        assert_eq!(kept(&a), (Some(Duration::from_secs(7)), None));
        ready(&mut a, Duration::from_secs(10)).unwrap();
        assert_eq!(kept(&a), (Some(Duration::from_secs(7)), None));
        let (b, theirs) = t.join().unwrap();
        assert_eq!(theirs, endpoint(1));
        assert_eq!(kept(&b), (None, None));
        // A step that fails puts them back too.
        drop(b);
        assert!(ready(&mut a, Duration::from_secs(10)).is_err());
        assert_eq!(kept(&a), (Some(Duration::from_secs(7)), None));
    }

    #[test]
    fn garbage_truncation_other_versions_and_silence_are_clear_errors() {
        let garbage = peer_sends(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n12345", true).to_string();
        assert!(garbage.contains("magic"), "{garbage}");
        let truncated = peer_sends(b"RE\x01\x05", true).to_string();
        assert!(
            truncated.contains("closed the connection after 4 of 32"),
            "{truncated}"
        );
        let mut v2 = endpoint(1).encode();
        v2[2] = 2;
        let v2: &'static [u8] = Box::leak(Box::new(v2));
        let version = peer_sends(v2, true).to_string();
        assert!(version.contains("version 2"), "{version}");
        let silence = peer_sends(b"", false);
        // A timeout is told apart from a refusal (a stream reports it as
        // `TimedOut`, a listener waits on).
        assert!(
            matches!(silence, Error::HandshakeTimeout { .. }),
            "{silence:?}"
        );
        let silence = silence.to_string();
        assert!(silence.contains("timed out after 0 of 32"), "{silence}");
        let truncated = peer_sends(b"RE\x01\x05", true);
        assert!(
            matches!(truncated, Error::Handshake { .. }),
            "{truncated:?}"
        );
    }
}
