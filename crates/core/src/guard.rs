//! What keeps a listener standing when clients are hostile, as values: the caches of
//! authentication and authorization answers (bounded, with the kubelet's TTLs), the back-off of
//! an accept loop after an error (a process out of file descriptors must not spin), and a
//! warning said at most once per period with a count of the ones held back.
//!
//! Time is passed in (`now`), so every rule is tested without waiting.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// How long review answers are kept, as the kubelet keeps them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReviewTtls {
    /// A token the API server authenticated (`--authentication-token-webhook-cache-ttl`).
    pub authenticated: Duration,
    /// A token it did not authenticate. The kubelet's delegating authenticator caches both
    /// answers for the same TTL (`cache.New(tokenAuth, false, ttl, ttl)`), so the same flag
    /// sets it.
    pub unauthenticated: Duration,
    /// An allowed SubjectAccessReview (`--authorization-webhook-cache-authorized-ttl`).
    pub allowed: Duration,
    /// A denied one (`--authorization-webhook-cache-unauthorized-ttl`).
    pub denied: Duration,
}

impl Default for ReviewTtls {
    /// The kubelet's defaults: tokens 2 min, allowed 5 min, denied 30 s.
    fn default() -> Self {
        Self {
            authenticated: Duration::from_secs(120),
            unauthenticated: Duration::from_secs(120),
            allowed: Duration::from_secs(300),
            denied: Duration::from_secs(30),
        }
    }
}

impl ReviewTtls {
    /// The TTLs with the token TTL set to `ttl` (for both answers, as the kubelet's flag).
    #[must_use]
    pub fn with_token_ttl(mut self, ttl: Duration) -> Self {
        self.authenticated = ttl;
        self.unauthenticated = ttl;
        self
    }
}

/// A map whose entries expire, holding at most `capacity` of them. When full, expired entries
/// go first; if none has expired, the one expiring soonest makes room, so a flood of new keys
/// cannot grow memory and the newest answer is always kept.
#[derive(Debug)]
pub struct TtlCache<K, V> {
    entries: HashMap<K, (V, Instant)>,
    capacity: usize,
}

impl<K: Hash + Eq + Clone, V: Clone> TtlCache<K, V> {
    /// An empty cache of at most `capacity` entries (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: HashMap::new(),
            capacity: capacity.max(1),
        }
    }

    /// The value of `key` if it has not expired at `now`; an expired one is forgotten.
    pub fn get(&mut self, key: &K, now: Instant) -> Option<V> {
        match self.entries.get(key) {
            Some((v, until)) if *until > now => Some(v.clone()),
            Some(_) => {
                self.entries.remove(key);
                None
            }
            None => None,
        }
    }

    /// Keeps `value` for `key` until `now + ttl`. A zero TTL keeps nothing.
    pub fn insert(&mut self, key: K, value: V, ttl: Duration, now: Instant) {
        if ttl.is_zero() {
            self.entries.remove(&key);
            return;
        }
        if !self.entries.contains_key(&key) && self.entries.len() >= self.capacity {
            self.entries.retain(|_, (_, until)| *until > now);
            if self.entries.len() >= self.capacity
                && let Some(soonest) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, until))| *until)
                    .map(|(k, _)| k.clone())
            {
                self.entries.remove(&soonest);
            }
        }
        self.entries.insert(key, (value, now + ttl));
    }

    /// Entries held (expired ones included until they are looked up or make room).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// How long an accept loop waits after its `consecutive`-th failed accept in a row (1 for the
/// first): 5 ms doubling up to 1 s, as Go's `net/http` server does. A process out of file
/// descriptors (EMFILE) then retries a few times a second instead of spinning on the error.
pub fn accept_backoff(consecutive: u32) -> Duration {
    const FIRST: Duration = Duration::from_millis(5);
    const MAX: Duration = Duration::from_secs(1);
    if consecutive == 0 {
        return Duration::ZERO;
    }
    let doublings = (consecutive - 1).min(16);
    FIRST.saturating_mul(1 << doublings).min(MAX)
}

/// A warning said at most once per `every`: the ones in between are counted and the count goes
/// with the next one said.
#[derive(Debug, Clone)]
pub struct WarnLimiter {
    every: Duration,
    last: Option<Instant>,
    held_back: u64,
}

impl WarnLimiter {
    /// At most one warning per `every`.
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            last: None,
            held_back: 0,
        }
    }

    /// Whether to say the warning at `now`: `Some(n)` with the number held back since the last
    /// one said, or `None` (then it is counted).
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < self.every => {
                self.held_back = self.held_back.saturating_add(1);
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.held_back))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_expire_at_their_ttl() {
        let t0 = Instant::now();
        let mut c = TtlCache::new(10);
        c.insert("a", 1, Duration::from_secs(10), t0);
        assert_eq!(c.get(&"a", t0 + Duration::from_secs(9)), Some(1));
        assert_eq!(c.get(&"a", t0 + Duration::from_secs(10)), None);
        assert!(c.is_empty(), "an expired entry is forgotten when looked up");
        c.insert("b", 2, Duration::ZERO, t0);
        assert_eq!(c.get(&"b", t0), None);
    }

    #[test]
    fn a_full_cache_drops_expired_entries_then_the_soonest_to_expire() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut c = TtlCache::new(3);
        c.insert(1, (), s(100), t0);
        c.insert(2, (), s(5), t0);
        c.insert(3, (), s(50), t0);
        // Nothing expired: the one expiring soonest (2) makes room.
        c.insert(4, (), s(100), t0);
        assert_eq!(c.len(), 3);
        assert_eq!(c.get(&2, t0), None);
        assert!(c.get(&1, t0).is_some() && c.get(&3, t0).is_some() && c.get(&4, t0).is_some());
        // Later, 3 has expired: it goes, not 1.
        c.insert(5, (), s(100), t0 + s(60));
        assert_eq!(c.len(), 3);
        assert!(c.get(&1, t0 + s(60)).is_some());
        // A flood of new keys never grows it.
        for k in 100..10_000 {
            c.insert(k, (), s(10), t0 + s(61));
        }
        assert_eq!(c.len(), 3);
        // Updating a key already held evicts nothing.
        c.insert(9_999, (), s(10), t0 + s(61));
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn the_kubelets_ttls_are_the_defaults() {
        let t = ReviewTtls::default();
        assert_eq!(t.authenticated, Duration::from_secs(120));
        assert_eq!(t.unauthenticated, Duration::from_secs(120));
        assert_eq!(t.allowed, Duration::from_secs(300));
        assert_eq!(t.denied, Duration::from_secs(30));
        let t = t.with_token_ttl(Duration::from_secs(10));
        assert_eq!(
            (t.authenticated, t.unauthenticated),
            (Duration::from_secs(10), Duration::from_secs(10))
        );
    }

    #[test]
    fn accept_errors_back_off_from_5_ms_to_1_s() {
        assert_eq!(accept_backoff(0), Duration::ZERO);
        assert_eq!(accept_backoff(1), Duration::from_millis(5));
        assert_eq!(accept_backoff(2), Duration::from_millis(10));
        assert_eq!(accept_backoff(8), Duration::from_millis(640));
        assert_eq!(accept_backoff(9), Duration::from_secs(1));
        assert_eq!(accept_backoff(u32::MAX), Duration::from_secs(1));
        // 30 s of EMFILE is at most a few dozen retries, not millions.
        let mut spent = Duration::ZERO;
        let mut retries = 0;
        while spent < Duration::from_secs(30) {
            retries += 1;
            spent += accept_backoff(retries);
        }
        assert!(retries < 50, "{retries}");
    }

    #[test]
    fn a_warning_is_said_once_per_period_with_the_count_held_back() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut w = WarnLimiter::new(Duration::from_secs(10));
        assert_eq!(w.allow(t0), Some(0));
        for i in 1..=1000 {
            assert_eq!(w.allow(t0 + ms(i)), None);
        }
        assert_eq!(w.allow(t0 + Duration::from_secs(10)), Some(1000));
        assert_eq!(w.allow(t0 + Duration::from_secs(11)), None);
        assert_eq!(w.allow(t0 + Duration::from_secs(25)), Some(1));
    }
}
