//! [`RemoteRegion`]: a region of the peer's memory this side holds.

use std::fmt;
use std::ops::RangeBounds;
use std::sync::Weak;
use std::time::Instant;

use super::state::{Arrived, ReturnSink};
use super::wire::{Control, RegionDescriptor};
use super::SessionError;
use crate::buf::{RemoteAccess, RemoteSlice, RemoteWord};
use crate::Error;

/// A region of the peer's memory, lent to this side — granted on
/// [`request_remote_mr`](super::Session::request_remote_mr) or sent by the
/// peer ([`receive_remote_mr`](super::Session::receive_remote_mr)). Read,
/// write and run atomics on it through [`remote`](Self::remote) and
/// [`slice`](Self::slice), with the rights it was lent with.
///
/// Hand it back to the peer's user with
/// [`send_remote_mr`](super::Session::send_remote_mr) (who takes it with
/// [`receive_local_mr`](super::Session::receive_local_mr)); dropping it
/// releases it instead: the peer frees a region it allocated for a
/// request, and gives a region its user sent back to that user, as at the
/// end of a lease. Once handed back or released, or once its lease ends
/// ([`expires_at`](Self::expires_at)), the peer revokes it: an
/// operation on it then fails with a remote access error, which ends the
/// session (RC semantics) — so finish with a region before letting it go.
pub struct RemoteRegion {
    descriptor: RegionDescriptor,
    expires_at: Option<Instant>,
    session: Weak<dyn ReturnSink>,
    token: u64,
    handed_back: bool,
}

impl RemoteRegion {
    pub(super) fn new(arrived: Arrived, session: Weak<dyn ReturnSink>, token: u64) -> Self {
        let Arrived {
            descriptor,
            expires_at,
        } = arrived;
        RemoteRegion {
            descriptor,
            expires_at,
            session,
            token,
            handed_back: false,
        }
    }

    /// The whole region, as operations take it.
    pub fn remote(&self) -> RemoteSlice {
        self.descriptor.remote
    }

    /// Part of the region, bounds checked.
    pub fn slice(&self, range: impl RangeBounds<u64>) -> Result<RemoteSlice, Error> {
        self.descriptor.remote.slice(range)
    }

    /// The 8 bytes at `offset`, for an atomic (aligned, with the atomic
    /// right).
    pub fn word(&self, offset: u64) -> Result<RemoteWord, Error> {
        self.descriptor.remote.word(offset)
    }

    /// Bytes.
    pub fn len(&self) -> u64 {
        self.descriptor.remote.len()
    }

    /// Whether the region is empty (never: the peer cannot lend one).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The rights the peer lent it with.
    pub fn rights(&self) -> RemoteAccess {
        self.descriptor.remote.rights()
    }

    /// When the peer takes it back, if the lease ends: reckoned from when
    /// the region arrived (the lease left when the peer sent it), not from
    /// when it was taken here.
    pub fn expires_at(&self) -> Option<Instant> {
        self.expires_at
    }

    /// The peer's id for it.
    pub fn id(&self) -> u64 {
        self.descriptor.id
    }

    pub(super) fn token(&self) -> u64 {
        self.token
    }

    /// Hands the region back to the peer's user through its own session;
    /// the session's refusal if it failed or was closed (its handle gone
    /// too: closed here).
    pub(super) fn hand_back(mut self) -> Result<(), SessionError> {
        self.handed_back = true;
        match self.session.upgrade() {
            Some(session) => session.give_back(Control::Return {
                id: self.descriptor.id,
            }),
            None => Err(SessionError::Closed("closed here")),
        }
    }
}

impl Drop for RemoteRegion {
    fn drop(&mut self) {
        if !self.handed_back {
            if let Some(session) = self.session.upgrade() {
                // On a session that ended there is nothing to release.
                let _ = session.give_back(Control::Release {
                    id: self.descriptor.id,
                });
            }
        }
    }
}

impl fmt::Debug for RemoteRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteRegion")
            .field("id", &self.descriptor.id)
            .field("remote", &self.descriptor.remote)
            .field("expires_at", &self.expires_at)
            .finish()
    }
}
