//! A peer's exposed memory, with checked sub-slicing and a strict wire
//! encoding.

use std::ops::{Bound, RangeBounds};

use crate::error::Error;

bitflags::bitflags! {
    /// What a peer may do to exposed memory.
    ///
    /// ```
    /// use rdma_ring::buf::RemoteAccess;
    /// assert!(RemoteAccess::all().contains(RemoteAccess::ATOMIC));
    /// ```
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct RemoteAccess: u8 {
        /// RDMA READ.
        const READ = 1;
        /// RDMA WRITE (and WRITE with immediate).
        const WRITE = 2;
        /// 8-byte atomics.
        const ATOMIC = 4;
    }
}

/// Bytes in the wire encoding of a [`RemoteSlice`].
pub const REMOTE_SLICE_WIRE_LEN: usize = 24;
const WIRE_MAGIC: [u8; 2] = *b"RS";
const WIRE_VERSION: u8 = 1;

/// `len` bytes of a peer's memory at `addr`, reachable with `rkey`, with
/// the rights the peer granted. Sub-slices are bounds-checked, so a slice
/// can never name memory outside what the peer exposed.
///
/// ```
/// use rdma_ring::buf::{RemoteAccess, RemoteSlice};
/// let remote = RemoteSlice::new(0x10000, 4096, 0x1234, RemoteAccess::READ | RemoteAccess::WRITE);
/// let part = remote.slice(1024..2048).unwrap();
/// assert_eq!((part.addr(), part.len()), (0x10400, 1024));
/// assert!(remote.slice(4000..5000).is_err());
///
/// let wire = remote.encode();
/// assert_eq!(RemoteSlice::decode(&wire).unwrap(), remote);
/// assert!(RemoteSlice::decode(&wire[..10]).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteSlice {
    addr: u64,
    len: u64,
    rkey: u32,
    rights: RemoteAccess,
}

impl RemoteSlice {
    /// Describes remote memory obtained any other way (from a peer's own
    /// protocol, say). The device enforces the real rights and bounds; these
    /// let the ring refuse a doomed operation before posting it.
    ///
    /// # Panics
    ///
    /// If `addr + len` overflows.
    pub fn new(addr: u64, len: u64, rkey: u32, rights: RemoteAccess) -> Self {
        assert!(
            addr.checked_add(len).is_some(),
            "remote slice {addr:#x}+{len} overflows the address space"
        );
        RemoteSlice {
            addr,
            len,
            rkey,
            rights,
        }
    }

    /// Address of the first byte, in the peer's address space.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the slice is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The rights granted.
    pub fn rights(&self) -> RemoteAccess {
        self.rights
    }

    /// The same memory with fewer rights (never more).
    pub fn restrict(self, rights: RemoteAccess) -> Self {
        RemoteSlice {
            rights: self.rights & rights,
            ..self
        }
    }

    /// A checked sub-slice; `range` is relative to this slice.
    pub fn slice(&self, range: impl RangeBounds<u64>) -> Result<RemoteSlice, Error> {
        let start = match range.start_bound() {
            Bound::Included(&s) => Some(s),
            Bound::Excluded(&s) => s.checked_add(1),
            Bound::Unbounded => Some(0),
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.checked_add(1),
            Bound::Excluded(&e) => Some(e),
            Bound::Unbounded => Some(self.len),
        };
        match (start, end) {
            (Some(start), Some(end)) if start <= end && end <= self.len => Ok(RemoteSlice {
                addr: self.addr + start,
                len: end - start,
                ..*self
            }),
            (start, end) => Err(Error::OutOfBounds {
                start: start.unwrap_or(u64::MAX),
                end: end.unwrap_or(u64::MAX),
                len: self.len,
            }),
        }
    }

    /// The 8 bytes at `offset` as an atomic target: in bounds, 8-aligned,
    /// and with atomic rights, or an error saying which is missing
    /// ([`Error::OutOfBounds`], [`Error::Misaligned`],
    /// [`Error::MissingAtomicRights`]).
    pub fn word(&self, offset: u64) -> Result<RemoteWord, Error> {
        // Checked, not saturated: at the top of the address space a
        // saturated end would make a word of 7 bytes pass as 8.
        let end = offset.checked_add(8).ok_or(Error::OutOfBounds {
            start: offset,
            end: u64::MAX,
            len: self.len,
        })?;
        let part = self.slice(offset..end)?;
        if part.addr % 8 != 0 {
            return Err(Error::Misaligned { addr: part.addr });
        }
        if !self.rights.contains(RemoteAccess::ATOMIC) {
            return Err(Error::MissingAtomicRights {
                granted: format!("{:?}", self.rights),
            });
        }
        Ok(RemoteWord {
            addr: part.addr,
            rkey: self.rkey,
        })
    }

    /// The fixed-size, versioned wire record: magic `RS`, version 1, rights,
    /// then address, length and rkey in network byte order.
    pub fn encode(&self) -> [u8; REMOTE_SLICE_WIRE_LEN] {
        let mut out = [0u8; REMOTE_SLICE_WIRE_LEN];
        out[0..2].copy_from_slice(&WIRE_MAGIC);
        out[2] = WIRE_VERSION;
        out[3] = self.rights.bits();
        out[4..12].copy_from_slice(&self.addr.to_be_bytes());
        out[12..20].copy_from_slice(&self.len.to_be_bytes());
        out[20..24].copy_from_slice(&self.rkey.to_be_bytes());
        out
    }

    /// Decodes a wire record strictly: exact length, magic, version, known
    /// rights bits, and an address range that does not overflow. Never
    /// panics, whatever the input.
    pub fn decode(bytes: &[u8]) -> Result<RemoteSlice, Error> {
        let bad = |reason: String| Error::Malformed {
            what: "remote slice record",
            reason,
        };
        let record: &[u8; REMOTE_SLICE_WIRE_LEN] = bytes.try_into().map_err(|_| {
            bad(format!(
                "expected {REMOTE_SLICE_WIRE_LEN} bytes, got {}",
                bytes.len()
            ))
        })?;
        if record[0..2] != WIRE_MAGIC {
            return Err(bad(format!("bad magic {:02x?}", &record[0..2])));
        }
        if record[2] != WIRE_VERSION {
            return Err(bad(format!(
                "unsupported version {} (this build speaks {WIRE_VERSION})",
                record[2]
            )));
        }
        let rights = RemoteAccess::from_bits(record[3])
            .ok_or_else(|| bad(format!("unknown rights bits {:#04x}", record[3])))?;
        let word = |at: usize| u64::from_be_bytes(record[at..at + 8].try_into().expect("8 bytes"));
        let addr = word(4);
        let len = word(12);
        let rkey = u32::from_be_bytes(record[20..24].try_into().expect("4 bytes"));
        if addr.checked_add(len).is_none() {
            return Err(bad(format!("range {addr:#x}+{len} overflows")));
        }
        Ok(RemoteSlice {
            addr,
            len,
            rkey,
            rights,
        })
    }
}

/// Exactly 8 aligned bytes of a peer's memory with atomic rights: the
/// remote target of an atomic. Made by [`RemoteSlice::word`].
///
/// ```
/// use rdma_ring::buf::{RemoteAccess, RemoteSlice};
/// use rdma_ring::Error;
/// let remote = RemoteSlice::new(0x1000, 64, 9, RemoteAccess::ATOMIC);
/// assert_eq!(remote.word(8).unwrap().addr(), 0x1008);
/// assert!(matches!(remote.word(4), Err(Error::Misaligned { addr: 0x1004 })));
/// assert!(matches!(
///     remote.restrict(RemoteAccess::READ).word(8),
///     Err(Error::MissingAtomicRights { .. })
/// ));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteWord {
    addr: u64,
    rkey: u32,
}

impl RemoteWord {
    /// Address of the word in the peer's address space.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// The remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A word is 8 whole bytes of its slice, at the top of the address
    /// space too, where the end of the last 7 bytes cannot be computed.
    #[test]
    fn a_word_at_the_end_of_the_largest_slice_is_whole() {
        let s = RemoteSlice::new(0, u64::MAX, 1, RemoteAccess::ATOMIC);
        assert!(s.word(u64::MAX - 7).is_err(), "only 7 bytes are left");
        let last = s.word(u64::MAX - 15).unwrap();
        assert_eq!(last.addr(), u64::MAX - 15);
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = RemoteSlice::decode(&bytes);
        }

        #[test]
        fn round_trips(addr in 0u64..1 << 60, len in 0u64..1 << 40, rkey: u32, rights in 0u8..8) {
            let s = RemoteSlice::new(addr, len, rkey, RemoteAccess::from_bits_truncate(rights));
            prop_assert_eq!(RemoteSlice::decode(&s.encode()).unwrap(), s);
        }

        #[test]
        fn sub_slices_stay_inside(len in 0u64..10_000, a in 0u64..20_000, b in 0u64..20_000) {
            let s = RemoteSlice::new(1 << 20, len, 1, RemoteAccess::all());
            match s.slice(a..b) {
                Ok(part) => {
                    prop_assert!(part.addr() >= s.addr());
                    prop_assert!(part.addr() + part.len() <= s.addr() + s.len());
                }
                Err(_) => prop_assert!(a > b || b > len),
            }
        }
    }

    #[test]
    fn rejects_each_malformation() {
        let good = RemoteSlice::new(8, 8, 1, RemoteAccess::READ).encode();
        let mut bad_magic = good;
        bad_magic[0] = b'X';
        let mut bad_version = good;
        bad_version[2] = 2;
        let mut bad_rights = good;
        bad_rights[3] = 0x80;
        let mut overflow = good;
        overflow[4..12].copy_from_slice(&u64::MAX.to_be_bytes());
        for (bytes, needle) in [
            (&bad_magic[..], "magic"),
            (&bad_version[..], "version"),
            (&bad_rights[..], "rights"),
            (&overflow[..], "overflows"),
            (&good[..23], "expected 24 bytes"),
        ] {
            let err = RemoteSlice::decode(bytes).unwrap_err().to_string();
            assert!(err.contains(needle), "{err}");
        }
    }
}
