//! What the component subcommands share: Go duration flags, where the upper cluster's
//! kubeconfig comes from, clients, serving certificates, the metrics and probes listener.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use prometheus_client::registry::Registry;
use tensile_core::duration::parse_duration;
use tensile_placement::serve::{LiveCert, ServingCert};
use tensile_placement::tls_secret::{SecretName, TlsSecretConfig};
use tensile_runtime::clients::{ApiCalls, KubeconfigSource, build_client};
use tensile_runtime::leader::STANDBY;
use tensile_runtime::metrics::Readiness;
use tokio_util::sync::CancellationToken;

/// `--metrics-addr` of the webhook, the descheduler and the scheduler extender.
#[derive(Debug, Clone, clap::Args)]
pub struct MetricsArgs {
    /// Plain-HTTP listener (`host:port` or `:port`) for Prometheus `/metrics`, `/healthz` and
    /// `/readyz`; also on a standby, whose `/readyz` answers 503. Empty: none.
    #[arg(long, default_value = "")]
    pub metrics_addr: String,
}

/// `--metrics-addr` as node-cli took it: `host:port` or `:port` (all addresses); empty: off.
pub fn metrics_addr(value: &str) -> anyhow::Result<Option<SocketAddr>> {
    if value.is_empty() {
        return Ok(None);
    }
    let full = if value.starts_with(':') {
        format!("0.0.0.0{value}")
    } else {
        value.to_owned()
    };
    full.parse()
        .map(Some)
        .with_context(|| format!("invalid --metrics-addr {value:?}: expected host:port or :port"))
}

/// Starts the `--metrics-addr` listener of `registry` (none when the flag is empty) before
/// anything else, so that a standby answers its probes too; `/readyz` answers 503 with
/// [`STANDBY`] under `--leader-elect`, else with `starting`, until the component sets it ready.
pub async fn serve_metrics(
    args: &MetricsArgs,
    leader_elect: bool,
    mut registry: Registry,
    stop: &CancellationToken,
) -> anyhow::Result<(Readiness, Option<SocketAddr>)> {
    crate::heap::register(&mut registry);
    let readiness = Readiness::not_ready(if leader_elect { STANDBY } else { "starting" });
    let bound = match metrics_addr(&args.metrics_addr)? {
        Some(addr) => Some(
            tensile_runtime::metrics::serve_probes(
                addr,
                Arc::new(registry),
                readiness.clone(),
                stop.clone(),
            )
            .await?,
        ),
        None => None,
    };
    if let Some(addr) = bound {
        tracing::info!(%addr, "metrics and probes serving");
    }
    Ok((readiness, bound))
}

/// The upper cluster's kubeconfig, in kube's own order: the given path (which must load), else
/// `~/.kube/config` if it exists, else the in-cluster configuration.
pub fn upper_source(path: Option<&PathBuf>) -> KubeconfigSource {
    if let Some(p) = path {
        return KubeconfigSource::Path(p.clone());
    }
    match std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".kube/config")) {
        Some(p) if p.exists() => KubeconfigSource::Path(p),
        _ => KubeconfigSource::InCluster,
    }
}

/// A client of `source` limited to `qps`/`burst`, its API calls counted under `cluster` in a
/// registry of its own: the webhook's, descheduler's and extender's API calls are not served.
pub async fn client(
    source: KubeconfigSource,
    qps: f32,
    burst: u32,
    cluster: &'static str,
) -> anyhow::Result<kube::Client> {
    let mut registry = prometheus_client::registry::Registry::default();
    let calls = ApiCalls::new(&mut registry);
    build_client(source.clone(), qps, burst, cluster, &calls)
        .await
        .with_context(|| format!("{cluster} cluster client from {source}"))
}

/// Where a component's serving certificate comes from.
#[derive(Debug)]
pub enum CertSource {
    /// Files given on the command line (cert-manager's, say): served as they are, nothing
    /// watched; the certificate itself is what clients are told to trust.
    Files(ServingCert),
    /// `--tls-secret`: kept in that Secret of the upper cluster, shared by every replica and
    /// restart, renewed before it expires.
    Secret(SecretName),
    /// Neither: a CA and a certificate generated at this start.
    Generated(ServingCert),
}

/// Where the serving certificate comes from: the given files (`flags` names them), which take
/// precedence, else `secret`, else a CA and certificate generated now for `sans`.
pub fn cert_source(
    cert: Option<&PathBuf>,
    key: Option<&PathBuf>,
    flags: (&str, &str),
    secret: Option<&SecretName>,
    common_name: &str,
    sans: &[String],
) -> anyhow::Result<CertSource> {
    Ok(match (cert, key, secret) {
        (Some(c), Some(k), secret) => {
            if let Some(s) = secret {
                tracing::info!(secret = %s, "serving the certificate of {} and {}: they take precedence over --tls-secret", flags.0, flags.1);
            }
            CertSource::Files(ServingCert::from_files(c, k)?)
        }
        (None, None, Some(s)) => CertSource::Secret(s.clone()),
        (None, None, None) => CertSource::Generated(ServingCert::generate(common_name, sans)?),
        _ => anyhow::bail!("{} and {} go together", flags.0, flags.1),
    })
}

/// A serving certificate being served: what the server presents (replaced as its Secret
/// changes) and the CA bundle clients are to trust (changing only with `--tls-secret`).
#[derive(Debug)]
pub struct Serving {
    /// Presented by the server.
    pub cert: LiveCert,
    /// The CAs to trust, PEM.
    pub bundle: tokio::sync::watch::Receiver<String>,
}

/// Starts serving from `source`: with a Secret, reads it from `upper` (creating or renewing it,
/// as `owner`, for `sans`) and keeps watching it until `stop`.
pub async fn serve_cert(
    source: CertSource,
    upper: &kube::Client,
    owner: &str,
    sans: &[String],
    stop: &CancellationToken,
) -> anyhow::Result<Serving> {
    let fixed = |cert: ServingCert| -> anyhow::Result<Serving> {
        // The sender goes: the bundle never changes.
        let (_, bundle) = tokio::sync::watch::channel(cert.ca_pem.clone());
        Ok(Serving {
            cert: LiveCert::new(cert)?,
            bundle,
        })
    };
    match source {
        CertSource::Files(cert) | CertSource::Generated(cert) => fixed(cert),
        CertSource::Secret(secret) => {
            let kept = tensile_placement::tls_secret::start(
                upper.clone(),
                TlsSecretConfig {
                    secret,
                    owner: owner.to_owned(),
                    names: sans.to_vec(),
                    policy: tensile_core::certs::Policy::default(),
                },
                stop.clone(),
            )
            .await?;
            Ok(Serving {
                cert: kept.cert,
                bundle: kept.bundle,
            })
        }
    }
}

/// `--tls-secret`, the same on the webhook and the extender.
#[derive(Debug, Clone, clap::Args)]
pub struct TlsSecretArgs {
    /// Keep the CA and serving certificate in this Secret of the upper cluster
    /// (NAMESPACE/NAME, type kubernetes.io/tls): created when missing, shared by every replica
    /// and restart, renewed before it expires. Refused if the Secret exists and is not ours.
    /// Given certificate files take precedence.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pub tls_secret: Option<SecretName>,
}

/// `--leader-elect` and its settings, named as kube-controller-manager names them.
#[derive(Clone, Debug, clap::Args)]
pub struct LeaderElectArgs {
    /// Run as one of several replicas: only the holder of a `coordination.k8s.io` Lease works;
    /// the others stand by and take over when it stops renewing.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub leader_elect: bool,
    /// How long a standby waits after the leader's last renewal before it takes over.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader keeps trying to renew before it stops (exits).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// Time between two tries to renew or to acquire the lease.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,
    /// Name of the election Lease (default: one per component, see docs/flags.md).
    #[arg(long)]
    pub leader_elect_resource_name: Option<String>,
    /// Namespace of the election Lease (default: $POD_NAMESPACE, else kube-system).
    #[arg(long, env = "POD_NAMESPACE", default_value = "kube-system")]
    pub leader_elect_resource_namespace: String,
}

impl LeaderElectArgs {
    /// The election Lease as `namespace/name` (`default_name` unless
    /// `--leader-elect-resource-name`); empty without `--leader-elect`.
    pub fn lease(&self, default_name: &str) -> String {
        if !self.leader_elect {
            return String::new();
        }
        format!(
            "{}/{}",
            self.leader_elect_resource_namespace,
            self.lease_name(default_name)
        )
    }

    fn lease_name(&self, default_name: &str) -> String {
        self.leader_elect_resource_name
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| default_name.to_owned())
    }

    /// The timings, checked.
    pub fn timings(&self) -> anyhow::Result<tensile_core::lease::Timings> {
        let t = tensile_core::lease::Timings {
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
        };
        t.check().map_err(anyhow::Error::msg)?;
        Ok(t)
    }
}

/// What [`lead`] came to.
#[derive(Debug)]
pub enum Leadership {
    /// No `--leader-elect`: the process works alone.
    Alone,
    /// This process leads, and renews the Lease in the background.
    Leader(Holding),
    /// A shutdown signal came while it stood by.
    Stopped,
}

/// The renewal of a held Lease, running from the moment it was acquired.
#[derive(Debug)]
pub struct Holding {
    renewing: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// With `--leader-elect`, stands by until this process holds the election Lease
/// (`default_name` unless `--leader-elect-resource-name`) of the upper cluster, or a shutdown
/// signal comes. Nothing else of the component has started meanwhile: a standby writes nothing.
/// Once it leads, the Lease is renewed at once, in the background, while the component starts;
/// if leadership is lost (at any time, start-up included) the process exits at once with
/// status 1, so no write of an old leader follows a new leader's (Kubernetes restarts it as a
/// standby). `gauge` turns 1 once it leads (at once without `--leader-elect`).
pub async fn lead(
    args: &LeaderElectArgs,
    upper: &kube::Client,
    default_name: &str,
    identity_prefix: &str,
    gauge: &tensile_runtime::leader::LeaderGauge,
) -> anyhow::Result<Leadership> {
    if !args.leader_elect {
        gauge.set_leading();
        return Ok(Leadership::Alone);
    }
    let timings = args.timings()?;
    let name = args.lease_name(default_name);
    let election = tensile_runtime::leader::LeaderElection::new(
        upper.clone(),
        &args.leader_elect_resource_namespace,
        &name,
        tensile_runtime::leader::holder_identity(identity_prefix),
        timings,
    );
    tracing::info!(lease = %format!("{}/{name}", args.leader_elect_resource_namespace), identity = %election.identity(), "running for leader");
    let stop = CancellationToken::new();
    let acquire = election.acquire(&stop);
    tokio::pin!(acquire);
    let leader = tokio::select! {
        leader = &mut acquire => leader,
        signal = crate::shutdown_signal() => {
            signal?;
            None
        }
    };
    let Some(leader) = leader else {
        return Ok(Leadership::Stopped);
    };
    gauge.set_leading();
    let renewing = CancellationToken::new();
    let task = tokio::spawn(hold_or_exit(leader, renewing.clone()));
    Ok(Leadership::Leader(Holding { renewing, task }))
}

/// Renews until `renewing` is cancelled (then gives the Lease up); exits the process when
/// leadership is lost.
async fn hold_or_exit(leader: tensile_runtime::leader::Leader, renewing: CancellationToken) {
    if let Err(lost) = leader.hold(renewing).await {
        tracing::error!("{lost}; exiting");
        let _ = std::io::Write::write_fmt(&mut std::io::stderr(), format_args!("error: {lost}\n"));
        std::process::exit(1);
    }
}

/// Runs until a shutdown signal; then `stop` is cancelled, the component gets `grace` to finish
/// in `done`, and only then, once it stopped writing, is the Lease given up.
pub async fn run_until_stopped(
    leadership: Leadership,
    stop: CancellationToken,
    done: impl std::future::Future<Output = ()>,
    grace: Duration,
) -> anyhow::Result<()> {
    crate::shutdown_signal().await?;
    stop.cancel();
    let _ = tokio::time::timeout(grace, done).await;
    if let Leadership::Leader(holding) = leadership {
        holding.renewing.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(3), holding.task).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_addr_takes_host_port_or_port_and_empty_is_off() {
        assert_eq!(metrics_addr("").unwrap(), None);
        assert_eq!(
            metrics_addr(":10255").unwrap(),
            Some("0.0.0.0:10255".parse().unwrap())
        );
        assert_eq!(
            metrics_addr("127.0.0.1:9").unwrap(),
            Some("127.0.0.1:9".parse().unwrap())
        );
        assert!(
            metrics_addr("10255")
                .unwrap_err()
                .to_string()
                .contains("expected host:port or :port")
        );
    }

    /// What a `--leader-elect` descheduler or extender serves while it stands by (alive, not
    /// ready), then as it works (ready, its metrics).
    #[tokio::test]
    async fn a_standby_is_alive_and_not_ready() {
        let stop = CancellationToken::new();
        let args = MetricsArgs {
            metrics_addr: "127.0.0.1:0".into(),
        };
        let mut registry = Registry::default();
        let metrics = tensile_placement::metrics::DeschedulerMetrics::new(&mut registry);
        let (readiness, addr) = serve_metrics(&args, true, registry, &stop).await.unwrap();
        let addr = addr.unwrap();
        let get = |path| tensile_testenv::http_get(addr, path);
        assert_eq!(get("/healthz").await.unwrap(), (200, "ok".into()));
        assert_eq!(get("/readyz").await.unwrap(), (503, STANDBY.into()));
        readiness.set_ready();
        assert_eq!(get("/readyz").await.unwrap(), (200, "ok".into()));
        metrics.gave_up();
        let (status, text) = get("/metrics").await.unwrap();
        assert_eq!(status, 200);
        assert_eq!(
            tensile_testenv::metric_value(&text, "tensile_descheduler_give_ups_total"),
            Some(1.0),
            "{text}"
        );
        assert_eq!(get("/nothing").await.unwrap().0, 404);
        stop.cancel();
    }

    #[test]
    fn leader_election_flags_default_to_kube_controller_managers() {
        #[derive(clap::Parser)]
        struct Only {
            #[command(flatten)]
            args: LeaderElectArgs,
        }
        let a = <Only as clap::Parser>::try_parse_from(["x", "--leader-elect"])
            .unwrap()
            .args;
        assert!(a.leader_elect);
        assert_eq!(
            a.timings().unwrap(),
            tensile_core::lease::Timings::default()
        );
        let bad =
            <Only as clap::Parser>::try_parse_from(["x", "--leader-elect-renew-deadline=20s"])
                .unwrap()
                .args;
        assert!(bad.timings().is_err());
    }
}
