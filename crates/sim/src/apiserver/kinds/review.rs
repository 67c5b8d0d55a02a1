//! The create-only review kinds: nothing is stored, the answer is the body with its status.
//! TokenReviews authenticate a token as the API server would; SubjectAccessReviews (and the
//! requester's own, SelfSubjectAccessReviews) are decided by the RBAC policy like a request
//! of that user.

use serde_json::{Value, json};

use super::core::spec_audiences;
use super::rbac::review_status;
use crate::apiserver::errors::ApiError;
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
}

impl Strategy for Review {
    fn create(
        &self,
        state: &State,
        _namespace: Option<&str>,
        body: Value,
        user: &UserInfo,
    ) -> Result<(u16, Value), ApiError> {
        let status = match self {
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
}
