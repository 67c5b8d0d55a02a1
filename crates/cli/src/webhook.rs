//! `tensile webhook`: the mutating admission webhook (see `tensile_placement::webhook`),
//! accepting the original's flags.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Args;
use tensile_core::inject::{DEFAULT_IGNORE_SELECTOR_KEYS, parse_ignore_keys};
use tensile_core::keys::OWNER_WEBHOOK;
use tensile_placement::ca_bundle::{keep_ca_bundle, write_ca_bundle};
use tensile_placement::metrics::WebhookMetrics;
use tensile_placement::serve::{Server, tls_config_live};
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
    /// Serving certificate (PEM). Without --tlscert/--tlskey, the CA and certificate of
    /// --tls-secret, else a CA and a certificate for --tls-san generated at start.
    #[arg(long)]
    pub tlscert: Option<PathBuf>,
    /// Serving key (PEM).
    #[arg(long)]
    pub tlskey: Option<PathBuf>,
    /// Require client certificates signed by this CA (PEM).
    #[arg(long = "CA")]
    pub ca: Option<PathBuf>,
    #[command(flatten)]
    pub tls: crate::common::TlsSecretArgs,
    /// Names and addresses of a generated certificate (or of --tls-secret's).
    #[arg(long = "tls-san", default_values_t = ["tensile-webhook.kube-system.svc".to_owned(), "localhost".to_owned(), "127.0.0.1".to_owned()])]
    pub tls_san: Vec<String>,
    /// Upper-cluster kubeconfig, to read claims (pins pods to their volume's node) and to
    /// write the caBundle. Default: ~/.kube/config if it exists, else in-cluster.
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
    /// Namespace of the descheduler's exclusion records (its --namespace): which virtual
    /// nodes a workload is kept off after one of its pods was moved away from them.
    #[arg(long, default_value = "kube-system")]
    pub exclusions_namespace: String,
    /// Write the CA of the serving certificate into this MutatingWebhookConfiguration's
    /// webhooks at start, and with --tls-secret whenever its CA bundle changes (needs get and
    /// update on it).
    #[arg(long)]
    pub webhook_configuration: Option<String>,
    #[command(flatten)]
    pub metrics: crate::common::MetricsArgs,
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

/// Starts the webhook from its flags; `client` is the upper cluster. Its answers are counted in
/// `metrics`.
pub async fn start(
    args: &WebhookArgs,
    client: kube::Client,
    metrics: WebhookMetrics,
    stop: &CancellationToken,
) -> anyhow::Result<Server> {
    let source = crate::common::cert_source(
        args.tlscert.as_ref(),
        args.tlskey.as_ref(),
        ("--tlscert", "--tlskey"),
        args.tls.tls_secret.as_ref(),
        OWNER_WEBHOOK,
        &args.tls_san,
    )?;
    let serving =
        crate::common::serve_cert(source, &client, OWNER_WEBHOOK, &args.tls_san, stop).await?;
    let client_ca = args
        .ca
        .as_ref()
        .map(|p| {
            std::fs::read_to_string(p).with_context(|| format!("reading --CA {}", p.display()))
        })
        .transpose()?;
    let tls = tls_config_live(&serving.cert, client_ca.as_deref())?;
    let config = WebhookConfig {
        ignore_keys: parse_ignore_keys(&args.ignore_selector_keys),
        exclusions_namespace: args.exclusions_namespace.clone(),
    };
    let webhook = Webhook::connected(config, client.clone(), stop)
        .await
        .with_metrics(metrics);
    let listen = SocketAddr::new(args.address, args.port);
    let server = Server::start(listen, tls, Arc::new(webhook)).await?;
    if let Some(name) = &args.webhook_configuration {
        let bundle = serving.bundle.borrow().clone();
        write_ca_bundle(&client, name, &bundle)
            .await
            .with_context(|| {
                format!("writing the caBundle of MutatingWebhookConfiguration {name}")
            })?;
        tokio::spawn(keep_ca_bundle(
            client.clone(),
            name.clone(),
            serving.bundle,
            stop.clone(),
        ));
    }
    tracing::info!(addr = %server.addr(), "webhook serving");
    Ok(server)
}

pub async fn run(args: WebhookArgs) -> anyhow::Result<()> {
    if args.master.is_some() || args.incluster.is_some() {
        tracing::warn!("--master and --incluster are accepted for compatibility and unused");
    }
    let client = crate::common::client(
        crate::common::upper_source(args.kubeconfig.as_ref()),
        50.0,
        100,
        "upper",
    )
    .await?;
    let stop = CancellationToken::new();
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = WebhookMetrics::new(&mut registry);
    let (readiness, _) =
        crate::common::serve_metrics(&args.metrics, false, registry, &stop).await?;
    // Ready once serving: the claims and exclusions have listed by then (`Webhook::connected`).
    let _server = start(&args, client, metrics, &stop).await?;
    readiness.set_ready();
    crate::shutdown_signal().await?;
    stop.cancel();
    Ok(())
}
