//! The sandbox in one process: an upper cluster, lower clusters with simulated nodes, a virtual
//! node per lower cluster (labelled `clusterID=<lower cluster>`), and the placement components
//! wired in: the webhook registered in the upper cluster from the shipped configuration, the
//! descheduler, the scheduler extender called by the upper scheduler. `tensile up`, the benchmarks and the end-to-end tests all start it here.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use base64::Engine as _;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tensile_core::keys::{OWNER_SCHEDULER, OWNER_WEBHOOK};
use tensile_node::clients::KubeconfigSource;
use tensile_placement::descheduler::DeschedulerConfig;
use tensile_placement::extender::{
    DEFAULT_RESERVATION_TTL, ExtenderConfig, KUBE_SCHEDULER_USER, LowerClusterClient,
};
use tensile_placement::serve::{ClientAuth, Server, tls_config_live};
use tensile_placement::webhook::{Webhook, WebhookConfig};
use tensile_sim::apiserver::ApiServer;
use tensile_sim::apiserver::controllers::SchedulerExtender;
use tensile_sim::kubelet::{SimKubelet, SimNode};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The shipped MutatingWebhookConfiguration, registered as is but for where to call.
const WEBHOOK_CONFIGURATION: &str =
    include_str!("../../../deploy/webhook/mutating-webhook-configuration.yaml");

/// The shipped KubeSchedulerConfiguration snippet, which the upper scheduler follows but for
/// where to call and which CA to trust.
const SCHEDULER_CONFIGURATION: &str =
    include_str!("../../../deploy/scheduler/kube-scheduler-config.yaml");

/// The shipped extender entries, pointed at `url_prefix` with `ca_pem` trusted, presenting
/// `client` (the scheduler's client certificate).
fn shipped_extenders(
    url_prefix: &str,
    ca_pem: &str,
    client: &tensile_sim::certs::Issued,
) -> anyhow::Result<Vec<SchedulerExtender>> {
    let config: Value = serde_saphyr::from_str(SCHEDULER_CONFIGURATION)
        .context("the shipped kube-scheduler configuration")?;
    let mut extenders = SchedulerExtender::from_scheduler_config(&config)
        .map_err(|e| anyhow::anyhow!("the shipped kube-scheduler configuration: {e}"))?;
    for e in &mut extenders {
        e.url_prefix = url_prefix.to_owned();
        e.ca_pem = Some(ca_pem.to_owned());
        e.client_cert_pem = Some(client.cert_pem.clone());
        e.client_key_pem = Some(client.key_pem.clone());
    }
    Ok(extenders)
}

/// What to start.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    /// Address every server listens on.
    pub address: IpAddr,
    /// Port of the upper API server, lower cluster i on PORT+i; 0: free ports.
    pub port: u16,
    /// The nodes of each lower cluster.
    pub lowers: Vec<Vec<SimNode>>,
    /// Register the webhook in the upper cluster.
    pub webhook: bool,
    /// Run the descheduler with this configuration.
    pub descheduler: Option<DeschedulerConfig>,
    /// Run the scheduler extender and have the upper scheduler call it (filter, prioritize,
    /// bind).
    pub extender: bool,
    /// Where the extender counts its calls and reservations (benchmarks read them).
    pub extender_metrics: tensile_placement::metrics::ExtenderMetrics,
}

/// A running sandbox; [`Sandbox::stop`] shuts it down.
pub struct Sandbox {
    /// The upper cluster.
    pub upper: ApiServer,
    /// Lower clusters: name, API server, simulated nodes.
    pub lowers: Vec<(String, ApiServer, Option<SimKubelet>)>,
    /// The virtual nodes, one per lower cluster, in order.
    pub virtual_nodes: Vec<String>,
    stop: CancellationToken,
    handles: Vec<JoinHandle<()>>,
    _webhook: Option<Server>,
}

/// The port of cluster `index` (0 is the upper one).
fn port_of(base: u16, index: usize) -> anyhow::Result<u16> {
    if base == 0 {
        return Ok(0);
    }
    u16::try_from(index)
        .ok()
        .and_then(|i| base.checked_add(i))
        .with_context(|| format!("--port {base} leaves no room for {index} lower clusters"))
}

impl Sandbox {
    /// Starts everything, telling `progress` each step.
    pub async fn start(spec: SandboxSpec, progress: &dyn Fn(&str)) -> anyhow::Result<Self> {
        let listen = SocketAddr::new(spec.address, port_of(spec.port, 0)?);
        let (upper, _) = crate::sim::start_cluster("upper", listen, true, Vec::new(), 244).await?;
        progress(&format!("upper cluster on {}", upper.url()));
        let mut lowers = Vec::new();
        for (i, nodes) in spec.lowers.iter().enumerate() {
            let name = format!("lower-{}", i + 1);
            let listen = SocketAddr::new(spec.address, port_of(spec.port, i + 1)?);
            let octet = u8::try_from(i + 1)
                .map(|i| 243_u8.wrapping_add(i))
                .unwrap_or(243);
            let (server, kubelet) =
                crate::sim::start_cluster(&name, listen, true, nodes.clone(), octet).await?;
            progress(&format!(
                "{name} on {} with {} nodes",
                server.url(),
                nodes.len()
            ));
            lowers.push((name, server, kubelet));
        }

        let stop = CancellationToken::new();
        let upper_text = upper.kubeconfig("upper");
        let mut handles = Vec::new();
        let mut virtual_nodes = Vec::new();
        for (name, server, _) in &lowers {
            let node_name = format!("vk-{name}");
            let vn_args = crate::virtual_node::parse_args([
                "--nodename",
                &node_name,
                // Virtual pods tolerate not-ready and unreachable (the webhook adds that), not
                // the provider taint: the original's manifest disables it too.
                "--disable-taint",
            ])
            .context("virtual node flags")?;
            let address = spec.address.to_string();
            let label = format!("clusterID: {name}");
            let env = move |key: &str| match key {
                "VKUBELET_POD_IP" => Some(address.clone()),
                "VKUBELET_NODE_LABEL" => Some(label.clone()),
                _ => None,
            };
            let vn = crate::virtual_node::assemble(
                &vn_args,
                KubeconfigSource::Text(upper_text.clone()),
                KubeconfigSource::Text(server.kubeconfig(name)),
                None,
                &env,
                Some(SocketAddr::new(spec.address, 0)),
            )
            .await
            .with_context(|| format!("virtual node {node_name}"))?;
            let running = vn
                .start(stop.clone())
                .await
                .with_context(|| format!("starting virtual node {node_name}"))?;
            handles.push(running.handle);
            virtual_nodes.push(node_name);
        }
        progress(&format!("virtual nodes {}", virtual_nodes.join(", ")));

        let client = upper.client().await.context("upper cluster client")?;
        let webhook = if spec.webhook {
            let server = start_webhook(&client, spec.address, &stop).await?;
            progress(&format!("webhook on {}", server.addr()));
            Some(server)
        } else {
            None
        };
        if spec.extender {
            let mut clusters = Vec::new();
            for (name, server, _) in &lowers {
                clusters.push(LowerClusterClient {
                    id: name.clone(),
                    client: server
                        .client()
                        .await
                        .with_context(|| format!("{name} client"))?,
                });
            }
            // The upper scheduler authenticates as kube-scheduler does as shipped: a client
            // certificate for system:kube-scheduler, here from a CA of the sandbox's own.
            let clients = tensile_sim::certs::Ca::new("tensile-scheduler-clients")
                .context("the scheduler's client CA")?;
            let scheduler_cert = clients
                .issue_client(KUBE_SCHEDULER_USER, None)
                .context("the scheduler's client certificate")?;
            let running = tensile_placement::extender::start(
                ExtenderConfig {
                    upper: client.clone(),
                    clusters,
                    reservation_ttl: DEFAULT_RESERVATION_TTL,
                    listen: SocketAddr::new(spec.address, 0),
                    cert: serve_from_secret(
                        &client,
                        SCHEDULER_SECRET,
                        OWNER_SCHEDULER,
                        spec.address,
                        &stop,
                    )
                    .await?
                    .cert,
                    client_auth: Some(ClientAuth {
                        ca_pem: clients.cert_pem().to_owned(),
                        allowed_names: vec![KUBE_SCHEDULER_USER.to_owned()],
                    }),
                    insecure_without_client_auth: false,
                    metrics: spec.extender_metrics.clone(),
                },
                stop.clone(),
            )
            .await
            .context("starting the scheduler extender")?;
            upper.set_scheduler_extenders(shipped_extenders(
                &format!("https://{}", running.addr),
                &running.ca_pem,
                &scheduler_cert,
            )?);
            progress(&format!("scheduler extender on {}", running.addr));
            handles.push(running.handle);
        }
        if let Some(config) = spec.descheduler {
            let (client, stop) = (client.clone(), stop.clone());
            handles.push(tokio::spawn(async move {
                if let Err(e) = tensile_placement::descheduler::run(config, client, stop).await {
                    tracing::error!(error = %e, "descheduler stopped");
                }
            }));
            progress("descheduler running");
        }
        Ok(Self {
            upper,
            lowers,
            virtual_nodes,
            stop,
            handles,
            _webhook: webhook,
        })
    }

    /// Waits (on a watch) until every virtual node is Ready upstairs.
    pub async fn wait_ready(&self, within: Duration) -> anyhow::Result<()> {
        let client = self.upper.client().await?;
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client);
        let ready = |n: Option<&k8s_openapi::api::core::v1::Node>| {
            n.and_then(|n| n.status.as_ref())
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        };
        for name in &self.virtual_nodes {
            tokio::time::timeout(
                within,
                kube::runtime::wait::await_condition(nodes.clone(), name, ready),
            )
            .await
            .with_context(|| format!("virtual node {name} was not Ready within {within:?}"))?
            .with_context(|| format!("watching virtual node {name}"))?;
        }
        Ok(())
    }

    /// The stop token every component watches.
    pub fn stop_token(&self) -> &CancellationToken {
        &self.stop
    }

    /// Stops every component and cluster.
    pub async fn stop(self) {
        self.stop.cancel();
        for h in self.handles {
            let _ = tokio::time::timeout(Duration::from_secs(5), h).await;
        }
        for (_, server, kubelet) in &self.lowers {
            if let Some(k) = kubelet {
                k.stop();
            }
            server.stop();
        }
        self.upper.stop();
    }
}

/// Where the sandbox keeps the webhook's CA and serving certificate, as the shipped manifests
/// do (`--tls-secret`): `tensile up` exercises the Secret, its watch and the caBundle it keeps.
const WEBHOOK_SECRET: &str = "kube-system/tensile-webhook-tls";
/// The same for the scheduler extender.
const SCHEDULER_SECRET: &str = "kube-system/tensile-scheduler-tls";

/// A serving certificate for `address`, kept in `secret` of the upper cluster.
async fn serve_from_secret(
    client: &kube::Client,
    secret: &str,
    owner: &str,
    address: IpAddr,
    stop: &CancellationToken,
) -> anyhow::Result<crate::common::Serving> {
    let secret = secret.parse().map_err(anyhow::Error::msg)?;
    crate::common::serve_cert(
        crate::common::CertSource::Secret(secret),
        client,
        owner,
        &[address.to_string()],
        stop,
    )
    .await
    .with_context(|| format!("the serving certificate of {owner}"))
}

/// Serves the webhook on loopback and registers the shipped configuration, called by URL (the
/// sandbox has no service network), with the CA bundle of its Secret, kept current.
async fn start_webhook(
    client: &kube::Client,
    address: IpAddr,
    stop: &CancellationToken,
) -> anyhow::Result<Server> {
    let serving = serve_from_secret(client, WEBHOOK_SECRET, OWNER_WEBHOOK, address, stop).await?;
    let webhook = Webhook::connected(WebhookConfig::default(), client.clone(), stop).await;
    let server = Server::start(
        SocketAddr::new(address, 0),
        tls_config_live(&serving.cert, None)?,
        Arc::new(webhook),
    )
    .await?;
    let mut config: Value = serde_saphyr::from_str(WEBHOOK_CONFIGURATION)
        .context("the shipped webhook configuration")?;
    let url = format!("https://{}/mutate", server.addr());
    let bundle = serving.bundle.borrow().clone();
    for hook in config["webhooks"].as_array_mut().into_iter().flatten() {
        hook["clientConfig"] = json!({"url": url,
            "caBundle": base64::engine::general_purpose::STANDARD.encode(&bundle)});
    }
    let config: MutatingWebhookConfiguration =
        serde_json::from_value(config).context("the shipped webhook configuration")?;
    let name = config.metadata.name.clone().unwrap_or_default();
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &config)
        .await
        .context("registering the webhook")?;
    tokio::spawn(crate::webhook::keep_ca_bundle(
        client.clone(),
        name,
        serving.bundle,
        stop.clone(),
    ));
    Ok(server)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use tensile_sim::env::eventually;

    #[test]
    fn lower_clusters_take_the_ports_after_the_upper_one() {
        assert_eq!(port_of(7443, 0).unwrap(), 7443);
        assert_eq!(port_of(7443, 2).unwrap(), 7445);
        assert_eq!(port_of(0, 2).unwrap(), 0);
        assert!(port_of(65535, 1).is_err());
    }

    fn pod_running_on(p: &Pod) -> Option<String> {
        let running = p.status.as_ref()?.phase.as_deref() == Some("Running");
        running
            .then(|| p.spec.as_ref()?.node_name.clone())
            .flatten()
    }

    /// The issue's scenario: a pod that cannot fit in lower cluster A (its nodes are too
    /// small, though their sum is not) ends Running in lower cluster B, through its
    /// controller (a Deployment) and re-created by the descheduler (a bare pod that opted in).
    #[tokio::test]
    async fn a_pod_that_cannot_fit_in_lower_cluster_a_ends_running_in_b() {
        let node = |name: &str, cpu: &str| SimNode::new(name, cpu, "16Gi");
        let descheduler = DeschedulerConfig {
            policy: tensile_core::deschedule::Policy {
                unschedulable_for: k8s_openapi::jiff::SignedDuration::from_secs(2),
                ..Default::default()
            },
            ..Default::default()
        };
        let sandbox = Sandbox::start(
            SandboxSpec {
                address: "127.0.0.1".parse().unwrap(),
                port: 0,
                // Upstairs lower-1 looks bigger (12 CPU) than lower-2 (9 CPU), so the upper
                // scheduler sends a 4-CPU pod there first; no node of lower-1 can hold it.
                // lower-2 holds two.
                lowers: vec![
                    vec![
                        node("a-1", "3"),
                        node("a-2", "3"),
                        node("a-3", "3"),
                        node("a-4", "3"),
                    ],
                    vec![node("b-1", "9")],
                ],
                webhook: true,
                descheduler: Some(descheduler),
                extender: false,
                extender_metrics: Default::default(),
            },
            &|_| {},
        )
        .await
        .unwrap();
        sandbox.wait_ready(Duration::from_secs(30)).await.unwrap();
        let client = sandbox.upper.client().await.unwrap();
        let template = json!({"metadata": {"labels": {"app": "big", "virtual-pod": "true"}},
            "spec": {"containers": [{"name": "c", "image": "nginx",
                "resources": {"requests": {"cpu": "4", "memory": "1Gi"}}}]}});
        let deployment: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(json!({
            "metadata": {"name": "big"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "big"}}, "template": template}
        }))
        .unwrap();
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), "default")
            .create(&PostParams::default(), &deployment)
            .await
            .unwrap();
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        // It went to lower-1 first and was found Unschedulable there.
        eventually(
            60,
            "the Deployment's pod is Unschedulable on vk-lower-1",
            || async {
                pods.list(&Default::default())
                    .await
                    .unwrap()
                    .items
                    .iter()
                    .any(|p| {
                        p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("vk-lower-1")
                            && p.status
                                .as_ref()
                                .and_then(|s| s.conditions.as_ref())
                                .is_some_and(|c| {
                                    c.iter()
                                        .any(|c| c.reason.as_deref() == Some("Unschedulable"))
                                })
                    })
                    .then_some(())
            },
        )
        .await;
        eventually(90, "the Deployment's pod Running on vk-lower-2", || async {
            let list = pods.list(&Default::default()).await.unwrap().items;
            list.iter()
                .any(|p| pod_running_on(p).as_deref() == Some("vk-lower-2"))
                .then_some(())
        })
        .await;

        // A bare pod that opted in is re-created under its name by the descheduler.
        let mut bare: Pod = serde_json::from_value(template).unwrap();
        bare.metadata.name = Some("bare".into());
        bare.metadata.annotations = Some(
            [(
                "descheduler.alpha.kubernetes.io/evict".to_owned(),
                "true".to_owned(),
            )]
            .into(),
        );
        bare.spec.as_mut().unwrap().node_name = Some("vk-lower-1".into());
        pods.create(&PostParams::default(), &bare).await.unwrap();
        let moved = eventually(90, "the bare pod Running on vk-lower-2", || async {
            let p = pods.get_opt("bare").await.unwrap()?;
            (pod_running_on(&p).as_deref() == Some("vk-lower-2")).then_some(p)
        })
        .await;
        let annotations = moved.metadata.annotations.unwrap();
        assert_eq!(annotations["sigs.k8s.io/deschedule-count"], "1");
        assert_eq!(annotations["tensile-kube.io/excluded-nodes"], "vk-lower-1");
        assert_eq!(annotations["descheduler.alpha.kubernetes.io/evict"], "true");
        sandbox.stop().await;
    }
}
