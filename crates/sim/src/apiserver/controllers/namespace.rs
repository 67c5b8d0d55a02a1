//! Namespace deletion: everything in a terminating namespace is deleted (pods gracefully, so
//! kubelets finish them), and the namespace is removed once it is empty.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::super::State;
use super::super::meta;
use super::super::resources::{self, RESOURCES, ids};
use super::super::rest::DeleteOptions;
use super::super::store::{Event, ObjKey};
use super::{Reconciler, delete, modify, run_loop};

pub(super) async fn run(state: Arc<State>, stop: CancellationToken) {
    run_loop(state, stop, Duration::from_secs(2), NamespaceController).await;
}

struct NamespaceController;

fn terminating(state: &State) -> Vec<String> {
    let (items, _, _) = state.store.list(*ids::NAMESPACES, None, None, None, |e| {
        meta::deleting(&e.object)
    });
    items
        .iter()
        .filter_map(|e| meta::name(&e.object).map(str::to_owned))
        .collect()
}

/// Deletes what is left in `ns`; removes the namespace when nothing is.
fn clean(state: &State, ns: &str) {
    let mut remaining = 0;
    for (res, rt) in RESOURCES.iter().enumerate() {
        if !rt.namespaced || rt.create_only || rt.read_only {
            continue;
        }
        let (items, _, _) = state.store.list(res, Some(ns), None, None, |_| true);
        for e in items {
            remaining += 1;
            if meta::deleting(&e.object) {
                continue;
            }
            let key = ObjKey::new(ns, meta::name(&e.object).unwrap_or_default());
            let _ = delete(state, res, &key, &DeleteOptions::default());
        }
    }
    if remaining > 0 {
        return;
    }
    let key = ObjKey::new("", ns);
    let _ = modify(state, *ids::NAMESPACES, &key, |n| {
        n["spec"]["finalizers"] = json!([]);
        true
    });
    if let Some(e) = state.store.get(*ids::NAMESPACES, &key)
        && meta::deleting(&e.object)
        && e.object
            .pointer("/spec/finalizers")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty)
        && meta::finalizers(&e.object).is_empty()
    {
        let _ = state.store.remove(*ids::NAMESPACES, &key, Some(e.rv));
    }
}

impl Reconciler for NamespaceController {
    async fn resync(&mut self, state: &State) {
        for ns in terminating(state) {
            clean(state, &ns);
        }
    }

    async fn changed(&mut self, state: &State, events: Option<&[Arc<Event>]>) {
        let dying: BTreeSet<String> = terminating(state).into_iter().collect();
        if dying.is_empty() {
            return;
        }
        let touched: BTreeSet<&str> = match events {
            // A tick: look at every terminating namespace again.
            None => dying.iter().map(String::as_str).collect(),
            Some(events) => events
                .iter()
                .filter_map(|e| {
                    if e.res == *ids::NAMESPACES {
                        Some(e.key.name.as_str())
                    } else if resources::get(e.res).namespaced {
                        Some(e.key.namespace.as_str())
                    } else {
                        None
                    }
                })
                .filter(|ns| dying.contains(*ns))
                .collect(),
        };
        for ns in touched {
            clean(state, ns);
        }
    }
}
