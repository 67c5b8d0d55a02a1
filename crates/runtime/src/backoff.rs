//! How our watches run ([`watch`]) and their retry delays: 250 ms doubling to 4 s, with
//! jitter, reset after a success. kube's default goes to 30 s, so after a lower-cluster outage the pod statuses would
//! stay stale for up to half a minute after the cluster is back; a watch retry every 4 s
//! costs one request per cluster.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

const FIRST: Duration = Duration::from_millis(250);
const MAX: Duration = Duration::from_secs(4);

/// Exponential backoff for `WatchStreamExt::backoff`.
#[derive(Debug, Clone, Default)]
pub struct WatchBackoff {
    next: Option<Duration>,
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let delay = self.next.unwrap_or(FIRST);
        self.next = Some((delay * 2).min(MAX));
        // Up to a quarter more, so that many watches failing together do not retry together.
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        Some(delay + delay.mul_f64(f64::from(nanos % 1000) / 4000.0))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = None;
    }
}

/// A watch of `api` as all of ours run: retried with [`WatchBackoff`], and without
/// `managedFields` (never read here, and often most of an object's size on real clusters).
pub fn watch<K>(
    api: kube::Api<K>,
    config: kube::runtime::watcher::Config,
) -> impl futures::Stream<Item = Result<kube::runtime::watcher::Event<K>, kube::runtime::watcher::Error>>
+ Send
+ use<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    use kube::runtime::WatchStreamExt as _;
    kube::runtime::watcher(api, config)
        .backoff(WatchBackoff::default())
        .modify(|o| o.meta_mut().managed_fields = None)
}

/// [`watch`], whose wait before its next attempt after an error ends early when `down`
/// changes to `false` (the node found the lower cluster answering again): after an outage the
/// lower pods' statuses flow again within a moment of its end, not after the back-off (up to
/// 5 s) of a watch that failed all along.
pub fn watch_waking<K>(
    api: kube::Api<K>,
    config: kube::runtime::watcher::Config,
    down: tokio::sync::watch::Receiver<bool>,
) -> impl futures::Stream<Item = Result<kube::runtime::watcher::Event<K>, kube::runtime::watcher::Error>>
+ Send
+ use<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    use kube::runtime::WatchStreamExt as _;
    waking(
        kube::runtime::watcher(api, config).modify(|o| o.meta_mut().managed_fields = None),
        down,
    )
}

/// `inner` with a [`WatchBackoff`] wait after each error, ended early when `down` changes to
/// `false`.
fn waking<T, E>(
    inner: impl futures::Stream<Item = Result<T, E>> + Send + 'static,
    down: tokio::sync::watch::Receiver<bool>,
) -> impl futures::Stream<Item = Result<T, E>> + Send
where
    T: Send + 'static,
    E: Send + 'static,
{
    use futures::StreamExt as _;
    use kube::runtime::utils::Backoff as _;
    let state = (
        inner.boxed(),
        WatchBackoff::default(),
        down,
        None::<Duration>,
    );
    futures::stream::unfold(
        state,
        |(mut inner, mut backoff, mut down, delay)| async move {
            if let Some(delay) = delay {
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = answers_again(&mut down) => {}
                }
            }
            let item = inner.next().await?;
            let delay = match &item {
                Ok(_) => {
                    backoff.reset();
                    None
                }
                Err(_) => backoff.next(),
            };
            Some((item, (inner, backoff, down, delay)))
        },
    )
}

/// Returns when `down` changes to `false`; never if its sender is gone.
async fn answers_again(down: &mut tokio::sync::watch::Receiver<bool>) {
    loop {
        if down.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        if !*down.borrow_and_update() {
            return;
        }
    }
}

/// Hands every item of a watch stream to `on_item` until the stream ends or `stop`; errors
/// are logged as `what` (the watcher retries by itself, with backoff).
pub async fn drain<T, E: std::fmt::Display>(
    mut stream: impl futures::Stream<Item = Result<T, E>> + Unpin,
    stop: &tokio_util::sync::CancellationToken,
    what: &str,
    mut on_item: impl FnMut(T),
) {
    use futures::TryStreamExt as _;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            next = stream.try_next() => match next {
                Ok(Some(item)) => on_item(item),
                Ok(None) => return,
                Err(e) => tracing::warn!(watch = what, error = %e, "watch error"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_maximum_with_at_most_a_quarter_of_jitter_and_resets() {
        use kube::runtime::utils::Backoff as _;
        let mut b = WatchBackoff::default();
        let delays: Vec<Duration> = (&mut b).take(8).collect();
        let bases = [250, 500, 1000, 2000, 4000, 4000, 4000, 4000];
        for (d, base) in delays.iter().zip(bases) {
            let base = Duration::from_millis(base);
            assert!(*d >= base && *d <= base + base / 4, "{d:?} for {base:?}");
        }
        b.reset();
        assert!(b.next().is_some_and(|d| d < Duration::from_millis(320)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_watch_waits_its_back_off_unless_the_cluster_answers_again() {
        use futures::StreamExt as _;
        let items: Vec<Result<u32, &str>> = vec![Err("refused"); 6]
            .into_iter()
            .chain([Ok(1), Err("refused"), Ok(2)])
            .collect();
        let (tx, down) = tokio::sync::watch::channel(true);
        let mut stream = std::pin::pin!(waking(futures::stream::iter(items), down));
        // Six failures in a row: the waits grow to 4 s (with jitter).
        let t0 = tokio::time::Instant::now();
        for _ in 0..6 {
            assert!(stream.next().await.unwrap().is_err());
        }
        let waited = t0.elapsed();
        assert!(
            waited >= Duration::from_millis(250 + 500 + 1000 + 2000 + 4000),
            "{waited:?}"
        );
        // The next wait (4 s) ends as soon as the cluster is found answering.
        let t1 = tokio::time::Instant::now();
        let next = async {
            let item = stream.next().await;
            (item, t1.elapsed())
        };
        let answer = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            tx.send_replace(false);
        };
        let ((item, waited), ()) = tokio::join!(next, answer);
        assert_eq!(item, Some(Ok(1)));
        assert!(waited < Duration::from_millis(200), "{waited:?}");
        // A success resets the back-off: the next failure waits 250 ms again.
        assert!(stream.next().await.unwrap().is_err());
        let t2 = tokio::time::Instant::now();
        assert_eq!(stream.next().await, Some(Ok(2)));
        assert!(
            t2.elapsed() < Duration::from_millis(320),
            "{:?}",
            t2.elapsed()
        );
    }
}
