//! What the server runs for each request: a [`Handler`] (on the poller
//! thread, synchronously) or an [`AsyncHandler`] (futures the poller
//! thread polls).

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;

/// Who made a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The server's name for the connection, unique for the server's life.
    pub client_id: u32,
    /// The client's address, when the connection was made over a network
    /// handshake.
    pub peer: Option<SocketAddr>,
    /// The server-side queue pair number of the connection.
    pub qp_num: u32,
}

/// A handler's refusal: the caller gets
/// [`RpcError::Handler`](super::RpcError::Handler) with this text (cut to
/// 256 bytes).
///
/// ```
/// use rdma_ring::rpc::HandlerError;
/// let e = HandlerError::new("no such key");
/// assert_eq!(e.to_string(), "no such key");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandlerError(String);

impl HandlerError {
    /// An error with `text`.
    pub fn new(text: impl Into<String>) -> Self {
        HandlerError(text.into())
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for HandlerError {}

/// Turns a request into a response, on the server's poller thread: while
/// it runs, no other connection is served, so it should be quick (hand
/// slow work to an [`AsyncHandler`]). `response` arrives empty, with the
/// capacity a previous call left, so a handler that writes into it
/// allocates nothing per call.
///
/// A panic is caught: the caller gets
/// [`RpcError::Panicked`](super::RpcError::Panicked) and the server
/// serves on with the same handler.
///
/// The poller holds the server's state while a handler runs, so a handler
/// must not call its own server's methods (`stats`, `failure`,
/// `connect_soft`, `shutdown`): they wait for that state, for ever. Send
/// such work to another thread.
///
/// Closures of the right shape are handlers:
///
/// ```
/// use rdma_ring::rpc::{Caller, Handler, HandlerError};
/// let mut echo = |_: &Caller, req: &[u8], resp: &mut Vec<u8>| -> Result<(), HandlerError> {
///     resp.extend_from_slice(req);
///     Ok(())
/// };
/// let caller = Caller { client_id: 1, peer: None, qp_num: 7 };
/// let mut out = Vec::new();
/// echo.handle(&caller, b"hi", &mut out).unwrap();
/// assert_eq!(out, b"hi");
/// ```
pub trait Handler: Send + 'static {
    /// Handles one request.
    fn handle(
        &mut self,
        caller: &Caller,
        request: &[u8],
        response: &mut Vec<u8>,
    ) -> Result<(), HandlerError>;
}

impl<F> Handler for F
where
    F: FnMut(&Caller, &[u8], &mut Vec<u8>) -> Result<(), HandlerError> + Send + 'static,
{
    fn handle(
        &mut self,
        caller: &Caller,
        request: &[u8],
        response: &mut Vec<u8>,
    ) -> Result<(), HandlerError> {
        self(caller, request, response)
    }
}

/// A response on its way.
pub type ResponseFuture = Pin<Box<dyn Future<Output = Result<Vec<u8>, HandlerError>> + Send>>;

/// Turns a request into a future of its response. The futures run on the
/// server's poller thread, between its passes over the completion queue,
/// so they must not block (and must be `Send`: the server may be moved
/// between threads before it starts); a future woken from elsewhere (a timer, a
/// channel) is polled within a millisecond. Many may be pending at once:
/// responses go out in the order they finish. A panic in `call` or in the
/// future is caught as for [`Handler`]. Neither `call` nor the future may
/// call its own server's methods, as for [`Handler`].
///
/// ```
/// use rdma_ring::rpc::{AsyncHandler, Caller, HandlerError, ResponseFuture};
/// struct Upper;
/// impl AsyncHandler for Upper {
///     fn call(&mut self, _caller: Caller, request: Vec<u8>) -> ResponseFuture {
///         Box::pin(async move { Ok(request.to_ascii_uppercase()) })
///     }
/// }
/// let caller = Caller { client_id: 1, peer: None, qp_num: 7 };
/// let got = futures::executor::block_on(Upper.call(caller, b"hi".to_vec())).unwrap();
/// assert_eq!(got, b"HI");
/// ```
pub trait AsyncHandler: Send + 'static {
    /// Starts handling one request.
    fn call(&mut self, caller: Caller, request: Vec<u8>) -> ResponseFuture;
}
