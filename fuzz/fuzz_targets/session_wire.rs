//! Every session message and hello is untrusted input to the side that
//! receives it: the decoders must never panic, and whatever they accept
//! must be the one encoding of what they decoded (no two byte strings mean
//! the same message; nothing is silently ignored).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_ring::session::wire::{decode, Greeting, Hello, Kind, Message, Trailer};

fuzz_target!(|data: &[u8]| {
    if let Ok(hello) = Hello::decode(data) {
        assert_eq!(&hello.encode()[..], data, "{hello:?} has another encoding");
    }
    if let Ok(greeting) = Greeting::decode(data) {
        assert_eq!(
            &greeting.encode()[..],
            data,
            "{greeting:?} has another encoding"
        );
    }
    let Ok((trailer, message)) = decode(data) else {
        return;
    };
    let again = match message {
        Message::User(payload) => {
            assert_eq!(trailer.kind, Kind::User);
            let mut out = payload.to_vec();
            out.extend_from_slice(
                &Trailer {
                    kind: Kind::User,
                    processed: trailer.processed,
                    taken: trailer.taken,
                }
                .encode(),
            );
            out
        }
        Message::Control(control) => {
            assert_eq!(control.kind(), trailer.kind);
            control.encode(trailer.processed, trailer.taken)
        }
    };
    assert_eq!(again, data, "{message:?} has another encoding");
});
