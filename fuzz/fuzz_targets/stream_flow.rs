//! A stream peer is untrusted: whatever headers and payloads it sends, in
//! whatever order, between our own sends and reposts, the flow control
//! must never panic, never let a grant exceed the peer's announced
//! buffers, never produce a header it cannot encode, and stop at the first
//! broken rule. The hello decoder must never panic, and what it accepts
//! must re-encode to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_ring::buf::{RemoteAccess, RemoteSlice};
use rdma_ring::stream::flow::{Flow, Limits, Received};
use rdma_ring::stream::frame::{self, Header, Hello, Kind, MAX_COUNT};

fuzz_target!(|data: &[u8]| {
    if let Ok(hello) = Hello::decode(data) {
        assert_eq!(&hello.encode()[..], data);
    }
    let ours = Limits {
        chunk: 64,
        data_receives: 3,
        answer_receives: 2,
    };
    let mut flow = Flow::new(ours);
    let hello = flow.header(Kind::Hello);
    flow.commit(hello, 0);
    // The peer's hello comes first in most runs, so the fuzzer reaches
    // the rules behind it.
    let mut bytes = data.iter().copied();
    if data.first().is_some_and(|b| b & 1 == 0) {
        let peer = Hello {
            chunk: 64,
            data_receives: 2 + u32::from(data[0] % 5),
            answer_receives: 2 + u32::from(data[0] % 3),
            probe: RemoteSlice::new(0x1000, 8, 1, RemoteAccess::READ),
        };
        let header = Header {
            kind: Kind::Hello,
            grant: 0,
            ack: 0,
        };
        flow.receive(header, frame::HELLO_LEN as u32, &peer.encode())
            .expect("a well-formed hello is accepted");
        flow.reposted(1);
        bytes.next();
    }
    let mut held = 0u32;
    while let Some(op) = bytes.next() {
        match op % 4 {
            0 => {
                let mut raw = [0u8; 4];
                for b in &mut raw {
                    *b = bytes.next().unwrap_or(0);
                }
                let header = Header::decode(u32::from_le_bytes(raw));
                let len = u32::from(bytes.next().unwrap_or(0));
                let payload: Vec<u8> = bytes.by_ref().take(len.min(48) as usize).collect();
                match flow.receive(header, len, &payload) {
                    Ok(Received::Data(_)) => held += 1,
                    Ok(Received::Fin) | Ok(Received::Hello(_)) => flow.reposted(1),
                    Ok(Received::Credit) => {}
                    // The connection ends at the first broken rule.
                    Err(_) => return,
                }
            }
            1 => {
                let kind = match op / 4 % 3 {
                    0 => Kind::Data,
                    1 => Kind::Fin,
                    _ => Kind::Credit,
                };
                if flow.can_send(kind) {
                    let header = flow.header(kind);
                    assert!(header.grant <= MAX_COUNT && header.ack <= MAX_COUNT);
                    assert_eq!(Header::decode(header.encode()), header);
                    flow.commit(header, if kind == Kind::Data { 1 } else { 0 });
                }
            }
            2 => {
                if held > 0 {
                    held -= 1;
                    flow.reposted(1);
                }
            }
            _ => {}
        }
        if let Some(peer) = flow.peer() {
            assert!(flow.grants() <= u64::from(peer.data_receives));
        }
    }
});
