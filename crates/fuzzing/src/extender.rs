//! The scheduler extender's request bodies: `ExtenderArgs` of `/filter` and `/prioritize`,
//! `ExtenderBindingArgs` of `/bind`, judged by an index of two lower clusters (one listed, one
//! not yet), as kube-scheduler would send them one after another.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::StatusCode;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher::Event;
use serde_json::{Value, json};
use tensile_placement::extender::index::{BindTarget, Index};
use tensile_placement::extender::{BindingArgs, Verb, answer_call};
use tensile_placement::metrics::FilterOutcome;

fn node(value: Value) -> Option<Node> {
    serde_json::from_value(value).ok()
}

/// Lower cluster `a` listed (one node of 4 CPUs, 8 GiB, 110 pods), `b` not yet; upstairs the
/// virtual nodes `vk-a`, `vk-b` and a real node `worker`.
fn index() -> Index {
    let mut index = Index::new(["a".to_owned(), "b".to_owned()], Duration::from_secs(120));
    index.apply_upper_node(&Event::Init);
    for (name, labels) in [
        ("vk-a", json!({"type": "virtual-kubelet", "clusterID": "a"})),
        ("vk-b", json!({"type": "virtual-kubelet", "clusterID": "b"})),
        ("worker", json!({})),
    ] {
        if let Some(n) = node(json!({"metadata": {"name": name, "labels": labels}})) {
            index.apply_upper_node(&Event::InitApply(n));
        }
    }
    index.apply_upper_node(&Event::InitDone);
    index.apply_lower_node("a", &Event::Init);
    if let Some(n) = node(json!({
        "metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1"}},
        "spec": {},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}]}
    })) {
        index.apply_lower_node("a", &Event::InitApply(n));
    }
    index.apply_lower_node("a", &Event::InitDone);
    index.apply_lower_pod("a", &Event::Init);
    index.apply_lower_pod("a", &Event::InitDone);
    index
}

/// Candidate names of a filter or prioritize body (`NodeNames`, or the names of `Nodes`),
/// read case-insensitively as the extender does.
fn candidates(body: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let Some(members) = body.as_object() else {
        return out;
    };
    for (key, value) in members {
        match key.to_ascii_lowercase().as_str() {
            "nodenames" => out.extend(
                value
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(str::to_owned),
            ),
            "nodes" => {
                let items = value
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter(|(k, _)| k.eq_ignore_ascii_case("items"))
                    .filter_map(|(_, v)| v.as_array())
                    .flatten();
                out.extend(
                    items
                        .filter_map(|n| n["metadata"]["name"].as_str())
                        .map(str::to_owned),
                );
            }
            _ => {}
        }
    }
    out
}

/// A filter answer keeps only nodes it was sent, and every node it refuses was sent.
fn check_filter(body: &[u8], answer: &Value) {
    let Ok(sent) = serde_json::from_slice::<Value>(body) else {
        return;
    };
    let sent = candidates(&sent);
    let mut named: Vec<&str> = Vec::new();
    named.extend(
        answer["nodenames"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str),
    );
    named.extend(
        answer["nodes"]["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n["metadata"]["name"].as_str()),
    );
    for key in ["failedNodes", "failedAndUnresolvableNodes"] {
        named.extend(
            answer[key]
                .as_object()
                .into_iter()
                .flat_map(|m| m.keys().map(String::as_str)),
        );
    }
    for name in named {
        assert!(sent.contains(name), "the answer names {name:?}, never sent");
    }
}

/// Extender calls separated by NUL bytes (never in JSON text); each call's first byte picks
/// `/filter`, `/prioritize` or `/bind`, the rest is its body. Bodies that are refused get 400,
/// answers are JSON naming only nodes that were sent, and a bind reserves room only where the
/// index judges it fits.
pub fn calls(data: &[u8]) {
    let index = Mutex::new(index());
    let now = Instant::now();
    for (i, call) in data.split(|b| *b == 0).enumerate() {
        let Some((&verb, body)) = call.split_first() else {
            continue;
        };
        let at = now + Duration::from_secs(u64::try_from(i).unwrap_or(u64::MAX) % 300);
        match verb % 3 {
            0 | 1 => {
                let verb = if verb % 3 == 0 {
                    Verb::Filter
                } else {
                    Verb::Prioritize
                };
                let (reply, outcome) = answer_call(&index, verb, body, at);
                if reply.status != StatusCode::OK {
                    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
                    assert!(outcome.is_none(), "a refused body was counted");
                    continue;
                }
                let answer = serde_json::from_slice::<Value>(&reply.body);
                let Ok(answer) = answer else {
                    return assert!(reply.body.is_empty(), "the answer is not JSON");
                };
                match verb {
                    Verb::Filter => {
                        assert!(outcome.is_some(), "a filter answer was not counted");
                        if outcome == Some(FilterOutcome::Retry) {
                            assert!(answer["error"].as_str().is_some_and(|e| !e.is_empty()));
                        }
                        check_filter(body, &answer);
                    }
                    Verb::Prioritize => {
                        assert!(outcome.is_none());
                        assert!(answer.is_array(), "prioritize answers a list");
                    }
                }
            }
            _ => {
                let Ok(args) = BindingArgs::parse(body) else {
                    continue;
                };
                assert!(!args.name.is_empty() && !args.node.is_empty());
                let mut index = index
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if let Ok(BindTarget::Cluster {
                    id,
                    demand: Some(demand),
                }) = index.bind_target(&args.node, args.uid.as_deref())
                {
                    let uid = args.uid.clone().unwrap_or_default();
                    let _ = index.reserve(&id, &uid, *demand, at);
                }
            }
        }
    }
}
