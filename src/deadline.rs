//! A point in time to give up at. A timeout too long to add to the clock
//! (`Duration::MAX`, say) means "never", not a panic.

use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
pub(crate) struct Deadline(Option<Instant>);

impl Deadline {
    /// `timeout` from now; never, if that is beyond what `Instant` holds.
    pub(crate) fn after(timeout: Duration) -> Self {
        Deadline(Instant::now().checked_add(timeout))
    }

    pub(crate) fn expired(&self) -> bool {
        self.0.is_some_and(|at| Instant::now() >= at)
    }

    /// Time left, zero once expired; `Duration::MAX` for never.
    pub(crate) fn remaining(&self) -> Duration {
        match self.0 {
            Some(at) => at.saturating_duration_since(Instant::now()),
            None => Duration::MAX,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unrepresentable_timeout_never_expires() {
        let never = Deadline::after(Duration::MAX);
        assert!(!never.expired());
        assert_eq!(never.remaining(), Duration::MAX);
        let now = Deadline::after(Duration::ZERO);
        assert!(now.expired());
        assert_eq!(now.remaining(), Duration::ZERO);
    }
}
