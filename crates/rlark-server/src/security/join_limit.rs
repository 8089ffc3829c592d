//! Rate limit of failed joins per source address.
//!
//! `POST /rlark/v1/join` needs no credentials, so anyone who reaches the port can guess
//! bootstrap tokens, and each guess would cost a store lookup and an audit record. A failed
//! join is one whose bootstrap token was refused (401: unknown, wrong secret, expired, used,
//! bound to another cluster); malformed requests (400) do not count. Each
//! source (an IPv4 address, or the /64 prefix of an IPv6 address, since one host commonly
//! owns a whole /64) has a bucket of [`JoinLimitConfig::burst`] failures that refills by one
//! every [`JoinLimitConfig::refill`]. The failure that empties the bucket blocks the source:
//! every join from it is refused with 429 and `Retry-After`, without looking at the token
//! (else the blocked source could go on guessing), for 1 s; a failure after the block, with
//! the bucket still empty, blocks it again for 2 s, then 4 s, ... up to
//! [`JoinLimitConfig::max_backoff`]. Successful joins cost nothing, so many agents
//! joining from one address (behind NAT) are never limited; one source that guesses does
//! block the agents behind its address while its block lasts.
//!
//! Memory is bounded: at most [`MAX_SOURCES`] sources are tracked; sources whose bucket is
//! full again are forgotten first, then the least recently seen.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Sources tracked at most (about 100 bytes each).
pub const MAX_SOURCES: usize = 65_536;

/// Length of the first block; each further block doubles it, up to `max_backoff`.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);

/// Settings of the join rate limit (config file section `security`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinLimitConfig {
    /// Failed joins a source may make in a row; the last of them blocks it (default 5).
    pub burst: u32,
    /// One failure is forgiven per this interval (default 60 s).
    pub refill: Duration,
    /// Longest block (default 300 s).
    pub max_backoff: Duration,
}

impl Default for JoinLimitConfig {
    /// 5 failures, one forgiven per minute, blocks of 1 s doubling up to 5 min.
    fn default() -> Self {
        Self {
            burst: 5,
            refill: Duration::from_secs(60),
            max_backoff: Duration::from_secs(300),
        }
    }
}

/// What a failure did to its source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Blocked {
    /// How long the source is refused now.
    pub retry_after: Duration,
    /// Blocks of this source in a row (1 for the first).
    pub blocks: u32,
    /// Joins refused while the previous block lasted.
    pub refused_before: u64,
}

#[derive(Debug)]
struct Source {
    /// Failures left before a block (fractional: refilled continuously).
    tokens: f64,
    /// When `tokens` was last brought up to date.
    updated: Instant,
    /// Blocks in a row; reset once the bucket is full again.
    blocks: u32,
    blocked_until: Option<Instant>,
    /// Joins refused during the current (or last) block.
    refused: u64,
    last_seen: Instant,
}

/// The per-source failure buckets.
#[derive(Debug)]
pub(crate) struct JoinLimiter {
    config: JoinLimitConfig,
    sources: Mutex<HashMap<IpAddr, Source>>,
}

/// The key a source is tracked under: IPv4 addresses (also IPv4-mapped IPv6 ones) as they
/// are, IPv6 addresses by their /64 prefix.
fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

impl JoinLimiter {
    pub(crate) fn new(config: JoinLimitConfig) -> Self {
        Self {
            config,
            sources: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Source>> {
        self.sources
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Refill `source`'s bucket up to `now`; a full bucket ends the streak of blocks.
    fn refill(&self, source: &mut Source, now: Instant) {
        let elapsed = now.saturating_duration_since(source.updated);
        let burst = f64::from(self.config.burst);
        source.tokens =
            (source.tokens + elapsed.as_secs_f64() / self.config.refill.as_secs_f64()).min(burst);
        source.updated = now;
        let blocked = source.blocked_until.is_some_and(|until| until > now);
        if source.tokens >= burst && !blocked {
            source.blocks = 0;
        }
    }

    /// `Err(retry_after)` when joins from `ip` are refused at `now` (counted for the next
    /// block's audit record).
    pub(crate) fn check(&self, ip: IpAddr, now: Instant) -> Result<(), Duration> {
        let mut sources = self.lock();
        let Some(source) = sources.get_mut(&source_key(ip)) else {
            return Ok(());
        };
        source.last_seen = now;
        match source.blocked_until {
            Some(until) if until > now => {
                source.refused += 1;
                Err(until - now)
            }
            _ => Ok(()),
        }
    }

    /// Count a failed join from `ip` at `now`. `Some` when it started a block.
    pub(crate) fn failure(&self, ip: IpAddr, now: Instant) -> Option<Blocked> {
        let key = source_key(ip);
        let mut sources = self.lock();
        if !sources.contains_key(&key) && sources.len() >= MAX_SOURCES {
            self.evict(&mut sources, now);
        }
        let source = sources.entry(key).or_insert_with(|| Source {
            tokens: f64::from(self.config.burst),
            updated: now,
            blocks: 0,
            blocked_until: None,
            refused: 0,
            last_seen: now,
        });
        source.last_seen = now;
        self.refill(source, now);
        if source.tokens >= 1.0 {
            source.tokens -= 1.0;
        }
        if source.tokens >= 1.0 {
            return None;
        }
        // Out of failures: block, twice as long as the previous block.
        let factor = 2u32.saturating_pow(source.blocks.min(31));
        let retry_after = FIRST_BACKOFF
            .saturating_mul(factor)
            .min(self.config.max_backoff);
        source.blocks = source.blocks.saturating_add(1);
        source.blocked_until = Some(now + retry_after);
        let refused_before = std::mem::take(&mut source.refused);
        Some(Blocked {
            retry_after,
            blocks: source.blocks,
            refused_before,
        })
    }

    /// Make room for one source: forget those whose bucket is full again (they carry no
    /// state worth keeping); if that frees nothing, the eighth least recently seen, so that
    /// the cost of this pass is shared by many insertions.
    fn evict(&self, sources: &mut HashMap<IpAddr, Source>, now: Instant) {
        let burst = f64::from(self.config.burst);
        let refill = self.config.refill.as_secs_f64();
        sources.retain(|_, s| {
            let tokens = s.tokens + now.saturating_duration_since(s.updated).as_secs_f64() / refill;
            tokens < burst || s.blocked_until.is_some_and(|until| until > now)
        });
        if sources.len() >= MAX_SOURCES {
            let mut seen: Vec<Instant> = sources.values().map(|s| s.last_seen).collect();
            let (_, cutoff, _) = seen.select_nth_unstable(MAX_SOURCES / 8);
            let cutoff = *cutoff;
            sources.retain(|_, s| s.last_seen > cutoff);
        }
    }

    /// Sources tracked now (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(burst: u32, refill_secs: u64) -> JoinLimiter {
        JoinLimiter::new(JoinLimitConfig {
            burst,
            refill: Duration::from_secs(refill_secs),
            max_backoff: Duration::from_secs(16),
        })
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[test]
    fn a_source_is_blocked_after_its_burst_with_growing_capped_backoff() {
        let limiter = limiter(3, 3600);
        let mut now = Instant::now();
        for _ in 0..2 {
            assert_eq!(limiter.check(A, now), Ok(()));
            assert_eq!(limiter.failure(A, now), None);
        }
        assert_eq!(limiter.check(A, now), Ok(()));
        let first = limiter.failure(A, now).expect("the third failure blocks");
        assert_eq!(first.retry_after, Duration::from_secs(1));
        assert_eq!(first.blocks, 1);
        assert_eq!(limiter.check(A, now), Err(Duration::from_secs(1)));
        assert_eq!(limiter.check(A, now), Err(Duration::from_secs(1)));
        // Another source is not affected.
        assert_eq!(limiter.check(B, now), Ok(()));
        assert_eq!(limiter.failure(B, now), None);

        // Each further block doubles, up to the cap (16 s here).
        let mut waits = Vec::new();
        let mut refused_before = Vec::new();
        let mut wait = first.retry_after;
        for _ in 0..7 {
            now += wait;
            assert_eq!(limiter.check(A, now), Ok(()), "free again after the block");
            let blocked = limiter.failure(A, now).expect("blocked at once again");
            wait = blocked.retry_after;
            waits.push(blocked.retry_after.as_secs());
            refused_before.push(blocked.refused_before);
        }
        assert_eq!(waits, [2, 4, 8, 16, 16, 16, 16]);
        assert_eq!(
            refused_before[0], 2,
            "refusals of the first block are reported"
        );
    }

    #[test]
    fn successes_are_free_and_the_bucket_refills() {
        let limiter = limiter(2, 60);
        let now = Instant::now();
        // Successes never call `failure`; a source with failures below the burst is fine.
        assert_eq!(limiter.failure(A, now), None);
        // One failure is forgiven per refill interval.
        let later = now + Duration::from_secs(60);
        assert_eq!(limiter.failure(A, later), None);
        let blocked = limiter.failure(A, later).expect("blocked");
        assert_eq!(blocked.blocks, 1);
        // Quiet for long enough: the streak of blocks is forgotten too.
        let much_later = later + Duration::from_secs(3600);
        assert_eq!(limiter.check(A, much_later), Ok(()));
        assert_eq!(limiter.failure(A, much_later), None);
        let again = limiter.failure(A, much_later).expect("blocked");
        assert_eq!(
            (again.retry_after, again.blocks),
            (Duration::from_secs(1), 1)
        );
    }

    #[test]
    fn ipv6_sources_are_grouped_by_64_prefix_and_mapped_v4_is_v4() {
        let limiter = limiter(2, 60);
        let now = Instant::now();
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::7".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(limiter.failure(a, now), None);
        assert!(limiter.failure(b, now).is_some(), "same /64");
        assert!(limiter.check(a, now).is_err());
        assert_eq!(limiter.check(other, now), Ok(()));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(limiter.failure(mapped, now), None);
        assert!(
            limiter.failure(A, now).is_some(),
            "::ffff:10.0.0.1 is 10.0.0.1"
        );
    }

    #[test]
    fn the_source_table_is_bounded() {
        let limiter = limiter(5, 60);
        let now = Instant::now();
        for i in 0..(MAX_SOURCES as u32 + 100) {
            let ip = IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            limiter.failure(ip, now);
        }
        assert!(limiter.len() <= MAX_SOURCES, "{} sources", limiter.len());
    }
}
