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
use tensile_core::keys::OWNER_WEBHOOK;
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

/// Puts `ca_pem` into every webhook of the configuration, unless every one holds it already
/// (so that replicas sharing a CA do not rewrite it in turn): whether it wrote. The write
/// carries the resourceVersion read; a conflict reads again.
pub async fn write_ca_bundle(
    client: &kube::Client,
    name: &str,
    ca_pem: &str,
) -> anyhow::Result<bool> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let bundle = k8s_openapi::ByteString(ca_pem.as_bytes().to_vec());
    let mut last = None;
    for _ in 0..3 {
        let mut config = api.get(name).await?;
        let hooks = config.webhooks.iter_mut().flatten();
        let mut changed = false;
        for hook in hooks {
            if hook.client_config.ca_bundle.as_ref() != Some(&bundle) {
                hook.client_config.ca_bundle = Some(bundle.clone());
                changed = true;
            }
        }
        if !changed {
            return Ok(false);
        }
        match api.replace(name, &PostParams::default(), &config).await {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => last = Some(s),
            Err(e) => return Err(e.into()),
        }
    }
    bail!("kept conflicting: {last:?}")
}

/// Writes each new CA bundle (a CA joined or left `--tls-secret`) into the configuration,
/// retrying with back-off until it is written, until `stop`.
pub async fn keep_ca_bundle(
    client: kube::Client,
    name: String,
    mut bundle: tokio::sync::watch::Receiver<String>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            changed = bundle.changed() => if changed.is_err() { return },
        }
        let mut delay = Duration::from_secs(1);
        loop {
            let pem = bundle.borrow_and_update().clone();
            match write_ca_bundle(&client, &name, &pem).await {
                Ok(written) => {
                    if written {
                        tracing::info!(configuration = %name, "the CA bundle changed: caBundle written");
                    }
                    break;
                }
                Err(e) => {
                    tracing::warn!(configuration = %name, error = %format!("{e:#}"), retry_in = ?delay, "writing the caBundle");
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(Duration::from_secs(60));
                }
            }
        }
    }
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
