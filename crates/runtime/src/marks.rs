//! Marks a controller's index keeps beside its caches, each a plain value behind the index's
//! one lock (`&mut self`): keys held back for a window ([`Holds`]), and writes a watch has not
//! shown yet ([`Expected`]).

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

/// Keys held back for a window: the first sighting holds a key, later ones within the window
/// keep holding it, the first one after lets it through (and forgets it). What a key's holder
/// does meanwhile (come back when the window is over: [`Queue::add_after`] what is left) is up
/// to the caller.
pub struct Holds<K> {
    window: Duration,
    since: HashMap<K, std::time::Instant>,
}

/// What [`Holds::hold`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// Held from now on: come back after this long (the window).
    Newly(Duration),
    /// Still within its window: come back after this long (what is left of it).
    Still(Duration),
    /// The window is over: go ahead.
    Over,
}

impl<K> std::fmt::Debug for Holds<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Holds")
            .field("window", &self.window)
            .finish_non_exhaustive()
    }
}

impl<K: Clone + Eq + Hash> Holds<K> {
    /// Holds of `window` each.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            since: HashMap::new(),
        }
    }

    /// Whether `key`, seen at `now`, is held.
    pub fn hold(&mut self, key: &K, now: std::time::Instant) -> Hold {
        let since = &mut self.since;
        match since.get(key) {
            None => {
                since.insert(key.clone(), now);
                Hold::Newly(self.window)
            }
            // A margin, so that the caller coming back after the window never finds it open.
            Some(t)
                if now.saturating_duration_since(*t) + Duration::from_millis(5) < self.window =>
            {
                Hold::Still(
                    self.window
                        .saturating_sub(now.saturating_duration_since(*t)),
                )
            }
            Some(_) => {
                since.remove(key);
                Hold::Over
            }
        }
    }

    /// Forgets `key` (its business was done another way).
    pub fn release(&mut self, key: &K) {
        self.since.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_held_for_its_window_then_let_through_once() {
        let mut holds = Holds::new(Duration::from_millis(200));
        let t0 = std::time::Instant::now();
        assert_eq!(
            holds.hold(&"a", t0),
            Hold::Newly(Duration::from_millis(200))
        );
        assert_eq!(
            holds.hold(&"a", t0 + Duration::from_millis(150)),
            Hold::Still(Duration::from_millis(50))
        );
        assert_eq!(
            holds.hold(&"b", t0 + Duration::from_millis(100)),
            Hold::Newly(Duration::from_millis(200))
        );
        assert_eq!(
            holds.hold(&"a", t0 + Duration::from_millis(200)),
            Hold::Over
        );
        // Let through and forgotten: the next sighting opens a new window.
        assert_eq!(
            holds.hold(&"a", t0 + Duration::from_millis(210)),
            Hold::Newly(Duration::from_millis(200))
        );
        // Released: forgotten at once.
        holds.release(&"b");
        assert_eq!(
            holds.hold(&"b", t0 + Duration::from_millis(110)),
            Hold::Newly(Duration::from_millis(200))
        );
    }
}

/// Writes whose result a watch has not shown yet: after a create succeeds, the watch that
/// fills the cache may not have delivered the object when its key is reconciled again (another
/// change of the key came meanwhile), and the cache would say to create it again (a create
/// answered AlreadyExists and a GET: two round trips for nothing). A key is expected, with the
/// version it was written for (the upper pod's UID), from the write until the watch shows
/// anything of that key, and for at most `window` (a watch that never shows it must not hold
/// the key back for good: the next create is idempotent anyway).
pub struct Expected<K> {
    window: Duration,
    since: HashMap<K, (String, std::time::Instant)>,
}

impl<K> std::fmt::Debug for Expected<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Expected")
            .field("window", &self.window)
            .finish_non_exhaustive()
    }
}

impl<K: Clone + Eq + Hash> Expected<K> {
    /// Expectations that last at most `window`.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            since: HashMap::new(),
        }
    }

    /// `key` was written for `version` at `now`.
    pub fn written(&mut self, key: K, version: &str, now: std::time::Instant) {
        self.since.insert(key, (version.to_owned(), now));
    }

    /// The watch showed something of `key`: the cache is to be believed again.
    pub fn seen(&mut self, key: &K) {
        self.since.remove(key);
    }

    /// Whether a write of `key` for `version` was made within the window and the watch has not
    /// shown the key since (the cache's absence of it is not to be believed).
    pub fn pending(&mut self, key: &K, version: &str, now: std::time::Instant) -> bool {
        let since = &mut self.since;
        match since.get(key) {
            Some((v, t)) if v == version && now.saturating_duration_since(*t) < self.window => true,
            Some(_) => {
                since.remove(key);
                false
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod expected_tests {
    use super::*;

    #[test]
    fn a_write_is_expected_until_the_watch_shows_the_key_or_the_window_ends() {
        let mut expected = Expected::new(Duration::from_secs(30));
        let t0 = std::time::Instant::now();
        assert!(!expected.pending(&"a", "uid-1", t0));
        expected.written("a", "uid-1", t0);
        assert!(expected.pending(&"a", "uid-1", t0 + Duration::from_secs(1)));
        // Another version of the key (the upper pod made again) is not expected.
        assert!(!expected.pending(&"a", "uid-2", t0 + Duration::from_secs(1)));
        expected.written("a", "uid-1", t0);
        // Seen by the watch: the cache is right again.
        expected.seen(&"a");
        assert!(!expected.pending(&"a", "uid-1", t0 + Duration::from_secs(1)));
        // Never seen: the window ends it.
        expected.written("b", "uid-3", t0);
        assert!(expected.pending(&"b", "uid-3", t0 + Duration::from_secs(29)));
        assert!(!expected.pending(&"b", "uid-3", t0 + Duration::from_secs(30)));
        assert!(!expected.pending(&"b", "uid-3", t0 + Duration::from_secs(1)));
    }
}
