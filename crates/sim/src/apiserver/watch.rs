//! Watches: list-then-stream semantics of the real server (synthetic ADDED events for
//! `resourceVersion` unset or "0", replay after a given resourceVersion, 410 when it is too
//! old), selectors applied to both the old and new state of each change (an object that stops
//! matching is sent as DELETED, one that starts matching as ADDED), bookmarks,
//! `sendInitialEvents`, and `timeoutSeconds`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::State;
use super::errors::ApiError;
use super::http::{Body, error_response};
use super::meta;
use super::request::ResourceRoute;
use super::resources::{self, ResourceType};
use super::rest::Query;
use super::selectors::{FieldSelector, LabelSelector};
use super::store::{EventType, StoreError};
use super::table;

/// Namespace, label and field selection of a list or watch.
#[derive(Debug, Default)]
pub(super) struct Filter {
    pub namespace: Option<String>,
    name: Option<String>,
    labels: Option<LabelSelector>,
    fields: Option<FieldSelector>,
}

impl Filter {
    /// Whether a name, label or field selector narrows the objects (beyond the namespace).
    pub(super) fn selects(&self) -> bool {
        self.name.is_some() || self.labels.is_some() || self.fields.is_some()
    }

    pub(super) fn from_query(
        rt: &ResourceType,
        namespace: Option<&str>,
        q: &Query,
    ) -> Result<Self, ApiError> {
        let labels = match q.get("labelSelector").filter(|s| !s.trim().is_empty()) {
            Some(s) => {
                Some(LabelSelector::parse(s).map_err(|e| ApiError::bad_request(e.to_string()))?)
            }
            None => None,
        };
        let fields = match q.get("fieldSelector").filter(|s| !s.trim().is_empty()) {
            Some(s) => {
                let sel =
                    FieldSelector::parse(s).map_err(|e| ApiError::bad_request(e.to_string()))?;
                if let Some(bad) = sel.fields().find(|k| !rt.supports_field(k)) {
                    return Err(ApiError::bad_request(format!(
                        "field label not supported: {bad}"
                    )));
                }
                Some(sel)
            }
            None => None,
        };
        Ok(Self {
            namespace: namespace.map(str::to_owned),
            name: None,
            labels,
            fields,
        })
    }

    pub(super) fn matches(&self, rt: &ResourceType, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace
            && meta::namespace(obj) != Some(ns.as_str())
        {
            return false;
        }
        if let Some(name) = &self.name
            && meta::name(obj) != Some(name.as_str())
        {
            return false;
        }
        if let Some(l) = &self.labels
            && !l.matches(&meta::labels(obj))
        {
            return false;
        }
        if let Some(f) = &self.fields {
            let values: std::collections::BTreeMap<String, String> = f
                .fields()
                .map(|field| (field.to_owned(), rt.strategy.field_value(obj, field)))
                .collect();
            if !f.matches(&values) {
                return false;
            }
        }
        true
    }
}

fn line(kind: &str, object: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(object.len() + 32);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    out.extend_from_slice(object);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

fn value_line(kind: &str, object: &Value) -> Bytes {
    line(kind, &serde_json::to_vec(object).unwrap_or_default())
}

fn expired_line(e: &StoreError) -> Bytes {
    value_line("ERROR", &ApiError::expired(e.to_string()).to_status())
}

fn bookmark(rt: &ResourceType, rv: u64, initial_events_end: bool) -> Bytes {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if initial_events_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    value_line(
        "BOOKMARK",
        &json!({"kind": rt.kind, "apiVersion": rt.api_version(), "metadata": metadata}),
    )
}

/// How often an idle watch that allows bookmarks gets one.
const BOOKMARK_EVERY: Duration = Duration::from_secs(10);
/// The longest a watch runs without `timeoutSeconds` (the real server's default is 30-60 min).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

pub(super) fn watch(
    state: Arc<State>,
    r: &ResourceRoute,
    q: &Query,
    as_table: bool,
) -> Response<Body> {
    let rt = resources::get(r.res);
    if rt.read_only {
        return error_response(&ApiError::method_not_allowed(format!(
            "watch is not supported on {}",
            rt.plural
        )));
    }
    let mut filter = match Filter::from_query(rt, r.namespace.as_deref(), q) {
        Ok(f) => f,
        Err(e) => return error_response(&e),
    };
    filter.name = r.name.clone();
    let send_initial = q.flag("sendInitialEvents");
    let bookmarks = q.flag("allowWatchBookmarks");
    let start = match q
        .get("resourceVersion")
        .filter(|v| !v.is_empty() && *v != "0")
    {
        Some(v) if !send_initial => match v.parse::<u64>() {
            Ok(rv) => Some(rv),
            Err(_) => {
                return error_response(&ApiError::bad_request(format!(
                    "invalid resourceVersion {v:?}"
                )));
            }
        },
        _ => None,
    };
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_TIMEOUT);
    let res = r.res;
    let include = q.get("includeObject").map(str::to_owned);
    // As a Table, each event carries a one-row table; the first one has the columns.
    let mut first_table = true;
    let mut render = move |kind: &str, json: &[u8], object: &Value| -> Bytes {
        if as_table {
            let t = table::table(
                rt,
                std::slice::from_ref(object),
                0,
                include.as_deref(),
                first_table,
                None,
            );
            first_table = false;
            value_line(kind, &t)
        } else {
            line(kind, json)
        }
    };
    let (tx, rx) = mpsc::channel::<Bytes>(1024);
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + timeout;
        let from = match start {
            Some(rv) => rv,
            None => {
                let (items, rv, _) =
                    state
                        .store
                        .list(res, filter.namespace.as_deref(), None, None, |e| {
                            filter.matches(rt, &e.object)
                        });
                for e in items {
                    if tx.send(render("ADDED", &e.json, &e.object)).await.is_err() {
                        return;
                    }
                }
                if send_initial && bookmarks && tx.send(bookmark(rt, rv, true)).await.is_err() {
                    return;
                }
                rv
            }
        };
        let mut cursor = match state.store.watch_resource_from(res, from) {
            Ok(c) => c,
            Err(e) => {
                let _ = tx.send(expired_line(&e)).await;
                return;
            }
        };
        let mut ticker =
            tokio::time::interval_at(tokio::time::Instant::now() + BOOKMARK_EVERY, BOOKMARK_EVERY);
        loop {
            // A bookmark first takes what its resource has: its resourceVersion is then the
            // store's, as a real server's bookmark carries its cache's progress, so a watch of a
            // quiet resource resumes from a recent resourceVersion.
            let (batch, bookmark_after) = tokio::select! {
                batch = cursor.next_batch() => (batch, false),
                _ = ticker.tick(), if bookmarks => (cursor.take(), true),
                () = tokio::time::sleep_until(deadline) => return,
                () = tx.closed() => return,
                () = state.outage() => return,
            };
            let batch = match batch {
                Ok(b) => b,
                Err(e) => {
                    let _ = tx.send(expired_line(&e)).await;
                    return;
                }
            };
            for ev in batch.iter().filter(|e| e.res == res) {
                let now = filter.matches(rt, &ev.entry.object);
                let kind = match ev.kind {
                    EventType::Added if now => "ADDED",
                    EventType::Deleted if now => "DELETED",
                    EventType::Modified => {
                        let before = ev
                            .prev
                            .as_ref()
                            .is_some_and(|p| filter.matches(rt, &p.object));
                        match (before, now) {
                            (true, true) => "MODIFIED",
                            (false, true) => "ADDED",
                            (true, false) => "DELETED",
                            (false, false) => continue,
                        }
                    }
                    _ => continue,
                };
                if tx
                    .send(render(kind, &ev.entry.json, &ev.entry.object))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            if bookmark_after
                && tx
                    .send(bookmark(rt, cursor.position(), false))
                    .await
                    .is_err()
            {
                return;
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::io::Error>(Frame::data(b)), rx))
    });
    let mut resp = Response::new(StreamBody::new(stream).boxed_unsync());
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}
