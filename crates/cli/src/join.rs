//! `tensile join` and `tensile unjoin`: add a lower cluster to an upper one, or take it away,
//! with the contexts of the user's own kubeconfig. What is created is rendered from the
//! manifests `deploy/` ships (embedded here, never copied) by `tensile_core::join`; everything
//! is written by server-side apply under one field manager and labelled, so a second run changes
//! nothing and unjoin deletes only what join made.
//!
//! The credential stored upstairs is a TokenRequest token of the lower ServiceAccount
//! `kube-system/tensile`, with a bounded life (`--token-ttl`), never the user's own: deleting
//! the ServiceAccount (unjoin) revokes it at once, and running join again renews it once two
//! thirds of its life are gone (docs/deploy.md, "tensile join").

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use base64::Engine as _;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::Value;
use tensile_core::join::{self as plan, StoredCredential};

use tensile_core::duration::parse_duration;

/// One line of the report on stdout (a closed stdout ends nothing: the work is done).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `deploy/lower`: the identity in every lower cluster.
const LOWER_RBAC: &str = include_str!("../../../deploy/lower/rbac.yaml");
/// `deploy/virtual-node/rbac`: the virtual nodes' identity upstairs.
const UPPER_RBAC: &str = include_str!("../../../deploy/virtual-node/rbac/rbac.yaml");
/// `deploy/virtual-node/base`: one virtual node, which join renders for each lower cluster as
/// the overlays do.
const NODE_BASE: &str = include_str!("../../../deploy/virtual-node/base/deployment.yaml");
/// `deploy/virtual-node/base`'s binding of the node's own user (`system:node:<name>`) to what a
/// virtual node needs beyond a kubelet's rights.
const NODE_RBAC: &str = include_str!("../../../deploy/virtual-node/base/node-rbac.yaml");
/// The image `deploy/kustomization.yaml` sets.
const DEFAULT_IMAGE: &str = "ghcr.io/tensile-kube/tensile:0.1.0";

/// The two clusters `tensile join` and `tensile unjoin` work on, from the user's kubeconfig.
#[derive(Debug, clap::Args)]
pub struct ClusterPair {
    /// Kubeconfig holding both contexts (default: `KUBECONFIG`, which may list several files,
    /// else `~/.kube/config`).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Context of the upper cluster.
    #[arg(long)]
    upper_context: String,
    /// Context of the lower cluster (used to create the identity and issue its token; its
    /// credential is never stored).
    #[arg(long)]
    lower_context: String,
    /// Name of the lower cluster: the node is `vk-<name>`, labelled `clusterID=<name>`.
    #[arg(long)]
    name: String,
}

/// Flags of `tensile join`.
#[derive(Debug, clap::Args)]
pub struct JoinArgs {
    #[command(flatten)]
    clusters: ClusterPair,
    /// Image of the virtual node.
    #[arg(long, default_value = DEFAULT_IMAGE)]
    image: String,
    /// The lower API server's URL as the virtual node reaches it (default: the lower context's
    /// server).
    #[arg(long)]
    lower_server: Option<String>,
    /// Life of the lower token (Go duration); join renews it when run after two thirds of it.
    #[arg(long, default_value = "8760h", value_parser = parse_duration)]
    token_ttl: Duration,
    /// Also register the lower cluster with the scheduler extender (Deployment
    /// kube-system/tensile-scheduler, which must exist).
    #[arg(long)]
    placement: bool,
    /// Print what would be applied (YAML) and change nothing.
    #[arg(long)]
    dry_run: bool,
}

/// Flags of `tensile unjoin`: the clusters and the name join was given.
#[derive(Debug, clap::Args)]
pub struct UnjoinArgs {
    #[command(flatten)]
    clusters: ClusterPair,
}

fn parse_all(text: &str, what: &str) -> anyhow::Result<Vec<Value>> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(text).with_context(|| format!("parsing the shipped {what}"))?;
    Ok(docs.into_iter().filter(|d| d.is_object()).collect())
}

/// Everything join writes, rendered (the Secret apart: it needs the token).
struct Rendered {
    lower: Vec<Value>,
    upper_rbac: Vec<Value>,
}

fn render_fixed(name: &str) -> anyhow::Result<Rendered> {
    Ok(Rendered {
        lower: plan::lower_objects(&parse_all(LOWER_RBAC, "deploy/lower")?, name),
        upper_rbac: plan::upper_rbac_objects(&parse_all(UPPER_RBAC, "deploy/virtual-node/rbac")?),
    })
}

fn render_node(name: &str, image: &str, expires: Option<&str>) -> anyhow::Result<Vec<Value>> {
    let mut base = parse_all(NODE_BASE, "deploy/virtual-node/base")?;
    base.extend(parse_all(NODE_RBAC, "deploy/virtual-node/base")?);
    Ok(plan::virtual_node_objects(&base, name, image, expires)?)
}

fn load_kubeconfig(path: Option<&PathBuf>) -> anyhow::Result<Kubeconfig> {
    match path {
        Some(p) => {
            Kubeconfig::read_from(p).with_context(|| format!("reading kubeconfig {}", p.display()))
        }
        None => Kubeconfig::read().context("reading the kubeconfig (KUBECONFIG or ~/.kube/config)"),
    }
}

async fn client_of(kubeconfig: &Kubeconfig, context: &str) -> anyhow::Result<kube::Client> {
    let options = KubeConfigOptions {
        context: Some(context.to_owned()),
        ..KubeConfigOptions::default()
    };
    let config = kube::Config::from_custom_kubeconfig(kubeconfig.clone(), &options)
        .await
        .with_context(|| format!("context {context} of the kubeconfig"))?;
    kube::Client::try_from(config).with_context(|| format!("a client of context {context}"))
}

/// The lower API server of `context` and its CA (base64 PEM), for the stored kubeconfig.
fn server_of(kubeconfig: &Kubeconfig, context: &str) -> anyhow::Result<(String, Option<String>)> {
    let cluster_name = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context)
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone())
        .with_context(|| format!("the kubeconfig has no context {context}"))?;
    let cluster = kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == cluster_name)
        .and_then(|c| c.cluster.as_ref())
        .with_context(|| {
            format!("the kubeconfig has no cluster {cluster_name} (of context {context})")
        })?;
    let server = cluster
        .server
        .clone()
        .with_context(|| format!("cluster {cluster_name} of the kubeconfig has no server"))?;
    let ca = match (
        &cluster.certificate_authority_data,
        &cluster.certificate_authority,
    ) {
        (Some(data), _) => Some(data.clone()),
        (None, Some(file)) => Some(
            base64::engine::general_purpose::STANDARD
                .encode(std::fs::read(file).with_context(|| {
                    format!("reading CA file {file} of cluster {cluster_name}")
                })?),
        ),
        (None, None) => None,
    };
    Ok((server, ca))
}

/// The API resource of a shipped object (the kinds `deploy/` holds), and whether it is
/// namespaced.
fn resource_of(object: &Value) -> anyhow::Result<(ApiResource, bool)> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    let (plural, namespaced) = match kind {
        "Namespace" => ("namespaces", false),
        "ServiceAccount" => ("serviceaccounts", true),
        "Secret" => ("secrets", true),
        "ClusterRole" => ("clusterroles", false),
        "ClusterRoleBinding" => ("clusterrolebindings", false),
        "Role" => ("roles", true),
        "RoleBinding" => ("rolebindings", true),
        "Deployment" => ("deployments", true),
        "PodDisruptionBudget" => ("poddisruptionbudgets", true),
        other => bail!("join does not know kind {other} ({api_version})"),
    };
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    Ok((ApiResource::from_gvk_with_plural(&gvk, plural), namespaced))
}

fn api_for(client: &kube::Client, object: &Value) -> anyhow::Result<Api<DynamicObject>> {
    let (ar, namespaced) = resource_of(object)?;
    Ok(if namespaced {
        let ns = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or(plan::NAMESPACE);
        Api::namespaced_with(client.clone(), ns, &ar)
    } else {
        Api::all_with(client.clone(), &ar)
    })
}

fn describe(object: &Value) -> String {
    let kind = object["kind"].as_str().unwrap_or_default().to_lowercase();
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    match object["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// Applies `object` (server-side, our field manager, taking over fields another manager set)
/// and says what happened: created, configured or unchanged (same resourceVersion).
async fn apply(client: &kube::Client, cluster: &str, object: &Value) -> anyhow::Result<bool> {
    let api = api_for(client, object)?;
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let what = describe(object);
    let before = api
        .get_opt(name)
        .await
        .with_context(|| format!("reading {what} in {cluster}"))?
        .and_then(|o| o.metadata.resource_version);
    let after = api
        .patch(
            name,
            &PatchParams::apply(plan::FIELD_MANAGER).force(),
            &Patch::Apply(object),
        )
        .await
        .with_context(|| format!("applying {what} in {cluster}"))?;
    let (changed, word) = match before {
        None => (true, "created"),
        Some(rv) if after.metadata.resource_version.as_deref() == Some(rv.as_str()) => {
            (false, "unchanged")
        }
        Some(_) => (true, "configured"),
    };
    say!("{cluster}: {what} {word}");
    Ok(changed)
}

fn stored_credential(secret: &Secret) -> Option<StoredCredential> {
    let a = secret.metadata.annotations.as_ref()?;
    let time = |k: &str| a.get(k)?.parse::<Timestamp>().ok().map(|t| t.as_second());
    Some(StoredCredential {
        account_uid: a.get(plan::ANNOTATION_ACCOUNT_UID)?.clone(),
        server: a.get(plan::ANNOTATION_SERVER)?.clone(),
        issued: time(plan::ANNOTATION_TOKEN_ISSUED)?,
        expires: time(plan::ANNOTATION_TOKEN_EXPIRES)?,
    })
}

fn print_yaml(comment: &str, object: &Value) -> anyhow::Result<()> {
    let text = serde_saphyr::to_string(object).context("writing YAML")?;
    say!("---\n# {comment}\n{}", text.trim_end());
    Ok(())
}

/// `tensile join`.
pub async fn run_join(args: JoinArgs) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    plan::validate_name(&args.clusters.name)?;
    let kubeconfig = load_kubeconfig(args.clusters.kubeconfig.as_ref())?;
    let (context_server, ca) = server_of(&kubeconfig, &args.clusters.lower_context)?;
    let server = args.lower_server.clone().unwrap_or(context_server);
    let rendered = render_fixed(&args.clusters.name)?;
    let lower_at = format!(
        "lower {} (context {})",
        args.clusters.name, args.clusters.lower_context
    );
    let upper_at = format!("upper (context {})", args.clusters.upper_context);

    if args.dry_run {
        for o in &rendered.lower {
            print_yaml(&lower_at, o)?;
        }
        let kc = plan::kubeconfig(
            &args.clusters.name,
            &server,
            ca.as_deref(),
            "<a TokenRequest token, issued when applied>",
        );
        let credential = StoredCredential {
            account_uid: "<uid of kube-system/tensile downstairs>".into(),
            server: server.clone(),
            issued: 0,
            expires: 0,
        };
        let secret = plan::kubeconfig_secret(
            &args.clusters.name,
            &serde_saphyr::to_string(&kc).context("writing the kubeconfig")?,
            &credential,
            "<when issued>",
            "<when it expires>",
        );
        print_yaml(&upper_at, &secret)?;
        for o in
            rendered
                .upper_rbac
                .iter()
                .chain(&render_node(&args.clusters.name, &args.image, None)?)
        {
            print_yaml(&upper_at, o)?;
        }
        if args.placement {
            say!(
                "---\n# {upper_at}: deployment kube-system/{} gets --cluster={n}=/etc/tensile/{n}/kubeconfig and Secret {} mounted",
                plan::EXTENDER_DEPLOYMENT,
                plan::secret_name(&args.clusters.name),
                n = args.clusters.name
            );
        }
        return Ok(());
    }

    let upper = client_of(&kubeconfig, &args.clusters.upper_context).await?;
    let lower = client_of(&kubeconfig, &args.clusters.lower_context).await?;
    let mut changed = 0usize;
    for o in &rendered.lower {
        changed += usize::from(apply(&lower, &lower_at, o).await?);
    }

    // The credential: a token of the lower ServiceAccount, kept while it is fresh.
    let account = Api::<ServiceAccount>::namespaced(lower.clone(), plan::NAMESPACE)
        .get(plan::LOWER_ACCOUNT)
        .await
        .with_context(|| format!("reading serviceaccount kube-system/tensile in {lower_at}"))?;
    let account_uid = account.metadata.uid.clone().unwrap_or_default();
    let secrets = Api::<Secret>::namespaced(upper.clone(), plan::NAMESPACE);
    let secret_name = plan::secret_name(&args.clusters.name);
    let stored = secrets
        .get_opt(&secret_name)
        .await
        .with_context(|| format!("reading secret kube-system/{secret_name} in {upper_at}"))?
        .as_ref()
        .and_then(stored_credential);
    let now = Timestamp::now();
    let expires = if plan::needs_new_token(stored.as_ref(), &account_uid, &server, now.as_second())
    {
        let ttl = i64::try_from(args.token_ttl.as_secs()).unwrap_or(i64::MAX);
        let request = TokenRequest {
            spec: TokenRequestSpec {
                expiration_seconds: Some(ttl),
                ..TokenRequestSpec::default()
            },
            ..TokenRequest::default()
        };
        let issued = Api::<ServiceAccount>::namespaced(lower.clone(), plan::NAMESPACE)
            .create_token_request(plan::LOWER_ACCOUNT, &PostParams::default(), &request)
            .await
            .with_context(|| {
                format!("requesting a token of serviceaccount kube-system/tensile in {lower_at}")
            })?;
        let status = issued
            .status
            .with_context(|| format!("the TokenRequest in {lower_at} came back without a token"))?;
        // The server may shorten the life asked for: its answer is what counts.
        let expires = status.expiration_timestamp.0;
        let kc = plan::kubeconfig(&args.clusters.name, &server, ca.as_deref(), &status.token);
        let credential = StoredCredential {
            account_uid: account_uid.clone(),
            server: server.clone(),
            issued: now.as_second(),
            expires: expires.as_second(),
        };
        let mut secret = plan::kubeconfig_secret(
            &args.clusters.name,
            &serde_saphyr::to_string(&kc).context("writing the kubeconfig")?,
            &credential,
            &now.to_string(),
            &expires.to_string(),
        );
        // `data`, not `stringData`: a write-only field would make every apply look changed.
        if let Some(text) = secret
            .get_mut("stringData")
            .and_then(|s| s.get("kubeconfig"))
            .cloned()
        {
            let b64 =
                base64::engine::general_purpose::STANDARD.encode(text.as_str().unwrap_or_default());
            secret["data"] = serde_json::json!({"kubeconfig": b64});
            if let Some(m) = secret.as_object_mut() {
                m.remove("stringData");
            }
        }
        changed += usize::from(apply(&upper, &upper_at, &secret).await?);
        say!("{upper_at}: token of kube-system/tensile in {lower_at} issued, expires {expires}");
        expires.to_string()
    } else {
        let expires = stored
            .as_ref()
            .and_then(|s| Timestamp::from_second(s.expires).ok())
            .map(|t| t.to_string())
            .unwrap_or_default();
        say!(
            "{upper_at}: secret kube-system/{secret_name} unchanged (its token expires {expires})"
        );
        expires
    };

    for o in rendered.upper_rbac.iter().chain(&render_node(
        &args.clusters.name,
        &args.image,
        Some(&expires),
    )?) {
        changed += usize::from(apply(&upper, &upper_at, o).await?);
    }

    if args.placement {
        let deployments: Api<DynamicObject> = Api::namespaced_with(
            upper.clone(),
            plan::NAMESPACE,
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("apps", "v1", "Deployment"),
                "deployments",
            ),
        );
        let current = deployments
            .get_opt(plan::EXTENDER_DEPLOYMENT)
            .await
            .with_context(|| format!("reading the scheduler extender in {upper_at}"))?
            .with_context(|| {
                format!(
                    "--placement: {upper_at} has no deployment kube-system/{}: install the extender first (helm, or kubectl apply -k deploy)",
                    plan::EXTENDER_DEPLOYMENT
                )
            })?;
        let mut value = serde_json::to_value(&current).context("the extender's Deployment")?;
        match plan::register_with_extender(&mut value, &args.clusters.name) {
            None => bail!(
                "deployment kube-system/{} in {upper_at} has no container {}",
                plan::EXTENDER_DEPLOYMENT,
                plan::EXTENDER_CONTAINER
            ),
            Some(false) => say!(
                "{upper_at}: deployment kube-system/{} unchanged (already has {})",
                plan::EXTENDER_DEPLOYMENT,
                args.clusters.name
            ),
            Some(true) => {
                // A read-modify-write under resourceVersion: the args list is atomic, so an
                // apply would take the whole list over from whoever installed the extender.
                let object: DynamicObject =
                    serde_json::from_value(value).context("the extender's Deployment")?;
                deployments
                    .replace(plan::EXTENDER_DEPLOYMENT, &PostParams::default(), &object)
                    .await
                    .with_context(|| {
                        format!(
                            "registering {} with the scheduler extender in {upper_at}",
                            args.clusters.name
                        )
                    })?;
                say!(
                    "{upper_at}: deployment kube-system/{} configured",
                    plan::EXTENDER_DEPLOYMENT
                );
                changed += 1;
            }
        }
    }

    if changed == 0 {
        say!("{} was already joined: nothing changed", args.clusters.name);
    } else {
        say!(
            "{} joined as node {} ({changed} changes in {:.1} s)",
            args.clusters.name,
            plan::node_name(&args.clusters.name),
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// Deletes `kind/name` (in `namespace`) when it exists and carries join's label.
async fn delete_ours(client: &kube::Client, cluster: &str, object: &Value) -> anyhow::Result<bool> {
    let api = api_for(client, object)?;
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let what = describe(object);
    let Some(current) = api
        .get_opt(name)
        .await
        .with_context(|| format!("reading {what} in {cluster}"))?
    else {
        return Ok(false);
    };
    let ours = current
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(plan::LABEL_MANAGED_BY))
        .is_some_and(|v| v == plan::MANAGED_BY_JOIN);
    if !ours {
        say!("{cluster}: {what} left alone: join did not create it");
        return Ok(false);
    }
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => {
            say!("{cluster}: {what} deleted");
            return Ok(true);
        }
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(e).with_context(|| format!("deleting {what} in {cluster}")),
    }
    Ok(false)
}

/// Deletes `name` through `api` when it exists (objects the node made, not labelled by join).
async fn delete_if_present<K>(
    api: &Api<K>,
    name: &str,
    cluster: &str,
    what: &str,
) -> anyhow::Result<bool>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => {
            say!("{cluster}: {what} deleted");
            Ok(true)
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e).with_context(|| format!("deleting {what} in {cluster}")),
    }
}

/// Waits, on a watch, until no pod of the virtual node's Deployment is left (a node process
/// still running would register its node again).
async fn wait_node_pods_gone(
    upper: &kube::Client,
    name: &str,
    upper_at: &str,
) -> anyhow::Result<()> {
    use futures::TryStreamExt as _;
    use kube::runtime::watcher;
    use std::collections::BTreeSet;

    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(upper.clone(), plan::NAMESPACE);
    let selector = format!(
        "app.kubernetes.io/name=tensile-virtual-node,{}={name}",
        plan::LABEL_LOWER_CLUSTER
    );
    let mut left: BTreeSet<String> = BTreeSet::new();
    let mut listing: BTreeSet<String> = BTreeSet::new();
    let wait = async {
        let mut events =
            std::pin::pin!(watcher(pods, watcher::Config::default().labels(&selector)));
        while let Some(event) = events.try_next().await? {
            let name_of =
                |p: &k8s_openapi::api::core::v1::Pod| p.metadata.name.clone().unwrap_or_default();
            match event {
                watcher::Event::Init => listing.clear(),
                watcher::Event::InitApply(p) => {
                    listing.insert(name_of(&p));
                }
                watcher::Event::InitDone => {
                    left = std::mem::take(&mut listing);
                    if left.is_empty() {
                        return Ok(());
                    }
                }
                watcher::Event::Apply(p) => {
                    left.insert(name_of(&p));
                }
                watcher::Event::Delete(p) => {
                    left.remove(&name_of(&p));
                    if left.is_empty() {
                        return Ok(());
                    }
                }
            }
        }
        Ok::<(), watcher::Error>(())
    };
    match tokio::time::timeout(Duration::from_secs(120), wait).await {
        Ok(r) => r.with_context(|| format!("watching the virtual node's pods in {upper_at}")),
        Err(_) => bail!(
            "the virtual node's pods in {upper_at} did not stop within 120 s: {}",
            left.iter().cloned().collect::<Vec<_>>().join(", ")
        ),
    }
}

/// Deletes the lower namespaces node `node` created (owner label) that hold nothing of anyone
/// else (`tensile_core::join::namespace_deletable`); says why it keeps the others.
async fn delete_node_namespaces(
    lower: &kube::Client,
    lower_at: &str,
    node: &str,
) -> anyhow::Result<usize> {
    use k8s_openapi::api::core::v1::Namespace;
    let namespaces = Api::<Namespace>::all(lower.clone());
    let selector = format!(
        "{}={}",
        tensile_core::keys::LABEL_OWNER,
        tensile_core::keys::owner_label_value(node)
    );
    let marked = namespaces
        .list(&ListParams::default().labels(&selector))
        .await
        .with_context(|| format!("listing the namespaces node {node} created in {lower_at}"))?;
    let mut deleted = 0;
    for ns in marked.items {
        let name = ns.metadata.name.clone().unwrap_or_default();
        if ns.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let mut contents = Vec::new();
        for (group, version, kind) in plan::NAMESPACE_CONTENT_KINDS {
            let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
            let list = Api::<DynamicObject>::namespaced_with(lower.clone(), &name, &ar)
                .list(&ListParams::default())
                .await
                .with_context(|| {
                    format!(
                        "listing the {}s of namespace {name} in {lower_at}",
                        kind.to_lowercase()
                    )
                })?;
            for o in list.items {
                contents.push((kind, serde_json::to_value(&o).context("reading objects")?));
            }
        }
        let value = serde_json::to_value(&ns).context("reading namespaces")?;
        match plan::namespace_deletable(&value, node, &contents) {
            Ok(false) => {}
            Ok(true) => {
                deleted += usize::from(
                    delete_if_present(&namespaces, &name, lower_at, &format!("namespace {name}"))
                        .await?,
                );
            }
            Err(foreign) => say!(
                "{lower_at}: namespace {name} left alone: node {node} created it, but it holds {}",
                foreign.join(", ")
            ),
        }
    }
    Ok(deleted)
}

/// `tensile unjoin`.
pub async fn run_unjoin(args: UnjoinArgs) -> anyhow::Result<()> {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{Node, Pod};

    plan::validate_name(&args.clusters.name)?;
    let kubeconfig = load_kubeconfig(args.clusters.kubeconfig.as_ref())?;
    let upper = client_of(&kubeconfig, &args.clusters.upper_context).await?;
    let lower = client_of(&kubeconfig, &args.clusters.lower_context).await?;
    let lower_at = format!(
        "lower {} (context {})",
        args.clusters.name, args.clusters.lower_context
    );
    let upper_at = format!("upper (context {})", args.clusters.upper_context);
    let node = plan::node_name(&args.clusters.name);
    let mut deleted = 0usize;

    // Refuse while the node runs pods: unjoining would strand them.
    let bound = Api::<Pod>::all(upper.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .with_context(|| format!("listing the pods of node {node} in {upper_at}"))?;
    let values: Vec<Value> = bound
        .items
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<_, _>>()
        .context("reading pods")?;
    let running = plan::pods_still_running(&values);
    if !running.is_empty() {
        bail!(
            "node {node} still runs {} pod(s): {}; drain it first (kubectl drain {node} --ignore-daemonsets --delete-emptydir-data) and run unjoin again",
            running.len(),
            running.join(", ")
        );
    }

    let rendered = render_fixed(&args.clusters.name)?;
    // Upstairs: the node's Deployment first (its pods stop), then what the node registered,
    // then its Secret.
    for o in render_node(&args.clusters.name, "", None)? {
        deleted += usize::from(delete_ours(&upper, &upper_at, &o).await?);
    }
    wait_node_pods_gone(&upper, &args.clusters.name, &upper_at).await?;
    deleted += usize::from(
        delete_if_present(
            &Api::<Node>::all(upper.clone()),
            &node,
            &upper_at,
            &format!("node {node}"),
        )
        .await?,
    );
    deleted += usize::from(
        delete_if_present(
            &Api::<Lease>::namespaced(upper.clone(), "kube-node-lease"),
            &node,
            &upper_at,
            &format!("lease kube-node-lease/{node}"),
        )
        .await?,
    );
    let election = format!("tensile-virtual-node-{node}");
    deleted += usize::from(
        delete_if_present(
            &Api::<Lease>::namespaced(upper.clone(), plan::NAMESPACE),
            &election,
            &upper_at,
            &format!("lease kube-system/{election}"),
        )
        .await?,
    );
    let secret = serde_json::json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": plan::secret_name(&args.clusters.name), "namespace": plan::NAMESPACE}});
    deleted += usize::from(delete_ours(&upper, &upper_at, &secret).await?);

    // The extender forgets the cluster, when it was registered.
    let deployments: Api<DynamicObject> = Api::namespaced_with(
        upper.clone(),
        plan::NAMESPACE,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apps", "v1", "Deployment"),
            "deployments",
        ),
    );
    if let Some(current) = deployments
        .get_opt(plan::EXTENDER_DEPLOYMENT)
        .await
        .with_context(|| format!("reading the scheduler extender in {upper_at}"))?
    {
        let mut value = serde_json::to_value(&current).context("the extender's Deployment")?;
        if plan::unregister_from_extender(&mut value, &args.clusters.name) {
            let object: DynamicObject =
                serde_json::from_value(value).context("the extender's Deployment")?;
            deployments
                .replace(plan::EXTENDER_DEPLOYMENT, &PostParams::default(), &object)
                .await
                .with_context(|| {
                    format!(
                        "removing {} from the scheduler extender in {upper_at}",
                        args.clusters.name
                    )
                })?;
            say!(
                "{upper_at}: deployment kube-system/{} configured",
                plan::EXTENDER_DEPLOYMENT
            );
        }
    }

    // The shared identity of the virtual nodes goes with the last joined one.
    let others = deployments
        .list_metadata(&ListParams::default().labels(&format!(
            "app.kubernetes.io/name=tensile-virtual-node,{}={}",
            plan::LABEL_MANAGED_BY,
            plan::MANAGED_BY_JOIN
        )))
        .await
        .with_context(|| format!("listing the joined virtual nodes in {upper_at}"))?;
    if others.items.is_empty() {
        for o in rendered.upper_rbac.iter().rev() {
            deleted += usize::from(delete_ours(&upper, &upper_at, o).await?);
        }
    } else {
        say!(
            "{upper_at}: the virtual nodes' RBAC stays: {} other joined lower cluster(s) use it",
            others.items.len()
        );
    }

    // Downstairs: the namespaces the node created (its owner mark), unless something of
    // anyone else is in them; never one the node found.
    deleted += delete_node_namespaces(&lower, &lower_at, &node).await?;

    // Downstairs: the identity (deleting the ServiceAccount revokes the stored token).
    for o in rendered.lower.iter().rev() {
        deleted += usize::from(delete_ours(&lower, &lower_at, o).await?);
    }
    if deleted == 0 {
        say!(
            "nothing of {} was found: it is not joined",
            args.clusters.name
        );
    } else {
        say!("{} unjoined", args.clusters.name);
    }
    Ok(())
}
