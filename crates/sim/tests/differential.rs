//! Differential checks: the simulator against a real Kubernetes API server.
//!
//! The same HTTP requests (the ones tensile-kube and `kubectl` make) are sent, in the same
//! order, to an embedded simulated API server and to a real control plane started from the
//! binaries in `TENSILE_K8S_BIN` (`scripts/k8s-bin`). Each has one simulated node, served by the
//! same `SimKubelet`, so logs, exec, attach, port-forward and `nodes/proxy` have a kubelet behind
//! them on both sides. For every request the test compares:
//!
//! - the HTTP status code and the media type of the answer;
//! - `kind` and `apiVersion` of a JSON body, and the `reason` of a `Status`;
//! - the shape of the body: the set of JSON key paths, arrays collapsed to `[]` (the union of
//!   their elements' shapes), values ignored, to [`MAX_DEPTH`] keys, without the paths of
//!   [`IGNORED_PATHS`] and without keys whose value is `null`, `{}` or `[]` ([`is_empty`]);
//!   only when both answers have the same status and kind (otherwise that is the difference);
//! - for watches, the first events (type and object kind, or the `reason` of an `ERROR`) and
//!   the shapes of their objects.
//!
//! Every difference is collected; the test fails at the end with one report, by difference
//! and by request, listing them all except those in [`KNOWN_DIFFERENCES`] (which must each
//! still occur: a fixed difference is removed from the table). When Kubernetes and the
//! simulator disagree, Kubernetes is right. `TENSILE_DIFFERENTIAL_DUMP=<folder>` writes both
//! answers of every request there, to see what is behind a difference.
//!
//! Run it with the real binaries (it fails without them; the default nextest profile leaves it
//! out, the `real` profile runs it):
//!
//! ```sh
//! export TENSILE_K8S_BIN=$(scripts/k8s-bin | tail -1)
//! cargo nextest run -p tensile-sim --test differential
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use http_body_util::BodyExt;
use serde_json::{Value, json};
use tensile_sim::apiserver::{ApiServer, ApiServerConfig, client_from_kubeconfig};
use tensile_simkubelet::{SimKubelet, SimKubeletConfig, SimNode};
use tensile_testenv::{eventually, real, testhost};

/// The namespace the checks work in (created by the first requests).
const NS: &str = "diff";
/// The simulated node on both sides.
const NODE: &str = "diff-node-1";
/// How many keys deep shapes are compared.
const MAX_DEPTH: usize = 8;
/// How long a watch is read for its first events.
const WATCH_READ: Duration = Duration::from_secs(4);
/// How long a wait step may take on each side.
const WAIT: Duration = Duration::from_secs(30);
/// Names a folder to write both answers of every request to (`NNN-case.sim`, `NNN-case.real`).
const DUMP_ENV: &str = "TENSILE_DIFFERENTIAL_DUMP";

/// Key paths left out of every shape (matched as a run of keys anywhere in a path), each
/// because its presence depends on timing or on implementation details no client relies on.
const IGNORED_PATHS: &[(&str, &str)] = &[(
    "metadata.managedFields",
    "server-side apply bookkeeping; the simulator keeps no field managers (docs/sim.md)",
)];

/// Accepted differences: (case, difference, reason). The case is a case name and the
/// difference as the report prints it in brackets (`status`, `reason`, `kind`, `apiVersion`,
/// `content-type`, `events`, `only-real <path>`, `only-sim <path>`); in both, `*` stands for
/// any run of characters. Every entry must still match something.
const KNOWN_DIFFERENCES: &[(&str, &str, &str)] = &[
    (
        "*",
        "only-real resources[].storageVersionHash",
        "discovery's storage-version hash: only the storage version migrator reads it",
    ),
    (
        "node: create",
        "only-real status",
        "Go writes the zero nodeInfo strings and kubelet port of a node no kubelet reported on",
    ),
    (
        "*",
        "only-real *[\"node.alpha.kubernetes.io/ttl\"]",
        "kube-controller-manager's TTL controller tunes real kubelets' caches; ours have none",
    ),
    (
        "*",
        "only-real *[\"endpoints.kubernetes.io/last-change-trigger-time\"]",
        "a timestamp for kube-proxy's latency metrics, and there is no kube-proxy",
    ),
    (
        "event: get * as *",
        "*",
        "Kubernetes keeps core and events.k8s.io Events in one storage, served in both versions; \
         the simulator stores them apart (the project and kubectl write and read core Events)",
    ),
    (
        "event: list events.k8s.io",
        "*",
        "one storage for both Event versions (above); its field selectors are the core ones",
    ),
    (
        "event: list core by reason",
        "only-real items[].*",
        "the events.k8s.io Event shows in the core list on one storage (above)",
    ),
    (
        "replicaset: list",
        "only-real *[\"deployment.kubernetes.io/max-replicas\"]",
        "surge bookkeeping of rolling updates, which the simulator does not do (docs/sim.md)",
    ),
];

const JSON: &str = "application/json";
const YAML: &str = "application/yaml";
const MERGE: &str = "application/merge-patch+json";
const STRATEGIC: &str = "application/strategic-merge-patch+json";
const JSON_PATCH: &str = "application/json-patch+json";
const APPLY: &str = "application/apply-patch+yaml";
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";
const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// How an answer is read and compared.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Read {
    /// The whole body; JSON bodies are compared (kind, reason, shape).
    Body,
    /// The whole body, comparing status, media type, kind and reason but not the shape (which
    /// depends on timing, said where used).
    NoShape,
    /// A watch: up to this many events, read for at most [`WATCH_READ`].
    Watch(usize),
    /// Not compared: GET the path on both sides until the JSON pointer has the value (or, for
    /// `Value::Null`, exists), then go on.
    Wait(&'static str, Value),
}

/// One request sent to both servers (or a wait on both).
#[derive(Debug)]
struct Case {
    name: &'static str,
    method: &'static str,
    path: String,
    content_type: Option<&'static str>,
    accept: &'static str,
    body: Option<Vec<u8>>,
    read: Read,
}

fn case(name: &'static str, method: &'static str, path: impl Into<String>) -> Case {
    Case {
        name,
        method,
        path: path.into(),
        content_type: None,
        accept: JSON,
        body: None,
        read: Read::Body,
    }
}

fn get(name: &'static str, path: impl Into<String>) -> Case {
    case(name, "GET", path)
}

fn delete(name: &'static str, path: impl Into<String>) -> Case {
    case(name, "DELETE", path)
}

fn post(name: &'static str, path: impl Into<String>, body: Value) -> Case {
    case(name, "POST", path).body(JSON, body)
}

fn put(name: &'static str, path: impl Into<String>, body: Value) -> Case {
    case(name, "PUT", path).body(JSON, body)
}

fn patch(
    name: &'static str,
    path: impl Into<String>,
    content_type: &'static str,
    body: Value,
) -> Case {
    case(name, "PATCH", path).body(content_type, body)
}

fn watch(name: &'static str, path: impl Into<String>, events: usize) -> Case {
    let mut c = get(name, path);
    c.read = Read::Watch(events);
    c
}

fn wait(what: &'static str, path: impl Into<String>, pointer: &'static str, want: Value) -> Case {
    let mut c = get(what, path);
    c.read = Read::Wait(pointer, want);
    c
}

impl Case {
    fn body(mut self, content_type: &'static str, body: Value) -> Self {
        self.content_type = Some(content_type);
        self.body = Some(body.to_string().into_bytes());
        self
    }

    fn raw(mut self, content_type: &'static str, body: &str) -> Self {
        self.content_type = Some(content_type);
        self.body = Some(body.as_bytes().to_vec());
        self
    }

    fn accept(mut self, accept: &'static str) -> Self {
        self.accept = accept;
        self
    }

    fn no_shape(mut self) -> Self {
        self.read = Read::NoShape;
        self
    }

    fn request(&self) -> http::Request<kube::client::Body> {
        let mut b = http::Request::builder()
            .method(self.method)
            .uri(&self.path)
            .header("accept", self.accept);
        if let Some(ct) = self.content_type {
            b = b.header("content-type", ct);
        }
        b.body(kube::client::Body::from(
            self.body.clone().unwrap_or_default(),
        ))
        .unwrap()
    }
}

fn ns(rest: &str) -> String {
    format!("/api/v1/namespaces/{NS}/{rest}")
}

fn group_ns(group_version: &str, rest: &str) -> String {
    format!("/apis/{group_version}/namespaces/{NS}/{rest}")
}

/// `{apiVersion, kind, metadata: {name}}` and the fields of `rest`.
fn obj(api_version: &str, kind: &str, name: &str, rest: Value) -> Value {
    let mut v = json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name}});
    if let (Some(map), Value::Object(rest)) = (v.as_object_mut(), rest) {
        map.extend(rest);
    }
    v
}

/// A pod that the simulated kubelet runs (bound to [`NODE`] at creation).
fn running_pod(name: &str) -> Value {
    let mut p = obj(
        "v1",
        "Pod",
        name,
        json!({"spec": {
        "nodeName": NODE, "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "c", "image": "busybox:1.36", "command": ["sleep", "3600"],
            "ports": [{"containerPort": 80}]}]}}),
    );
    p["metadata"]["labels"] = json!({"app": "diff", "pod": name});
    p
}

/// A pod no scheduler takes: it stays Pending.
fn pending_pod(name: &str) -> Value {
    let mut p = obj(
        "v1",
        "Pod",
        name,
        json!({"spec": {"schedulerName": "diff-nobody",
        "containers": [{"name": "c", "image": "busybox:1.36"}]}}),
    );
    p["metadata"]["labels"] = json!({"app": "diff", "pod": name});
    p
}

const YAML_POD: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: yaml\nspec:\n  \
    schedulerName: diff-nobody\n  containers:\n  - name: c\n    image: busybox:1.36\n";

fn lease(name: &str, resource_version: Option<&str>) -> Value {
    let mut v = obj(
        "coordination.k8s.io/v1",
        "Lease",
        name,
        json!({
        "spec": {"holderIdentity": "diff-holder", "leaseDurationSeconds": 15}}),
    );
    if let Some(rv) = resource_version {
        v["metadata"]["resourceVersion"] = json!(rv);
    }
    v
}

fn service(name: &str, spec: Value) -> Value {
    obj("v1", "Service", name, json!({ "spec": spec }))
}

fn eviction(name: &str) -> Value {
    let mut v = obj("policy/v1", "Eviction", name, json!({}));
    v["metadata"]["namespace"] = json!(NS);
    v
}

/// The requests, in order. Later ones rely on what earlier ones made.
fn cases() -> Vec<Case> {
    let pods = ns("pods");
    let run = ns("pods/run");
    let pending = ns("pods/pending");
    let services = ns("services");
    let events = ns("events");
    let new_events = group_ns("events.k8s.io/v1", "events");
    let claims = ns("persistentvolumeclaims");
    let claim = ns("persistentvolumeclaims/claim");
    let pv = "/api/v1/persistentvolumes/diff-pv";
    let leases = group_ns("coordination.k8s.io/v1", "leases");
    let l1 = format!("{leases}/l1");
    let l2 = format!("{leases}/l2");
    let deployment = group_ns("apps/v1", "deployments/web");
    let scale = format!("{deployment}/scale");
    let node = format!("/api/v1/nodes/{NODE}");
    let extra = "/api/v1/nodes/diff-extra";
    let by_label = "labelSelector=app%3Ddiff";
    let bad_selector = "labelSelector=a%20in%20(";
    let one_pod = "watch=true&fieldSelector=metadata.name%3Drun&timeoutSeconds=5";
    let exec = "exec?command=echo&command=hi&stdout=true";
    let watch_web = "watch=true&fieldSelector=metadata.name%3Dweb";
    let ev_time = "2025-01-01T00:00:00Z";
    let involved = json!({"kind": "Pod", "name": "run", "namespace": NS, "apiVersion": "v1"});
    vec![
        // Discovery, as kubectl does it.
        get("version", "/version"),
        get("core api versions", "/api"),
        get("core v1 resources", "/api/v1"),
        get("coordination resources", "/apis/coordination.k8s.io/v1"),
        get("aggregated discovery", "/apis").accept(AGGREGATED),
        get("unknown resource", ns("foos")),
        // The namespace.
        post(
            "namespace: create",
            "/api/v1/namespaces",
            obj("v1", "Namespace", NS, json!({})),
        ),
        wait(
            "default SA",
            ns("serviceaccounts/default"),
            "/kind",
            json!("ServiceAccount"),
        ),
        get("namespace: get", format!("/api/v1/namespaces/{NS}")),
        // Pods.
        post("pod: create bound", &pods, running_pod("run")),
        post("pod: create pending", &pods, pending_pod("pending")),
        post("pod: create existing", &pods, running_pod("run")),
        post(
            "pod: create without containers",
            &pods,
            obj("v1", "Pod", "empty", json!({"spec": {"containers": []}})),
        ),
        post(
            "pod: create in a missing namespace",
            "/api/v1/namespaces/diff-missing/pods",
            pending_pod("lost"),
        ),
        case("pod: create, malformed JSON", "POST", &pods).raw(JSON, "{\"apiVersion\": "),
        case("pod: create, text/plain", "POST", &pods).raw("text/plain", "hello"),
        case("pod: create, YAML", "POST", &pods).raw(YAML, YAML_POD),
        get("pod: get missing", ns("pods/missing")),
        wait("pod run Running", &run, "/status/phase", json!("Running")),
        wait("pod run has an IP", &run, "/status/podIP", Value::Null),
        get("pod: get running", &run),
        get("pod: get pending", &pending),
        get("pod: get status", format!("{run}/status")),
        get("pod: list by label", format!("{pods}?{by_label}")),
        get("pod: list, limit 1", format!("{pods}?limit=1")),
        get(
            "pod: list, bad label selector",
            format!("{pods}?{bad_selector}"),
        ),
        get(
            "pod: list by nodeName",
            format!("{pods}?fieldSelector=spec.nodeName%3D{NODE}"),
        ),
        get(
            "pod: list, unsupported field",
            format!("{pods}?fieldSelector=spec.foo%3Dbar"),
        ),
        get(
            "pod: list, all namespaces",
            format!("/api/v1/pods?{by_label}"),
        ),
        get("pod: list as Table", format!("{pods}?{by_label}")).accept(TABLE),
        get("pod: get as Table", &run).accept(TABLE),
        patch(
            "pod: merge patch",
            &pending,
            MERGE,
            json!({"metadata": {"labels": {"m": "1"}}}),
        ),
        patch(
            "pod: strategic merge patch",
            &pending,
            STRATEGIC,
            json!({"spec": {"containers": [{"name": "c", "image": "busybox:1.37"}]}}),
        ),
        patch(
            "pod: strategic patch adding a container",
            &pending,
            STRATEGIC,
            json!({"spec": {"containers": [{"name": "d", "image": "busybox:1.37"}]}}),
        ),
        patch(
            "pod: json patch",
            &pending,
            JSON_PATCH,
            json!([{"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}}]),
        ),
        patch(
            "pod: json patch, failed test",
            &pending,
            JSON_PATCH,
            json!([{"op": "test", "path": "/metadata/name", "value": "other"}]),
        ),
        patch(
            "pod: patch, application/json",
            &pending,
            JSON,
            json!({"metadata": {}}),
        ),
        patch(
            "pod: patch missing",
            ns("pods/missing"),
            MERGE,
            json!({"metadata": {}}),
        ),
        case("pod: patch, malformed", "PATCH", &pending).raw(MERGE, "{"),
        put("pod: update, stale resourceVersion", &pending, {
            let mut p = pending_pod("pending");
            p["metadata"]["resourceVersion"] = json!("1");
            p
        }),
        put("pod: update, name mismatch", &pending, pending_pod("other")),
        case("pod: PUT on the collection", "PUT", &pods).body(JSON, pending_pod("x")),
        post("pod: POST on an object", &run, running_pod("run")),
        // Watches.
        watch("watch: one pod", format!("{pods}?{one_pod}"), 1),
        watch(
            "watch: initial events and bookmark",
            format!(
                "{pods}?{one_pod}\
            &sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan"
            ),
            2,
        ),
        // A fresh control plane has compacted nothing, and a watch cache that has dropped no
        // event replays the state for any older resourceVersion: no 410 to be had from a real
        // server in a test's time. Both must at least agree that this one is served.
        watch(
            "watch: from resourceVersion 1",
            format!("{pods}?watch=true&resourceVersion=1&timeoutSeconds=5"),
            1,
        ),
        watch(
            "watch: resourceVersion from the future",
            format!("{pods}?watch=true&resourceVersion=999999999&timeoutSeconds=5"),
            1,
        ),
        watch(
            "watch: bad label selector",
            format!("{pods}?watch=true&{bad_selector}"),
            1,
        ),
        // `kubectl get -w`.
        watch("watch: one pod as Table", format!("{pods}?{one_pod}"), 1).accept(TABLE),
        // Streams through the kubelet.
        get("pod: log", format!("{run}/log")),
        get(
            "pod: log of a missing container",
            format!("{run}/log?container=nope"),
        ),
        get("pod: log of a pending pod", format!("{pending}/log")),
        get("pod: log of a missing pod", ns("pods/missing/log")),
        case("pod: exec without upgrade", "POST", format!("{run}/{exec}")),
        get("pod: exec (GET) without upgrade", format!("{run}/{exec}")),
        case(
            "pod: exec of a pending pod",
            "POST",
            format!("{pending}/{exec}"),
        ),
        case(
            "pod: attach without upgrade",
            "POST",
            format!("{run}/attach?stdout=true"),
        ),
        case(
            "pod: portforward without upgrade",
            "POST",
            format!("{run}/portforward?ports=80"),
        ),
        get(
            "pod: portforward (GET) without upgrade",
            format!("{run}/portforward?ports=80"),
        ),
        get("node: proxy healthz", format!("{node}/proxy/healthz")),
        // Its values are the kubelet's, the same code on both sides.
        get(
            "node: proxy stats/summary",
            format!("{node}/proxy/stats/summary"),
        )
        .no_shape(),
        get(
            "node: proxy of a missing node",
            "/api/v1/nodes/missing/proxy/healthz",
        ),
        // Ephemeral containers (`kubectl debug`): only through the subresource, added never
        // changed or removed, named apart from every other container, without ports, probes,
        // resources or lifecycle.
        get("ephemeral: get", format!("{run}/ephemeralcontainers")),
        patch(
            "ephemeral: add (strategic)",
            format!("{run}/ephemeralcontainers"),
            STRATEGIC,
            json!({"spec": {"ephemeralContainers": [{"name": "dbg", "image": "busybox:1.36",
                "command": ["sh"], "stdin": true, "targetContainerName": "c"}]}}),
        ),
        wait(
            "ephemeral: dbg reported",
            &run,
            "/status/ephemeralContainerStatuses/0/name",
            json!("dbg"),
        ),
        get("ephemeral: pod with its status", &run),
        get("ephemeral: log", format!("{run}/log?container=dbg")),
        patch(
            "ephemeral: change an existing one",
            format!("{run}/ephemeralcontainers"),
            STRATEGIC,
            json!({"spec": {"ephemeralContainers": [{"name": "dbg", "image": "busybox:1.37"}]}}),
        ),
        patch(
            "ephemeral: remove (merge patch)",
            format!("{run}/ephemeralcontainers"),
            MERGE,
            json!({"spec": {"ephemeralContainers": []}}),
        ),
        patch(
            "ephemeral: name of a container",
            format!("{run}/ephemeralcontainers"),
            STRATEGIC,
            json!({"spec": {"ephemeralContainers": [{"name": "c", "image": "busybox:1.36"}]}}),
        ),
        patch(
            "ephemeral: ports, resources, probe, missing target",
            format!("{run}/ephemeralcontainers"),
            STRATEGIC,
            json!({"spec": {"ephemeralContainers": [{"name": "bad", "image": "busybox:1.36",
                "targetContainerName": "nope", "ports": [{"containerPort": 81}],
                "resources": {"requests": {"cpu": "1"}},
                "readinessProbe": {"exec": {"command": ["true"]}}}]}}),
        ),
        put(
            "ephemeral: update (PUT) adding one",
            format!("{run}/ephemeralcontainers"),
            {
                let mut p = running_pod("run");
                p["metadata"]["namespace"] = json!(NS);
                p["spec"]["ephemeralContainers"] = json!([
                {"name": "dbg", "image": "busybox:1.36", "command": ["sh"], "stdin": true,
                 "targetContainerName": "c", "imagePullPolicy": "IfNotPresent",
                 "terminationMessagePath": "/dev/termination-log",
                 "terminationMessagePolicy": "File"},
                {"name": "dbg2", "image": "busybox", "command": ["sleep", "3600"]}]);
                p
            },
        ),
        patch(
            "ephemeral: add (json patch)",
            format!("{run}/ephemeralcontainers"),
            JSON_PATCH,
            json!([{"op": "add", "path": "/spec/ephemeralContainers/-",
                "value": {"name": "dbg3", "image": "busybox:1.36"}}]),
        ),
        patch(
            "ephemeral: through the pod itself",
            &run,
            STRATEGIC,
            json!({"spec": {"ephemeralContainers": [{"name": "dbg9", "image": "busybox:1.36"}]}}),
        ),
        post("ephemeral: create a pod with one", &pods, {
            let mut p = running_pod("with-ephemeral");
            p["spec"]["ephemeralContainers"] = json!([{"name": "e", "image": "busybox:1.36"}]);
            p
        }),
        patch(
            "ephemeral: on a pod without the subresource",
            format!("{}/ephemeralcontainers", ns("services/missing")),
            STRATEGIC,
            json!({}),
        ),
        // Services and endpoints (before pod run goes: the endpoints of `web` list it).
        post(
            "service: create ClusterIP",
            &services,
            service(
                "web",
                json!({"selector": {"pod": "run"}, "ports": [{"port": 80, "targetPort": 80}]}),
            ),
        ),
        post(
            "service: create NodePort",
            &services,
            service(
                "np",
                json!({"type": "NodePort", "selector": {"app": "diff"}, "ports": [{"port": 80}]}),
            ),
        ),
        post(
            "service: create without selector",
            &services,
            service("manual", json!({"ports": [{"port": 80}]})),
        ),
        post(
            "service: create invalid",
            &services,
            service("bad", json!({"ports": [{"port": 0}]})),
        ),
        post(
            "service: create existing",
            &services,
            service("web", json!({"ports": [{"port": 80}]})),
        ),
        patch(
            "service: change clusterIP",
            ns("services/web"),
            MERGE,
            json!({"spec": {"clusterIP": "10.96.0.99", "clusterIPs": ["10.96.0.99"]}}),
        ),
        get("service: list", &services),
        wait(
            "endpoints of web",
            ns("endpoints/web"),
            "/subsets/0/addresses/0/ip",
            Value::Null,
        ),
        get("endpoints: get controller-made", ns("endpoints/web")),
        post(
            "endpoints: create",
            ns("endpoints"),
            obj(
                "v1",
                "Endpoints",
                "manual",
                json!({
            "subsets": [{"addresses": [{"ip": "10.1.2.3"}], "ports": [{"port": 80}]}]}),
            ),
        ),
        get("endpoints: get", ns("endpoints/manual")),
        get(
            "endpointslices: list",
            group_ns(
                "discovery.k8s.io/v1",
                "endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Dweb",
            ),
        ),
        patch(
            "service: merge patch",
            ns("services/web"),
            MERGE,
            json!({"metadata": {"labels": {"m": "1"}}}),
        ),
        patch(
            "endpoints: strategic merge patch",
            ns("endpoints/manual"),
            STRATEGIC,
            json!({"metadata": {"labels": {"m": "1"}}}),
        ),
        watch("watch: services", format!("{services}?{watch_web}"), 1),
        watch(
            "watch: endpoints",
            format!("{}?{watch_web}", ns("endpoints")),
            1,
        ),
        delete("service: delete", ns("services/np")),
        // As `kubectl delete` sends it.
        delete("endpoints: delete with options", ns("endpoints/manual")).body(
            JSON,
            json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}),
        ),
        // Eviction and deletion.
        post(
            "pod: evict pending",
            format!("{pending}/eviction"),
            eviction("pending"),
        ),
        post(
            "pod: evict missing",
            ns("pods/missing/eviction"),
            eviction("missing"),
        ),
        delete("pod: delete running", &run),
        wait("pod run gone", &run, "/code", json!(404)),
        delete("pod: delete missing", &run),
        delete("pod: delete unbound", ns("pods/yaml")),
        // Nodes.
        get("node: get", &node),
        get("node: list", "/api/v1/nodes"),
        get("node: get missing", "/api/v1/nodes/missing"),
        watch(
            "watch: nodes",
            format!("/api/v1/nodes?watch=true&fieldSelector=metadata.name%3D{NODE}"),
            1,
        ),
        watch(
            "watch: node leases",
            format!(
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases?watch=true\
                 &fieldSelector=metadata.name%3D{NODE}"
            ),
            1,
        ),
        post(
            "node: create",
            "/api/v1/nodes",
            obj("v1", "Node", "diff-extra", json!({})),
        ),
        // The node lifecycle controller may taint the new node at any moment.
        patch(
            "node: strategic merge patch",
            extra,
            STRATEGIC,
            json!({"metadata": {"labels": {"a": "b"}}}),
        )
        .no_shape(),
        patch(
            "node: status patch",
            format!("{extra}/status"),
            MERGE,
            json!({"status": {"capacity": {"cpu": "2", "memory": "1Gi"}}}),
        )
        .no_shape(),
        get("node: get status", format!("{node}/status")),
        delete("node: delete", extra).no_shape(),
        // Leases.
        post("lease: create", &leases, lease("l1", None)),
        get("lease: get", &l1),
        put(
            "lease: update, stale resourceVersion",
            &l1,
            lease("l1", Some("1")),
        ),
        put("lease: update, no resourceVersion", &l1, lease("l1", None)),
        patch(
            "lease: merge patch",
            &l1,
            MERGE,
            json!({"spec": {"holderIdentity": "b"}}),
        ),
        patch(
            "lease: apply without fieldManager",
            &l2,
            APPLY,
            lease("l2", None),
        ),
        patch(
            "lease: apply (create)",
            format!("{l2}?fieldManager=diff"),
            APPLY,
            lease("l2", None),
        ),
        patch(
            "lease: apply (update)",
            format!("{l2}?fieldManager=diff"),
            APPLY,
            {
                let mut l = lease("l2", None);
                l["spec"]["holderIdentity"] = json!("other");
                l
            },
        ),
        get(
            "lease: list node leases",
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
        ),
        delete("lease: delete", &l1),
        // Events, both APIs.
        post(
            "event: create core",
            &events,
            obj(
                "v1",
                "Event",
                "ev1",
                json!({
            "involvedObject": involved, "reason": "DiffTest", "message": "m", "type": "Normal",
            "count": 1, "firstTimestamp": ev_time, "lastTimestamp": ev_time,
            "source": {"component": "diff"}}),
            ),
        ),
        post(
            "event: create events.k8s.io",
            &new_events,
            obj(
                "events.k8s.io/v1",
                "Event",
                "ev2",
                json!({"eventTime": "2025-01-01T00:00:00.000000Z",
                "reportingController": "diff/ctl", "reportingInstance": "diff-1",
                "action": "Test", "reason": "DiffTest", "note": "n", "type": "Normal",
                "regarding": involved}),
            ),
        ),
        post(
            "event: create core, invalid",
            &events,
            obj(
                "v1",
                "Event",
                "ev3",
                json!({"reason": "DiffTest", "type": "Bogus"}),
            ),
        ),
        get(
            "event: list core by reason",
            format!("{events}?fieldSelector=reason%3DDiffTest"),
        ),
        get("event: get events.k8s.io as core", format!("{events}/ev2")),
        get(
            "event: get core as events.k8s.io",
            format!("{new_events}/ev1"),
        ),
        get(
            "event: list events.k8s.io",
            format!("{new_events}?fieldSelector=reason%3DDiffTest"),
        ),
        patch(
            "event: merge patch",
            format!("{events}/ev1"),
            MERGE,
            json!({"count": 2}),
        ),
        watch(
            "watch: core events",
            format!("{events}?watch=true&fieldSelector=metadata.name%3Dev1"),
            1,
        ),
        delete("event: delete", format!("{events}/ev1")),
        // Volumes.
        post(
            "pv: create",
            "/api/v1/persistentvolumes",
            obj(
                "v1",
                "PersistentVolume",
                "diff-pv",
                json!({"spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                "storageClassName": "diff-manual", "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": "/tmp/diff-pv"}}}),
            ),
        ),
        post(
            "pvc: create",
            &claims,
            obj(
                "v1",
                "PersistentVolumeClaim",
                "claim",
                json!({"spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "diff-manual",
                "resources": {"requests": {"storage": "1Gi"}}}}),
            ),
        ),
        post(
            "pvc: create invalid",
            &claims,
            obj(
                "v1",
                "PersistentVolumeClaim",
                "bad",
                json!({"spec": {"resources": {"requests": {"storage": "1Gi"}}}}),
            ),
        ),
        wait("claim Bound", &claim, "/status/phase", json!("Bound")),
        wait("volume Bound", pv, "/status/phase", json!("Bound")),
        get("pvc: get bound", &claim),
        get("pv: get bound", pv),
        get("pvc: list", &claims),
        patch(
            "pvc: strategic merge patch",
            &claim,
            STRATEGIC,
            json!({"metadata": {"labels": {"m": "1"}}}),
        ),
        patch(
            "pv: json patch",
            pv,
            JSON_PATCH,
            json!([{"op": "add", "path": "/metadata/labels", "value": {"m": "1"}}]),
        ),
        watch(
            "watch: claims",
            format!("{claims}?watch=true&fieldSelector=metadata.name%3Dclaim"),
            1,
        ),
        delete("pvc: delete", &claim),
        wait("claim gone", &claim, "/code", json!(404)),
        wait("volume Released", pv, "/status/phase", json!("Released")),
        get("pv: get released", pv),
        delete("pv: delete", pv),
        // Deployments and their scale subresource.
        post(
            "deployment: create",
            group_ns("apps/v1", "deployments"),
            obj(
                "apps/v1",
                "Deployment",
                "web",
                json!({"spec": {"replicas": 1,
                "selector": {"matchLabels": {"app": "web-d"}},
                "template": {"metadata": {"labels": {"app": "web-d"}},
                    "spec": {"schedulerName": "diff-nobody",
                        "containers": [{"name": "c", "image": "busybox:1.36"}]}}}}),
            ),
        ),
        wait(
            "deployment observed",
            &deployment,
            "/status/replicas",
            json!(1),
        ),
        get("scale: get", &scale),
        patch(
            "scale: merge patch",
            &scale,
            MERGE,
            json!({"spec": {"replicas": 2}}),
        ),
        put("scale: update", &scale, {
            let mut s = obj(
                "autoscaling/v1",
                "Scale",
                "web",
                json!({"spec": {"replicas": 3}}),
            );
            s["metadata"]["namespace"] = json!(NS);
            s
        }),
        delete("scale: delete", &scale),
        get(
            "scale: of a missing deployment",
            group_ns("apps/v1", "deployments/missing/scale"),
        ),
        wait(
            "deployment scaled",
            &deployment,
            "/status/replicas",
            json!(3),
        ),
        wait(
            "deployment settled",
            &deployment,
            "/status/unavailableReplicas",
            json!(3),
        ),
        get("deployment: get", &deployment),
        get(
            "replicaset: list",
            group_ns("apps/v1", "replicasets?labelSelector=app%3Dweb-d"),
        ),
        delete("deployment: delete", &deployment),
        // The namespace goes (its controller writes conditions at its own pace).
        delete("namespace: delete", format!("/api/v1/namespaces/{NS}")).no_shape(),
    ]
}

/// What one server answered.
#[derive(Debug, Default)]
struct Answer {
    status: u16,
    media: String,
    /// The JSON body, when it is one.
    json: Option<Value>,
    /// The text of a non-JSON body, for the report.
    text: String,
    /// A watch's events.
    events: Vec<Value>,
    /// A failure to get any answer.
    error: Option<String>,
}

impl Answer {
    fn summary(&self) -> String {
        if let Some(e) = &self.error {
            return format!("no answer: {e}");
        }
        let mut s = format!("{} {}", self.status, self.media);
        if let Some(v) = &self.json {
            let kind = v["kind"].as_str().unwrap_or("-");
            let _ = write!(s, " {kind}");
            if kind == "Status" {
                let _ = write!(
                    s,
                    " {} {:?}",
                    v["reason"].as_str().unwrap_or("-"),
                    v["message"].as_str().unwrap_or("")
                );
            }
        } else if !self.events.is_empty() {
            let _ = write!(s, " events {:?}", event_summaries(&self.events));
        } else if !self.text.is_empty() {
            let t: String = self.text.chars().take(120).collect();
            let _ = write!(s, " {t:?}");
        }
        s
    }
}

async fn send(client: &kube::Client, c: &Case) -> Answer {
    let res = match tokio::time::timeout(Duration::from_secs(30), client.send(c.request())).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            return Answer {
                error: Some(e.to_string()),
                ..Answer::default()
            };
        }
        Err(_) => {
            return Answer {
                error: Some("no answer within 30 s".into()),
                ..Answer::default()
            };
        }
    };
    let status = res.status().as_u16();
    let media = res
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or("").trim().to_owned())
        .unwrap_or_default();
    let mut body = res.into_body();
    let mut answer = Answer {
        status,
        media,
        ..Answer::default()
    };
    if let Read::Watch(n) = c.read
        && status == 200
    {
        answer.events = read_events(&mut body, n).await;
        return answer;
    }
    let bytes = match tokio::time::timeout(Duration::from_secs(30), body.collect_bytes()).await {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => {
            answer.error = Some(format!("reading the body: {e}"));
            return answer;
        }
        Err(_) => {
            answer.error = Some("body not finished within 30 s".into());
            return answer;
        }
    };
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(v) if v.is_object() => answer.json = Some(v),
        _ => answer.text = String::from_utf8_lossy(&bytes).into_owned(),
    }
    answer
}

/// The first `n` events of a watch (newline-separated JSON), or what came in [`WATCH_READ`].
async fn read_events(body: &mut kube::client::Body, n: usize) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + WATCH_READ;
    let mut buf: Vec<u8> = Vec::new();
    let mut events = Vec::new();
    loop {
        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            if let Ok(v) = serde_json::from_slice::<Value>(&line) {
                events.push(v);
            }
        }
        if events.len() >= n {
            break;
        }
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    buf.extend_from_slice(&data);
                }
            }
            _ => break,
        }
    }
    if let Ok(v) = serde_json::from_slice::<Value>(&buf) {
        events.push(v);
    }
    events.truncate(n);
    events
}

fn event_summaries(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            let t = e["type"].as_str().unwrap_or("?");
            let kind = e["object"]["kind"].as_str().unwrap_or("?");
            match e["object"]["reason"].as_str() {
                Some(r) if kind == "Status" => format!("{t} {kind} {r}"),
                _ => format!("{t} {kind}"),
            }
        })
        .collect()
}

/// Renders a key for a path: plain, or `["key"]` when it holds `.`, `/` or brackets (label
/// and annotation names).
fn key_segment(k: &str) -> String {
    if k.contains(['.', '/', '[', ']', '"']) {
        format!("[{k:?}]")
    } else {
        k.to_owned()
    }
}

fn render(path: &[String]) -> String {
    let mut s = String::new();
    for seg in path {
        if seg == "[]" || seg.starts_with('[') || s.is_empty() {
            s += seg;
        } else {
            s += ".";
            s += seg;
        }
    }
    s
}

fn ignored(path: &[String]) -> bool {
    IGNORED_PATHS.iter().any(|(pattern, _)| {
        let pat: Vec<String> = pattern.split('.').map(str::to_owned).collect();
        path.windows(pat.len()).any(|w| w == pat.as_slice())
    })
}

/// Whether `text` matches `pattern`, where `*` stands for any run of characters.
fn glob(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, rest)) => {
            let Some(tail) = text.strip_prefix(head) else {
                return false;
            };
            (0..=tail.len())
                .filter(|&i| tail.is_char_boundary(i))
                .any(|i| glob(rest, &tail[i..]))
        }
    }
}

/// Whether a value counts as absent: `null`, `{}` and `[]`. Go's encoder writes empty structs
/// (`resources: {}`, `lastState: {}`, `details: {}`) and zero times (`lastProbeTime: null`) even
/// under `omitempty`, and drops empty slices, while the simulator keeps the JSON it was given;
/// a decoding client cannot tell these apart, so they are not differences.
fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// The key paths of `v`, arrays collapsed, at most [`MAX_DEPTH`] keys deep; keys with an empty
/// value ([`is_empty`]) left out.
fn shape(v: &Value) -> BTreeSet<String> {
    fn walk(v: &Value, path: &mut Vec<String>, depth: usize, out: &mut BTreeSet<String>) {
        match v {
            Value::Object(map) if depth < MAX_DEPTH => {
                for (k, child) in map {
                    if is_empty(child) {
                        continue;
                    }
                    path.push(key_segment(k));
                    if !ignored(path) {
                        out.insert(render(path));
                        walk(child, path, depth + 1, out);
                    }
                    path.pop();
                }
            }
            Value::Array(items) => {
                path.push("[]".into());
                for item in items {
                    walk(item, path, depth, out);
                }
                path.pop();
            }
            _ => {}
        }
    }
    let mut out = BTreeSet::new();
    walk(v, &mut Vec::new(), 0, &mut out);
    out
}

/// Paths of `a` not in `b`, without those whose parent is already listed (but with the
/// names in a missing `labels` or `annotations` map, which say more than the map's name).
fn only_in(a: &BTreeSet<String>, b: &BTreeSet<String>) -> Vec<String> {
    let missing: Vec<&String> = a.difference(b).collect();
    let named_map = |q: &str| q.ends_with("annotations") || q.ends_with("labels");
    // `rest` is one key: `.name` or `["a.b/c"]`.
    let one_key = |rest: &str| match rest.strip_prefix('.') {
        Some(name) => !name.contains(['.', '[']),
        None => rest.starts_with("[\"") && rest.find("\"]") == Some(rest.len() - 2),
    };
    let within = |p: &str, q: &str| {
        q.len() < p.len()
            && p.starts_with(q)
            && matches!(p.as_bytes()[q.len()], b'.' | b'[')
            && !(named_map(q) && one_key(&p[q.len()..]))
    };
    let listed: Vec<&String> = missing
        .iter()
        .filter(|p| !missing.iter().any(|q| within(p, q)))
        .copied()
        .collect();
    // A map whose names are listed goes without saying.
    listed
        .iter()
        .filter(|q| {
            !(named_map(q)
                && listed.iter().any(|p| {
                    p.len() > q.len() && p.starts_with(q.as_str()) && one_key(&p[q.len()..])
                }))
        })
        .map(|q| (*q).clone())
        .collect()
}

/// One difference: its key (as [`KNOWN_DIFFERENCES`] names it) and what the report says.
#[derive(Debug)]
struct Difference {
    key: String,
    detail: String,
}

fn compare(c: &Case, sim: &Answer, real: &Answer) -> Vec<Difference> {
    let mut out = Vec::new();
    let mut push = |key: String, detail: String| out.push(Difference { key, detail });
    if sim.error.is_some() || real.error.is_some() {
        push(
            "answer".into(),
            format!("sim: {}; real: {}", sim.summary(), real.summary()),
        );
        return out;
    }
    if sim.status != real.status {
        push(
            "status".into(),
            format!("sim {}, real {}", sim.status, real.status),
        );
    }
    if sim.media != real.media {
        push(
            "content-type".into(),
            format!("sim {:?}, real {:?}", sim.media, real.media),
        );
    }
    let field = |a: &Answer, f: &str| {
        a.json
            .as_ref()
            .and_then(|v| v[f].as_str().map(str::to_owned))
    };
    for f in ["kind", "apiVersion"] {
        let (s, r) = (field(sim, f), field(real, f));
        if s != r {
            push(f.into(), format!("sim {s:?}, real {r:?}"));
        }
    }
    let is_status = |a: &Answer| field(a, "kind").as_deref() == Some("Status");
    if is_status(sim) || is_status(real) {
        let (s, r) = (field(sim, "reason"), field(real, "reason"));
        if s != r {
            push("reason".into(), format!("sim {s:?}, real {r:?}"));
        }
    }
    if let Read::Watch(_) = c.read {
        let (s, r) = (event_summaries(&sim.events), event_summaries(&real.events));
        if s != r {
            push("events".into(), format!("sim {s:?}, real {r:?}"));
        }
    }
    // A different status or kind makes the shapes incomparable: the difference is said.
    if c.read == Read::NoShape
        || sim.status != real.status
        || field(sim, "kind") != field(real, "kind")
    {
        return out;
    }
    let shape_of = |a: &Answer| {
        let mut set = a.json.as_ref().map(shape).unwrap_or_default();
        for e in &a.events {
            set.extend(shape(e));
        }
        set
    };
    let (s, r) = (shape_of(sim), shape_of(real));
    for p in only_in(&r, &s) {
        push(format!("only-real {p}"), String::new());
    }
    for p in only_in(&s, &r) {
        push(format!("only-sim {p}"), String::new());
    }
    out
}

/// GETs `c.path` on one side until the pointer has the wanted value (or, for null, exists);
/// what it last saw after [`WAIT`].
async fn wait_for(
    client: &kube::Client,
    c: &Case,
    pointer: &str,
    want: &Value,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let a = send(client, c).await;
        let got = a.json.as_ref().and_then(|v| v.pointer(pointer)).cloned();
        match (&got, want) {
            (Some(_), Value::Null) => return Ok(()),
            (Some(g), w) if g == w => return Ok(()),
            _ => {}
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("{pointer} = {got:?} ({})", a.summary()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One side: an API server client, with the simulated node running behind it.
struct Side {
    client: kube::Client,
    _kubelet: SimKubelet,
}

async fn with_node(client: kube::Client) -> Side {
    let address = testhost::address().unwrap();
    let kubelet = SimKubelet::start(
        client.clone(),
        SimKubeletConfig {
            nodes: vec![SimNode::new(NODE, "4", "8Gi")],
            address: Some(address),
            ..SimKubeletConfig::default()
        },
    )
    .await
    .unwrap();
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    eventually(90, "the simulated node Ready", || {
        let nodes = nodes.clone();
        async move {
            let n = nodes.get_opt(NODE).await.ok().flatten()?;
            let ready = n
                .status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            ready.then_some(())
        }
    })
    .await;
    Side {
        client,
        _kubelet: kubelet,
    }
}

/// A simulated API server and a real control plane (files in a temporary folder named after
/// `what`), and a client of the real one.
async fn start_both(
    bin: &std::path::Path,
    what: &str,
) -> (
    std::path::PathBuf,
    ApiServer,
    real::RealCluster,
    kube::Client,
) {
    let dir = std::env::temp_dir().join(format!("tensile-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let server = tensile_testenv::start_apiserver(ApiServerConfig::default())
        .await
        .unwrap()
        .0;
    let real_cluster = real::start(bin, &dir, "real").await.unwrap();
    let real_client = client_from_kubeconfig(&real_cluster.kubeconfig)
        .await
        .unwrap();
    (dir, server, real_cluster, real_client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulator_answers_like_a_real_api_server() {
    let Some(bin) = real::bin_dir() else {
        panic!(
            "the differential checks need real Kubernetes binaries: set {} to the folder \
             `scripts/k8s-bin` prints (export {}=$(scripts/k8s-bin | tail -1))",
            real::BIN_ENV,
            real::BIN_ENV
        );
    };
    let started = std::time::Instant::now();
    let (dir, server, real_cluster, real_client) = start_both(&bin, "differential").await;
    // The simulated kubelet trusts the API server's client certificate by the cluster CA it
    // reads from kube-system/kube-root-ca.crt, which the controller manager publishes.
    let config_maps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(real_client.clone(), "kube-system");
    eventually(
        60,
        "kube-system/kube-root-ca.crt on the real cluster",
        || {
            let config_maps = config_maps.clone();
            async move { config_maps.get_opt("kube-root-ca.crt").await.ok().flatten() }
        },
    )
    .await;
    let (sim, real) = tokio::join!(
        async { with_node(server.client().await.unwrap()).await },
        with_node(real_client),
    );
    let setup = started.elapsed();

    let dump = std::env::var_os(DUMP_ENV).map(std::path::PathBuf::from);
    let mut report = String::new();
    let mut used = vec![false; KNOWN_DIFFERENCES.len()];
    // difference key -> the cases showing it, for the summary.
    let mut by_key: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    let cases = cases();
    for (i, c) in cases.iter().enumerate() {
        if let Read::Wait(pointer, want) = &c.read {
            let (s, r) = tokio::join!(
                wait_for(&sim.client, c, pointer, want),
                wait_for(&real.client, c, pointer, want)
            );
            for (side, res) in [("sim", s), ("real", r)] {
                if let Err(last) = res {
                    by_key
                        .entry(format!("wait on {side}"))
                        .or_default()
                        .push(c.name);
                    let _ = writeln!(
                        report,
                        "\n[wait] {}: not reached on {side} within {} s: {last}",
                        c.name,
                        WAIT.as_secs()
                    );
                }
            }
            continue;
        }
        let (s, r) = tokio::join!(send(&sim.client, c), send(&real.client, c));
        if let Some(dir) = &dump {
            write_dump(dir, i, c, &s, &r);
        }
        let mut lines = Vec::new();
        for d in compare(c, &s, &r) {
            let known = KNOWN_DIFFERENCES
                .iter()
                .position(|(case, key, _)| glob(case, c.name) && glob(key, &d.key));
            if let Some(k) = known {
                used[k] = true;
                continue;
            }
            lines.push(if d.detail.is_empty() {
                format!("    [{}]", d.key)
            } else {
                format!("    [{}] {}", d.key, d.detail)
            });
            by_key.entry(d.key).or_default().push(c.name);
        }
        if !lines.is_empty() {
            let _ = writeln!(report, "\n{}: {} {}", c.name, c.method, c.path);
            let _ = writeln!(report, "  sim:  {}", s.summary());
            let _ = writeln!(report, "  real: {}", r.summary());
            for l in lines {
                let _ = writeln!(report, "{l}");
            }
        }
    }
    for (k, (case, key, reason)) in KNOWN_DIFFERENCES.iter().enumerate() {
        if !used[k] {
            by_key
                .entry("stale KNOWN_DIFFERENCES entry".into())
                .or_default()
                .push(case);
            let _ = writeln!(
                report,
                "\nKNOWN_DIFFERENCES entry no longer seen (remove it): {case} [{key}] ({reason})"
            );
        }
    }
    let requests = cases
        .iter()
        .filter(|c| !matches!(c.read, Read::Wait(..)))
        .count();
    #[allow(clippy::print_stderr)] // the timing, for whoever runs it
    {
        eprintln!(
            "differential: {requests} requests, {} waits; setup {:.1} s, total {:.1} s",
            cases.len() - requests,
            setup.as_secs_f64(),
            started.elapsed().as_secs_f64()
        );
    }
    drop((sim, real));
    drop(real_cluster);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    let mut summary = String::new();
    for (key, names) in &by_key {
        let _ = writeln!(
            summary,
            "  [{key}] in {}: {}",
            names.len(),
            names.join("; ")
        );
    }
    let total: usize = by_key.values().map(Vec::len).sum();
    assert!(
        total == 0,
        "the simulator and the real API server differ: {total} differences, {} distinct \
         ([only-real P]: key path P only in the real answer, [only-sim P]: only in the \
         simulator's; the simulator should change, or the difference be accepted in \
         KNOWN_DIFFERENCES with its reason)\n\nBy difference:\n{summary}\nBy request:{report}",
        by_key.len()
    );
}

/// Writes both answers of case `i` to `dir` (when [`DUMP_ENV`] is set), to see the bodies
/// behind a difference.
fn write_dump(dir: &std::path::Path, i: usize, c: &Case, sim: &Answer, real: &Answer) {
    let slug: String = c
        .name
        .chars()
        .map(|ch| if ch.is_ascii_alphanumeric() { ch } else { '-' })
        .collect();
    let _ = std::fs::create_dir_all(dir);
    for (side, a) in [("sim", sim), ("real", real)] {
        let body = if let Some(v) = &a.json {
            serde_json::to_string_pretty(v).unwrap_or_default()
        } else if !a.events.is_empty() {
            serde_json::to_string_pretty(&a.events).unwrap_or_default()
        } else {
            a.text.clone()
        };
        let text = format!("{} {}\n{}\n\n{body}\n", c.method, c.path, a.summary());
        let _ = std::fs::write(dir.join(format!("{i:03}-{slug}.{side}")), text);
    }
}

/// The columns of a Table: (name, type, format, priority).
fn columns(table: &Value) -> Vec<(String, String, String, i64)> {
    table["columnDefinitions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or_default().to_owned(),
                c["type"].as_str().unwrap_or_default().to_owned(),
                c["format"].as_str().unwrap_or_default().to_owned(),
                c["priority"].as_i64().unwrap_or(0),
            )
        })
        .collect()
}

/// Every listable resource of an API server, as list paths, from its discovery.
async fn list_paths(client: &kube::Client) -> BTreeSet<String> {
    let mut paths = BTreeSet::new();
    let mut group_versions = vec![("/api/v1".to_owned(), String::new())];
    let groups = get_json(client, "/apis").await;
    for g in groups["groups"].as_array().into_iter().flatten() {
        if let Some(v) = g["preferredVersion"]["groupVersion"].as_str() {
            group_versions.push((format!("/apis/{v}"), v.to_owned()));
        }
    }
    for (prefix, _) in group_versions {
        let list = get_json(client, &prefix).await;
        for r in list["resources"].as_array().into_iter().flatten() {
            let name = r["name"].as_str().unwrap_or_default();
            let listable = r["verbs"]
                .as_array()
                .is_some_and(|v| v.iter().any(|v| v == "list"));
            if listable && !name.contains('/') {
                paths.insert(format!("{prefix}/{name}"));
            }
        }
    }
    paths
}

async fn get_json(client: &kube::Client, path: &str) -> Value {
    let req = http::Request::get(path).body(Vec::new()).unwrap();
    client.request::<Value>(req).await.unwrap_or(Value::Null)
}

async fn get_table(client: &kube::Client, path: &str) -> Value {
    let req = http::Request::get(path)
        .header("Accept", TABLE)
        .body(Vec::new())
        .unwrap();
    client.request::<Value>(req).await.unwrap_or(Value::Null)
}

/// `kubectl get` shows what the server's Table says: every resource the simulator serves
/// prints the real API server's columns (names, types, formats, priorities: `-o wide` shows
/// priority 1), and each row has as many cells as there are columns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_prints_the_columns_of_a_real_api_server() {
    let Some(bin) = real::bin_dir() else {
        panic!(
            "the differential checks need real Kubernetes binaries: set {} (scripts/k8s-bin)",
            real::BIN_ENV
        );
    };
    let (dir, server, real_cluster, real_client) = start_both(&bin, "tables").await;
    let sim_client = server.client().await.unwrap();
    let sim_paths = list_paths(&sim_client).await;
    let real_paths = list_paths(&real_client).await;
    let mut report = String::new();
    for path in &sim_paths {
        if !real_paths.contains(path) {
            let _ = writeln!(report, "{path}: not served by the real API server");
            continue;
        }
        let (sim, real) = tokio::join!(get_table(&sim_client, path), get_table(&real_client, path));
        let (s, r) = (columns(&sim), columns(&real));
        if s != r {
            let _ = writeln!(report, "{path}:\n  sim:  {s:?}\n  real: {r:?}");
        }
        for row in sim["rows"].as_array().into_iter().flatten() {
            let cells = row["cells"].as_array().map_or(0, Vec::len);
            if cells != s.len() {
                let _ = writeln!(
                    report,
                    "{path}: a simulator row has {cells} cells for {} columns",
                    s.len()
                );
                break;
            }
        }
    }
    drop(real_cluster);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(report.is_empty(), "Table columns differ:\n{report}");
}
