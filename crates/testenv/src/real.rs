//! Real control planes from binaries (the envtest pattern): when `TENSILE_K8S_BIN` names a
//! folder holding `etcd`, `kube-apiserver`, `kube-scheduler` and `kube-controller-manager`,
//! each cluster of a `TestEnv` runs them on loopback with its own CA, certificates, ports and
//! data directory, all removed when the cluster is dropped. The API server is configured like
//! kubeadm's (RBAC, a kubelet client certificate in `system:masters`), so what passes here
//! holds for ordinary clusters.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::certs::{Ca, CertError};
use tensile_sim::apiserver::{KubeconfigEntry, kubeconfig};

/// The environment variable naming the binaries folder.
pub const BIN_ENV: &str = "TENSILE_K8S_BIN";

/// Starting a real control plane failed.
#[derive(Debug, thiserror::Error)]
pub enum RealError {
    /// A binary is missing.
    #[error(
        "{binary} not found in {dir} (set {BIN_ENV} to a folder holding etcd, kube-apiserver, kube-scheduler and kube-controller-manager)"
    )]
    Missing {
        /// Which binary.
        binary: &'static str,
        /// Where it was looked for.
        dir: PathBuf,
    },
    /// Files could not be written.
    #[error("writing {path}: {source}")]
    Io {
        /// Which file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A process did not start.
    #[error("starting {binary}: {source}")]
    Spawn {
        /// Which binary.
        binary: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Certificates could not be made.
    #[error(transparent)]
    Cert(#[from] CertError),
    /// The API server did not become ready.
    #[error("kube-apiserver of {cluster} not ready after {seconds} s (logs in {logs})")]
    NotReady {
        /// Which cluster.
        cluster: String,
        /// How long it was given.
        seconds: u64,
        /// Where its logs are.
        logs: String,
    },
}

/// A running real control plane; its processes are killed and its files removed on drop.
#[derive(Debug)]
pub struct RealCluster {
    /// Kubeconfig text (admin, client certificate).
    pub kubeconfig: String,
    /// The same as one kubeconfig entry (administrator, client certificate).
    pub entry: KubeconfigEntry,
    /// Where its API server listens.
    pub api_addr: std::net::SocketAddr,
    /// The cluster CA certificate (PEM).
    pub ca_pem: String,
    /// The folder holding its files and logs.
    pub dir: PathBuf,
    // std's processes, not tokio's: a cluster may be dropped outside any runtime (a `#[test]`
    // that owns its runtime drops the env after it), and tokio's need its reactor to die.
    children: std::sync::Mutex<Vec<Child>>,
    scheduler: Option<SchedulerRun>,
    /// How etcd and kube-apiserver were started, to kill and start them again as they were.
    etcd: Option<Restartable>,
    apiserver: Option<Restartable>,
    /// Set when it failed to start: its logs say why.
    keep_files: bool,
    /// The cluster CA (what an administrator issues client certificates with).
    pub(crate) ca: Ca,
}

impl Drop for RealCluster {
    fn drop(&mut self) {
        let children = match self.children.get_mut() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        for c in children.iter_mut() {
            let _ = c.kill();
        }
        for c in children.iter_mut() {
            let _ = c.wait();
        }
        // A failing test keeps the control plane's logs for whoever reads its output.
        if std::thread::panicking() || self.keep_files {
            tracing::warn!(dir = %self.dir.display(), "test failed: control-plane logs kept");
            #[allow(clippy::print_stderr)] // the one place a failed test's reader will look
            {
                eprintln!("control-plane logs kept in {}", self.dir.display());
            }
            return;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The audit log of node identities' requests, in the control plane's folder.
const AUDIT_LOG: &str = "audit-nodes.log";

impl RealCluster {
    /// The cluster CA (what signs its certificates and verifies its clients').
    pub fn ca(&self) -> &Ca {
        &self.ca
    }

    /// Every request of a node identity (group `system:nodes`) the API server refused (403)
    /// and never allowed afterwards, from its audit log: user, verb, URI and the reason.
    ///
    /// The Node authorizer learns that a pod is bound to a node from its own informer, so a
    /// node that reads a new pod's Secret or claim before that informer caught up is refused
    /// once ("no relationship found"), as a real kubelet is, and reads it on its retry. A
    /// refusal about an object (resource, namespace, name; a list's or watch's
    /// `metadata.name` field selector names it) that the same user was later allowed to read
    /// is that race, not a permission the node lacks, and is left out.
    pub fn refused_node_requests(&self) -> Vec<String> {
        let text = std::fs::read_to_string(self.dir.join(AUDIT_LOG)).unwrap_or_default();
        let events: Vec<serde_json::Value> = text
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect();
        let object = |e: &serde_json::Value| {
            let r = &e["objectRef"];
            let named = r["name"].as_str().map(str::to_owned).or_else(|| {
                let uri = e["requestURI"].as_str()?;
                let selector = uri
                    .split(['?', '&'])
                    .find_map(|p| p.strip_prefix("fieldSelector="))?;
                let decoded = selector.replace("%3D", "=").replace("%3d", "=");
                decoded.strip_prefix("metadata.name=").map(str::to_owned)
            });
            (
                e["user"]["username"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                r["resource"].as_str().unwrap_or_default().to_owned(),
                r["subresource"].as_str().unwrap_or_default().to_owned(),
                r["namespace"].as_str().unwrap_or_default().to_owned(),
                named,
            )
        };
        let reads = ["get", "list", "watch"];
        events
            .iter()
            .enumerate()
            .filter(|(_, e)| e["responseStatus"]["code"] == 403)
            .filter(|(i, e)| {
                let key = object(e);
                let read = reads.contains(&e["verb"].as_str().unwrap_or_default());
                let allowed_later = read
                    && key.4.is_some()
                    && events.iter().skip(i + 1).any(|later| {
                        reads.contains(&later["verb"].as_str().unwrap_or_default())
                            && later["responseStatus"]["code"]
                                .as_i64()
                                .is_some_and(|c| (200..300).contains(&c))
                            && object(later) == key
                    });
                !allowed_later
            })
            .map(|(_, e)| {
                format!(
                    "{} {} {}: {}",
                    e["user"]["username"].as_str().unwrap_or_default(),
                    e["verb"].as_str().unwrap_or_default(),
                    e["requestURI"].as_str().unwrap_or_default(),
                    e["annotations"]["authorization.k8s.io/reason"]
                        .as_str()
                        .or_else(|| e["responseStatus"]["message"].as_str())
                        .unwrap_or_default(),
                )
            })
            .collect()
    }
}

/// The binaries folder, when real control planes are asked for.
pub fn bin_dir() -> Option<PathBuf> {
    std::env::var_os(BIN_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

fn free_port() -> Result<u16, RealError> {
    crate::free_port().map_err(|source| RealError::Io {
        path: "127.0.0.1".into(),
        source,
    })
}

/// A control-plane file. Owner-only, whatever it holds: most are keys or kubeconfigs, and only
/// this user's processes read them.
fn write(dir: &Path, name: &str, text: &str) -> Result<PathBuf, RealError> {
    let path = dir.join(name);
    crate::secret_file::write_secret(&path, text).map_err(|source| RealError::Io {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

fn spawn(
    bin: &Path,
    binary: &'static str,
    args: &[String],
    log: &Path,
) -> Result<Child, RealError> {
    spawn_logging(bin, binary, args, log, false)
}

/// [`spawn`]; with `append`, the log is continued (a restart) rather than started afresh.
fn spawn_logging(
    bin: &Path,
    binary: &'static str,
    args: &[String],
    log: &Path,
    append: bool,
) -> Result<Child, RealError> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(log)
        .map_err(|source| RealError::Io {
            path: log.to_owned(),
            source,
        })?;
    let err = out.try_clone().map_err(|source| RealError::Io {
        path: log.to_owned(),
        source,
    })?;
    Command::new(bin.join(binary))
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|source| RealError::Spawn { binary, source })
}

/// How a real control plane differs from kubeadm's defaults.
#[derive(Clone, Debug, Default)]
pub struct RealOptions {
    /// kube-controller-manager's `--node-monitor-grace-period` (how long a node may go
    /// without renewing its lease before it is marked Unknown); its default when unset.
    pub node_grace: Option<Duration>,
    /// kube-controller-manager's `--cluster-signing-duration` (the life of the certificates
    /// it signs for CertificateSigningRequests); its default (a year) when unset.
    pub signing_duration: Option<Duration>,
    /// Where kube-apiserver listens (its serving certificate names that address too); a free
    /// port on 127.0.0.1 when unset. Port 0: a free port on that address.
    pub api_listen: Option<std::net::SocketAddr>,
    /// kube-scheduler's client rate limit (`clientConnection.qps`, `.burst`), kept across
    /// restarts with configurations that set none; its defaults (50, 100) when unset.
    pub scheduler_client: Option<(f64, u32)>,
}

/// Starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler for `cluster` in a
/// fresh folder under `parent`, as kubeadm would configure them.
pub async fn start(bin: &Path, parent: &Path, cluster: &str) -> Result<RealCluster, RealError> {
    start_with(bin, parent, cluster, &RealOptions::default()).await
}

/// [`start`], with `options`.
pub async fn start_with(
    bin: &Path,
    parent: &Path,
    cluster: &str,
    options: &RealOptions,
) -> Result<RealCluster, RealError> {
    for binary in [
        "etcd",
        "kube-apiserver",
        "kube-scheduler",
        "kube-controller-manager",
    ] {
        if !bin.join(binary).is_file() {
            return Err(RealError::Missing {
                binary,
                dir: bin.to_owned(),
            });
        }
    }
    let dir = parent.join(format!("{cluster}-control-plane"));
    std::fs::create_dir_all(dir.join("etcd")).map_err(|source| RealError::Io {
        path: dir.clone(),
        source,
    })?;
    let ca = Ca::new(&format!("{cluster}-ca"))?;
    let api_ip = options
        .api_listen
        .map_or(std::net::IpAddr::from([127, 0, 0, 1]), |a| a.ip());
    let serving = ca.issue_server(
        "kube-apiserver",
        &[
            api_ip.to_string(),
            "127.0.0.1".into(),
            "localhost".into(),
            crate::real_node::KUBERNETES_SERVICE.to_string(),
            "kubernetes".into(),
            "kubernetes.default".into(),
            "kubernetes.default.svc".into(),
        ],
    )?;
    let admin = ca.issue_client("kubernetes-admin", Some("system:masters"))?;
    let kubelet_client =
        ca.issue_client("kube-apiserver-kubelet-client", Some("system:masters"))?;
    // What the aggregator presents to extension API servers (metrics-server), as kubeadm's
    // front-proxy-client; signed by the cluster CA here rather than a second CA.
    let front_proxy = ca.issue_client("front-proxy-client", None)?;
    let sa = rcgen::KeyPair::generate().map_err(|e| CertError::Generate {
        what: "service account key".into(),
        source: e,
    })?;
    let ca_key = ca.key_pem();
    let f = |name: &str, text: &str| write(&dir, name, text);
    let ca_crt = f("ca.crt", ca.cert_pem())?;
    let ca_key_file = f("ca.key", &ca_key)?;
    let tls_crt = f("apiserver.crt", &serving.cert_pem)?;
    let tls_key = f("apiserver.key", &serving.key_pem)?;
    let kc_crt = f("kubelet-client.crt", &kubelet_client.cert_pem)?;
    let kc_key = f("kubelet-client.key", &kubelet_client.key_pem)?;
    let fp_crt = f("front-proxy-client.crt", &front_proxy.cert_pem)?;
    let fp_key = f("front-proxy-client.key", &front_proxy.key_pem)?;
    let sa_key = f("sa.key", &sa.serialize_pem())?;
    let sa_pub = f("sa.pub", &sa.public_key_pem())?;
    // Node identities' requests (users of group system:nodes) go to an audit log, so a test can
    // list what the Node authorizer and NodeRestriction refused them; nobody else's.
    let audit_policy = f(
        "audit-policy.yaml",
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n  \
         - level: Metadata\n    userGroups: [\"system:nodes\"]\n  - level: None\n",
    )?;
    let audit_log = dir.join(AUDIT_LOG);
    let fixed_api_port = options.api_listen.map(|a| a.port()).filter(|p| *p != 0);
    let s = |p: &Path| p.display().to_string();
    // Made before the first process starts, so a failure part-way kills what did start; its
    // address and kubeconfig are set once kube-apiserver listens (its port may change).
    let mut cluster_handle = RealCluster {
        kubeconfig: String::new(),
        entry: KubeconfigEntry {
            context: cluster.to_owned(),
            server: String::new(),
            ca_pem: ca.cert_pem().to_owned(),
            client: Some(admin),
            token: None,
        },
        api_addr: std::net::SocketAddr::new(api_ip, 0),
        ca_pem: ca.cert_pem().to_owned(),
        children: std::sync::Mutex::new(Vec::new()),
        scheduler: None,
        etcd: None,
        apiserver: None,
        keep_files: false,
        dir: dir.clone(),
        ca,
    };
    let loopback = std::net::IpAddr::from([127, 0, 0, 1]);
    let etcd_dir = dir.join("etcd");
    let etcd_log = dir.join("etcd.log");
    let etcd = spawn_listening(bin, "etcd", &etcd_log, loopback, None, |[client, peer]| {
        let client = format!("http://127.0.0.1:{client}");
        let peer = format!("http://127.0.0.1:{peer}");
        vec![
            format!("--data-dir={}", s(&etcd_dir)),
            "--name=default".into(),
            format!("--listen-client-urls={client}"),
            format!("--advertise-client-urls={client}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster=default={peer}"),
            "--unsafe-no-fsync".into(),
        ]
    })
    .await;
    let etcd = match etcd {
        Ok(started) => started,
        Err(e) => {
            cluster_handle.keep_files = true;
            return Err(e);
        }
    };
    let etcd_url = format!("http://127.0.0.1:{}", etcd.ports[0]);
    cluster_handle.push(etcd.child);
    cluster_handle.etcd = Some(Restartable {
        bin: bin.to_owned(),
        binary: "etcd",
        args: etcd.args,
        log: etcd_log,
        index: cluster_handle.child_count() - 1,
    });
    // An address to bind to may be "any"; the one advertised (to the cluster's own
    // endpoints) and probed must be one address.
    let advertised = if api_ip.is_unspecified() {
        loopback
    } else {
        api_ip
    };
    let apiserver_log = dir.join("kube-apiserver.log");
    let apiserver = spawn_listening(
        bin,
        "kube-apiserver",
        &apiserver_log,
        advertised,
        fixed_api_port.map(|p| [p]),
        |[api_port]| {
            vec![
                format!("--etcd-servers={etcd_url}"),
                format!("--secure-port={api_port}"),
                format!("--bind-address={api_ip}"),
                format!("--advertise-address={advertised}"),
                format!("--tls-cert-file={}", s(&tls_crt)),
                format!("--tls-private-key-file={}", s(&tls_key)),
                format!("--client-ca-file={}", s(&ca_crt)),
                format!("--kubelet-client-certificate={}", s(&kc_crt)),
                format!("--kubelet-client-key={}", s(&kc_key)),
                format!("--service-account-key-file={}", s(&sa_pub)),
                format!("--service-account-signing-key-file={}", s(&sa_key)),
                "--service-account-issuer=https://kubernetes.default.svc".into(),
                format!(
                    "--service-cluster-ip-range={}",
                    crate::real_node::SERVICE_RANGE
                ),
                "--authorization-mode=Node,RBAC".into(),
                // As kubeadm: kubelets (and virtual nodes) may change only their own Node,
                // Lease and pods.
                "--enable-admission-plugins=NodeRestriction".into(),
                format!("--audit-policy-file={}", s(&audit_policy)),
                format!("--audit-log-path={}", s(&audit_log)),
                "--allow-privileged=true".into(),
                // Simulated nodes have no resolvable host name: reach kubelets by address
                // first, as kubeadm clusters are usually set up.
                "--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname".into(),
                // The aggregation layer, for metrics-server; routed to its endpoint directly,
                // as there is no kube-proxy to reach a ClusterIP.
                format!("--requestheader-client-ca-file={}", s(&ca_crt)),
                "--requestheader-allowed-names=front-proxy-client".into(),
                "--requestheader-username-headers=X-Remote-User".into(),
                "--requestheader-group-headers=X-Remote-Group".into(),
                "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
                format!("--proxy-client-cert-file={}", s(&fp_crt)),
                format!("--proxy-client-key-file={}", s(&fp_key)),
                "--enable-aggregator-routing=true".into(),
                // About a tenth of a test cluster's start-up CPU; the tests never depend on
                // API priority and fairness (max-requests-inflight still applies).
                "--enable-priority-and-fairness=false".into(),
            ]
        },
    )
    .await;
    let apiserver = match apiserver {
        Ok(started) => started,
        Err(e) => {
            cluster_handle.keep_files = true;
            return Err(e);
        }
    };
    let api_addr = std::net::SocketAddr::new(api_ip, apiserver.ports[0]);
    cluster_handle.push(apiserver.child);
    cluster_handle.apiserver = Some(Restartable {
        bin: bin.to_owned(),
        binary: "kube-apiserver",
        args: apiserver.args,
        log: apiserver_log,
        index: cluster_handle.child_count() - 1,
    });
    cluster_handle.api_addr = api_addr;
    cluster_handle.entry.server = format!("https://{api_addr}");
    let config = kubeconfig(std::slice::from_ref(&cluster_handle.entry));
    cluster_handle.kubeconfig = config.clone();
    let kubeconfig_file = f("admin.kubeconfig", &config)?;
    // kube-controller-manager gives up (and exits) when the API server is not healthy within
    // its own short wait, which a busy machine can exceed: it starts once /readyz answers.
    if let Err(e) = wait_ready(&config, api_addr, cluster, &dir, false).await {
        cluster_handle.keep_files = true;
        return Err(e);
    }
    cluster_handle.push(spawn(
        bin,
        "kube-controller-manager",
        &[
            format!("--kubeconfig={}", s(&kubeconfig_file)),
            "--leader-elect=false".into(),
            format!("--service-account-private-key-file={}", s(&sa_key)),
            format!("--root-ca-file={}", s(&ca_crt)),
            format!("--cluster-signing-cert-file={}", s(&ca_crt)),
            format!("--cluster-signing-key-file={}", s(&ca_key_file)),
            "--use-service-account-credentials=false".into(),
            "--bind-address=127.0.0.1".into(),
            "--secure-port=0".into(),
        ]
        .into_iter()
        .chain(
            options
                .signing_duration
                .map(|d| format!("--cluster-signing-duration={}s", d.as_secs().max(1))),
        )
        .chain(options.node_grace.iter().flat_map(|grace| {
            // The lifecycle controller looks at nodes every monitor period: keep it well
            // under the grace period so the grace is what decides.
            let period = (*grace / 4).max(Duration::from_millis(500));
            [
                format!("--node-monitor-grace-period={}ms", grace.as_millis()),
                format!("--node-monitor-period={}ms", period.as_millis()),
            ]
        }))
        .collect::<Vec<_>>(),
        &dir.join("kube-controller-manager.log"),
    )?);
    let scheduler = start_scheduler(
        bin,
        &dir,
        &kubeconfig_file,
        &serde_json::json!({}),
        options.scheduler_client,
    )
    .await;
    let scheduler = match scheduler {
        Ok((child, _)) => child,
        Err(e) => {
            cluster_handle.keep_files = true;
            return Err(e);
        }
    };
    cluster_handle.push(scheduler);
    cluster_handle.scheduler = Some(SchedulerRun {
        bin: bin.to_owned(),
        kubeconfig: kubeconfig_file.clone(),
        index: cluster_handle.child_count() - 1,
        client: options.scheduler_client,
    });

    if let Err(e) = wait_ready(&config, api_addr, cluster, &dir, true).await {
        cluster_handle.keep_files = true;
        return Err(e);
    }
    if bin.join("metrics-server").is_file() {
        let child = start_metrics_server(bin, &dir, &kubeconfig_file, &config).await?;
        cluster_handle.push(child);
    }
    Ok(cluster_handle)
}

impl RealCluster {
    fn push(&mut self, child: Child) {
        match self.children.get_mut() {
            Ok(c) => c.push(child),
            Err(poisoned) => poisoned.into_inner().push(child),
        }
    }

    fn child_count(&mut self) -> usize {
        match self.children.get_mut() {
            Ok(c) => c.len(),
            Err(poisoned) => poisoned.into_inner().len(),
        }
    }
}

/// How many times a process is started on fresh ports when one it was given was taken.
const PORT_ATTEMPTS: usize = 5;

/// A process listening on the ports it was started with.
struct Listening<const N: usize> {
    child: Child,
    ports: [u16; N],
    args: Vec<String>,
}

/// Starts `binary` with `args(ports)` and waits until it accepts connections on
/// `host:ports[0]`. Ports are found free here, but another process (another test's cluster,
/// an outgoing connection) may take one before the child binds it: a child that exits saying
/// its address is in use is started again on fresh ports. `fixed` ports are the caller's
/// choice and never changed.
async fn spawn_listening<const N: usize>(
    bin: &Path,
    binary: &'static str,
    log: &Path,
    host: std::net::IpAddr,
    fixed: Option<[u16; N]>,
    args: impl Fn([u16; N]) -> Vec<String>,
) -> Result<Listening<N>, RealError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let ports = match fixed {
            Some(ports) => ports,
            None => {
                let mut ports = [0; N];
                for port in &mut ports {
                    *port = free_port()?;
                }
                ports
            }
        };
        let run_args = args(ports);
        let mut child = spawn(bin, binary, &run_args, log)?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(READY_SECONDS);
        let addr = std::net::SocketAddr::new(host, ports[0]);
        let exited = loop {
            if let Ok(Some(status)) = child.try_wait() {
                break status;
            }
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return Ok(Listening {
                    child,
                    ports,
                    args: run_args,
                });
            }
            if tokio::time::Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(RealError::Io {
                    path: log.to_owned(),
                    source: std::io::Error::other(format!(
                        "{binary} not listening on {addr} after {READY_SECONDS} s"
                    )),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let said = std::fs::read_to_string(log).unwrap_or_default();
        if fixed.is_none() && attempt < PORT_ATTEMPTS && said.contains("address already in use") {
            tracing::info!(
                binary,
                ?ports,
                "a port was taken before it bound: fresh ports"
            );
            continue;
        }
        return Err(RealError::Io {
            path: log.to_owned(),
            source: std::io::Error::other(format!("{binary} exited at start: {exited}")),
        });
    }
}

/// Starts metrics-server as a process on the test-host address and registers it the way its
/// manifests do (a Service, here without selector and with an Endpoints object naming the
/// process, and the `v1beta1.metrics.k8s.io` APIService), so `kubectl top` and the metrics API
/// work as on an ordinary cluster. It scrapes kubelets at their InternalIP and node status
/// port with the administrator's client certificate.
async fn start_metrics_server(
    bin: &Path,
    dir: &Path,
    kubeconfig: &Path,
    config: &str,
) -> Result<Child, RealError> {
    let address = super::testhost::address().map_err(|e| RealError::Io {
        path: dir.to_owned(),
        source: std::io::Error::other(e.to_string()),
    })?;
    let port = {
        let l = TcpListener::bind((address, 0)).map_err(|source| RealError::Io {
            path: format!("{address}:0").into(),
            source,
        })?;
        l.local_addr()
            .map(|a| a.port())
            .map_err(|source| RealError::Io {
                path: format!("{address}:0").into(),
                source,
            })?
    };
    let certs = dir.join("metrics-server");
    let kc = kubeconfig.display().to_string();
    let child = spawn(
        bin,
        "metrics-server",
        &[
            format!("--kubeconfig={kc}"),
            format!("--authentication-kubeconfig={kc}"),
            format!("--authorization-kubeconfig={kc}"),
            format!("--bind-address={address}"),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", certs.display()),
            "--kubelet-insecure-tls".into(),
            "--kubelet-preferred-address-types=InternalIP".into(),
            "--kubelet-use-node-status-port".into(),
            "--metric-resolution=10s".into(),
            // Must be shorter than the resolution.
            "--kubelet-request-timeout=5s".into(),
        ],
        &dir.join("metrics-server.log"),
    )?;
    let objects = [
        serde_json::json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "metrics-server", "namespace": "kube-system"},
            "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]}}),
        serde_json::json!({"apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": "metrics-server", "namespace": "kube-system"},
            "subsets": [{"addresses": [{"ip": address.to_string()}],
                "ports": [{"name": "https", "port": port}]}]}),
        serde_json::json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": "v1beta1.metrics.k8s.io"},
            "spec": {"group": "metrics.k8s.io", "version": "v1beta1",
                "service": {"name": "metrics-server", "namespace": "kube-system", "port": 443},
                "insecureSkipTLSVerify": true, "groupPriorityMinimum": 100, "versionPriority": 100}}),
    ];
    let fail = |what: &str, e: &dyn std::fmt::Display| RealError::Io {
        path: dir.to_owned(),
        source: std::io::Error::other(format!("registering metrics-server ({what}): {e}")),
    };
    let register = async {
        let client = tensile_sim::apiserver::client_from_kubeconfig(config)
            .await
            .map_err(|e| fail("client", &e))?;
        for object in objects {
            let mut obj: kube::api::DynamicObject =
                serde_json::from_value(object).map_err(|e| fail("object", &e))?;
            let gvk = obj
                .types
                .as_ref()
                .map(kube::core::GroupVersionKind::try_from)
                .transpose()
                .map_err(|e| fail("kind", &e))?
                .ok_or_else(|| fail("kind", &"missing"))?;
            let (resource, _) = kube::discovery::pinned_kind(&client, &gvk)
                .await
                .map_err(|e| fail(&gvk.kind, &e))?;
            let api: kube::Api<kube::api::DynamicObject> = match obj.metadata.namespace.take() {
                Some(ns) => kube::Api::namespaced_with(client.clone(), &ns, &resource),
                None => kube::Api::all_with(client.clone(), &resource),
            };
            api.create(&kube::api::PostParams::default(), &obj)
                .await
                .map_err(|e| fail(&gvk.kind, &e))?;
        }
        Ok(())
    };
    let mut child = child;
    if let Err(e) = register.await {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    // A flag it refuses ends it at once: say so here rather than with empty metrics later.
    if let Ok(Some(status)) = child.try_wait() {
        return Err(RealError::Io {
            path: dir.join("metrics-server.log"),
            source: std::io::Error::other(format!("metrics-server exited: {status}")),
        });
    }
    Ok(child)
}

/// A control-plane process that a fault may kill and the harness start again, with the same
/// flags, ports and data directory (what a restarted static pod does).
#[derive(Debug)]
struct Restartable {
    bin: PathBuf,
    binary: &'static str,
    args: Vec<String>,
    log: PathBuf,
    /// Its place in `RealCluster::children`.
    index: usize,
}

/// A process of a real control plane that faults can hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    /// etcd (its data directory is kept across a restart).
    Etcd,
    /// kube-apiserver.
    ApiServer,
}

/// How the cluster's kube-scheduler was started, to start it again with another
/// configuration.
#[derive(Debug)]
struct SchedulerRun {
    bin: PathBuf,
    kubeconfig: PathBuf,
    /// Its place in `RealCluster::children`.
    index: usize,
    /// [`RealOptions::scheduler_client`].
    client: Option<(f64, u32)>,
}

/// Starts kube-scheduler with `config`, a KubeSchedulerConfiguration (JSON) whose client
/// kubeconfig and leader election the harness sets (and `client`'s QPS and burst where it sets
/// none), serving /readyz on a free port so a restart can be waited for.
async fn start_scheduler(
    bin: &Path,
    dir: &Path,
    kubeconfig: &Path,
    config: &serde_json::Value,
    client: Option<(f64, u32)>,
) -> Result<(Child, u16), RealError> {
    let mut config = config.clone();
    if !config.is_object() {
        config = serde_json::json!({});
    }
    config["apiVersion"] = "kubescheduler.config.k8s.io/v1".into();
    config["kind"] = "KubeSchedulerConfiguration".into();
    // The caller's client limits (qps, burst) stay; the kubeconfig is the harness's.
    if !config["clientConnection"].is_object() {
        config["clientConnection"] = serde_json::json!({});
    }
    config["clientConnection"]["kubeconfig"] = kubeconfig.display().to_string().into();
    if let Some((qps, burst)) = client
        && config["clientConnection"].get("qps").is_none()
    {
        config["clientConnection"]["qps"] = qps.into();
        config["clientConnection"]["burst"] = burst.into();
    }
    config["leaderElection"] = serde_json::json!({"leaderElect": false});
    // JSON is YAML: kube-scheduler reads it as it is.
    let file = write(dir, "kube-scheduler-config.yaml", &config.to_string())?;
    let started = spawn_listening(
        bin,
        "kube-scheduler",
        &dir.join("kube-scheduler.log"),
        std::net::IpAddr::from([127, 0, 0, 1]),
        None,
        |[port]| {
            vec![
                format!("--config={}", file.display()),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={port}"),
            ]
        },
    )
    .await?;
    Ok((started.child, started.ports[0]))
}

impl RealCluster {
    /// Restarts the cluster's kube-scheduler with `config` (a KubeSchedulerConfiguration as
    /// JSON; its client connection and leader election are the harness's) and waits until it
    /// answers /readyz (it schedules from then on).
    pub async fn restart_scheduler(&self, config: &serde_json::Value) -> Result<(), RealError> {
        let Some(run) = &self.scheduler else {
            return Err(RealError::NotReady {
                cluster: self.entry.context.clone(),
                seconds: 0,
                logs: self.dir.display().to_string(),
            });
        };
        let log = self.dir.join("kube-scheduler.log");
        let poisoned = || RealError::Io {
            path: log.clone(),
            source: std::io::Error::other("a previous restart panicked"),
        };
        {
            let mut children = self.children.lock().map_err(|_| poisoned())?;
            if let Some(old) = children.get_mut(run.index) {
                let _ = old.kill();
                let _ = old.wait();
            }
        }
        let (new, port) =
            start_scheduler(&run.bin, &self.dir, &run.kubeconfig, config, run.client).await?;
        {
            let mut children = self.children.lock().map_err(|_| poisoned())?;
            if let Some(slot) = children.get_mut(run.index) {
                *slot = new;
            }
        }
        wait_scheduling(port, &self.entry.context, &self.dir).await
    }
}

impl RealCluster {
    fn restartable(&self, component: Component) -> Result<&Restartable, RealError> {
        match component {
            Component::Etcd => self.etcd.as_ref(),
            Component::ApiServer => self.apiserver.as_ref(),
        }
        .ok_or_else(|| RealError::Io {
            path: self.dir.clone(),
            source: std::io::Error::other(format!("{component:?} was not started")),
        })
    }

    fn with_child<T>(
        &self,
        component: Component,
        f: impl FnOnce(&Restartable, &mut Child) -> Result<T, RealError>,
    ) -> Result<T, RealError> {
        let run = self.restartable(component)?;
        let mut children = self.children.lock().map_err(|_| RealError::Io {
            path: run.log.clone(),
            source: std::io::Error::other("a previous restart panicked"),
        })?;
        let child = children.get_mut(run.index).ok_or_else(|| RealError::Io {
            path: run.log.clone(),
            source: std::io::Error::other("no such process"),
        })?;
        f(run, child)
    }

    /// Kills `component` with SIGKILL and reaps it; [`RealCluster::start_again`] brings it
    /// back.
    pub fn kill(&self, component: Component) -> Result<(), RealError> {
        self.with_child(component, |run, child| {
            let io = |source| RealError::Io {
                path: run.log.clone(),
                source,
            };
            child.kill().map_err(io)?;
            child.wait().map_err(io)?;
            Ok(())
        })
    }

    /// Starts `component` again as it was first started (same flags, ports and data
    /// directory; its log continued), after [`RealCluster::kill`]. It is not waited for:
    /// [`RealCluster::wait_serving`] does.
    pub fn start_again(&self, component: Component) -> Result<(), RealError> {
        self.with_child(component, |run, child| {
            *child = spawn_logging(&run.bin, run.binary, &run.args, &run.log, true)?;
            Ok(())
        })
    }

    /// Sends SIGSTOP (`stopped`) or SIGCONT to `component`: a process that hangs, its
    /// connections open and its port accepting, answering nothing.
    pub fn set_stopped(&self, component: Component, stopped: bool) -> Result<(), RealError> {
        self.with_child(component, |run, child| {
            let io = |source| RealError::Io {
                path: run.log.clone(),
                source,
            };
            let signal = if stopped { "-STOP" } else { "-CONT" };
            // The coreutils/shell `kill`: signals other than SIGKILL need libc otherwise.
            let status = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status()
                .map_err(io)?;
            if status.success() {
                Ok(())
            } else {
                Err(io(std::io::Error::other(format!(
                    "kill {signal}: {status}"
                ))))
            }
        })
    }

    /// Compacts etcd to its current revision at once and for good (what kube-apiserver does
    /// every 5 minutes): nothing older can be read or watched from any more. Answers that
    /// revision. Through etcd's JSON gateway, so no etcdctl is needed.
    pub async fn compact_etcd(&self) -> Result<i64, RealError> {
        let run = self.restartable(Component::Etcd)?;
        let io = |source| RealError::Io {
            path: run.log.clone(),
            source,
        };
        let addr: std::net::SocketAddr = run
            .args
            .iter()
            .find_map(|a| a.strip_prefix("--advertise-client-urls=http://"))
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| {
                io(std::io::Error::other(
                    "etcd was started without a client URL",
                ))
            })?;
        // Any key: the answer's header carries the store's revision.
        let range = etcd_post(addr, "/v3/kv/range", r#"{"key":"AA=="}"#.to_owned())
            .await
            .map_err(io)?;
        let revision: i64 = range["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .ok_or_else(|| io(std::io::Error::other(format!("no revision in {range}"))))?;
        let body = serde_json::json!({"revision": revision.to_string(), "physical": true});
        etcd_post(addr, "/v3/kv/compaction", body.to_string())
            .await
            .map_err(io)?;
        Ok(revision)
    }

    /// Waits until kube-apiserver answers /readyz (its storage reachable).
    pub async fn wait_serving(&self) -> Result<(), RealError> {
        wait_ready(
            &self.kubeconfig,
            self.api_addr,
            &self.entry.context,
            &self.dir,
            false,
        )
        .await
    }
}

/// POSTs `body` (JSON) to etcd's gateway at `addr`, within 30 s: its JSON answer.
async fn etcd_post(
    addr: std::net::SocketAddr,
    path: &str,
    body: String,
) -> std::io::Result<serde_json::Value> {
    use http_body_util::BodyExt as _;
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
                .await
                .map_err(std::io::Error::other)?;
        tokio::spawn(conn);
        let req = http::Request::post(path)
            .header(http::header::HOST, addr.to_string())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .map_err(std::io::Error::other)?;
        let res = send
            .send_request(req)
            .await
            .map_err(std::io::Error::other)?;
        let status = res.status();
        let bytes = res
            .into_body()
            .collect()
            .await
            .map_err(std::io::Error::other)?
            .to_bytes();
        if !status.is_success() {
            return Err(std::io::Error::other(format!(
                "etcd {path}: {status}: {}",
                String::from_utf8_lossy(&bytes)
            )));
        }
        serde_json::from_slice(&bytes).map_err(std::io::Error::other)
    };
    tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .map_err(|_| std::io::Error::other(format!("etcd {path}: no answer within 30 s")))?
}

/// How long a control-plane process may take to become ready. Tests run three real clusters'
/// worth of processes at a time on two cores, and a start-up can take over a minute then.
const READY_SECONDS: u64 = 120;

/// Whether the server at `addr` answers `/readyz` with 200 (anonymously, its certificate not
/// checked). Without a kube client, which logs every failed request as an ERROR: a starting
/// server answers many, and `tensile up` shows its log.
async fn answers_ready(addr: std::net::SocketAddr) -> bool {
    super::https_exchange_unverified(
        addr,
        b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await
    .is_ok_and(|answer| answer.starts_with("HTTP/1.1 200"))
}

/// Waits until kube-scheduler answers /readyz (its informers synced: it schedules from then
/// on). Its serving certificate is self-signed, and /readyz needs no credentials.
async fn wait_scheduling(port: u16, cluster: &str, dir: &Path) -> Result<(), RealError> {
    let seconds = READY_SECONDS;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    loop {
        if answers_ready(addr).await {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(RealError::NotReady {
                cluster: cluster.to_owned(),
                seconds,
                logs: dir.display().to_string(),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until kube-apiserver answers /readyz and, with `service_account`, until the default
/// ServiceAccount exists (kube-controller-manager runs: pods can be created).
async fn wait_ready(
    config: &str,
    addr: std::net::SocketAddr,
    cluster: &str,
    dir: &Path,
    service_account: bool,
) -> Result<(), RealError> {
    let seconds = READY_SECONDS;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
    let not_ready = || RealError::NotReady {
        cluster: cluster.to_owned(),
        seconds,
        logs: dir.display().to_string(),
    };
    let kubeconfig = kube::config::Kubeconfig::from_yaml(config).map_err(|_| not_ready())?;
    loop {
        // First without a client (see `answers_ready`).
        if !answers_ready(addr).await {
            if tokio::time::Instant::now() >= deadline {
                return Err(not_ready());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
            continue;
        }
        let client =
            match kube::Config::from_custom_kubeconfig(kubeconfig.clone(), &Default::default())
                .await
            {
                Ok(c) => kube::Client::try_from(c).ok(),
                Err(_) => None,
            };
        if let Some(client) = client {
            let req = http::Request::get("/readyz").body(Vec::new());
            // The default ServiceAccount must exist before pods can be created.
            let sa = kube::Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(
                client.clone(),
                "default",
            );
            if let Ok(req) = req
                && client.request_text(req).await.is_ok()
                && (!service_account || sa.get_opt("default").await.ok().flatten().is_some())
            {
                return Ok(());
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(not_ready());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_folder_without_the_binaries_is_a_clear_error() {
        let dir = std::env::temp_dir().join(format!("tensile-real-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let err = start(&dir, &dir, "c1").await.unwrap_err();
        assert!(
            matches!(err, RealError::Missing { binary: "etcd", .. }),
            "{err}"
        );
        assert!(err.to_string().contains("TENSILE_K8S_BIN"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A folder holding `name`, a shell script with `body`.
    fn script(test: &str, name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("tensile-real-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        dir
    }

    #[tokio::test]
    async fn a_process_whose_port_was_taken_starts_again_on_fresh_ports() {
        // The first run finds its port taken, as etcd does when another process binds it
        // first; the second writes the port it was given, and this test listens there for it.
        let dir = script(
            "taken",
            "fake",
            "if [ ! -e \"$0.ran\" ]; then touch \"$0.ran\"; \
             echo 'listen tcp 127.0.0.1:1: bind: address already in use'; exit 1; fi\n\
             echo \"$1\" > \"$0.port\"; exec sleep 60",
        );
        let loopback = std::net::IpAddr::from([127, 0, 0, 1]);
        let log = dir.join("fake.log");
        let port_file = dir.join("fake.port");
        let listen = async {
            let port = loop {
                if let Some(port) = std::fs::read_to_string(&port_file)
                    .ok()
                    .and_then(|p| p.trim().parse::<u16>().ok())
                {
                    break port;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            tokio::net::TcpListener::bind((loopback, port))
                .await
                .unwrap()
        };
        let start = spawn_listening(&dir, "fake", &log, loopback, None, |[port]| {
            vec![port.to_string()]
        });
        let (started, _listener) = tokio::join!(start, listen);
        let mut started = started.unwrap();
        let first_ports = std::fs::read_to_string(&port_file).unwrap();
        assert_eq!(first_ports.trim(), started.ports[0].to_string());
        assert_eq!(started.args, vec![started.ports[0].to_string()]);
        started.child.kill().unwrap();
        started.child.wait().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_process_that_exits_for_another_reason_or_on_a_fixed_port_is_an_error_at_once() {
        let dir = script(
            "exits",
            "fake",
            "echo 'bind: address already in use'; echo \"$1\" >> \"$0.runs\"; exit 3",
        );
        let loopback = std::net::IpAddr::from([127, 0, 0, 1]);
        let log = dir.join("fake.log");
        let err = spawn_listening(&dir, "fake", &log, loopback, Some([1]), |[port]| {
            vec![port.to_string()]
        })
        .await
        .err()
        .unwrap();
        assert!(err.to_string().contains("fake exited at start"), "{err}");
        let runs = std::fs::read_to_string(dir.join("fake.runs")).unwrap();
        assert_eq!(
            runs.lines().count(),
            1,
            "a fixed port is never changed: {runs}"
        );

        let _ = std::fs::remove_dir_all(&dir);
        let dir = script("refuses", "fake", "echo 'unknown flag'; exit 2");
        let log = dir.join("fake.log");
        let err = spawn_listening(&dir, "fake", &log, loopback, None, |[port]| {
            vec![port.to_string()]
        })
        .await
        .err()
        .unwrap();
        assert!(err.to_string().contains("exited at start"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
