//! The virtual node as the upper cluster sees it: its labels, taints, addresses, daemon
//! endpoint, node info, conditions, capacity and the annotations with the largest pod a single
//! lower node fits. An unreachable lower cluster leaves the node Ready (until an optional grace
//! runs out) but tainted NoSchedule, see [`node_health`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus,
    NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::keys::{
    EFFECT_NO_EXECUTE, EFFECT_NO_SCHEDULE, EFFECT_PREFER_NO_SCHEDULE, LABEL_ARCH, LABEL_HOSTNAME,
    LABEL_NODE_TYPE, LABEL_OS, LABEL_OS_BETA, RESOURCE_VIRTUAL_POD, TAINT_VIRTUAL_KUBELET,
    TAINT_VIRTUAL_KUBELET_VALUE, VALUE_NODE_TYPE_VIRTUAL,
};
use crate::quantity::format_quantity;
use crate::resources::{
    RESOURCE_PODS, ResourceVector, format_for_resource, node_status_quantities,
};

/// Annotation prefix of the largest pod a single lower node fits, per resource
/// (`tensile-kube.io/largest-pod-cpu: "3500m"`), for schedulers that look before they bind.
pub const ANNOTATION_LARGEST_POD_PREFIX: &str = "tensile-kube.io/largest-pod-";
/// Condition type set while the lower cluster cannot be reached.
pub const CONDITION_LOWER_REACHABLE: &str = "tensile-kube.io/LowerClusterReachable";
/// Reason of the lower-reachable condition (still `True`) while the lower cluster answers but
/// some requests fail there (throttled or server errors): shown, nothing tainted.
pub const REASON_LOWER_ERRORS: &str = "LowerClusterErrors";
/// Taint put on the virtual node while the lower cluster cannot be reached, so nothing new is
/// placed there while the pods already there are left alone.
pub const TAINT_LOWER_UNREACHABLE: &str = "tensile-kube.io/lower-cluster-unreachable";

/// What identifies and describes a virtual node, from flags and environment.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeIdentity {
    /// `--nodename`.
    pub name: String,
    /// `VKUBELET_NODE_LABEL`, parsed.
    pub extra_label: Option<(String, String)>,
    /// The taint, unless `--disable-taint`.
    pub taint: Option<Taint>,
    /// `VKUBELET_POD_IP`.
    pub internal_ip: String,
    /// `VKUBELET_EXTERNAL_POD_IP`.
    pub external_ip: Option<String>,
    /// `KUBELET_PORT`.
    pub kubelet_port: i32,
    /// The lower API server's gitVersion.
    pub lower_version: String,
}

/// A bad flag or environment value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeConfigError {
    /// `VKUBELET_TAINT_EFFECT` is not a taint effect.
    #[error("invalid taint effect {0:?}: must be NoSchedule, PreferNoSchedule or NoExecute")]
    TaintEffect(String),
    /// `KUBELET_PORT` is not a port.
    #[error("invalid KUBELET_PORT {0:?}: must be an integer between 1 and 65535")]
    Port(String),
    /// An entry of `--service-exclude` is not `namespace/name`.
    #[error("invalid --service-exclude entry {0:?}: expected namespace/name")]
    ServiceExclude(String),
}

/// The extra controllers `--enable-controllers` turns on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExtraControllers {
    /// `ServiceControllers`: Services and Endpoints mirrored downstairs.
    pub services: bool,
    /// `PVControllers`: PVC binding mirrored upstairs.
    pub volumes: bool,
    /// Names that are not controllers (the original only warned about them; so do we).
    pub unknown: Vec<String>,
}

/// `--enable-controllers`: a comma list of `PVControllers` and `ServiceControllers`; empty
/// items are skipped, names are trimmed.
pub fn parse_controllers(text: &str) -> ExtraControllers {
    let mut controllers = ExtraControllers::default();
    for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match name {
            "ServiceControllers" => controllers.services = true,
            "PVControllers" => controllers.volumes = true,
            other => controllers.unknown.push(other.to_owned()),
        }
    }
    controllers
}

/// The Services kept upstairs: `--service-exclude-namespaces` (comma list of namespaces) and
/// `--service-exclude` (comma list of `namespace/name`).
pub fn parse_service_filter(
    namespaces: &str,
    services: &str,
) -> Result<crate::services::ServiceFilter, NodeConfigError> {
    let list = |text: &str| -> Vec<String> {
        text.split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let excluded_services = list(services);
    if let Some(bad) = excluded_services.iter().find(|s| {
        s.split_once('/')
            .is_none_or(|(ns, name)| ns.is_empty() || name.is_empty() || name.contains('/'))
    }) {
        return Err(NodeConfigError::ServiceExclude(bad.clone()));
    }
    Ok(crate::services::ServiceFilter {
        excluded_namespaces: list(namespaces),
        excluded_services,
    })
}

/// `VKUBELET_NODE_LABEL=key:value`: applied only when it has exactly two parts; both trimmed.
pub fn parse_node_label(text: &str) -> Option<(String, String)> {
    let parts: Vec<&str> = text.split(':').collect();
    match parts.as_slice() {
        [k, v] => Some((k.trim().to_owned(), v.trim().to_owned())),
        _ => None,
    }
}

/// The taint from `VKUBELET_TAINT_KEY/VALUE/EFFECT` (defaults: `virtual-kubelet.io/provider`,
/// `k8s`, `NoSchedule`), or none with `--disable-taint`.
pub fn node_taint(
    disabled: bool,
    key: Option<&str>,
    value: Option<&str>,
    effect: Option<&str>,
) -> Result<Option<Taint>, NodeConfigError> {
    let effect = effect
        .filter(|e| !e.is_empty())
        .unwrap_or(EFFECT_NO_SCHEDULE);
    if ![
        EFFECT_NO_SCHEDULE,
        EFFECT_PREFER_NO_SCHEDULE,
        EFFECT_NO_EXECUTE,
    ]
    .contains(&effect)
    {
        return Err(NodeConfigError::TaintEffect(effect.to_owned()));
    }
    if disabled {
        return Ok(None);
    }
    Ok(Some(Taint {
        key: key
            .filter(|k| !k.is_empty())
            .unwrap_or(TAINT_VIRTUAL_KUBELET)
            .to_owned(),
        value: Some(
            value
                .filter(|v| !v.is_empty())
                .unwrap_or(TAINT_VIRTUAL_KUBELET_VALUE)
                .to_owned(),
        ),
        effect: effect.to_owned(),
        time_added: None,
    }))
}

/// `KUBELET_PORT` (default 10250); a non-integer is a startup error.
pub fn kubelet_port(text: Option<&str>) -> Result<i32, NodeConfigError> {
    match text.map(str::trim).filter(|t| !t.is_empty()) {
        None => Ok(10250),
        Some(t) => t
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .map(i32::from)
            .ok_or_else(|| NodeConfigError::Port(t.to_owned())),
    }
}

/// Health of the lower cluster as the virtual node last saw it.
#[derive(Clone, Debug, PartialEq)]
pub enum LowerHealth {
    /// Reachable.
    Reachable,
    /// It answers, but some requests failed there lately (429, 5xx): what happened, for
    /// people. The node stays schedulable: most requests succeed and are retried.
    Erroring {
        /// What failed, e.g. "12 of 40 requests ... answered 429 or 5xx in the last 10 s".
        message: String,
    },
    /// Unreachable since this time, with the last error.
    Unreachable {
        /// Since when.
        since: Time,
        /// Why (the last error).
        reason: String,
    },
}

/// The conditions and extra taints of the virtual node. While the lower cluster is
/// unreachable the node stays Ready (so the upper cluster evicts nothing), says so in its own
/// condition and is tainted NoSchedule (so nothing new lands); only once `not_ready_after`
/// (default: never) has passed does it report NotReady.
pub fn node_health(
    health: &LowerHealth,
    not_ready_after: Option<std::time::Duration>,
    now: &Time,
    previous: &[NodeCondition],
) -> (Vec<NodeCondition>, Vec<Taint>) {
    let since_previous = |t: &str, status: &str| {
        previous
            .iter()
            .find(|c| c.type_ == t && c.status == status)
            .and_then(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| now.clone())
    };
    let cond = |t: &str, status: &str, reason: &str, message: String| NodeCondition {
        type_: t.to_owned(),
        status: status.to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(since_previous(t, status)),
    };
    let (ready, reachable, taints) = match health {
        LowerHealth::Reachable => (
            cond(
                "Ready",
                "True",
                "KubeletReady",
                "kubelet is posting ready status".into(),
            ),
            cond(
                CONDITION_LOWER_REACHABLE,
                "True",
                "LowerClusterReachable",
                "the lower cluster answers".into(),
            ),
            Vec::new(),
        ),
        LowerHealth::Erroring { message } => (
            cond(
                "Ready",
                "True",
                "KubeletReady",
                "kubelet is posting ready status".into(),
            ),
            cond(
                CONDITION_LOWER_REACHABLE,
                "True",
                REASON_LOWER_ERRORS,
                message.clone(),
            ),
            Vec::new(),
        ),
        LowerHealth::Unreachable { since, reason } => {
            let elapsed = now.0.duration_since(since.0);
            let expired = not_ready_after
                .and_then(|d| k8s_openapi::jiff::SignedDuration::try_from(d).ok())
                .is_some_and(|d| elapsed >= d);
            let ready = if expired {
                cond(
                    "Ready",
                    "False",
                    "LowerClusterUnreachable",
                    format!(
                        "the lower cluster has been unreachable since {}: {reason}",
                        since.0
                    ),
                )
            } else {
                cond(
                    "Ready",
                    "True",
                    "KubeletReady",
                    "kubelet is posting ready status".into(),
                )
            };
            let taint = Taint {
                key: TAINT_LOWER_UNREACHABLE.to_owned(),
                value: None,
                effect: EFFECT_NO_SCHEDULE.to_owned(),
                time_added: Some(since.clone()),
            };
            (
                ready,
                cond(
                    CONDITION_LOWER_REACHABLE,
                    "False",
                    "LowerClusterUnreachable",
                    reason.clone(),
                ),
                vec![taint],
            )
        }
    };
    let conditions = vec![
        ready,
        cond(
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available".into(),
        ),
        cond(
            "DiskPressure",
            "False",
            "KubeletHasNoDiskPressure",
            "kubelet has no disk pressure".into(),
        ),
        cond(
            "PIDPressure",
            "False",
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available".into(),
        ),
        reachable,
    ];
    (conditions, taints)
}

/// The node's taints once this process has had its say: every taint someone else put there
/// (`kubectl taint`, the node lifecycle controller's not-ready and unreachable NoExecute taints)
/// kept as it is, and the taints this process manages (the configured one, the
/// lower-unreachable one) replaced by `ours`. A taint of ours that did not change keeps its
/// `timeAdded`. `None` when there are no taints at all.
pub fn merged_taints(
    current: Option<&[Taint]>,
    id: &NodeIdentity,
    ours: Option<&[Taint]>,
) -> Option<Vec<Taint>> {
    let managed = |t: &Taint| {
        t.key == TAINT_LOWER_UNREACHABLE || id.taint.as_ref().is_some_and(|c| c.key == t.key)
    };
    let current = current.unwrap_or_default();
    let mut taints: Vec<Taint> = current.iter().filter(|t| !managed(t)).cloned().collect();
    for t in ours.unwrap_or_default() {
        let kept = current.iter().find(|c| {
            c.key == t.key && c.value == t.value && c.effect == t.effect && t.time_added.is_none()
        });
        taints.push(kept.unwrap_or(t).clone());
    }
    (!taints.is_empty()).then_some(taints)
}

/// The whole Node object the virtual node registers and keeps patching.
pub fn virtual_node(
    id: &NodeIdentity,
    capacity: &ResourceVector,
    largest_fit: &ResourceVector,
    conditions: Vec<NodeCondition>,
    extra_taints: Vec<Taint>,
) -> Node {
    let mut labels = BTreeMap::from([
        (
            LABEL_NODE_TYPE.to_owned(),
            VALUE_NODE_TYPE_VIRTUAL.to_owned(),
        ),
        (LABEL_HOSTNAME.to_owned(), id.name.clone()),
        (LABEL_ARCH.to_owned(), "amd64".to_owned()),
        (LABEL_OS.to_owned(), "linux".to_owned()),
        (LABEL_OS_BETA.to_owned(), "linux".to_owned()),
    ]);
    if let Some((k, v)) = &id.extra_label {
        labels.insert(k.clone(), v.clone());
    }
    let annotations: BTreeMap<String, String> = largest_fit
        .iter()
        .map(|(resource, nanos)| {
            (
                format!(
                    "{ANNOTATION_LARGEST_POD_PREFIX}{}",
                    resource.replace('/', "_")
                ),
                format_quantity(nanos.max(0), format_for_resource(resource)),
            )
        })
        .collect();
    let mut taints: Vec<Taint> = id.taint.iter().cloned().collect();
    taints.extend(extra_taints);
    let mut addresses = vec![NodeAddress {
        type_: "InternalIP".into(),
        address: id.internal_ip.clone(),
    }];
    if let Some(ip) = &id.external_ip {
        addresses.push(NodeAddress {
            type_: "ExternalIP".into(),
            address: ip.clone(),
        });
    }
    let mut quantities = node_status_quantities(capacity);
    // Every pod the webhook mutates asks for one of the extender's marker resource, which
    // kube-scheduler's resource fit counts unless its configuration lists the extender
    // (`ignoredByScheduler`). Offering as many as the node takes pods lets virtual pods onto
    // virtual nodes without that configuration too (and onto no ordinary node, which would
    // run them without the constraints the webhook moved into `clusterSelector`).
    if let Some(pods) = quantities.get(RESOURCE_PODS).cloned() {
        quantities.insert(RESOURCE_VIRTUAL_POD.to_owned(), pods);
    }
    Node {
        metadata: ObjectMeta {
            name: Some(id.name.clone()),
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            taints: (!taints.is_empty()).then_some(taints),
            ..NodeSpec::default()
        }),
        status: Some(NodeStatus {
            capacity: Some(quantities.clone()),
            allocatable: Some(quantities),
            conditions: Some(conditions),
            addresses: Some(addresses),
            daemon_endpoints: Some(NodeDaemonEndpoints {
                kubelet_endpoint: Some(DaemonEndpoint {
                    port: id.kubelet_port,
                }),
            }),
            node_info: Some(NodeSystemInfo {
                kubelet_version: id.lower_version.clone(),
                kube_proxy_version: String::new(),
                operating_system: "linux".into(),
                architecture: "amd64".into(),
                os_image: "tensile-kube virtual node".into(),
                kernel_version: String::new(),
                container_runtime_version: "tensile://lower-cluster".into(),
                machine_id: String::new(),
                system_uuid: String::new(),
                boot_id: String::new(),
                ..NodeSystemInfo::default()
            }),
            ..NodeStatus::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::LABEL_NODE_ROLE;

    #[test]
    fn enable_controllers_is_a_trimmed_comma_list_with_unknown_names_reported() {
        assert_eq!(
            parse_controllers("PVControllers, ServiceControllers,,Foo"),
            ExtraControllers {
                services: true,
                volumes: true,
                unknown: vec!["Foo".into()],
            }
        );
        assert_eq!(parse_controllers(""), ExtraControllers::default());
    }

    #[test]
    fn service_filter_flags_default_to_the_originals_exclusions_and_reject_bad_entries() {
        assert_eq!(
            parse_service_filter("kube-system", "default/kubernetes"),
            Ok(crate::services::ServiceFilter::default())
        );
        let filter = parse_service_filter("kube-system, infra", "shop/db,").unwrap();
        assert!(!filter.mirrors("infra", "x"));
        assert!(!filter.mirrors("shop", "db"));
        assert!(filter.mirrors("default", "kubernetes"));
        for bad in ["db", "/db", "shop/", "a/b/c"] {
            assert_eq!(
                parse_service_filter("", bad),
                Err(NodeConfigError::ServiceExclude(bad.into()))
            );
        }
    }

    fn identity() -> NodeIdentity {
        NodeIdentity {
            name: "vk-lower-1".into(),
            extra_label: parse_node_label("clusterID: c1"),
            taint: node_taint(false, None, None, None).unwrap(),
            internal_ip: "10.0.0.5".into(),
            external_ip: Some("203.0.113.7".into()),
            kubelet_port: kubelet_port(Some("10450")).unwrap(),
            lower_version: "v1.33.4".into(),
        }
    }

    fn now() -> Time {
        Time("2026-11-22T10:00:00Z".parse().unwrap())
    }

    fn node() -> Node {
        let (conditions, taints) = node_health(&LowerHealth::Reachable, None, &now(), &[]);
        let cap = ResourceVector::from_quantities(&BTreeMap::from([
            (
                "cpu".to_owned(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("16".into()),
            ),
            (
                "memory".to_owned(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("64Gi".into()),
            ),
        ]))
        .unwrap();
        let largest = ResourceVector::from_quantities(&BTreeMap::from([
            (
                "cpu".to_owned(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("3500m".into()),
            ),
            (
                "nvidia.com/gpu".to_owned(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("2".into()),
            ),
        ]))
        .unwrap();
        virtual_node(&identity(), &cap, &largest, conditions, taints)
    }

    #[test]
    fn checklist_01_name_and_labels() {
        let n = node();
        assert_eq!(n.metadata.name.as_deref(), Some("vk-lower-1"));
        let l = n.metadata.labels.unwrap();
        for (k, v) in [
            ("type", "virtual-kubelet"),
            ("kubernetes.io/hostname", "vk-lower-1"),
            ("kubernetes.io/os", "linux"),
            ("beta.kubernetes.io/os", "linux"),
            ("kubernetes.io/arch", "amd64"),
        ] {
            assert_eq!(l.get(k).map(String::as_str), Some(v), "{k}");
        }
        // The original's `kubernetes.io/role=agent` is not set: NodeRestriction refuses a node
        // that sets its own kubernetes.io labels other than the kubelet's (docs/differences.md).
        assert!(!l.contains_key(LABEL_NODE_ROLE), "{l:?}");
    }

    #[test]
    fn checklist_02_node_label_env_needs_exactly_one_colon() {
        assert_eq!(
            parse_node_label(" clusterID : c1 "),
            Some(("clusterID".into(), "c1".into()))
        );
        assert_eq!(parse_node_label("clusterID"), None);
        assert_eq!(parse_node_label("a:b:c"), None);
        assert_eq!(
            node()
                .metadata
                .labels
                .unwrap()
                .get("clusterID")
                .map(String::as_str),
            Some("c1")
        );
    }

    #[test]
    fn checklist_03_04_05_addresses_port_and_version() {
        let s = node().status.unwrap();
        let a: Vec<(String, String)> = s
            .addresses
            .unwrap()
            .into_iter()
            .map(|a| (a.type_, a.address))
            .collect();
        assert_eq!(
            a,
            [
                ("InternalIP".to_owned(), "10.0.0.5".to_owned()),
                ("ExternalIP".to_owned(), "203.0.113.7".to_owned())
            ]
        );
        assert_eq!(
            s.daemon_endpoints.unwrap().kubelet_endpoint.unwrap().port,
            10450
        );
        assert_eq!(kubelet_port(None).unwrap(), 10250);
        assert!(kubelet_port(Some("ten")).is_err());
        assert_eq!(s.node_info.unwrap().kubelet_version, "v1.33.4");
    }

    #[test]
    fn taints_of_others_survive_and_ours_are_replaced() {
        let other = |key: &str, effect: &str| Taint {
            key: key.into(),
            value: None,
            effect: effect.into(),
            time_added: None,
        };
        let id = identity();
        let configured = id.taint.clone().unwrap();
        let unreachable = Taint {
            key: TAINT_LOWER_UNREACHABLE.into(),
            value: None,
            effect: EFFECT_NO_SCHEDULE.into(),
            time_added: Some(now()),
        };
        let not_ready = Taint {
            time_added: Some(now()),
            ..other(crate::keys::TAINT_NOT_READY, "NoExecute")
        };
        let current = vec![
            other("dedicated", "NoSchedule"),
            configured.clone(),
            unreachable.clone(),
            not_ready.clone(),
        ];
        // The lower cluster is back: our unreachable taint goes, everyone else's stays.
        let ours = vec![configured.clone()];
        assert_eq!(
            merged_taints(Some(&current), &id, Some(&ours)),
            Some(vec![
                other("dedicated", "NoSchedule"),
                not_ready.clone(),
                configured.clone()
            ])
        );
        // Nothing of ours, nothing of theirs: no taints.
        assert_eq!(merged_taints(None, &id, None), None);
        // Ours with a timeAdded of its own (the unreachable one) replaces the old one.
        let later = Taint {
            time_added: Some(Time(
                now().0 + k8s_openapi::jiff::SignedDuration::from_secs(5),
            )),
            ..unreachable.clone()
        };
        let merged = merged_taints(
            Some(&current),
            &id,
            Some(&[configured.clone(), later.clone()]),
        )
        .unwrap();
        assert!(
            merged.contains(&later) && !merged.contains(&unreachable),
            "{merged:?}"
        );
        assert!(merged.contains(&not_ready), "{merged:?}");
    }

    #[test]
    fn checklist_06_taint_defaults_overrides_and_invalid_effect() {
        let t = node().spec.unwrap().taints.unwrap();
        assert_eq!(
            (
                t[0].key.as_str(),
                t[0].value.as_deref(),
                t[0].effect.as_str()
            ),
            ("virtual-kubelet.io/provider", Some("k8s"), "NoSchedule")
        );
        let t = node_taint(false, Some("k"), Some("v"), Some("NoExecute"))
            .unwrap()
            .unwrap();
        assert_eq!(
            (t.key.as_str(), t.value.as_deref(), t.effect.as_str()),
            ("k", Some("v"), "NoExecute")
        );
        assert_eq!(node_taint(true, None, None, None).unwrap(), None);
        assert!(node_taint(false, None, None, Some("Sometimes")).is_err());
        assert!(
            node_taint(true, None, None, Some("Sometimes")).is_err(),
            "a bad value is an error even when disabled"
        );
    }

    #[test]
    fn checklist_07_conditions_are_healthy_with_the_kubelets_reasons() {
        let c = node().status.unwrap().conditions.unwrap();
        let pairs: Vec<(&str, &str, &str)> = c
            .iter()
            .map(|c| {
                (
                    c.type_.as_str(),
                    c.status.as_str(),
                    c.reason.as_deref().unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(
            &pairs[..4],
            [
                ("Ready", "True", "KubeletReady"),
                ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                ("PIDPressure", "False", "KubeletHasSufficientPID")
            ]
        );
    }

    #[test]
    fn capacity_equals_allocatable_and_largest_pod_is_published() {
        let n = node();
        let s = n.status.as_ref().unwrap();
        assert_eq!(s.capacity, s.allocatable);
        assert_eq!(s.capacity.as_ref().unwrap()["memory"].0, "64Gi");
        assert_eq!(s.capacity.as_ref().unwrap()["pods"].0, "0");
        // The extender's marker: as many as pods.
        assert_eq!(
            s.capacity.as_ref().unwrap()["tensile-kube.io/virtual-pod"].0,
            "0"
        );
        let a = n.metadata.annotations.unwrap();
        assert_eq!(a["tensile-kube.io/largest-pod-cpu"], "3500m");
        assert_eq!(a["tensile-kube.io/largest-pod-nvidia.com_gpu"], "2");
    }

    #[test]
    fn an_unreachable_lower_cluster_keeps_the_node_ready_but_tainted_until_the_grace_expires() {
        let since = Time("2026-11-22T09:59:00Z".parse().unwrap());
        let down = LowerHealth::Unreachable {
            since: since.clone(),
            reason: "connection refused".into(),
        };
        let (c, t) = node_health(&down, None, &now(), &[]);
        assert_eq!(c[0].status, "True", "no grace configured: never NotReady");
        assert_eq!(c[4].status, "False");
        assert_eq!(
            (t[0].key.as_str(), t[0].effect.as_str()),
            (TAINT_LOWER_UNREACHABLE, "NoSchedule")
        );
        let (c, _) = node_health(
            &down,
            Some(std::time::Duration::from_secs(120)),
            &now(),
            &[],
        );
        assert_eq!(c[0].status, "True", "60 s in, grace 120 s");
        let (c, _) = node_health(&down, Some(std::time::Duration::from_secs(30)), &now(), &[]);
        assert_eq!(
            (c[0].status.as_str(), c[0].reason.as_deref()),
            ("False", Some("LowerClusterUnreachable"))
        );
        let (back, t) = node_health(&LowerHealth::Reachable, None, &now(), &c);
        assert_eq!(back[0].status, "True");
        assert!(t.is_empty());
    }

    #[test]
    fn a_lower_cluster_answering_with_errors_says_so_and_stays_schedulable() {
        let erroring = LowerHealth::Erroring {
            message: "3 of 10 requests answered 429 or 5xx".into(),
        };
        let (c, t) = node_health(&erroring, Some(std::time::Duration::ZERO), &now(), &[]);
        assert_eq!(c[0].status, "True");
        assert_eq!(
            (
                c[4].status.as_str(),
                c[4].reason.as_deref(),
                c[4].message.as_deref()
            ),
            (
                "True",
                Some(REASON_LOWER_ERRORS),
                Some("3 of 10 requests answered 429 or 5xx")
            )
        );
        assert!(t.is_empty(), "nothing tainted: {t:?}");
    }

    #[test]
    fn transition_times_only_move_on_transitions() {
        let (first, _) = node_health(&LowerHealth::Reachable, None, &now(), &[]);
        let later = Time("2026-11-22T11:00:00Z".parse().unwrap());
        let (again, _) = node_health(&LowerHealth::Reachable, None, &later, &first);
        assert_eq!(again[0].last_transition_time, first[0].last_transition_time);
        assert_eq!(again[0].last_heartbeat_time, Some(later));
    }
}
