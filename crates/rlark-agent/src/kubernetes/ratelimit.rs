//! The creation rate limit (`--max-creates-per-minute`, default
//! [`DEFAULT_MAX_CREATES_PER_MINUTE`]): at most N workload creations in any sliding
//! 60-second window. Over the limit the caller is told when to try again; a Task is
//! deferred, never failed. Every creation attempt counts (a failed create still cost
//! the member API a request). Sans-IO: the caller passes the time.

use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

/// Default of `--max-creates-per-minute` (agent-lightning's).
pub use crate::config::DEFAULT_MAX_CREATES_PER_MINUTE;
/// The window.
pub const WINDOW: Duration = Duration::from_secs(60);

/// The limiter's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Create now (counted).
    Allowed,
    /// Do not create before `until` (not counted).
    DeferUntil(Instant),
}

/// At most `max` creations per [`WINDOW`].
#[derive(Clone, Debug)]
pub struct CreateLimiter {
    max: usize,
    recent: VecDeque<Instant>,
}

impl CreateLimiter {
    /// A limiter of `max` creations per minute.
    pub fn new(max: NonZeroU32) -> Self {
        let max = usize::try_from(max.get()).unwrap_or(usize::MAX);
        Self {
            max,
            recent: VecDeque::with_capacity(max.min(1024)),
        }
    }

    /// May a creation happen at `now`? `Allowed` records it. `now` must not go backwards
    /// (an `Instant` does not).
    pub fn try_acquire(&mut self, now: Instant) -> Admission {
        while let Some(&oldest) = self.recent.front() {
            if now.saturating_duration_since(oldest) >= WINDOW {
                self.recent.pop_front();
            } else {
                break;
            }
        }
        if self.recent.len() < self.max {
            self.recent.push_back(now);
            return Admission::Allowed;
        }
        // Full: the oldest creation in the window leaves it at oldest + WINDOW.
        let oldest = self.recent.front().copied().unwrap_or(now);
        Admission::DeferUntil(oldest + WINDOW)
    }

    /// Creations counted in the window ending at the last call.
    pub fn in_window(&self) -> usize {
        self.recent.len()
    }
}

impl Default for CreateLimiter {
    fn default() -> Self {
        Self::new(NonZeroU32::new(DEFAULT_MAX_CREATES_PER_MINUTE).unwrap_or(NonZeroU32::MIN))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_hundred_fifty_creates_in_a_minute_are_one_hundred_then_deferred() {
        let start = Instant::now();
        let mut limiter = CreateLimiter::default();
        // 150 creations asked for, one every 100 ms (15 s in all).
        let step = Duration::from_millis(100);
        let mut allowed = Vec::new();
        let mut deferred = Vec::new();
        for i in 0..150u32 {
            let now = start + step * i;
            match limiter.try_acquire(now) {
                Admission::Allowed => allowed.push(i),
                Admission::DeferUntil(until) => deferred.push((i, until)),
            }
        }
        assert_eq!(allowed, (0..100).collect::<Vec<_>>());
        assert_eq!(deferred.len(), 50);
        // All wait for the first creation (at `start`) to leave the window.
        assert!(deferred.iter().all(|(_, until)| *until == start + WINDOW));
        assert_eq!(limiter.in_window(), 100);

        // Just before: still deferred. At the instant: one slot per creation that left.
        let almost = start + WINDOW - Duration::from_millis(1);
        assert_eq!(
            limiter.try_acquire(almost),
            Admission::DeferUntil(start + WINDOW)
        );
        assert_eq!(limiter.try_acquire(start + WINDOW), Admission::Allowed);
        assert_eq!(
            limiter.try_acquire(start + WINDOW),
            Admission::DeferUntil(start + step + WINDOW),
            "the next slot frees when the second creation leaves"
        );
        // After a quiet minute everything is free again.
        let later = start + WINDOW * 3;
        for _ in 0..100 {
            assert_eq!(limiter.try_acquire(later), Admission::Allowed);
        }
        assert!(matches!(
            limiter.try_acquire(later),
            Admission::DeferUntil(_)
        ));
    }

    #[test]
    fn a_small_limit() {
        let start = Instant::now();
        let mut limiter = CreateLimiter::new(NonZeroU32::MIN);
        assert_eq!(limiter.try_acquire(start), Admission::Allowed);
        assert_eq!(
            limiter.try_acquire(start + Duration::from_secs(59)),
            Admission::DeferUntil(start + WINDOW)
        );
        assert_eq!(limiter.try_acquire(start + WINDOW), Admission::Allowed);
    }
}
