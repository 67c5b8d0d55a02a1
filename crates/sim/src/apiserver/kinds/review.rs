//! The create-only review kinds: nothing is stored, the answer is the body with its status.
//! TokenReviews authenticate a token as the API server would; SubjectAccessReviews (the
//! requester's own: SelfSubjectAccessReviews; in one namespace: LocalSubjectAccessReviews)
//! are decided by the RBAC policy like a request of that user; a SelfSubjectReview says who
//! the requester is (`kubectl auth whoami`).

use serde_json::{Value, json};

use super::core::spec_audiences;
use super::rbac::review_status;
use crate::apiserver::errors::ApiError;
use crate::apiserver::meta;
use crate::apiserver::strategy::Strategy;
use crate::apiserver::{State, UserInfo};

/// A review kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Review {
    /// authentication.k8s.io TokenReview.
    Token,
    /// authorization.k8s.io SubjectAccessReview.
    SubjectAccess,
    /// authorization.k8s.io SelfSubjectAccessReview: the requester's own access.
    SelfSubjectAccess,
    /// authorization.k8s.io LocalSubjectAccessReview: a SubjectAccessReview in the namespace
    /// it is created in.
    LocalSubjectAccess,
    /// authentication.k8s.io SelfSubjectReview: the requester's user.
    SelfSubject,
}

impl Strategy for Review {
    fn create(
        &self,
        state: &State,
        namespace: Option<&str>,
        body: Value,
        user: &UserInfo,
    ) -> Result<(u16, Value), ApiError> {
        let status = match self {
            Self::LocalSubjectAccess => {
                local_review_check(namespace.unwrap_or_default(), &body)?;
                review_status(state, &body)
            }
            Self::SelfSubject => {
                let mut out = body;
                out["metadata"]["creationTimestamp"] = json!(meta::now());
                out["status"] = json!({"userInfo":
                    {"username": user.username, "uid": user.uid, "groups": user.groups}});
                return Ok((201, out));
            }
            Self::Token => token_review_status(state, &body),
            Self::SubjectAccess => review_status(state, &body),
            Self::SelfSubjectAccess => {
                let mut review = body.clone();
                review["spec"]["user"] = json!(user.username);
                review["spec"]["uid"] = json!(user.uid);
                review["spec"]["groups"] = json!(user.groups);
                review_status(state, &review)
            }
        };
        let mut out = body;
        out["status"] = status;
        Ok((201, out))
    }
}

/// `ValidateLocalSubjectAccessReview`: the review is about the namespace it is created in, and
/// only about resources.
fn local_review_check(namespace: &str, body: &Value) -> Result<(), ApiError> {
    let mut causes = Vec::new();
    if let Some(n) = body
        .pointer("/spec/nonResourceAttributes")
        .filter(|n| !n.is_null())
    {
        causes.push((
            "spec.nonResourceAttributes".to_owned(),
            format!("Invalid value: {n}: disallowed on this kind of request"),
        ));
    }
    let asked = body
        .pointer("/spec/resourceAttributes/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let own = meta::namespace(body)
        .filter(|n| !n.is_empty())
        .unwrap_or(namespace);
    if own != namespace {
        return Err(ApiError::bad_request(format!(
            "namespace of the review ({own}) does not match the namespace of the request ({namespace})"
        )));
    }
    if asked != namespace {
        causes.push((
            "spec.resourceAttributes.namespace".to_owned(),
            format!("Invalid value: {asked:?}: must match metadata.namespace"),
        ));
    }
    if causes.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid(
        "authorization.k8s.io",
        "LocalSubjectAccessReview",
        "",
        &causes,
    ))
}

fn token_review_status(state: &State, body: &Value) -> Value {
    let token = body
        .pointer("/spec/token")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let audiences = spec_audiences(body);
    match state.authenticate(token, &audiences) {
        Ok(a) => {
            let mut user =
                json!({"username": a.user.username, "uid": a.user.uid, "groups": a.user.groups});
            if let Some((name, uid)) = a.pod {
                user["extra"] = json!({
                    "authentication.kubernetes.io/pod-name": [name],
                    "authentication.kubernetes.io/pod-uid": [uid],
                });
            }
            json!({"authenticated": true, "user": user, "audiences": a.audiences})
        }
        Err(why) => json!({"authenticated": false, "error": why}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            username: name.into(),
            uid: String::new(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        }
    }

    #[test]
    fn reviews_answer_with_the_decision_and_store_nothing() {
        let state = State::for_tests();
        let ask = json!({"spec": {"resourceAttributes": {"verb": "get", "resource": "pods"}}});
        let admin = user("admin", &["system:masters", "system:authenticated"]);
        let (code, out) = Review::SelfSubjectAccess
            .create(&state, None, ask.clone(), &admin)
            .unwrap();
        assert_eq!((code, out["status"]["allowed"].clone()), (201, json!(true)));
        let nobody = user("nobody", &["system:authenticated"]);
        let (_, out) = Review::SelfSubjectAccess
            .create(&state, None, ask.clone(), &nobody)
            .unwrap();
        assert_eq!(out["status"]["allowed"], false);
        let mut of_admin = ask;
        of_admin["spec"]["user"] = json!("admin");
        of_admin["spec"]["groups"] = json!(["system:masters"]);
        let (_, out) = Review::SubjectAccess
            .create(&state, None, of_admin, &nobody)
            .unwrap();
        assert_eq!(out["status"]["allowed"], true);
        let (_, out) = Review::Token
            .create(&state, None, json!({"spec": {"token": "nope"}}), &admin)
            .unwrap();
        assert_eq!(out["status"]["authenticated"], false);
    }

    #[test]
    fn a_local_review_is_about_its_own_namespace_and_a_self_review_names_the_requester() {
        let state = State::for_tests();
        let admin = user("admin", &["system:masters", "system:authenticated"]);
        let local = |ns: &str| {
            json!({"spec": {"user": "admin", "groups": ["system:masters"],
                "resourceAttributes": {"namespace": ns, "verb": "get", "resource": "pods"}}})
        };
        let (_, out) = Review::LocalSubjectAccess
            .create(&state, Some("team"), local("team"), &admin)
            .unwrap();
        assert_eq!(out["status"]["allowed"], true);
        let e = Review::LocalSubjectAccess
            .create(&state, Some("team"), local("other"), &admin)
            .unwrap_err();
        assert_eq!(e.code, 422);
        let (code, me) = Review::SelfSubject
            .create(&state, None, json!({}), &admin)
            .unwrap();
        assert_eq!(code, 201);
        assert_eq!(me["status"]["userInfo"]["username"], "admin");
        assert_eq!(me["status"]["userInfo"]["groups"][0], "system:masters");
    }
}
