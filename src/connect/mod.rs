//! Endpoint exchange: what two RC queue pairs must tell each other to
//! connect, its wire record, and a TCP handshake that carries it.
//!
//! * [`Endpoint`]: QPN, PSN, LID, GID and MTU, with a strict, fixed-size,
//!   versioned encoding; a peer is untrusted input, so decoding checks
//!   everything and never panics.
//! * [`tcp`]: exchange endpoints over a `std::net` stream, with timeouts.
//! * Manual: give a queue pair's `connect` an [`Endpoint`] obtained any
//!   other way, e.g. from another verbs program.
//! * `cm` (feature `verbs`): connect through librdmacm, so standard
//!   rdma_cm peers can connect.

#[cfg(feature = "verbs")]
pub(crate) mod accept;
#[cfg(feature = "verbs")]
pub mod cm;
mod endpoint;
#[cfg(feature = "verbs")]
mod readiness;
pub mod tcp;

pub use endpoint::{Endpoint, ENDPOINT_WIRE_LEN};
