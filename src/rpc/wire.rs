//! The RPC wire format: every message is one SEND whose first
//! [`HEADER_LEN`] bytes are a [`Header`]; what follows depends on its
//! [`Kind`]. Strictly decoded: a peer is untrusted input.
//!
//! ```text
//! 0       2         3      4          8             16            24
//! | "RC"  | version | kind | len: u32 | call id: u64 | aux: u64    | body…
//! ```
//!
//! All integers are little-endian. `len` is the length of the call's
//! message: of the body for inline kinds, of the remote buffer for the
//! rendezvous kinds (whose body is that buffer's
//! [`RemoteSlice`] encoding). `aux` carries the error code of an
//! [`Kind::Error`], the released call of a [`Kind::Release`], and is zero
//! otherwise.

use crate::buf::{RemoteAccess, RemoteSlice, REMOTE_SLICE_WIRE_LEN};

/// Bytes of the header that starts every message.
pub const HEADER_LEN: usize = 24;
/// The version this crate speaks.
pub const VERSION: u8 = 1;
const MAGIC: [u8; 2] = *b"RC";
/// Bytes of a hello's body.
pub const HELLO_LEN: usize = 16;

/// What a message is.
///
/// ```
/// use rdma_ring::rpc::wire::{encode_inline, Header, Kind};
/// let mut buf = [0u8; 32];
/// encode_inline(&mut buf, Kind::Goodbye, 0, b"");
/// assert_eq!(Header::decode(&buf).unwrap().kind, Kind::Goodbye);
/// buf[3] = 11; // the kind byte follows the version
/// assert_eq!(Header::decode(&buf).unwrap_err(), "unknown message kind 11");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Server to client, once, first: the connection's sizes ([`Hello`]).
    Hello = 1,
    /// A request whose bytes follow the header.
    Request = 2,
    /// A request too large for a receive buffer: the body describes a
    /// buffer of `len` bytes the client exposes for reading.
    RequestRendezvous = 3,
    /// A response whose bytes follow the header.
    Response = 4,
    /// A response too large for a receive buffer: the body describes a
    /// buffer of `len` bytes the server exposes for reading until the
    /// client sends a [`Kind::Release`].
    ResponseRendezvous = 5,
    /// Client to server: the rendezvous response of call `aux` was read;
    /// its buffer may go. Answered by a [`Kind::Released`].
    Release = 6,
    /// The answer to a [`Kind::Release`].
    Released = 7,
    /// The call failed on the server; `aux` is the [`ErrorCode`], the body
    /// a UTF-8 explanation.
    Error = 8,
    /// Server to client: the server shuts down; calls already sent are
    /// answered, later ones refused.
    Goodbye = 9,
    /// Client to server: the client leaves; nothing more follows. Not
    /// answered.
    Close = 10,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Hello,
            2 => Kind::Request,
            3 => Kind::RequestRendezvous,
            4 => Kind::Response,
            5 => Kind::ResponseRendezvous,
            6 => Kind::Release,
            7 => Kind::Released,
            8 => Kind::Error,
            9 => Kind::Goodbye,
            10 => Kind::Close,
            _ => return None,
        })
    }

    /// Whether a client may send it.
    ///
    /// ```
    /// use rdma_ring::rpc::wire::Kind;
    /// assert!(Kind::Request.from_client());
    /// assert!(Kind::Close.from_client());
    /// // A server's message arriving from a client breaks the protocol.
    /// assert!(!Kind::Response.from_client());
    /// assert!(!Kind::Hello.from_client());
    /// ```
    pub fn from_client(self) -> bool {
        matches!(
            self,
            Kind::Request | Kind::RequestRendezvous | Kind::Release | Kind::Close
        )
    }

    /// Whether it answers a client's message (and so returns a credit).
    ///
    /// ```
    /// use rdma_ring::rpc::wire::Kind;
    /// assert!(Kind::Response.answers());
    /// assert!(Kind::Error.answers());
    /// // Unsolicited: it frees no slot of the client's window.
    /// assert!(!Kind::Goodbye.answers());
    /// ```
    pub fn answers(self) -> bool {
        matches!(
            self,
            Kind::Response | Kind::ResponseRendezvous | Kind::Released | Kind::Error
        )
    }
}

/// Why the server failed a call.
///
/// The code travels in the `aux` field of a [`Kind::Error`] message:
///
/// ```
/// use rdma_ring::rpc::wire::{encode_with_aux, ErrorCode, Kind, Message};
/// let mut buf = [0u8; 64];
/// let n = encode_with_aux(&mut buf, Kind::Error, 3, ErrorCode::Busy as u64, b"no room");
/// let expected = Message::Error { id: 3, code: ErrorCode::Busy, text: "no room" };
/// assert_eq!(Message::decode(&buf[..n]).unwrap(), expected);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum ErrorCode {
    /// The handler returned an error.
    Handler = 1,
    /// The handler panicked.
    Panicked = 2,
    /// The request is larger than the server's `max_message`.
    TooLarge = 3,
    /// The server could not read a rendezvous request. This crate's
    /// server never sends it: on RC a failed READ moves the queue pair to
    /// the error state, so the connection ends instead, and its calls
    /// fail as on a lost connection. The code stays in the protocol for
    /// servers that could answer.
    ReadFailed = 4,
    /// The server is shutting down and takes no new calls.
    ShuttingDown = 5,
    /// The server ran out of resources for this call.
    Busy = 6,
    /// The client broke the protocol (call id 0: the whole connection);
    /// the server closes the connection after this message.
    Protocol = 7,
}

impl ErrorCode {
    /// Decodes a code; unknown codes are refused.
    ///
    /// ```
    /// use rdma_ring::rpc::wire::ErrorCode;
    /// assert_eq!(ErrorCode::from_u64(3), Some(ErrorCode::TooLarge));
    /// assert_eq!(ErrorCode::from_u64(ErrorCode::Protocol as u64), Some(ErrorCode::Protocol));
    /// assert_eq!(ErrorCode::from_u64(0), None);
    /// assert_eq!(ErrorCode::from_u64(8), None);
    /// ```
    pub fn from_u64(v: u64) -> Option<ErrorCode> {
        Some(match v {
            1 => ErrorCode::Handler,
            2 => ErrorCode::Panicked,
            3 => ErrorCode::TooLarge,
            4 => ErrorCode::ReadFailed,
            5 => ErrorCode::ShuttingDown,
            6 => ErrorCode::Busy,
            7 => ErrorCode::Protocol,
            _ => return None,
        })
    }
}

/// The header every message starts with.
///
/// ```
/// use rdma_ring::rpc::wire::{Header, Kind, HEADER_LEN};
/// let h = Header { kind: Kind::Request, len: 5, id: 42, aux: 0 };
/// let mut bytes = [0u8; HEADER_LEN];
/// h.encode(&mut bytes);
/// assert_eq!(Header::decode(&bytes).unwrap(), h);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// What the message is.
    pub kind: Kind,
    /// The call's message length (see the module docs).
    pub len: u32,
    /// The call it belongs to, chosen by the client.
    pub id: u64,
    /// Kind-specific: error code, released call, or zero.
    pub aux: u64,
}

impl Header {
    /// Writes the header into the first [`HEADER_LEN`] bytes of `out`.
    ///
    /// # Panics
    ///
    /// If `out` is shorter than [`HEADER_LEN`].
    ///
    /// ```
    /// use rdma_ring::rpc::wire::{Header, Kind, HEADER_LEN};
    /// let mut out = [0u8; HEADER_LEN];
    /// Header { kind: Kind::Release, len: 0, id: 5, aux: 4 }.encode(&mut out);
    /// assert_eq!(&out[..4], b"RC\x01\x06"); // magic, version 1, kind 6
    /// assert_eq!(out[8..16], 5u64.to_le_bytes());
    /// assert_eq!(out[16..24], 4u64.to_le_bytes());
    /// ```
    pub fn encode(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&MAGIC);
        out[2] = VERSION;
        out[3] = self.kind as u8;
        out[4..8].copy_from_slice(&self.len.to_le_bytes());
        out[8..16].copy_from_slice(&self.id.to_le_bytes());
        out[16..24].copy_from_slice(&self.aux.to_le_bytes());
    }

    /// Reads a header from the start of `bytes`.
    ///
    /// ```
    /// use rdma_ring::rpc::wire::{Header, Kind, HEADER_LEN};
    /// let mut bytes = [0u8; HEADER_LEN];
    /// Header { kind: Kind::Request, len: 4, id: 1, aux: 0 }.encode(&mut bytes);
    /// assert_eq!(Header::decode(&bytes).unwrap().len, 4);
    /// assert!(Header::decode(&bytes[..10]).unwrap_err().contains("shorter"));
    /// bytes[2] = 2; // a later version of the wire format
    /// assert_eq!(Header::decode(&bytes).unwrap_err(), "RPC wire version 2 (this side speaks 1)");
    /// ```
    pub fn decode(bytes: &[u8]) -> Result<Header, String> {
        if bytes.len() < HEADER_LEN {
            return Err(format!(
                "a message of {} bytes is shorter than the {HEADER_LEN}-byte header",
                bytes.len()
            ));
        }
        if bytes[0..2] != MAGIC {
            return Err(format!(
                "bad magic {:02x}{:02x} (not an rdma-ring RPC message)",
                bytes[0], bytes[1]
            ));
        }
        if bytes[2] != VERSION {
            return Err(format!(
                "RPC wire version {} (this side speaks {VERSION})",
                bytes[2]
            ));
        }
        let kind =
            Kind::from_u8(bytes[3]).ok_or_else(|| format!("unknown message kind {}", bytes[3]))?;
        let word = |r: std::ops::Range<usize>| u64::from_le_bytes(bytes[r].try_into().expect("8"));
        Ok(Header {
            kind,
            len: u32::from_le_bytes(bytes[4..8].try_into().expect("4")),
            id: word(8..16),
            aux: word(16..24),
        })
    }
}

/// The server's first message: the sizes the client must keep to.
///
/// ```
/// use rdma_ring::rpc::wire::{Hello, HELLO_LEN};
/// let hello = Hello { window: 16, buffer_size: 4096, max_message: 1 << 20, client_id: 7 };
/// let mut bytes = [0u8; HELLO_LEN];
/// hello.encode(&mut bytes);
/// assert_eq!(Hello::decode(&bytes).unwrap(), hello);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Messages the client may have unanswered at once.
    pub window: u16,
    /// Bytes of every receive buffer, on both sides: the longest message
    /// that travels inline, header included.
    pub buffer_size: u32,
    /// The longest request or response the server handles.
    pub max_message: u32,
    /// The server's name for this connection.
    pub client_id: u32,
}

/// The smallest receive buffer: a header and a remote slice.
pub const MIN_BUFFER: u32 = (HEADER_LEN + REMOTE_SLICE_WIRE_LEN) as u32;

impl Hello {
    /// Writes the hello into the first [`HELLO_LEN`] bytes of `out`.
    ///
    /// ```
    /// use rdma_ring::rpc::wire::{Hello, HELLO_LEN};
    /// let hello = Hello { window: 16, buffer_size: 4120, max_message: 1 << 20, client_id: 7 };
    /// let mut body = [0u8; HELLO_LEN];
    /// hello.encode(&mut body);
    /// assert_eq!(body[0..4], [16, 0, 0, 0]); // the window, then two reserved bytes
    /// assert_eq!(body[4..8], 4120u32.to_le_bytes());
    /// assert_eq!(Hello::decode(&body).unwrap(), hello);
    /// ```
    pub fn encode(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&self.window.to_le_bytes());
        out[2..4].fill(0);
        out[4..8].copy_from_slice(&self.buffer_size.to_le_bytes());
        out[8..12].copy_from_slice(&self.max_message.to_le_bytes());
        out[12..16].copy_from_slice(&self.client_id.to_le_bytes());
    }

    /// Reads a hello body, refusing sizes a client cannot work with.
    ///
    /// ```
    /// use rdma_ring::rpc::wire::{Hello, HELLO_LEN};
    /// let good = Hello { window: 16, buffer_size: 4120, max_message: 1 << 20, client_id: 7 };
    /// let mut body = [0u8; HELLO_LEN];
    /// Hello { window: 0, ..good }.encode(&mut body);
    /// assert_eq!(Hello::decode(&body).unwrap_err(), "a hello with window 0 (1 to 1024)");
    /// // A buffer must hold at least a header and a rendezvous descriptor.
    /// Hello { buffer_size: 16, ..good }.encode(&mut body);
    /// assert!(Hello::decode(&body).unwrap_err().contains("buffer size 16"));
    /// ```
    pub fn decode(body: &[u8]) -> Result<Hello, String> {
        if body.len() != HELLO_LEN {
            return Err(format!(
                "a hello of {} bytes (expected {HELLO_LEN})",
                body.len()
            ));
        }
        let u32_at = |i: usize| u32::from_le_bytes(body[i..i + 4].try_into().expect("4"));
        let hello = Hello {
            window: u16::from_le_bytes([body[0], body[1]]),
            buffer_size: u32_at(4),
            max_message: u32_at(8),
            client_id: u32_at(12),
        };
        if body[2..4] != [0, 0] {
            return Err("a hello with reserved bytes set".into());
        }
        if hello.window == 0 || hello.window > MAX_WINDOW {
            return Err(format!(
                "a hello with window {} (1 to {MAX_WINDOW})",
                hello.window
            ));
        }
        if !(MIN_BUFFER..=MAX_BUFFER).contains(&hello.buffer_size) {
            return Err(format!(
                "a hello with buffer size {} ({MIN_BUFFER} to {MAX_BUFFER})",
                hello.buffer_size
            ));
        }
        Ok(hello)
    }
}

/// The largest window a hello may grant.
pub const MAX_WINDOW: u16 = 1024;
/// The largest receive buffer a hello may ask for (a client posts a
/// window of them; larger messages go by rendezvous anyway).
pub const MAX_BUFFER: u32 = 1 << 20;

/// A decoded message: its header and body, checked against each other.
///
/// ```
/// use rdma_ring::rpc::wire::{encode_inline, Kind, Message};
/// let mut buf = [0u8; 64];
/// let n = encode_inline(&mut buf, Kind::Goodbye, 0, b"");
/// assert_eq!(Message::decode(&buf[..n]).unwrap(), Message::Goodbye);
/// // A goodbye is for the whole connection, never for one call.
/// let n = encode_inline(&mut buf, Kind::Goodbye, 3, b"");
/// assert_eq!(Message::decode(&buf[..n]).unwrap_err(), "a goodbye with a call id");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message<'a> {
    /// See [`Kind::Hello`].
    Hello(Hello),
    /// An inline request.
    Request {
        /// Call id.
        id: u64,
        /// The request.
        body: &'a [u8],
    },
    /// A request to read from the client.
    RequestRendezvous {
        /// Call id.
        id: u64,
        /// Where the request is, exactly its length, readable.
        remote: RemoteSlice,
    },
    /// An inline response.
    Response {
        /// Call id.
        id: u64,
        /// The response.
        body: &'a [u8],
    },
    /// A response to read from the server.
    ResponseRendezvous {
        /// Call id.
        id: u64,
        /// Where the response is, exactly its length, readable.
        remote: RemoteSlice,
    },
    /// See [`Kind::Release`].
    Release {
        /// This message's own id (answered by [`Message::Released`]).
        id: u64,
        /// The call whose response buffer may go.
        call: u64,
    },
    /// See [`Kind::Released`].
    Released {
        /// The release's id.
        id: u64,
    },
    /// See [`Kind::Error`].
    Error {
        /// Call id.
        id: u64,
        /// Why.
        code: ErrorCode,
        /// The server's explanation.
        text: &'a str,
    },
    /// See [`Kind::Goodbye`].
    Goodbye,
    /// See [`Kind::Close`].
    Close,
}

impl Message<'_> {
    /// The kind it was sent as.
    ///
    /// ```
    /// use rdma_ring::rpc::wire::{encode_inline, Kind, Message};
    /// let mut buf = [0u8; 64];
    /// let n = encode_inline(&mut buf, Kind::Response, 9, b"pong");
    /// let msg = Message::decode(&buf[..n]).unwrap();
    /// assert_eq!(msg.kind(), Kind::Response);
    /// assert!(msg.kind().answers());
    /// ```
    pub fn kind(&self) -> Kind {
        match self {
            Message::Hello(_) => Kind::Hello,
            Message::Request { .. } => Kind::Request,
            Message::RequestRendezvous { .. } => Kind::RequestRendezvous,
            Message::Response { .. } => Kind::Response,
            Message::ResponseRendezvous { .. } => Kind::ResponseRendezvous,
            Message::Release { .. } => Kind::Release,
            Message::Released { .. } => Kind::Released,
            Message::Error { .. } => Kind::Error,
            Message::Goodbye => Kind::Goodbye,
            Message::Close => Kind::Close,
        }
    }
}

/// Longest error text sent.
pub const MAX_ERROR_TEXT: usize = 256;

impl<'a> Message<'a> {
    /// Decodes one received message (`bytes` is exactly what arrived).
    ///
    /// ```
    /// use rdma_ring::rpc::wire::{Message, encode_inline, Kind};
    /// let mut buf = vec![0u8; 64];
    /// let n = encode_inline(&mut buf, Kind::Request, 9, b"ping");
    /// assert_eq!(Message::decode(&buf[..n]).unwrap(), Message::Request { id: 9, body: b"ping" });
    /// assert!(Message::decode(&buf[..n - 1]).is_err()); // the length must match
    /// ```
    pub fn decode(bytes: &'a [u8]) -> Result<Message<'a>, String> {
        let header = Header::decode(bytes)?;
        let body = &bytes[HEADER_LEN..];
        let inline_len = || {
            if body.len() == header.len as usize {
                Ok(())
            } else {
                Err(format!(
                    "a {:?} announcing {} bytes carries {}",
                    header.kind,
                    header.len,
                    body.len()
                ))
            }
        };
        let no_aux = || {
            if header.aux == 0 {
                Ok(())
            } else {
                Err(format!(
                    "a {:?} with aux {} (must be 0)",
                    header.kind, header.aux
                ))
            }
        };
        let remote = || -> Result<RemoteSlice, String> {
            no_aux()?;
            if body.len() != REMOTE_SLICE_WIRE_LEN {
                return Err(format!(
                    "a {:?} whose descriptor is {} bytes (expected {REMOTE_SLICE_WIRE_LEN})",
                    header.kind,
                    body.len()
                ));
            }
            let remote = RemoteSlice::decode(body).map_err(|e| e.to_string())?;
            if remote.len() != u64::from(header.len) || header.len == 0 {
                return Err(format!(
                    "a {:?} announcing {} bytes describes a buffer of {}",
                    header.kind,
                    header.len,
                    remote.len()
                ));
            }
            if !remote.rights().contains(RemoteAccess::READ) {
                return Err(format!("a {:?} whose buffer is not readable", header.kind));
            }
            Ok(remote)
        };
        let empty = || {
            if body.is_empty() && header.len == 0 {
                Ok(())
            } else {
                Err(format!("a {:?} with a body", header.kind))
            }
        };
        Ok(match header.kind {
            Kind::Hello => {
                inline_len()?;
                no_aux()?;
                if header.id != 0 {
                    return Err("a hello with a call id".into());
                }
                Message::Hello(Hello::decode(body)?)
            }
            Kind::Request => {
                inline_len()?;
                no_aux()?;
                Message::Request {
                    id: header.id,
                    body,
                }
            }
            Kind::Response => {
                inline_len()?;
                no_aux()?;
                Message::Response {
                    id: header.id,
                    body,
                }
            }
            Kind::RequestRendezvous => Message::RequestRendezvous {
                id: header.id,
                remote: remote()?,
            },
            Kind::ResponseRendezvous => Message::ResponseRendezvous {
                id: header.id,
                remote: remote()?,
            },
            Kind::Release => {
                empty()?;
                Message::Release {
                    id: header.id,
                    call: header.aux,
                }
            }
            Kind::Released => {
                empty()?;
                no_aux()?;
                Message::Released { id: header.id }
            }
            Kind::Error => {
                inline_len()?;
                let code = ErrorCode::from_u64(header.aux)
                    .ok_or_else(|| format!("an error with unknown code {}", header.aux))?;
                if body.len() > MAX_ERROR_TEXT {
                    return Err(format!("an error text of {} bytes", body.len()));
                }
                let text = std::str::from_utf8(body)
                    .map_err(|_| "an error text that is not UTF-8".to_string())?;
                Message::Error {
                    id: header.id,
                    code,
                    text,
                }
            }
            Kind::Goodbye => {
                empty()?;
                no_aux()?;
                if header.id != 0 {
                    return Err("a goodbye with a call id".into());
                }
                Message::Goodbye
            }
            Kind::Close => {
                empty()?;
                no_aux()?;
                if header.id != 0 {
                    return Err("a close with a call id".into());
                }
                Message::Close
            }
        })
    }
}

/// Writes a header of `kind` and `body` into `out`; returns the bytes
/// written. `aux` is zero.
///
/// # Panics
///
/// If `out` cannot hold them, or `body` is 4 GiB or longer.
///
/// ```
/// use rdma_ring::rpc::wire::{encode_inline, Header, Kind, HEADER_LEN};
/// let mut buf = [0u8; 64];
/// let n = encode_inline(&mut buf, Kind::Request, 1, b"ping");
/// assert_eq!(n, HEADER_LEN + 4);
/// assert_eq!(&buf[HEADER_LEN..n], b"ping");
/// let header = Header::decode(&buf[..n]).unwrap();
/// assert_eq!(header, Header { kind: Kind::Request, len: 4, id: 1, aux: 0 });
/// ```
pub fn encode_inline(out: &mut [u8], kind: Kind, id: u64, body: &[u8]) -> usize {
    encode_with_aux(out, kind, id, 0, body)
}

/// Like [`encode_inline`], with `aux`.
///
/// ```
/// use rdma_ring::rpc::wire::{encode_with_aux, Kind, Message, HEADER_LEN};
/// let mut buf = [0u8; 64];
/// // Message 8 releases the rendezvous response of call 5.
/// let n = encode_with_aux(&mut buf, Kind::Release, 8, 5, b"");
/// assert_eq!(n, HEADER_LEN);
/// assert_eq!(Message::decode(&buf[..n]).unwrap(), Message::Release { id: 8, call: 5 });
/// ```
pub fn encode_with_aux(out: &mut [u8], kind: Kind, id: u64, aux: u64, body: &[u8]) -> usize {
    let len = u32::try_from(body.len()).expect("a body under 4 GiB");
    Header { kind, len, id, aux }.encode(out);
    out[HEADER_LEN..HEADER_LEN + body.len()].copy_from_slice(body);
    HEADER_LEN + body.len()
}

/// Writes a rendezvous message of `kind` for `remote` into `out`.
///
/// ```
/// use rdma_ring::buf::{RemoteAccess, RemoteSlice, REMOTE_SLICE_WIRE_LEN};
/// use rdma_ring::rpc::wire::{encode_rendezvous, Kind, Message, HEADER_LEN};
/// let remote = RemoteSlice::new(0x1000, 1 << 20, 7, RemoteAccess::READ);
/// let mut buf = [0u8; 64];
/// let n = encode_rendezvous(&mut buf, Kind::ResponseRendezvous, 3, &remote);
/// assert_eq!(n, HEADER_LEN + REMOTE_SLICE_WIRE_LEN);
/// assert_eq!(Message::decode(&buf[..n]).unwrap(), Message::ResponseRendezvous { id: 3, remote });
/// // The peer only reads the buffer, so one it may not read is refused.
/// let write_only = RemoteSlice::new(0x1000, 1 << 20, 7, RemoteAccess::WRITE);
/// let n = encode_rendezvous(&mut buf, Kind::ResponseRendezvous, 3, &write_only);
/// assert!(Message::decode(&buf[..n]).unwrap_err().contains("not readable"));
/// ```
pub fn encode_rendezvous(out: &mut [u8], kind: Kind, id: u64, remote: &RemoteSlice) -> usize {
    let len = u32::try_from(remote.len()).expect("a rendezvous under 4 GiB");
    Header {
        kind,
        len,
        id,
        aux: 0,
    }
    .encode(out);
    out[HEADER_LEN..HEADER_LEN + REMOTE_SLICE_WIRE_LEN].copy_from_slice(&remote.encode());
    HEADER_LEN + REMOTE_SLICE_WIRE_LEN
}

/// Cuts an error text to [`MAX_ERROR_TEXT`] bytes at a character boundary.
///
/// ```
/// use rdma_ring::rpc::wire::{error_text, MAX_ERROR_TEXT};
/// assert_eq!(error_text("short"), "short");
/// let text = format!("x{}", "é".repeat(200)); // 'é' takes two bytes
/// let cut = error_text(&text);
/// assert_eq!(cut.len(), MAX_ERROR_TEXT - 1); // byte 256 is inside an 'é'
/// assert!(text.starts_with(cut));
/// ```
pub fn error_text(text: &str) -> &str {
    if text.len() <= MAX_ERROR_TEXT {
        return text;
    }
    let mut end = MAX_ERROR_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(msg_bytes: &[u8]) -> Message<'_> {
        Message::decode(msg_bytes).unwrap()
    }

    #[test]
    fn every_kind_round_trips() {
        let mut buf = vec![0u8; 128];
        let remote = RemoteSlice::new(0x1000, 100, 7, RemoteAccess::READ);
        let n = encode_rendezvous(&mut buf, Kind::RequestRendezvous, 3, &remote);
        assert_eq!(
            roundtrip(&buf[..n]),
            Message::RequestRendezvous { id: 3, remote }
        );
        let n = encode_rendezvous(&mut buf, Kind::ResponseRendezvous, 4, &remote);
        assert_eq!(
            roundtrip(&buf[..n]),
            Message::ResponseRendezvous { id: 4, remote }
        );
        let n = encode_with_aux(&mut buf, Kind::Release, 5, 4, b"");
        assert_eq!(roundtrip(&buf[..n]), Message::Release { id: 5, call: 4 });
        let n = encode_inline(&mut buf, Kind::Released, 5, b"");
        assert_eq!(roundtrip(&buf[..n]), Message::Released { id: 5 });
        let n = encode_with_aux(
            &mut buf,
            Kind::Error,
            6,
            ErrorCode::Panicked as u64,
            b"boom",
        );
        assert_eq!(
            roundtrip(&buf[..n]),
            Message::Error {
                id: 6,
                code: ErrorCode::Panicked,
                text: "boom"
            }
        );
        let n = encode_inline(&mut buf, Kind::Goodbye, 0, b"");
        assert_eq!(roundtrip(&buf[..n]), Message::Goodbye);
        let n = encode_inline(&mut buf, Kind::Close, 0, b"");
        assert_eq!(roundtrip(&buf[..n]), Message::Close);
        let hello = Hello {
            window: 8,
            buffer_size: 4096,
            max_message: 1 << 20,
            client_id: 1,
        };
        let mut body = [0u8; HELLO_LEN];
        hello.encode(&mut body);
        let n = encode_inline(&mut buf, Kind::Hello, 0, &body);
        assert_eq!(roundtrip(&buf[..n]), Message::Hello(hello));
    }

    #[test]
    fn lies_and_garbage_are_refused_with_reasons() {
        let mut buf = vec![0u8; 128];
        let n = encode_inline(&mut buf, Kind::Request, 1, b"abc");
        let mut bad = buf[..n].to_vec();
        bad[2] = 2;
        assert!(Message::decode(&bad).unwrap_err().contains("version 2"));
        let mut bad = buf[..n].to_vec();
        bad[3] = 77;
        assert!(Message::decode(&bad)
            .unwrap_err()
            .contains("unknown message kind"));
        let mut bad = buf[..n].to_vec();
        bad[0] = b'X';
        assert!(Message::decode(&bad).unwrap_err().contains("magic"));
        assert!(Message::decode(&buf[..10]).unwrap_err().contains("shorter"));
        // A rendezvous whose length disagrees with its descriptor.
        let remote = RemoteSlice::new(0x1000, 100, 7, RemoteAccess::READ);
        let n = encode_rendezvous(&mut buf, Kind::RequestRendezvous, 3, &remote);
        buf[4..8].copy_from_slice(&99u32.to_le_bytes());
        assert!(Message::decode(&buf[..n])
            .unwrap_err()
            .contains("describes"));
        // A descriptor the reader may not read.
        let wo = RemoteSlice::new(0x1000, 100, 7, RemoteAccess::WRITE);
        let n = encode_rendezvous(&mut buf, Kind::RequestRendezvous, 3, &wo);
        assert!(Message::decode(&buf[..n])
            .unwrap_err()
            .contains("not readable"));
        let n = encode_with_aux(&mut buf, Kind::Error, 6, 99, b"x");
        assert!(Message::decode(&buf[..n])
            .unwrap_err()
            .contains("unknown code"));
        let n = encode_with_aux(&mut buf, Kind::Error, 6, 1, &[0xff, 0xfe]);
        assert!(Message::decode(&buf[..n]).unwrap_err().contains("UTF-8"));
        let n = encode_with_aux(&mut buf, Kind::Goodbye, 0, 0, b"x");
        assert!(Message::decode(&buf[..n]).is_err());
        let mut body = [0u8; HELLO_LEN];
        Hello {
            window: 0,
            buffer_size: 4096,
            max_message: 0,
            client_id: 0,
        }
        .encode(&mut body);
        let n = encode_inline(&mut buf, Kind::Hello, 0, &body);
        assert!(Message::decode(&buf[..n]).unwrap_err().contains("window 0"));
    }

    #[test]
    fn error_text_is_cut_at_a_character() {
        let long = "é".repeat(200);
        let cut = error_text(&long);
        assert!(cut.len() <= MAX_ERROR_TEXT);
        assert!(long.starts_with(cut));
    }
}
