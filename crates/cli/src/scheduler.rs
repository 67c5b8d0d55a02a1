//! `tensile scheduler`: the kube-scheduler extender (see `tensile_placement::extender` and
//! `docs/scheduler-extender.md`). Users keep their kube-scheduler and point its `extenders:` at
//! this server.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;
use tensile_core::keys::OWNER_SCHEDULER;
use tensile_placement::extender::{self, ExtenderConfig, LowerClusterClient};
use tensile_placement::metrics::ExtenderMetrics;
use tensile_placement::serve::ClientAuth;
use tensile_runtime::clients::KubeconfigSource;
use tokio_util::sync::CancellationToken;

use crate::common::CertSource;

/// Flags of `tensile scheduler`.
#[derive(Debug, Args)]
pub struct SchedulerArgs {
    /// Kubeconfig of the upper cluster (default: ~/.kube/config if it exists, else in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// A lower cluster, as ID=KUBECONFIG: the `clusterID` label value of its virtual node and
    /// the path of its kubeconfig. Repeat for each lower cluster.
    #[arg(long = "cluster", value_name = "ID=KUBECONFIG", required = true, value_parser = parse_cluster)]
    pub clusters: Vec<(String, PathBuf)>,
    /// Listen address.
    #[arg(long, default_value = "0.0.0.0")]
    pub address: IpAddr,
    /// Listen port.
    #[arg(long, default_value_t = 10262)]
    pub port: u16,
    /// Serving certificate (PEM). Without it and --tls-private-key-file, the CA and
    /// certificate of --tls-secret, else a CA and a certificate for the Service name generated
    /// at start (see --write-ca).
    #[arg(long)]
    pub tls_cert_file: Option<PathBuf>,
    /// Serving key (PEM).
    #[arg(long)]
    pub tls_private_key_file: Option<PathBuf>,
    #[command(flatten)]
    pub tls: crate::common::TlsSecretArgs,
    /// More names or addresses for a generated certificate or --tls-secret's (repeatable), e.g.
    /// the Service's ClusterIP when kube-scheduler cannot resolve cluster DNS names.
    #[arg(long = "tls-san", value_name = "NAME")]
    pub tls_san: Vec<String>,
    /// Require client certificates signed by this CA (PEM): kube-scheduler's
    /// `tlsConfig.certData`/`keyData`. Without it anyone who reaches the port could have pods
    /// bound, so the extender then refuses to start on a non-loopback address (see
    /// --insecure-serve-without-client-auth). Shipped: the cluster CA.
    #[arg(long)]
    pub client_ca_file: Option<PathBuf>,
    /// Common names a client certificate of --client-ca-file may carry (comma-separated);
    /// empty: any. A cluster CA also signs kubelets' and users' certificates.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = extender::KUBE_SCHEDULER_USER
    )]
    pub allowed_client_names: Vec<String>,
    /// Serve a non-loopback address without --client-ca-file: whoever reaches the port can
    /// then have pods bound (only behind a network policy that lets kube-scheduler alone in).
    #[arg(long)]
    pub insecure_serve_without_client_auth: bool,
    /// Write the CA (what kube-scheduler's `tlsConfig.caData` needs) to this file; with
    /// --tls-secret, once leading and again whenever its CA bundle changes.
    #[arg(long)]
    pub write_ca: Option<PathBuf>,
    /// How long room stays reserved for a pod bound to a virtual node whose lower pod has not
    /// appeared (Go duration: 90s, 2m, 1h30m).
    #[arg(long, default_value = "2m", value_parser = tensile_core::duration::parse_duration)]
    pub reservation_ttl: Duration,
    /// QPS of every client (kube-scheduler's own default).
    #[arg(long, default_value_t = 50.0)]
    pub kube_api_qps: f32,
    /// Burst of every client.
    #[arg(long, default_value_t = 100)]
    pub kube_api_burst: u32,
    #[command(flatten)]
    pub leader: crate::common::LeaderElectArgs,
    #[command(flatten)]
    pub metrics: crate::common::MetricsArgs,
}

/// `ID=KUBECONFIG`.
fn parse_cluster(value: &str) -> Result<(String, PathBuf), String> {
    tensile_core::extender::parse_cluster_flag(value).map(|(id, path)| (id, PathBuf::from(path)))
}

/// Names a generated certificate is valid for: the shipped Service's names, loopback, the
/// listen address when specific, and `extra`.
fn generated_sans(address: IpAddr, extra: &[String]) -> Vec<String> {
    let mut sans: Vec<String> = [
        "tensile-scheduler",
        "tensile-scheduler.kube-system",
        "tensile-scheduler.kube-system.svc",
        "tensile-scheduler.kube-system.svc.cluster.local",
        "localhost",
        "127.0.0.1",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    if !address.is_unspecified() && !address.is_loopback() {
        sans.push(address.to_string());
    }
    for san in extra {
        if !sans.contains(san) {
            sans.push(san.clone());
        }
    }
    sans
}

/// What the extender is built from: its flags read, its clients built.
struct Prepared {
    upper: kube::Client,
    clusters: Vec<LowerClusterClient>,
    client_auth: Option<ClientAuth>,
    cert: CertSource,
    sans: Vec<String>,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("clusters", &self.clusters)
            .field("cert", &self.cert)
            .finish_non_exhaustive()
    }
}

/// The extender's configuration from its flags (clients built, certificate files read or a
/// certificate generated; a `--tls-secret` is read once leading).
async fn config(args: &SchedulerArgs) -> anyhow::Result<Prepared> {
    // Before anything else (a standby would only find out once leading).
    if args.client_ca_file.is_none()
        && !args.address.is_loopback()
        && !args.insecure_serve_without_client_auth
    {
        bail!(
            "--address {} without --client-ca-file would let anyone who reaches the extender \
             bind pods: give --client-ca-file (the CA of kube-scheduler's client certificate, \
             its tlsConfig.certData), listen on a loopback address, or pass \
             --insecure-serve-without-client-auth",
            args.address
        );
    }
    let mut seen = BTreeSet::new();
    for (id, _) in &args.clusters {
        if !seen.insert(id) {
            bail!("--cluster {id} is given twice");
        }
    }
    let sans = generated_sans(args.address, &args.tls_san);
    let cert = crate::common::cert_source(
        args.tls_cert_file.as_ref(),
        args.tls_private_key_file.as_ref(),
        ("--tls-cert-file", "--tls-private-key-file"),
        args.tls.tls_secret.as_ref(),
        OWNER_SCHEDULER,
        &sans,
    )?;
    if let (Some(path), CertSource::Files(c) | CertSource::Generated(c)) = (&args.write_ca, &cert) {
        write_ca(path, &c.ca_pem)?;
    }
    let upper = crate::common::client(
        crate::common::upper_source(args.kubeconfig.as_ref()),
        args.kube_api_qps,
        args.kube_api_burst,
        "upper",
    )
    .await?;
    let mut clusters = Vec::new();
    // Followed for the process's life, standby included (it only reads a file).
    let follow_stop = CancellationToken::new();
    for (id, path) in &args.clusters {
        // A token the virtual node renews (what join stores) is followed in the mounted file.
        let source = KubeconfigSource::Path(path.clone());
        let mut config = tensile_runtime::clients::load_config(&source)
            .await
            .with_context(|| format!("lower cluster {id}"))?;
        let token = tensile_node::lower_token::LowerToken::take_from(&mut config);
        let mut registry = prometheus_client::registry::Registry::default();
        let client = tensile_node::clients::client_with_token(
            config,
            token.as_ref(),
            args.kube_api_qps,
            args.kube_api_burst,
            "lower",
            &tensile_runtime::clients::ApiCalls::new(&mut registry),
        )
        .with_context(|| format!("lower cluster {id}: a client from {source}"))?;
        if let Some(token) = token {
            tokio::spawn(tensile_node::lower_token::follow_file(
                token,
                path.clone(),
                Duration::from_secs(60),
                follow_stop.clone(),
            ));
        }
        clusters.push(LowerClusterClient {
            id: id.clone(),
            client,
        });
    }
    let client_auth = args
        .client_ca_file
        .as_ref()
        .map(|p| {
            std::fs::read_to_string(p)
                .with_context(|| format!("reading --client-ca-file {}", p.display()))
                .map(|ca_pem| ClientAuth {
                    ca_pem,
                    allowed_names: args
                        .allowed_client_names
                        .iter()
                        .map(|n| n.trim().to_owned())
                        .filter(|n| !n.is_empty())
                        .collect(),
                })
        })
        .transpose()?;
    Ok(Prepared {
        upper,
        clusters,
        client_auth,
        cert,
        sans,
    })
}

/// Writes the CA bundle to `path` whole (a temporary file renamed), so kube-scheduler's
/// tooling never reads half of it.
fn write_ca(path: &Path, pem: &str) -> anyhow::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, pem)
        .and_then(|()| std::fs::rename(&tmp, path))
        .with_context(|| format!("writing the CA to {}", path.display()))?;
    tracing::info!(path = %path.display(), "CA of the serving certificate written");
    Ok(())
}

/// Rewrites `--write-ca` whenever the CA bundle of `--tls-secret` changes, until `stop`.
async fn keep_ca_file(
    path: PathBuf,
    mut bundle: tokio::sync::watch::Receiver<String>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            changed = bundle.changed() => if changed.is_err() { return },
        }
        let pem = bundle.borrow_and_update().clone();
        if let Err(e) = write_ca(&path, &pem) {
            tracing::error!(error = %format!("{e:#}"), "the CA bundle changed");
        }
    }
}

pub async fn run(args: SchedulerArgs) -> anyhow::Result<()> {
    let prepared = config(&args).await?;
    // Served from the start, so that a standby answers its probes (`/readyz` 503).
    let probes = CancellationToken::new();
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = ExtenderMetrics::new(&mut registry);
    let gauge = tensile_runtime::leader::LeaderGauge::new(
        &mut registry,
        &args.leader.lease("tensile-scheduler"),
    );
    let (readiness, _) =
        crate::common::serve_metrics(&args.metrics, args.leader.leader_elect, registry, &probes)
            .await?;
    // A standby does not listen: the Service sends kube-scheduler to the leader only (its
    // readiness probe fails meanwhile). A new leader lists the lower clusters again.
    let leadership = crate::common::lead(
        &args.leader,
        &prepared.upper,
        "tensile-scheduler",
        "scheduler",
        &gauge,
    )
    .await?;
    if matches!(leadership, crate::common::Leadership::Stopped) {
        return Ok(());
    }
    let stop = CancellationToken::new();
    // A standby writes nothing: the Secret is read (or created, or renewed) once leading.
    let from_secret = matches!(prepared.cert, CertSource::Secret(_));
    let serving = crate::common::serve_cert(
        prepared.cert,
        &prepared.upper,
        OWNER_SCHEDULER,
        &prepared.sans,
        &stop,
    )
    .await?;
    if let (Some(path), true) = (&args.write_ca, from_secret) {
        write_ca(path, &serving.bundle.borrow().clone())?;
        tokio::spawn(keep_ca_file(
            path.clone(),
            serving.bundle.clone(),
            stop.clone(),
        ));
    }
    let config = ExtenderConfig {
        upper: prepared.upper,
        clusters: prepared.clusters,
        reservation_ttl: args.reservation_ttl,
        listen: SocketAddr::new(args.address, args.port),
        cert: serving.cert,
        client_auth: prepared.client_auth,
        insecure_without_client_auth: args.insecure_serve_without_client_auth,
        metrics,
    };
    let running = extender::start(config, stop.clone())
        .await
        .context("starting the scheduler extender")?;
    tracing::info!(addr = %running.addr, clusters = args.clusters.len(), "scheduler extender running");
    // Ready once every cluster's watches have listed: before, it fails their virtual nodes.
    readiness.set_not_ready("starting: listing the lower clusters' nodes and pods");
    tokio::spawn(ready_when_synced(
        running.extender.clone(),
        readiness,
        stop.clone(),
    ));
    let handle = running.handle;
    crate::common::run_until_stopped(
        leadership,
        stop,
        async {
            let _ = handle.await;
        },
        Duration::from_secs(10),
    )
    .await
}

/// Sets `readiness` once the extender's watches have listed. The watches report no event for
/// it, so this looks twice a second (cheap: one lock).
async fn ready_when_synced(
    extender: extender::Extender,
    readiness: tensile_runtime::metrics::Readiness,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if extender.synced() {
            readiness.set_ready();
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: SchedulerArgs,
    }

    fn parse(args: &[&str]) -> Result<SchedulerArgs, String> {
        Cli::try_parse_from(std::iter::once("scheduler").chain(args.iter().copied()))
            .map(|c| c.args)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn flags_and_defaults() {
        let a = parse(&["--cluster", "c1=/a", "--cluster", "c2=/b"]).unwrap();
        assert_eq!(
            a.clusters,
            [
                ("c1".into(), PathBuf::from("/a")),
                ("c2".into(), PathBuf::from("/b"))
            ]
        );
        assert_eq!(a.port, 10262);
        assert_eq!(a.address.to_string(), "0.0.0.0");
        assert_eq!(a.reservation_ttl, Duration::from_secs(120));
        let a = parse(&["--cluster", "c1=/a", "--reservation-ttl", "1m30s"]).unwrap();
        assert_eq!(a.reservation_ttl, Duration::from_secs(90));
    }

    #[test]
    fn bad_flags_are_clear_errors() {
        assert!(
            parse(&[])
                .unwrap_err()
                .contains("--cluster <ID=KUBECONFIG>")
        );
        assert!(
            parse(&["--cluster", "c1"])
                .unwrap_err()
                .contains("expected ID=KUBECONFIG")
        );
        assert!(
            parse(&["--cluster", "c1=/a", "--reservation-ttl", "soon"])
                .unwrap_err()
                .contains("invalid duration \"soon\"")
        );
        assert!(
            parse(&["--cluster", "c1=/a", "--reservation-ttl", "0s"])
                .unwrap_err()
                .contains("must be positive")
        );
    }

    #[tokio::test]
    async fn an_unreadable_kubeconfig_or_half_a_certificate_stops_the_start() {
        let dir =
            std::env::temp_dir().join(format!("tensile-scheduler-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.kubeconfig");
        let upper = format!("--kubeconfig={}", missing.display());
        let lo = "--address=127.0.0.1";
        let a = parse(&[lo, upper.as_str(), "--cluster", "c1=/nowhere"]).unwrap();
        let err = format!("{:#}", config(&a).await.unwrap_err());
        assert!(
            err.starts_with("upper cluster client from kubeconfig ")
                && err.contains("cannot read kubeconfig"),
            "{err}"
        );
        let a = parse(&[lo, "--cluster", "c1=/a", "--tls-cert-file", "/x"]).unwrap();
        let err = config(&a).await.unwrap_err().to_string();
        assert_eq!(
            err,
            "--tls-cert-file and --tls-private-key-file go together"
        );
        let a = parse(&[lo, "--cluster", "c1=/a", "--cluster", "c1=/b"]).unwrap();
        assert_eq!(
            config(&a).await.unwrap_err().to_string(),
            "--cluster c1 is given twice"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Anyone who reaches a non-loopback address could have pods bound: the extender does not
    /// start there without client certificates, unless told to in so many words.
    #[tokio::test]
    async fn no_client_auth_off_loopback_stops_the_start_naming_the_flags() {
        let a = parse(&["--cluster", "c1=/a"]).unwrap();
        assert_eq!(a.allowed_client_names, ["system:kube-scheduler"]);
        let err = config(&a).await.unwrap_err().to_string();
        assert!(
            err.starts_with("--address 0.0.0.0 without --client-ca-file")
                && err.contains("--insecure-serve-without-client-auth"),
            "{err}"
        );
        // Told so, it goes on (and stops at the next problem: no kubeconfig here).
        let a = parse(&[
            "--cluster",
            "c1=/a",
            "--kubeconfig=/nowhere",
            "--insecure-serve-without-client-auth",
        ])
        .unwrap();
        let err = config(&a).await.unwrap_err().to_string();
        assert!(!err.contains("--client-ca-file"), "{err}");
        let a = parse(&["--cluster", "c1=/a", "--allowed-client-names="]).unwrap();
        assert_eq!(a.allowed_client_names, [""]);
    }
}
