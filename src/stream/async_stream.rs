//! The async stream: `futures-io`'s `AsyncRead`/`AsyncWrite` (and tokio's,
//! behind the `tokio` feature) over the futures adapter.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use futures_core::Stream;

use super::blocking::{to_io, StreamCore};
use super::connection::{Connection, Failure, ReadOutcome};
use super::RdmaStream;
use crate::backend::{CompletionQueue, QueuePair};
use crate::error::Error;
use crate::future::{AsyncRing, CompletionStream, Driver, Wakeup};
use crate::ring::RingStats;

/// A connected byte stream over RDMA for any executor: `futures-io`'s
/// `AsyncRead` and `AsyncWrite`, and tokio's with the `tokio` feature (so
/// `tokio::io::copy`, codecs and TLS wrappers work unchanged).
///
/// Made from an established [`RdmaStream`] with
/// [`RdmaStream::into_async`]; the [`Wakeup`] chosen there says what
/// notices completions ([`Wakeup::Thread`] works everywhere; with
/// [`Wakeup::Reactor`], drive its [`driver`](Self::driver) from your reactor).
///
/// The reading and the writing task may differ (e.g. after
/// `tokio::io::split`): each is woken on its own. A dead peer is noticed by
/// the keep-alive probe, which runs whenever the stream is polled: with
/// [`Wakeup::Thread`] the notifier wakes a waiting task every quarter
/// second, so a dead peer fails any wait (read, write, flush, close) in
/// bounded time; with [`Wakeup::Reactor`] nothing polls a stream whose
/// peer went silent, so bound such waits with your executor's timeout.
/// Close it with `close`/`shutdown` to send the end of stream after what
/// was written: it resolves once both arrived, or at once while bytes
/// wait for us to read them (the peer may not take the rest before we
/// do), and then the rest and the end go as reads make room — so keep
/// reading, or drop the stream. Dropping it tries for up to
/// [`linger`](super::StreamConfig::linger), blocking the thread.
///
/// ```
/// use futures::{AsyncReadExt, AsyncWriteExt};
/// use rdma_ring::backend::soft::SoftDevice;
/// use rdma_ring::future::Wakeup;
/// use rdma_ring::stream::{RdmaStream, StreamConfig};
///
/// let (a, b) = RdmaStream::soft_pair(&SoftDevice::new(), StreamConfig::default()).unwrap();
/// let (mut a, mut b) = (a.into_async(Wakeup::Busy).unwrap(), b.into_async(Wakeup::Busy).unwrap());
/// futures::executor::block_on(async {
///     a.write_all(b"ping").await.unwrap();
///     a.close().await.unwrap();
///     let mut got = Vec::new();
///     b.read_to_end(&mut got).await.unwrap();
///     assert_eq!(got, b"ping");
/// });
/// ```
pub struct AsyncRdmaStream<Q: QueuePair + Send + 'static> {
    ring: AsyncRing<Q>,
    completions: CompletionStream<Q>,
    conn: Connection,
    wakers: Arc<TaskWakers>,
    linger: Duration,
}

/// The reading and the writing task's wakers: one completion wakes both.
#[derive(Default)]
struct TaskWakers {
    slots: Mutex<[Option<Waker>; 2]>,
}

const READER: usize = 0;
const WRITER: usize = 1;

impl TaskWakers {
    fn set(&self, which: usize, waker: &Waker) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if !slots[which].as_ref().is_some_and(|w| w.will_wake(waker)) {
            slots[which] = Some(waker.clone());
        }
    }
}

impl Wake for TaskWakers {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let taken = {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            [slots[READER].take(), slots[WRITER].take()]
        };
        crate::wakers::wake_all(taken.into_iter().flatten());
    }
}

impl<Q: QueuePair + Send + 'static> AsyncRdmaStream<Q> {
    pub(super) fn from_blocking(stream: RdmaStream<Q>, wakeup: Wakeup) -> io::Result<Self> {
        // What could refuse the ring is checked while the stream still
        // holds it: refused, the stream is dropped as any stream is,
        // lingering to deliver what was written and then ending in order,
        // rather than torn down with its written bytes.
        if wakeup != Wakeup::Busy {
            let events = stream.core().ring.cq().completion_events().ok_or_else(|| {
                to_io(Error::Soft(
                    "this completion queue has no completion channel; use Wakeup::Busy",
                ))
            })?;
            events.arm().map_err(to_io)?;
        }
        let (core, linger) = stream.into_core();
        let (ring, conn) = core.into_parts();
        let ring = match AsyncRing::new_or_back(ring, wakeup) {
            Ok(ring) => ring,
            // No notifier thread to be had: the stream closes as a
            // dropped one does.
            Err((e, ring)) => {
                StreamCore::from_parts(*ring, conn).linger(linger);
                return Err(to_io(e));
            }
        };
        let completions = ring.completions();
        Ok(AsyncRdmaStream {
            ring,
            completions,
            conn,
            wakers: Arc::default(),
            linger,
        })
    }

    /// A driver for the stream's ring, for your reactor under
    /// [`Wakeup::Reactor`]: wait until its
    /// [`completion_fd`](Driver::completion_fd) is readable, then
    /// [`drive`](Driver::drive).
    ///
    /// The ring itself is not lent out: an operation pushed to it, or a
    /// completion taken from it, behind the stream's back would take the
    /// peer's bytes from the stream.
    ///
    /// ```
    /// use rdma_ring::backend::soft::SoftDevice;
    /// use rdma_ring::future::Wakeup;
    /// use rdma_ring::stream::{RdmaStream, StreamConfig};
    ///
    /// let (a, _b) = RdmaStream::soft_pair(&SoftDevice::new(), StreamConfig::default()).unwrap();
    /// let a = a.into_async(Wakeup::Reactor).unwrap();
    /// let driver = a.driver();
    /// assert!(driver.completion_fd().is_some());
    /// driver.drive().unwrap();
    /// ```
    pub fn driver(&self) -> Driver<Q> {
        self.ring.driver()
    }

    /// What the stream's ring did (doorbells, work requests, completions).
    ///
    /// ```
    /// # use rdma_ring::backend::soft::SoftDevice;
    /// # use rdma_ring::future::Wakeup;
    /// # use rdma_ring::stream::{RdmaStream, StreamConfig};
    /// let (a, _b) = RdmaStream::soft_pair(&SoftDevice::new(), StreamConfig::default()).unwrap();
    /// let a = a.into_async(Wakeup::Busy).unwrap();
    /// assert!(a.ring_stats().recv_wrs > 0); // its receives are posted
    /// ```
    pub fn ring_stats(&self) -> RingStats {
        self.ring.with_ring(|ring| ring.stats())
    }

    /// Bytes received and not read yet.
    pub fn readable(&self) -> usize {
        self.conn.readable()
    }

    /// Applies every completion ready now (asking to be woken, through
    /// both tasks' wakers, when the next arrives), then pushes and submits
    /// whatever may go.
    fn turn(&mut self) {
        let failed = self.conn.failure().is_some();
        let waker = Waker::from(Arc::clone(&self.wakers));
        let mut cx = Context::from_waker(&waker);
        loop {
            match Pin::new(&mut self.completions).poll_next(&mut cx) {
                Poll::Ready(Some(c)) => self.conn.on_completion(c),
                Poll::Ready(None) => {
                    self.conn
                        .fail(Failure::Transport("the stream's ring was closed".into()));
                    break;
                }
                Poll::Pending => break,
            }
        }
        let conn = &mut self.conn;
        self.ring.with_ring(|mut ring| {
            // A ring whose completion queue or device failed gives nothing
            // more back: the stream fails, as a blocking one does when its
            // reap fails, rather than waiting for ever. (What it reaped
            // before is applied above.)
            if let Some(why) = ring.failure() {
                conn.fail(Failure::Transport(format!(
                    "the stream's ring failed: {why}"
                )));
            }
            let pushed = conn.pump(&mut ring.submission());
            if pushed {
                if let Err(e) = ring.submit() {
                    conn.fail(Failure::Transport(e.error.to_string()));
                }
            }
            if conn.take_fail_qp() {
                if let Some(qp) = ring.default_qp() {
                    let _ = ring.fail_qp(qp);
                }
            }
        });
        // A failure found here may come with no completion to wake the
        // other task (a failed completion queue gives none): it is woken
        // to see the failure.
        if !failed && self.conn.failure().is_some() {
            self.wakers.wake_by_ref();
        }
    }

    /// `AsyncRead::poll_read`, shared by the futures-io and tokio impls.
    fn read_some(&mut self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        self.wakers.set(READER, cx.waker());
        self.turn();
        match self.conn.read(buf) {
            Err(e) => Poll::Ready(Err(e)),
            Ok(ReadOutcome::Bytes(n)) => {
                // Post the emptied buffers again and grant them now.
                self.turn();
                Poll::Ready(Ok(n))
            }
            Ok(ReadOutcome::End) => Poll::Ready(Ok(0)),
            Ok(ReadOutcome::Empty) => Poll::Pending,
        }
    }

    fn write_some(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        self.wakers.set(WRITER, cx.waker());
        self.turn();
        match self.conn.write(buf) {
            Err(e) => Poll::Ready(Err(e)),
            Ok(0) => Poll::Pending,
            Ok(n) => {
                self.turn();
                Poll::Ready(Ok(n))
            }
        }
    }

    fn flush_all(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.wakers.set(WRITER, cx.waker());
        self.turn();
        if let Some(failure) = self.conn.failure() {
            return Poll::Ready(Err(failure.to_io()));
        }
        if self.conn.unsent() {
            Poll::Pending
        } else {
            Poll::Ready(Ok(()))
        }
    }

    fn close_write(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.wakers.set(WRITER, cx.waker());
        self.conn.shutdown_write();
        self.turn();
        // Ready once the end of stream is done, and fine only if it and
        // the bytes before it arrived.
        if self.conn.fin_done() && self.conn.sends_arrived() {
            return Poll::Ready(Ok(()));
        }
        if let Some(failure) = self.conn.failure() {
            return Poll::Ready(Err(failure.to_io()));
        }
        if !self.conn.fin_sent() && self.conn.readable() > 0 {
            // The peer may be waiting for us to read before it takes the
            // rest: ready now, as the blocking stream's shutdown is, and
            // the rest goes as reads make room (or in the drop's linger).
            return Poll::Ready(Ok(()));
        }
        Poll::Pending
    }
}

impl<Q: QueuePair + Send + 'static> futures_io::AsyncRead for AsyncRdmaStream<Q> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().read_some(cx, buf)
    }
}

impl<Q: QueuePair + Send + 'static> futures_io::AsyncWrite for AsyncRdmaStream<Q> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().write_some(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().flush_all(cx)
    }

    /// Sends the end of stream after everything written, and is ready once
    /// its send has completed: `Ok` if it and every byte before it
    /// arrived, the connection's failure if a send of them failed. When
    /// the end of stream cannot go yet while bytes the peer sent wait here
    /// unread, it is ready at once, as
    /// [`RdmaStream::shutdown`](super::RdmaStream::shutdown) says why.
    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().close_write(cx)
    }
}

#[cfg(feature = "tokio")]
impl<Q: QueuePair + Send + 'static> tokio::io::AsyncRead for AsyncRdmaStream<Q> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let unfilled = buf.initialize_unfilled();
        match this.read_some(cx, unfilled) {
            Poll::Ready(Ok(n)) => {
                buf.advance(n);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(feature = "tokio")]
impl<Q: QueuePair + Send + 'static> tokio::io::AsyncWrite for AsyncRdmaStream<Q> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().write_some(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().flush_all(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().close_write(cx)
    }
}

impl<Q: QueuePair + Send + 'static> Drop for AsyncRdmaStream<Q> {
    fn drop(&mut self) {
        // As the blocking stream does: let what was written and the end of
        // stream leave before the ring's teardown could flush them, and
        // drop what arrives meanwhile (nobody will read it), so a peer
        // blocked writing to us goes on.
        if !self.conn.established() {
            return;
        }
        self.conn.shutdown_read();
        self.conn.shutdown_write();
        let deadline = Instant::now().checked_add(self.linger);
        loop {
            self.turn();
            let sent = self.conn.fin_done();
            if sent || self.conn.failure().is_some() {
                return;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return;
            }
            let _ = self.ring.drive();
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

impl<Q: QueuePair + Send + 'static> std::fmt::Debug for AsyncRdmaStream<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncRdmaStream")
            .field("connection", &self.conn)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use crate::backend::soft::SoftDevice;
    use crate::future::{Wakeup, REFUSE_NEXT_SPAWN};
    use crate::stream::{RdmaStream, StreamConfig};

    /// A conversion refused because no notifier thread could start closes
    /// the stream as a dropped one does: what was written, held back by
    /// the peer's full buffers, is delivered, then the end of stream.
    #[test]
    fn a_conversion_without_a_thread_delivers_what_was_written() {
        let config = StreamConfig {
            chunk_size: 64,
            recv_buffers: 4,
            send_buffers: 4,
            ..StreamConfig::default()
        };
        let (mut a, mut b) = RdmaStream::soft_pair(&SoftDevice::new(), config).unwrap();
        a.set_nonblocking(true);
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        let mut written = 0;
        while let Ok(n) = a.write(&data[written..]) {
            written += n;
        }
        assert!(written < data.len(), "nothing held the writer back");
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            b.read_to_end(&mut got).map(|_| got)
        });
        REFUSE_NEXT_SPAWN.with(|refuse| refuse.set(true));
        let err = a.into_async(Wakeup::Thread).unwrap_err();
        assert!(err.to_string().contains("refused by a test"), "{err}");
        let got = reader.join().unwrap().expect("the end of stream, in order");
        assert!(
            got == data[..written],
            "got {} of {written} bytes",
            got.len()
        );
    }
}
