//! Endpoints and EndpointSlices of Services with a selector, from the pods that match it
//! (ready ones as addresses, the others as not-ready), and EndpointSlices mirrored from the
//! Endpoints of selector-less Services (what tensile-kube's lower Services are).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::super::State;
use super::super::meta;
use super::super::resources::ids;
use super::super::rest::DeleteOptions;
use super::super::store::{Event, EventType, ObjKey};
use super::replicaset::is_ready;
use super::{Reconciler, all_keys, create, delete, modify, run_loop};

pub(super) async fn run(state: Arc<State>, stop: CancellationToken) {
    run_loop(state, stop, Duration::from_secs(30), EndpointsController).await;
}

struct EndpointsController;

const MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
const SLICE_CONTROLLER: &str = "endpointslice-controller.k8s.io";
const MIRROR_CONTROLLER: &str = "endpointslicemirroring-controller.k8s.io";
const SERVICE_NAME: &str = "kubernetes.io/service-name";

fn selector_matches(
    selector: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// A service port's target on a pod: a number, or a named container port.
fn target_port(svc_port: &Value, pod: &Value) -> Option<i64> {
    match svc_port.get("targetPort") {
        Some(Value::Number(n)) => n.as_i64(),
        Some(Value::String(name)) => pod
            .pointer("/spec/containers")
            .and_then(Value::as_array)?
            .iter()
            .flat_map(|c| {
                c.get("ports")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
            })
            .find(|p| p.get("name").and_then(Value::as_str) == Some(name.as_str()))
            .and_then(|p| p.get("containerPort").and_then(Value::as_i64)),
        _ => svc_port.get("port").and_then(Value::as_i64),
    }
}

async fn reconcile(state: &State, key: &ObjKey) {
    let svc = state.store.get(*ids::SERVICES, key);
    let ep_key = key.clone();
    let Some(svc) = svc.filter(|s| !meta::deleting(&s.object)) else {
        // The Service is gone: its Endpoints and our slices go too.
        if state.store.get(*ids::ENDPOINTS, &ep_key).is_some() {
            let _ = delete(state, *ids::ENDPOINTS, &ep_key, &DeleteOptions::default());
        }
        delete_slices(state, key, None);
        return;
    };
    let selector = meta::string_map(svc.object.pointer("/spec/selector"));
    if selector.is_empty() {
        mirror(state, key).await;
        return;
    }
    let ports = svc
        .object
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let (pods, _, _) = state
        .store
        .list(*ids::PODS, Some(&key.namespace), None, None, |e| {
            selector_matches(&selector, &meta::labels(&e.object))
                && e.object
                    .pointer("/status/podIP")
                    .and_then(Value::as_str)
                    .is_some_and(|ip| !ip.is_empty())
                && !matches!(
                    e.object.pointer("/status/phase").and_then(Value::as_str),
                    Some("Succeeded" | "Failed")
                )
        });
    let (mut ready, mut not_ready, mut slice_endpoints) = (Vec::new(), Vec::new(), Vec::new());
    for p in &pods {
        let ip = p
            .object
            .pointer("/status/podIP")
            .cloned()
            .unwrap_or(Value::Null);
        let node = p
            .object
            .pointer("/spec/nodeName")
            .cloned()
            .unwrap_or(Value::Null);
        let target = json!({"kind": "Pod", "namespace": key.namespace, "name": meta::name(&p.object),
            "uid": meta::meta_str(&p.object, "uid")});
        let address = json!({"ip": ip, "nodeName": node, "targetRef": target});
        let terminating = meta::deleting(&p.object);
        let is_ready = is_ready(&p.object) && !terminating;
        if is_ready {
            ready.push(address)
        } else {
            not_ready.push(address)
        }
        slice_endpoints.push(json!({"addresses": [ip], "conditions": {"ready": is_ready, "serving": is_ready, "terminating": terminating},
            "nodeName": node, "targetRef": target}));
    }
    let first_pod = pods
        .first()
        .map(|p| (*p.object).clone())
        .unwrap_or_default();
    let ep_ports: Vec<Value> = ports
        .iter()
        .map(|p| {
            let mut e = json!({"port": target_port(p, &first_pod).unwrap_or(0), "protocol": p.get("protocol").cloned().unwrap_or(json!("TCP"))});
            if let Some(n) = p.get("name") {
                e["name"] = n.clone();
            }
            e
        })
        .collect();
    // A slice's port always has a name, "" when the Service's has none.
    let slice_ports: Vec<Value> = ep_ports
        .iter()
        .map(|p| {
            let mut p = p.clone();
            if p.get("name").is_none() {
                p["name"] = json!("");
            }
            p
        })
        .collect();
    let mut subsets = Vec::new();
    if !ready.is_empty() || !not_ready.is_empty() {
        let mut subset = json!({"ports": ep_ports});
        if !ready.is_empty() {
            subset["addresses"] = json!(ready);
        }
        if !not_ready.is_empty() {
            subset["notReadyAddresses"] = json!(not_ready);
        }
        subsets.push(subset);
    }
    // The Service's labels, and the controller's mark, as kube-controller-manager writes them.
    let mut labels = svc
        .object
        .pointer("/metadata/labels")
        .cloned()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    labels[ENDPOINTS_MANAGED_BY] = json!("endpoint-controller");
    let desired = json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": key.name, "namespace": key.namespace, "labels": labels}, "subsets": subsets});
    upsert_endpoints(state, key, desired).await;
    upsert_slice(state, key, SLICE_CONTROLLER, slice_endpoints, slice_ports).await;
}

const ENDPOINTS_MANAGED_BY: &str = "endpoints.kubernetes.io/managed-by";

async fn upsert_endpoints(state: &State, key: &ObjKey, desired: Value) {
    if state.store.get(*ids::ENDPOINTS, key).is_none() {
        let _ = create(
            state,
            *ids::ENDPOINTS,
            Some(&key.namespace),
            desired,
            "endpoint-controller",
        )
        .await;
        return;
    }
    let _ = modify(state, *ids::ENDPOINTS, key, |o| {
        let subsets = desired.get("subsets").cloned().unwrap_or_else(|| json!([]));
        let labels = desired.pointer("/metadata/labels").cloned();
        let same = o.get("subsets").cloned().unwrap_or_else(|| json!([])) == subsets
            && o.pointer("/metadata/labels").cloned() == labels;
        if same {
            return false;
        }
        o["subsets"] = subsets;
        if let Some(l) = labels {
            o["metadata"]["labels"] = l;
        }
        true
    });
}

/// The slices of a service written by `controller` (all of ours when `None`).
fn slices(state: &State, key: &ObjKey, controller: Option<&str>) -> Vec<ObjKey> {
    let (items, _, _) = state.store.list(
        *ids::ENDPOINTSLICES,
        Some(&key.namespace),
        None,
        None,
        |e| {
            let labels = meta::labels(&e.object);
            labels.get(SERVICE_NAME) == Some(&key.name)
                && labels.get(MANAGED_BY).is_some_and(|m| {
                    controller.is_none_or(|c| m == c)
                        && (m == SLICE_CONTROLLER || m == MIRROR_CONTROLLER)
                })
        },
    );
    items
        .iter()
        .map(|e| ObjKey::new(&key.namespace, meta::name(&e.object).unwrap_or_default()))
        .collect()
}

fn delete_slices(state: &State, key: &ObjKey, controller: Option<&str>) {
    for k in slices(state, key, controller) {
        let _ = delete(state, *ids::ENDPOINTSLICES, &k, &DeleteOptions::default());
    }
}

async fn upsert_slice(
    state: &State,
    key: &ObjKey,
    controller: &str,
    endpoints: Vec<Value>,
    ports: Vec<Value>,
) {
    let existing = slices(state, key, Some(controller));
    // The slices belong to their Service (garbage collected with it) and carry its labels.
    let svc = state.store.get(*ids::SERVICES, key);
    let mut labels = svc
        .as_ref()
        .and_then(|s| s.object.pointer("/metadata/labels").cloned())
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    labels[SERVICE_NAME] = json!(key.name);
    labels[MANAGED_BY] = json!(controller);
    let owners = svc.as_ref().map(|s| {
        json!([{"apiVersion": "v1", "kind": "Service", "name": key.name,
            "uid": meta::meta_str(&s.object, "uid"), "controller": true, "blockOwnerDeletion": true}])
    });
    match existing.first() {
        None => {
            let mut slice = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"generateName": format!("{}-", key.name), "namespace": key.namespace,
                    "labels": labels},
                "addressType": "IPv4", "endpoints": endpoints, "ports": ports});
            if let Some(o) = owners {
                slice["metadata"]["ownerReferences"] = o;
            }
            let _ = create(
                state,
                *ids::ENDPOINTSLICES,
                Some(&key.namespace),
                slice,
                "endpointslice-controller",
            )
            .await;
        }
        Some(k) => {
            let _ = modify(state, *ids::ENDPOINTSLICES, k, |o| {
                if o.get("endpoints") == Some(&json!(endpoints))
                    && o.get("ports") == Some(&json!(ports))
                    && o.pointer("/metadata/labels") == Some(&labels)
                {
                    return false;
                }
                o["endpoints"] = json!(endpoints);
                o["ports"] = json!(ports);
                o["metadata"]["labels"] = labels.clone();
                true
            });
        }
    }
    // Keep one slice per service and controller.
    for extra in existing.iter().skip(1) {
        let _ = delete(
            state,
            *ids::ENDPOINTSLICES,
            extra,
            &DeleteOptions::default(),
        );
    }
}

/// EndpointSlices mirrored from the Endpoints of a selector-less Service.
async fn mirror(state: &State, key: &ObjKey) {
    let Some(ep) = state.store.get(*ids::ENDPOINTS, key) else {
        delete_slices(state, key, Some(MIRROR_CONTROLLER));
        return;
    };
    let mut endpoints = Vec::new();
    let mut ports = Vec::new();
    for subset in ep
        .object
        .get("subsets")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        for (list, ready) in [("addresses", true), ("notReadyAddresses", false)] {
            for a in subset
                .get(list)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let mut e = json!({"addresses": [a.get("ip")], "conditions": {"ready": ready}});
                for f in ["nodeName", "targetRef", "hostname"] {
                    if let Some(v) = a.get(f) {
                        e[f] = v.clone();
                    }
                }
                endpoints.push(e);
            }
        }
        for p in subset
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if !ports.contains(p) {
                ports.push(p.clone());
            }
        }
    }
    upsert_slice(state, key, MIRROR_CONTROLLER, endpoints, ports).await;
}

impl Reconciler for EndpointsController {
    async fn resync(&mut self, state: &State) {
        for key in all_keys(state, *ids::SERVICES) {
            reconcile(state, &key).await;
        }
    }

    async fn changed(&mut self, state: &State, events: Option<&[Arc<Event>]>) {
        let Some(events) = events else { return };
        let mut dirty: BTreeSet<ObjKey> = BTreeSet::new();
        let mut namespaces: BTreeSet<String> = BTreeSet::new();
        for e in events {
            if e.res == *ids::SERVICES {
                dirty.insert(e.key.clone());
            } else if e.res == *ids::ENDPOINTS && e.kind != EventType::Deleted {
                // Selector-less services mirror their Endpoints.
                dirty.insert(e.key.clone());
            } else if e.res == *ids::PODS {
                let relevant = e.kind == EventType::Deleted
                    || e.prev.as_ref().is_none_or(|p| {
                        p.object.get("status") != e.entry.object.get("status")
                            || p.object.pointer("/metadata/labels")
                                != e.entry.object.pointer("/metadata/labels")
                            || meta::deleting(&p.object) != meta::deleting(&e.entry.object)
                    });
                if relevant {
                    namespaces.insert(e.key.namespace.clone());
                }
            }
        }
        for ns in namespaces {
            let (svcs, _, _) = state
                .store
                .list(*ids::SERVICES, Some(&ns), None, None, |s| {
                    s.object.pointer("/spec/selector").is_some()
                });
            for s in svcs {
                dirty.insert(ObjKey::new(&ns, meta::name(&s.object).unwrap_or_default()));
            }
        }
        for key in dirty {
            reconcile(state, &key).await;
        }
    }
}
