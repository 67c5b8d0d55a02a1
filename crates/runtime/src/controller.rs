//! The one controller skeleton every loop of the project runs on, in the manner of
//! kube-runtime's `Controller` and linkerd's policy indexes: the watches apply their events to
//! an index, which names the keys to look at ([`Queue::add`]); a worker takes a key, asks the
//! [`Reconciler`] for its plan (decided from the index alone, no I/O), has the writer carry it
//! out ([`Reconciler::execute`]), and hands the outcome to the queue: done, look again later
//! ([`Action`]), or failed, which the error policy ([`Reconciler::failed`]) turns into a
//! back-off or an end.
//!
//! What the skeleton owns, so that no controller writes it again: the workers and how much each
//! carries at once, the two measured stages ([`Stage`]), the error policy's application, and
//! shutdown (what is in flight may finish, for at most [`Workers::drain`]).
//!
//! A worker carries one plan at a time, or up to [`Workers::long_per_worker`] long plans
//! ([`Reconciler::is_long`]: the pod controller's creations, three writes in series) and one
//! other; while full of long plans it takes only urgent keys ([`Queue::add_urgent`]), so that
//! what a lower cluster reports never waits behind a burst of creations.

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::queue::{Action, Queue, Receiver};

/// A controller's decisions and writer, for the skeleton to run.
pub trait Reconciler: Send + Sync + 'static {
    /// What the queue holds: one object (or one decision) of the controller.
    type Key: Clone + Eq + Hash + Send + Sync + fmt::Debug + 'static;
    /// What to do for a key, as values.
    type Plan: Send + 'static;
    /// A failure of the writer.
    type Error: fmt::Display + Send + 'static;

    /// What to do for `key` now, from the index alone (no I/O).
    fn plan(&self, key: &Self::Key) -> Self::Plan;

    /// Whether `plan` is a long one (see the module's documentation).
    fn is_long(&self, _plan: &Self::Plan) -> bool {
        false
    }

    /// Carries `plan` out against the API servers; when to look at `key` again.
    fn execute(
        self: Arc<Self>,
        key: Self::Key,
        plan: Self::Plan,
    ) -> impl Future<Output = Result<Action, Self::Error>> + Send;

    /// The error policy: what follows from `error` of `key`, failing since `since` (the first
    /// of its failures in a row; None when this is the first). Logging and events go here.
    fn failed(&self, key: &Self::Key, error: &Self::Error, since: Option<Instant>) -> OnFailure;

    /// A measured stage of `key` took `took`.
    fn observe(&self, _stage: Stage, _took: Duration) {}
}

/// What follows a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnFailure {
    /// Try again after the key's back-off.
    Retry,
    /// Nothing until the key is added again (retrying would change nothing).
    Done,
}

/// The stages the skeleton measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// From a key's add to a worker taking it.
    QueueWait,
    /// From a worker taking a key to its outcome: plan and writes.
    Reconcile,
}

impl Stage {
    /// The name the metrics use.
    pub fn name(self) -> &'static str {
        match self {
            Stage::QueueWait => "queue_wait",
            Stage::Reconcile => "reconcile",
        }
    }
}

/// How the work is spread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workers {
    /// How many workers (at least one runs).
    pub count: usize,
    /// How many long plans one worker carries at once (0: none is told apart).
    pub long_per_worker: usize,
    /// How long what is in flight at a stop may take to finish before it is abandoned.
    pub drain: Duration,
}

impl Workers {
    /// `count` workers of one plan at a time, which finish what they carry at a stop for up to
    /// ten seconds.
    pub fn one_at_a_time(count: usize) -> Self {
        Workers {
            count,
            long_per_worker: 0,
            drain: Duration::from_secs(10),
        }
    }
}

/// What one worker has in flight.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct InFlight {
    long: usize,
    other: usize,
}

/// Which keys a worker takes next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Takes {
    /// None: another plan is in flight.
    Nothing,
    /// Urgent ones only: it is full of long plans.
    Urgent,
    /// Any (a key's plan is only known once it is taken).
    Any,
}

impl InFlight {
    fn takes(self, long_per_worker: usize) -> Takes {
        if self.other > 0 {
            Takes::Nothing
        } else if self.long < long_per_worker.max(1) {
            Takes::Any
        } else {
            Takes::Urgent
        }
    }

    fn add(&mut self, long: bool, by: isize) {
        let n = if long {
            &mut self.long
        } else {
            &mut self.other
        };
        *n = n.saturating_add_signed(by);
    }
}

/// Runs `reconciler`'s workers on `queue` until `stop`, then lets what is in flight finish (for
/// at most [`Workers::drain`]).
pub async fn run<R: Reconciler>(
    reconciler: Arc<R>,
    queue: Queue<R::Key>,
    rx: Receiver<R::Key>,
    workers: Workers,
    stop: CancellationToken,
) {
    let tasks: Vec<_> = (0..workers.count.max(1))
        .map(|_| {
            tokio::spawn(worker(
                reconciler.clone(),
                queue.clone(),
                rx.clone(),
                workers,
                stop.clone(),
            ))
        })
        .collect();
    for task in tasks {
        if let Err(e) = task.await
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

async fn worker<R: Reconciler>(
    reconciler: Arc<R>,
    queue: Queue<R::Key>,
    rx: Receiver<R::Key>,
    workers: Workers,
    stop: CancellationToken,
) {
    let mut running = futures::stream::FuturesUnordered::new();
    let mut in_flight = InFlight::default();
    type Done<K, E> = (K, bool, Result<Action, E>, Instant);
    let finish = |(key, long, result, t0): Done<R::Key, R::Error>, in_flight: &mut InFlight| {
        reconciler.observe(Stage::Reconcile, t0.elapsed());
        in_flight.add(long, -1);
        let result = match result {
            Ok(action) => Ok(action),
            Err(e) => match reconciler.failed(&key, &e, queue.failing_since(&key)) {
                OnFailure::Done => Ok(Action::Done),
                OnFailure::Retry => Err(()),
            },
        };
        queue.finish(key, &result);
    };
    let long_per_worker = workers.long_per_worker;
    loop {
        let takes = in_flight.takes(long_per_worker);
        tokio::select! {
            biased;
            Some(done) = running.next() => finish(done, &mut in_flight),
            // Also when no key would be taken (a plan in flight): a hung one must not hide it.
            () = stop.cancelled() => break,
            next = async {
                match takes {
                    Takes::Urgent => queue.next_urgent(&rx, &stop).await,
                    _ => queue.next(&rx, &stop).await,
                }
            }, if takes != Takes::Nothing => {
                let Some((key, waited)) = next else { break };
                reconciler.observe(Stage::QueueWait, waited);
                let t0 = Instant::now();
                let plan = reconciler.plan(&key);
                let long = long_per_worker > 0 && reconciler.is_long(&plan);
                in_flight.add(long, 1);
                let reconciler = reconciler.clone();
                running.push(async move {
                    let result = reconciler.execute(key.clone(), plan).await;
                    (key, long, result, t0)
                });
            }
        }
    }
    // Stopping: what is in flight may finish (a creation cut between its writes leaves work
    // for the next start), but a writer that hangs does not keep the process up.
    let deadline = tokio::time::sleep(workers.drain);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            done = running.next() => match done {
                Some(done) => finish(done, &mut in_flight),
                None => return,
            },
            () = &mut deadline => {
                tracing::warn!(abandoned = running.len(), "stopping: work still in flight abandoned");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The skeleton once, as kube-runtime tests its applier: bounded concurrency under a flood,
    //! a writer that hangs, failures and the policy, shutdown in the middle of work.
    use super::*;
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A writer that records what it does; keys with "hang" never finish, "long" are long plans,
    /// those starting with "fail" fail (and "fail-done" fails for good).
    #[derive(Default)]
    struct Recorder {
        reconciled: Mutex<HashMap<String, usize>>,
        running: AtomicUsize,
        most: AtomicUsize,
        observed: Mutex<Vec<Stage>>,
        /// How long each write takes.
        write: Duration,
    }

    impl Recorder {
        fn count(&self, key: &str) -> usize {
            self.reconciled
                .lock()
                .unwrap()
                .get(key)
                .copied()
                .unwrap_or(0)
        }
    }

    impl Reconciler for Recorder {
        type Key = String;
        type Plan = String;
        type Error = String;

        fn plan(&self, key: &String) -> String {
            key.clone()
        }

        fn is_long(&self, plan: &String) -> bool {
            plan.contains("long")
        }

        async fn execute(self: Arc<Self>, key: String, plan: String) -> Result<Action, String> {
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            if plan.contains("hang") {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(self.write).await;
            *self.reconciled.lock().unwrap().entry(key).or_default() += 1;
            self.running.fetch_sub(1, Ordering::SeqCst);
            if plan.starts_with("fail") {
                return Err(format!("{plan} failed"));
            }
            Ok(Action::Done)
        }

        fn failed(&self, key: &String, _: &String, _: Option<Instant>) -> OnFailure {
            if key.starts_with("fail-done") {
                OnFailure::Done
            } else {
                OnFailure::Retry
            }
        }

        fn observe(&self, stage: Stage, _: Duration) {
            self.observed.lock().unwrap().push(stage);
        }
    }

    fn start(
        recorder: &Arc<Recorder>,
        workers: Workers,
    ) -> (
        Queue<String>,
        CancellationToken,
        tokio::task::JoinHandle<()>,
    ) {
        let (queue, rx) = Queue::new();
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(
            recorder.clone(),
            queue.clone(),
            rx,
            workers,
            stop.clone(),
        ));
        (queue, stop, task)
    }

    /// Waits (in paused time: instantly) until `done` holds.
    async fn until(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(3600);
        while !done() {
            assert!(Instant::now() < deadline, "never: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_adds_is_worked_on_by_at_most_the_workers_and_each_key_coalesces() {
        let recorder = Arc::new(Recorder {
            write: Duration::from_millis(100),
            ..Recorder::default()
        });
        let (queue, stop, task) = start(&recorder, Workers::one_at_a_time(3));
        // Ten keys added a thousand times each while the workers are busy: the queue holds
        // ten entries, not ten thousand, and each key is worked on once or twice (once more if
        // it was added while being worked on), never a thousand times.
        for _ in 0..1000 {
            for k in 0..10 {
                queue.add(format!("k{k}"));
            }
        }
        until("every key worked on", || {
            (0..10).all(|k| recorder.count(&format!("k{k}")) >= 1)
        })
        .await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        for k in 0..10 {
            let n = recorder.count(&format!("k{k}"));
            assert!((1..=2).contains(&n), "k{k} worked on {n} times");
        }
        assert_eq!(recorder.most.load(Ordering::SeqCst), 3);
        let observed = recorder.observed.lock().unwrap().clone();
        assert!(observed.contains(&Stage::QueueWait) && observed.contains(&Stage::Reconcile));
        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_writer_that_hangs_takes_one_worker_and_nothing_else() {
        let recorder = Arc::new(Recorder::default());
        let (queue, stop, task) = start(&recorder, Workers::one_at_a_time(2));
        queue.add("hang".into());
        until("the hanging write started", || {
            recorder.running.load(Ordering::SeqCst) == 1
        })
        .await;
        for k in 0..100 {
            queue.add(format!("k{k}"));
        }
        until("the other keys done by the other worker", || {
            (0..100).all(|k| recorder.count(&format!("k{k}")) == 1)
        })
        .await;
        // Added again while it hangs: not taken by the free worker (one worker per key).
        queue.add("hang".into());
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(recorder.most.load(Ordering::SeqCst), 2);
        assert_eq!(recorder.running.load(Ordering::SeqCst), 1);
        // A stop does not wait for it past the drain.
        stop.cancel();
        let stopped = tokio::time::timeout(Duration::from_secs(11), task).await;
        assert!(stopped.is_ok(), "the hanging write kept the controller up");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_in_the_middle_lets_the_work_in_flight_finish_and_takes_no_more() {
        let recorder = Arc::new(Recorder {
            write: Duration::from_secs(2),
            ..Recorder::default()
        });
        let (queue, stop, task) = start(&recorder, Workers::one_at_a_time(1));
        queue.add("a".into());
        queue.add("b".into());
        until("a started", || recorder.running.load(Ordering::SeqCst) == 1).await;
        stop.cancel();
        task.await.unwrap();
        assert_eq!(recorder.count("a"), 1, "the write in flight finished");
        assert_eq!(recorder.count("b"), 0, "no key was taken after the stop");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_backs_off_and_comes_back_unless_the_policy_says_it_is_done() {
        let recorder = Arc::new(Recorder::default());
        let (queue, stop, task) = start(&recorder, Workers::one_at_a_time(1));
        queue.add("fail".into());
        queue.add("fail-done".into());
        until("retried with back-off", || recorder.count("fail") >= 5).await;
        assert_eq!(recorder.count("fail-done"), 1, "done after its failure");
        // Back-off doubling from 5 ms: five tries take at least 5+10+20+40 ms.
        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_full_of_long_plans_still_takes_urgent_keys() {
        let recorder = Arc::new(Recorder::default());
        let workers = Workers {
            count: 1,
            long_per_worker: 1,
            drain: Duration::ZERO,
        };
        let (queue, stop, task) = start(&recorder, workers);
        queue.add("long-hang".into());
        until("the long plan started", || {
            recorder.running.load(Ordering::SeqCst) == 1
        })
        .await;
        // Normal keys wait for the long plan; an urgent one does not.
        queue.add("normal".into());
        queue.add_urgent("urgent".into());
        until("the urgent key done", || recorder.count("urgent") == 1).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(recorder.count("normal"), 0);
        stop.cancel();
        task.await.unwrap();
    }

    #[test]
    fn a_worker_takes_any_key_until_full_then_urgent_ones_and_none_beside_another_plan() {
        let mut in_flight = InFlight::default();
        assert_eq!(in_flight.takes(2), Takes::Any);
        in_flight.add(true, 1);
        assert_eq!(in_flight.takes(2), Takes::Any);
        in_flight.add(true, 1);
        assert_eq!(in_flight.takes(2), Takes::Urgent);
        in_flight.add(false, 1);
        assert_eq!(in_flight.takes(2), Takes::Nothing);
        in_flight.add(false, -1);
        in_flight.add(true, -1);
        assert_eq!(in_flight.takes(2), Takes::Any);
        // With no long plans told apart: one at a time.
        let mut one = InFlight::default();
        assert_eq!(one.takes(0), Takes::Any);
        one.add(false, 1);
        assert_eq!(one.takes(0), Takes::Nothing);
    }
}
