//! The virtual node's own lower credential, a ServiceAccount token with an expiry (what
//! `tensile join` stores), renewed by the node before it expires: when, for which account, how
//! often to retry, and the kubeconfig written back upstairs. The requests are
//! `tensile_node::lower_token`.
//!
//! The token's claims are read without verifying its signature: they only schedule the renewal
//! (a forged `exp` can make us renew early or late, never trust anything more).

use std::time::Duration;

use serde_json::Value;

/// The share of a token's life after which it is renewed (as a kubelet renews the projected
/// tokens of its pods, and as `--tls-bootstrap` renews the node's certificate).
pub const RENEW_PERCENT: i64 = 80;
/// First retry of a failed renewal; doubled on each failure up to [`RETRY_MAX`].
pub const RETRY_FIRST: Duration = Duration::from_secs(5);
/// Longest wait between two tries of a failed renewal.
pub const RETRY_MAX: Duration = Duration::from_secs(300);

/// What the renewal needs of a token's claims.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenClaims {
    /// Namespace of the ServiceAccount (`sub` = `system:serviceaccount:<ns>:<name>`).
    pub namespace: String,
    /// Its name.
    pub account: String,
    /// `iat`, seconds since the epoch (`nbf` when there is no `iat`).
    pub issued: i64,
    /// `exp`, seconds since the epoch.
    pub expires: i64,
}

/// 9999-12-31T23:59:59Z, the last second a token's times may name.
const MAX_SECONDS: i64 = 253_402_300_799;

/// The claims of a token whose JWT payload (base64url-decoded) is `payload`: `None` unless it
/// is a ServiceAccount's token with an expiry (a legacy Secret-based token has no `exp`:
/// nothing to renew).
pub fn claims_of_payload(payload: &[u8]) -> Option<TokenClaims> {
    let v: Value = serde_json::from_slice(payload).ok()?;
    let subject = v.get("sub")?.as_str()?;
    let (namespace, account) = subject
        .strip_prefix("system:serviceaccount:")?
        .split_once(':')?;
    if namespace.is_empty() || account.is_empty() {
        return None;
    }
    let expires = v.get("exp")?.as_i64()?;
    let issued = v
        .get("iat")
        .or_else(|| v.get("nbf"))
        .and_then(Value::as_i64)?;
    // Times a token can carry (seconds from 1970 to the year 9999): beyond them the life and
    // renewal time overflowed (found by the fuzz target `annotations`).
    let plausible = |t: i64| (0..=MAX_SECONDS).contains(&t);
    (plausible(issued) && plausible(expires) && expires > issued).then(|| TokenClaims {
        namespace: namespace.to_owned(),
        account: account.to_owned(),
        issued,
        expires,
    })
}

/// The life a renewal asks for: the current token's (the server may shorten it).
pub fn requested_seconds(claims: &TokenClaims) -> i64 {
    claims.expires - claims.issued
}

/// When the token of `claims` is renewed (seconds since the epoch): at [`RENEW_PERCENT`] of its
/// life, or `renew_after` after it was issued when that is sooner (a shorter schedule for
/// tests and for operators who want renewals seen early; never later than the expiry).
pub fn renewal_time(claims: &TokenClaims, renew_after: Option<Duration>) -> i64 {
    let life = claims.expires - claims.issued;
    let mut after = life / 100 * RENEW_PERCENT + (life % 100) * RENEW_PERCENT / 100;
    if let Some(d) = renew_after {
        after = after.min(i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    }
    claims.issued + after
}

/// The wait before try `failures + 1` of a renewal that failed `failures` times: doubling from
/// [`RETRY_FIRST`] to [`RETRY_MAX`].
pub fn retry_delay(failures: u32) -> Duration {
    let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(16));
    RETRY_FIRST.saturating_mul(factor).min(RETRY_MAX)
}

/// Why a kubeconfig cannot take a renewed token.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KubeconfigTokenError {
    /// Its current context names no user entry of the kubeconfig.
    #[error("the kubeconfig's current context {0:?} names no user of the kubeconfig")]
    NoUser(String),
    /// It has no current context, or that context is not in it.
    #[error("the kubeconfig has no current context")]
    NoContext,
}

/// `kubeconfig` (parsed YAML or JSON) with the token of its current context's user replaced by
/// `token`: everything else (server, CA, names) as it was, so a restarted node reads the same
/// cluster with the renewed credential.
pub fn with_token(kubeconfig: &Value, token: &str) -> Result<Value, KubeconfigTokenError> {
    let mut out = kubeconfig.clone();
    let current = kubeconfig
        .get("current-context")
        .and_then(Value::as_str)
        .ok_or(KubeconfigTokenError::NoContext)?;
    let user = kubeconfig
        .get("contexts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|c| c.get("name").and_then(Value::as_str) == Some(current))
        .and_then(|c| c.pointer("/context/user"))
        .and_then(Value::as_str)
        .ok_or(KubeconfigTokenError::NoContext)?
        .to_owned();
    let entry = out
        .get_mut("users")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .find(|u| u.get("name").and_then(Value::as_str) == Some(user.as_str()))
        .ok_or_else(|| KubeconfigTokenError::NoUser(current.to_owned()))?;
    if !entry["user"].is_object() {
        entry["user"] = serde_json::json!({});
    }
    entry["user"]["token"] = Value::String(token.to_owned());
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code
mod tests {
    use super::*;
    use serde_json::json;

    fn claims(issued: i64, expires: i64) -> TokenClaims {
        TokenClaims {
            namespace: "kube-system".into(),
            account: "tensile".into(),
            issued,
            expires,
        }
    }

    #[test]
    fn a_service_account_token_with_an_expiry_has_claims_others_have_none() {
        let p = json!({"sub": "system:serviceaccount:kube-system:tensile", "iat": 100, "exp": 700,
            "aud": ["https://kubernetes.default.svc"]});
        assert_eq!(
            claims_of_payload(p.to_string().as_bytes()),
            Some(claims(100, 700))
        );
        // A legacy Secret-based token never expires: nothing to renew.
        let legacy = json!({"sub": "system:serviceaccount:kube-system:tensile"});
        assert_eq!(claims_of_payload(legacy.to_string().as_bytes()), None);
        let user = json!({"sub": "alice", "iat": 1, "exp": 2});
        assert_eq!(claims_of_payload(user.to_string().as_bytes()), None);
        let backwards = json!({"sub": "system:serviceaccount:a:b", "iat": 5, "exp": 5});
        assert_eq!(claims_of_payload(backwards.to_string().as_bytes()), None);
        assert_eq!(claims_of_payload(b"not json"), None);
        // Found by the fuzz target `annotations`: a life of more than i64::MAX seconds
        // overflowed when it was computed.
        for (iat, exp) in [(-100, i64::MAX), (-1, 10), (0, MAX_SECONDS + 1)] {
            let p = json!({"sub": "system:serviceaccount:a:b", "iat": iat, "exp": exp});
            assert_eq!(
                claims_of_payload(p.to_string().as_bytes()),
                None,
                "{iat} {exp}"
            );
        }
    }

    #[test]
    fn a_token_is_renewed_at_four_fifths_of_its_life_or_sooner_when_asked() {
        let c = claims(1_000, 1_000 + 365 * 24 * 3600);
        assert_eq!(renewal_time(&c, None), 1_000 + 365 * 24 * 36 * 80);
        assert_eq!(renewal_time(&claims(0, 600), None), 480);
        assert_eq!(
            renewal_time(&claims(0, 600), Some(Duration::from_secs(20))),
            20
        );
        // Never after the usual point, however long the flag.
        assert_eq!(
            renewal_time(&claims(0, 600), Some(Duration::from_secs(10_000))),
            480
        );
        assert_eq!(requested_seconds(&claims(10, 610)), 600);
    }

    #[test]
    fn failed_renewals_back_off_to_five_minutes() {
        assert_eq!(retry_delay(1), Duration::from_secs(5));
        assert_eq!(retry_delay(2), Duration::from_secs(10));
        assert_eq!(retry_delay(4), Duration::from_secs(40));
        assert_eq!(retry_delay(7), RETRY_MAX);
        assert_eq!(retry_delay(u32::MAX), RETRY_MAX);
    }

    #[test]
    fn the_kubeconfig_keeps_everything_but_the_token_of_its_current_user() {
        let kc = json!({"apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "l", "cluster": {"server": "https://l:6443", "certificate-authority-data": "Q0E="}}],
            "users": [{"name": "other", "user": {"token": "keep"}}, {"name": "tensile", "user": {"token": "old"}}],
            "contexts": [{"name": "l", "context": {"cluster": "l", "user": "tensile"}}],
            "current-context": "l"});
        let out = with_token(&kc, "new").unwrap();
        assert_eq!(out["users"][1]["user"]["token"], "new");
        assert_eq!(out["users"][0]["user"]["token"], "keep");
        let mut back = out.clone();
        back["users"][1]["user"]["token"] = json!("old");
        assert_eq!(back, kc);
        let mut broken = kc.clone();
        broken["current-context"] = json!("missing");
        assert_eq!(
            with_token(&broken, "t"),
            Err(KubeconfigTokenError::NoContext)
        );
        broken["current-context"] = json!("l");
        broken["users"] = json!([]);
        assert_eq!(
            with_token(&broken, "t"),
            Err(KubeconfigTokenError::NoUser("l".into()))
        );
    }
}
