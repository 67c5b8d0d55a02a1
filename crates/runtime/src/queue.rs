//! A keyed work queue: each key is worked on by at most one worker at a time, a key that
//! changes while it is being worked on is worked on again afterwards, and failures come back
//! after a per-key exponential backoff (5 ms doubling to 10 s, like virtual-kubelet's).
//!
//! Two lanes: a key added as urgent ([`Queue::add_urgent`]) is taken before every key of the
//! normal lane, whenever they were added. The pod controller puts there what the lower
//! cluster reports (a pod Running downstairs: one status write upstairs), so that it does not
//! wait behind a burst of creations (three writes each with upper identity).
//!
//! Delayed requeue, in the manner of kube-runtime's `Controller` and `Action`: a worker ends a
//! key with [`Queue::finish`] and an [`Action`] (done, or look again after a while) or an
//! error (the backoff), and [`Queue::add_after`] / [`Queue::add_at`] hold a key until its
//! time. A key has at most one time: asking for an earlier one moves it earlier, a later one
//! is ignored, and adding the key now takes it out of its wait. The times are kept in the
//! queue and fire while a worker waits in [`Queue::next`]: no task per key.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

use crate::maps::{shrink_after_removal, shrink_set_after_removal};

/// What a reconcile asks of the queue for its key, once it succeeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing more: the key comes back when it is added again.
    Done,
    /// Look again after this long (sooner if the key is added again meanwhile).
    RequeueAfter(Duration),
}

impl Action {
    /// Look again at `at` (at once when it is past).
    pub fn requeue_at(at: Instant) -> Self {
        Action::RequeueAfter(at.saturating_duration_since(Instant::now()))
    }
}

/// What was asked for a key while it was being worked on, for when the work is done.
#[derive(Default)]
struct Again {
    /// Added for now; whether urgently.
    now: Option<bool>,
    /// The earliest time asked for.
    at: Option<Instant>,
}

struct State<K> {
    /// Keys waiting for a worker, with when they started waiting and whether they are urgent.
    queued: HashMap<K, (Instant, bool)>,
    /// Keys held until a time (never also queued), with their entry in `timers`.
    held: HashMap<K, (Instant, u64)>,
    /// The held keys by time; the number tells keys of one time apart.
    timers: BTreeMap<(Instant, u64), K>,
    next_timer: u64,
    processing: HashSet<K>,
    /// What was asked for keys while they were being worked on.
    dirty: HashMap<K, Again>,
    /// Failures in a row of each failing key, and when the first of them was.
    failures: HashMap<K, (u32, Instant)>,
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
    /// A key was held until a time: the waiting worker looks at the earliest time again.
    timers_changed: Arc<Notify>,
}

impl<K> Clone for Queue<K> {
    fn clone(&self) -> Self {
        Self {
            state: self.state.clone(),
            tx: self.tx.clone(),
            urgent_tx: self.urgent_tx.clone(),
            timers_changed: self.timers_changed.clone(),
        }
    }
}

impl<K> std::fmt::Debug for Queue<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue").finish_non_exhaustive()
    }
}

/// The receiving end, shared by the workers.
pub type Receiver<K> = Arc<Lanes<K>>;

/// The two lanes' receivers, each taken by one waiting worker at a time: a worker that waits
/// for urgent keys only ([`Queue::next_urgent`]) never keeps the normal lane from the others.
#[derive(Debug)]
pub struct Lanes<K> {
    urgent: tokio::sync::Mutex<mpsc::UnboundedReceiver<K>>,
    normal: tokio::sync::Mutex<mpsc::UnboundedReceiver<K>>,
}

/// `d` after `now`; a delay too long for the clock is a year.
fn after(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(365 * 24 * 3600)))
        .unwrap_or(now)
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
            held: HashMap::new(),
            timers: BTreeMap::new(),
            next_timer: 0,
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
                timers_changed: Arc::new(Notify::new()),
            },
            Arc::new(Lanes {
                urgent: tokio::sync::Mutex::new(urgent),
                normal: tokio::sync::Mutex::new(normal),
            }),
        )
    }

    /// Asks for `key` to be worked on.
    pub fn add(&self, key: K) {
        self.request(key, None, false);
    }

    /// Asks for `key` to be worked on before every key of the normal lane.
    pub fn add_urgent(&self, key: K) {
        self.request(key, None, true);
    }

    /// Asks for `key` to be worked on after `delay` (sooner if it is already due sooner).
    pub fn add_after(&self, key: K, delay: Duration) {
        self.request(key, Some(after(Instant::now(), delay)), false);
    }

    /// Asks for `key` to be worked on at `at` (sooner if it is already due sooner).
    pub fn add_at(&self, key: K, at: Instant) {
        self.request(key, Some(at), false);
    }

    fn state(&self) -> MutexGuard<'_, State<K>> {
        crate::lock::lock(&self.state, "a work queue")
    }

    /// Asks for `key` at `at` (`None`: now).
    fn request(&self, key: K, at: Option<Instant>, urgent: bool) {
        let mut s = self.state();
        let now = Instant::now();
        let at = at.filter(|at| *at > now);
        if s.processing.contains(&key) {
            let again = s.dirty.entry(key).or_default();
            match at {
                None => again.now = Some(again.now.unwrap_or(false) | urgent),
                Some(at) => again.at = Some(again.at.map_or(at, |t| t.min(at))),
            }
            return;
        }
        if let Some((_, was_urgent)) = s.queued.get_mut(&key) {
            // Waiting in the normal lane: sent again in the urgent one; whichever copy comes
            // first is worked on, the other finds the key no longer queued and is dropped.
            if urgent && !*was_urgent {
                *was_urgent = true;
                let _ = self.urgent_tx.send(key);
            }
            return;
        }
        match at {
            None => {
                if let Some(entry) = s.held.remove(&key) {
                    s.timers.remove(&entry);
                }
                s.queued.insert(key.clone(), (now, urgent));
                let _ = if urgent {
                    self.urgent_tx.send(key)
                } else {
                    self.tx.send(key)
                };
            }
            Some(at) => {
                if s.held.get(&key).is_some_and(|(t, _)| *t <= at) {
                    return;
                }
                if let Some(entry) = s.held.remove(&key) {
                    s.timers.remove(&entry);
                }
                s.next_timer = s.next_timer.wrapping_add(1);
                let entry = (at, s.next_timer);
                s.timers.insert(entry, key.clone());
                s.held.insert(key, entry);
                drop(s);
                self.timers_changed.notify_one();
            }
        }
    }

    /// Puts the held keys whose time has come in the normal lane; the next time, if any.
    fn release_due(&self) -> Option<Instant> {
        let mut s = self.state();
        let now = Instant::now();
        while let Some(entry) = s.timers.first_entry() {
            let at = entry.key().0;
            if at > now {
                return Some(at);
            }
            let key = entry.remove();
            s.held.remove(&key);
            shrink_after_removal(&mut s.held);
            s.queued.insert(key.clone(), (at, false));
            let _ = self.tx.send(key);
        }
        None
    }

    /// The next key for a worker to work on (an urgent one first), and how long it waited; None
    /// once `stop` is cancelled or the queue is gone. Call [`Self::finish`] (or [`Self::done`])
    /// when finished with it.
    pub async fn next(
        &self,
        rx: &Receiver<K>,
        stop: &tokio_util::sync::CancellationToken,
    ) -> Option<(K, Duration)> {
        self.next_of(rx, stop, true).await
    }

    /// [`Self::next`], of the urgent lane only: for a worker that has room for a quick
    /// reconcile but not for any (the pod controller's, full of creations, still writes a
    /// status up).
    pub async fn next_urgent(
        &self,
        rx: &Receiver<K>,
        stop: &tokio_util::sync::CancellationToken,
    ) -> Option<(K, Duration)> {
        self.next_of(rx, stop, false).await
    }

    async fn next_of(
        &self,
        rx: &Receiver<K>,
        stop: &tokio_util::sync::CancellationToken,
        normal_too: bool,
    ) -> Option<(K, Duration)> {
        loop {
            // Each lane is waited on by one worker at a time; the urgent one is looked at
            // first.
            let key = tokio::select! {
                biased;
                () = stop.cancelled() => return None,
                k = async { rx.urgent.lock().await.recv().await } => k?,
                k = self.next_normal(rx), if normal_too => k?,
            };
            if let Some(waited) = self.start(&key) {
                return Some((key, waited));
            }
        }
    }

    /// The next key of the normal lane. The worker waiting on it also keeps the time of the
    /// held keys: a time asked for meanwhile wakes it (a permit is kept if it is not waiting).
    async fn next_normal(&self, rx: &Receiver<K>) -> Option<K> {
        let mut normal = rx.normal.lock().await;
        loop {
            let changed = self.timers_changed.notified();
            let wake = self.release_due();
            let due = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                k = normal.recv() => return k,
                () = due => {}
                () = changed => {}
            }
        }
    }

    /// A worker takes `key`: how long it waited, or None if it is already being worked on or
    /// no longer queued (the other lane's copy was taken first).
    fn start(&self, key: &K) -> Option<Duration> {
        let mut s = self.state();
        let (since, urgent) = s.queued.remove(key)?;
        shrink_after_removal(&mut s.queued);
        if s.processing.contains(key) {
            let again = s.dirty.entry(key.clone()).or_default();
            again.now = Some(again.now.unwrap_or(false) | urgent);
            return None;
        }
        s.processing.insert(key.clone());
        Some(since.elapsed())
    }

    /// Since when `key` has been failing: the time of the first of its failures in a row, or
    /// None when its last work succeeded (or it never failed). A worker asks before it
    /// finishes a failed attempt, to tell a failure that persists from a passing one.
    pub fn failing_since(&self, key: &K) -> Option<Instant> {
        let s = self.state();
        s.failures.get(key).map(|(_, since)| *since)
    }

    /// A worker is done with `key`; `ok` says whether it succeeded ([`Action::Done`]).
    pub fn done(&self, key: K, ok: bool) {
        self.finish(key, &if ok { Ok(Action::Done) } else { Err(()) });
    }

    /// A worker is done with `key`: on success the key comes back as the [`Action`] says (and
    /// at once if it was added while being worked on); on failure after its backoff (adds made
    /// for now while it was being worked on wait for that too; times asked for stand).
    pub fn finish<E>(&self, key: K, result: &Result<Action, E>) {
        let (again, failures) = {
            let mut s = self.state();
            s.processing.remove(&key);
            shrink_set_after_removal(&mut s.processing);
            let again = s.dirty.remove(&key).unwrap_or_default();
            shrink_after_removal(&mut s.dirty);
            let failures = if result.is_ok() {
                if s.failures.remove(&key).is_some() {
                    shrink_after_removal(&mut s.failures);
                }
                None
            } else {
                let (n, _) = s.failures.entry(key.clone()).or_insert((0, Instant::now()));
                *n = n.saturating_add(1);
                let n = *n;
                Some(s.retry.after(n))
            };
            (again, failures)
        };
        let now = Instant::now();
        match failures {
            Some(backoff) => self.request(key.clone(), Some(after(now, backoff)), false),
            None => {
                if let Some(urgent) = again.now {
                    self.request(key.clone(), None, urgent);
                }
                if let Ok(Action::RequeueAfter(d)) = result {
                    self.request(key.clone(), Some(after(now, *d)), false);
                }
            }
        }
        if let Some(at) = again.at {
            self.request(key, Some(at), false);
        }
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
mod burst_tests {
    use super::*;

    /// A burst of 5,000 keys, each added, then later again (held), taken, failed once and
    /// done: once it is over the queue's tables are given back (they held the whole burst).
    #[tokio::test(start_paused = true)]
    async fn the_tables_of_a_burst_are_given_back_when_it_is_over() {
        let (queue, rx) = Queue::<u32>::new();
        let stop = tokio_util::sync::CancellationToken::new();
        for k in 0..5_000 {
            queue.add(k);
            queue.add_after(k, Duration::from_secs(1));
        }
        for _ in 0..5_000 {
            let (k, _) = queue.next(&rx, &stop).await.unwrap_or_default();
            queue.add(k);
            queue.done(k, false);
        }
        for _ in 0..5_000 {
            let (k, _) = queue.next(&rx, &stop).await.unwrap_or_default();
            queue.done(k, true);
        }
        let s = queue.state();
        assert!(s.queued.is_empty() && s.held.is_empty() && s.failures.is_empty());
        for capacity in [
            s.queued.capacity(),
            s.held.capacity(),
            s.processing.capacity(),
            s.dirty.capacity(),
            s.failures.capacity(),
        ] {
            assert!(capacity <= 128, "{capacity}");
        }
    }
}

#[cfg(test)]
mod urgent_only_tests {
    use super::*;

    /// A worker waiting for urgent keys only takes none of the normal lane, and does not keep
    /// another worker from them.
    #[tokio::test(start_paused = true)]
    async fn a_worker_waiting_for_urgent_keys_leaves_the_normal_lane_to_the_others() {
        let (queue, rx) = Queue::<&str>::new();
        let stop = tokio_util::sync::CancellationToken::new();
        let full = {
            let (queue, rx, stop) = (queue.clone(), rx.clone(), stop.clone());
            tokio::spawn(async move { queue.next_urgent(&rx, &stop).await })
        };
        // Let it wait on the urgent lane first.
        tokio::task::yield_now().await;
        queue.add("create");
        let (taken, _) = queue.next(&rx, &stop).await.unwrap_or_default();
        assert_eq!(taken, "create");
        assert!(!full.is_finished());
        queue.add_urgent("status");
        let got = full.await.ok().flatten().map(|(k, _)| k);
        assert_eq!(got, Some("status"));
        // Nothing of the normal lane is left for an urgent-only wait.
        queue.add("another");
        let none =
            tokio::time::timeout(Duration::from_secs(60), queue.next_urgent(&rx, &stop)).await;
        assert!(none.is_err(), "{none:?}");
    }
}

#[cfg(test)]
mod delayed_tests {
    use super::*;
    use tokio_util::sync::CancellationToken;

    /// The next key, or None when none comes within a minute (of paused time).
    async fn next_within_a_minute(
        queue: &Queue<&'static str>,
        rx: &Receiver<&'static str>,
    ) -> Option<&'static str> {
        let stop = CancellationToken::new();
        tokio::time::timeout(Duration::from_secs(60), queue.next(rx, &stop))
            .await
            .ok()
            .flatten()
            .map(|(k, _)| k)
    }

    #[tokio::test(start_paused = true)]
    async fn a_requeue_comes_back_at_its_time_and_the_earliest_time_wins() {
        let (queue, rx) = Queue::new();
        let t0 = Instant::now();
        queue.add("a");
        assert_eq!(next_within_a_minute(&queue, &rx).await, Some("a"));
        queue.finish(
            "a",
            &Ok::<_, ()>(Action::RequeueAfter(Duration::from_secs(10))),
        );
        // Asked again for later: ignored; for sooner: moved earlier.
        queue.add_after("a", Duration::from_secs(20));
        queue.add_after("a", Duration::from_secs(5));
        queue.add_at("b", t0 + Duration::from_secs(7));
        assert_eq!(next_within_a_minute(&queue, &rx).await, Some("a"));
        assert_eq!(Instant::now(), t0 + Duration::from_secs(5));
        queue.finish("a", &Ok::<_, ()>(Action::Done));
        assert_eq!(next_within_a_minute(&queue, &rx).await, Some("b"));
        assert_eq!(Instant::now(), t0 + Duration::from_secs(7));
        queue.done("b", true);
        // Each key came once: the later times of "a" were dropped.
        assert_eq!(next_within_a_minute(&queue, &rx).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_added_now_leaves_its_wait_and_comes_once() {
        let (queue, rx) = Queue::new();
        let t0 = Instant::now();
        queue.add_after("a", Duration::from_secs(30));
        queue.add("a");
        assert_eq!(next_within_a_minute(&queue, &rx).await, Some("a"));
        assert_eq!(Instant::now(), t0);
        queue.done("a", true);
        assert_eq!(next_within_a_minute(&queue, &rx).await, None);
        // Urgent too: out of its wait, into the urgent lane, before the normal lane's keys.
        queue.add("b");
        queue.add_after("a", Duration::from_secs(30));
        queue.add_urgent("a");
        assert_eq!(next_within_a_minute(&queue, &rx).await, Some("a"));
        queue.done("a", true);
        assert_eq!(next_within_a_minute(&queue, &rx).await, Some("b"));
        queue.done("b", true);
        assert_eq!(next_within_a_minute(&queue, &rx).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_worker_wakes_for_a_time_asked_after_it_began_to_wait() {
        let (queue, rx) = Queue::new();
        let t0 = Instant::now();
        let worker = {
            let (queue, rx) = (queue.clone(), rx.clone());
            tokio::spawn(async move { next_within_a_minute(&queue, &rx).await })
        };
        // The worker is waiting (nothing queued, no time held) when the time is asked for.
        tokio::task::yield_now().await;
        queue.add_after("a", Duration::from_secs(3));
        assert_eq!(worker.await.ok().flatten(), Some("a"));
        assert_eq!(Instant::now(), t0 + Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn what_is_asked_while_a_key_is_worked_on_applies_once_it_is_done() {
        let (queue, rx) = Queue::new();
        let t0 = Instant::now();
        queue.add("a");
        assert_eq!(next_within_a_minute(&queue, &rx).await, Some("a"));
        // A time asked for while working: not while the key is worked on...
        queue.add_after("a", Duration::from_secs(4));
        let stop = CancellationToken::new();
        let early = tokio::time::timeout(Duration::from_secs(10), queue.next(&rx, &stop)).await;
        assert!(early.is_err(), "{early:?}");
        // ...then at once, as its time is past.
        queue.finish("a", &Ok::<_, ()>(Action::Done));
        assert_eq!(next_within_a_minute(&queue, &rx).await, Some("a"));
        assert_eq!(Instant::now(), t0 + Duration::from_secs(10));
        // One still ahead is kept until its time, even when the reconcile asks for none.
        queue.add_after("a", Duration::from_secs(4));
        queue.finish("a", &Ok::<_, ()>(Action::Done));
        assert_eq!(next_within_a_minute(&queue, &rx).await, Some("a"));
        assert_eq!(Instant::now(), t0 + Duration::from_secs(14));
        // Added now while working: at once when done, before the reconcile's own requeue.
        queue.add("a");
        let t1 = Instant::now();
        queue.finish(
            "a",
            &Ok::<_, ()>(Action::RequeueAfter(Duration::from_secs(10))),
        );
        assert_eq!(next_within_a_minute(&queue, &rx).await, Some("a"));
        assert_eq!(Instant::now(), t1);
        queue.done("a", true);
        assert_eq!(next_within_a_minute(&queue, &rx).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_key_backs_off_even_when_added_meanwhile_and_a_success_resets_it() {
        let retry = Retry {
            first: Duration::from_secs(1),
            max: Duration::from_secs(3),
        };
        let (queue, rx) = Queue::with_retry(retry);
        queue.add("a");
        assert_eq!(next_within_a_minute(&queue, &rx).await, Some("a"));
        let t0 = Instant::now();
        let mut delays = Vec::new();
        for _ in 0..3 {
            // Added while failing: it still waits for its backoff.
            queue.add("a");
            let t = Instant::now();
            queue.finish("a", &Err::<Action, _>("refused"));
            assert_eq!(next_within_a_minute(&queue, &rx).await, Some("a"));
            delays.push(Instant::now() - t);
        }
        // 1 s, doubling, capped at 3 s.
        assert_eq!(delays, [1, 2, 3].map(Duration::from_secs));
        // Failing since the first of the three, not the last.
        assert_eq!(queue.failing_since(&"a"), Some(t0));
        assert_eq!(queue.failing_since(&"b"), None);
        // A success forgets the failures: the next failure waits the first delay again.
        queue.done("a", true);
        assert_eq!(queue.failing_since(&"a"), None);
        queue.add("a");
        assert_eq!(next_within_a_minute(&queue, &rx).await, Some("a"));
        let t = Instant::now();
        queue.done("a", false);
        assert_eq!(next_within_a_minute(&queue, &rx).await, Some("a"));
        assert_eq!(Instant::now() - t, Duration::from_secs(1));
    }
}
