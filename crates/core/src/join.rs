//! `tensile join` / `tensile unjoin` as functions of values: the objects joining a lower cluster
//! creates (rendered from the same manifests `deploy/` ships, never a copy of them), when its
//! stored credential is due for renewal, the scheduler extender's registration of a lower
//! cluster, and which upper pods keep an unjoin from going ahead.

use serde_json::{Value, json};

/// The field manager of every object join applies (server-side apply).
pub const FIELD_MANAGER: &str = "tensile-join";
/// Label on everything join creates, upstairs and downstairs: unjoin deletes only what has it.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`LABEL_MANAGED_BY`].
pub const MANAGED_BY_JOIN: &str = "tensile-join";
/// Label naming the lower cluster an object belongs to (the one `deploy/virtual-node/lower-1`
/// sets).
pub const LABEL_LOWER_CLUSTER: &str = "tensile-kube.io/lower-cluster";
/// Annotation on the kubeconfig Secret: the UID of the lower ServiceAccount its token is of.
pub const ANNOTATION_ACCOUNT_UID: &str = "tensile-kube.io/service-account-uid";
/// Annotation on the kubeconfig Secret: when its token was issued (RFC 3339).
pub const ANNOTATION_TOKEN_ISSUED: &str = "tensile-kube.io/token-issued";
/// Annotation on the kubeconfig Secret and on the virtual node's pod template: when the
/// token expires (RFC 3339). On the pod template it rolls the node's pods when join renews the
/// token, so they read the new one.
pub const ANNOTATION_TOKEN_EXPIRES: &str = "tensile-kube.io/token-expires";
/// Annotation on the kubeconfig Secret: the lower API server the kubeconfig points at.
pub const ANNOTATION_SERVER: &str = "tensile-kube.io/server";
/// Namespace of everything join creates upstairs, and of the identity downstairs.
pub const NAMESPACE: &str = "kube-system";
/// The lower ServiceAccount (as `deploy/lower` names it).
pub const LOWER_ACCOUNT: &str = "tensile";
/// The scheduler extender's Deployment upstairs (`deploy/scheduler`).
pub const EXTENDER_DEPLOYMENT: &str = "tensile-scheduler";
/// Its container.
pub const EXTENDER_CONTAINER: &str = "scheduler";

/// What is wrong with a join's input.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JoinError {
    /// The lower cluster's name cannot name objects.
    #[error(
        "invalid lower cluster name {0:?}: it names objects (vk-<name>, tensile-<name>-kubeconfig), so it must be a DNS label of lowercase letters, digits and '-', at most 40 characters"
    )]
    InvalidName(String),
    /// A shipped manifest lacks what the overlay replaces.
    #[error("the shipped manifest {what} has no {path}: deploy/ and join disagree")]
    Manifest {
        /// Which manifest.
        what: String,
        /// The JSON pointer looked for.
        path: String,
    },
}

/// Checks a lower cluster's name: a DNS label short enough for `tensile-<name>-kubeconfig`
/// and the election Lease `tensile-virtual-node-vk-<name>`.
pub fn validate_name(name: &str) -> Result<(), JoinError> {
    let ok = !name.is_empty()
        && name.len() <= 40
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(JoinError::InvalidName(name.to_owned()))
    }
}

/// The virtual node's name upstairs (`DEFAULTNODE_NAME` of `deploy/virtual-node/lower-1`).
pub fn node_name(name: &str) -> String {
    format!("vk-{name}")
}

/// The upper Secret holding the lower cluster's kubeconfig.
pub fn secret_name(name: &str) -> String {
    format!("tensile-{name}-kubeconfig")
}

/// The virtual node's Deployment (and PodDisruptionBudget) upstairs.
pub fn deployment_name(name: &str) -> String {
    format!("tensile-virtual-node-{name}")
}

fn add_labels(object: &mut Value, labels: &[(&str, &str)]) {
    let meta = &mut object["metadata"];
    if !meta["labels"].is_object() {
        meta["labels"] = json!({});
    }
    for (k, v) in labels {
        meta["labels"][*k] = json!(v);
    }
}

/// Whether a shipped object is a long-lived service-account token Secret: `deploy/lower` has
/// one for the manual path; join never creates it, its credential is a bounded token.
fn is_legacy_token(object: &Value) -> bool {
    object["kind"] == "Secret" && object["type"] == "kubernetes.io/service-account-token"
}

/// The lower cluster's objects: `deploy/lower` as shipped (namespace, ServiceAccount,
/// ClusterRole, ClusterRoleBinding), labelled as join's, without the long-lived token Secret.
pub fn lower_objects(shipped: &[Value], name: &str) -> Vec<Value> {
    shipped
        .iter()
        .filter(|o| !is_legacy_token(o))
        .cloned()
        .map(|mut o| {
            add_labels(
                &mut o,
                &[
                    (LABEL_MANAGED_BY, MANAGED_BY_JOIN),
                    (LABEL_LOWER_CLUSTER, name),
                ],
            );
            o
        })
        .collect()
}

/// The virtual nodes' shared identity upstairs (`deploy/virtual-node/rbac`), labelled as
/// join's. Shared by every joined lower cluster: unjoin deletes it with the last one.
pub fn upper_rbac_objects(shipped: &[Value]) -> Vec<Value> {
    shipped
        .iter()
        .cloned()
        .map(|mut o| {
            add_labels(&mut o, &[(LABEL_MANAGED_BY, MANAGED_BY_JOIN)]);
            o
        })
        .collect()
}

fn set(object: &mut Value, what: &str, path: &str, value: Value) -> Result<(), JoinError> {
    match object.pointer_mut(path) {
        Some(slot) => {
            *slot = value;
            Ok(())
        }
        None => Err(JoinError::Manifest {
            what: what.to_owned(),
            path: path.to_owned(),
        }),
    }
}

/// The virtual node of lower cluster `name`: `deploy/virtual-node/base` with what the overlay
/// `deploy/virtual-node/lower-1` does for lower-1 (name suffix, the lower-cluster label on the
/// objects and their selectors, node name, clusterID, Secret), the image, and the token's
/// expiry on the pod template when known.
pub fn virtual_node_objects(
    base: &[Value],
    name: &str,
    image: &str,
    token_expires: Option<&str>,
) -> Result<Vec<Value>, JoinError> {
    let mut out = Vec::new();
    for shipped in base {
        let mut o = shipped.clone();
        let kind = o["kind"].as_str().unwrap_or_default().to_owned();
        let base_name = o["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let what = format!("{kind}/{base_name}");
        o["metadata"]["name"] = json!(format!("{base_name}-{name}"));
        add_labels(&mut o, &[(LABEL_LOWER_CLUSTER, name)]);
        // kustomize's `labels` with includeSelectors: the selector and, for a workload, its
        // pod template get the label too.
        if let Some(sel) = o.pointer_mut("/spec/selector/matchLabels") {
            sel[LABEL_LOWER_CLUSTER] = json!(name);
        }
        if kind == "Deployment" {
            let template =
                o.pointer_mut("/spec/template/metadata")
                    .ok_or_else(|| JoinError::Manifest {
                        what: what.clone(),
                        path: "/spec/template/metadata".into(),
                    })?;
            add_labels_meta(template, &[(LABEL_LOWER_CLUSTER, name)]);
            if let Some(expires) = token_expires {
                if !template["annotations"].is_object() {
                    template["annotations"] = json!({});
                }
                template["annotations"][ANNOTATION_TOKEN_EXPIRES] = json!(expires);
            }
            label_affinity_selectors(&mut o, name);
            let c = "/spec/template/spec/containers/0";
            set(
                &mut o,
                &what,
                &format!("{c}/env/0/value"),
                json!(node_name(name)),
            )?;
            set(
                &mut o,
                &what,
                &format!("{c}/env/1/value"),
                json!(format!("clusterID:{name}")),
            )?;
            set(
                &mut o,
                &what,
                &format!("{c}/env/2/value"),
                json!(secret_name(name)),
            )?;
            set(&mut o, &what, &format!("{c}/image"), json!(image))?;
            set(
                &mut o,
                &what,
                "/spec/template/spec/volumes/0/secret/secretName",
                json!(secret_name(name)),
            )?;
        }
        // The overlay names the node's own user in its binding (the ClusterRole it binds is
        // the shared one of `deploy/virtual-node/rbac`, which keeps its name).
        if kind == "ClusterRoleBinding" && base_name == "tensile-virtual-node" {
            set(
                &mut o,
                &what,
                "/subjects/0/name",
                json!(format!("system:node:{}", node_name(name))),
            )?;
        }
        // The Role on the node's own kubeconfig Secret names it; its binding refers to the
        // Role by its suffixed name, as kustomize renames references to what it renames.
        if kind == "Role" && base_name == "tensile-virtual-node-kubeconfig" {
            set(
                &mut o,
                &what,
                "/rules/0/resourceNames/0",
                json!(secret_name(name)),
            )?;
        }
        if kind == "RoleBinding"
            && o.pointer("/roleRef/kind") == Some(&json!("Role"))
            && let Some(role) = o.pointer("/roleRef/name").and_then(Value::as_str)
            && base
                .iter()
                .any(|b| b["kind"] == "Role" && b["metadata"]["name"] == role)
        {
            let renamed = format!("{role}-{name}");
            o["roleRef"]["name"] = json!(renamed);
        }
        add_labels(&mut o, &[(LABEL_MANAGED_BY, MANAGED_BY_JOIN)]);
        out.push(o);
    }
    Ok(out)
}

/// kustomize's `labels` with includeSelectors also reaches the label selectors of the pod
/// template's (anti-)affinity terms, where they have `matchLabels`.
fn label_affinity_selectors(deployment: &mut Value, name: &str) {
    for kind in ["podAffinity", "podAntiAffinity"] {
        let Some(affinity) =
            deployment.pointer_mut(&format!("/spec/template/spec/affinity/{kind}"))
        else {
            continue;
        };
        for (list, prefix) in [
            (
                "preferredDuringSchedulingIgnoredDuringExecution",
                "/podAffinityTerm",
            ),
            ("requiredDuringSchedulingIgnoredDuringExecution", ""),
        ] {
            if let Some(terms) = affinity.get_mut(list).and_then(Value::as_array_mut) {
                for term in terms {
                    if let Some(m) =
                        term.pointer_mut(&format!("{prefix}/labelSelector/matchLabels"))
                    {
                        m[LABEL_LOWER_CLUSTER] = json!(name);
                    }
                }
            }
        }
    }
}

fn add_labels_meta(meta: &mut Value, labels: &[(&str, &str)]) {
    if !meta["labels"].is_object() {
        meta["labels"] = json!({});
    }
    for (k, v) in labels {
        meta["labels"][*k] = json!(v);
    }
}

/// A kubeconfig whose only user is the lower ServiceAccount's token.
pub fn kubeconfig(name: &str, server: &str, ca_data: Option<&str>, token: &str) -> Value {
    let mut cluster = json!({"server": server});
    if let Some(ca) = ca_data {
        cluster["certificate-authority-data"] = json!(ca);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": LOWER_ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": LOWER_ACCOUNT}}],
        "current-context": name,
    })
}

/// What a stored credential is, from its Secret's annotations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredCredential {
    /// UID of the ServiceAccount the token is of.
    pub account_uid: String,
    /// The lower API server of the kubeconfig.
    pub server: String,
    /// Issued, seconds since the epoch.
    pub issued: i64,
    /// Expires, seconds since the epoch.
    pub expires: i64,
}

/// Whether join must issue a new token: none stored, the ServiceAccount was re-created (the
/// old token is dead), the server changed, or less than a third of its life is left.
pub fn needs_new_token(
    stored: Option<&StoredCredential>,
    account_uid: &str,
    server: &str,
    now: i64,
) -> bool {
    let Some(s) = stored else { return true };
    if s.account_uid != account_uid || s.server != server || s.expires <= s.issued {
        return true;
    }
    let life = s.expires - s.issued;
    s.expires - now < life / 3
}

/// The upper Secret the virtual node reads its lower kubeconfig from.
pub fn kubeconfig_secret(
    name: &str,
    kubeconfig_text: &str,
    credential: &StoredCredential,
    issued: &str,
    expires: &str,
) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": secret_name(name),
            "namespace": NAMESPACE,
            "labels": {LABEL_MANAGED_BY: MANAGED_BY_JOIN, LABEL_LOWER_CLUSTER: name},
            "annotations": {
                ANNOTATION_ACCOUNT_UID: credential.account_uid,
                ANNOTATION_SERVER: credential.server,
                ANNOTATION_TOKEN_ISSUED: issued,
                ANNOTATION_TOKEN_EXPIRES: expires,
            },
        },
        "type": "Opaque",
        "stringData": {"kubeconfig": kubeconfig_text},
    })
}

fn extender_arg(name: &str) -> String {
    format!("--cluster={name}=/etc/tensile/{name}/kubeconfig")
}

fn extender_container(deployment: &mut Value) -> Option<&mut Value> {
    deployment
        .pointer_mut("/spec/template/spec/containers")?
        .as_array_mut()?
        .iter_mut()
        .find(|c| c["name"] == EXTENDER_CONTAINER)
}

fn push_missing(list: &mut Value, item: Value, same: impl Fn(&Value) -> bool) -> bool {
    if !list.is_array() {
        *list = json!([]);
    }
    match list.as_array_mut() {
        Some(items) if !items.iter().any(same) => {
            items.push(item);
            true
        }
        _ => false,
    }
}

/// Registers lower cluster `name` with the scheduler extender's Deployment as
/// `deploy/scheduler` does for lower-1: a `--cluster` argument and the kubeconfig Secret
/// mounted. Returns whether anything changed; `None` when the Deployment has no extender
/// container.
pub fn register_with_extender(deployment: &mut Value, name: &str) -> Option<bool> {
    let arg = extender_arg(name);
    let container = extender_container(deployment)?;
    let mut changed = push_missing(&mut container["args"], json!(arg), |a| *a == arg);
    changed |= push_missing(
        &mut container["volumeMounts"],
        json!({"name": name, "mountPath": format!("/etc/tensile/{name}"), "readOnly": true}),
        |m| m["name"] == name,
    );
    let volumes = deployment.pointer_mut("/spec/template/spec")?;
    changed |= push_missing(
        &mut volumes["volumes"],
        json!({"name": name, "secret": {"secretName": secret_name(name)}}),
        |v| v["name"] == name,
    );
    Some(changed)
}

/// Undoes [`register_with_extender`]. Returns whether anything changed.
pub fn unregister_from_extender(deployment: &mut Value, name: &str) -> bool {
    let arg = extender_arg(name);
    let mut changed = false;
    let mut retain = |list: Option<&mut Value>, keep: &dyn Fn(&Value) -> bool| {
        if let Some(items) = list.and_then(Value::as_array_mut) {
            let before = items.len();
            items.retain(keep);
            changed |= items.len() != before;
        }
    };
    if let Some(container) = extender_container(deployment) {
        retain(container.get_mut("args"), &|a| *a != arg);
        retain(container.get_mut("volumeMounts"), &|m| m["name"] != name);
    }
    retain(
        deployment.pointer_mut("/spec/template/spec/volumes"),
        &|v| {
            v["name"] != name || v.pointer("/secret/secretName") != Some(&json!(secret_name(name)))
        },
    );
    changed
}

/// The upper pods that keep an unjoin from going ahead: every pod bound to the node that has
/// not finished (`namespace/name`, sorted).
pub fn pods_still_running(pods: &[Value]) -> Vec<String> {
    let mut out: Vec<String> = pods
        .iter()
        .filter(|p| {
            !matches!(
                p.pointer("/status/phase").and_then(Value::as_str),
                Some("Succeeded" | "Failed")
            )
        })
        .map(|p| {
            format!(
                "{}/{}",
                p["metadata"]["namespace"].as_str().unwrap_or_default(),
                p["metadata"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect();
    out.sort();
    out
}

/// The kinds unjoin looks into before deleting a lower namespace the node created: anything of
/// these kinds that is not ours (and not made by the cluster itself) keeps the namespace.
pub const NAMESPACE_CONTENT_KINDS: [(&str, &str, &str); 8] = [
    ("", "v1", "Pod"),
    ("", "v1", "Service"),
    ("", "v1", "ConfigMap"),
    ("", "v1", "Secret"),
    ("", "v1", "ServiceAccount"),
    ("", "v1", "PersistentVolumeClaim"),
    ("rbac.authorization.k8s.io", "v1", "Role"),
    ("rbac.authorization.k8s.io", "v1", "RoleBinding"),
];

/// What the cluster puts in every namespace by itself: the `default` ServiceAccount (with its
/// legacy token Secret on old clusters) and the `kube-root-ca.crt` ConfigMap.
fn made_by_the_cluster(kind: &str, object: &Value) -> bool {
    let name = object.pointer("/metadata/name").and_then(Value::as_str);
    match kind {
        "ServiceAccount" => name == Some("default"),
        "ConfigMap" => name == Some("kube-root-ca.crt"),
        "Secret" => {
            object.get("type").and_then(Value::as_str)
                == Some("kubernetes.io/service-account-token")
                && object
                    .pointer("/metadata/annotations/kubernetes.io~1service-account.name")
                    .and_then(Value::as_str)
                    == Some("default")
        }
        _ => false,
    }
}

/// Whether unjoin deletes lower namespace `namespace`: only when node `owner` created it (our
/// owner label; a namespace we found, even one with our pods, is never deleted) and nothing of
/// anyone else is in it. `contents` are `(kind, object)` of [`NAMESPACE_CONTENT_KINDS`] in it.
/// `Err` names what keeps it (`kind/name`, sorted), `Ok(false)` when it is not ours.
pub fn namespace_deletable(
    namespace: &Value,
    owner: &str,
    contents: &[(&str, Value)],
) -> Result<bool, Vec<String>> {
    let ours = |o: &Value| {
        o.pointer("/metadata/labels")
            .and_then(|l| l.get(crate::keys::LABEL_OWNER))
            .and_then(Value::as_str)
            == Some(crate::keys::owner_label_value(owner).as_str())
    };
    if !ours(namespace) {
        return Ok(false);
    }
    let mut foreign: Vec<String> = contents
        .iter()
        .filter(|(kind, o)| !ours(o) && !made_by_the_cluster(kind, o))
        .map(|(kind, o)| {
            format!(
                "{}/{}",
                kind.to_lowercase(),
                o.pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
            )
        })
        .collect();
    foreign.sort();
    if foreign.is_empty() {
        Ok(true)
    } else {
        Err(foreign)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_must_be_short_dns_labels() {
        assert!(validate_name("lower-1").is_ok());
        for bad in ["", "Lower", "a_b", "-a", "a-", &"x".repeat(41), "a.b"] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_lower_objects_are_the_shipped_ones_without_the_long_lived_token() {
        let shipped = vec![
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "tensile", "namespace": "kube-system"}}),
            json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token", "metadata": {"name": "tensile-token"}}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "tensile-lower"}, "rules": []}),
        ];
        let out = lower_objects(&shipped, "lower-1");
        assert_eq!(out.len(), 2);
        assert_eq!(
            out[0]["metadata"]["labels"][LABEL_MANAGED_BY],
            MANAGED_BY_JOIN
        );
        assert_eq!(out[1]["metadata"]["labels"][LABEL_LOWER_CLUSTER], "lower-1");
        assert_eq!(out[1]["rules"], json!([]));
    }

    fn base() -> Vec<Value> {
        vec![
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "tensile-virtual-node", "namespace": "kube-system", "labels": {"a": "b"}},
                "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}},
                  "spec": {"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "podAffinityTerm": {"topologyKey": "h", "labelSelector": {"matchLabels": {"a": "b"}}}}]}},
                    "containers": [{"name": "vn", "image": "tensile",
                    "env": [{"name": "DEFAULTNODE_NAME", "value": "vk-lower"}, {"name": "VKUBELET_NODE_LABEL", "value": "clusterID:lower"},
                      {"name": "LOWER_KUBECONFIG_SECRET", "value": "tensile-lower-kubeconfig"}]}],
                    "volumes": [{"name": "lower-kubeconfig", "secret": {"secretName": "tensile-lower-kubeconfig"}}]}}}}),
            json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": "tensile-virtual-node", "namespace": "kube-system"},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"a": "b"}}}}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "tensile-virtual-node"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "tensile-virtual-node"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:node:vk-lower"}]}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "tensile-virtual-node-kubeconfig", "namespace": "kube-system"},
                "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["tensile-lower-kubeconfig"], "verbs": ["get", "update"]}]}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "tensile-virtual-node-kubeconfig", "namespace": "kube-system"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tensile-virtual-node-kubeconfig"},
                "subjects": [{"kind": "ServiceAccount", "name": "tensile-virtual-node", "namespace": "kube-system"}]}),
        ]
    }

    #[test]
    fn the_virtual_node_is_the_overlay_of_the_base() {
        let out = virtual_node_objects(&base(), "lower-3", "img:1", Some("2027-01-01T00:00:00Z"))
            .unwrap();
        let d = &out[0];
        assert_eq!(d["metadata"]["name"], "tensile-virtual-node-lower-3");
        assert_eq!(d["metadata"]["labels"][LABEL_LOWER_CLUSTER], "lower-3");
        assert_eq!(
            d["spec"]["selector"]["matchLabels"][LABEL_LOWER_CLUSTER],
            "lower-3"
        );
        let t = &d["spec"]["template"];
        assert_eq!(t["metadata"]["labels"][LABEL_LOWER_CLUSTER], "lower-3");
        assert_eq!(
            t["metadata"]["annotations"][ANNOTATION_TOKEN_EXPIRES],
            "2027-01-01T00:00:00Z"
        );
        // As kustomize's includeSelectors: the anti-affinity keeps apart this node's replicas.
        assert_eq!(
            t.pointer("/spec/affinity/podAntiAffinity/preferredDuringSchedulingIgnoredDuringExecution/0/podAffinityTerm/labelSelector/matchLabels")
                .unwrap()[LABEL_LOWER_CLUSTER],
            "lower-3"
        );
        let c = &t["spec"]["containers"][0];
        assert_eq!(c["env"][0]["value"], "vk-lower-3");
        assert_eq!(c["env"][1]["value"], "clusterID:lower-3");
        assert_eq!(c["image"], "img:1");
        assert_eq!(
            t["spec"]["volumes"][0]["secret"]["secretName"],
            "tensile-lower-3-kubeconfig"
        );
        let pdb = &out[1];
        assert_eq!(pdb["metadata"]["name"], "tensile-virtual-node-lower-3");
        assert_eq!(
            pdb["spec"]["selector"]["matchLabels"][LABEL_LOWER_CLUSTER],
            "lower-3"
        );
        // The node's own user gets the extra rights; the shared ClusterRole keeps its name.
        let binding = &out[2];
        assert_eq!(binding["metadata"]["name"], "tensile-virtual-node-lower-3");
        assert_eq!(binding["subjects"][0]["name"], "system:node:vk-lower-3");
        assert_eq!(binding["roleRef"]["name"], "tensile-virtual-node");
        // The node may rewrite its own kubeconfig Secret, and no other.
        assert_eq!(c["env"][2]["value"], "tensile-lower-3-kubeconfig");
        let role = &out[3];
        assert_eq!(
            role["metadata"]["name"],
            "tensile-virtual-node-kubeconfig-lower-3"
        );
        assert_eq!(
            role["rules"][0]["resourceNames"],
            json!(["tensile-lower-3-kubeconfig"])
        );
        assert_eq!(
            out[4]["roleRef"]["name"],
            "tensile-virtual-node-kubeconfig-lower-3"
        );
    }

    #[test]
    fn a_base_without_the_replaced_fields_is_an_error() {
        let mut b = base();
        b[0]["spec"]["template"]["spec"]["volumes"] = json!([]);
        assert!(matches!(
            virtual_node_objects(&b, "x", "i", None),
            Err(JoinError::Manifest { .. })
        ));
    }

    #[test]
    fn a_token_is_renewed_in_the_last_third_of_its_life_or_when_it_cannot_work() {
        let s = StoredCredential {
            account_uid: "u".into(),
            server: "https://l".into(),
            issued: 0,
            expires: 300,
        };
        assert!(!needs_new_token(Some(&s), "u", "https://l", 150));
        assert!(needs_new_token(Some(&s), "u", "https://l", 201));
        assert!(needs_new_token(Some(&s), "other", "https://l", 0));
        assert!(needs_new_token(Some(&s), "u", "https://m", 0));
        assert!(needs_new_token(None, "u", "https://l", 0));
    }

    #[test]
    fn the_extender_registration_is_added_once_and_removed() {
        let mut d = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "scheduler", "args": ["scheduler", "--cluster=lower-1=/etc/tensile/lower-1/kubeconfig"],
             "volumeMounts": [{"name": "lower-1", "mountPath": "/etc/tensile/lower-1", "readOnly": true}]}],
            "volumes": [{"name": "lower-1", "secret": {"secretName": "tensile-lower-1-kubeconfig"}}]}}}});
        let shipped = d.clone();
        assert_eq!(register_with_extender(&mut d, "lower-1"), Some(false));
        assert_eq!(register_with_extender(&mut d, "lower-3"), Some(true));
        assert_eq!(register_with_extender(&mut d, "lower-3"), Some(false));
        let c = &d["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(
            c["args"][2],
            "--cluster=lower-3=/etc/tensile/lower-3/kubeconfig"
        );
        assert_eq!(c["volumeMounts"][1]["mountPath"], "/etc/tensile/lower-3");
        assert_eq!(
            d["spec"]["template"]["spec"]["volumes"][1]["secret"]["secretName"],
            "tensile-lower-3-kubeconfig"
        );
        assert!(unregister_from_extender(&mut d, "lower-3"));
        assert!(!unregister_from_extender(&mut d, "lower-3"));
        assert_eq!(d, shipped);
        assert_eq!(register_with_extender(&mut json!({}), "x"), None);
    }

    #[test]
    fn only_finished_pods_let_an_unjoin_go_ahead() {
        let pods = vec![
            json!({"metadata": {"namespace": "b", "name": "p"}, "status": {"phase": "Running"}}),
            json!({"metadata": {"namespace": "a", "name": "q"}, "status": {"phase": "Succeeded"}}),
            json!({"metadata": {"namespace": "a", "name": "r"}}),
        ];
        assert_eq!(pods_still_running(&pods), vec!["a/r", "b/p"]);
    }

    #[test]
    fn only_a_namespace_we_created_holding_nothing_of_others_is_deleted() {
        let owner = "vk-lower-1";
        let ours =
            json!({"metadata": {"name": "team-a", "labels": {"tensile-kube.io/owner": owner}}});
        let found = json!({"metadata": {"name": "team-b"}});
        let other_node = json!({"metadata": {"name": "team-c", "labels": {"tensile-kube.io/owner": "vk-lower-2"}}});
        let automatic = vec![
            ("ServiceAccount", json!({"metadata": {"name": "default"}})),
            (
                "ConfigMap",
                json!({"metadata": {"name": "kube-root-ca.crt"}}),
            ),
            (
                "Secret",
                json!({"type": "kubernetes.io/service-account-token",
                "metadata": {"name": "default-token-x", "annotations": {"kubernetes.io/service-account.name": "default"}}}),
            ),
            (
                "Pod",
                json!({"metadata": {"name": "p", "labels": {"tensile-kube.io/owner": owner}}}),
            ),
        ];
        assert_eq!(namespace_deletable(&ours, owner, &automatic), Ok(true));
        assert_eq!(namespace_deletable(&found, owner, &[]), Ok(false));
        assert_eq!(namespace_deletable(&other_node, owner, &[]), Ok(false));
        let mut theirs = automatic.clone();
        theirs.push(("Pod", json!({"metadata": {"name": "their-pod"}})));
        theirs.push(("ConfigMap", json!({"metadata": {"name": "settings", "labels": {"tensile-kube.io/owner": "vk-lower-2"}}})));
        assert_eq!(
            namespace_deletable(&ours, owner, &theirs),
            Err(vec![
                "configmap/settings".to_owned(),
                "pod/their-pod".to_owned()
            ])
        );
    }
}
