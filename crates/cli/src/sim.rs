//! `tensile sim`: one simulated cluster in the foreground, for people and scripts.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use tensile_sim::apiserver::{ApiServer, ApiServerConfig};
use tensile_simkubelet::{SimKubelet, SimKubeletConfig, SimNode};

/// Flags of `tensile sim`.
#[derive(Debug, clap::Args)]
pub struct SimArgs {
    /// Address to serve the API on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Cluster (and kubeconfig context) name.
    #[arg(long, default_value = "sim")]
    name: String,
    /// Simulated nodes to register (4 CPU, 8 GiB each).
    #[arg(long, default_value_t = 2)]
    nodes: usize,
    /// Serve plain HTTP instead of HTTPS.
    #[arg(long)]
    insecure_http: bool,
    /// Write the kubeconfig here (without it, the kubeconfig is printed).
    #[arg(long)]
    kubeconfig_out: Option<PathBuf>,
}

pub async fn run(args: SimArgs) -> anyhow::Result<()> {
    let nodes = (1..=args.nodes)
        .map(|i| SimNode::new(format!("{}-node-{i}", args.name), "4", "8Gi"))
        .collect();
    let (server, _nodes) = start_cluster(
        &args.name,
        args.listen,
        !args.insecure_http,
        nodes,
        244,
        None,
    )
    .await?;
    let kubeconfig = server.kubeconfig(&args.name);
    if let Some(path) = &args.kubeconfig_out {
        tensile_testenv::secret_file::write_secret(path, &kubeconfig)
            .with_context(|| format!("writing the kubeconfig to {}", path.display()))?;
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "# tensile sim: cluster {:?} serving on {}",
        args.name,
        server.url()
    )?;
    match &args.kubeconfig_out {
        Some(path) => writeln!(
            out,
            "# kubeconfig written to {}; try: kubectl --kubeconfig {} get ns",
            path.display(),
            path.display()
        )?,
        None => write!(out, "{kubeconfig}")?,
    }
    out.flush()?;
    drop(out);
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    server.stop();
    Ok(())
}

/// One simulated cluster: its API server on `listen` and, if any, its `nodes` (with kubelet APIs;
/// pod IPs `10.<pod_network_octet>.<node>.<n>`).
pub(crate) async fn start_cluster(
    name: &str,
    listen: SocketAddr,
    tls: bool,
    nodes: Vec<SimNode>,
    pod_network_octet: u8,
    scheduler_qps: Option<u32>,
) -> anyhow::Result<(ApiServer, Option<SimKubelet>)> {
    let mut config = ApiServerConfig {
        name: name.to_owned(),
        listen,
        tls,
        // Its simulated nodes live on loopback addresses (no root needed to run it), so the
        // stats the virtual node reads through nodes/proxy must be let through.
        proxy_to_loopback: true,
        ..ApiServerConfig::default()
    };
    // A cluster without nodes of its own is an upper cluster: its claims are bound downstairs,
    // and its scheduler must not wait for volumes it cannot bind (reference 4.3).
    config.controllers.volume_binding = !nodes.is_empty();
    if let Some(qps) = scheduler_qps {
        config.controllers.scheduler_client_qps = f64::from(qps);
        config.controllers.scheduler_client_burst = qps.saturating_mul(2);
    }
    let (server, _ca) = tensile_testenv::start_apiserver(config)
        .await
        .with_context(|| format!("starting the API server of cluster {name} on {listen}"))?;
    let client = server
        .client()
        .await
        .with_context(|| format!("building a client for cluster {name}"))?;
    default_storage_class(&client)
        .await
        .with_context(|| format!("creating the default StorageClass of cluster {name}"))?;
    if nodes.is_empty() {
        return Ok((server, None));
    }
    let config = SimKubeletConfig {
        nodes,
        pod_network_octet,
        ..SimKubeletConfig::default()
    };
    let kubelet = SimKubelet::start(client, config)
        .await
        .with_context(|| format!("registering the simulated nodes of cluster {name}"))?;
    Ok((server, Some(kubelet)))
}

/// The StorageClass every sandbox cluster has, like kind's `standard`: volumes provisioned on
/// the pod's node when it is scheduled (`WaitForFirstConsumer`), deleted with their claim.
pub(crate) async fn default_storage_class(client: &kube::Client) -> Result<(), kube::Error> {
    let class: k8s_openapi::api::storage::v1::StorageClass =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": STORAGE_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": "tensile.io/local-path",
            "volumeBindingMode": "WaitForFirstConsumer",
            "reclaimPolicy": "Delete",
        }))
        .map_err(kube::Error::SerdeError)?;
    kube::Api::all(client.clone())
        .create(&kube::api::PostParams::default(), &class)
        .await
        .map(drop)
}

/// The name of the sandbox's default StorageClass.
pub(crate) const STORAGE_CLASS: &str = "standard";
