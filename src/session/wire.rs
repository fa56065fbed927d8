//! The session's wire format: every SEND on a session ends with a 16-byte
//! trailer; control messages carry a small body before it.
//!
//! A trailer, rather than a header, keeps a user message's payload at
//! offset 0 of the receive region, so [`Session::receive`] hands the region
//! itself to the user, no copy.
//!
//! ```text
//! trailer (16 bytes, little endian)
//!   0..2   magic "SN"
//!   2      version (2)
//!   3      kind: 1 user, 2 ack, 3 alloc request, 4 alloc grant,
//!          5 alloc refuse, 6 lend, 7 return, 8 close, 9 release
//!   4..8   messages of the peer this side processed (cumulative, wrapping)
//!   8..12  user messages of the peer this side's user took (same)
//!   12..16 zero
//! bodies
//!   ack, close        empty
//!   alloc request     request id u64, size u64, align u32, rights u8, 3 zero
//!   alloc grant       request id u64, then a region descriptor
//!   alloc refuse      request id u64, reason u8, 7 zero
//!   lend              a region descriptor
//!   return, release   region id u64
//! region descriptor   region id u64, remote slice record (24 bytes),
//!                     lease in milliseconds u32 (0: none), 4 zero
//! ```
//!
//! Decoding is strict: exact lengths per kind, zero padding, known rights
//! and reasons, canonical values only. A peer is untrusted input; this
//! decoder is fuzzed (`fuzz/fuzz_targets/session_wire.rs`).
//!
//! [`Session::receive`]: super::Session::receive

use crate::buf::{RemoteAccess, RemoteSlice, REMOTE_SLICE_WIRE_LEN};

/// Bytes of the trailer that ends every session SEND.
pub const TRAILER_LEN: usize = 16;
/// Largest control body.
pub const MAX_CONTROL_BODY: usize = 8 + DESCRIPTOR_LEN;
/// Bytes of an encoded [`RegionDescriptor`].
pub const DESCRIPTOR_LEN: usize = 8 + REMOTE_SLICE_WIRE_LEN + 8;
/// Largest alignment a peer may ask for.
pub const MAX_ALIGN: u32 = 4096;

const MAGIC: [u8; 2] = *b"SN";
const VERSION: u8 = 2;
/// The hello's own version: 3 since both sides count flow control with
/// the smaller of their depths, so a side counting by the older rules is
/// refused at connect rather than left to stall; 4 since the TCP
/// handshake exchanges hellos before endpoints, and a full host answers
/// with [`Greeting::HostFull`].
const HELLO_VERSION: u8 = 4;

/// What a message is.
///
/// ```
/// use rdma_ring::session::wire::{Control, Kind};
/// // A close has no body: its bytes are the trailer alone, kind at byte 3.
/// let bytes = Control::Close.encode(0, 0);
/// assert_eq!(bytes[3], Kind::Close as u8);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A user message: the payload precedes the trailer.
    User = 1,
    /// Only the trailer's counts.
    Ack = 2,
    /// The peer asks us to allocate a region for it.
    AllocRequest = 3,
    /// The region asked for.
    AllocGrant = 4,
    /// The allocation was refused.
    AllocRefuse = 5,
    /// A region handed to the receiver.
    Lend = 6,
    /// A region handed back to its owner's user.
    Return = 7,
    /// The sender is closing the session.
    Close = 8,
    /// A region its holder is done with: its owner frees it (or gives it
    /// back to the user who lent it).
    Release = 9,
}

impl Kind {
    fn from_byte(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::User,
            2 => Kind::Ack,
            3 => Kind::AllocRequest,
            4 => Kind::AllocGrant,
            5 => Kind::AllocRefuse,
            6 => Kind::Lend,
            7 => Kind::Return,
            8 => Kind::Close,
            9 => Kind::Release,
            _ => return None,
        })
    }
}

/// The trailer's fields.
///
/// ```
/// use rdma_ring::session::wire::{decode, Kind, Message, Trailer};
/// let trailer = Trailer { kind: Kind::User, processed: 4, taken: 2 };
/// let mut bytes = b"hi".to_vec();
/// bytes.extend_from_slice(&trailer.encode());
/// assert_eq!(decode(&bytes).unwrap(), (trailer, Message::User(b"hi")));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trailer {
    /// What the message is.
    pub kind: Kind,
    /// Messages of the receiver the sender processed, cumulative.
    pub processed: u32,
    /// User messages of the receiver the sender's user took, cumulative.
    pub taken: u32,
}

impl Trailer {
    /// The 16 bytes.
    ///
    /// ```
    /// use rdma_ring::session::wire::{decode, Kind, Trailer};
    /// let bytes = Trailer { kind: Kind::Ack, processed: 1, taken: 0 }.encode();
    /// assert_eq!(&bytes[..4], b"SN\x02\x02");
    /// assert_eq!(bytes[4..8], 1u32.to_le_bytes());
    /// assert_eq!(decode(&bytes).unwrap().0.processed, 1);
    /// ```
    pub fn encode(&self) -> [u8; TRAILER_LEN] {
        let mut out = [0u8; TRAILER_LEN];
        out[0..2].copy_from_slice(&MAGIC);
        out[2] = VERSION;
        out[3] = self.kind as u8;
        out[4..8].copy_from_slice(&self.processed.to_le_bytes());
        out[8..12].copy_from_slice(&self.taken.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8; TRAILER_LEN]) -> Result<Trailer, WireError> {
        if bytes[0..2] != MAGIC {
            return Err(WireError(format!("bad magic {:02x?}", &bytes[0..2])));
        }
        if bytes[2] != VERSION {
            return Err(WireError(format!(
                "unsupported version {} (this build speaks {VERSION})",
                bytes[2]
            )));
        }
        let kind = Kind::from_byte(bytes[3])
            .ok_or_else(|| WireError(format!("unknown kind {}", bytes[3])))?;
        if bytes[12..16] != [0; 4] {
            return Err(WireError("non-zero trailer padding".into()));
        }
        Ok(Trailer {
            kind,
            processed: u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes")),
            taken: u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")),
        })
    }
}

/// A region one side lends the other: its id (in the lender's numbering),
/// where it is, and how long the lease lasts.
///
/// ```
/// use rdma_ring::buf::{RemoteAccess, RemoteSlice};
/// use rdma_ring::session::wire::{decode, Control, Message, RegionDescriptor};
/// let remote = RemoteSlice::new(0x1000, 4096, 77, RemoteAccess::READ);
/// let region = RegionDescriptor { id: 9, remote, lease_ms: 1500 };
/// let bytes = Control::Lend(region).encode(0, 0);
/// assert_eq!(decode(&bytes).unwrap().1, Message::Control(Control::Lend(region)));
/// // An empty region lends nothing, so a peer sending one is refused.
/// let empty = RegionDescriptor { remote: RemoteSlice::new(0x1000, 0, 77, RemoteAccess::READ), ..region };
/// assert!(decode(&Control::Lend(empty).encode(0, 0)).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionDescriptor {
    /// The lender's id for the region.
    pub id: u64,
    /// Address, length, rkey and rights.
    pub remote: RemoteSlice,
    /// Milliseconds until the lender takes the region back; 0: never.
    pub lease_ms: u32,
}

impl RegionDescriptor {
    fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.id.to_le_bytes());
        out.extend_from_slice(&self.remote.encode());
        out.extend_from_slice(&self.lease_ms.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
    }

    fn decode(bytes: &[u8]) -> Result<RegionDescriptor, WireError> {
        let bytes = exact::<DESCRIPTOR_LEN>(bytes, "region descriptor")?;
        let remote = RemoteSlice::decode(&bytes[8..8 + REMOTE_SLICE_WIRE_LEN])
            .map_err(|e| WireError(e.to_string()))?;
        if remote.is_empty() {
            return Err(WireError("an empty region".into()));
        }
        let tail = &bytes[8 + REMOTE_SLICE_WIRE_LEN..];
        zero(&tail[4..8], "region descriptor")?;
        Ok(RegionDescriptor {
            id: u64_at(bytes, 0),
            remote,
            lease_ms: u32::from_le_bytes(tail[0..4].try_into().expect("4 bytes")),
        })
    }
}

/// Why an allocation was refused.
///
/// ```
/// use rdma_ring::session::wire::{decode, Control, Message, RefuseReason};
/// let refusal = Control::AllocRefuse { request: 3, reason: RefuseReason::Quota };
/// let mut bytes = refusal.encode(0, 0);
/// assert_eq!(decode(&bytes).unwrap().1, Message::Control(refusal));
/// assert_eq!(RefuseReason::Quota.to_string(), "the peer's memory cap for this session is reached");
/// bytes[8] = 0; // the reason byte
/// assert!(decode(&bytes).unwrap_err().0.contains("unknown refusal reason 0"));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RefuseReason {
    /// Larger than the peer allows one region to be.
    TooLarge = 1,
    /// Rights beyond what the peer grants.
    Rights = 2,
    /// The peer's total for this session would exceed its cap.
    Quota = 3,
    /// The peer has no memory left.
    OutOfMemory = 4,
    /// The session is closing.
    Closing = 5,
    /// Granted, but its lease ended before the grant could be sent (the
    /// asker's flow control held it back).
    LeaseEnded = 6,
}

impl RefuseReason {
    fn from_byte(b: u8) -> Option<RefuseReason> {
        Some(match b {
            1 => RefuseReason::TooLarge,
            2 => RefuseReason::Rights,
            3 => RefuseReason::Quota,
            4 => RefuseReason::OutOfMemory,
            5 => RefuseReason::Closing,
            6 => RefuseReason::LeaseEnded,
            _ => return None,
        })
    }
}

impl std::fmt::Display for RefuseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RefuseReason::TooLarge => "larger than the peer allows one region to be",
            RefuseReason::Rights => "rights beyond what the peer grants",
            RefuseReason::Quota => "the peer's memory cap for this session is reached",
            RefuseReason::OutOfMemory => "the peer has no registered memory left",
            RefuseReason::Closing => "the session is closing",
            RefuseReason::LeaseEnded => "the region's lease ended before the grant could be sent",
        })
    }
}

/// A control message (any message but a user one).
///
/// ```
/// use rdma_ring::buf::RemoteAccess;
/// use rdma_ring::session::wire::{decode, Control, Message};
/// let request = Control::AllocRequest { request: 1, size: 100, align: 64, rights: RemoteAccess::WRITE };
/// let mut bytes = request.encode(0, 0);
/// assert_eq!(decode(&bytes).unwrap().1, Message::Control(request));
/// // The peer is untrusted: an alignment of 3 (bytes 16..20) is refused.
/// bytes[16] = 3;
/// assert!(decode(&bytes).unwrap_err().0.contains("alignment 3"));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// Counts only.
    Ack,
    /// Allocate a region for the sender.
    AllocRequest {
        /// The sender's id for the request.
        request: u64,
        /// Bytes.
        size: u64,
        /// Alignment, a power of two up to [`MAX_ALIGN`].
        align: u32,
        /// Rights the sender wants.
        rights: RemoteAccess,
    },
    /// The region asked for by `request`.
    AllocGrant {
        /// The request answered.
        request: u64,
        /// The region.
        region: RegionDescriptor,
    },
    /// Request `request` was refused.
    AllocRefuse {
        /// The request answered.
        request: u64,
        /// Why.
        reason: RefuseReason,
    },
    /// A region the sender hands to the receiver.
    Lend(RegionDescriptor),
    /// The receiver's region `id` comes back, for the receiver's user.
    Return {
        /// The receiver's id for it.
        id: u64,
    },
    /// The sender is done with the receiver's region `id`: the receiver
    /// frees it, or gives it back to the user who lent it.
    Release {
        /// The receiver's id for it.
        id: u64,
    },
    /// The sender closes the session.
    Close,
}

impl Control {
    /// The trailer kind.
    ///
    /// ```
    /// use rdma_ring::session::wire::{decode, Control, Kind};
    /// let ret = Control::Return { id: 7 };
    /// assert_eq!(ret.kind(), Kind::Return);
    /// assert_eq!(decode(&ret.encode(0, 0)).unwrap().0.kind, Kind::Return);
    /// ```
    pub fn kind(&self) -> Kind {
        match self {
            Control::Ack => Kind::Ack,
            Control::AllocRequest { .. } => Kind::AllocRequest,
            Control::AllocGrant { .. } => Kind::AllocGrant,
            Control::AllocRefuse { .. } => Kind::AllocRefuse,
            Control::Lend(_) => Kind::Lend,
            Control::Return { .. } => Kind::Return,
            Control::Release { .. } => Kind::Release,
            Control::Close => Kind::Close,
        }
    }

    /// Body and trailer, ready to send.
    ///
    /// ```
    /// use rdma_ring::session::wire::{decode, Control, TRAILER_LEN};
    /// let bytes = Control::Return { id: 7 }.encode(3, 1);
    /// assert_eq!(bytes.len(), 8 + TRAILER_LEN);
    /// assert_eq!(bytes[..8], 7u64.to_le_bytes());
    /// let (trailer, _) = decode(&bytes).unwrap();
    /// assert_eq!((trailer.processed, trailer.taken), (3, 1));
    /// ```
    pub fn encode(&self, processed: u32, taken: u32) -> Vec<u8> {
        let mut out = Vec::with_capacity(MAX_CONTROL_BODY + TRAILER_LEN);
        match self {
            Control::Ack | Control::Close => {}
            Control::AllocRequest {
                request,
                size,
                align,
                rights,
            } => {
                out.extend_from_slice(&request.to_le_bytes());
                out.extend_from_slice(&size.to_le_bytes());
                out.extend_from_slice(&align.to_le_bytes());
                out.push(rights.bits());
                out.extend_from_slice(&[0; 3]);
            }
            Control::AllocGrant { request, region } => {
                out.extend_from_slice(&request.to_le_bytes());
                region.encode_into(&mut out);
            }
            Control::AllocRefuse { request, reason } => {
                out.extend_from_slice(&request.to_le_bytes());
                out.push(*reason as u8);
                out.extend_from_slice(&[0; 7]);
            }
            Control::Lend(region) => region.encode_into(&mut out),
            Control::Return { id } | Control::Release { id } => {
                out.extend_from_slice(&id.to_le_bytes())
            }
        }
        let trailer = Trailer {
            kind: self.kind(),
            processed,
            taken,
        };
        out.extend_from_slice(&trailer.encode());
        out
    }

    fn decode(kind: Kind, body: &[u8]) -> Result<Control, WireError> {
        Ok(match kind {
            Kind::User => unreachable!("user messages have no control body"),
            Kind::Ack => {
                exact::<0>(body, "ack")?;
                Control::Ack
            }
            Kind::Close => {
                exact::<0>(body, "close")?;
                Control::Close
            }
            Kind::AllocRequest => {
                let b = exact::<24>(body, "allocation request")?;
                let size = u64_at(b, 8);
                let align = u32::from_le_bytes(b[16..20].try_into().expect("4 bytes"));
                let rights = RemoteAccess::from_bits(b[20])
                    .ok_or_else(|| WireError(format!("unknown rights bits {:#04x}", b[20])))?;
                zero(&b[21..24], "allocation request")?;
                if size == 0 {
                    return Err(WireError("a request for 0 bytes".into()));
                }
                if !align.is_power_of_two() || align > MAX_ALIGN {
                    return Err(WireError(format!(
                        "alignment {align} is not a power of two up to {MAX_ALIGN}"
                    )));
                }
                if rights.is_empty() {
                    return Err(WireError("a request for no rights".into()));
                }
                Control::AllocRequest {
                    request: u64_at(b, 0),
                    size,
                    align,
                    rights,
                }
            }
            Kind::AllocGrant => {
                if body.len() != 8 + DESCRIPTOR_LEN {
                    return Err(length("allocation grant", 8 + DESCRIPTOR_LEN, body.len()));
                }
                Control::AllocGrant {
                    request: u64_at(body, 0),
                    region: RegionDescriptor::decode(&body[8..])?,
                }
            }
            Kind::AllocRefuse => {
                let b = exact::<16>(body, "allocation refusal")?;
                let reason = RefuseReason::from_byte(b[8])
                    .ok_or_else(|| WireError(format!("unknown refusal reason {}", b[8])))?;
                zero(&b[9..16], "allocation refusal")?;
                Control::AllocRefuse {
                    request: u64_at(b, 0),
                    reason,
                }
            }
            Kind::Lend => Control::Lend(RegionDescriptor::decode(body)?),
            Kind::Return => Control::Return {
                id: u64_at(exact::<8>(body, "return")?, 0),
            },
            Kind::Release => Control::Release {
                id: u64_at(exact::<8>(body, "release")?, 0),
            },
        })
    }
}

/// A decoded message.
///
/// ```
/// use rdma_ring::session::wire::{decode, Control, Kind, Message, Trailer};
/// let mut bytes = b"payload".to_vec();
/// bytes.extend_from_slice(&Trailer { kind: Kind::User, processed: 0, taken: 0 }.encode());
/// // The payload is everything before the trailer.
/// assert_eq!(decode(&bytes).unwrap().1, Message::User(b"payload"));
/// let ack = Control::Ack.encode(0, 0);
/// assert_eq!(decode(&ack).unwrap().1, Message::Control(Control::Ack));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Message<'a> {
    /// A user message's payload.
    User(&'a [u8]),
    /// A control message.
    Control(Control),
}

/// Decodes one received message (payload or body, then trailer). Never
/// panics, whatever the input.
///
/// ```
/// use rdma_ring::session::wire::{decode, Control, Message};
/// let bytes = Control::Return { id: 7 }.encode(3, 1);
/// let (trailer, message) = decode(&bytes).unwrap();
/// assert_eq!((trailer.processed, trailer.taken), (3, 1));
/// assert_eq!(message, Message::Control(Control::Return { id: 7 }));
/// assert!(decode(&bytes[1..]).is_err());
/// ```
pub fn decode(bytes: &[u8]) -> Result<(Trailer, Message<'_>), WireError> {
    let Some(split) = bytes.len().checked_sub(TRAILER_LEN) else {
        return Err(WireError(format!(
            "{} bytes: shorter than the {TRAILER_LEN}-byte trailer",
            bytes.len()
        )));
    };
    let (body, trailer) = bytes.split_at(split);
    let trailer = Trailer::decode(trailer.try_into().expect("16 bytes"))?;
    let message = match trailer.kind {
        Kind::User => Message::User(body),
        kind => Message::Control(Control::decode(kind, body)?),
    };
    Ok((trailer, message))
}

/// Bytes of an encoded [`Hello`].
pub const HELLO_LEN: usize = 12;

/// What each side tells the other while connecting (over the TCP
/// handshake, in rdma_cm's private data, or directly on the soft device):
/// magic `SH`, version 4, a zero byte, then `recv_depth` u16,
/// `user_window` u16 and `max_message` u32, little endian.
///
/// ```
/// use rdma_ring::session::wire::Hello;
/// let hello = Hello { recv_depth: 32, user_window: 16, max_message: 4096 };
/// assert_eq!(Hello::decode(&hello.encode()).unwrap(), hello);
/// // The window must stay below the depth, which leaves receives for control messages.
/// let greedy = Hello { user_window: 32, ..hello };
/// assert!(Hello::decode(&greedy.encode()).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Receives the sender keeps posted.
    pub recv_depth: u16,
    /// User messages the sender's user may leave unread.
    pub user_window: u16,
    /// Largest user message the sender accepts.
    pub max_message: u32,
}

impl Hello {
    /// The 12 bytes.
    ///
    /// ```
    /// use rdma_ring::session::wire::{Hello, HELLO_LEN};
    /// let bytes = Hello { recv_depth: 32, user_window: 16, max_message: 4096 }.encode();
    /// assert_eq!(bytes.len(), HELLO_LEN);
    /// assert_eq!(&bytes[..4], b"SH\x04\x00");
    /// assert_eq!(bytes[4..6], 32u16.to_le_bytes());
    /// ```
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut out = [0u8; HELLO_LEN];
        out[0..2].copy_from_slice(b"SH");
        out[2] = HELLO_VERSION;
        out[4..6].copy_from_slice(&self.recv_depth.to_le_bytes());
        out[6..8].copy_from_slice(&self.user_window.to_le_bytes());
        out[8..12].copy_from_slice(&self.max_message.to_le_bytes());
        out
    }

    /// Decodes strictly: length, magic, version, padding and ranges
    /// (`recv_depth` 4..=1024, `user_window` 1..recv_depth, `max_message`
    /// up to 1 MiB). Never panics.
    ///
    /// ```
    /// use rdma_ring::session::wire::Hello;
    /// let hello = Hello { recv_depth: 32, user_window: 16, max_message: 4096 };
    /// assert_eq!(Hello::decode(&hello.encode()).unwrap(), hello);
    /// assert!(Hello::decode(&[0u8; 12]).is_err());
    /// ```
    pub fn decode(bytes: &[u8]) -> Result<Hello, WireError> {
        let b = exact::<HELLO_LEN>(bytes, "hello")?;
        if b[0..2] != *b"SH" || b[2] != HELLO_VERSION || b[3] != 0 {
            return Err(WireError(format!(
                "not a version {HELLO_VERSION} session hello: {:02x?}",
                &b[0..4]
            )));
        }
        let hello = Hello {
            recv_depth: u16::from_le_bytes([b[4], b[5]]),
            user_window: u16::from_le_bytes([b[6], b[7]]),
            max_message: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
        };
        if !(4..=1024).contains(&hello.recv_depth)
            || hello.user_window == 0
            || hello.user_window >= hello.recv_depth
            || hello.max_message > 1 << 20
        {
            return Err(WireError(format!("hello out of range: {hello:?}")));
        }
        Ok(hello)
    }
}

/// What a side says first while connecting: its [`Hello`], or, from a
/// host that holds its most sessions already, that it is full. A full
/// host's greeting is the hello's magic and version, byte 3 one, four
/// zero bytes, then the host's most sessions as a u32, little endian.
///
/// ```
/// use rdma_ring::session::wire::{Greeting, Hello};
/// let full = Greeting::HostFull { most: 64 };
/// assert_eq!(Greeting::decode(&full.encode()).unwrap(), full);
/// let hello = Hello { recv_depth: 32, user_window: 16, max_message: 4096 };
/// assert_eq!(Greeting::Hello(hello).encode(), hello.encode());
/// assert_eq!(Greeting::decode(&hello.encode()).unwrap(), Greeting::Hello(hello));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Greeting {
    /// A host with room for the session.
    Hello(Hello),
    /// A host that holds its most sessions
    /// ([`SessionConfig::max_sessions`](super::SessionConfig::max_sessions)),
    /// handshakes under way included.
    HostFull {
        /// The sessions it holds at most.
        most: u32,
    },
}

impl Greeting {
    /// The 12 bytes.
    ///
    /// ```
    /// use rdma_ring::session::wire::Greeting;
    /// let bytes = Greeting::HostFull { most: 64 }.encode();
    /// assert_eq!(&bytes[..4], b"SH\x04\x01");
    /// assert_eq!(bytes[8..], 64u32.to_le_bytes());
    /// ```
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        match self {
            Greeting::Hello(hello) => hello.encode(),
            Greeting::HostFull { most } => {
                let mut out = [0u8; HELLO_LEN];
                out[0..2].copy_from_slice(b"SH");
                out[2] = HELLO_VERSION;
                out[3] = HOST_FULL;
                out[8..12].copy_from_slice(&most.to_le_bytes());
                out
            }
        }
    }

    /// Decodes as strictly as [`Hello::decode`]: a full host's greeting
    /// has its four zero bytes, and says it holds at least one session.
    /// Never panics.
    ///
    /// ```
    /// use rdma_ring::session::wire::Greeting;
    /// let mut bytes = Greeting::HostFull { most: 64 }.encode();
    /// bytes[5] = 1;
    /// assert!(Greeting::decode(&bytes).is_err());
    /// ```
    pub fn decode(bytes: &[u8]) -> Result<Greeting, WireError> {
        let b = exact::<HELLO_LEN>(bytes, "greeting")?;
        if b[0..2] != *b"SH" || b[2] != HELLO_VERSION || b[3] != HOST_FULL {
            return Hello::decode(b).map(Greeting::Hello);
        }
        let most = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
        if b[4..8] != [0; 4] || most == 0 {
            return Err(WireError(format!(
                "a full host's greeting out of range: {b:02x?}"
            )));
        }
        Ok(Greeting::HostFull { most })
    }
}

/// Byte 3 of a full host's greeting.
const HOST_FULL: u8 = 1;

/// A message that breaks the format, and how.
///
/// ```
/// use rdma_ring::session::wire::decode;
/// let err = decode(b"short").unwrap_err();
/// assert_eq!(err.to_string(), "malformed session message: 5 bytes: shorter than the 16-byte trailer");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed session message: {0}")]
pub struct WireError(pub String);

fn exact<'a, const N: usize>(bytes: &'a [u8], what: &str) -> Result<&'a [u8; N], WireError> {
    bytes.try_into().map_err(|_| length(what, N, bytes.len()))
}

fn length(what: &str, want: usize, got: usize) -> WireError {
    WireError(format!("{what}: expected {want} bytes, got {got}"))
}

fn zero(bytes: &[u8], what: &str) -> Result<(), WireError> {
    if bytes.iter().any(|&b| b != 0) {
        return Err(WireError(format!("{what}: non-zero padding")));
    }
    Ok(())
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn descriptor() -> RegionDescriptor {
        RegionDescriptor {
            id: 9,
            remote: RemoteSlice::new(0x1000, 4096, 77, RemoteAccess::READ | RemoteAccess::WRITE),
            lease_ms: 1500,
        }
    }

    /// A peer of an older version (counting flow control by the older
    /// rules, or sending its endpoint before its hello) is told apart at
    /// connect, as a greeting too.
    #[test]
    fn a_hello_of_an_older_version_is_refused_by_name() {
        for version in [2, 3] {
            let mut bytes = Hello {
                recv_depth: 32,
                user_window: 16,
                max_message: 4096,
            }
            .encode();
            bytes[2] = version;
            let err = Hello::decode(&bytes).unwrap_err();
            assert!(err.0.contains("not a version 4 session hello"), "{err}");
            let err = Greeting::decode(&bytes).unwrap_err();
            assert!(err.0.contains("not a version 4 session hello"), "{err}");
        }
        // A full host's greeting is no hello.
        assert!(Hello::decode(&Greeting::HostFull { most: 1 }.encode()).is_err());
        assert!(Greeting::decode(&Greeting::HostFull { most: 0 }.encode()).is_err());
    }

    #[test]
    fn every_control_message_round_trips() {
        let all = [
            Control::Ack,
            Control::Close,
            Control::AllocRequest {
                request: 1,
                size: 100,
                align: 64,
                rights: RemoteAccess::WRITE,
            },
            Control::AllocGrant {
                request: 1,
                region: descriptor(),
            },
            Control::AllocRefuse {
                request: 2,
                reason: RefuseReason::Quota,
            },
            Control::Lend(descriptor()),
            Control::Return { id: u64::MAX },
            Control::Release { id: 3 },
        ];
        for c in all {
            let bytes = c.encode(u32::MAX, 5);
            let (t, m) = decode(&bytes).unwrap();
            assert_eq!(m, Message::Control(c));
            assert_eq!((t.kind, t.processed, t.taken), (c.kind(), u32::MAX, 5));
            // Every shorter or longer body is refused.
            for cut in 1..=bytes.len().min(TRAILER_LEN + 1) {
                let mut longer = bytes[..bytes.len() - TRAILER_LEN].to_vec();
                longer.push(0);
                longer.extend_from_slice(&bytes[bytes.len() - TRAILER_LEN..]);
                assert!(decode(&longer).is_err(), "{c:?} with a longer body");
                if cut <= bytes.len() - TRAILER_LEN {
                    let mut shorter = bytes[..bytes.len() - TRAILER_LEN - cut].to_vec();
                    shorter.extend_from_slice(&bytes[bytes.len() - TRAILER_LEN..]);
                    assert!(decode(&shorter).is_err(), "{c:?} cut by {cut}");
                }
            }
        }
    }

    #[test]
    fn user_payload_is_everything_before_the_trailer() {
        let mut bytes = b"hello".to_vec();
        bytes.extend_from_slice(
            &Trailer {
                kind: Kind::User,
                processed: 1,
                taken: 2,
            }
            .encode(),
        );
        assert_eq!(decode(&bytes).unwrap().1, Message::User(b"hello"));
    }

    #[test]
    fn hostile_fields_are_refused() {
        let request = |size: u64, align: u32, rights: u8| {
            let mut b = Control::AllocRequest {
                request: 1,
                size: 1,
                align: 8,
                rights: RemoteAccess::READ,
            }
            .encode(0, 0);
            b[8..16].copy_from_slice(&size.to_le_bytes());
            b[16..20].copy_from_slice(&align.to_le_bytes());
            b[20] = rights;
            decode(&b).map(|_| ())
        };
        assert!(request(1, 8, 1).is_ok());
        assert!(request(0, 8, 1).is_err(), "zero size");
        assert!(request(1, 3, 1).is_err(), "alignment not a power of two");
        assert!(request(1, 8192, 1).is_err(), "alignment too large");
        assert!(request(1, 8, 0).is_err(), "no rights");
        assert!(request(1, 8, 0x80).is_err(), "unknown rights");
        let mut bad = Control::Close.encode(0, 0);
        bad[2] = VERSION - 1;
        assert!(decode(&bad).unwrap_err().0.contains("version"));
        bad[2] = VERSION + 1;
        assert!(decode(&bad).unwrap_err().0.contains("version"));
        bad[2] = VERSION;
        bad[3] = 99;
        assert!(decode(&bad).unwrap_err().0.contains("kind"));
        bad[3] = Kind::Close as u8;
        bad[15] = 1;
        assert!(decode(&bad).is_err(), "padding");
        assert!(decode(&[0u8; 3]).is_err());
        let mut refuse = Control::AllocRefuse {
            request: 1,
            reason: RefuseReason::Rights,
        }
        .encode(0, 0);
        refuse[8] = 0;
        assert!(decode(&refuse).is_err(), "unknown reason");
    }
}
