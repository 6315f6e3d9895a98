//! A per-endpoint circuit breaker: after `threshold` consecutive failures
//! the endpoint gets no traffic for a cool-down, then one probe request
//! decides whether it closes again or stays open.

use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen { probing: bool },
}

/// What the breaker says about sending now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Traffic may go.
    Pass,
    /// Open until then.
    OpenUntil(Instant),
    /// Half-open and the one probe is in flight; its outcome decides.
    ProbeInFlight,
}

#[derive(Debug)]
pub(crate) struct Breaker {
    state: State,
    threshold: u32,
    cooldown: Duration,
    pub(crate) opened: u64,
}

impl Breaker {
    pub(crate) fn new(threshold: u32, cooldown: Duration) -> Breaker {
        Breaker {
            state: State::Closed { failures: 0 },
            threshold: threshold.max(1),
            cooldown,
            opened: 0,
        }
    }

    /// Whether a request could go now, without committing to sending one.
    pub(crate) fn peek(&self, now: Instant) -> Gate {
        match self.state {
            State::Closed { .. } | State::HalfOpen { probing: false } => Gate::Pass,
            State::Open { until } if now >= until => Gate::Pass,
            State::Open { until } => Gate::OpenUntil(until),
            State::HalfOpen { probing: true } => Gate::ProbeInFlight,
        }
    }

    /// Commits to sending one request. `Some(true)` means it is the probe of
    /// a half-open breaker; `None` means the gate closed meanwhile.
    pub(crate) fn enter(&mut self, now: Instant) -> Option<bool> {
        match self.state {
            State::Closed { .. } => Some(false),
            State::Open { until } if now >= until => {
                self.state = State::HalfOpen { probing: true };
                Some(true)
            }
            State::HalfOpen { probing: false } => {
                self.state = State::HalfOpen { probing: true };
                Some(true)
            }
            State::Open { .. } | State::HalfOpen { probing: true } => None,
        }
    }

    pub(crate) fn success(&mut self) {
        self.state = State::Closed { failures: 0 };
    }

    /// Returns true when this failure opened the breaker.
    pub(crate) fn failure(&mut self, now: Instant) -> bool {
        match self.state {
            State::Closed { failures } if failures + 1 < self.threshold => {
                self.state = State::Closed {
                    failures: failures + 1,
                };
                false
            }
            State::Closed { .. } | State::HalfOpen { .. } => {
                self.state = State::Open {
                    until: crate::limits::later(now, self.cooldown),
                };
                self.opened += 1;
                true
            }
            // A request admitted before the breaker opened failed too;
            // the cool-down already runs.
            State::Open { .. } => false,
        }
    }

    /// An outcome that says nothing about the endpoint's health (a 429, a
    /// client error, a cancelled probe): a probe's slot is given back.
    pub(crate) fn neutral(&mut self, probe: bool) {
        if probe && self.state == (State::HalfOpen { probing: true }) {
            self.state = State::HalfOpen { probing: false };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_threshold_then_half_opens_with_one_probe() {
        let t0 = Instant::now();
        let mut b = Breaker::new(3, Duration::from_secs(10));
        for _ in 0..2 {
            assert_eq!(b.enter(t0), Some(false));
            assert!(!b.failure(t0));
        }
        assert_eq!(b.peek(t0), Gate::Pass);
        assert!(b.failure(t0));
        assert_eq!(b.peek(t0), Gate::OpenUntil(t0 + Duration::from_secs(10)));
        assert_eq!(b.enter(t0), None);
        let later = t0 + Duration::from_secs(11);
        assert_eq!(b.peek(later), Gate::Pass);
        assert_eq!(b.enter(later), Some(true));
        assert_eq!(b.peek(later), Gate::ProbeInFlight);
        assert_eq!(b.enter(later), None);
        // A failed probe opens it again for a full cool-down.
        assert!(b.failure(later));
        assert_eq!(b.opened, 2);
        let again = later + Duration::from_secs(11);
        assert_eq!(b.enter(again), Some(true));
        b.neutral(true);
        assert_eq!(b.enter(again), Some(true));
        b.success();
        assert_eq!(b.peek(again), Gate::Pass);
        assert_eq!(b.enter(again), Some(false));
    }

    #[test]
    fn success_resets_the_count() {
        let t0 = Instant::now();
        let mut b = Breaker::new(2, Duration::from_secs(1));
        assert!(!b.failure(t0));
        b.success();
        assert!(!b.failure(t0));
        assert!(b.failure(t0));
    }
}
