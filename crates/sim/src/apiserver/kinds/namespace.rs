//! Namespaces: the `kubernetes.io/metadata.name` label and the `kubernetes` finalizer on
//! create, what every namespace brings along (its `default` ServiceAccount and
//! `kube-root-ca.crt`), deletion as `Terminating` until the namespace controller empties it,
//! and the `finalize` subresource.

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use crate::apiserver::State;
use crate::apiserver::errors::ApiError;
use crate::apiserver::meta::{self, meta_mut};
use crate::apiserver::resources::{self, ids};
use crate::apiserver::rest::DeleteOptions;
use crate::apiserver::store::ObjKey;
use crate::apiserver::strategy::{
    NameRule, Strategy, SubresourceCall, init_meta, may_finish_deletion,
};

/// The strategy of namespaces.
#[derive(Debug)]
pub(crate) struct Namespaces;

impl Strategy for Namespaces {
    fn name_rule(&self) -> NameRule {
        NameRule::Label
    }

    fn prepare_create(&self, _state: &State, obj: &mut Value) -> Result<(), ApiError> {
        let name = meta::name(obj).unwrap_or_default().to_owned();
        let m = meta_mut(obj);
        let labels = m.entry("labels").or_insert_with(|| json!({}));
        if let Some(l) = labels.as_object_mut() {
            l.insert("kubernetes.io/metadata.name".into(), json!(name));
        }
        obj["spec"] = json!({"finalizers": ["kubernetes"]});
        obj["status"] = json!({"phase": "Active"});
        Ok(())
    }

    fn after_create(&self, state: &State, obj: &Value) {
        let ns = meta::name(obj).unwrap_or_default().to_owned();
        let mut sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": ns}});
        init_meta(&mut sa);
        let _ = state
            .store
            .create(*ids::SERVICEACCOUNTS, ObjKey::new(&ns, "default"), sa);
        let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "kube-root-ca.crt", "namespace": ns,
                "annotations": {"kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."}},
            "data": {"ca.crt": state.config.certs.ca_pem}});
        init_meta(&mut cm);
        let _ = state
            .store
            .create(*ids::CONFIGMAPS, ObjKey::new(&ns, "kube-root-ca.crt"), cm);
    }

    /// Always marked (Terminating); the namespace controller deletes its content, then
    /// finalizes it.
    fn deletion(&self, obj: &Value, _opts: &DeleteOptions) -> Option<Value> {
        let mut marked = obj.clone();
        let m = meta_mut(&mut marked);
        m.entry("deletionTimestamp")
            .or_insert_with(|| json!(meta::time_string(Timestamp::now())));
        m.insert("deletionGracePeriodSeconds".into(), json!(0));
        marked["status"] = json!({"phase": "Terminating"});
        Some(marked)
    }

    /// Once `spec.finalizers` is empty too.
    fn may_finish_deletion(&self, obj: &Value) -> bool {
        obj.pointer("/spec/finalizers")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty)
    }

    fn subresource(
        &self,
        state: &State,
        call: &SubresourceCall<'_>,
        body: Value,
    ) -> Option<Result<(u16, Value), ApiError>> {
        (call.sub == "finalize" && call.method == http::Method::PUT)
            .then(|| finalize(state, call.name, &body))
    }
}

/// `namespaces/finalize`: writes `spec.finalizers`; the namespace goes when it was the last.
fn finalize(state: &State, name: &str, body: &Value) -> Result<(u16, Value), ApiError> {
    let k = ObjKey::new("", name);
    let current = state
        .store
        .get(*ids::NAMESPACES, &k)
        .ok_or_else(|| ApiError::not_found("", "namespaces", name))?;
    let mut new = (*current.object).clone();
    new["spec"]["finalizers"] = body
        .pointer("/spec/finalizers")
        .cloned()
        .unwrap_or(json!([]));
    let rt = resources::get(*ids::NAMESPACES);
    let result = if may_finish_deletion(rt, &new) {
        state.store.remove(*ids::NAMESPACES, &k, Some(current.rv))
    } else {
        state
            .store
            .replace(*ids::NAMESPACES, k, new, Some(current.rv))
    };
    result
        .map(|e| (200, (*e.object).clone()))
        .map_err(|e| ApiError::conflict("", "namespaces", name, &e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_is_labelled_finalized_and_brings_its_account_and_ca() {
        let state = State::for_tests();
        let mut ns = json!({"metadata": {"name": "team"}});
        Namespaces.prepare_create(&state, &mut ns).unwrap();
        assert_eq!(
            ns["metadata"]["labels"]["kubernetes.io/metadata.name"],
            "team"
        );
        assert_eq!(ns["spec"]["finalizers"], json!(["kubernetes"]));
        assert_eq!(ns["status"]["phase"], "Active");
        Namespaces.after_create(&state, &ns);
        assert!(
            state
                .store
                .get(*ids::SERVICEACCOUNTS, &ObjKey::new("team", "default"))
                .is_some()
        );
        assert!(
            state
                .store
                .get(*ids::CONFIGMAPS, &ObjKey::new("team", "kube-root-ca.crt"))
                .is_some()
        );
    }

    #[test]
    fn a_deleted_namespace_terminates_until_finalized() {
        let ns = json!({"metadata": {"name": "team"}, "spec": {"finalizers": ["kubernetes"]}});
        let marked = Namespaces.deletion(&ns, &DeleteOptions::default()).unwrap();
        assert_eq!(marked["status"]["phase"], "Terminating");
        assert!(!Namespaces.may_finish_deletion(&marked));
        let mut finalized = marked;
        finalized["spec"]["finalizers"] = json!([]);
        assert!(Namespaces.may_finish_deletion(&finalized));
    }
}
