//! The pod path's errors, typed by what follows from them. Each variant is a kind of failure
//! with its context (which object, which cluster, what was being done); [`policy`] maps a
//! failure to what the controller does next: the queue's action, the Warning event on the
//! upper pod (and its reason), and the log level. The rule lives here, in one function, so
//! that retry, back-off and events follow from the type and nowhere else.
//!
//! API errors are sorted by their status code in one place,
//! `tensile_runtime::api_error::classify`.

use std::time::Duration;

use tensile_core::keys::{
    EVENT_PROVIDER_CREATE_FAILED, EVENT_PROVIDER_DELETE_FAILED, EVENT_PROVIDER_UPDATE_FAILED,
};

use tensile_runtime::api_error::{ApiClass, Level, TRANSIENT_QUIET, classify};
use tensile_runtime::controller::OnFailure;

use crate::namespaces::NamespaceError;

/// Which cluster a call went to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cluster {
    /// The upper cluster.
    Upper,
    /// The lower cluster of this name.
    Lower(String),
}

impl std::fmt::Display for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cluster::Upper => f.write_str("the upper cluster"),
            Cluster::Lower(name) => write!(f, "lower cluster {name}"),
        }
    }
}

/// What was being done when a call failed: `creating Pod default/web in lower cluster a`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// What was being done, as a verb (`creating`, `writing the status of`).
    pub doing: &'static str,
    /// The object, as `Kind namespace/name`.
    pub object: String,
    /// Where.
    pub cluster: Cluster,
}

impl Call {
    /// `doing` the `kind` `namespace/name` in `cluster`.
    pub fn new(
        doing: &'static str,
        kind: &str,
        namespace: &str,
        name: &str,
        cluster: Cluster,
    ) -> Self {
        Call {
            doing,
            object: format!("{kind} {namespace}/{name}"),
            cluster,
        }
    }
}

impl std::fmt::Display for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} in {}", self.doing, self.object, self.cluster)
    }
}

/// The underlying error of a failed call (the API server's answer, or the error of the module
/// that made the call, which names its object too).
pub type Source = Box<dyn std::error::Error + Send + Sync>;

/// Why a pod's sync failed.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// The API server could not answer now (see [`ApiClass::Transient`]).
    #[error("{call}: {source}")]
    Transient {
        /// What failed.
        call: Call,
        /// Why.
        #[source]
        source: Source,
    },
    /// The API server is ahead of our cache (see [`ApiClass::Conflict`]).
    #[error("{call}: {source}")]
    Conflict {
        /// What failed.
        call: Call,
        /// Why.
        #[source]
        source: Source,
    },
    /// An upper object the pod needs is not there (yet): it waits, as a kubelet does.
    #[error("{kind} {namespace}/{name} {why}; the pod waits for it")]
    MissingDependency {
        /// The kind, as in today's messages (`secret`).
        kind: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// What is missing (`not found in the upper cluster`).
        why: &'static str,
    },
    /// The copy of an upper object the pod needs is not in the lower cluster yet: the copy
    /// controller (its only writer, `crate::copies`) makes it and wakes the pod. Quiet while it
    /// is a moment's wait; an event once it lasts, or when making it failed.
    #[error(
        "{kind} {namespace}/{name} is not copied to {cluster} yet{}; the pod waits for it",
        failed.as_ref().map(|f| format!(" (the last attempt failed: {f})")).unwrap_or_default()
    )]
    CopyPending {
        /// The kind, as `kubectl` spells it.
        kind: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Where.
        cluster: Cluster,
        /// Why the copy controller's last create failed, if it did.
        failed: Option<String>,
    },
    /// The lower API server refused the object (validation, admission, quota, RBAC).
    #[error("{call}: {source}")]
    RefusedByLower {
        /// What failed.
        call: Call,
        /// The lower API server's answer, with its reason.
        #[source]
        source: Source,
    },
    /// The upper API server refused a call of ours (a TokenRequest, a status).
    #[error("{call}: {source}")]
    RefusedByUpper {
        /// What failed.
        call: Call,
        /// The upper API server's answer.
        #[source]
        source: Source,
    },
    /// The upper pod itself cannot be carried down (it does not translate, or needs what is
    /// never copied): nothing changes until the pod, or what it names, does.
    #[error("{0}")]
    Invalid(#[source] Source),
    /// A lower object of the name is not ours: never used for an upper pod, never overwritten.
    #[error(
        "a {kind} {namespace}/{name} that is not ours exists in {cluster}: it is never used for \
         an upper pod, and the pod waits until it is gone"
    )]
    Ownership {
        /// Its kind.
        kind: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Where.
        cluster: Cluster,
    },
}

impl SyncError {
    /// The failure of `call`, whose client error was `e`.
    pub fn api(call: Call, e: kube::Error) -> Self {
        let class = classify(&e);
        Self::classified(call, class, Box::new(e))
    }

    /// The failure of `call`, classified as `class`, for `source`.
    pub(crate) fn classified(call: Call, class: ApiClass, source: Source) -> Self {
        match class {
            ApiClass::Transient => SyncError::Transient { call, source },
            ApiClass::Conflict => SyncError::Conflict { call, source },
            ApiClass::Refused if call.cluster == Cluster::Upper => {
                SyncError::RefusedByUpper { call, source }
            }
            ApiClass::Refused => SyncError::RefusedByLower { call, source },
        }
    }

    /// The failure to make lower namespace `ns` exist, for an object `kind` `ns/name`.
    pub fn namespace(e: NamespaceError, kind: &str, name: &str, lower: &str) -> Self {
        let (class, cluster) = match &e {
            NamespaceError::Upper { source, .. } => (classify(source), Cluster::Upper),
            NamespaceError::Lower { source, .. } => {
                (classify(source), Cluster::Lower(lower.to_owned()))
            }
        };
        let ns = match &e {
            NamespaceError::Upper { name, .. } | NamespaceError::Lower { name, .. } => name.clone(),
        };
        let call = Call::new("making the namespace exist for", kind, &ns, name, cluster);
        Self::classified(call, class, Box::new(e))
    }

    /// A wait for a copy the copy controller is making, with nothing to tell the pod's owner
    /// yet: the pod's status is left as it is.
    pub fn is_quiet_wait(&self) -> bool {
        matches!(self, SyncError::CopyPending { failed: None, .. })
    }

    /// A short name of the kind, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            SyncError::Transient { .. } => "transient",
            SyncError::Conflict { .. } => "conflict",
            SyncError::MissingDependency { .. } => "missing-dependency",
            SyncError::CopyPending { .. } => "copy-pending",
            SyncError::RefusedByLower { .. } => "refused-by-lower",
            SyncError::RefusedByUpper { .. } => "refused-by-upper",
            SyncError::Invalid(_) => "invalid",
            SyncError::Ownership { .. } => "ownership",
        }
    }
}

/// Which part of a pod's sync failed: it names the Warning event (virtual-kubelet's reasons).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Creating the lower pod and what it needs first.
    Create,
    /// Carrying a change of the upper pod down.
    Update,
    /// Deleting the lower pod.
    Delete,
    /// Anything else (statuses written up, token garbage): no event, the log tells.
    Other,
}

impl Op {
    /// The reason of the Warning event of a failure of this part.
    fn reason(self) -> Option<&'static str> {
        match self {
            Op::Create => Some(EVENT_PROVIDER_CREATE_FAILED),
            Op::Update => Some(EVENT_PROVIDER_UPDATE_FAILED),
            Op::Delete => Some(EVENT_PROVIDER_DELETE_FAILED),
            Op::Other => None,
        }
    }
}

/// A failed pod sync: what failed, in which part.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct Failure {
    /// The part.
    pub op: Op,
    /// What failed.
    #[source]
    pub error: SyncError,
}

impl Failure {
    /// `error` in part `op`.
    pub fn new(op: Op, error: SyncError) -> Self {
        Failure { op, error }
    }
}

impl From<SyncError> for Failure {
    fn from(error: SyncError) -> Self {
        Failure::new(Op::Other, error)
    }
}

/// What follows from a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// What the queue does.
    pub on_failure: OnFailure,
    /// The reason of the Warning event on the upper pod, if one is due.
    pub event: Option<&'static str>,
    /// The log level.
    pub level: Level,
}

/// What follows from `failure`, for a pod whose sync has been failing for `failing_for`
/// (zero at its first failure).
pub fn policy(failure: &Failure, failing_for: Duration) -> Policy {
    let event = failure.op.reason();
    let (then, event, level) = match &failure.error {
        SyncError::Transient { .. } if failing_for < TRANSIENT_QUIET => {
            (OnFailure::Retry, None, Level::Debug)
        }
        SyncError::Transient { .. } => (OnFailure::Retry, event, Level::Warn),
        // The watch brings the change: at once in effect (the first back-off is 5 ms), and
        // slower while the cache stays behind, so that a stale cache is no hot loop.
        SyncError::Conflict { .. } => (OnFailure::Retry, None, Level::Debug),
        // As a kubelet waiting for a ConfigMap: an event at every attempt (one series with a
        // count: the sink folds repeats); the object's watch brings the pod back at once.
        SyncError::MissingDependency { .. } => (OnFailure::Retry, event, Level::Debug),
        // The copy controller wakes a pod still to be created when the copy is there, or when
        // making it failed: nothing to look at before (no polling), and a moment's wait is no
        // news. A pod that exists downstairs (an ephemeral container waits) is not woken: it
        // looks again with back-off, quietly for a while.
        SyncError::CopyPending { failed: None, .. } if failure.op == Op::Create => {
            (OnFailure::Done, None, Level::Debug)
        }
        SyncError::CopyPending { failed: None, .. } if failing_for < TRANSIENT_QUIET => {
            (OnFailure::Retry, None, Level::Debug)
        }
        SyncError::CopyPending { .. } => (OnFailure::Retry, event, Level::Warn),
        // Quotas free up and admission changes: tried again, with back-off.
        SyncError::RefusedByLower { .. } | SyncError::RefusedByUpper { .. } => {
            (OnFailure::Retry, event, Level::Warn)
        }
        // Trying again changes nothing: the pod's (or its dependency's) next change does.
        SyncError::Invalid(_) => (OnFailure::Done, event, Level::Info),
        // Nobody tells us when someone else's object goes: looked at again, with back-off.
        SyncError::Ownership { .. } => (OnFailure::Retry, event, Level::Warn),
    };
    Policy {
        on_failure: then,
        event,
        level,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    pub(crate) fn api_error(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            reason: reason.to_owned(),
            message: format!("answer {code}"),
            ..kube::core::Status::default()
        }))
    }

    fn lower() -> Cluster {
        Cluster::Lower("a".into())
    }

    fn call(cluster: Cluster) -> Call {
        Call::new("creating", "Pod", "default", "web", cluster)
    }

    #[test]
    fn a_refusal_names_the_cluster_that_refused_and_keeps_its_reason() {
        let e = SyncError::api(call(lower()), api_error(403, "Forbidden"));
        assert_eq!(e.kind(), "refused-by-lower");
        let text = e.to_string();
        assert!(
            text.starts_with("creating Pod default/web in lower cluster a: "),
            "{text}"
        );
        assert!(text.contains("Forbidden"), "{text}");
        let e = SyncError::api(call(Cluster::Upper), api_error(422, "Invalid"));
        assert_eq!(e.kind(), "refused-by-upper");
        assert!(e.to_string().contains("in the upper cluster"), "{e}");
        let e = SyncError::api(call(lower()), api_error(409, "Conflict"));
        assert_eq!(e.kind(), "conflict");
        let e = SyncError::api(call(lower()), api_error(503, "ServiceUnavailable"));
        assert_eq!(e.kind(), "transient");
    }

    #[test]
    fn namespace_errors_take_their_kind_from_what_failed() {
        let ns = NamespaceError::Lower {
            name: "shop".into(),
            source: api_error(403, "Forbidden"),
        };
        let e = SyncError::namespace(ns, "Pod", "web", "a");
        assert_eq!(e.kind(), "refused-by-lower");
        assert!(
            e.to_string()
                .starts_with("making the namespace exist for Pod shop/web in lower cluster a"),
            "{e}"
        );
        let ns = NamespaceError::Upper {
            name: "shop".into(),
            source: kube::Error::Service("timed out".into()),
        };
        assert_eq!(
            SyncError::namespace(ns, "Pod", "web", "a").kind(),
            "transient"
        );
    }

    fn failure(op: Op, error: SyncError) -> Failure {
        Failure::new(op, error)
    }

    fn missing() -> SyncError {
        SyncError::MissingDependency {
            kind: "secret",
            namespace: "default".into(),
            name: "s".into(),
            why: "not found in the upper cluster",
        }
    }

    #[test]
    fn a_pod_waiting_for_its_copy_is_woken_not_polled_and_quiet_until_it_is_news() {
        let pending = |failed: Option<&str>| SyncError::CopyPending {
            kind: "ConfigMap",
            namespace: "default".into(),
            name: "cfg".into(),
            cluster: lower(),
            failed: failed.map(str::to_owned),
        };
        let quiet = |then| Policy {
            on_failure: then,
            event: None,
            level: Level::Debug,
        };
        let (now, later) = (Duration::ZERO, TRANSIENT_QUIET);
        assert_eq!(
            policy(&failure(Op::Create, pending(None)), later),
            quiet(OnFailure::Done),
            "the copy controller wakes it"
        );
        assert_eq!(
            policy(&failure(Op::Update, pending(None)), now),
            quiet(OnFailure::Retry)
        );
        let news = Policy {
            on_failure: OnFailure::Retry,
            event: Some(EVENT_PROVIDER_CREATE_FAILED),
            level: Level::Warn,
        };
        assert_eq!(
            policy(&failure(Op::Create, pending(Some("quota"))), now),
            news
        );
        assert!(pending(None).is_quiet_wait() && !pending(Some("quota")).is_quiet_wait());
    }

    #[test]
    fn the_policy_follows_from_the_kind_and_the_part_that_failed() {
        let now = Duration::ZERO;
        let api = |class_code, cluster| SyncError::api(call(cluster), api_error(class_code, ""));
        let policy_of = |op, e, d| policy(&failure(op, e), d);
        // Transient: quiet at first, an event and a warning once it lasts.
        assert_eq!(
            policy_of(Op::Create, api(503, lower()), now),
            Policy {
                on_failure: OnFailure::Retry,
                event: None,
                level: Level::Debug
            }
        );
        assert_eq!(
            policy_of(Op::Create, api(503, lower()), TRANSIENT_QUIET),
            Policy {
                on_failure: OnFailure::Retry,
                event: Some(EVENT_PROVIDER_CREATE_FAILED),
                level: Level::Warn
            }
        );
        // Conflict: the watch brings the news; never an event, however long.
        assert_eq!(
            policy_of(Op::Update, api(409, lower()), Duration::from_secs(3600)),
            Policy {
                on_failure: OnFailure::Retry,
                event: None,
                level: Level::Debug
            }
        );
        // A missing dependency: an event at once (kubelet-style), back-off.
        assert_eq!(
            policy_of(Op::Create, missing(), now),
            Policy {
                on_failure: OnFailure::Retry,
                event: Some(EVENT_PROVIDER_CREATE_FAILED),
                level: Level::Debug
            }
        );
        // Refused by the lower cluster: an event with its reason at once, back-off, a warning.
        for (op, reason) in [
            (Op::Create, EVENT_PROVIDER_CREATE_FAILED),
            (Op::Update, EVENT_PROVIDER_UPDATE_FAILED),
            (Op::Delete, EVENT_PROVIDER_DELETE_FAILED),
        ] {
            assert_eq!(
                policy_of(op, api(422, lower()), now),
                Policy {
                    on_failure: OnFailure::Retry,
                    event: Some(reason),
                    level: Level::Warn
                }
            );
        }
        // Statuses written up and token garbage: never an event.
        assert_eq!(
            policy_of(Op::Other, api(422, Cluster::Upper), now).event,
            None
        );
        // Someone else's object: an event, looked at again with back-off.
        let theirs = SyncError::Ownership {
            kind: "Pod",
            namespace: "default".into(),
            name: "web".into(),
            cluster: lower(),
        };
        assert_eq!(
            policy_of(Op::Create, theirs, now),
            Policy {
                on_failure: OnFailure::Retry,
                event: Some(EVENT_PROVIDER_CREATE_FAILED),
                level: Level::Warn
            }
        );
    }

    /// Today's bug this fixes: a pod that cannot be translated (a malformed `clusterSelector`,
    /// a mandatory service-account token Secret) was retried every 10 s for ever, with an event
    /// each time. Retrying changes nothing: the pod's next change brings it back.
    #[test]
    fn an_invalid_pod_is_told_once_and_not_retried_until_it_changes() {
        let invalid = SyncError::Invalid("pod default/web has no containers".into());
        assert_eq!(
            policy(&failure(Op::Create, invalid), Duration::ZERO),
            Policy {
                on_failure: OnFailure::Done,
                event: Some(EVENT_PROVIDER_CREATE_FAILED),
                level: Level::Info
            }
        );
    }
}
