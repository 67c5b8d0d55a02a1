//! Every well-known name tensile-kube reads or writes: the original's labels, annotations,
//! taints and reasons (kept byte for byte so its manifests and users keep working), plus our
//! own ownership marks.

/// Label on pods. Upper cluster: opt-in for the webhook. Lower cluster: always set on pods we
/// create.
pub const LABEL_VIRTUAL_POD: &str = "virtual-pod";
/// An extended resource the webhook adds (1, request and limit) to the first container of every
/// pod it mutates at creation: kube-scheduler calls the extender only for pods that request one
/// of its `managedResources`, so ordinary pods never depend on the extender
/// (deploy/scheduler/kube-scheduler-config.yaml). A marker, not a quantity of anything: no node
/// offers it, it counts in no fit or capacity ([`crate::resources::pod_requests`] leaves it
/// out, as kube-scheduler does with `ignoredByScheduler` and the kubelet with resources its
/// node lacks), and the lower pod does not carry it.
pub const RESOURCE_VIRTUAL_POD: &str = "tensile-kube.io/virtual-pod";
/// The value of [`LABEL_VIRTUAL_POD`] and of [`ANNOTATION_GLOBAL`].
pub const VALUE_TRUE: &str = "true";

/// Label of a virtual node (`type=virtual-kubelet`), what `IsVirtualNode` looks at.
pub const LABEL_NODE_TYPE: &str = "type";
/// Value of [`LABEL_NODE_TYPE`] on virtual nodes.
pub const VALUE_NODE_TYPE_VIRTUAL: &str = "virtual-kubelet";
/// The original's node role label (`agent`), which NodeRestriction refuses a node to set on
/// itself: not set by us (docs/differences.md).
pub const LABEL_NODE_ROLE: &str = "kubernetes.io/role";
/// Hostname label; also the key of the descheduler's `NotIn` exclusion and of PV node affinity.
pub const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
/// Deprecated hostname label, still rewritten in PV node affinity.
pub const LABEL_HOSTNAME_BETA: &str = "beta.kubernetes.io/hostname";
/// Operating system label.
pub const LABEL_OS: &str = "kubernetes.io/os";
/// Deprecated operating system label.
pub const LABEL_OS_BETA: &str = "beta.kubernetes.io/os";
/// Architecture label.
pub const LABEL_ARCH: &str = "kubernetes.io/arch";
/// Node label naming the lower cluster a virtual node stands for (set by the operator through
/// `VKUBELET_NODE_LABEL`); the webhook's default ignore key.
pub const LABEL_CLUSTER_ID: &str = "clusterID";
/// Marks a pod re-created by the descheduler; the webhook skips such pods.
pub const LABEL_CREATE_BY_DESCHEDULER: &str = "create-by-descheduler";
/// Default of `--ignore-labels`: pod labels removed from lower pods.
pub const DEFAULT_IGNORE_LABELS: &str = "pod-group.scheduling.sigs.k8s.io";
/// Opt-in label of super-scheduling's TopologyScheduling plugin.
pub const LABEL_TOPOLOGY_SCHEDULING_POLICY: &str =
    "topology-scheduling-policy.scheduling.sigs.k8s.io";

/// Pod annotation carrying the scheduling constraints hidden from the upper scheduler.
pub const ANNOTATION_CLUSTER_SELECTOR: &str = "clusterSelector";
/// Lower pod annotation: JSON map of the ignore-labels removed from it.
pub const ANNOTATION_TRIPPED_LABELS: &str = "tripped-labels";
/// `global: "true"` marks objects copied or managed by tensile-kube (kept for compatibility;
/// ownership is decided by [`LABEL_OWNER`]).
pub const ANNOTATION_GLOBAL: &str = "global";
/// JSON of a selector removed from a spec (lower Services, upper PVCs).
pub const ANNOTATION_LABEL_SELECTOR: &str = "labelSelector";
/// PVC annotation written by the scheduler; rewritten to the virtual node upstairs.
pub const ANNOTATION_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// Upper pod annotation: the node the pod failed on (descheduler).
pub const ANNOTATION_UNSCHEDULABLE_NODE: &str = "unschedulable-node";
/// Decimal count of descheduler re-creations.
pub const ANNOTATION_DESCHEDULE_COUNT: &str = "sigs.k8s.io/deschedule-count";
/// Service-account name on service-account-token secrets.
pub const ANNOTATION_SERVICE_ACCOUNT_NAME: &str = "kubernetes.io/service-account.name";
/// Service-account UID on service-account-token secrets.
pub const ANNOTATION_SERVICE_ACCOUNT_UID: &str = "kubernetes.io/service-account.uid";
/// Forces evictability in the descheduler.
pub const ANNOTATION_DESCHEDULER_EVICT: &str = "descheduler.alpha.kubernetes.io/evict";
/// Static pod source (critical pod detection).
pub const ANNOTATION_CONFIG_SOURCE: &str = "kubernetes.io/config.source";
/// Mirror pod marker.
pub const ANNOTATION_CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";
/// virtual-kubelet's three-way merge base for node status.
pub const ANNOTATION_VK_LAST_APPLIED_NODE_STATUS: &str =
    "virtual-kubelet.io/last-applied-node-status";
/// virtual-kubelet's three-way merge base for node metadata.
pub const ANNOTATION_VK_LAST_APPLIED_OBJECT_META: &str =
    "virtual-kubelet.io/last-applied-object-meta";

/// Default taint key of a virtual node (`VKUBELET_TAINT_KEY`).
pub const TAINT_VIRTUAL_KUBELET: &str = "virtual-kubelet.io/provider";
/// Default taint value (`VKUBELET_TAINT_VALUE`): the provider name.
pub const TAINT_VIRTUAL_KUBELET_VALUE: &str = "k8s";
/// Taint of nodes whose Ready condition is False.
pub const TAINT_NOT_READY: &str = "node.kubernetes.io/not-ready";
/// Taint of nodes whose Ready condition is Unknown.
pub const TAINT_UNREACHABLE: &str = "node.kubernetes.io/unreachable";
/// Taint of cordoned nodes.
pub const TAINT_UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";
/// Taint effect: new pods are not scheduled.
pub const EFFECT_NO_SCHEDULE: &str = "NoSchedule";
/// Taint effect: running pods are evicted too.
pub const EFFECT_NO_EXECUTE: &str = "NoExecute";
/// Taint effect: a soft preference only.
pub const EFFECT_PREFER_NO_SCHEDULE: &str = "PreferNoSchedule";

/// Namespace of node heartbeat leases.
pub const NAMESPACE_NODE_LEASE: &str = "kube-node-lease";
/// Namespace whose pods are never offloaded.
pub const NAMESPACE_KUBE_SYSTEM: &str = "kube-system";
/// ConfigMap the API server publishes in every namespace; never copied between clusters.
pub const CONFIG_MAP_KUBE_ROOT_CA: &str = "kube-root-ca.crt";
/// Secret type of legacy service-account tokens; never copied between clusters.
pub const SECRET_TYPE_SERVICE_ACCOUNT_TOKEN: &str = "kubernetes.io/service-account-token";
/// Name prefix of legacy service-account token volumes.
pub const VOLUME_PREFIX_DEFAULT_TOKEN: &str = "default-token";
/// Name prefix of the projected service-account volume injected by modern API servers.
pub const VOLUME_PREFIX_KUBE_API_ACCESS: &str = "kube-api-access-";
/// Where service-account credentials are mounted in containers.
pub const SERVICE_ACCOUNT_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The ServiceAccount every namespace has.
pub const SERVICE_ACCOUNT_DEFAULT: &str = "default";

/// Pod status reason of a failed sync (virtual-kubelet's `ProviderFailed`).
pub const REASON_PROVIDER_FAILED: &str = "ProviderFailed";
/// Pod status reason: the lower pod disappeared without being deleted from upstairs.
pub const REASON_LOWER_POD_LOST: &str = "LowerPodLost";
/// Pod status reason: this pod is not offloaded (kube-system, DaemonSet...).
pub const REASON_NOT_OFFLOADED: &str = "NotOffloaded";
/// Event reasons of virtual-kubelet, kept so existing alerting keeps matching.
pub const EVENT_PROVIDER_CREATE_SUCCESS: &str = "ProviderCreateSuccess";
/// See [`EVENT_PROVIDER_CREATE_SUCCESS`].
pub const EVENT_PROVIDER_CREATE_FAILED: &str = "ProviderCreateFailed";
/// See [`EVENT_PROVIDER_CREATE_SUCCESS`].
pub const EVENT_PROVIDER_UPDATE_SUCCESS: &str = "ProviderUpdateSuccess";
/// See [`EVENT_PROVIDER_CREATE_SUCCESS`].
pub const EVENT_PROVIDER_UPDATE_FAILED: &str = "ProviderUpdateFailed";
/// See [`EVENT_PROVIDER_CREATE_SUCCESS`].
pub const EVENT_PROVIDER_DELETE_SUCCESS: &str = "ProviderDeleteSuccess";
/// See [`EVENT_PROVIDER_CREATE_SUCCESS`].
pub const EVENT_PROVIDER_DELETE_FAILED: &str = "ProviderDeleteFailed";
/// PV controller event reason.
pub const EVENT_SYNCED: &str = "Synced";
/// PV controller event reason.
pub const EVENT_UPDATED: &str = "Updated";
/// Descheduler event reason.
pub const EVENT_RESCHEDULED: &str = "Rescheduled";

/// Our ownership label: the owner id (by default the virtual node's name, see
/// [`owner_label_value`]) of the virtual node that created a lower object. Nothing without it, or
/// with another value, is ever changed or deleted by us. Upstairs it also marks the Secret of a
/// component's CA and serving certificate (`--tls-secret`), valued with the component
/// ([`OWNER_WEBHOOK`], [`OWNER_SCHEDULER`]).
pub const LABEL_OWNER: &str = "tensile-kube.io/owner";
/// [`LABEL_OWNER`] of the webhook's `--tls-secret`, and the common name of its certificates.
pub const OWNER_WEBHOOK: &str = "tensile-webhook";
/// [`LABEL_OWNER`] of the scheduler extender's `--tls-secret`, and the common name of its
/// certificates.
pub const OWNER_SCHEDULER: &str = "tensile-scheduler";
/// Our annotation on lower objects: the UID of the upper object they mirror.
pub const ANNOTATION_UPPER_UID: &str = "tensile-kube.io/upper-uid";
/// Our annotation on lower pods: the annotation keys copied from the upper pod, so that a key
/// removed upstairs is removed downstairs without touching keys written by the lower cluster.
pub const ANNOTATION_SYNCED_ANNOTATIONS: &str = "tensile-kube.io/synced-annotations";
/// Our label on the lower Secret holding an offloaded pod's upper service-account tokens
/// ([`crate::identity`]): the upper pod's UID. The copy controllers leave such Secrets alone.
pub const LABEL_IDENTITY_OF: &str = "tensile-kube.io/identity-of";
/// Our annotation on a token Secret: the name of the pod it serves.
pub const ANNOTATION_TOKEN_POD: &str = "tensile-kube.io/pod";
/// Our annotation on a token Secret: when its earliest token is to be replaced (RFC 3339).
pub const ANNOTATION_TOKEN_REFRESH_AT: &str = "tensile-kube.io/refresh-at";

/// Our annotation on upper pods: the virtual nodes the pod's required node affinity excludes
/// because the pod (or another pod of its owner) could not be placed in their lower clusters;
/// comma-separated, sorted. It tells the webhook which `kubernetes.io/hostname NotIn`
/// expression is ours, so it stays in the upper pod instead of moving into `clusterSelector`.
pub const ANNOTATION_EXCLUDED_NODES: &str = "tensile-kube.io/excluded-nodes";

/// Our annotation on upper pods (opt-in, set by the user): the scheduler of the lower pod. The
/// upper pod's `schedulerName` names a scheduler of the upper cluster, which the lower cluster
/// usually does not run (its pod would stay Pending with no condition for ever), so lower pods
/// get [`DEFAULT_SCHEDULER`] unless this names another.
pub const ANNOTATION_LOWER_SCHEDULER_NAME: &str = "tensile-kube.io/lower-scheduler-name";
/// The scheduler every cluster runs, and the API server's default `schedulerName`.
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// Our condition on upper pods: True once the lower pod exists, False with a reason when it was
/// lost. It is the durable record that a pod was offloaded, so that after a restart a missing
/// lower pod is recognised as lost rather than created again.
pub const CONDITION_OFFLOADED: &str = "tensile-kube.io/Offloaded";
/// Reason of [`CONDITION_OFFLOADED`] when True.
pub const REASON_OFFLOADED: &str = "Offloaded";

/// The longest label value Kubernetes accepts.
pub const MAX_LABEL_VALUE_LEN: usize = 63;

/// FNV-1a, 64 bits: the same in every build, version and platform (std's hashers promise
/// none of that), for what must survive a restart or an upgrade: label suffixes, token slots.
pub fn stable_hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The value of [`LABEL_OWNER`] for an owner id (a node name is a DNS subdomain of up to 253
/// characters, a label value at most 63): short ids are used as they are, long ones are cut and
/// suffixed with a stable hash so two long names never share a value by accident.
pub fn owner_label_value(owner: &str) -> String {
    if owner.len() <= MAX_LABEL_VALUE_LEN && is_label_value(owner) {
        return owner.to_owned();
    }
    let hash = stable_hash(owner.as_bytes());
    let suffix = format!("{hash:016x}");
    let keep = MAX_LABEL_VALUE_LEN - suffix.len() - 1;
    let head: String = owner
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(keep)
        .collect();
    let head = head.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if head.is_empty() {
        suffix
    } else {
        format!("{head}-{suffix}")
    }
}

/// Whether `value` is a valid label value (empty, or up to 63 characters of `[A-Za-z0-9._-]`
/// starting and ending with an alphanumeric).
pub fn is_label_value(value: &str) -> bool {
    if value.is_empty() {
        return true;
    }
    let bytes = value.as_bytes();
    value.len() <= MAX_LABEL_VALUE_LEN
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_owner_is_used_verbatim() {
        assert_eq!(owner_label_value("vk-cluster-a"), "vk-cluster-a");
    }

    #[test]
    fn long_owner_is_cut_and_hashed_into_a_valid_distinct_label_value() {
        let a = format!("{}.example.com", "a".repeat(80));
        let b = format!("{}.example.org", "a".repeat(80));
        let (va, vb) = (owner_label_value(&a), owner_label_value(&b));
        assert!(is_label_value(&va), "{va}");
        assert!(is_label_value(&vb), "{vb}");
        assert_ne!(va, vb);
        assert_eq!(va, owner_label_value(&a), "stable");
    }

    #[test]
    fn label_value_validation() {
        assert!(is_label_value(""));
        assert!(is_label_value("a.b-c_d"));
        assert!(!is_label_value("-a"));
        assert!(!is_label_value("a/b"));
        assert!(!is_label_value(&"a".repeat(64)));
    }
}
