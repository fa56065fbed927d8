//! Every RPC message is untrusted input to the side that receives it: the
//! decoder must never panic, and whatever it accepts must be the one
//! encoding of what it decoded (so no two byte strings mean the same
//! message, and nothing is silently ignored).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_ring::rpc::wire::{self, Hello, Kind, Message, HEADER_LEN, HELLO_LEN};

fuzz_target!(|data: &[u8]| {
    let Ok(message) = Message::decode(data) else {
        return;
    };
    let mut out = vec![0u8; data.len().max(HEADER_LEN + HELLO_LEN)];
    let n = match &message {
        Message::Hello(hello) => {
            let mut body = [0u8; HELLO_LEN];
            hello.encode(&mut body);
            assert_eq!(Hello::decode(&body).as_ref(), Ok(hello));
            wire::encode_inline(&mut out, Kind::Hello, 0, &body)
        }
        Message::Request { id, body } => wire::encode_inline(&mut out, Kind::Request, *id, body),
        Message::Response { id, body } => wire::encode_inline(&mut out, Kind::Response, *id, body),
        Message::RequestRendezvous { id, remote } => {
            assert!(remote.len() > 0 && remote.len() <= u64::from(u32::MAX));
            wire::encode_rendezvous(&mut out, Kind::RequestRendezvous, *id, remote)
        }
        Message::ResponseRendezvous { id, remote } => {
            wire::encode_rendezvous(&mut out, Kind::ResponseRendezvous, *id, remote)
        }
        Message::Release { id, call } => {
            wire::encode_with_aux(&mut out, Kind::Release, *id, *call, &[])
        }
        Message::Released { id } => wire::encode_inline(&mut out, Kind::Released, *id, &[]),
        Message::Error { id, code, text } => {
            assert!(text.len() <= wire::MAX_ERROR_TEXT);
            wire::encode_with_aux(&mut out, Kind::Error, *id, *code as u64, text.as_bytes())
        }
        Message::Goodbye => wire::encode_inline(&mut out, Kind::Goodbye, 0, &[]),
        Message::Close => wire::encode_inline(&mut out, Kind::Close, 0, &[]),
    };
    assert_eq!(&out[..n], data, "{message:?} has another encoding");
});
