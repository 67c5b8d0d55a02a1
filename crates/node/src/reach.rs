//! Whether the lower cluster answers, as the node loop last saw it, shared with the kubelet
//! backend so that logs, exec, attach, port-forward and stats fail at once with 503 and the
//! cause ("lower cluster lower-1 unreachable: connection refused ...") instead of a 404 or a
//! bare `client error (Connect)`.

use std::error::Error as StdError;
use std::sync::{Arc, PoisonError, RwLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tensile_core::reach::{Cause, explain, unreachable_message};
use tensile_kubelet::BackendError;

/// Every link of an error's source chain, as displayed, outermost first.
pub fn chain(e: &(dyn StdError + 'static)) -> Vec<String> {
    let mut links = vec![e.to_string()];
    let mut next = e.source();
    while let Some(s) = next {
        links.push(s.to_string());
        next = s.source();
    }
    links
}

/// Whether a kube error means the server could not be reached or did not answer (rather than
/// an answer, even an error status, from it).
pub fn is_unreachable(e: &kube::Error) -> bool {
    !matches!(
        e,
        kube::Error::Api(_)
            | kube::Error::SerdeError(_)
            | kube::Error::BuildRequest(_)
            | kube::Error::Discovery(_)
    )
}

/// The cause of a kube error in words: certificate problems named as such (see
/// [`tensile_core::reach::explain`]); the API server's own message for an error status.
pub fn describe(e: &kube::Error) -> (Cause, String) {
    match e {
        kube::Error::Api(s) => (Cause::Other, format!("{} ({})", s.message, s.code)),
        other => explain(&chain(other)),
    }
}

/// The lower cluster's name and reachability, cheap to clone.
#[derive(Clone, Debug)]
pub struct LowerReach {
    cluster: Arc<str>,
    down: Arc<RwLock<Option<String>>>,
    /// Whether it is down, for those who act when that changes.
    changes: tokio::sync::watch::Sender<bool>,
    /// `tensile_lower_cluster_reachable`, once [`Self::reported_in`] a registry.
    gauge: Option<Gauge>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LowerClusterLabel {
    lower_cluster: String,
}

impl LowerReach {
    /// A lower cluster named `cluster` (in messages), reachable until told otherwise.
    pub fn new(cluster: impl Into<Arc<str>>) -> Self {
        Self {
            cluster: cluster.into(),
            down: Arc::new(RwLock::new(None)),
            changes: tokio::sync::watch::Sender::new(false),
            gauge: None,
        }
    }

    /// Also reported as the Prometheus gauge `tensile_lower_cluster_reachable{lower_cluster}`
    /// of `registry`: 1 while the last health check found the lower cluster answering, 0 while
    /// it does not.
    pub fn reported_in(mut self, registry: &mut Registry) -> Self {
        let family = Family::<LowerClusterLabel, Gauge>::default();
        let gauge = family.get_or_create_owned(&LowerClusterLabel {
            lower_cluster: self.cluster.to_string(),
        });
        gauge.set(i64::from(self.cause().is_none()));
        registry.register(
            "tensile_lower_cluster_reachable",
            "1 while the lower cluster answers the virtual node's health checks, 0 while it does not",
            family,
        );
        self.gauge = Some(gauge);
        self
    }

    /// The lower cluster's name.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// Records the last health check: `None` reachable, else the cause.
    pub fn set(&self, cause: Option<String>) {
        let down = cause.is_some();
        *self.down.write().unwrap_or_else(PoisonError::into_inner) = cause;
        if let Some(g) = &self.gauge {
            g.set(i64::from(!down));
        }
        self.changes.send_if_modified(|was| {
            let changed = *was != down;
            *was = down;
            changed
        });
    }

    /// Tells of each change between reachable (`false`) and not (`true`).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<bool> {
        self.changes.subscribe()
    }

    /// The message for a pod or request while the cluster is down (`None`: it answers).
    pub fn message(&self) -> Option<String> {
        self.cause().map(|c| unreachable_message(&self.cluster, &c))
    }

    /// The cause, while the last health check failed.
    pub fn cause(&self) -> Option<String> {
        self.down
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The error to answer with while the lower cluster is known to be unreachable.
    pub fn unavailable(&self) -> Option<BackendError> {
        self.cause()
            .map(|c| BackendError::unavailable(unreachable_message(&self.cluster, &c)))
    }

    /// A failed lower request as the user should read it: an unreachable cluster is a 503
    /// naming the cluster and the cause; an error status is `context: message (code)`, a 400
    /// again upstairs.
    pub fn error(&self, context: &str, e: &kube::Error) -> BackendError {
        let (_, cause) = describe(e);
        if is_unreachable(e) {
            BackendError::unavailable(unreachable_message(&self.cluster, &cause))
        } else if matches!(e, kube::Error::Api(s) if s.code == 400) {
            // Such as `logs --previous` of a container that never restarted: the lower
            // answer is a 400 whose message the upper API server shows the user.
            BackendError::bad_request(format!("{context}: {cause}"))
        } else {
            BackendError::new(format!("{context}: {cause}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("client error (Connect)")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn the_chain_reaches_the_root_cause() {
        let e = Outer(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "invalid peer certificate: UnknownIssuer",
        ));
        let links = chain(&e);
        assert_eq!(
            links,
            vec![
                "client error (Connect)".to_owned(),
                "invalid peer certificate: UnknownIssuer".to_owned()
            ]
        );
        assert_eq!(explain(&links).0, Cause::Certificate);
    }

    #[test]
    fn a_lower_bad_request_stays_a_bad_request_and_other_statuses_take_the_routes() {
        let reach = LowerReach::new("lower-1");
        let status = |code| {
            kube::Error::Api(
                kube::core::Status::failure("previous terminated container \"c\" not found", "")
                    .with_code(code)
                    .boxed(),
            )
        };
        let route = http::StatusCode::NOT_FOUND;
        let bad = reach.error("logs", &status(400));
        assert_eq!(bad.status(route), http::StatusCode::BAD_REQUEST);
        assert!(
            bad.to_string()
                .starts_with("logs: previous terminated container")
        );
        assert_eq!(reach.error("logs", &status(404)).status(route), route);
    }

    #[test]
    fn reachability_is_a_gauge_of_the_lower_cluster() {
        let mut registry = Registry::default();
        let reach = LowerReach::new("lower-1").reported_in(&mut registry);
        let text = |registry: &Registry| {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
            out
        };
        let series = "tensile_lower_cluster_reachable{lower_cluster=\"lower-1\"}";
        assert!(text(&registry).contains(&format!("{series} 1")));
        // Clones (the backend's, the pod controller's) report into the same gauge.
        reach.clone().set(Some("connection refused".into()));
        assert!(text(&registry).contains(&format!("{series} 0")));
        reach.set(None);
        assert!(text(&registry).contains(&format!("{series} 1")));
    }

    #[test]
    fn an_unreachable_cluster_is_a_503_naming_it() {
        let reach = LowerReach::new("lower-1");
        assert!(reach.unavailable().is_none());
        reach.set(Some("connection refused".into()));
        let e = reach.unavailable().unwrap();
        assert!(e.is_unavailable());
        assert_eq!(
            e.to_string(),
            "lower cluster lower-1 unreachable: connection refused"
        );
    }
}
