//! The REST verbs, generic over the resource table: get, list, create, update, patch, delete,
//! deletecollection, and the status subresource. Resource-specific behaviour comes from
//! `strategy`.

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use bytes::Bytes;
use http::{Method, Request, Response, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::{Value, json};

use super::errors::{self, ApiError};
use super::http::{Body, error_response, value_response};
use super::meta::{self, meta_mut};
use super::request::ResourceRoute;
use super::resources::{self, ResId, ResourceType, ids};
use super::store::{Entry, ObjKey, StoreError};
use super::strategy::{self, Subresource};
use super::{State, UserInfo, table, watch};

/// Query parameters of a request.
#[derive(Debug, Default)]
pub(crate) struct Query(Vec<(String, String)>);

impl Query {
    pub(super) fn parse(query: Option<&str>) -> Self {
        Self(
            form_urlencoded::parse(query.unwrap_or_default().as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    pub(super) fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub(super) fn all(&self, key: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// `true`/`1` flags, as the API server's conversion accepts them.
    pub(super) fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1" | "True"))
    }

    fn dry_run(&self) -> bool {
        self.all("dryRun").contains(&"All")
    }
}

type Result<T, E = ApiError> = std::result::Result<T, E>;

pub(super) async fn dispatch(
    state: Arc<State>,
    req: Request<Incoming>,
    r: ResourceRoute,
    user: UserInfo,
) -> Response<Body> {
    let q = Query::parse(req.uri().query());
    let rt = resources::get(r.res);
    let method = req.method().clone();
    let as_table = table::wants_table(
        req.headers()
            .get(header::ACCEPT)
            .and_then(|a| a.to_str().ok()),
    );
    let name = r.name.clone();
    let sub = r.subresource.clone();
    if rt.create_only && !(method == Method::POST && name.is_none()) {
        return error_response(&ApiError::method_not_allowed(format!(
            "{} only supports create",
            rt.plural
        )));
    }
    if rt.read_only {
        let result = match (&method, name.as_deref()) {
            (&Method::GET, Some(n)) => {
                super::metrics::get(&state, rt, r.namespace.as_deref(), n).await
            }
            (&Method::GET, None) => match watch::Filter::from_query(rt, r.namespace.as_deref(), &q)
            {
                Ok(filter) => super::metrics::list(&state, rt, &filter).await,
                Err(e) => Err(e),
            },
            _ => Err(ApiError::method_not_allowed(format!(
                "{} are read-only",
                rt.plural
            ))),
        };
        return match result {
            Ok(v) => value_response(200, &v),
            Err(e) => error_response(&e),
        };
    }
    let outcome = match (&method, name.as_deref(), sub.as_deref()) {
        (&Method::GET, None, None) if r.watch_prefix || q.flag("watch") => {
            return watch::watch(state, &r, &q, as_table);
        }
        (&Method::GET, None, None) => list(&state, &r, &q, as_table),
        (&Method::POST, None, None)
            if r.namespace.is_none() && rt.namespaced && !rt.create_only =>
        {
            Err(ApiError::method_not_allowed(format!(
                "create {} needs a namespace",
                rt.plural
            )))
        }
        (&Method::POST, None, None) => match read_object(&state, req).await {
            Ok(body) if rt.create_only => {
                rt.strategy
                    .create(&state, r.namespace.as_deref(), body, &user)
            }
            Ok(body) => create(&state, &r, body, &q, &user).await.map(|e| (201, e)),
            Err(e) => Err(e),
        },
        (&Method::DELETE, None, None) => match read_optional_object(&state, req).await {
            Ok(opts) => delete_collection(&state, &r, &q, opts),
            Err(e) => Err(e),
        },
        (&Method::GET, Some(n), None | Some("status" | "ephemeralcontainers")) => {
            get(&state, &r, n).map(|(code, v)| {
                if as_table {
                    (
                        code,
                        table::table(
                            rt,
                            &[v],
                            state.store.current_rv(),
                            q.get("includeObject"),
                            true,
                            None,
                        ),
                    )
                } else {
                    (code, v)
                }
            })
        }
        (&Method::PUT, Some(n), s @ (None | Some("status" | "ephemeralcontainers"))) => {
            match read_object(&state, req).await {
                Ok(body) => update(&state, &r, n, body, &q, &user, subresource(s))
                    .await
                    .map(|v| (200, v)),
                Err(e) => Err(e),
            }
        }
        (&Method::PATCH, Some(n), s @ (None | Some("status" | "ephemeralcontainers"))) => {
            let content_type = content_type(&req);
            match read_bytes(&state, req).await {
                Ok(body) => {
                    patch(
                        &state,
                        &r,
                        n,
                        &content_type,
                        &body,
                        &q,
                        &user,
                        subresource(s),
                    )
                    .await
                }
                Err(e) => Err(e),
            }
        }
        (&Method::DELETE, Some(n), None) => match read_optional_object(&state, req).await {
            Ok(opts) => delete(&state, &r, n, &q, opts),
            Err(e) => Err(e),
        },
        (_, Some(n), Some("scale")) => {
            return super::scale::serve(&state, req, &r, n, &q).await;
        }
        (_, Some(n), Some(s)) => {
            return strategy::subresource(state, req, &r, n, s, &q).await;
        }
        _ => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({method} {})",
            rt.plural
        ))),
    };
    match outcome {
        Ok((code, value)) => value_response(code, &value),
        Err(e) => error_response(&e),
    }
}

fn subresource(s: Option<&str>) -> Subresource {
    match s {
        Some("status") => Subresource::Status,
        Some("ephemeralcontainers") => Subresource::EphemeralContainers,
        _ => Subresource::Main,
    }
}

fn content_type(req: &Request<Incoming>) -> String {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_owned()
}

/// The request body, within the size limit. A body over the limit is still read and dropped,
/// up to a bound, so the client, still sending, gets the 413 rather than a reset connection.
pub(super) async fn read_bytes(state: &State, req: Request<Incoming>) -> Result<Bytes> {
    let limit = state.config.max_body_bytes;
    let drain_limit = limit.saturating_mul(4);
    let mut body = req.into_body();
    let mut collected = bytes::BytesMut::new();
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        seen = seen.saturating_add(data.len());
        if seen <= limit {
            collected.extend_from_slice(&data);
        } else if seen > drain_limit {
            break;
        }
    }
    if seen > limit {
        return Err(ApiError::too_large(format!(
            "the request body is larger than the {limit} byte limit"
        )));
    }
    Ok(collected.freeze())
}

/// Decodes a JSON or YAML body into an object.
pub(super) fn decode(content_type: &str, body: &[u8]) -> Result<Value> {
    let mime = content_type.split(';').next().unwrap_or_default().trim();
    let value: Value = match mime {
        "" | "application/json" | "*/*" => serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!("error decoding the request body as JSON: {e}"))
        })?,
        "application/yaml" | "application/apply-patch+yaml" => {
            let text = std::str::from_utf8(body).map_err(|e| {
                ApiError::bad_request(format!("the request body is not UTF-8: {e}"))
            })?;
            serde_saphyr::from_str(text).map_err(|e| {
                ApiError::bad_request(format!("error decoding the request body as YAML: {e}"))
            })?
        }
        // kubectl's `create` generators send protobuf; objects are kept as JSON.
        "application/vnd.kubernetes.protobuf" => super::protobuf::decode_k8s_protobuf(body)
            .map_err(|e| {
                ApiError::bad_request(format!("error decoding the request body as protobuf: {e}"))
            })?,
        other => return Err(ApiError::unsupported_media_type(other)),
    };
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    Ok(value)
}

pub(super) async fn read_object(state: &State, req: Request<Incoming>) -> Result<Value> {
    let content_type = content_type(&req);
    let body = read_bytes(state, req).await?;
    decode(&content_type, &body)
}

async fn read_optional_object(state: &State, req: Request<Incoming>) -> Result<Option<Value>> {
    let content_type = content_type(&req);
    let body = read_bytes(state, req).await?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    decode(&content_type, &body).map(Some)
}

fn key(rt: &ResourceType, namespace: Option<&str>, name: &str) -> ObjKey {
    ObjKey::new(
        if rt.namespaced {
            namespace.unwrap_or_default()
        } else {
            ""
        },
        name,
    )
}

fn entry_value(e: &Entry) -> Value {
    (*e.object).clone()
}

fn get(state: &State, r: &ResourceRoute, name: &str) -> Result<(u16, Value)> {
    let rt = resources::get(r.res);
    state
        .store
        .get(r.res, &key(rt, r.namespace.as_deref(), name))
        .map(|e| (200, entry_value(&e)))
        .ok_or_else(|| ApiError::not_found(rt.group, rt.plural, name))
}

/// A list continuation: where the previous page ended.
#[derive(serde::Serialize, serde::Deserialize)]
struct Continue {
    ns: String,
    name: String,
}

fn list(state: &State, r: &ResourceRoute, q: &Query, as_table: bool) -> Result<(u16, Value)> {
    let rt = resources::get(r.res);
    let filter = watch::Filter::from_query(rt, r.namespace.as_deref(), q)?;
    let start = match q.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            let raw = B64URL
                .decode(token)
                .map_err(|_| ApiError::bad_request("continue key is not valid"))?;
            let c: Continue = serde_json::from_slice(&raw)
                .map_err(|_| ApiError::bad_request("continue key is not valid"))?;
            Some(ObjKey::new(c.ns, c.name))
        }
        None => None,
    };
    let limit = q
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let (items, rv, more) = state.store.list_page(
        r.res,
        filter.namespace.as_deref(),
        start.as_ref(),
        limit,
        |e| filter.matches(rt, &e.object),
    );
    let remaining = more.as_ref().map(|(_, n)| *n);
    let items: Vec<Value> = items.iter().map(entry_value).collect();
    let more = more.map(|(k, _)| k);
    if as_table {
        let token = more.map(|k| json!(continue_token(k)));
        return Ok((
            200,
            table::table(rt, &items, rv, q.get("includeObject"), true, token.as_ref()),
        ));
    }
    let mut list = list_value(rt, items, rv, more);
    // Like etcd's storage, the count is known only when nothing but the namespace selects.
    if let Some(n) = remaining
        && !filter.selects()
    {
        list["metadata"]["remainingItemCount"] = json!(n);
    }
    Ok((200, list))
}

/// The `continue` token of a page that ended at `k`.
fn continue_token(k: ObjKey) -> String {
    let token = serde_json::to_vec(&Continue {
        ns: k.namespace,
        name: k.name,
    })
    .unwrap_or_default();
    B64URL.encode(token)
}

pub(super) fn list_value(
    rt: &ResourceType,
    items: Vec<Value>,
    rv: u64,
    more: Option<ObjKey>,
) -> Value {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if let Some(k) = more {
        metadata["continue"] = json!(continue_token(k));
    }
    // The items of a list carry no kind and apiVersion of their own, as the real server's.
    let items: Vec<Value> = items
        .into_iter()
        .map(|mut item| {
            if let Some(map) = item.as_object_mut() {
                map.remove("kind");
                map.remove("apiVersion");
            }
            item
        })
        .collect();
    json!({"kind": format!("{}List", rt.kind), "apiVersion": rt.api_version(), "metadata": metadata, "items": items})
}

/// Checks kind/apiVersion, namespace and name of a body against the request.
fn check_identity(
    rt: &ResourceType,
    obj: &mut Value,
    namespace: Option<&str>,
    name: Option<&str>,
) -> Result<()> {
    let api_version = rt.api_version();
    match obj.get("apiVersion").and_then(Value::as_str) {
        Some(v) if v != api_version => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({api_version})"
            )));
        }
        _ => {}
    }
    match obj.get("kind").and_then(Value::as_str) {
        Some(k) if k != rt.kind => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                rt.kind
            )));
        }
        _ => {}
    }
    if let Some(map) = obj.as_object_mut() {
        map.insert("apiVersion".into(), json!(api_version));
        map.insert("kind".into(), json!(rt.kind));
    }
    if rt.namespaced {
        let ns = namespace.unwrap_or_default();
        match meta::namespace(obj) {
            Some(body_ns) if body_ns != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => {
                meta_mut(obj).insert("namespace".into(), json!(ns));
            }
        }
    } else {
        meta_mut(obj).remove("namespace");
    }
    if let Some(url_name) = name {
        match meta::name(obj) {
            Some(n) if n != url_name => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({url_name})"
                )));
            }
            _ => {
                meta_mut(obj).insert("name".into(), json!(url_name));
            }
        }
    }
    Ok(())
}

fn normalize(rt: &ResourceType, obj: Value) -> Result<Value> {
    (rt.normalize)(obj)
        .map_err(|e| ApiError::bad_request(format!("error decoding {}: {e}", rt.kind)))
}

pub(super) async fn create(
    state: &State,
    r: &ResourceRoute,
    body: Value,
    q: &Query,
    user: &UserInfo,
) -> Result<Value> {
    create_as(state, r, body, q, user, None).await
}

/// [`create`]; `apply_manager` names the field manager when a server-side apply creates it.
async fn create_as(
    state: &State,
    r: &ResourceRoute,
    body: Value,
    q: &Query,
    user: &UserInfo,
    apply_manager: Option<&str>,
) -> Result<Value> {
    let rt = resources::get(r.res);
    let applied = apply_manager.map(|m| (m.to_owned(), body.clone()));
    let mut obj = body;
    check_identity(rt, &mut obj, r.namespace.as_deref(), None)?;
    let mut obj = normalize(rt, obj)?;
    let name = match meta::name(&obj) {
        Some(n) => n.to_owned(),
        None => match meta::meta_str(&obj, "generateName").filter(|g| !g.is_empty()) {
            Some(prefix) => format!("{prefix}{}", meta::random_suffix(5)),
            None => {
                return Err(ApiError::invalid(
                    rt.group,
                    rt.kind,
                    "",
                    &[(
                        "metadata.name".into(),
                        "Required value: name or generateName is required".into(),
                    )],
                ));
            }
        },
    };
    strategy::validate_name(rt, &name)?;
    strategy::namespace_admission(state, rt, r.namespace.as_deref())?;
    {
        let m = meta_mut(&mut obj);
        m.insert("name".into(), json!(name));
        for server_owned in [
            "resourceVersion",
            "selfLink",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
        ] {
            m.remove(server_owned);
        }
        m.insert("uid".into(), json!(meta::new_uid()));
        m.insert("creationTimestamp".into(), json!(meta::now()));
    }
    if let Some((manager, config)) = &applied {
        super::apply::record(&mut obj, manager, config, &meta::now());
    }
    strategy::prepare_create(state, rt, &mut obj)?;
    let mut obj = super::admission::mutate(state, rt, obj, None, user).await?;
    strategy::validate(rt, &obj, None)?;
    if rt.strategy.tracks_generation() {
        meta_mut(&mut obj).insert("generation".into(), json!(1));
    }
    if q.dry_run() {
        return Ok(obj);
    }
    let k = key(rt, r.namespace.as_deref(), &name);
    let entry = state.store.create(r.res, k, obj).map_err(|e| match e {
        StoreError::AlreadyExists => ApiError::already_exists(rt.group, rt.plural, &name),
        other => ApiError::internal(other.to_string()),
    })?;
    rt.strategy.after_create(state, &entry.object);
    Ok(entry_value(&entry))
}

/// How many times a patch or unconditional update retries a write that lost a race.
const RETRIES: usize = 16;

#[allow(clippy::too_many_arguments)]
async fn update(
    state: &State,
    r: &ResourceRoute,
    name: &str,
    body: Value,
    q: &Query,
    user: &UserInfo,
    sub: Subresource,
) -> Result<Value> {
    let rt = resources::get(r.res);
    let mut body = body;
    check_identity(rt, &mut body, r.namespace.as_deref(), Some(name))?;
    let body = normalize(rt, body)?;
    let precondition = meta::meta_str(&body, "resourceVersion")
        .filter(|v| !v.is_empty())
        .map(str::to_owned);
    let precondition = match precondition {
        Some(v) => Some(
            v.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {v:?}")))?,
        ),
        None if !rt.strategy.unconditional_update() => {
            return Err(ApiError::invalid(
                rt.group,
                rt.plural,
                name,
                &[(
                    "metadata.resourceVersion".into(),
                    "Invalid value: 0: must be specified for an update".into(),
                )],
            ));
        }
        None => None,
    };
    write_loop(state, r, name, q, user, sub, precondition, |_current| {
        Ok(body.clone())
    })
    .await
}

/// Read the current object, compute the new one, admit, validate and write it; retry when a
/// concurrent write wins, unless the client gave a resourceVersion (then 409).
#[allow(clippy::too_many_arguments)]
async fn write_loop(
    state: &State,
    r: &ResourceRoute,
    name: &str,
    q: &Query,
    user: &UserInfo,
    sub: Subresource,
    precondition: Option<u64>,
    mut compute: impl FnMut(&Value) -> Result<Value>,
) -> Result<Value> {
    let rt = resources::get(r.res);
    let k = key(rt, r.namespace.as_deref(), name);
    for _ in 0..RETRIES {
        let current = state
            .store
            .get(r.res, &k)
            .ok_or_else(|| ApiError::not_found(rt.group, rt.plural, name))?;
        if precondition.is_some_and(|p| p != current.rv) {
            return Err(ApiError::conflict(
                rt.group,
                rt.plural,
                name,
                &StoreError::Conflict.to_string(),
            ));
        }
        let mut new = compute(&current.object)?;
        strategy::prepare_update(rt, &mut new, &current.object, sub);
        let new = if sub == Subresource::Main {
            super::admission::mutate(state, rt, new, Some(&current.object), user).await?
        } else {
            new
        };
        strategy::validate_update(rt, &new, &current.object, sub)?;
        if same_object(&new, &current.object) {
            return Ok(entry_value(&current));
        }
        if q.dry_run() {
            return Ok(new);
        }
        let written = if strategy::may_finish_deletion(rt, &new) {
            state.store.remove(r.res, &k, Some(current.rv))
        } else {
            state.store.replace(r.res, k.clone(), new, Some(current.rv))
        };
        match written {
            Ok(entry) => return Ok(entry_value(&entry)),
            Err(e) => match write_error(rt, name, e, precondition.is_some()) {
                Some(err) => return Err(err),
                None => continue,
            },
        }
    }
    Err(too_many_writes(rt, name))
}

/// What a failed write of an update answers; `None`: try again (a concurrent write won and the
/// client gave no resourceVersion to hold it to).
pub(super) fn write_error(
    rt: &ResourceType,
    name: &str,
    e: StoreError,
    precondition: bool,
) -> Option<ApiError> {
    match e {
        StoreError::Conflict if !precondition => None,
        StoreError::Conflict => Some(ApiError::conflict(
            rt.group,
            rt.plural,
            name,
            &StoreError::Conflict.to_string(),
        )),
        StoreError::NotFound => Some(ApiError::not_found(rt.group, rt.plural, name)),
        e => Some(ApiError::internal(e.to_string())),
    }
}

/// The answer when concurrent writers kept winning.
pub(super) fn too_many_writes(rt: &ResourceType, name: &str) -> ApiError {
    ApiError::conflict(
        rt.group,
        rt.plural,
        name,
        "too many concurrent writes, try again",
    )
}

/// Equal but for the resourceVersion: such a write is skipped, as the real server does.
pub(super) fn same_object(a: &Value, b: &Value) -> bool {
    // Like kube-apiserver, a write that would change only the times of managedFields entries
    // is a no-op: an apply repeated with the same configuration changes nothing.
    let strip = |v: &Value| {
        let mut v = v.clone();
        let meta = meta_mut(&mut v);
        meta.remove("resourceVersion");
        if let Some(entries) = meta.get_mut("managedFields").and_then(Value::as_array_mut) {
            for e in entries.iter_mut().filter_map(Value::as_object_mut) {
                e.remove("time");
            }
        }
        v
    };
    strip(a) == strip(b)
}

#[allow(clippy::too_many_arguments)]
async fn patch(
    state: &State,
    r: &ResourceRoute,
    name: &str,
    content_type: &str,
    body: &[u8],
    q: &Query,
    user: &UserInfo,
    sub: Subresource,
) -> Result<(u16, Value)> {
    let rt = resources::get(r.res);
    let mime = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned();
    let kind = strategy::PatchKind::from_mime(&mime)
        .ok_or_else(|| ApiError::unsupported_media_type(&mime))?;
    let patch_doc: Value = match kind {
        strategy::PatchKind::Apply => decode("application/apply-patch+yaml", body)?,
        _ => serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding the patch as JSON: {e}")))?,
    };
    let k = key(rt, r.namespace.as_deref(), name);
    let apply_manager = match kind {
        strategy::PatchKind::Apply => Some(apply_field_manager(q)?),
        _ => None,
    };
    if let Some(manager) = apply_manager
        && state.store.get(r.res, &k).is_none()
        && sub == Subresource::Main
    {
        // Server-side apply creates what does not exist yet.
        return create_as(state, r, patch_doc, q, user, Some(manager))
            .await
            .map(|v| (201, v));
    }
    let precondition = patch_doc
        .get("metadata")
        .and_then(|m| m.get("resourceVersion"))
        .and_then(Value::as_str)
        .and_then(|v| v.parse::<u64>().ok());
    let value = write_loop(state, r, name, q, user, sub, precondition, |current| {
        let mut patched = current.clone();
        if let Some(manager) = apply_manager {
            super::apply::remove_dropped_fields(&mut patched, manager, &patch_doc);
        }
        strategy::apply_patch(rt, kind, &mut patched, &patch_doc)?;
        if let Some(manager) = apply_manager {
            super::apply::record(&mut patched, manager, &patch_doc, &meta::now());
        }
        let mut patched = normalize(rt, patched)?;
        if meta::name(&patched) != Some(name)
            || meta::namespace(&patched) != meta::namespace(current)
        {
            return Err(ApiError::invalid(
                rt.group,
                rt.kind,
                name,
                &[(
                    "metadata.name".into(),
                    "Invalid value: field is immutable".into(),
                )],
            ));
        }
        if let Some(rv) = meta::meta_str(current, "resourceVersion") {
            meta_mut(&mut patched).insert("resourceVersion".into(), json!(rv));
        }
        Ok(patched)
    })
    .await?;
    Ok((200, value))
}

/// DeleteOptions from the body or the query.
#[derive(Debug, Default)]
pub(crate) struct DeleteOptions {
    pub grace_period_seconds: Option<i64>,
    pub propagation: Option<String>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub dry_run: bool,
}

impl DeleteOptions {
    pub(super) fn from(q: &Query, body: Option<Value>) -> Result<Self> {
        let body = body.unwrap_or_default();
        let grace = match body.get("gracePeriodSeconds").and_then(Value::as_i64) {
            Some(g) => Some(g),
            None => match q.get("gracePeriodSeconds") {
                Some(g) => Some(g.parse::<i64>().map_err(|_| {
                    ApiError::bad_request(format!("invalid gracePeriodSeconds {g:?}"))
                })?),
                None => None,
            },
        };
        let pre = body.get("preconditions");
        let dry_run = q.dry_run()
            || body
                .get("dryRun")
                .and_then(Value::as_array)
                .is_some_and(|a| a.iter().any(|v| v == "All"));
        Ok(Self {
            grace_period_seconds: grace,
            propagation: body
                .get("propagationPolicy")
                .and_then(Value::as_str)
                .or(q.get("propagationPolicy"))
                .map(str::to_owned),
            uid: pre
                .and_then(|p| p.get("uid"))
                .and_then(Value::as_str)
                .map(str::to_owned),
            resource_version: pre
                .and_then(|p| p.get("resourceVersion"))
                .and_then(Value::as_str)
                .map(str::to_owned),
            dry_run,
        })
    }
}

fn delete(
    state: &State,
    r: &ResourceRoute,
    name: &str,
    q: &Query,
    body: Option<Value>,
) -> Result<(u16, Value)> {
    let opts = DeleteOptions::from(q, body)?;
    let rt = resources::get(r.res);
    let k = key(rt, r.namespace.as_deref(), name);
    let (deleted, removed) = delete_or_mark(state, r.res, &k, &opts)?;
    // An object removed at once is answered with a Status, except by the storages that return
    // the deleted object (pods and services); one that stays (finalizers, grace) is returned,
    // as this delete wrote it, whatever a controller does with it next.
    let uid = meta::meta_str(&deleted, "uid").unwrap_or_default();
    if removed && r.res != *ids::PODS && r.res != *ids::SERVICES {
        let mut details = json!({"name": name, "kind": rt.plural, "uid": uid});
        if !rt.group.is_empty() {
            details["group"] = json!(rt.group);
        }
        return Ok((200, errors::success_status(details)));
    }
    Ok((200, deleted))
}

/// Deletes one object: immediately, or by marking it (finalizers, graceful pod deletion,
/// namespaces), as the strategy decides.
pub(super) fn delete_object(
    state: &State,
    res: ResId,
    k: &ObjKey,
    opts: &DeleteOptions,
) -> Result<Value> {
    delete_or_mark(state, res, k, opts).map(|(v, _)| v)
}

/// [`delete_object`], and whether the object was removed (rather than marked, or left as it
/// was by a dry run).
fn delete_or_mark(
    state: &State,
    res: ResId,
    k: &ObjKey,
    opts: &DeleteOptions,
) -> Result<(Value, bool)> {
    let rt = resources::get(res);
    for _ in 0..RETRIES {
        let current = state
            .store
            .get(res, k)
            .ok_or_else(|| ApiError::not_found(rt.group, rt.plural, &k.name))?;
        let uid = meta::meta_str(&current.object, "uid").unwrap_or_default();
        if let Some(want) = &opts.uid
            && want != uid
        {
            return Err(ApiError::conflict(
                rt.group,
                rt.plural,
                &k.name,
                &format!(
                    "Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"
                ),
            ));
        }
        if let Some(want) = &opts.resource_version
            && *want != current.rv.to_string()
        {
            return Err(ApiError::conflict(
                rt.group,
                rt.plural,
                &k.name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {want}, ResourceVersion in object meta: {}",
                    current.rv
                ),
            ));
        }
        let plan = rt.strategy.deletion(&current.object, opts);
        if opts.dry_run {
            return Ok((plan.unwrap_or_else(|| entry_value(&current)), false));
        }
        let removed = plan.is_none();
        let written = match plan {
            Some(marked) if same_object(&marked, &current.object) => {
                return Ok((entry_value(&current), false));
            }
            Some(marked) => state
                .store
                .replace(res, k.clone(), marked, Some(current.rv)),
            None => match rt.strategy.last_mark(&current.object) {
                Some(marked) => state
                    .store
                    .replace(res, k.clone(), marked, Some(current.rv))
                    .and_then(|entry| {
                        // Another client may remove the marked object first (a kubelet that
                        // saw it): the delete happened, and kube-apiserver's registry then
                        // answers with the last state it wrote, as here.
                        match state.store.remove(res, k, Some(entry.rv)) {
                            Err(StoreError::NotFound) => Ok(entry),
                            other => other,
                        }
                    }),
                None => state.store.remove(res, k, Some(current.rv)),
            },
        };
        match written {
            Ok(entry) => return Ok((entry_value(&entry), removed)),
            Err(StoreError::Conflict) => continue,
            Err(StoreError::NotFound) => {
                return Err(ApiError::not_found(rt.group, rt.plural, &k.name));
            }
            Err(e) => return Err(ApiError::internal(e.to_string())),
        }
    }
    Err(ApiError::conflict(
        rt.group,
        rt.plural,
        &k.name,
        "too many concurrent writes, try again",
    ))
}

fn delete_collection(
    state: &State,
    r: &ResourceRoute,
    q: &Query,
    body: Option<Value>,
) -> Result<(u16, Value)> {
    let rt = resources::get(r.res);
    let opts = DeleteOptions::from(q, body)?;
    let filter = watch::Filter::from_query(rt, r.namespace.as_deref(), q)?;
    let (items, rv, _) = state
        .store
        .list(r.res, filter.namespace.as_deref(), None, None, |e| {
            filter.matches(rt, &e.object)
        });
    let mut deleted = Vec::new();
    for e in items {
        let k = key(
            rt,
            meta::namespace(&e.object),
            meta::name(&e.object).unwrap_or_default(),
        );
        match delete_object(state, r.res, &k, &opts) {
            Ok(v) => deleted.push(v),
            Err(err) if err.code == 404 => {}
            Err(err) => return Err(err),
        }
    }
    Ok((200, list_value(rt, deleted, rv, None)))
}

/// The `fieldManager` an apply patch must name (422 as the real server answers without one).
pub(super) fn apply_field_manager(q: &Query) -> Result<&str> {
    q.get("fieldManager")
        .filter(|m| !m.is_empty())
        .ok_or_else(|| {
            ApiError::invalid(
                "meta.k8s.io",
                "PatchOptions",
                "",
                &[(
                    "fieldManager".into(),
                    "Required value: is required for apply patch".into(),
                )],
            )
        })
}
