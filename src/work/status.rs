//! Work completion status, with the codes of `ibv_wc_status`.

use std::fmt;

/// The outcome of a work request, as its completion reports it. The
/// numeric codes are those of `ibv_wc_status`.
///
/// ```
/// use rdma_ring::backend::WcStatus;
/// assert_eq!(WcStatus::from_code(10), WcStatus::RemAccessErr);
/// assert_eq!(WcStatus::RemAccessErr.code(), 10);
/// assert!(WcStatus::WrFlushErr.is_flush());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum WcStatus {
    /// The work request completed.
    #[default]
    Success,
    /// Local length error: a receive buffer too small, or a bad length.
    LocLenErr,
    /// Local QP operation error: an internal consistency error.
    LocQpOpErr,
    /// Local protection error: a local buffer's key or bounds are wrong.
    LocProtErr,
    /// Flushed: the QP went to the error state before the WR completed.
    /// A WR still waiting to run never ran; one already on the wire may
    /// have taken effect at the responder (an atomic may have been
    /// applied), so a flushed WR is not safe to simply retry.
    WrFlushErr,
    /// Bad response from the peer.
    BadRespErr,
    /// Local access error: a local buffer lacks the rights the WR needs.
    LocAccessErr,
    /// Remote invalid request: the peer refused the request (bad opcode,
    /// misaligned atomic, receive buffer too small at the peer).
    RemInvReqErr,
    /// Remote access error: wrong rkey, out of bounds, or missing rights.
    RemAccessErr,
    /// Remote operation error: the peer could not complete the request.
    RemOpErr,
    /// Transport retries exhausted: the peer did not answer.
    RetryExcErr,
    /// RNR retries exhausted: the peer had no receive posted.
    RnrRetryExcErr,
    /// Fatal device error.
    FatalErr,
    /// Response timeout.
    RespTimeoutErr,
    /// General error.
    GeneralErr,
    /// Another `ibv_wc_status` code.
    Other(u32),
}

impl WcStatus {
    /// The status for an `ibv_wc_status` code.
    pub fn from_code(code: u32) -> Self {
        match code {
            0 => WcStatus::Success,
            1 => WcStatus::LocLenErr,
            2 => WcStatus::LocQpOpErr,
            4 => WcStatus::LocProtErr,
            5 => WcStatus::WrFlushErr,
            7 => WcStatus::BadRespErr,
            8 => WcStatus::LocAccessErr,
            9 => WcStatus::RemInvReqErr,
            10 => WcStatus::RemAccessErr,
            11 => WcStatus::RemOpErr,
            12 => WcStatus::RetryExcErr,
            13 => WcStatus::RnrRetryExcErr,
            19 => WcStatus::FatalErr,
            20 => WcStatus::RespTimeoutErr,
            21 => WcStatus::GeneralErr,
            other => WcStatus::Other(other),
        }
    }

    /// The `ibv_wc_status` code.
    pub fn code(self) -> u32 {
        match self {
            WcStatus::Success => 0,
            WcStatus::LocLenErr => 1,
            WcStatus::LocQpOpErr => 2,
            WcStatus::LocProtErr => 4,
            WcStatus::WrFlushErr => 5,
            WcStatus::BadRespErr => 7,
            WcStatus::LocAccessErr => 8,
            WcStatus::RemInvReqErr => 9,
            WcStatus::RemAccessErr => 10,
            WcStatus::RemOpErr => 11,
            WcStatus::RetryExcErr => 12,
            WcStatus::RnrRetryExcErr => 13,
            WcStatus::FatalErr => 19,
            WcStatus::RespTimeoutErr => 20,
            WcStatus::GeneralErr => 21,
            WcStatus::Other(code) => code,
        }
    }

    /// Whether the work request completed successfully.
    pub fn is_success(self) -> bool {
        self == WcStatus::Success
    }

    /// Whether the work request was flushed: it did not complete, and
    /// may or may not have taken effect at the responder (see
    /// [`WcStatus::WrFlushErr`]).
    pub fn is_flush(self) -> bool {
        self == WcStatus::WrFlushErr
    }

    fn describe(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error (buffer too small or bad length)",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocProtErr => "local protection error (bad lkey or out of bounds)",
            WcStatus::WrFlushErr => "flushed: the queue pair was in the error state",
            WcStatus::BadRespErr => "bad response from the peer",
            WcStatus::LocAccessErr => "local access error (missing local rights)",
            WcStatus::RemInvReqErr => {
                "remote invalid request (misaligned atomic, or receive too small at the peer)"
            }
            WcStatus::RemAccessErr => {
                "remote access error (wrong rkey, out of bounds, or missing rights)"
            }
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retries exhausted: the peer did not answer",
            WcStatus::RnrRetryExcErr => "RNR retries exhausted: the peer posted no receive",
            WcStatus::FatalErr => "fatal device error",
            WcStatus::RespTimeoutErr => "response timeout",
            WcStatus::GeneralErr => "general error",
            WcStatus::Other(_) => "other work completion error",
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (ibv_wc_status {})", self.describe(), self.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for code in 0..32 {
            assert_eq!(WcStatus::from_code(code).code(), code);
        }
    }

    #[test]
    fn display_names_the_code() {
        assert!(WcStatus::RemAccessErr
            .to_string()
            .contains("ibv_wc_status 10"));
    }
}
