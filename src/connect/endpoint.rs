//! The endpoint record.

use crate::error::Error;

/// Bytes in the wire encoding of an [`Endpoint`].
pub const ENDPOINT_WIRE_LEN: usize = 32;
const MAGIC: [u8; 2] = *b"RE";
const VERSION: u8 = 1;

/// What a peer needs to connect its RC queue pair to ours.
///
/// Wire format (32 bytes, network byte order): magic `RE`, version 1, MTU
/// (an `ibv_mtu` value, 1..=5), QPN (24 bits in 4 bytes), PSN (24 bits in
/// 4 bytes), LID (2 bytes), responder resources (1 byte), initiator depth
/// (1 byte), GID (16 bytes).
///
/// ```
/// use rdma_ring::connect::Endpoint;
/// let ep = Endpoint { qpn: 0x11, psn: 0x2233, lid: 0, gid: [0; 16], mtu: 5, rd_atomic: 16, init_rd_atomic: 16 };
/// let wire = ep.encode();
/// assert_eq!(Endpoint::decode(&wire).unwrap(), ep);
/// assert!(Endpoint::decode(&wire[..31]).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// First packet sequence number the peer will send (24 bits).
    pub psn: u32,
    /// Local identifier (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// GID (RoCE; the IPv4-mapped address for RoCE v2).
    pub gid: [u8; 16],
    /// Path MTU as an `ibv_mtu` value: 1 = 256 … 5 = 4096 bytes.
    pub mtu: u8,
    /// RDMA READs and atomics this side can answer at once (its responder
    /// resources); 0 means unknown. The peer issues no more than that (one
    /// at a time if unknown).
    pub rd_atomic: u8,
    /// RDMA READs and atomics this side will have outstanding at once (its
    /// initiator depth); 0 means unknown.
    pub init_rd_atomic: u8,
}

impl Endpoint {
    /// The wire record.
    pub fn encode(&self) -> [u8; ENDPOINT_WIRE_LEN] {
        let mut out = [0u8; ENDPOINT_WIRE_LEN];
        out[0..2].copy_from_slice(&MAGIC);
        out[2] = VERSION;
        out[3] = self.mtu;
        out[4..8].copy_from_slice(&self.qpn.to_be_bytes());
        out[8..12].copy_from_slice(&self.psn.to_be_bytes());
        out[12..14].copy_from_slice(&self.lid.to_be_bytes());
        out[14] = self.rd_atomic;
        out[15] = self.init_rd_atomic;
        out[16..32].copy_from_slice(&self.gid);
        out
    }

    /// Decodes a wire record strictly: exact length, magic, version, MTU in
    /// range, 24-bit QPN and PSN, and a QPN that can be a connected queue
    /// pair's (not 0 or 1, the subnet management and general services
    /// queue pairs). Never panics.
    pub fn decode(bytes: &[u8]) -> Result<Endpoint, Error> {
        let bad = |reason: String| Error::Malformed {
            what: "endpoint record",
            reason,
        };
        let record: &[u8; ENDPOINT_WIRE_LEN] = bytes.try_into().map_err(|_| {
            bad(format!(
                "expected {ENDPOINT_WIRE_LEN} bytes, got {}",
                bytes.len()
            ))
        })?;
        if record[0..2] != MAGIC {
            return Err(bad(format!(
                "bad magic {:02x?} (not an rdma-ring endpoint)",
                &record[0..2]
            )));
        }
        if record[2] != VERSION {
            return Err(bad(format!(
                "unsupported version {} (this build speaks {VERSION})",
                record[2]
            )));
        }
        let mtu = record[3];
        if !(1..=5).contains(&mtu) {
            return Err(bad(format!("MTU code {mtu} is not an ibv_mtu (1..=5)")));
        }
        let u32_at =
            |at: usize| u32::from_be_bytes(record[at..at + 4].try_into().expect("4 bytes"));
        let (qpn, psn) = (u32_at(4), u32_at(8));
        if qpn > 0x00ff_ffff || psn > 0x00ff_ffff {
            return Err(bad(format!("QPN {qpn:#x} or PSN {psn:#x} exceeds 24 bits")));
        }
        if qpn < 2 {
            return Err(bad(format!(
                "QPN {qpn} is a special queue pair's, never a connected one's"
            )));
        }
        let lid = u16::from_be_bytes([record[12], record[13]]);
        let gid: [u8; 16] = record[16..32].try_into().expect("16 bytes");
        Ok(Endpoint {
            qpn,
            psn,
            lid,
            gid,
            mtu,
            rd_atomic: record[14],
            init_rd_atomic: record[15],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..48)) {
            let _ = Endpoint::decode(&bytes);
        }

        #[test]
        fn round_trips(qpn in 2u32..1 << 24, psn in 0u32..1 << 24, lid: u16, gid: [u8; 16], mtu in 1u8..=5, rd: u8, init: u8) {
            let ep = Endpoint { qpn, psn, lid, gid, mtu, rd_atomic: rd, init_rd_atomic: init };
            prop_assert_eq!(Endpoint::decode(&ep.encode()).unwrap(), ep);
        }
    }

    #[test]
    fn rejects_each_malformation() {
        let good = Endpoint {
            qpn: 0x11,
            psn: 2,
            lid: 3,
            gid: [4; 16],
            mtu: 3,
            rd_atomic: 16,
            init_rd_atomic: 16,
        }
        .encode();
        let cases: [(usize, u8, &str); 4] = [
            (0, b'X', "magic"),
            (2, 9, "version"),
            (3, 0, "MTU"),
            (4, 1, "24 bits"),
        ];
        for (at, value, needle) in cases {
            let mut bad = good;
            bad[at] = value;
            let err = Endpoint::decode(&bad).unwrap_err().to_string();
            assert!(err.contains(needle), "{err}");
        }
        for special in [0u8, 1] {
            let mut bad = good;
            bad[4..8].copy_from_slice(&[0, 0, 0, special]);
            let err = Endpoint::decode(&bad).unwrap_err().to_string();
            assert!(err.contains("special queue pair"), "{err}");
        }
    }
}
