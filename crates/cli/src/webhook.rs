//! `tensile webhook`: the mutating admission webhook (see `tensile_placement::webhook`),
//! accepting the original's flags.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::Api;
use kube::api::PostParams;
use tensile_core::inject::{DEFAULT_IGNORE_SELECTOR_KEYS, parse_ignore_keys};
use tensile_node::clients::{ApiCalls, KubeconfigSource, build_client};
use tensile_placement::serve::{Server, ServingCert, tls_config};
use tensile_placement::webhook::{Webhook, WebhookConfig};
use tokio_util::sync::CancellationToken;

/// Flags of `tensile webhook`.
#[derive(Debug, Args)]
pub struct WebhookArgs {
    /// Listen address.
    #[arg(long, default_value = "0.0.0.0")]
    pub address: IpAddr,
    /// Listen port (the shipped manifest uses 8443 behind Service port 443).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Serving certificate (PEM). Without --tlscert/--tlskey a CA and a certificate for
    /// --tls-san are generated at start.
    #[arg(long)]
    pub tlscert: Option<PathBuf>,
    /// Serving key (PEM).
    #[arg(long)]
    pub tlskey: Option<PathBuf>,
    /// Require client certificates signed by this CA (PEM).
    #[arg(long = "CA")]
    pub ca: Option<PathBuf>,
    /// Names and addresses of a generated certificate.
    #[arg(long = "tls-san", default_values_t = ["tensile-webhook.kube-system.svc".to_owned(), "localhost".to_owned(), "127.0.0.1".to_owned()])]
    pub tls_san: Vec<String>,
    /// Upper-cluster kubeconfig, to read claims (pins pods to their volume's node) and to
    /// write the caBundle. Default: in-cluster when run in a pod, else ~/.kube/config.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Accepted for compatibility; unused.
    #[arg(long)]
    pub master: Option<String>,
    /// Accepted for compatibility; unused.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub incluster: Option<String>,
    /// Node selector and node affinity keys that stay in the upper pod.
    #[arg(long, default_value = DEFAULT_IGNORE_SELECTOR_KEYS)]
    pub ignore_selector_keys: String,
    /// How long a workload stays off a virtual node the descheduler marked one of its pods
    /// unschedulable on (Go duration).
    #[arg(long, default_value = "3m", value_parser = parse_duration)]
    pub exclusion_window: Duration,
    /// Write the CA of the serving certificate into this MutatingWebhookConfiguration's
    /// webhooks at start (needs get and update on it).
    #[arg(long)]
    pub webhook_configuration: Option<String>,
    /// klog verbosity (accepted; use RUST_LOG).
    #[arg(long = "v")]
    pub verbosity: Option<u8>,
    /// Accepted for compatibility.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub logtostderr: Option<String>,
    /// Accepted for compatibility.
    #[arg(long)]
    pub vmodule: Option<String>,
}

/// A Go duration (`10s`, `3m`, `1h30m`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let d: k8s_openapi::jiff::SignedDuration = text
        .trim()
        .parse()
        .map_err(|e| format!("invalid duration {text:?}: {e}"))?;
    Duration::try_from(d).map_err(|_| format!("invalid duration {text:?}: negative"))
}

/// The upper cluster as the webhook and descheduler find it: the given kubeconfig (which
/// must load), else in-cluster inside a pod, else ~/.kube/config, else none.
pub fn upper_source(path: Option<&PathBuf>) -> Option<KubeconfigSource> {
    if let Some(p) = path {
        return Some(KubeconfigSource::Path(p.clone()));
    }
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        return Some(KubeconfigSource::InCluster);
    }
    std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".kube/config"))
        .filter(|p| p.exists())
        .map(KubeconfigSource::Path)
}

/// Starts the webhook from its flags; `client` is the upper cluster, if any.
pub async fn start(
    args: &WebhookArgs,
    client: Option<kube::Client>,
    stop: &CancellationToken,
) -> anyhow::Result<Server> {
    let cert = match (&args.tlscert, &args.tlskey) {
        (Some(c), Some(k)) => ServingCert::from_files(c, k)?,
        (None, None) => ServingCert::generate("tensile-webhook", &args.tls_san)?,
        _ => bail!("--tlscert and --tlskey go together"),
    };
    let client_ca = args
        .ca
        .as_ref()
        .map(|p| {
            std::fs::read_to_string(p).with_context(|| format!("reading --CA {}", p.display()))
        })
        .transpose()?;
    let tls = tls_config(&cert, client_ca.as_deref())?;
    let config = WebhookConfig {
        ignore_keys: parse_ignore_keys(&args.ignore_selector_keys),
        exclusion_window: args.exclusion_window,
    };
    let webhook = match &client {
        Some(c) => Webhook::with_claims(config, c.clone(), stop).await,
        None => {
            tracing::warn!("no upper cluster: pods are not pinned to the node of their volumes");
            Webhook::new(config)
        }
    };
    let listen = SocketAddr::new(args.address, args.port);
    let server = Server::start(listen, tls, Arc::new(webhook)).await?;
    if let (Some(name), Some(c)) = (&args.webhook_configuration, &client) {
        write_ca_bundle(c, name, &cert.ca_pem)
            .await
            .with_context(|| {
                format!("writing the caBundle of MutatingWebhookConfiguration {name}")
            })?;
    }
    tracing::info!(addr = %server.addr(), "webhook serving");
    Ok(server)
}

/// Puts `ca_pem` into every webhook of the configuration (retried once on a conflict).
pub async fn write_ca_bundle(
    client: &kube::Client,
    name: &str,
    ca_pem: &str,
) -> anyhow::Result<()> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let bundle = k8s_openapi::ByteString(ca_pem.as_bytes().to_vec());
    let mut last = None;
    for _ in 0..3 {
        let mut config = api.get(name).await?;
        for hook in config.webhooks.iter_mut().flatten() {
            hook.client_config.ca_bundle = Some(bundle.clone());
        }
        match api.replace(name, &PostParams::default(), &config).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => last = Some(s),
            Err(e) => return Err(e.into()),
        }
    }
    bail!("kept conflicting: {last:?}")
}

pub async fn run(args: WebhookArgs) -> anyhow::Result<()> {
    if args.master.is_some() || args.incluster.is_some() {
        tracing::warn!("--master and --incluster are accepted for compatibility and unused");
    }
    let client = match upper_source(args.kubeconfig.as_ref()) {
        Some(source) => {
            let mut registry = prometheus_client::registry::Registry::default();
            let calls = ApiCalls::new(&mut registry);
            Some(
                build_client(source.clone(), 50.0, 100, "upper", &calls)
                    .await
                    .with_context(|| format!("upper cluster from {source}"))?,
            )
        }
        None => None,
    };
    let stop = CancellationToken::new();
    let _server = start(&args, client, &stop).await?;
    crate::shutdown_signal().await?;
    stop.cancel();
    Ok(())
}
