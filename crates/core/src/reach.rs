//! Why a cluster could not be reached, in words a user can act on, and when the virtual node
//! tells the upper cluster about it with an Event.
//!
//! The clients' errors arrive as chains (kube -> hyper -> the connector -> io -> rustls) whose
//! outer links say only `client error (Connect)`; [`explain`] reads the whole chain, as the
//! Display text of each link, outermost first, and names the cause: a certificate the client
//! does not trust (a cluster re-created with a new CA), a refused connection, a timeout, a name
//! that does not resolve.

use std::time::Duration;

/// What kind of failure a chain describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The server's certificate failed verification, or the server refused ours.
    Certificate,
    /// Nothing accepted the TCP connection.
    Refused,
    /// The connection or the answer took too long.
    Timeout,
    /// The server's name did not resolve.
    Dns,
    /// The connection was closed or reset under the request.
    Closed,
    /// Something else: the chain's own words.
    Other,
}

/// The certificate problems rustls names (its `CertificateError` variants as displayed), with
/// what they usually mean for a cluster.
const CERTIFICATE_HINTS: &[(&str, &str)] = &[
    (
        "UnknownIssuer",
        "the server's certificate is not signed by the CA in the kubeconfig; the cluster's CA changed (re-created cluster?)",
    ),
    (
        "BadSignature",
        "the server's certificate is not signed by the CA in the kubeconfig; the cluster's CA changed?",
    ),
    (
        "Expired",
        "the server's certificate has expired (or this machine's clock is wrong)",
    ),
    (
        "NotValidYet",
        "the server's certificate is not valid yet (is this machine's clock wrong?)",
    ),
    (
        "NotValidForName",
        "the server's certificate does not name the address in the kubeconfig",
    ),
    ("Revoked", "the server's certificate has been revoked"),
    ("BadEncoding", "the server's certificate cannot be decoded"),
];

/// Alerts a server sends when it refuses our client certificate.
const REFUSED_CLIENT_CERT: &[&str] = &[
    "BadCertificate",
    "UnknownCA",
    "CertificateRequired",
    "CertificateUnknown",
    "CertificateExpired",
    "bad certificate",
    "unknown certificate authority",
];

/// The cause of the failure `chain` describes (each link's Display text, outermost first) and a
/// message naming it: e.g. `certificate verify failed: UnknownIssuer (the server's certificate
/// is not signed by the CA in the kubeconfig; ...)`. An empty chain is `Other`, "unknown error".
pub fn explain(chain: &[String]) -> (Cause, String) {
    let all = chain.join(": ");
    let has = |needle: &str| all.contains(needle);
    let lower = all.to_ascii_lowercase();
    if has("invalid peer certificate") || lower.contains("certificate verify failed") {
        let hint = CERTIFICATE_HINTS.iter().find(|(name, _)| has(name));
        let message = match hint {
            Some((name, hint)) => format!("certificate verify failed: {name} ({hint})"),
            None => format!("certificate verify failed: {}", innermost(chain)),
        };
        return (Cause::Certificate, message);
    }
    if has("received fatal alert")
        && let Some(alert) = REFUSED_CLIENT_CERT.iter().find(|a| has(a))
    {
        return (
            Cause::Certificate,
            format!(
                "the server refused our client certificate ({alert}): the credentials in the kubeconfig are not signed by its CA"
            ),
        );
    }
    if lower.contains("connection refused") {
        return (
            Cause::Refused,
            "connection refused (no API server listens at the address)".to_owned(),
        );
    }
    if lower.contains("dns error") || lower.contains("failed to lookup address") {
        return (
            Cause::Dns,
            format!("cannot resolve the server's name: {}", innermost(chain)),
        );
    }
    if lower.contains("timed out") || lower.contains("deadline has elapsed") {
        return (Cause::Timeout, "timed out".to_owned());
    }
    if lower.contains("connection reset")
        || lower.contains("broken pipe")
        || lower.contains("connection closed")
        || lower.contains("unexpected eof")
        || lower.contains("unexpected end of file")
    {
        return (
            Cause::Closed,
            format!("the connection was closed: {}", innermost(chain)),
        );
    }
    if chain.is_empty() {
        return (Cause::Other, "unknown error".to_owned());
    }
    (Cause::Other, dedup_chain(chain))
}

/// The deepest link that says something (the root cause).
fn innermost(chain: &[String]) -> String {
    chain
        .iter()
        .rev()
        .find(|s| !s.trim().is_empty())
        .cloned()
        .unwrap_or_else(|| "unknown error".to_owned())
}

/// The chain as one line, leaving out links whose text the previous link already shows (many
/// errors print their source inside their own message).
fn dedup_chain(chain: &[String]) -> String {
    let mut out: Vec<&str> = Vec::new();
    for link in chain {
        let link = link.trim();
        if link.is_empty() || out.last().is_some_and(|prev| prev.contains(link)) {
            continue;
        }
        out.push(link);
    }
    out.join(": ")
}

/// What the kubelet API answers (503) and the node's events say while the lower cluster does
/// not answer.
pub fn unreachable_message(cluster: &str, cause: &str) -> String {
    format!("lower cluster {cluster} unreachable: {cause}")
}

/// The least time between two Warning events of the same reason about the lower cluster.
pub const WARNING_INTERVAL: Duration = Duration::from_secs(60);

/// An event about the lower cluster's reachability, for the virtual Node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthEvent {
    /// Warning (true) or Normal.
    pub warning: bool,
    /// `LowerClusterUnreachable` or `LowerClusterReachable`.
    pub reason: &'static str,
    /// For people.
    pub note: String,
}

/// Reason of the Warning event recorded when the lower cluster stops answering.
pub const REASON_UNREACHABLE: &str = "LowerClusterUnreachable";
/// Reason of the Normal event recorded when it answers again.
pub const REASON_REACHABLE: &str = "LowerClusterReachable";

/// Reason of the Warning event recorded while the lower cluster answers some requests with
/// errors (429, 5xx).
pub const REASON_ERRORS: &str = "LowerClusterErrors";

/// What the node says while the lower cluster answers some of its requests with errors:
/// `throttled` 429s and `server` 5xx of `requests` in the last `window`. `None` when none
/// failed.
pub fn errors_message(
    cluster: &str,
    (throttled, server): (u64, u64),
    requests: u64,
    window: Duration,
) -> Option<String> {
    let failed = throttled + server;
    (failed > 0).then(|| {
        format!(
            "lower cluster {cluster} answered {failed} of {} requests with errors in the last {} s ({throttled} throttled: 429, {server} server errors: 5xx)",
            requests.max(failed),
            window.as_secs()
        )
    })
}

/// Whether to record an event after a health check: on every transition (down: Warning, back:
/// Normal), and while it stays down, again when the cause changed or [`WARNING_INTERVAL`]
/// has passed since the last Warning (`since_warning`), so an outage is neither silent nor a
/// flood. `was`/`now` are the causes while unreachable (`None`: reachable).
pub fn health_event(
    cluster: &str,
    was: Option<&str>,
    now: Option<&str>,
    since_warning: Option<Duration>,
) -> Option<HealthEvent> {
    match (was, now) {
        (None, None) => None,
        (Some(_), None) => Some(HealthEvent {
            warning: false,
            reason: REASON_REACHABLE,
            note: format!("lower cluster {cluster} answers again"),
        }),
        (was, Some(cause)) => {
            let due = since_warning.is_none_or(|d| d >= WARNING_INTERVAL);
            (was.is_none() || due).then(|| HealthEvent {
                warning: true,
                reason: REASON_UNREACHABLE,
                note: unreachable_message(cluster, cause),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(links: &[&str]) -> Vec<String> {
        links.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn errors_of_the_lower_cluster_are_counted_in_words() {
        assert_eq!(
            errors_message("l", (0, 0), 40, Duration::from_secs(10)),
            None
        );
        assert_eq!(
            errors_message("l", (2, 1), 40, Duration::from_secs(10)).as_deref(),
            Some(
                "lower cluster l answered 3 of 40 requests with errors in the last 10 s (2 throttled: 429, 1 server errors: 5xx)"
            )
        );
    }

    #[test]
    fn an_unknown_issuer_deep_in_the_chain_is_named_as_a_certificate_error() {
        let (cause, message) = explain(&chain(&[
            "HyperError: client error (Connect)",
            "client error (Connect)",
            "invalid peer certificate: UnknownIssuer",
        ]));
        assert_eq!(cause, Cause::Certificate);
        assert!(
            message.starts_with("certificate verify failed: UnknownIssuer"),
            "{message}"
        );
        assert!(message.contains("CA changed"), "{message}");
        let (_, expired) = explain(&chain(&["invalid peer certificate: Expired"]));
        assert!(expired.contains("expired"), "{expired}");
        let (cause, other) = explain(&chain(&["invalid peer certificate: Other(x)"]));
        assert_eq!(cause, Cause::Certificate);
        assert!(other.contains("Other(x)"), "{other}");
    }

    #[test]
    fn a_refused_client_certificate_is_a_certificate_error() {
        let (cause, message) = explain(&chain(&[
            "client error (Connect)",
            "received fatal alert: UnknownCA",
        ]));
        assert_eq!(cause, Cause::Certificate);
        assert!(message.contains("client certificate"), "{message}");
    }

    #[test]
    fn network_failures_are_named() {
        let refused = chain(&[
            "client error (Connect)",
            "tcp connect error: Connection refused (os error 111)",
            "Connection refused (os error 111)",
        ]);
        assert_eq!(explain(&refused).0, Cause::Refused);
        assert_eq!(
            explain(&chain(&["operation timed out"])),
            (Cause::Timeout, "timed out".to_owned())
        );
        assert_eq!(
            explain(&chain(&[
                "client error (Connect)",
                "dns error: failed to lookup address information: Name or service not known"
            ]))
            .0,
            Cause::Dns
        );
        assert_eq!(
            explain(&chain(&["connection reset by peer"])).0,
            Cause::Closed
        );
    }

    #[test]
    fn anything_else_keeps_its_words_once() {
        assert_eq!(
            explain(&chain(&["outer: inner", "inner", "", "root"])),
            (Cause::Other, "outer: inner: root".to_owned())
        );
        assert_eq!(explain(&[]), (Cause::Other, "unknown error".to_owned()));
    }

    #[test]
    fn events_on_transitions_and_at_most_once_a_minute_while_down() {
        let c = "lower-1";
        assert_eq!(health_event(c, None, None, None), None);
        let down = health_event(c, None, Some("connection refused"), None).unwrap();
        assert!(down.warning);
        assert_eq!(down.reason, REASON_UNREACHABLE);
        assert_eq!(
            down.note,
            "lower cluster lower-1 unreachable: connection refused"
        );
        // Still down, same cause: not before a minute has passed.
        let secs = Duration::from_secs;
        assert_eq!(health_event(c, Some("x"), Some("x"), Some(secs(10))), None);
        assert!(health_event(c, Some("x"), Some("x"), Some(secs(60))).is_some());
        // A new cause within the minute waits too (one per reason per minute).
        assert_eq!(health_event(c, Some("x"), Some("y"), Some(secs(10))), None);
        // Going down again soon after coming back is a transition: recorded.
        assert!(health_event(c, None, Some("x"), Some(secs(5))).is_some());
        let back = health_event(c, Some("x"), None, Some(secs(5))).unwrap();
        assert!(!back.warning);
        assert_eq!(back.reason, REASON_REACHABLE);
    }
}
