//! `tensile virtual-node`: one lower cluster as one node of the upper cluster. Accepts the
//! original tensile-kube's flags and environment variables (its own and those node-cli gave it)
//! so its manifests run unchanged; flags that mean nothing here are accepted with a warning.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use prometheus_client::registry::Registry;
use tensile_core::identity::UpperApi;
use tensile_core::node::{
    NodeIdentity, kubelet_port, node_taint, parse_controllers, parse_node_label,
    parse_service_filter,
};
use tensile_core::translate::TranslateConfig;
use tensile_node::clients::{UpperClients, client_with_token};
use tensile_node::node::NodeLoop;
use tensile_node::pods::PodSettings;
use tensile_node::{ClientCa, KubeletApi, Metrics, VirtualNode};
use tensile_runtime::clients::{
    ApiCalls, KubeconfigSource, build_client, build_client_with_server, load_config,
    override_server,
};
use tensile_runtime::leader::LeaderGauge;
use tokio_util::sync::CancellationToken;

/// `--pod-identity`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PodIdentity {
    /// The upper cluster's.
    Upper,
    /// The lower cluster's.
    Lower,
}

/// Flags of `tensile virtual-node` (the original's names and defaults).
#[derive(Debug, clap::Args)]
#[allow(clippy::struct_excessive_bools)]
pub struct VirtualNodeArgs {
    /// Kubeconfig of the lower cluster (required; an unreadable file is an error, never a
    /// fall-back to another cluster).
    #[arg(long)]
    client_kubeconfig: Option<PathBuf>,
    /// QPS of the lower-cluster client (0: no client-side limit).
    #[arg(long, default_value_t = tensile_runtime::clients::DEFAULT_QPS)]
    client_qps: f32,
    /// Burst of the lower-cluster client (0: twice the QPS).
    #[arg(long, default_value_t = tensile_runtime::clients::DEFAULT_BURST)]
    client_burst: u32,
    /// Pod labels removed from lower pods (recorded in `tripped-labels`).
    #[arg(long, default_value = tensile_core::keys::DEFAULT_IGNORE_LABELS)]
    ignore_labels: String,
    /// Extra controllers (`PVControllers`, `ServiceControllers`).
    #[arg(long, default_value = "PVControllers,ServiceControllers")]
    enable_controllers: String,
    /// Namespaces whose Services are not mirrored to the lower cluster (comma list).
    #[arg(long, default_value = tensile_core::keys::NAMESPACE_KUBE_SYSTEM)]
    service_exclude_namespaces: String,
    /// Services not mirrored to the lower cluster (comma list of namespace/name).
    #[arg(long, default_value = "default/kubernetes")]
    service_exclude: String,
    /// With `ServiceControllers`: answer on the node ports of NodePort and LoadBalancer Services
    /// at the node's InternalIP (`VKUBELET_POD_IP`) and forward to their backends, as
    /// kube-proxy does on every node (docs/virtual-node.md, "Node ports").
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    node_ports: bool,
    /// Create ServiceAccounts in the lower cluster for the pods that use them.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    enable_serviceaccount: bool,
    /// Accepted for compatibility; the log level is set with RUST_LOG.
    #[arg(long, default_value = "info")]
    log_level: String,
    /// Kubeconfig of the upper cluster.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Name of the virtual node.
    #[arg(long, env = "DEFAULTNODE_NAME", default_value = "virtual-kubelet")]
    nodename: String,
    /// Provider (only `k8s`).
    #[arg(long, default_value = "k8s")]
    provider: String,
    /// Ignored (kept for compatibility).
    #[arg(long)]
    provider_config: Option<String>,
    /// Restrict the upper pods to one namespace (not supported: a warning).
    #[arg(long, default_value = "")]
    namespace: String,
    /// Ignored (kept for compatibility).
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    /// `Linux` or `Windows`; the node is reported as linux.
    #[arg(long, default_value = "Linux")]
    os: String,
    /// Plain-HTTP listener (`host:port` or `:port`) for Prometheus `/metrics`, `/healthz` and
    /// `/readyz` (the stats summary is on the kubelet port, with credentials).
    #[arg(long, default_value = "")]
    metrics_addr: String,
    /// Taint key (deprecated in node-cli; `VKUBELET_TAINT_KEY`).
    #[arg(long, env = "VKUBELET_TAINT_KEY")]
    taint: Option<String>,
    /// Do not taint the node.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    disable_taint: bool,
    /// Pod-sync workers: each carries one reconcile at a time, and beside a pod creation
    /// (up to three writes in series) one status to write up.
    #[arg(long, default_value_t = 50)]
    pod_sync_workers: usize,
    /// Always true: the lease is how the upper cluster knows the node is alive.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    enable_node_lease: bool,
    /// Ignored: we never re-list.
    #[arg(long, default_value = "1m")]
    full_resync_period: String,
    /// Ignored (kept for compatibility).
    #[arg(long, default_value = "0")]
    startup_timeout: String,
    /// QPS of the upper client (0: no client-side limit; the original's 0 meant client-go's 5).
    #[arg(long, default_value_t = tensile_runtime::clients::DEFAULT_QPS)]
    kube_api_qps: f32,
    /// Burst of the upper client (0: twice the QPS).
    #[arg(long, default_value_t = tensile_runtime::clients::DEFAULT_BURST)]
    kube_api_burst: u32,
    /// CA of client certificates on the kubelet port (default: the upper cluster's CA).
    #[arg(long, env = "APISERVER_CA_CERT_LOCATION")]
    client_verify_ca: Option<PathBuf>,
    /// Turn the kubelet API's authentication and authorization OFF.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    no_verify_clients: bool,
    /// Bearer tokens through TokenReview on the kubelet port; false: only client certificates.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    authentication_token_webhook: bool,
    /// How long TokenReview answers are cached, authenticated or not (kubelet default 2m).
    #[arg(long)]
    authentication_token_webhook_cache_ttl: Option<String>,
    /// How long allowed SubjectAccessReview answers are cached (kubelet default 5m).
    #[arg(long)]
    authorization_webhook_cache_authorized_ttl: Option<String>,
    /// How long denied SubjectAccessReview answers are cached (kubelet default 30s).
    #[arg(long)]
    authorization_webhook_cache_unauthorized_ttl: Option<String>,
    /// Accepted for compatibility; the log level is set with RUST_LOG.
    #[arg(long = "klog.v")]
    klog_v: Option<u8>,
    /// Accepted for compatibility.
    #[arg(long = "klog.logtostderr", num_args = 0..=1, default_missing_value = "true")]
    klog_logtostderr: Option<String>,
    /// Accepted for compatibility.
    #[arg(long = "klog.alsologtostderr", num_args = 0..=1, default_missing_value = "true")]
    klog_alsologtostderr: Option<String>,
    /// Accepted for compatibility.
    #[arg(long = "klog.vmodule")]
    klog_vmodule: Option<String>,
    /// Owner id written on lower objects (default: the node name). Give each virtual node of
    /// every upper cluster sharing a lower cluster its own.
    #[arg(long)]
    owner_id: Option<String>,
    /// Report NotReady after the lower cluster has been unreachable this many seconds (default:
    /// never; the node stays Ready, tainted NoSchedule, so nothing is evicted).
    #[arg(long)]
    not_ready_after_seconds: Option<u64>,
    /// Whose Kubernetes API offloaded pods see: `upper` gives them ServiceAccount tokens the
    /// upper cluster issued for the upper pod, its CA and KUBERNETES_SERVICE_HOST/PORT;
    /// `lower` drops the upper tokens and lets the lower cluster mount its own (the original).
    #[arg(long, value_enum, default_value = "upper")]
    pod_identity: PodIdentity,
    /// The upper API server as offloaded pods reach it (host:port, [IPv6]:port or an https URL),
    /// for KUBERNETES_SERVICE_HOST/PORT (default: the server of the upper kubeconfig).
    #[arg(long)]
    upper_api_address: Option<String>,
    /// Address of the kubelet API (the port comes from KUBELET_PORT).
    #[arg(long, default_value = "0.0.0.0")]
    kubelet_address: IpAddr,
    /// The lower cluster's name in events, conditions and errors (default: the current
    /// context of --client-kubeconfig).
    #[arg(long)]
    lower_cluster_name: Option<String>,
    /// Run upstairs as `system:node:<nodename>` in `system:nodes`, like a kubelet: the upper
    /// credential (--kubeconfig, or the pod's ServiceAccount) only asks for a client
    /// certificate (a CertificateSigningRequest for the kubernetes.io/kube-apiserver-client-kubelet
    /// signer), which is then used for everything but leader election, and asked for again
    /// before it expires.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    tls_bootstrap: bool,
    /// The upper Secret holding --client-kubeconfig (`[namespace/]name`; namespace default
    /// $POD_NAMESPACE, else kube-system). When the lower credential is a ServiceAccount token
    /// with an expiry, the node renews it and writes the renewed kubeconfig back here, with the
    /// pod's ServiceAccount (upper credential), so a restarted node starts with a valid token.
    #[arg(long, env = "LOWER_KUBECONFIG_SECRET")]
    lower_kubeconfig_secret: Option<String>,
    /// Renew the lower token this long after it was issued (Go duration), when sooner than the
    /// default, four fifths of its life. For seeing renewals early (tests, drills).
    #[arg(long, value_parser = tensile_core::duration::parse_duration)]
    lower_token_renew_after: Option<Duration>,
    #[command(flatten)]
    leader: crate::common::LeaderElectArgs,
}

/// Where `--lower-kubeconfig-secret` points: (namespace, name).
fn secret_ref(text: &str, default_namespace: &str) -> anyhow::Result<(String, String)> {
    let (ns, name) = match text.trim().split_once('/') {
        Some((ns, name)) => (ns.to_owned(), name.to_owned()),
        None => (default_namespace.to_owned(), text.trim().to_owned()),
    };
    if ns.is_empty() || name.is_empty() || name.contains('/') {
        bail!("--lower-kubeconfig-secret {text:?}: expected [namespace/]name");
    }
    Ok((ns, name))
}

/// The lower cluster's name in messages: `--lower-cluster-name`, else the current context of
/// its kubeconfig, else `lower`.
fn lower_cluster_name(args: &VirtualNodeArgs, source: &KubeconfigSource) -> String {
    let context = match source {
        KubeconfigSource::Path(p) => kube::config::Kubeconfig::read_from(p).ok(),
        KubeconfigSource::Text(t) => kube::config::Kubeconfig::from_yaml(t).ok(),
        KubeconfigSource::InCluster | KubeconfigSource::Loaded(_) => None,
    }
    .and_then(|k| k.current_context)
    .filter(|c| !c.is_empty());
    args.lower_cluster_name
        .clone()
        .filter(|n| !n.is_empty())
        .or(context)
        .unwrap_or_else(|| "lower".to_owned())
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn read(path: &PathBuf, what: &str) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {what} {}", path.display()))
}

pub async fn run(args: VirtualNodeArgs) -> anyhow::Result<()> {
    if args.provider != "k8s" {
        bail!("unknown provider {:?}: only k8s", args.provider);
    }
    if !matches!(args.os.as_str(), "Linux" | "Windows") {
        bail!("invalid --os {:?}: must be Linux or Windows", args.os);
    }
    for (set, flag) in [
        (args.provider_config.is_some(), "--provider-config"),
        (!args.namespace.is_empty(), "--namespace"),
        (!args.enable_node_lease, "--enable-node-lease=false"),
        (args.log_level != "info", "--log-level (use RUST_LOG)"),
        (args.klog_v.is_some(), "--klog.v (use RUST_LOG)"),
        (args.full_resync_period != "1m", "--full-resync-period"),
        (args.cluster_domain != "cluster.local", "--cluster-domain"),
        (args.startup_timeout != "0", "--startup-timeout"),
    ] {
        if set {
            tracing::warn!(
                "{flag} is accepted for compatibility but has no effect in this version"
            );
        }
    }
    let Some(lower_path) = args.client_kubeconfig.clone() else {
        bail!("--client-kubeconfig is required: the kubeconfig of the lower cluster");
    };
    let upper_source = crate::common::upper_source(args.kubeconfig.as_ref());
    // A standby builds nothing and writes nothing until it leads; the leader's kubelet API,
    // node addresses and daemon endpoints are then this process's (written at its start).
    let election_client = build_client_with_server(
        upper_source.clone(),
        env("MASTER_URI").as_deref(),
        args.kube_api_qps,
        args.kube_api_burst,
        "upper",
        &ApiCalls::new(&mut Registry::default()),
    )
    .await
    .context("upper cluster client for leader election")?;
    // A standby answers its probes on --metrics-addr (`/readyz` 503) until it leads; the
    // node's own listener then takes the port over.
    // It reports `tensile_leader` 0 meanwhile, so that "no replica leads" can be told.
    let lease = args
        .leader
        .lease(&format!("tensile-virtual-node-{}", args.nodename));
    let mut standby_registry = node_registry(&args.nodename);
    let standby_gauge = LeaderGauge::new(&mut standby_registry, &lease);
    let standby_probes = CancellationToken::new();
    let standby_listener = match crate::common::metrics_addr(&args.metrics_addr)? {
        Some(addr) if args.leader.leader_elect => Some(
            tensile_runtime::metrics::serve_probes_joinable(
                addr,
                std::sync::Arc::new(standby_registry),
                tensile_runtime::metrics::Readiness::not_ready(tensile_runtime::leader::STANDBY),
                standby_probes.clone(),
            )
            .await?
            .1,
        ),
        _ => None,
    };
    let leadership = crate::common::lead(
        &args.leader,
        &election_client,
        &format!("tensile-virtual-node-{}", args.nodename),
        &args.nodename,
        &standby_gauge,
    )
    .await?;
    if matches!(leadership, crate::common::Leadership::Stopped) {
        return Ok(());
    }
    let lower_source = KubeconfigSource::Path(lower_path);
    // A lower ServiceAccount token with an expiry (what join stores) is renewed by the node;
    // every lower client of every round sends the one current token.
    let lower_token = {
        let mut config = load_config(&lower_source)
            .await
            .context("the lower kubeconfig")?;
        tensile_node::lower_token::LowerToken::take_from(&mut config)
    };
    let stored_at = args
        .lower_kubeconfig_secret
        .as_deref()
        .filter(|s| !s.trim().is_empty())
        .map(|s| secret_ref(s, &args.leader.leader_elect_resource_namespace))
        .transpose()?;
    if let Some(t) = &lower_token {
        let claims = t.claims();
        tracing::info!(
            account = %format!("{}/{}", claims.namespace, claims.account),
            renew_at = %k8s_openapi::jiff::Timestamp::from_second(
                tensile_core::lower_token::renewal_time(&claims, args.lower_token_renew_after)
            ).map(|t| t.to_string()).unwrap_or_default(),
            "the lower token is renewed by this node"
        );
    }
    let stop = CancellationToken::new();
    let mut standby = Some((standby_probes, standby_listener));
    // Without --tls-bootstrap one round, until stopped. With it, each round runs on a new
    // certificate and ends when that one is due for renewal: the next round asks for a new one
    // and starts the node again on it (it adopts what the previous round left, as a restart).
    let (election, nodename) = (election_client.clone(), args.nodename.clone());
    let round_stop = stop.clone();
    let rounds = async move {
        let (args, stop, election_client) = (&args, round_stop, election);
        loop {
            let (source, renew_at) = if args.tls_bootstrap {
                let cert = tensile_node::bootstrap::request_certificate(
                    &election_client,
                    &args.nodename,
                    tensile_node::bootstrap::SIGN_TIMEOUT,
                    &stop,
                )
                .await?;
                let mut config = load_config(&upper_source).await?;
                if let Some(url) = env("MASTER_URI").filter(|u| !u.trim().is_empty()) {
                    override_server(&mut config, &url)?;
                }
                let renew_at = tensile_core::bootstrap::renewal_time(
                    cert.not_before,
                    cert.not_after,
                    k8s_openapi::jiff::Timestamp::now(),
                );
                tracing::info!(node = %args.nodename, %renew_at, "running as system:node:{} (TLS bootstrap)", args.nodename);
                (
                    KubeconfigSource::Loaded(Box::new(cert.credentials_of(config))),
                    Some(renew_at),
                )
            } else {
                (upper_source.clone(), None)
            };
            let round = stop.child_token();
            let mut vn = assemble(
                args,
                source,
                lower_source.clone(),
                lower_token.as_ref(),
                &env,
                None,
            )
            .await?;
            // This process leads (or runs alone) from here on.
            LeaderGauge::new(&mut vn.metrics.registry, &lease).set_leading();
            let token_metrics = lower_token
                .as_ref()
                .map(|_| tensile_node::lower_token::TokenMetrics::new(&mut vn.metrics.registry));
            let renewal = lower_token
                .clone()
                .zip(token_metrics)
                .map(|(token, metrics)| tensile_node::lower_token::Renewal {
                    token,
                    lower: vn.pods.lower.clone(),
                    lower_name: vn.pods.lower_name.clone(),
                    node: args.nodename.clone(),
                    upper_events: vn.pods.upper_events.clone(),
                    // With the ServiceAccount credential: a node identity may not write Secrets.
                    secret: stored_at.clone().map(|(namespace, name)| {
                        tensile_node::lower_token::StoredKubeconfig {
                            client: election_client.clone(),
                            namespace,
                            name,
                        }
                    }),
                    renew_after: args.lower_token_renew_after,
                    metrics,
                });
            let listen = vn.kubelet.as_ref().map(|k| k.listen);
            if let Some((probes, listener)) = standby.take() {
                probes.cancel();
                if let Some(task) = listener {
                    // Ends once its listener is closed, so the node can bind the same port.
                    let _ = task.await;
                }
            }
            let running = vn
                .start(round.clone())
                .await
                .context("starting the virtual node")?;
            tracing::info!(node = %args.nodename, ?listen, metrics = ?running.metrics_addr, "virtual node running");
            if let Some(renewal) = renewal {
                tokio::spawn(tensile_node::lower_token::run(renewal, round.child_token()));
            }
            let due = async {
                match renew_at {
                    Some(at) => {
                        let wait = at.duration_since(k8s_openapi::jiff::Timestamp::now());
                        tokio::time::sleep(wait.try_into().unwrap_or_default()).await;
                    }
                    None => std::future::pending().await,
                }
            };
            let mut handle = running.handle;
            tokio::select! {
                _ = &mut handle => return Ok::<(), anyhow::Error>(()),
                () = due => {
                    tracing::info!(node = %args.nodename, "client certificate due for renewal: the node restarts on a new one");
                    round.cancel();
                    let _ = handle.await;
                }
            }
            if stop.is_cancelled() {
                return Ok(());
            }
        }
    };
    // A round that fails (a certificate refused, a start that fails) ends the process with
    // its error; otherwise it runs until a shutdown signal.
    let (failed_tx, failed_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        if let Err(e) = rounds.await {
            let _ = failed_tx.send(e);
        }
    });
    tokio::select! {
        Ok(e) = failed_rx => Err(e.context(format!("virtual node {nodename}"))),
        stopped = crate::common::run_until_stopped(
            leadership,
            stop,
            async {
                let _ = task.await;
            },
            Duration::from_secs(10),
        ) => stopped,
    }
}

/// A registry whose every metric carries `node="<nodename>"`: the virtual node it serves
/// names each series, whichever pod or address Prometheus scraped it from.
fn node_registry(nodename: &str) -> Registry {
    let mut registry = Registry::with_labels(std::iter::once((
        std::borrow::Cow::Borrowed("node"),
        std::borrow::Cow::Owned(nodename.to_owned()),
    )));
    crate::heap::register(&mut registry);
    registry
}

/// The CA certificates (PEM) the upper configuration of `source` trusts.
async fn trusted_ca(source: &KubeconfigSource) -> anyhow::Result<String> {
    use base64::Engine as _;
    let config = load_config(source).await?;
    let certs = config
        .root_cert
        .filter(|c| !c.is_empty())
        .context("the upper kubeconfig names no CA: set --client-verify-ca")?;
    let mut pem = String::new();
    for der in certs {
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        pem.push_str("-----BEGIN CERTIFICATE-----\n");
        for line in b64.as_bytes().chunks(64) {
            pem.push_str(&String::from_utf8_lossy(line));
            pem.push('\n');
        }
        pem.push_str("-----END CERTIFICATE-----\n");
    }
    tensile_kubelet::auth::check_ca_pem(&pem).context("the upper kubeconfig's CA")?;
    Ok(pem)
}

/// Whether `PVControllers` is asked for but cannot run: NodeRestriction lets a node identity
/// (`--tls-bootstrap`) write only the status of a claim, never the binding it mirrors up; the
/// node runs without it, which is logged.
fn pv_controllers_refused(args: &VirtualNodeArgs) -> bool {
    let refused = args.tls_bootstrap && parse_controllers(&args.enable_controllers).volumes;
    if refused {
        tracing::warn!(
            "--enable-controllers: PVControllers is off with --tls-bootstrap: NodeRestriction \
             refuses a node the binding of an upper claim (docs/security.md); run the role-based \
             mode for it"
        );
    }
    refused
}

/// The virtual node that `args` describe, its clients built from the two sources. `env` reads the
/// environment variables of the original (`KUBELET_PORT`, `VKUBELET_*`, ...); `kubelet_listen`
/// overrides where the kubelet API listens (port 0 allowed: the bound port is advertised).
pub(crate) async fn assemble(
    args: &VirtualNodeArgs,
    upper_source: KubeconfigSource,
    lower_source: KubeconfigSource,
    lower_token: Option<&tensile_node::lower_token::LowerToken>,
    env: &(dyn Fn(&str) -> Option<String> + Sync),
    kubelet_listen: Option<SocketAddr>,
) -> anyhow::Result<VirtualNode> {
    let metrics_listen = crate::common::metrics_addr(&args.metrics_addr)?;
    let controllers = parse_controllers(&args.enable_controllers);
    for unknown in &controllers.unknown {
        tracing::warn!("--enable-controllers: unknown controller {unknown:?} ignored");
    }
    let services = controllers
        .services
        .then(|| parse_service_filter(&args.service_exclude_namespaces, &args.service_exclude))
        .transpose()?;
    let mut registry = node_registry(&args.nodename);
    let calls = ApiCalls::new(&mut registry);
    let master_uri = env("MASTER_URI");
    let review_ttls = review_ttls(args)?;
    // Each with its own bucket at the same limits: the lease and node status, the kubelet
    // port's reviews and events never wait behind pod sync or each other.
    let UpperClients {
        work: upper,
        events: upper_events,
        heartbeat,
        reviews,
    } = UpperClients::build(
        &upper_source,
        master_uri.as_deref(),
        args.kube_api_qps,
        args.kube_api_burst,
        &calls,
    )
    .await
    .context("upper cluster client")?;
    let upper_api = match args.pod_identity {
        PodIdentity::Lower => None,
        PodIdentity::Upper => Some(match &args.upper_api_address {
            Some(text) => UpperApi::parse(text)?,
            None => {
                let mut config = load_config(&upper_source).await?;
                if let Some(url) = master_uri.as_deref().filter(|u| !u.trim().is_empty()) {
                    override_server(&mut config, url)?;
                }
                UpperApi::parse(&config.cluster_url.to_string()).context(
                    "the upper kubeconfig's server cannot be given to pods; set --upper-api-address",
                )?
            }
        }),
    };
    let lower_name = lower_cluster_name(args, &lower_source);
    let lower = match lower_token {
        None => {
            build_client(
                lower_source,
                args.client_qps,
                args.client_burst,
                tensile_node::node::LOWER,
                &calls,
            )
            .await
        }
        Some(token) => {
            // The kubeconfig's own token is replaced by the shared, renewed one.
            let mut config = load_config(&lower_source).await?;
            config.auth_info.token = None;
            client_with_token(
                config,
                Some(token),
                args.client_qps,
                args.client_burst,
                tensile_node::node::LOWER,
                &calls,
            )
        }
    }
    .context("lower cluster client")?;
    // A lower cluster that does not answer at start is an outage like any other: the node
    // registers, shows it (condition, taint, event) and catches up when it answers; its
    // version is then read by the node loop. Exiting instead made a crash loop of every
    // restart that met the outage.
    let lower_version = match tokio::time::timeout(
        Duration::from_secs(5),
        lower.apiserver_version(),
    )
    .await
    {
        Ok(Ok(v)) => v.git_version,
        // The cause in words (a certificate the kubeconfig's CA does not sign is named as
        // such), not hyper's "client error (Connect)".
        Ok(Err(e)) => {
            tracing::warn!(
                cluster = %lower_name,
                cause = %tensile_node::reach::describe(&e).1,
                "the lower cluster does not answer at start: the node starts and shows it unreachable until it does"
            );
            String::new()
        }
        Err(_) => {
            tracing::warn!(
                cluster = %lower_name,
                "the lower cluster did not answer at start within 5 s: the node starts and shows it unreachable until it does"
            );
            String::new()
        }
    };
    let taint = node_taint(
        args.disable_taint,
        args.taint.as_deref(),
        env("VKUBELET_TAINT_VALUE").as_deref(),
        env("VKUBELET_TAINT_EFFECT").as_deref(),
    )?;
    let port = kubelet_port(env("KUBELET_PORT").as_deref())?;
    let identity = NodeIdentity {
        name: args.nodename.clone(),
        extra_label: env("VKUBELET_NODE_LABEL")
            .as_deref()
            .and_then(parse_node_label),
        taint,
        internal_ip: env("VKUBELET_POD_IP").unwrap_or_default(),
        external_ip: env("VKUBELET_EXTERNAL_POD_IP"),
        kubelet_port: port,
        lower_version,
    };
    let owner = args
        .owner_id
        .clone()
        .unwrap_or_else(|| args.nodename.clone());
    let ignore_labels = args
        .ignore_labels
        .split(',')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    let cert = match (
        env("APISERVER_CERT_LOCATION"),
        env("APISERVER_KEY_LOCATION"),
    ) {
        (Some(c), Some(k)) => tensile_kubelet::ServingCert::Pem {
            cert: read(&PathBuf::from(c), "certificate")?,
            key: read(&PathBuf::from(k), "key")?,
        },
        _ => {
            let mut sans = vec![args.nodename.clone()];
            sans.extend(
                [identity.internal_ip.clone()]
                    .into_iter()
                    .chain(identity.external_ip.clone())
                    .filter(|s| !s.is_empty()),
            );
            tensile_kubelet::ServingCert::SelfSigned { sans }
        }
    };
    // A CA given by the operator must be usable; one discovered upstairs may be missing (the
    // node still offloads pods; the kubelet API then refuses client certificates, said loudly).
    let client_ca = match &args.client_verify_ca {
        Some(p) => {
            let pem = read(p, "client CA")?;
            tensile_kubelet::auth::check_ca_pem(&pem)
                .with_context(|| format!("--client-verify-ca {}", p.display()))?;
            ClientCa::Pem(pem)
        }
        // A node identity may not read kube-system's ConfigMaps: as a kubelet's
        // --client-ca-file on kubeadm, the cluster CA its kubeconfig trusts.
        None if args.tls_bootstrap => match trusted_ca(&upper_source).await {
            Ok(pem) => ClientCa::Pem(pem),
            Err(e) => ClientCa::Unavailable(format!("{e:#}")),
        },
        None => match tensile_kubelet::auth::cluster_client_ca(&upper).await {
            Ok(pem) => ClientCa::Pem(pem),
            Err(e) => ClientCa::Unavailable(e.to_string()),
        },
    };
    let listen = kubelet_listen.unwrap_or_else(|| {
        SocketAddr::new(args.kubelet_address, u16::try_from(port).unwrap_or(10250))
    });
    Ok(VirtualNode {
        heartbeat,
        node: NodeLoop {
            identity,
            owner: owner.clone(),
            not_ready_after: args.not_ready_after_seconds.map(Duration::from_secs),
            lease_renew: Duration::from_secs(10),
            heartbeat: Duration::from_secs(60),
            holder_identity: tensile_runtime::leader::holder_identity(&args.nodename),
            leader_elected: args.leader.leader_elect,
            api_calls: calls.clone(),
        },
        pods: PodSettings {
            upper_events,
            upper,
            lower,
            node: args.nodename.clone(),
            lower_name,
            translate: TranslateConfig {
                owner,
                ignore_labels,
                upper_api,
            },
            workers: args.pod_sync_workers,
            service_accounts: args.enable_serviceaccount,
            retry: Default::default(),
        },
        kubelet: Some(KubeletApi {
            listen,
            cert,
            client_ca,
            auth_disabled: args.no_verify_clients,
            token_reviews: args.authentication_token_webhook,
            review_ttls,
            reviews,
        }),
        metrics: Metrics {
            registry,
            listen: metrics_listen,
        },
        services,
        volumes: controllers.volumes && !pv_controllers_refused(args),
        node_ports: args.node_ports,
    })
}

/// The review cache TTLs of the kubelet's flags (a TTL of 0 caches nothing), else its defaults.
fn review_ttls(args: &VirtualNodeArgs) -> anyhow::Result<tensile_core::guard::ReviewTtls> {
    let parse = |flag: &str, text: &Option<String>| -> anyhow::Result<Option<Duration>> {
        match text.as_deref().map(str::trim) {
            None => Ok(None),
            Some("0" | "0s") => Ok(Some(Duration::ZERO)),
            Some(t) => tensile_core::duration::parse_duration(t)
                .map(Some)
                .map_err(|e| anyhow::anyhow!("--{flag}: {e}")),
        }
    };
    let mut ttls = tensile_core::guard::ReviewTtls::default();
    if let Some(d) = parse(
        "authentication-token-webhook-cache-ttl",
        &args.authentication_token_webhook_cache_ttl,
    )? {
        ttls = ttls.with_token_ttl(d);
    }
    if let Some(d) = parse(
        "authorization-webhook-cache-authorized-ttl",
        &args.authorization_webhook_cache_authorized_ttl,
    )? {
        ttls.allowed = d;
    }
    if let Some(d) = parse(
        "authorization-webhook-cache-unauthorized-ttl",
        &args.authorization_webhook_cache_unauthorized_ttl,
    )? {
        ttls.denied = d;
    }
    Ok(ttls)
}

/// `args` read as the command line of `tensile virtual-node` (its environment defaults apply).
#[cfg(any(test, feature = "sandbox"))]
pub(crate) fn parse_args<'a>(
    args: impl IntoIterator<Item = &'a str>,
) -> Result<VirtualNodeArgs, clap::Error> {
    #[derive(clap::Parser)]
    struct Only {
        #[command(flatten)]
        args: VirtualNodeArgs,
    }
    <Only as clap::Parser>::try_parse_from(std::iter::once("virtual-node").chain(args))
        .map(|o| o.args)
}

/// A virtual node of the sandbox, in this process (`tensile up`, the benchmarks' sandboxes):
/// the sandbox's flags, its kubeconfigs as text, its kubelet API on the node's address.
#[cfg(feature = "sandbox")]
pub(crate) fn start_in_sandbox(
    node: tensile_bench::sandbox::InProcessNode,
    stop: CancellationToken,
) -> futures::future::BoxFuture<'static, anyhow::Result<tokio::task::JoinHandle<()>>> {
    Box::pin(async move {
        let name = &node.name;
        let args = parse_args([
            "--nodename",
            name,
            // Virtual pods tolerate not-ready and unreachable (the webhook adds that), not
            // the provider taint: the original's manifest disables it too.
            "--disable-taint",
        ])
        .context("virtual node flags")?;
        let address = node.kubelet_ip.to_string();
        let label = format!("clusterID: {}", node.cluster_id);
        let env = move |key: &str| match key {
            "VKUBELET_POD_IP" => Some(address.clone()),
            "VKUBELET_NODE_LABEL" => Some(label.clone()),
            _ => None,
        };
        let vn = assemble(
            &args,
            KubeconfigSource::Text(node.upper_kubeconfig.clone()),
            KubeconfigSource::Text(node.lower_kubeconfig.clone()),
            None,
            &env,
            Some(SocketAddr::new(node.kubelet_ip, 0)),
        )
        .await
        .with_context(|| format!("virtual node {name}"))?;
        let running = vn
            .start(stop)
            .await
            .with_context(|| format!("starting virtual node {name}"))?;
        Ok(running.handle)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBECONFIG: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:6443'}\ncontexts:\n- name: lower-east\n  context: {cluster: c, user: u}\nusers:\n- name: u\n  user: {token: t}\ncurrent-context: lower-east\n";

    #[test]
    fn the_kubelets_review_cache_flags_set_the_ttls() {
        let ttls = review_ttls(&parse_args(["--nodename", "vk-1"]).unwrap()).unwrap();
        assert_eq!(ttls, tensile_core::guard::ReviewTtls::default());
        let args = parse_args([
            "--nodename",
            "vk-1",
            "--authentication-token-webhook-cache-ttl",
            "10s",
            "--authorization-webhook-cache-authorized-ttl",
            "1m",
            "--authorization-webhook-cache-unauthorized-ttl",
            "0",
        ])
        .unwrap();
        let ttls = review_ttls(&args).unwrap();
        assert_eq!(ttls.authenticated, Duration::from_secs(10));
        assert_eq!(ttls.unauthenticated, Duration::from_secs(10));
        assert_eq!(ttls.allowed, Duration::from_secs(60));
        assert_eq!(ttls.denied, Duration::ZERO);
        let bad = parse_args([
            "--nodename",
            "vk-1",
            "--authentication-token-webhook-cache-ttl",
            "soon",
        ])
        .unwrap();
        let e = review_ttls(&bad).unwrap_err().to_string();
        assert!(
            e.contains("--authentication-token-webhook-cache-ttl"),
            "{e}"
        );
    }

    #[test]
    fn the_lower_kubeconfig_secret_is_namespace_and_name_or_a_name_in_the_pods_namespace() {
        assert_eq!(
            secret_ref("kube-system/tensile-l-kubeconfig", "x").unwrap(),
            ("kube-system".to_owned(), "tensile-l-kubeconfig".to_owned())
        );
        assert_eq!(
            secret_ref("tensile-l-kubeconfig", "tensile").unwrap(),
            ("tensile".to_owned(), "tensile-l-kubeconfig".to_owned())
        );
        for bad in ["/x", "ns/", "a/b/c"] {
            let e = secret_ref(bad, "ns").unwrap_err().to_string();
            assert!(e.contains("--lower-kubeconfig-secret"), "{e}");
        }
    }

    #[test]
    fn the_lower_cluster_is_named_by_its_context_unless_a_flag_says_otherwise() {
        let text = KubeconfigSource::Text(KUBECONFIG.to_owned());
        let args = parse_args(["--nodename", "vk-1"]).unwrap();
        // Not the node's name (what messages said before).
        assert_eq!(lower_cluster_name(&args, &text), "lower-east");
        let args = parse_args(["--nodename", "vk-1", "--lower-cluster-name", "eu-1"]).unwrap();
        assert_eq!(lower_cluster_name(&args, &text), "eu-1");
        let args = parse_args(["--nodename", "vk-1"]).unwrap();
        assert_eq!(
            lower_cluster_name(&args, &KubeconfigSource::InCluster),
            "lower"
        );
    }
}
