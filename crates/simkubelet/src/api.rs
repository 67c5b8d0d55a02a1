//! The kubelet API of simulated nodes (served by `tensile-kubelet`): deterministic container
//! logs, a small set of built-in commands for exec (no host processes are ever run), attach,
//! an echo server on each declared container port for port-forward, and resource statistics
//! from the pods' requests.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::jiff::Timestamp;
use tensile_core::quantity::parse_quantity;
use tensile_kubelet::stats::{
    ContainerStats, CpuIntegrator, CpuStats, MemoryStats, NodeStats, PodReference, PodStats,
    Summary,
};
use tensile_kubelet::{
    AttachRequest, BackendError, ExecIo, ExecRequest, ExitStatus, KubeletBackend, LogOptions,
    LogStream, PodRef, PortForwardRequest, PortForwardStream, StreamBackend,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::Shared;
use crate::time_string;

/// The kubelet API backend of one simulated node.
pub(super) struct SimBackend {
    pub(super) node: String,
    pub(super) shared: Arc<Shared>,
    pub(super) started: String,
    pub(super) cpu: Mutex<CpuIntegrator>,
}

impl SimBackend {
    fn pod(&self, r: &PodRef) -> Result<Pod, BackendError> {
        let pods = self
            .shared
            .pods
            .lock()
            .map_err(|_| BackendError::new("pod cache unavailable"))?;
        let pod = pods
            .get(&(r.namespace.clone(), r.name.clone()))
            .filter(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(self.node.as_str())
            })
            .cloned()
            .ok_or_else(|| {
                BackendError::new(format!(
                    "pod {}/{} not found on node {}",
                    r.namespace, r.name, self.node
                ))
            })?;
        if let Some(uid) = &r.uid
            && pod.metadata.uid.as_ref() != Some(uid)
        {
            return Err(BackendError::new(format!(
                "pod {}/{} has another uid",
                r.namespace, r.name
            )));
        }
        Ok(pod)
    }

    /// The node's allocatable resources (a resource limit that is not set is this).
    fn allocatable(&self) -> BTreeMap<String, String> {
        self.shared
            .config
            .nodes
            .iter()
            .find(|n| n.name == self.node)
            .map(|n| n.resources.clone())
            .unwrap_or_default()
    }

    fn container(&self, r: &PodRef, name: &str) -> Result<(Pod, Container), BackendError> {
        let pod = self.pod(r)?;
        let spec = pod.spec.clone().unwrap_or_default();
        let c = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .find(|c| c.name == name)
            .cloned()
            .or_else(|| {
                super::ephemeral_containers(&pod)
                    .into_iter()
                    .find(|c| c.name == name)
            })
            .ok_or_else(|| {
                BackendError::new(format!("container {name} is not valid for pod {}", r.name))
            })?;
        Ok((pod, c))
    }
}

/// The log attempt `attempt` of a container writes: its start, then what its command echoes.
fn log_lines(pod: &Pod, c: &Container, attempt: i32) -> Vec<String> {
    let restart = if attempt > 0 {
        format!(", restart {attempt}")
    } else {
        String::new()
    };
    let mut lines = vec![format!(
        "container {} of pod {} started (image {}{restart})",
        c.name,
        pod.metadata.name.as_deref().unwrap_or_default(),
        c.image.as_deref().unwrap_or_default()
    )];
    let script = super::containers::argv(c).join(" ");
    for part in script.split([';', '&']) {
        let part = part.trim();
        let at = if part.starts_with("echo ") {
            Some(0)
        } else {
            part.find(" echo ").map(|i| i + 1)
        };
        if let Some(rest) = at.and_then(|i| part.get(i + 5..)) {
            lines.push(rest.trim().trim_matches(['"', '\'']).to_owned());
        }
    }
    lines
}

fn stamp(line: &str, timestamps: bool) -> String {
    if timestamps {
        format!("{} {line}\n", time_string(Timestamp::now()))
    } else {
        format!("{line}\n")
    }
}

impl SimBackend {
    /// Runs `argv` with the built-in shell in `container` of `pod`, over its file system.
    async fn shell(
        &self,
        pod: &Pod,
        container: &Container,
        argv: Vec<String>,
        io: &mut ExecIo,
    ) -> ExitStatus {
        let ctx = super::shell::Context {
            pod,
            container,
            client: &self.shared.client,
            allocatable: self.allocatable(),
            fs: self.shared.files_of(pod, &container.name),
        };
        super::shell::exec(&ctx, argv, io).await
    }
}

impl StreamBackend for SimBackend {
    async fn exec(&self, request: ExecRequest, mut io: ExecIo) -> ExitStatus {
        let (pod, container) = match self.container(&request.pod, &request.container) {
            Ok(x) => x,
            Err(e) => return ExitStatus::Error(e.to_string()),
        };
        self.shell(&pod, &container, request.command, &mut io).await
    }

    async fn attach(&self, request: AttachRequest, mut io: ExecIo) -> ExitStatus {
        let (pod, container) = match self.container(&request.pod, &request.container) {
            Ok(x) => x,
            Err(e) => return ExitStatus::Error(e.to_string()),
        };
        if io.stdin.is_some()
            && let Some(argv) = shell_session(&container)
        {
            // The main process is an interactive shell (`kubectl run -i -- sh`, `kubectl debug
            // -it`): the one attached to talks to that shell.
            return self.shell(&pod, &container, argv, &mut io).await;
        }
        write_out(&mut io, &format!("attached to {}\n", request.container)).await;
        if io.stdin.is_some() {
            // The main process echoes what it is given until stdin ends.
            let _ = copy_stdin(&mut io).await;
            return ExitStatus::Success;
        }
        // Without stdin, its output as it comes (a line a second, as `logs -f` shows), until
        // the client goes.
        let Some(out) = io.stdout.as_mut() else {
            return ExitStatus::Success;
        };
        for n in 1u64.. {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let line = format!("tick {n}\n");
            if out.write_all(line.as_bytes()).await.is_err() || out.flush().await.is_err() {
                break;
            }
        }
        ExitStatus::Success
    }

    async fn port_forward(
        &self,
        request: PortForwardRequest,
    ) -> Result<PortForwardStream, BackendError> {
        let pod = self.pod(&request.pod)?;
        let declared = pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .flat_map(|c| c.ports.iter().flatten())
            .any(|p| i64::from(p.container_port) == i64::from(request.port));
        if !declared {
            return Err(BackendError::new(format!(
                "failed to connect to localhost:{}: connection refused",
                request.port
            )));
        }
        let (ours, theirs) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            let (mut r, mut w) = tokio::io::split(ours);
            let _ = tokio::io::copy(&mut r, &mut w).await;
            let _ = w.shutdown().await;
        });
        Ok(PortForwardStream::new(theirs))
    }
}

/// The command line of a container whose main process is a shell reading its stdin: `stdin`
/// set and a command of `sh`, `bash` or `ash` with no script.
fn shell_session(c: &Container) -> Option<Vec<String>> {
    if c.stdin != Some(true) {
        return None;
    }
    let argv: Vec<String> = super::containers::argv(c)
        .into_iter()
        .map(str::to_owned)
        .collect();
    let program = argv.first()?.rsplit('/').next()?;
    let flags_only = argv
        .iter()
        .skip(1)
        .all(|f| matches!(f.as_str(), "-i" | "-l" | "-il" | "-li"));
    (matches!(program, "sh" | "bash" | "ash") && flags_only).then_some(argv)
}

async fn copy_stdin(io: &mut ExecIo) -> io::Result<()> {
    let (Some(stdin), Some(stdout)) = (io.stdin.as_mut(), io.stdout.as_mut()) else {
        return Ok(());
    };
    let mut buf = [0u8; 8192];
    loop {
        let n = stdin.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        stdout.write_all(&buf[..n]).await?;
        stdout.flush().await?;
    }
}

async fn write_out(io: &mut ExecIo, text: &str) {
    if let Some(out) = io.stdout.as_mut() {
        let _ = out.write_all(text.as_bytes()).await;
        let _ = out.flush().await;
    }
}

/// The keys of the ConfigMap or Secret volume mounted at `mount_path` in `container` (its
/// `items` paths when it names some), read from the API server at the moment.
pub(super) async fn volume_keys(
    client: &kube::Client,
    pod: &Pod,
    container: &Container,
    mount_path: &str,
) -> Vec<String> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let Some(mount) = container
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path.trim_end_matches('/') == mount_path)
    else {
        return Vec::new();
    };
    let Some(volume) = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .find(|v| v.name == mount.name)
    else {
        return Vec::new();
    };
    let mut keys = Vec::new();
    if let Some(cm) = &volume.config_map {
        keys.extend(
            listed(
                cm.items.as_ref(),
                config_map_keys(client, namespace, &cm.name),
            )
            .await,
        );
    }
    if let Some(secret) = &volume.secret
        && let Some(name) = secret.secret_name.as_deref()
    {
        keys.extend(listed(secret.items.as_ref(), secret_keys(client, namespace, name)).await);
    }
    keys.extend(
        volume
            .downward_api
            .iter()
            .flat_map(|d| d.items.iter().flatten())
            .map(|i| i.path.clone()),
    );
    for source in volume
        .projected
        .iter()
        .flat_map(|p| p.sources.iter().flatten())
    {
        if let Some(cm) = &source.config_map {
            keys.extend(
                listed(
                    cm.items.as_ref(),
                    config_map_keys(client, namespace, &cm.name),
                )
                .await,
            );
        }
        if let Some(secret) = &source.secret {
            keys.extend(
                listed(
                    secret.items.as_ref(),
                    secret_keys(client, namespace, &secret.name),
                )
                .await,
            );
        }
        if let Some(d) = &source.downward_api {
            keys.extend(d.items.iter().flatten().map(|i| i.path.clone()));
        }
    }
    keys
}

/// The files a ConfigMap or Secret source lays out: its `items` paths when it names some,
/// else every key of the object (`all`, read only then).
async fn listed(
    items: Option<&Vec<k8s_openapi::api::core::v1::KeyToPath>>,
    all: impl std::future::Future<Output = Vec<String>>,
) -> Vec<String> {
    match items {
        Some(items) => items.iter().map(|k| k.path.clone()).collect(),
        None => all.await,
    }
}

/// The keys of ConfigMap `namespace/name` (none when it cannot be read).
async fn config_map_keys(client: &kube::Client, namespace: &str, name: &str) -> Vec<String> {
    let api =
        kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), namespace);
    match api.get(name).await {
        Ok(cm) => cm
            .data
            .into_iter()
            .flat_map(BTreeMap::into_keys)
            .chain(cm.binary_data.into_iter().flat_map(BTreeMap::into_keys))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The keys of Secret `namespace/name` (none when it cannot be read).
async fn secret_keys(client: &kube::Client, namespace: &str, name: &str) -> Vec<String> {
    let api =
        kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), namespace);
    match api.get(name).await {
        Ok(secret) => secret
            .data
            .into_iter()
            .flat_map(BTreeMap::into_keys)
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The content of file `path` in `container`, if it lies in a ConfigMap or Secret volume: read
/// from the API server at the moment (a real kubelet refreshes such volumes within about a
/// minute, and never for `subPath` mounts; the simulated one is always current).
pub(super) async fn volume_file(
    client: &kube::Client,
    pod: &Pod,
    container: &Container,
    path: &str,
) -> Result<Vec<u8>, String> {
    const MISSING: &str = "No such file or directory";
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let (mount, relative) = container
        .volume_mounts
        .iter()
        .flatten()
        .filter_map(|m| {
            let sub = m.sub_path.as_deref().filter(|s| !s.is_empty());
            match sub {
                Some(sub) => (path == m.mount_path).then(|| (m, sub.to_owned())),
                None => path
                    .strip_prefix(m.mount_path.trim_end_matches('/'))
                    .and_then(|rest| rest.strip_prefix('/'))
                    .map(|rest| (m, rest.to_owned())),
            }
        })
        .max_by_key(|(m, _)| m.mount_path.len())
        .ok_or(MISSING)?;
    let volume = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .find(|v| v.name == mount.name)
        .ok_or(MISSING)?;
    let key_of = |items: Option<&Vec<k8s_openapi::api::core::v1::KeyToPath>>| match items {
        Some(items) => items
            .iter()
            .find(|i| i.path == relative)
            .map(|i| i.key.clone()),
        None => Some(relative.clone()),
    };
    if let Some(source) = &volume.config_map {
        let key = key_of(source.items.as_ref()).ok_or(MISSING)?;
        return config_map_key(client, namespace, &source.name, &key)
            .await
            .ok_or_else(|| MISSING.to_owned());
    }
    if let Some(source) = &volume.secret {
        let key = key_of(source.items.as_ref()).ok_or(MISSING)?;
        let name = source.secret_name.as_deref().ok_or(MISSING)?;
        return secret_key(client, namespace, name, &key)
            .await
            .ok_or_else(|| MISSING.to_owned());
    }
    if let Some(item) = volume
        .downward_api
        .iter()
        .flat_map(|d| d.items.iter().flatten())
        .find(|i| i.path == relative)
        && let Some(field) = &item.field_ref
    {
        return super::env::field_value(pod, &field.field_path).map(String::into_bytes);
    }
    // A projected volume: the first source that has the file, as the kubelet lays them out.
    for source in volume
        .projected
        .iter()
        .flat_map(|p| p.sources.iter().flatten())
    {
        if let Some(cm) = &source.config_map
            && let Some(key) = key_of(cm.items.as_ref())
            && let Some(bytes) = config_map_key(client, namespace, &cm.name, &key).await
        {
            return Ok(bytes);
        }
        if let Some(secret) = &source.secret
            && let Some(key) = key_of(secret.items.as_ref())
            && let Some(bytes) = secret_key(client, namespace, &secret.name, &key).await
        {
            return Ok(bytes);
        }
        if let Some(item) = source
            .downward_api
            .iter()
            .flat_map(|d| d.items.iter().flatten())
            .find(|i| i.path == relative)
            && let Some(field) = &item.field_ref
        {
            return super::env::field_value(pod, &field.field_path).map(String::into_bytes);
        }
    }
    Err(MISSING.to_owned())
}

/// Key `key` of ConfigMap `namespace/name`, read now.
async fn config_map_key(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    key: &str,
) -> Option<Vec<u8>> {
    let cm =
        kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), namespace)
            .get(name)
            .await
            .ok()?;
    if let Some(text) = cm.data.as_ref().and_then(|d| d.get(key)) {
        return Some(text.clone().into_bytes());
    }
    cm.binary_data.and_then(|d| d.get(key).map(|b| b.0.clone()))
}

/// Key `key` of Secret `namespace/name`, read now.
async fn secret_key(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    key: &str,
) -> Option<Vec<u8>> {
    let secret =
        kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), namespace)
            .get(name)
            .await
            .ok()?;
    secret.data.and_then(|d| d.get(key).map(|b| b.0.clone()))
}

/// What a simulated container uses: its requests, or a small default.
fn usage(c: &Container) -> (u64, u64) {
    let request = |name: &str| {
        c.resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get(name))
            .and_then(|q| parse_quantity(&q.0).ok())
            .map(|q| q.nanos)
    };
    let cpu_nanocores = request("cpu")
        .and_then(|n| u64::try_from(n).ok())
        .unwrap_or(1_000_000);
    let memory = request("memory")
        .and_then(|n| u64::try_from(n / 1_000_000_000).ok())
        .unwrap_or(8 << 20);
    (cpu_nanocores, memory)
}

impl KubeletBackend for SimBackend {
    async fn logs(
        &self,
        pod: PodRef,
        container: String,
        options: LogOptions,
    ) -> Result<LogStream, BackendError> {
        let (p, c) = self.container(&pod, &container)?;
        // The latest attempt's log, or with `previous` the one before (what `kubectl logs
        // --previous` shows of a restarted container).
        let attempt = p
            .status
            .iter()
            .flat_map(|s| {
                s.container_statuses
                    .iter()
                    .flatten()
                    .chain(s.init_container_statuses.iter().flatten())
                    .chain(s.ephemeral_container_statuses.iter().flatten())
            })
            .find(|s| s.name == container)
            .map_or(0, |s| s.restart_count);
        let attempt = if options.previous {
            if attempt == 0 {
                return Err(BackendError::bad_request(format!(
                    "previous terminated container \"{container}\" in pod \"{}\" not found",
                    pod.name
                )));
            }
            attempt - 1
        } else {
            attempt
        };
        let mut lines = log_lines(&p, &c, attempt);
        if let Some(n) = options.tail_lines.and_then(|n| usize::try_from(n).ok()) {
            let skip = lines.len().saturating_sub(n);
            lines.drain(..skip);
        }
        let mut text: String = lines.iter().map(|l| stamp(l, options.timestamps)).collect();
        if let Some(limit) = options.limit_bytes.and_then(|l| usize::try_from(l).ok()) {
            text.truncate(limit);
        }
        let head = futures::stream::once(async move { Ok::<_, io::Error>(Bytes::from(text)) });
        if !options.follow || options.previous {
            return Ok(Box::pin(head));
        }
        // Following: a line a second for as long as the client reads.
        let timestamps = options.timestamps;
        let ticks = futures::stream::unfold(1u64, move |n| async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Some((
                Ok(Bytes::from(stamp(&format!("tick {n}"), timestamps))),
                n + 1,
            ))
        });
        Ok(Box::pin(futures::StreamExt::chain(head, ticks)))
    }

    async fn pods(&self) -> Result<Vec<Pod>, BackendError> {
        let pods = self
            .shared
            .pods
            .lock()
            .map_err(|_| BackendError::new("pod cache unavailable"))?;
        Ok(pods
            .values()
            .filter(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(self.node.as_str())
            })
            .cloned()
            .collect())
    }

    async fn stats(&self) -> Result<Summary, BackendError> {
        let now = Timestamp::now();
        let time = time_string(now);
        let millis = now.as_millisecond();
        let pods = self.pods().await?;
        let mut cpu = self
            .cpu
            .lock()
            .map_err(|_| BackendError::new("stats unavailable"))?;
        let (mut node_cpu, mut node_mem, mut node_total) = (0u64, 0u64, 0u64);
        let mut out = Vec::new();
        let mut live = std::collections::HashSet::new();
        for p in pods
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        {
            let uid = p.metadata.uid.clone().unwrap_or_default();
            let start = p
                .status
                .as_ref()
                .and_then(|s| s.start_time.as_ref())
                .map(|t| time_string(t.0));
            let (mut pc, mut pm, mut pt) = (0u64, 0u64, 0u64);
            let mut containers = Vec::new();
            for c in p.spec.iter().flat_map(|s| s.containers.iter()) {
                let (nano, mem) = usage(c);
                let key = format!("{uid}/{}", c.name);
                let total = cpu.sample(&key, nano, millis);
                live.insert(key);
                pc += nano;
                pm += mem;
                pt += total;
                containers.push(ContainerStats {
                    name: c.name.clone(),
                    start_time: start.clone(),
                    cpu: Some(CpuStats {
                        time: time.clone(),
                        usage_nano_cores: Some(nano),
                        usage_core_nano_seconds: Some(total),
                    }),
                    memory: Some(MemoryStats {
                        time: time.clone(),
                        working_set_bytes: Some(mem),
                        usage_bytes: Some(mem),
                    }),
                });
            }
            node_cpu += pc;
            node_mem += pm;
            node_total += pt;
            out.push(PodStats {
                pod_ref: PodReference {
                    name: p.metadata.name.clone().unwrap_or_default(),
                    namespace: p.metadata.namespace.clone().unwrap_or_default(),
                    uid,
                },
                start_time: start,
                containers,
                cpu: Some(CpuStats {
                    time: time.clone(),
                    usage_nano_cores: Some(pc),
                    usage_core_nano_seconds: Some(pt),
                }),
                memory: Some(MemoryStats {
                    time: time.clone(),
                    working_set_bytes: Some(pm),
                    usage_bytes: Some(pm),
                }),
            });
        }
        cpu.retain(|k| live.contains(k));
        Ok(Summary {
            node: NodeStats {
                node_name: self.node.clone(),
                start_time: Some(self.started.clone()),
                cpu: Some(CpuStats {
                    time: time.clone(),
                    usage_nano_cores: Some(node_cpu),
                    usage_core_nano_seconds: Some(node_total),
                }),
                memory: Some(MemoryStats {
                    time,
                    working_set_bytes: Some(node_mem),
                    usage_bytes: Some(node_mem),
                }),
            },
            pods: out,
        })
    }
}
