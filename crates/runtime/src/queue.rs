//! A keyed work queue: each key is worked on by at most one worker at a time, a key that
//! changes while it is being worked on is worked on again afterwards, and failures come back
//! after a per-key exponential backoff (5 ms doubling to 10 s, like virtual-kubelet's).
//!
//! Two lanes: a key added as urgent ([`Queue::add_urgent`]) is taken before every key of the
//! normal lane, whenever they were added. The pod controller puts there what the lower
//! cluster reports (a pod Running downstairs: one status write upstairs), so that it does not
//! wait behind a burst of creations (three writes each with upper identity).

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

struct State<K> {
    /// Keys waiting for a worker, with when they started waiting and whether they are urgent.
    queued: HashMap<K, (Instant, bool)>,
    processing: HashSet<K>,
    /// Keys changed while being worked on, and whether a change was urgent.
    dirty: HashMap<K, bool>,
    failures: HashMap<K, u32>,
    retry: Retry,
}

/// The backoff of a failed key: `first` after the first failure, doubling up to `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retry {
    /// After the first failure.
    pub first: Duration,
    /// The longest.
    pub max: Duration,
}

impl Default for Retry {
    /// 5 ms doubling to 10 s, like virtual-kubelet's.
    fn default() -> Self {
        Retry {
            first: Duration::from_millis(5),
            max: Duration::from_secs(10),
        }
    }
}

impl Retry {
    /// The delay after the `n`th failure in a row (from 1).
    fn after(&self, n: u32) -> Duration {
        self.first
            .saturating_mul(1 << n.saturating_sub(1).min(20))
            .min(self.max)
    }
}

/// The queue; cheap to clone.
pub struct Queue<K> {
    state: Arc<Mutex<State<K>>>,
    tx: mpsc::UnboundedSender<K>,
    urgent_tx: mpsc::UnboundedSender<K>,
}

impl<K> Clone for Queue<K> {
    fn clone(&self) -> Self {
        Self {
            state: self.state.clone(),
            tx: self.tx.clone(),
            urgent_tx: self.urgent_tx.clone(),
        }
    }
}

impl<K> std::fmt::Debug for Queue<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue").finish_non_exhaustive()
    }
}

/// The receiving end, shared by the workers.
pub type Receiver<K> = Arc<tokio::sync::Mutex<Lanes<K>>>;

/// The two lanes' receivers.
#[derive(Debug)]
pub struct Lanes<K> {
    urgent: mpsc::UnboundedReceiver<K>,
    normal: mpsc::UnboundedReceiver<K>,
}

impl<K: Clone + Eq + Hash + Send + 'static> Queue<K> {
    /// A queue and its receiver, with the default [`Retry`].
    pub fn new() -> (Self, Receiver<K>) {
        Self::with_retry(Retry::default())
    }

    /// A queue and its receiver whose failed keys come back after `retry`.
    pub fn with_retry(retry: Retry) -> (Self, Receiver<K>) {
        let (tx, normal) = mpsc::unbounded_channel();
        let (urgent_tx, urgent) = mpsc::unbounded_channel();
        let state = State {
            queued: HashMap::new(),
            processing: HashSet::new(),
            dirty: HashMap::new(),
            failures: HashMap::new(),
            retry,
        };
        (
            Self {
                state: Arc::new(Mutex::new(state)),
                tx,
                urgent_tx,
            },
            Arc::new(tokio::sync::Mutex::new(Lanes { urgent, normal })),
        )
    }

    /// Asks for `key` to be worked on.
    pub fn add(&self, key: K) {
        self.push(key, false);
    }

    /// Asks for `key` to be worked on before every key of the normal lane.
    pub fn add_urgent(&self, key: K) {
        self.push(key, true);
    }

    fn push(&self, key: K, urgent: bool) {
        let Ok(mut s) = self.state.lock() else { return };
        if s.processing.contains(&key) {
            *s.dirty.entry(key).or_insert(false) |= urgent;
            return;
        }
        match s.queued.get_mut(&key) {
            // Waiting in the normal lane: sent again in the urgent one; whichever copy comes
            // first is worked on, the other finds the key no longer queued and is dropped.
            Some((_, was_urgent)) if urgent && !*was_urgent => {
                *was_urgent = true;
                let _ = self.urgent_tx.send(key);
            }
            Some(_) => {}
            None => {
                s.queued.insert(key.clone(), (Instant::now(), urgent));
                let _ = if urgent {
                    self.urgent_tx.send(key)
                } else {
                    self.tx.send(key)
                };
            }
        }
    }

    /// The next key for a worker to work on, and how long it waited; None once `stop` is
    /// cancelled or the queue is gone. Call [`Self::done`] when finished with it.
    pub async fn next(
        &self,
        rx: &Receiver<K>,
        stop: &tokio_util::sync::CancellationToken,
    ) -> Option<(K, Duration)> {
        loop {
            let key = {
                let mut rx = rx.lock().await;
                let Lanes { urgent, normal } = &mut *rx;
                tokio::select! {
                    biased;
                    () = stop.cancelled() => return None,
                    k = urgent.recv() => k?,
                    k = normal.recv() => k?,
                }
            };
            if let Some(waited) = self.start(&key) {
                return Some((key, waited));
            }
        }
    }

    /// A worker takes `key`: how long it waited, or None if it is already being worked on or
    /// no longer queued (the other lane's copy was taken first).
    fn start(&self, key: &K) -> Option<Duration> {
        let mut s = self.state.lock().ok()?;
        let (since, urgent) = s.queued.remove(key)?;
        if s.processing.contains(key) {
            *s.dirty.entry(key.clone()).or_insert(false) |= urgent;
            return None;
        }
        s.processing.insert(key.clone());
        Some(since.elapsed())
    }

    /// A worker is done with `key`; `ok` says whether it succeeded.
    pub fn done(&self, key: K, ok: bool) {
        let retry_after = {
            let Ok(mut s) = self.state.lock() else { return };
            s.processing.remove(&key);
            if ok {
                s.failures.remove(&key);
                None
            } else {
                let n = s.failures.entry(key.clone()).or_insert(0);
                *n = n.saturating_add(1);
                let n = *n;
                Some(s.retry.after(n))
            }
        };
        let dirty = self
            .state
            .lock()
            .ok()
            .and_then(|mut s| s.dirty.remove(&key));
        match (retry_after, dirty) {
            (Some(delay), _) => {
                let q = self.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    q.add(key);
                });
            }
            (None, Some(urgent)) => self.push(key, urgent),
            (None, None) => {}
        }
    }
}

/// Keys held back for a window: the first sighting holds a key, later ones within the window
/// keep holding it, the first one after lets it through (and forgets it). What a key's holder
/// does meanwhile (come back when the window is over) is up to the caller.
pub struct Holds<K> {
    window: Duration,
    since: Mutex<HashMap<K, Instant>>,
}

/// What [`Holds::hold`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// Held from now on: come back after the window.
    Newly,
    /// Still within its window.
    Still,
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
            since: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `key`, seen at `now`, is held.
    pub fn hold(&self, key: &K, now: Instant) -> Hold {
        let Ok(mut since) = self.since.lock() else {
            return Hold::Over;
        };
        match since.get(key) {
            None => {
                since.insert(key.clone(), now);
                Hold::Newly
            }
            // A margin, so that the caller coming back after the window never finds it open.
            Some(t)
                if now.saturating_duration_since(*t) + Duration::from_millis(5) < self.window =>
            {
                Hold::Still
            }
            Some(_) => {
                since.remove(key);
                Hold::Over
            }
        }
    }

    /// Forgets `key` (its business was done another way).
    pub fn release(&self, key: &K) {
        if let Ok(mut since) = self.since.lock() {
            since.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_held_for_its_window_then_let_through_once() {
        let holds = Holds::new(Duration::from_millis(200));
        let t0 = Instant::now();
        assert_eq!(holds.hold(&"a", t0), Hold::Newly);
        assert_eq!(
            holds.hold(&"a", t0 + Duration::from_millis(100)),
            Hold::Still
        );
        assert_eq!(
            holds.hold(&"b", t0 + Duration::from_millis(100)),
            Hold::Newly
        );
        assert_eq!(
            holds.hold(&"a", t0 + Duration::from_millis(200)),
            Hold::Over
        );
        // Let through and forgotten: the next sighting opens a new window.
        assert_eq!(
            holds.hold(&"a", t0 + Duration::from_millis(210)),
            Hold::Newly
        );
        // Released: forgotten at once.
        holds.release(&"b");
        assert_eq!(
            holds.hold(&"b", t0 + Duration::from_millis(110)),
            Hold::Newly
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
    since: Mutex<HashMap<K, (String, Instant)>>,
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
            since: Mutex::new(HashMap::new()),
        }
    }

    /// `key` was written for `version` at `now`.
    pub fn written(&self, key: K, version: &str, now: Instant) {
        if let Ok(mut since) = self.since.lock() {
            since.insert(key, (version.to_owned(), now));
        }
    }

    /// The watch showed something of `key`: the cache is to be believed again.
    pub fn seen(&self, key: &K) {
        if let Ok(mut since) = self.since.lock() {
            since.remove(key);
        }
    }

    /// Whether a write of `key` for `version` was made within the window and the watch has not
    /// shown the key since (the cache's absence of it is not to be believed).
    pub fn pending(&self, key: &K, version: &str, now: Instant) -> bool {
        let Ok(mut since) = self.since.lock() else {
            return false;
        };
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
        let expected = Expected::new(Duration::from_secs(30));
        let t0 = Instant::now();
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

/// Keys to put on a queue at a time of their own (a token's refresh): one sleeping task per
/// key and time asked; asking again for the same time is free, and a new time supersedes the
/// old one (whose task then wakes to nothing).
pub struct Later<K> {
    due: Arc<Mutex<HashMap<K, tokio::time::Instant>>>,
    queue: Queue<K>,
}

impl<K> std::fmt::Debug for Later<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Later").finish_non_exhaustive()
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> Later<K> {
    /// Adds to `queue`.
    pub fn new(queue: Queue<K>) -> Self {
        Self {
            due: Arc::default(),
            queue,
        }
    }

    /// Puts `key` on the queue at `when`.
    pub fn at(&self, key: K, when: tokio::time::Instant) {
        {
            let Ok(mut due) = self.due.lock() else { return };
            if due.get(&key) == Some(&when) {
                return;
            }
            due.insert(key.clone(), when);
        }
        let (due, queue) = (self.due.clone(), self.queue.clone());
        tokio::spawn(async move {
            tokio::time::sleep_until(when).await;
            let still = due.lock().is_ok_and(|mut d| {
                let current = d.get(&key) == Some(&when);
                if current {
                    d.remove(&key);
                }
                current
            });
            if still {
                queue.add(key);
            }
        });
    }
}

#[cfg(test)]
mod lane_tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_urgent_key_goes_first_and_a_key_in_both_lanes_is_worked_on_once() {
        let (queue, rx) = Queue::<&str>::new();
        let stop = tokio_util::sync::CancellationToken::new();
        queue.add("create-1");
        queue.add("create-2");
        queue.add("both");
        queue.add_urgent("status");
        queue.add_urgent("both");
        let mut order = Vec::new();
        for _ in 0..4 {
            let (key, _) = queue.next(&rx, &stop).await.unwrap_or_default();
            order.push(key);
            queue.done(key, true);
        }
        assert_eq!(order, ["status", "both", "create-1", "create-2"]);
        // The normal lane's copy of "both" is dropped: nothing more comes.
        let more = tokio::time::timeout(Duration::from_secs(60), queue.next(&rx, &stop)).await;
        assert!(more.is_err(), "{more:?}");
        // An urgent change while a key is worked on brings it back in the urgent lane.
        queue.add("create-3");
        queue.add("busy");
        let (busy, _) = queue.next(&rx, &stop).await.unwrap_or_default();
        assert_eq!(busy, "create-3");
        queue.add_urgent("create-3");
        queue.done(busy, true);
        let (again, _) = queue.next(&rx, &stop).await.unwrap_or_default();
        assert_eq!(again, "create-3");
        queue.done(again, true);
        let (last, _) = queue.next(&rx, &stop).await.unwrap_or_default();
        assert_eq!(last, "busy");
    }
}

#[cfg(test)]
mod later_tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_key_comes_once_at_its_latest_time() {
        let (queue, rx) = Queue::<u32>::new();
        let later = Later::new(queue.clone());
        let t0 = tokio::time::Instant::now();
        later.at(1, t0 + Duration::from_secs(10));
        later.at(1, t0 + Duration::from_secs(10));
        later.at(1, t0 + Duration::from_secs(20));
        let stop = tokio_util::sync::CancellationToken::new();
        let (key, _) = queue.next(&rx, &stop).await.unwrap_or_default();
        assert_eq!(key, 1);
        assert!(tokio::time::Instant::now() >= t0 + Duration::from_secs(20));
        queue.done(key, true);
        // Nothing else comes: the superseded time woke to nothing.
        let more = tokio::time::timeout(Duration::from_secs(60), queue.next(&rx, &stop)).await;
        assert!(more.is_err());
    }
}
