//! The stream's wire format: the header every message carries in its
//! immediate data, the hello record each side sends first, and the byte
//! count that closes each control message.
//!
//! Every message is a SEND with immediate data. The 32-bit immediate is
//! the [`Header`]:
//!
//! ```text
//!  31 30 | 29 ........ 15 | 14 ......... 0
//!  kind  |     grant      |      ack
//! ```
//!
//! * `kind`: 0 data, 1 credit, 2 end of stream (FIN), 3 hello.
//! * `grant`: receive buffers for data the sender has posted again and not
//!   granted before (each lets the peer send one more message).
//! * `ack`: messages of the peer (data, FIN, hello) the sender received and
//!   had not acknowledged before (each frees a receive the peer keeps for
//!   the answer). A message that grants nothing leaves one unacknowledged
//!   (see [`flow`](super::flow)).
//!
//! Payloads: data carries 1 or more bytes of the stream; a credit and a FIN
//! carry the sender's total of data bytes sent so far (8 bytes, little
//! endian), which the receiver checks against what it received; the hello
//! carries the [`Hello`] record. Decoding is strict and never panics: a
//! peer is untrusted input.

use crate::buf::{RemoteAccess, RemoteSlice};

/// Largest `grant` or `ack` a header can carry.
pub const MAX_COUNT: u32 = (1 << 15) - 1;
/// Length of an encoded [`Hello`].
pub const HELLO_LEN: usize = 40;
/// Length of a credit's or FIN's payload.
pub const TOTAL_LEN: usize = 8;
/// Smallest receive buffer a side may announce.
pub const MIN_CHUNK: u32 = 64;
/// Largest receive buffer a side may announce (16 MiB).
pub const MAX_CHUNK: u32 = 1 << 24;

const MAGIC: [u8; 2] = *b"RB";
const VERSION: u8 = 1;

/// What a message is.
///
/// ```
/// use rdma_ring::stream::frame::{Header, Kind};
/// // The top two bits of the immediate data.
/// assert_eq!(Header::decode(1 << 30).kind, Kind::Credit);
/// assert_eq!(Header::decode(2 << 30).kind, Kind::Fin);
/// assert_eq!(Header::decode(5).kind, Kind::Data);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Bytes of the stream.
    Data,
    /// Only grants and acknowledgements.
    Credit,
    /// The sender will write no more (half-close).
    Fin,
    /// The first message of each side.
    Hello,
}

impl Kind {
    /// Whether the message uses one of the receive buffers the peer granted
    /// (data, FIN, hello) rather than one kept for answers (credit).
    ///
    /// ```
    /// use rdma_ring::stream::frame::Kind;
    /// assert!(Kind::Data.needs_grant());
    /// assert!(Kind::Fin.needs_grant());
    /// assert!(Kind::Hello.needs_grant());
    /// assert!(!Kind::Credit.needs_grant());
    /// ```
    pub fn needs_grant(self) -> bool {
        !matches!(self, Kind::Credit)
    }
}

/// The header a message carries in its immediate data.
///
/// ```
/// use rdma_ring::stream::frame::{Header, Kind};
/// let h = Header { kind: Kind::Credit, grant: 3, ack: 2 };
/// assert_eq!(Header::decode(h.encode()), h);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// What the message is.
    pub kind: Kind,
    /// Receive buffers posted again for the peer's data and not granted
    /// before.
    pub grant: u32,
    /// Messages of the peer received and not acknowledged before.
    pub ack: u32,
}

impl Header {
    /// The immediate data. `grant` and `ack` above [`MAX_COUNT`] are a bug
    /// of the caller (the flow never produces them).
    ///
    /// ```
    /// use rdma_ring::stream::frame::{Header, Kind};
    /// let imm = Header { kind: Kind::Data, grant: 2, ack: 5 }.encode();
    /// assert_eq!(imm, (2 << 15) | 5); // data is kind 0
    /// assert_eq!(Header { kind: Kind::Hello, grant: 0, ack: 0 }.encode(), 3 << 30);
    /// ```
    pub fn encode(self) -> u32 {
        debug_assert!(self.grant <= MAX_COUNT && self.ack <= MAX_COUNT);
        let kind = match self.kind {
            Kind::Data => 0,
            Kind::Credit => 1,
            Kind::Fin => 2,
            Kind::Hello => 3,
        };
        (kind << 30) | ((self.grant & MAX_COUNT) << 15) | (self.ack & MAX_COUNT)
    }

    /// Every 32-bit value is some header; whether it makes sense is the
    /// flow's check.
    ///
    /// ```
    /// use rdma_ring::stream::frame::{Header, Kind, MAX_COUNT};
    /// let h = Header::decode(u32::MAX);
    /// assert_eq!(h, Header { kind: Kind::Hello, grant: MAX_COUNT, ack: MAX_COUNT });
    /// assert_eq!(Header::decode(h.encode()), h);
    /// ```
    pub fn decode(imm: u32) -> Header {
        let kind = match imm >> 30 {
            0 => Kind::Data,
            1 => Kind::Credit,
            2 => Kind::Fin,
            _ => Kind::Hello,
        };
        Header {
            kind,
            grant: (imm >> 15) & MAX_COUNT,
            ack: imm & MAX_COUNT,
        }
    }
}

/// What each side announces first: its receive buffers, and a small
/// read-only pad the peer may read to check that the connection is alive.
///
/// ```
/// use rdma_ring::buf::{RemoteAccess, RemoteSlice};
/// use rdma_ring::stream::frame::Hello;
/// let hello = Hello {
///     chunk: 65536,
///     data_receives: 16,
///     answer_receives: 8,
///     probe: RemoteSlice::new(0x1000, 8, 7, RemoteAccess::READ),
/// };
/// assert_eq!(Hello::decode(&hello.encode()).unwrap(), hello);
/// assert!(Hello::decode(&hello.encode()[..39]).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Size of each receive buffer: the longest message the peer may send.
    pub chunk: u32,
    /// Receive buffers posted for the peer's data, FIN and hello: the
    /// peer's first grant.
    pub data_receives: u32,
    /// Receive buffers kept for the peer's answers: at most this many of
    /// the sender's own messages go unacknowledged.
    pub answer_receives: u32,
    /// 8 bytes the peer may read (and only read).
    pub probe: RemoteSlice,
}

impl Hello {
    /// The record: magic `RB`, version 1, a zero byte, then chunk, data
    /// receives and answer receives (little endian), then the probe pad's
    /// [`RemoteSlice`] record.
    ///
    /// ```
    /// use rdma_ring::buf::{RemoteAccess, RemoteSlice};
    /// use rdma_ring::stream::frame::Hello;
    /// let probe = RemoteSlice::new(0x1000, 8, 7, RemoteAccess::READ);
    /// let hello = Hello { chunk: 65536, data_receives: 16, answer_receives: 8, probe };
    /// let bytes = hello.encode();
    /// assert_eq!(&bytes[..4], b"RB\x01\x00");
    /// assert_eq!(bytes[4..8], 65536u32.to_le_bytes());
    /// assert_eq!(bytes[16..], probe.encode());
    /// ```
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut out = [0u8; HELLO_LEN];
        out[0..2].copy_from_slice(&MAGIC);
        out[2] = VERSION;
        out[4..8].copy_from_slice(&self.chunk.to_le_bytes());
        out[8..12].copy_from_slice(&self.data_receives.to_le_bytes());
        out[12..16].copy_from_slice(&self.answer_receives.to_le_bytes());
        out[16..40].copy_from_slice(&self.probe.encode());
        out
    }

    /// Decodes a hello strictly: exact length, magic, version, reserved
    /// byte zero, sizes in range, a probe pad of exactly 8 read-only bytes.
    ///
    /// ```
    /// use rdma_ring::buf::{RemoteAccess, RemoteSlice};
    /// use rdma_ring::stream::frame::Hello;
    /// let probe = RemoteSlice::new(0x1000, 8, 7, RemoteAccess::READ);
    /// let good = Hello { chunk: 65536, data_receives: 16, answer_receives: 8, probe };
    /// assert_eq!(Hello::decode(&good.encode()).unwrap(), good);
    /// let tiny = Hello { chunk: 32, ..good };
    /// assert_eq!(
    ///     Hello::decode(&tiny.encode()).unwrap_err(),
    ///     "hello with receive buffers of 32 bytes (allowed: 64 to 16777216)"
    /// );
    /// // The probe pad must not let the peer write.
    /// let writable = RemoteSlice::new(0x1000, 8, 7, RemoteAccess::READ | RemoteAccess::WRITE);
    /// let err = Hello::decode(&Hello { probe: writable, ..good }.encode()).unwrap_err();
    /// assert!(err.contains("must be 8 read-only bytes"));
    /// ```
    pub fn decode(bytes: &[u8]) -> Result<Hello, String> {
        let record: &[u8; HELLO_LEN] = bytes
            .try_into()
            .map_err(|_| format!("hello of {} bytes, expected {HELLO_LEN}", bytes.len()))?;
        if record[0..2] != MAGIC {
            return Err(format!("hello with bad magic {:02x?}", &record[0..2]));
        }
        if record[2] != VERSION {
            return Err(format!(
                "hello of version {} (this build speaks {VERSION})",
                record[2]
            ));
        }
        if record[3] != 0 {
            return Err(format!("hello with reserved byte {:#04x}", record[3]));
        }
        let word = |at: usize| u32::from_le_bytes(record[at..at + 4].try_into().expect("4 bytes"));
        let (chunk, data_receives, answer_receives) = (word(4), word(8), word(12));
        if !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk) {
            return Err(format!(
                "hello with receive buffers of {chunk} bytes (allowed: {MIN_CHUNK} to {MAX_CHUNK})"
            ));
        }
        if !(1..=MAX_COUNT).contains(&data_receives) {
            return Err(format!(
                "hello with {data_receives} data receives (allowed: 1 to {MAX_COUNT})"
            ));
        }
        if !(2..=MAX_COUNT).contains(&answer_receives) {
            return Err(format!(
                "hello with {answer_receives} answer receives (allowed: 2 to {MAX_COUNT})"
            ));
        }
        let probe = RemoteSlice::decode(&record[16..40]).map_err(|e| format!("hello: {e}"))?;
        if probe.len() != 8 || probe.rights() != RemoteAccess::READ {
            return Err(format!(
                "hello with a probe pad of {} bytes and rights {:?} (must be 8 read-only bytes)",
                probe.len(),
                probe.rights()
            ));
        }
        Ok(Hello {
            chunk,
            data_receives,
            answer_receives,
            probe,
        })
    }
}

/// A credit's or FIN's payload: the sender's total of data bytes sent.
///
/// ```
/// use rdma_ring::stream::frame::{decode_total, encode_total};
/// let payload = encode_total(1 << 40);
/// assert_eq!(payload, (1u64 << 40).to_le_bytes());
/// assert_eq!(decode_total(&payload).unwrap(), 1 << 40);
/// ```
pub fn encode_total(total: u64) -> [u8; TOTAL_LEN] {
    total.to_le_bytes()
}

/// Decodes a credit's or FIN's payload strictly (exactly 8 bytes).
///
/// ```
/// use rdma_ring::stream::frame::{decode_total, encode_total};
/// assert_eq!(decode_total(&encode_total(77)).unwrap(), 77);
/// assert_eq!(decode_total(&[0; 7]).unwrap_err(), "control payload of 7 bytes, expected 8");
/// ```
pub fn decode_total(bytes: &[u8]) -> Result<u64, String> {
    let raw: [u8; TOTAL_LEN] = bytes.try_into().map_err(|_| {
        format!(
            "control payload of {} bytes, expected {TOTAL_LEN}",
            bytes.len()
        )
    })?;
    Ok(u64::from_le_bytes(raw))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> Hello {
        Hello {
            chunk: 4096,
            data_receives: 16,
            answer_receives: 8,
            probe: RemoteSlice::new(0x1000, 8, 9, RemoteAccess::READ),
        }
    }

    #[test]
    fn headers_round_trip_at_the_edges() {
        for kind in [Kind::Data, Kind::Credit, Kind::Fin, Kind::Hello] {
            for (grant, ack) in [
                (0, 0),
                (MAX_COUNT, 0),
                (0, MAX_COUNT),
                (MAX_COUNT, MAX_COUNT),
            ] {
                let h = Header { kind, grant, ack };
                assert_eq!(Header::decode(h.encode()), h);
            }
        }
    }

    #[test]
    fn hellos_are_decoded_strictly() {
        let good = hello().encode();
        let mut bad = good;
        bad[0] = b'X';
        assert!(Hello::decode(&bad).unwrap_err().contains("magic"));
        let mut bad = good;
        bad[2] = 2;
        assert!(Hello::decode(&bad).unwrap_err().contains("version 2"));
        let mut bad = good;
        bad[3] = 1;
        assert!(Hello::decode(&bad).unwrap_err().contains("reserved"));
        let mut bad = good;
        bad[4..8].copy_from_slice(&32u32.to_le_bytes());
        assert!(Hello::decode(&bad).unwrap_err().contains("32 bytes"));
        let mut bad = good;
        bad[8..12].copy_from_slice(&0u32.to_le_bytes());
        assert!(Hello::decode(&bad).unwrap_err().contains("0 data receives"));
        let mut bad = good;
        bad[12..16].copy_from_slice(&1u32.to_le_bytes());
        assert!(Hello::decode(&bad)
            .unwrap_err()
            .contains("1 answer receives"));
        let writable = Hello {
            probe: RemoteSlice::new(0x1000, 8, 9, RemoteAccess::READ | RemoteAccess::WRITE),
            ..hello()
        };
        assert!(Hello::decode(&writable.encode())
            .unwrap_err()
            .contains("read-only"));
        assert!(Hello::decode(&good[..HELLO_LEN - 1])
            .unwrap_err()
            .contains("39 bytes"));
        assert_eq!(Hello::decode(&good).unwrap(), hello());
    }

    #[test]
    fn totals_are_exactly_eight_bytes() {
        assert_eq!(decode_total(&encode_total(77)).unwrap(), 77);
        assert!(decode_total(&[0; 7]).is_err());
        assert!(decode_total(&[0; 9]).is_err());
    }
}
