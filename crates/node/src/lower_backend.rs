//! The kubelet backend of the virtual node: every kubelet API request for a pod of the virtual
//! node is forwarded to the pod of the same namespace and name in the lower cluster, through the
//! lower API server (kube-rs: `pods/log`, `pods/exec`, `pods/attach`; `pods/portforward` over
//! SPDY, see [`crate::lower_portforward`]) and its `metrics.k8s.io` API.
//!
//! Security first: a lower pod is only ever reached when it is ours, i.e. it carries our owner
//! label ([`LABEL_OWNER`] equal to [`owner_label_value`] of the owner id). When the request names
//! a UID (the `/exec/{ns}/{pod}/{uid}/...` routes), that is the UID of the *upper* pod, so it is
//! compared with the lower pod's [`ANNOTATION_UPPER_UID`]. A pod that is missing, not ours, or
//! of another UID is "not found", and nothing is forwarded to it.
//!
//! ```text
//! let backend = LowerBackend::new(lower_client, "vk-1".into(), move || upper_pods.snapshot())
//!     .with_node_name("vk-1");
//! let server = KubeletServer::start(config, Arc::new(backend)).await?;
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::{AsyncBufReadExt as _, SinkExt as _};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, AttachParams, AttachedProcess, ListParams, LogParams};
use serde::Deserialize;
use tensile_core::keys::{ANNOTATION_UPPER_UID, LABEL_OWNER, owner_label_value};
use tensile_core::quantity::{parse_quantity, value};
use tensile_kubelet::stats::{
    ContainerStats, CpuIntegrator, CpuStats, MemoryStats, NodeStats, PodReference, PodStats,
    Summary,
};
use tensile_kubelet::{
    AttachRequest, BackendError, BoxWriter, ExecIo, ExecRequest, ExitStatus, KubeletBackend,
    LogOptions, LogStream, PodRef, PortForwardRequest, PortForwardStream, StreamBackend,
    StreamOptions,
};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};

use crate::lower_portforward::PortForwardError;

/// Buffer of each standard stream between kube-rs and the kubelet side (kube-rs' default is
/// 1 KiB, which makes bulk copies crawl).
const STREAM_BUFFER: usize = 64 * 1024;

/// The upper pods bound to the virtual node (`/pods`), e.g. a snapshot of the upper pod
/// reflector's store.
type UpperPods = dyn Fn() -> Vec<Pod> + Send + Sync;

/// The virtual node's kubelet backend: forwards logs, exec, attach and port-forward to our pods
/// of the lower cluster, and builds `/stats/summary` from the lower cluster's metrics API.
pub struct LowerBackend {
    lower: kube::Client,
    owner: String,
    owner_value: String,
    node_name: String,
    started: String,
    upper_pods: Arc<UpperPods>,
    /// Our lower pods, from the pod controller's watch (stats read it once it has listed).
    lower_pods: Option<tensile_runtime::cache::CompactCache<Pod>>,
    cpu: Mutex<CpuIntegrator>,
    /// The lower cluster's name and whether it answers (failures name it; 503 while down).
    reach: crate::reach::LowerReach,
}

impl fmt::Debug for LowerBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LowerBackend")
            .field("owner", &self.owner)
            .field("owner_value", &self.owner_value)
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}

impl LowerBackend {
    /// A backend reaching the lower cluster with `lower`. `owner` is the owner id whose
    /// [`LABEL_OWNER`] value marks the lower pods this virtual node created (only those are ever
    /// reached); `upper_pods` lists the upper pods bound to the virtual node (served on `/pods`).
    /// The node name reported in stats is `owner` until [`Self::with_node_name`] says otherwise.
    pub fn new(
        lower: kube::Client,
        owner: String,
        upper_pods: impl Fn() -> Vec<Pod> + Send + Sync + 'static,
    ) -> Self {
        Self {
            lower,
            owner_value: owner_label_value(&owner),
            reach: crate::reach::LowerReach::new(owner.clone()),
            node_name: owner.clone(),
            owner,
            started: rfc3339(Timestamp::now()),
            upper_pods: Arc::new(upper_pods),
            lower_pods: None,
            cpu: Mutex::new(CpuIntegrator::default()),
        }
    }

    /// The lower cluster's name and reachability, as the node loop sees it (default: named
    /// after the owner id, always reachable).
    #[must_use]
    pub fn with_reach(mut self, reach: crate::reach::LowerReach) -> Self {
        self.reach = reach;
        self
    }

    /// The virtual node's name, as reported in `/stats/summary`.
    #[must_use]
    pub fn with_node_name(mut self, node_name: impl Into<String>) -> Self {
        self.node_name = node_name.into();
        self
    }

    /// Reads our lower pods from a watch cache (`None` while it has not listed once) instead of
    /// listing them at every stats request.
    pub fn with_lower_pods(
        mut self,
        lower_pods: tensile_runtime::cache::CompactCache<Pod>,
    ) -> Self {
        self.lower_pods = Some(lower_pods);
        self
    }

    /// The owner id.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The label selector of the lower pods this backend may reach.
    pub fn owner_selector(&self) -> String {
        format!("{LABEL_OWNER}={}", self.owner_value)
    }

    /// Our pods' `metrics.k8s.io` metrics in the lower cluster.
    async fn pod_metrics(&self, selector: &str) -> Result<PodMetricsList, kube::Error> {
        let request = kube::core::Request::new("/apis/metrics.k8s.io/v1beta1/pods")
            .list(&ListParams::default().labels(selector))
            .map_err(kube::Error::BuildRequest)?;
        self.lower.request(request).await
    }

    /// The lower pod of `r`, if it is ours (and of the upper UID `r` names, if any); anything else
    /// is "not found". Returns the namespaced API to reach it with.
    async fn owned_pod(&self, r: &PodRef) -> Result<(Api<Pod>, Pod), BackendError> {
        let not_found = || BackendError::new(format!("pod {}/{} not found", r.namespace, r.name));
        // Names go into the lower API server's URL path: only real object names get there.
        if !is_object_name(&r.namespace) || !is_object_name(&r.name) {
            return Err(not_found());
        }
        let api: Api<Pod> = Api::namespaced(self.lower.clone(), &r.namespace);
        let pod = api.get_opt(&r.name).await.map_err(|e| {
            let context = format!(
                "reading pod {}/{} in the lower cluster",
                r.namespace, r.name
            );
            self.reach.error(&context, &e)
        })?;
        let Some(pod) = pod else {
            return Err(not_found());
        };
        let owner = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_OWNER));
        if owner != Some(&self.owner_value) {
            tracing::warn!(
                namespace = %r.namespace,
                pod = %r.name,
                "refusing a kubelet API request for a lower pod this virtual node does not own"
            );
            return Err(not_found());
        }
        if let Some(uid) = &r.uid {
            let upper = pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_UPPER_UID));
            if upper != Some(uid) {
                return Err(BackendError::new(format!(
                    "pod {}/{} with uid {uid} not found",
                    r.namespace, r.name
                )));
            }
        }
        Ok((api, pod))
    }

    /// Exec (`command` given) or attach, with the streams of `io`.
    async fn remote(
        &self,
        r: &PodRef,
        container: String,
        command: Option<Vec<String>>,
        options: StreamOptions,
        io: ExecIo,
    ) -> ExitStatus {
        let what = if command.is_some() {
            "exec in"
        } else {
            "attach to"
        };
        let api = match self.owned_pod(r).await {
            Ok((api, _)) => api,
            Err(e) => return ExitStatus::Error(e.to_string()),
        };
        let context = format!(
            "{what} container {container} of pod {}/{} in the lower cluster",
            r.namespace, r.name
        );
        let params = AttachParams::default()
            .container(container)
            .stdin(options.stdin)
            .stdout(options.stdout)
            .stderr(options.stderr)
            .tty(options.tty)
            .max_stdin_buf_size(STREAM_BUFFER)
            .max_stdout_buf_size(STREAM_BUFFER)
            .max_stderr_buf_size(STREAM_BUFFER);
        let started = match command {
            Some(command) => api.exec(&r.name, command, &params).await,
            None => api.attach(&r.name, &params).await,
        };
        let process = match started {
            Ok(p) => p,
            Err(e) => return ExitStatus::Error(self.reach.error(&context, &e).to_string()),
        };
        // From here on, dropping this future drops `process`, whose `Drop` aborts kube-rs'
        // connection task: the lower API server sees the stream closed and the lower kubelet
        // stops the command (exec) or detaches (attach).
        match pump(process, io).await {
            Ok(Some(status)) => ExitStatus::from_status(&status),
            // Ended cleanly without a status (protocols before v4 send none on success).
            Ok(None) => ExitStatus::Success,
            Err(e) => ExitStatus::Error(format!("{context}: {e}")),
        }
    }
}

/// A Kubernetes object name (DNS subdomain: lower-case alphanumerics, `-` and `.`, starting and
/// ending with an alphanumeric, at most 253 characters); namespaces are a subset.
fn is_object_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 253
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'-' | b'.'))
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// A kube-rs error as the user should read it: the API server's message when there is one.
fn api_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({})", s.message, s.code),
        other => other.to_string(),
    }
}

fn rfc3339(t: Timestamp) -> String {
    Timestamp::from_second(t.as_second())
        .unwrap_or(t)
        .to_string()
}

/// Copies the streams between the kubelet side (`io`) and the lower process until the process
/// ends; returns its final status, if the lower cluster sent one.
async fn pump(mut process: AttachedProcess, io: ExecIo) -> Result<Option<Status>, String> {
    let ExecIo {
        stdin,
        stdout,
        stderr,
        tty,
        resize,
    } = io;
    let status = process.take_status();
    let remote_stdin = process.stdin();
    let remote_stdout = process.stdout();
    let remote_stderr = process.stderr();
    let resizer = if tty { process.terminal_size() } else { None };

    // stdin until the client's EOF, then closed, so that `cat` and friends end.
    let input = async move {
        if let (Some(mut from), Some(mut to)) = (stdin, remote_stdin) {
            if let Err(e) = tokio::io::copy(&mut from, &mut to).await {
                tracing::debug!(error = %e, "copying stdin to the lower cluster stopped");
            }
            let _ = to.shutdown().await;
        }
    };
    let resizing = async move {
        if let (Some(mut sizes), Some(mut to)) = (resize, resizer) {
            while let Some(size) = sizes.recv().await {
                let size = kube::api::TerminalSize {
                    width: size.width,
                    height: size.height,
                };
                if to.send(size).await.is_err() {
                    break;
                }
            }
        }
    };
    let finished = async move {
        tokio::join!(
            copy_out(remote_stdout, stdout),
            copy_out(remote_stderr, stderr)
        );
        match status {
            Some(status) => status.await,
            None => None,
        }
    };
    // The process may end before the client closes stdin: the input side is abandoned then.
    let side = async move {
        tokio::join!(input, resizing);
        std::future::pending::<Option<Status>>().await
    };
    let status = tokio::select! {
        s = finished => s,
        s = side => s,
    };
    match status {
        Some(status) => Ok(Some(status)),
        // No status: the connection task has ended (its status sender is gone); whether it
        // ended cleanly decides between success and an error.
        None => process
            .join()
            .await
            .map(|()| None)
            .map_err(|e| e.to_string()),
    }
}

/// Copies one output stream of the lower process to the client until it ends, then ends the
/// client's stream. A client that stops reading stops the copy (and so, through kube-rs'
/// backpressure, the connection).
async fn copy_out<R: AsyncRead + Unpin>(from: Option<R>, to: Option<BoxWriter>) {
    let (Some(mut from), Some(mut to)) = (from, to) else {
        return;
    };
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let Some(chunk) = buf.get(..n) else { break };
        if to.write_all(chunk).await.is_err() || to.flush().await.is_err() {
            return;
        }
    }
    let _ = to.shutdown().await;
}

impl StreamBackend for LowerBackend {
    async fn exec(&self, request: ExecRequest, io: ExecIo) -> ExitStatus {
        self.remote(
            &request.pod,
            request.container,
            Some(request.command),
            request.options,
            io,
        )
        .await
    }

    async fn attach(&self, request: AttachRequest, io: ExecIo) -> ExitStatus {
        self.remote(&request.pod, request.container, None, request.options, io)
            .await
    }

    async fn port_forward(
        &self,
        request: PortForwardRequest,
    ) -> Result<PortForwardStream, BackendError> {
        let r = &request.pod;
        self.owned_pod(r).await?;
        let context = || {
            format!(
                "port-forward to port {} of pod {}/{} in the lower cluster",
                request.port, r.namespace, r.name
            )
        };
        crate::lower_portforward::forward(&self.lower, &r.namespace, &r.name, request.port)
            .await
            .map_err(|e| match e {
                PortForwardError::Api(e) => self.reach.error(&context(), &e),
                e => BackendError::new(format!("{}: {e}", context())),
            })
    }

    fn unavailable(&self) -> Option<BackendError> {
        self.reach.unavailable()
    }
}

/// A `metrics.k8s.io/v1beta1` `PodMetricsList`, the part we read.
#[derive(Debug, Default, Deserialize)]
struct PodMetricsList {
    #[serde(default)]
    items: Vec<PodMetricsItem>,
}

/// One `PodMetrics`, the part we read.
#[derive(Debug, Default, Deserialize)]
struct PodMetricsItem {
    #[serde(default)]
    metadata: NameOnly,
    #[serde(default)]
    timestamp: Option<String>,
    #[serde(default)]
    containers: Vec<ContainerMetrics>,
}

#[derive(Debug, Default, Deserialize)]
struct NameOnly {
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

/// What a pod's stats need of its lower pod (decoded from the cache without the rest).
#[derive(Clone, Debug, Default, Deserialize)]
struct PodFacts {
    #[serde(default)]
    metadata: FactsMeta,
    #[serde(default)]
    spec: FactsSpec,
    #[serde(default)]
    status: FactsStatus,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct FactsSpec {
    #[serde(default)]
    containers: Vec<FactsContainer>,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct FactsContainer {
    #[serde(default)]
    name: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct FactsMeta {
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FactsStatus {
    #[serde(default)]
    phase: Option<String>,
    #[serde(default)]
    start_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

impl PodFacts {
    fn of(p: &Pod) -> Self {
        Self {
            metadata: FactsMeta {
                annotations: p
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(ANNOTATION_UPPER_UID))
                    .map(|uid| BTreeMap::from([(ANNOTATION_UPPER_UID.to_owned(), uid.clone())])),
            },
            spec: FactsSpec {
                containers: p
                    .spec
                    .iter()
                    .flat_map(|s| &s.containers)
                    .map(|c| FactsContainer {
                        name: c.name.clone(),
                    })
                    .collect(),
            },
            status: FactsStatus {
                phase: p.status.as_ref().and_then(|s| s.phase.clone()),
                start_time: p.status.as_ref().and_then(|s| s.start_time.clone()),
            },
        }
    }

    /// The pod runs downstairs: a kubelet lists it in its stats.
    fn runs(&self) -> bool {
        self.status.phase.as_deref() == Some("Running")
    }

    /// The pod's (app) containers, in order.
    fn container_names(&self) -> Vec<String> {
        self.spec
            .containers
            .iter()
            .map(|c| c.name.clone())
            .collect()
    }

    fn upper_uid(&self) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()?
            .get(ANNOTATION_UPPER_UID)
            .map(String::as_str)
    }
}

#[derive(Debug, Default, Deserialize)]
struct ContainerMetrics {
    name: String,
    #[serde(default)]
    usage: BTreeMap<String, Quantity>,
}

/// The lower cluster serves no metrics API (no metrics-server, or its APIService is down).
fn no_metrics_api(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404 || s.code == 503)
}

/// CPU in nano-cores and memory in bytes of one container's usage.
fn usage(c: &ContainerMetrics) -> (u64, u64) {
    let nanos = |name: &str| {
        c.usage
            .get(name)
            .and_then(|q| parse_quantity(&q.0).ok())
            .map(|q| q.nanos)
            .unwrap_or(0)
    };
    let cpu = u64::try_from(nanos("cpu")).unwrap_or(0);
    let memory = u64::try_from(value(nanos("memory"))).unwrap_or(0);
    (cpu, memory)
}

impl KubeletBackend for LowerBackend {
    async fn logs(
        &self,
        pod: PodRef,
        container: String,
        options: LogOptions,
    ) -> Result<LogStream, BackendError> {
        let (api, _) = self.owned_pod(&pod).await?;
        let context = format!(
            "logs of container {container} of pod {}/{} in the lower cluster",
            pod.namespace, pod.name
        );
        let since_time = match options.since_time.as_deref() {
            None => None,
            Some(t) => Some(t.parse::<Timestamp>().map_err(|e| {
                BackendError::new(format!("{context}: invalid sinceTime {t:?}: {e}"))
            })?),
        };
        let params = LogParams {
            container: Some(container.clone()),
            follow: options.follow,
            limit_bytes: options.limit_bytes,
            pretty: false,
            previous: options.previous,
            since_seconds: options.since_seconds,
            since_time,
            tail_lines: options.tail_lines,
            timestamps: options.timestamps,
        };
        let reader = api
            .log_stream(&pod.name, &params)
            .await
            .map_err(|e| self.reach.error(&context, &e))?;
        let stream = futures::stream::unfold(Some(Box::pin(reader)), |state| async move {
            let mut reader = state?;
            match reader.fill_buf().await {
                Ok([]) => None,
                Ok(buf) => {
                    let chunk = Bytes::copy_from_slice(buf);
                    reader.consume_unpin(chunk.len());
                    Some((Ok(chunk), Some(reader)))
                }
                Err(e) => Some((Err(e), None)),
            }
        });
        Ok(Box::pin(stream))
    }

    async fn pods(&self) -> Result<Vec<Pod>, BackendError> {
        Ok((self.upper_pods)())
    }

    async fn stats(&self) -> Result<Summary, BackendError> {
        let selector = self.owner_selector();
        // Only our pods' metrics: the lower cluster's other pods are none of the upper
        // cluster's business (the original listed every pod's metrics of the lower cluster).
        // Decoded straight into the few fields read: at 10,000 pods a list of dynamic objects
        // (or of typed pods, below) held hundreds of MB for the length of a scrape.
        let metrics = match self.pod_metrics(&selector).await {
            Ok(list) => list.items,
            Err(e) if no_metrics_api(&e) => {
                // A lower cluster without metrics-server: `kubectl top` shows no usage for the
                // virtual node's pods, but the node keeps serving stats (its pods, with no
                // usage) instead of failing.
                tracing::debug!(error = %e, "the lower cluster serves no metrics API");
                Vec::new()
            }
            Err(e) => {
                let context = format!("listing pod metrics ({selector}) in the lower cluster");
                return Err(self.reach.error(&context, &e));
            }
        };
        let mut metrics: HashMap<(String, String), PodMetricsItem> = metrics
            .into_iter()
            .filter_map(|m| {
                let key = (m.metadata.namespace.clone()?, m.metadata.name.clone()?);
                Some((key, m))
            })
            .collect();
        // Every pod of ours that runs downstairs is listed at once, as a kubelet lists its
        // running pods (the lower metrics come 10 s or more after a start), and every pod that
        // has metrics: from the cache one pod at a time; before it has listed once, one LIST.
        let lower: Vec<((String, String), PodFacts)> =
            match self.lower_pods.as_ref().filter(|c| c.is_ready()) {
                Some(cache) => cache
                    .keys()
                    .into_iter()
                    .filter_map(|tensile_runtime::cache::Key { namespace, name }| {
                        let facts = cache.get_as::<PodFacts>(&namespace, &name)?;
                        Some(((namespace, name), facts))
                    })
                    .collect(),
                None => {
                    let pods_api: Api<Pod> = Api::all(self.lower.clone());
                    let list = pods_api
                        .list(&ListParams::default().labels(&selector))
                        .await
                        .map_err(|e| {
                            BackendError::new(format!(
                                "listing pods ({selector}) in the lower cluster: {}",
                                api_error(&e)
                            ))
                        })?;
                    list.items
                        .into_iter()
                        .filter_map(|p| {
                            let facts = PodFacts::of(&p);
                            Some(((p.metadata.namespace?, p.metadata.name?), facts))
                        })
                        .collect()
                }
            };
        // The pods listed, each with its metrics when the lower cluster has them. A pod that
        // is not ours (a metrics API ignoring the selector) is never listed.
        let mut listed: Vec<((String, String), PodFacts, Option<PodMetricsItem>)> = lower
            .into_iter()
            .filter_map(|(key, facts)| {
                let m = metrics.remove(&key);
                (facts.runs() || m.is_some()).then_some((key, facts, m))
            })
            .collect();
        listed.sort_by(|a, b| a.0.cmp(&b.0));
        // The upper UIDs by key, built only if a lower pod lacks our UID annotation (pods
        // created by an older version).
        let mut upper_uids: Option<HashMap<(String, String), String>> = None;

        let now = Timestamp::now();
        let now_string = rfc3339(now);
        let mut cpu = self
            .cpu
            .lock()
            .map_err(|_| BackendError::new("CPU statistics unavailable"))?;
        let mut live = HashSet::new();
        let (mut node_cpu, mut node_memory) = (0u64, 0u64);
        let mut pods = Vec::with_capacity(listed.len());
        for ((namespace, name), lower_pod, m) in listed {
            let (time, millis) = match m
                .as_ref()
                .and_then(|m| m.timestamp.as_deref())
                .and_then(|t| t.parse::<Timestamp>().ok())
            {
                Some(t) => (rfc3339(t), t.as_millisecond()),
                None => (now_string.clone(), now.as_millisecond()),
            };
            let uid = match lower_pod.upper_uid() {
                Some(uid) => uid.to_owned(),
                None => upper_uids
                    .get_or_insert_with(|| {
                        (self.upper_pods)()
                            .into_iter()
                            .filter_map(|p| {
                                let m = p.metadata;
                                Some(((m.namespace?, m.name?), m.uid?))
                            })
                            .collect()
                    })
                    .get(&(namespace.clone(), name.clone()))
                    .cloned()
                    .unwrap_or_default(),
            };
            let start = lower_pod.status.start_time.as_ref().map(|t| rfc3339(t.0));
            let (mut pod_cpu, mut pod_memory, mut pod_total) = (0u64, 0u64, 0u64);
            // Every container of the pod, with its usage when the metrics have it (none yet:
            // zero), then any container only the metrics name.
            let measured = m.map(|m| m.containers).unwrap_or_default();
            let mut names = lower_pod.container_names();
            for c in &measured {
                if !names.contains(&c.name) {
                    names.push(c.name.clone());
                }
            }
            let mut containers = Vec::with_capacity(names.len());
            for c_name in names {
                let (nano_cores, memory) = measured
                    .iter()
                    .find(|c| c.name == c_name)
                    .map_or((0, 0), usage);
                let counter = format!("{namespace}/{name}/{uid}/{c_name}");
                let total = cpu.sample(&counter, nano_cores, millis);
                live.insert(counter);
                pod_cpu = pod_cpu.saturating_add(nano_cores);
                pod_memory = pod_memory.saturating_add(memory);
                pod_total = pod_total.saturating_add(total);
                containers.push(ContainerStats {
                    name: c_name,
                    start_time: start.clone(),
                    cpu: Some(CpuStats {
                        time: time.clone(),
                        usage_nano_cores: Some(nano_cores),
                        usage_core_nano_seconds: Some(total),
                    }),
                    memory: Some(MemoryStats {
                        time: time.clone(),
                        working_set_bytes: Some(memory),
                        usage_bytes: None,
                    }),
                });
            }
            node_cpu = node_cpu.saturating_add(pod_cpu);
            node_memory = node_memory.saturating_add(pod_memory);
            pods.push(PodStats {
                pod_ref: PodReference {
                    name,
                    namespace,
                    uid,
                },
                start_time: start,
                containers,
                cpu: Some(CpuStats {
                    time: time.clone(),
                    usage_nano_cores: Some(pod_cpu),
                    usage_core_nano_seconds: Some(pod_total),
                }),
                memory: Some(MemoryStats {
                    time,
                    working_set_bytes: Some(pod_memory),
                    usage_bytes: None,
                }),
            });
        }
        // The node's counter integrates the node's usage itself, so that it never goes back
        // when a pod goes away.
        const NODE: &str = "";
        let node_total = cpu.sample(NODE, node_cpu, now.as_millisecond());
        live.insert(NODE.to_owned());
        cpu.retain(|k| live.contains(k));
        Ok(Summary {
            node: NodeStats {
                node_name: self.node_name.clone(),
                start_time: Some(self.started.clone()),
                cpu: Some(CpuStats {
                    time: now_string.clone(),
                    usage_nano_cores: Some(node_cpu),
                    usage_core_nano_seconds: Some(node_total),
                }),
                memory: Some(MemoryStats {
                    time: now_string,
                    working_set_bytes: Some(node_memory),
                    usage_bytes: None,
                }),
            },
            pods,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_names_are_validated_before_reaching_a_url() {
        assert!(is_object_name("web-1"));
        assert!(is_object_name("a.b"));
        for bad in ["", "..", ".", "a/b", "A", "x?watch=1", "-a", "a-", "a%2Fb"] {
            assert!(!is_object_name(bad), "{bad}");
        }
    }

    #[test]
    fn container_usage_from_quantities() {
        let c = ContainerMetrics {
            name: "c".into(),
            usage: BTreeMap::from([
                ("cpu".to_owned(), Quantity("250m".into())),
                ("memory".to_owned(), Quantity("64Mi".into())),
            ]),
        };
        assert_eq!(usage(&c), (250_000_000, 64 << 20));
        assert_eq!(usage(&ContainerMetrics::default()), (0, 0));
    }
}
