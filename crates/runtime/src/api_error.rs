//! API errors sorted by what follows from them, for every controller: [`classify`] by status
//! code (5xx, 429, 408, 401 and answers that never came are transient; 409 and 404 mean the
//! cache is behind the API server, whose watch brings the object's news; any other 4xx is a
//! refusal of the object), and how loud a failure is in the log ([`quiet_level`]).

use std::time::Duration;

use tokio::time::Instant;

/// How an API server's answer classifies (see [`classify`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiClass {
    /// Unreachable, timed out, overloaded (5xx, 429, 408), or our credentials were not taken
    /// (401: the client renews them): the same call may well succeed later.
    Transient,
    /// 409 or 404: the object changed or went since our cache saw it; the watch brings its
    /// news, and the next look decides anew.
    Conflict,
    /// Any other 4xx: the API server refused the object (validation, admission, quota, RBAC).
    Refused,
}

/// How an answer of HTTP status `code` classifies.
pub fn classify_code(code: u16) -> ApiClass {
    match code {
        404 | 409 => ApiClass::Conflict,
        401 | 408 | 429 => ApiClass::Transient,
        400..=499 => ApiClass::Refused,
        _ => ApiClass::Transient,
    }
}

/// How a client error classifies: by its status code when the API server answered, transient
/// otherwise (no connection, a timeout, a TLS failure, an answer cut short).
pub fn classify(e: &kube::Error) -> ApiClass {
    match e {
        kube::Error::Api(status) => classify_code(status.code),
        _ => ApiClass::Transient,
    }
}

/// The log level of a failed sync of a controller that sends no events (copies, volumes),
/// failing for `failing_for`: as the pod controller's policy, a conflict and a passing outage at
/// debug (the back-off and the watches take care of them), a refusal or an outage that lasts
/// at warn.
pub fn quiet_level(class: ApiClass, failing_for: Duration) -> Level {
    match class {
        ApiClass::Conflict => Level::Debug,
        ApiClass::Transient if failing_for < TRANSIENT_QUIET => Level::Debug,
        ApiClass::Transient | ApiClass::Refused => Level::Warn,
    }
}

/// Logs the failed sync `e` (`what`) at `level`.
pub fn log_failure(level: Level, e: &dyn std::error::Error, what: &'static str) {
    match level {
        Level::Debug => tracing::debug!(error = %e, "{what}"),
        Level::Info => tracing::info!(error = %e, "{what}"),
        Level::Warn => tracing::warn!(error = %e, "{what}"),
    }
}

/// How loud a failure is in the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// Expected on the way (a conflict, a wait the user was told of by an event).
    Debug,
    /// The user's input, told on the pod.
    Info,
    /// The operator should look: a refusal, someone else's object, an outage that lasts.
    Warn,
}

/// How long a transient failure of one object lasts before it is worth an event and a warning: an
/// API server that restarts, or answers 429 for a moment, is no news to the object's owner.
pub const TRANSIENT_QUIET: Duration = Duration::from_secs(30);

/// How long a key has been failing, from when its first failure in a row was (zero at its
/// first failure: see `crate::controller::Reconciler::failed`).
pub fn failing_for(since: Option<Instant>) -> Duration {
    since.map_or(Duration::ZERO, |since| since.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            reason: reason.to_owned(),
            message: format!("answer {code}"),
            ..kube::core::Status::default()
        }))
    }

    #[test]
    fn status_codes_classify_in_one_place() {
        for (code, class) in [
            (500, ApiClass::Transient),
            (503, ApiClass::Transient),
            (504, ApiClass::Transient),
            (429, ApiClass::Transient),
            (408, ApiClass::Transient),
            (401, ApiClass::Transient),
            (0, ApiClass::Transient),
            (409, ApiClass::Conflict),
            (404, ApiClass::Conflict),
            (400, ApiClass::Refused),
            (403, ApiClass::Refused),
            (413, ApiClass::Refused),
            (422, ApiClass::Refused),
        ] {
            assert_eq!(classify_code(code), class, "{code}");
            assert_eq!(classify(&api_error(code, "")), class, "{code}");
        }
        // No answer at all (no connection, a timeout): transient.
        let cut = kube::Error::Service("connection refused".into());
        assert_eq!(classify(&cut), ApiClass::Transient);
    }

    #[test]
    fn controllers_without_events_log_quietly_until_it_matters() {
        let (now, later) = (Duration::ZERO, TRANSIENT_QUIET);
        assert_eq!(quiet_level(ApiClass::Transient, now), Level::Debug);
        assert_eq!(quiet_level(ApiClass::Transient, later), Level::Warn);
        assert_eq!(quiet_level(ApiClass::Conflict, later), Level::Debug);
        assert_eq!(quiet_level(ApiClass::Refused, now), Level::Warn);
    }
}
