//! ControllerRevisions of StatefulSets and DaemonSets: one per pod template, named
//! `<owner>-<hash>`, numbered in the order the templates were used, as the real controllers
//! keep them (what `kubectl rollout history` and `rollout undo` read).

use serde_json::{Value, json};

use super::super::State;
use super::super::meta;
use super::super::resources::ids;
use super::super::rest::DeleteOptions;
use super::super::store::ObjKey;
use super::{controller_of, create, delete, modify, template_hash};

/// The revision of an owner's current template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Revision {
    /// `<owner>-<hash>`: the StatefulSet pods' `controller-revision-hash`.
    pub name: String,
    /// The hash alone: the DaemonSet pods' `controller-revision-hash`.
    pub hash: String,
}

/// The data a revision stores: the template, as a patch that replaces it.
fn data(template: &Value) -> Value {
    let mut t = template.clone();
    if let Some(m) = t.as_object_mut() {
        m.insert("$patch".into(), json!("replace"));
    }
    json!({"spec": {"template": t}})
}

/// Finds or makes the revision of `template` for the owner `key` (`owner` = its apiVersion,
/// kind and uid), makes it the newest, and trims the history to `spec.revisionHistoryLimit`.
/// `None` when it could not be written (the next pass tries again).
pub(super) async fn ensure(
    state: &State,
    key: &ObjKey,
    owner: (&str, &str, &str),
    template: &Value,
    spec: &Value,
) -> Option<Revision> {
    let (api_version, kind, uid) = owner;
    let data = data(template);
    let hash = template_hash(&data);
    let revision = Revision {
        name: format!("{}-{hash}", key.name),
        hash: hash.clone(),
    };
    let (items, _, _) = state.store.list(
        *ids::CONTROLLER_REVISIONS,
        Some(&key.namespace),
        None,
        None,
        |e| controller_of(&e.object).is_some_and(|(_, _, u)| u == uid),
    );
    let number = |o: &Value| o.get("revision").and_then(Value::as_i64).unwrap_or(0);
    let mut history: Vec<(i64, String)> = items
        .iter()
        .map(|e| {
            (
                number(&e.object),
                meta::name(&e.object).unwrap_or_default().to_owned(),
            )
        })
        .collect();
    history.sort();
    let newest = history.last().map_or(0, |(n, _)| *n);
    match history.iter().find(|(_, n)| *n == revision.name) {
        // A template used before (a rollback) becomes the newest revision again.
        Some((n, _)) if *n < newest => {
            let k = ObjKey::new(&key.namespace, &revision.name);
            modify(state, *ids::CONTROLLER_REVISIONS, &k, |o| {
                o["revision"] = json!(newest + 1);
                true
            })
            .ok()?;
        }
        Some(_) => {}
        None => {
            let mut labels = template
                .pointer("/metadata/labels")
                .cloned()
                .filter(Value::is_object)
                .unwrap_or_else(|| json!({}));
            labels["controller-revision-hash"] = json!(hash);
            let object = json!({"apiVersion": "apps/v1", "kind": "ControllerRevision",
                "metadata": {"name": revision.name, "namespace": key.namespace, "labels": labels,
                    "ownerReferences": [{"apiVersion": api_version, "kind": kind,
                        "name": key.name, "uid": uid, "controller": true,
                        "blockOwnerDeletion": true}]},
                "data": data, "revision": newest + 1});
            let who = format!("{}-controller", kind.to_lowercase());
            if let Err(e) = create(
                state,
                *ids::CONTROLLER_REVISIONS,
                Some(&key.namespace),
                object,
                &who,
            )
            .await
            {
                // Made by an earlier pass whose list this one did not see yet.
                if e.code != 409 {
                    return None;
                }
            }
            history.push((newest + 1, revision.name.clone()));
        }
    }
    let limit = spec
        .get("revisionHistoryLimit")
        .and_then(Value::as_i64)
        .unwrap_or(10)
        .max(0) as usize;
    let old: Vec<&String> = history
        .iter()
        .map(|(_, n)| n)
        .filter(|n| **n != revision.name)
        .collect();
    for name in old.iter().take(old.len().saturating_sub(limit)) {
        let _ = delete(
            state,
            *ids::CONTROLLER_REVISIONS,
            &ObjKey::new(&key.namespace, name.as_str()),
            &DeleteOptions::default(),
        );
    }
    Some(revision)
}
