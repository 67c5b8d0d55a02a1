//! `tensile sim`: one simulated cluster in the foreground, for people and scripts.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use tensile_bench::sandbox::{default_storage_class, simulated};
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
    let name = &args.name;
    let (server, _ca) = tensile_testenv::start_apiserver(simulated(
        name,
        args.listen,
        !args.insecure_http,
        args.nodes > 0,
        None,
    ))
    .await
    .with_context(|| {
        format!(
            "starting the API server of cluster {name} on {}",
            args.listen
        )
    })?;
    let client = server
        .client()
        .await
        .with_context(|| format!("building a client for cluster {name}"))?;
    default_storage_class(&client)
        .await
        .with_context(|| format!("creating the default StorageClass of cluster {name}"))?;
    let _nodes = if args.nodes > 0 {
        let config = SimKubeletConfig {
            nodes: (1..=args.nodes)
                .map(|i| SimNode::new(format!("{name}-node-{i}"), "4", "8Gi"))
                .collect(),
            pod_network_octet: 244,
            ..SimKubeletConfig::default()
        };
        Some(
            SimKubelet::start(client, config)
                .await
                .with_context(|| format!("registering the simulated nodes of cluster {name}"))?,
        )
    } else {
        None
    };
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
