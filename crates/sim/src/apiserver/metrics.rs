//! `metrics.k8s.io/v1beta1` as metrics-server serves it: pod and node usage scraped from each
//! node's kubelet (`/stats/summary`, over the same authenticated connection as logs), so
//! `kubectl top` works for real kubelets, simulated nodes and virtual nodes alike. Scrapes are
//! cached for a few seconds.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tensile_core::quantity::{QuantityFormat, format_quantity};

use super::errors::ApiError;
use super::meta;
use super::resources::{ResourceType, ids};
use super::rest::list_value;
use super::store::ObjKey;
use super::watch::Filter;
use super::{State, proxy};

/// Recent scrapes per node.
#[derive(Debug, Default)]
pub struct MetricsCache {
    summaries: Mutex<HashMap<String, (Instant, Value)>>,
}

const FRESH: Duration = Duration::from_secs(5);

async fn summary(state: &State, node: &str) -> Option<Value> {
    if let Ok(cache) = state.metrics.summaries.lock()
        && let Some((at, v)) = cache.get(node)
        && at.elapsed() < FRESH
    {
        return Some(v.clone());
    }
    let body = proxy::kubelet_get(state, node, "/stats/summary")
        .await
        .ok()?;
    let value: Value = serde_json::from_slice(&body).ok()?;
    if let Ok(mut cache) = state.metrics.summaries.lock() {
        cache.insert(node.to_owned(), (Instant::now(), value.clone()));
    }
    Some(value)
}

fn cpu(nano_cores: u64) -> String {
    format_quantity(i128::from(nano_cores), QuantityFormat::DecimalSI)
}

fn memory(bytes: u64) -> String {
    format_quantity(i128::from(bytes) * 1_000_000_000, QuantityFormat::BinarySI)
}

fn usage(stats: &Value) -> Value {
    json!({
        "cpu": cpu(stats.pointer("/cpu/usageNanoCores").and_then(Value::as_u64).unwrap_or(0)),
        "memory": memory(stats.pointer("/memory/workingSetBytes").and_then(Value::as_u64).unwrap_or(0)),
    })
}

fn nodes(state: &State) -> Vec<String> {
    let (nodes, _, _) = state.store.list(*ids::NODES, None, None, None, |_| true);
    nodes
        .iter()
        .filter_map(|n| meta::name(&n.object).map(str::to_owned))
        .collect()
}

async fn pod_metrics(state: &State) -> Vec<Value> {
    let mut out = Vec::new();
    for node in nodes(state) {
        let Some(s) = summary(state, &node).await else {
            continue;
        };
        for p in s
            .get("pods")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let ns = p
                .pointer("/podRef/namespace")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let name = p
                .pointer("/podRef/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let Some(pod) = state.store.get(*ids::PODS, &ObjKey::new(ns, name)) else {
                continue;
            };
            let containers: Vec<Value> = p
                .get("containers")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|c| json!({"name": c.get("name"), "usage": usage(c)}))
                .collect();
            out.push(json!({"kind": "PodMetrics", "apiVersion": "metrics.k8s.io/v1beta1",
                "metadata": {"name": name, "namespace": ns, "creationTimestamp": meta::now(),
                    "labels": pod.object.pointer("/metadata/labels").cloned().unwrap_or_else(|| json!({}))},
                "timestamp": p.pointer("/cpu/time").cloned().unwrap_or_else(|| json!(meta::now())),
                "window": "10s", "containers": containers}));
        }
    }
    out
}

async fn node_metrics(state: &State) -> Vec<Value> {
    let mut out = Vec::new();
    for node in nodes(state) {
        let Some(s) = summary(state, &node).await else {
            continue;
        };
        let labels = state
            .store
            .get(*ids::NODES, &ObjKey::new("", &node))
            .and_then(|n| n.object.pointer("/metadata/labels").cloned());
        out.push(json!({"kind": "NodeMetrics", "apiVersion": "metrics.k8s.io/v1beta1",
            "metadata": {"name": node, "creationTimestamp": meta::now(), "labels": labels.unwrap_or_else(|| json!({}))},
            "timestamp": s.pointer("/node/cpu/time").cloned().unwrap_or_else(|| json!(meta::now())),
            "window": "10s", "usage": usage(s.get("node").unwrap_or(&Value::Null))}));
    }
    out
}

async fn all(state: &State, rt: &ResourceType) -> Vec<Value> {
    if rt.kind == "PodMetrics" {
        pod_metrics(state).await
    } else {
        node_metrics(state).await
    }
}

/// A list of pod or node metrics.
pub(super) async fn list(
    state: &State,
    rt: &ResourceType,
    filter: &Filter,
) -> Result<Value, ApiError> {
    let items: Vec<Value> = all(state, rt)
        .await
        .into_iter()
        .filter(|m| filter.matches(rt, m))
        .collect();
    Ok(list_value(rt, items, state.store.current_rv(), None))
}

/// The metrics of one pod or node.
pub(super) async fn get(
    state: &State,
    rt: &ResourceType,
    namespace: Option<&str>,
    name: &str,
) -> Result<Value, ApiError> {
    all(state, rt)
        .await
        .into_iter()
        .find(|m| {
            meta::name(m) == Some(name)
                && (rt.kind == "NodeMetrics" || meta::namespace(m) == namespace)
        })
        .ok_or_else(|| ApiError::not_found(rt.group, rt.plural, name))
}
