//! The resource table: every resource the API server serves is one row of data (group,
//! version, names, scope, subresources, field selectors) naming, where a resource has
//! behaviour of its own, its strategy (`kinds`). Adding a resource is adding a row.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::kinds::core::{
    EndpointSlices, Endpoints, Events, EventsV1, Leases, Secrets, ServiceAccounts,
};
use super::kinds::namespace::Namespaces;
use super::kinds::node::Nodes;
use super::kinds::pod::{Bindings, Pods};
use super::kinds::rbac::Rbac;
use super::kinds::review::Review;
use super::kinds::service::Services;
use super::kinds::volume::{PersistentVolumeClaims, PersistentVolumes};
use super::kinds::workload::{Autoscaler, Workload};
use super::schemas::{self, SchemaFn, schema_of};
use super::strategy::{Generational, Plain, Strategy};
use super::table::{self as print, Printer};
use k8s_openapi::api::{
    admissionregistration::v1 as admreg, apps::v1 as apps, authentication::v1 as authn,
    authorization::v1 as authz, autoscaling::v2 as autoscaling, batch::v1 as batch,
    coordination::v1 as coordination, core::v1 as core, discovery::v1 as discovery,
    events::v1 as events, flowcontrol::v1 as flowcontrol, networking::v1 as networking,
    node::v1 as node, policy::v1 as policy, rbac::v1 as rbac, scheduling::v1 as scheduling,
    storage::v1 as storage, storage::v1beta1 as storage_v1beta1,
};

/// One served resource.
#[derive(Debug)]
pub struct ResourceType {
    /// API group, `""` for the core group.
    pub group: &'static str,
    /// API version within the group.
    pub version: &'static str,
    /// Plural resource name used in paths.
    pub plural: &'static str,
    /// Singular name (discovery, kubectl).
    pub singular: &'static str,
    /// Kind of the objects.
    pub kind: &'static str,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// kubectl short names.
    pub short_names: &'static [&'static str],
    /// kubectl categories (`all`).
    pub categories: &'static [&'static str],
    /// Subresources served, with the kind they take.
    pub subresources: &'static [(&'static str, &'static str)],
    /// Field selector labels beyond `metadata.name` and `metadata.namespace`.
    pub fields: &'static [&'static str],
    /// Only `create` is served (reviews, bindings): nothing is stored.
    pub create_only: bool,
    /// Read-only, computed resources (metrics).
    pub read_only: bool,
    /// Decodes a body into the typed object and back: rejects ill-typed JSON like the real
    /// decoder and drops unknown fields like the real server does for built-in types.
    pub normalize: fn(Value) -> Result<Value, String>,
    /// What the REST verbs do beyond storing.
    pub(crate) strategy: &'static dyn Strategy,
    /// How objects print as a Table.
    pub(crate) print: &'static Printer,
    /// Its JSON schema, for the OpenAPI v3 documents (`kubectl explain`).
    pub schema: SchemaFn,
}

impl ResourceType {
    /// `group/version`, or `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Whether it has a `status` subresource.
    pub fn has_status(&self) -> bool {
        self.subresources.iter().any(|(s, _)| *s == "status")
    }

    /// The verbs discovery advertises.
    pub fn verbs(&self) -> &'static [&'static str] {
        if self.create_only {
            &["create"]
        } else if self.read_only {
            &["get", "list"]
        } else {
            &[
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch",
            ]
        }
    }

    /// Whether `label` may be used in a field selector on this resource.
    pub fn supports_field(&self, label: &str) -> bool {
        matches!(label, "metadata.name" | "metadata.namespace") || self.fields.contains(&label)
    }
}

fn normalize<K: DeserializeOwned + Serialize>(value: Value) -> Result<Value, String> {
    let typed: K = serde_json::from_value(value).map_err(|e| e.to_string())?;
    serde_json::to_value(&typed).map_err(|e| e.to_string())
}

/// A kind served at a version newer than k8s-openapi 1.33 has (GA in 1.34), decoded as its
/// previous version, which has the same fields: [`normalize`] without the older
/// `apiVersion`, which the type would insist on.
fn promoted<K: DeserializeOwned + Serialize + k8s_openapi::Resource>(
    mut value: Value,
) -> Result<Value, String> {
    if let Some(m) = value.as_object_mut() {
        m.remove("apiVersion");
    }
    let mut value = normalize::<K>(value)?;
    if let Some(m) = value.as_object_mut() {
        m.insert("apiVersion".into(), format!("{}/v1", K::GROUP).into());
    }
    Ok(value)
}

/// Objects we serve without a k8s-openapi type (metrics): kept as they are.
fn untyped(value: Value) -> Result<Value, String> {
    if value.is_object() {
        Ok(value)
    } else {
        Err("expected a JSON object".to_owned())
    }
}

const STATUS: (&str, &str) = ("status", "");
const NONE: &[&str] = &[];

macro_rules! row {
    (@strategy) => { &Plain };
    (@strategy $strategy:expr) => { &$strategy };
    (@decode $ty:ty) => { normalize::<$ty> };
    (@decode $ty:ty, $decode:ident) => { $decode::<$ty> };
    (@print) => { &print::DEFAULT };
    (@print $print:ident) => { &print::$print };
    ($group:literal, $version:literal, $plural:literal, $singular:literal, $kind:literal, $ty:ty,
     namespaced: $ns:literal $(, short: [$($short:literal),*])? $(, categories: [$($cat:literal),*])?
     $(, sub: [$($sub:expr),*])? $(, fields: [$($field:literal),*])? $(, create_only: $co:literal)?
     $(, decode: $decode:ident)?
     $(, strategy: $strategy:expr)? $(, print: $print:ident)?) => {
        ResourceType {
            group: $group,
            version: $version,
            plural: $plural,
            singular: $singular,
            kind: $kind,
            namespaced: $ns,
            short_names: &[$($($short),*)?],
            categories: &[$($($cat),*)?],
            subresources: &[$($($sub),*)?],
            fields: &[$($($field),*)?],
            create_only: false $(|| $co)?,
            read_only: false,
            normalize: row!(@decode $ty $(, $decode)?),
            strategy: row!(@strategy $($strategy)?),
            print: row!(@print $($print)?),
            schema: schema_of::<$ty>,
        }
    };
}

/// Every resource served, in discovery order.
pub static RESOURCES: &[ResourceType] = &[
    row!("", "v1", "namespaces", "namespace", "Namespace", core::Namespace, namespaced: false,
        short: ["ns"], sub: [STATUS, ("finalize", "Namespace")], fields: ["status.phase"],
        strategy: Namespaces, print: NAMESPACES),
    row!("", "v1", "pods", "pod", "Pod", core::Pod, namespaced: true, short: ["po"],
        categories: ["all"],
        sub: [STATUS, ("binding", "Binding"), ("eviction", "Eviction"), ("log", "Pod"),
              ("exec", "PodExecOptions"), ("attach", "PodAttachOptions"),
              ("portforward", "PodPortForwardOptions"), ("proxy", "PodProxyOptions"),
              ("ephemeralcontainers", "Pod")],
        fields: ["spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
                 "spec.serviceAccountName", "spec.hostNetwork", "status.phase", "status.podIP",
                 "status.nominatedNodeName"],
        strategy: Pods, print: PODS),
    row!("", "v1", "bindings", "binding", "Binding", core::Binding, namespaced: true,
        create_only: true,
        strategy: Bindings),
    row!("", "v1", "nodes", "node", "Node", core::Node, namespaced: false, short: ["no"],
        sub: [STATUS, ("proxy", "NodeProxyOptions")], fields: ["spec.unschedulable"],
        strategy: Nodes, print: NODES),
    row!("", "v1", "services", "service", "Service", core::Service, namespaced: true,
        short: ["svc"], categories: ["all"], sub: [STATUS, ("proxy", "ServiceProxyOptions")],
        fields: ["spec.clusterIP", "spec.type"],
        strategy: Services, print: SERVICES),
    row!("", "v1", "endpoints", "endpoints", "Endpoints", core::Endpoints, namespaced: true,
        short: ["ep"],
        strategy: Endpoints, print: ENDPOINTS),
    row!("", "v1", "configmaps", "configmap", "ConfigMap", core::ConfigMap, namespaced: true,
        short: ["cm"], print: CONFIG_MAPS),
    row!("", "v1", "secrets", "secret", "Secret", core::Secret, namespaced: true,
        fields: ["type"],
        strategy: Secrets, print: SECRETS),
    row!("", "v1", "serviceaccounts", "serviceaccount", "ServiceAccount",
        core::ServiceAccount, namespaced: true, short: ["sa"], sub: [("token", "TokenRequest")],
        strategy: ServiceAccounts, print: SERVICE_ACCOUNTS),
    row!("", "v1", "persistentvolumes", "persistentvolume", "PersistentVolume",
        core::PersistentVolume, namespaced: false, short: ["pv"], sub: [STATUS],
        strategy: PersistentVolumes, print: PERSISTENT_VOLUMES),
    row!("", "v1", "persistentvolumeclaims", "persistentvolumeclaim", "PersistentVolumeClaim",
        core::PersistentVolumeClaim, namespaced: true, short: ["pvc"], sub: [STATUS],
        strategy: PersistentVolumeClaims, print: PERSISTENT_VOLUME_CLAIMS),
    row!("", "v1", "events", "event", "Event", core::Event, namespaced: true, short: ["ev"],
        fields: ["involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                 "involvedObject.uid", "involvedObject.apiVersion",
                 "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason",
                 "reportingComponent", "source", "type"],
        strategy: Events, print: EVENTS),
    row!("", "v1", "resourcequotas", "resourcequota", "ResourceQuota", core::ResourceQuota,
        namespaced: true, short: ["quota"], sub: [STATUS], print: RESOURCE_QUOTAS),
    row!("", "v1", "limitranges", "limitrange", "LimitRange", core::LimitRange,
        namespaced: true, short: ["limits"], print: LIMIT_RANGES),
    row!("apps", "v1", "deployments", "deployment", "Deployment", apps::Deployment,
        namespaced: true, short: ["deploy"], categories: ["all"], sub: [STATUS, ("scale", "Scale")],
        strategy: Workload::Deployment, print: DEPLOYMENTS),
    row!("apps", "v1", "replicasets", "replicaset", "ReplicaSet", apps::ReplicaSet,
        namespaced: true, short: ["rs"], categories: ["all"], sub: [STATUS, ("scale", "Scale")],
        fields: ["status.replicas"],
        strategy: Workload::ReplicaSet, print: REPLICA_SETS),
    row!("apps", "v1", "statefulsets", "statefulset", "StatefulSet", apps::StatefulSet,
        namespaced: true, short: ["sts"], categories: ["all"], sub: [STATUS, ("scale", "Scale")],
        strategy: Workload::StatefulSet, print: STATEFUL_SETS),
    row!("apps", "v1", "daemonsets", "daemonset", "DaemonSet", apps::DaemonSet,
        namespaced: true, short: ["ds"], categories: ["all"], sub: [STATUS],
        strategy: Workload::DaemonSet, print: DAEMON_SETS),
    row!("apps", "v1", "controllerrevisions", "controllerrevision", "ControllerRevision",
        apps::ControllerRevision, namespaced: true,
        strategy: Generational, print: CONTROLLER_REVISIONS),
    row!("batch", "v1", "jobs", "job", "Job", batch::Job, namespaced: true,
        categories: ["all"], sub: [STATUS],
        strategy: Workload::Job, print: JOBS),
    row!("batch", "v1", "cronjobs", "cronjob", "CronJob", batch::CronJob, namespaced: true,
        short: ["cj"], categories: ["all"], sub: [STATUS],
        strategy: Workload::CronJob, print: CRON_JOBS),
    row!("discovery.k8s.io", "v1", "endpointslices", "endpointslice", "EndpointSlice",
        discovery::EndpointSlice, namespaced: true,
        strategy: EndpointSlices, print: ENDPOINT_SLICES),
    row!("events.k8s.io", "v1", "events", "event", "Event", events::Event, namespaced: true,
        short: ["ev"],
        strategy: EventsV1, print: EVENTS_V1),
    row!("coordination.k8s.io", "v1", "leases", "lease", "Lease", coordination::Lease,
        namespaced: true,
        strategy: Leases, print: LEASES),
    row!("storage.k8s.io", "v1", "storageclasses", "storageclass", "StorageClass",
        storage::StorageClass, namespaced: false, short: ["sc"], print: STORAGE_CLASSES),
    row!("scheduling.k8s.io", "v1", "priorityclasses", "priorityclass", "PriorityClass",
        scheduling::PriorityClass, namespaced: false, short: ["pc"], print: PRIORITY_CLASSES),
    row!("policy", "v1", "poddisruptionbudgets", "poddisruptionbudget", "PodDisruptionBudget",
        policy::PodDisruptionBudget, namespaced: true, short: ["pdb"], sub: [STATUS],
        strategy: Generational, print: POD_DISRUPTION_BUDGETS),
    row!("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
        "mutatingwebhookconfiguration", "MutatingWebhookConfiguration",
        admreg::MutatingWebhookConfiguration, namespaced: false, print: WEBHOOK_CONFIGURATIONS),
    row!("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
        "validatingwebhookconfiguration", "ValidatingWebhookConfiguration",
        admreg::ValidatingWebhookConfiguration, namespaced: false, print: WEBHOOK_CONFIGURATIONS),
    row!("authentication.k8s.io", "v1", "tokenreviews", "tokenreview", "TokenReview",
        authn::TokenReview, namespaced: false, create_only: true,
        strategy: Review::Token),
    row!("authorization.k8s.io", "v1", "subjectaccessreviews", "subjectaccessreview",
        "SubjectAccessReview", authz::SubjectAccessReview, namespaced: false, create_only: true,
        strategy: Review::SubjectAccess),
    row!("authorization.k8s.io", "v1", "selfsubjectaccessreviews", "selfsubjectaccessreview",
        "SelfSubjectAccessReview", authz::SelfSubjectAccessReview, namespaced: false,
        create_only: true,
        strategy: Review::SelfSubjectAccess),
    row!("authorization.k8s.io", "v1", "localsubjectaccessreviews", "localsubjectaccessreview",
        "LocalSubjectAccessReview", authz::LocalSubjectAccessReview, namespaced: true,
        create_only: true, strategy: Review::LocalSubjectAccess),
    row!("authentication.k8s.io", "v1", "selfsubjectreviews", "selfsubjectreview",
        "SelfSubjectReview", authn::SelfSubjectReview, namespaced: false, create_only: true,
        strategy: Review::SelfSubject),
    row!("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "clusterrolebinding",
        "ClusterRoleBinding", rbac::ClusterRoleBinding, namespaced: false,
        strategy: Rbac::ClusterRoleBinding, print: ROLE_BINDINGS),
    row!("rbac.authorization.k8s.io", "v1", "clusterroles", "clusterrole", "ClusterRole",
        rbac::ClusterRole, namespaced: false,
        strategy: Rbac::ClusterRole, print: ROLES),
    row!("rbac.authorization.k8s.io", "v1", "rolebindings", "rolebinding", "RoleBinding",
        rbac::RoleBinding, namespaced: true,
        strategy: Rbac::RoleBinding, print: ROLE_BINDINGS),
    row!("rbac.authorization.k8s.io", "v1", "roles", "role", "Role", rbac::Role,
        namespaced: true,
        strategy: Rbac::Role, print: ROLES),
    // Kinds the simulator stores, watches and lists with no behaviour of their own, so an
    // ordinary application applies in the sandbox: nothing here acts on them (no ingress
    // controller, network policy, autoscaler, replication manager or CSI), which
    // docs/sim.md says.
    row!("", "v1", "replicationcontrollers", "replicationcontroller", "ReplicationController",
        core::ReplicationController, namespaced: true, short: ["rc"], categories: ["all"],
        sub: [STATUS], print: REPLICATION_CONTROLLERS),
    row!("", "v1", "podtemplates", "podtemplate", "PodTemplate", core::PodTemplate,
        namespaced: true, print: POD_TEMPLATES),
    row!("networking.k8s.io", "v1", "ingresses", "ingress", "Ingress", networking::Ingress,
        namespaced: true, short: ["ing"], sub: [STATUS], print: INGRESSES),
    row!("networking.k8s.io", "v1", "ingressclasses", "ingressclass", "IngressClass",
        networking::IngressClass, namespaced: false, print: INGRESS_CLASSES),
    row!("networking.k8s.io", "v1", "networkpolicies", "networkpolicy", "NetworkPolicy",
        networking::NetworkPolicy, namespaced: true, short: ["netpol"], print: NETWORK_POLICIES),
    row!("autoscaling", "v2", "horizontalpodautoscalers", "horizontalpodautoscaler",
        "HorizontalPodAutoscaler", autoscaling::HorizontalPodAutoscaler, namespaced: true,
        short: ["hpa"], categories: ["all"], sub: [STATUS],
        strategy: Autoscaler, print: HORIZONTAL_POD_AUTOSCALERS),
    row!("storage.k8s.io", "v1", "csidrivers", "csidriver", "CSIDriver", storage::CSIDriver,
        namespaced: false, print: CSI_DRIVERS),
    row!("storage.k8s.io", "v1", "csinodes", "csinode", "CSINode", storage::CSINode,
        namespaced: false, print: CSI_NODES),
    row!("storage.k8s.io", "v1", "csistoragecapacities", "csistoragecapacity",
        "CSIStorageCapacity", storage::CSIStorageCapacity, namespaced: true, print: CSI_STORAGE_CAPACITIES),
    row!("storage.k8s.io", "v1", "volumeattributesclasses", "volumeattributesclass",
        "VolumeAttributesClass", storage_v1beta1::VolumeAttributesClass, namespaced: false,
        short: ["vac"], decode: promoted, print: VOLUME_ATTRIBUTES_CLASSES),
    row!("storage.k8s.io", "v1", "volumeattachments", "volumeattachment", "VolumeAttachment",
        storage::VolumeAttachment, namespaced: false, sub: [STATUS], print: VOLUME_ATTACHMENTS),
    row!("flowcontrol.apiserver.k8s.io", "v1", "flowschemas", "flowschema", "FlowSchema",
        flowcontrol::FlowSchema, namespaced: false, sub: [STATUS], strategy: Generational,
        print: FLOW_SCHEMAS),
    row!("flowcontrol.apiserver.k8s.io", "v1", "prioritylevelconfigurations",
        "prioritylevelconfiguration", "PriorityLevelConfiguration",
        flowcontrol::PriorityLevelConfiguration, namespaced: false, sub: [STATUS],
        strategy: Generational, print: PRIORITY_LEVEL_CONFIGURATIONS),
    row!("node.k8s.io", "v1", "runtimeclasses", "runtimeclass", "RuntimeClass",
        node::RuntimeClass, namespaced: false, print: RUNTIME_CLASSES),
    ResourceType {
        group: "metrics.k8s.io",
        version: "v1beta1",
        plural: "pods",
        singular: "",
        kind: "PodMetrics",
        namespaced: true,
        short_names: NONE,
        categories: NONE,
        subresources: &[],
        fields: NONE,
        create_only: false,
        read_only: true,
        normalize: untyped,
        strategy: &Plain,
        print: &print::DEFAULT,
        schema: schema_of::<schemas::PodMetrics>,
    },
    ResourceType {
        group: "metrics.k8s.io",
        version: "v1beta1",
        plural: "nodes",
        singular: "",
        kind: "NodeMetrics",
        namespaced: false,
        short_names: NONE,
        categories: NONE,
        subresources: &[],
        fields: NONE,
        create_only: false,
        read_only: true,
        normalize: untyped,
        strategy: &Plain,
        print: &print::DEFAULT,
        schema: schema_of::<schemas::NodeMetrics>,
    },
];

/// Index of a row in [`RESOURCES`]; the store keys objects by it.
pub type ResId = usize;

/// Finds a resource by group, version and plural.
pub fn find(group: &str, version: &str, plural: &str) -> Option<ResId> {
    RESOURCES
        .iter()
        .position(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Finds the resource of a kind in a group/version (`apiVersion` as written in objects).
pub fn find_kind(api_version: &str, kind: &str) -> Option<ResId> {
    RESOURCES
        .iter()
        .position(|r| r.api_version() == api_version && r.kind == kind)
}

/// The resource type of an id; ids only come from this table.
pub fn get(id: ResId) -> &'static ResourceType {
    &RESOURCES[id.min(RESOURCES.len() - 1)]
}

/// Well-known ids, looked up once.
pub mod ids {
    use super::{ResId, find};
    use std::sync::LazyLock;

    macro_rules! id {
        ($name:ident, $group:literal, $plural:literal) => {
            #[doc = concat!("`", $plural, "` in group `", $group, "`.")]
            pub static $name: LazyLock<ResId> = LazyLock::new(|| {
                find(
                    $group,
                    if $group == "metrics.k8s.io" {
                        "v1beta1"
                    } else {
                        "v1"
                    },
                    $plural,
                )
                .unwrap_or(usize::MAX)
            });
        };
    }
    id!(NAMESPACES, "", "namespaces");
    id!(PODS, "", "pods");
    id!(NODES, "", "nodes");
    id!(SERVICES, "", "services");
    id!(ENDPOINTS, "", "endpoints");
    id!(CONFIGMAPS, "", "configmaps");
    id!(SECRETS, "", "secrets");
    id!(SERVICEACCOUNTS, "", "serviceaccounts");
    id!(EVENTS, "", "events");
    id!(PERSISTENT_VOLUMES, "", "persistentvolumes");
    id!(PERSISTENT_VOLUME_CLAIMS, "", "persistentvolumeclaims");
    id!(STORAGE_CLASSES, "storage.k8s.io", "storageclasses");
    id!(DEPLOYMENTS, "apps", "deployments");
    id!(REPLICASETS, "apps", "replicasets");
    id!(STATEFULSETS, "apps", "statefulsets");
    id!(DAEMONSETS, "apps", "daemonsets");
    id!(CONTROLLER_REVISIONS, "apps", "controllerrevisions");
    id!(JOBS, "batch", "jobs");
    id!(CRONJOBS, "batch", "cronjobs");
    id!(POD_DISRUPTION_BUDGETS, "policy", "poddisruptionbudgets");
    id!(ENDPOINTSLICES, "discovery.k8s.io", "endpointslices");
    id!(LEASES, "coordination.k8s.io", "leases");
    id!(
        MUTATING_WEBHOOKS,
        "admissionregistration.k8s.io",
        "mutatingwebhookconfigurations"
    );
    id!(ROLES, "rbac.authorization.k8s.io", "roles");
    id!(ROLE_BINDINGS, "rbac.authorization.k8s.io", "rolebindings");
    id!(CLUSTER_ROLES, "rbac.authorization.k8s.io", "clusterroles");
    id!(
        CLUSTER_ROLE_BINDINGS,
        "rbac.authorization.k8s.io",
        "clusterrolebindings"
    );
    id!(POD_METRICS, "metrics.k8s.io", "pods");
    id!(NODE_METRICS, "metrics.k8s.io", "nodes");
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_row_is_unique_and_findable() {
        for (i, r) in RESOURCES.iter().enumerate() {
            assert_eq!(find(r.group, r.version, r.plural), Some(i), "{}", r.plural);
        }
        assert_ne!(*ids::PODS, usize::MAX);
        assert_ne!(*ids::NODE_METRICS, usize::MAX);
        assert_eq!(get(*ids::PODS).kind, "Pod");
    }

    #[test]
    fn normalize_rejects_ill_typed_json_and_drops_unknown_fields() {
        let pods = get(*ids::PODS);
        let ok = (pods.normalize)(json!({"metadata": {"name": "a"}, "bogus": 1,
            "spec": {"containers": [{"name": "c", "image": "i"}]}}))
        .unwrap();
        assert!(ok.get("bogus").is_none());
        let err = (pods.normalize)(json!({"spec": {"containers": "nope"}})).unwrap_err();
        assert!(err.contains("invalid type"), "{err}");
    }

    #[test]
    fn a_kind_newer_than_its_type_keeps_its_served_version() {
        let id = find("storage.k8s.io", "v1", "volumeattributesclasses").unwrap();
        let vac = (get(id).normalize)(json!({"apiVersion": "storage.k8s.io/v1",
            "kind": "VolumeAttributesClass", "metadata": {"name": "gold"},
            "driverName": "csi.example.com", "parameters": {"iops": "3000"}}))
        .unwrap();
        assert_eq!(vac["apiVersion"], "storage.k8s.io/v1");
        assert_eq!(vac["parameters"]["iops"], "3000");
    }
}
