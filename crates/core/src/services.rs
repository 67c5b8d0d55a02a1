//! What the lower copies of upper Services and Endpoints are (the Service controller; where it
//! fixes the original's bugs and gaps: `docs/differences.md`).
//!
//! A lower copy of a Service has no selector, so the lower endpoints controllers leave it alone
//! and its Endpoints are ours: a copy of the upper Endpoints, whose addresses are the IPs of the
//! backend pods wherever they run (virtual pods report their lower pod IP upstairs). The lower
//! cluster's EndpointSlice mirroring controller turns those Endpoints into EndpointSlices, as it
//! does for any selector-less Service, so kube-proxy and DNS downstairs see every backend.
//!
//! Differences from the original:
//! - updates of Services and Endpoints always follow (the original needed a manual `global`
//!   annotation on the upper object);
//! - NodePort and LoadBalancer Services become ClusterIP downstairs, without external IPs: the
//!   entry point from outside is the upper cluster's, and repeating it in every lower cluster
//!   takes the same node ports there (conflicts) and buys a cloud load balancer per cluster;
//! - only our own copies are updated or deleted.

use std::collections::BTreeMap;

use k8s_openapi::Metadata;
use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointSubset, Endpoints, ObjectReference, Service, ServiceSpec,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use crate::deps::{CopyAction, is_owned_by, lower_meta, meta_differs};
use crate::keys;

/// The value of `spec.clusterIP` (and `clusterIPs`) of a headless Service.
pub const CLUSTER_IP_NONE: &str = "None";
/// Labels and annotations the upper cluster's endpoints controllers write on Endpoints: they
/// describe the upper controllers' bookkeeping and would mislead (or, for `managed-by`, claim
/// the copy for) the lower ones.
const CONTROLLER_KEY_PREFIXES: &[&str] =
    &["endpoints.kubernetes.io/", "endpointslice.kubernetes.io/"];

/// Which upper Services (and their Endpoints) are mirrored to the lower cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceFilter {
    /// Namespaces whose Services stay upstairs (default `kube-system`).
    pub excluded_namespaces: Vec<String>,
    /// `namespace/name` of single Services that stay upstairs (default `default/kubernetes`:
    /// every cluster has its own API server Service).
    pub excluded_services: Vec<String>,
}

impl Default for ServiceFilter {
    fn default() -> Self {
        ServiceFilter {
            excluded_namespaces: vec![keys::NAMESPACE_KUBE_SYSTEM.to_owned()],
            excluded_services: vec!["default/kubernetes".to_owned()],
        }
    }
}

impl ServiceFilter {
    /// Whether the Service (or Endpoints) `namespace/name` is mirrored.
    pub fn mirrors(&self, namespace: &str, name: &str) -> bool {
        !self.excluded_namespaces.iter().any(|n| n == namespace)
            && !self
                .excluded_services
                .iter()
                .any(|s| s.split_once('/') == Some((namespace, name)))
    }

    fn mirrors_meta(&self, meta: &ObjectMeta) -> bool {
        self.mirrors(
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
        )
    }
}

fn is_headless(spec: Option<&ServiceSpec>) -> bool {
    spec.and_then(|s| s.cluster_ip.as_deref()) == Some(CLUSTER_IP_NONE)
}

fn service_type(spec: Option<&ServiceSpec>) -> &str {
    spec.and_then(|s| s.type_.as_deref())
        .filter(|t| !t.is_empty())
        .unwrap_or("ClusterIP")
}

/// The lower copy of an upper Service made by node `owner`.
///
/// - no selector; the upper one is kept as JSON in annotation `labelSelector` (as the original);
/// - headless stays headless (`clusterIP: None`); any other cluster IP is asked for downstairs
///   too, so a pod offloaded there reaches the Service at the address the upper cluster gave it
///   (when the lower cluster's Service range has it free; if not, [`without_cluster_ip`] is
///   the copy to create instead); the IP families are left to the lower cluster;
/// - ports with their names, protocols, target ports and appProtocols, session affinity,
///   traffic policies, publishNotReadyAddresses are kept; node ports are not;
/// - NodePort and LoadBalancer become ClusterIP (see the module notes); ExternalName stays;
/// - no status; trimmed metadata; `global` and our ownership marks.
pub fn lower_service(upper: &Service, owner: &str) -> Service {
    let mut metadata = lower_meta(&upper.metadata, owner);
    let annotations = metadata.annotations.get_or_insert_with(BTreeMap::new);
    match upper
        .spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .filter(|s| !s.is_empty())
        .and_then(|s| serde_json::to_string(s).ok())
    {
        Some(json) => annotations.insert(keys::ANNOTATION_LABEL_SELECTOR.to_owned(), json),
        None => annotations.remove(keys::ANNOTATION_LABEL_SELECTOR),
    };
    let spec = upper.spec.as_ref().map(|upper_spec| {
        let headless = is_headless(Some(upper_spec));
        let external_name = service_type(Some(upper_spec)) == "ExternalName";
        let ports = upper_spec.ports.clone().map(|ports| {
            ports
                .into_iter()
                .map(|mut p| {
                    p.node_port = None;
                    p
                })
                .collect()
        });
        ServiceSpec {
            type_: Some(
                if external_name {
                    "ExternalName"
                } else {
                    "ClusterIP"
                }
                .to_owned(),
            ),
            external_name: upper_spec.external_name.clone().filter(|_| external_name),
            cluster_ip: if headless {
                Some(CLUSTER_IP_NONE.to_owned())
            } else {
                upper_spec
                    .cluster_ip
                    .clone()
                    .filter(|ip| !ip.is_empty() && !external_name)
            },
            cluster_ips: if headless {
                Some(vec![CLUSTER_IP_NONE.to_owned()])
            } else {
                upper_spec
                    .cluster_ips
                    .clone()
                    .filter(|ips| !ips.is_empty() && !external_name)
            },
            ports,
            session_affinity: upper_spec.session_affinity.clone(),
            session_affinity_config: upper_spec.session_affinity_config.clone(),
            publish_not_ready_addresses: upper_spec.publish_not_ready_addresses,
            internal_traffic_policy: upper_spec.internal_traffic_policy.clone(),
            traffic_distribution: upper_spec.traffic_distribution.clone(),
            ..ServiceSpec::default()
        }
    });
    Service {
        metadata,
        spec,
        status: None,
    }
}

/// The copy to create when the lower API server refused the upper cluster IP of `copy`
/// ([`cluster_ip_refused`]): the same without it, for the lower cluster to allocate one. `None`
/// when `copy` asked for none (headless and ExternalName Services too).
pub fn without_cluster_ip(copy: &Service) -> Option<Service> {
    let spec = copy.spec.as_ref()?;
    let asked = spec
        .cluster_ip
        .as_deref()
        .is_some_and(|ip| ip != CLUSTER_IP_NONE);
    asked.then(|| {
        let mut other = copy.clone();
        if let Some(spec) = other.spec.as_mut() {
            spec.cluster_ip = None;
            spec.cluster_ips = None;
        }
        other
    })
}

/// Whether an API server's answer `code`/`message` to a Service create refused the cluster IP
/// it asked for: taken already, or outside the lower cluster's Service range (422 Invalid on
/// `spec.clusterIP`/`spec.clusterIPs`).
pub fn cluster_ip_refused(code: u16, message: &str) -> bool {
    code == 422 && message.contains("spec.clusterIP")
}

/// Whether the lower Service differs from the `desired` copy ([`lower_service`]): in a spec
/// field the copy sets (fields it leaves unset are the lower cluster's, such as the allocated
/// cluster IP and IP families), in labels, or in the desired annotations.
pub fn service_needs_update(lower: &Service, desired: &Service) -> bool {
    let lower_spec = serde_json::to_value(&lower.spec).unwrap_or(Value::Null);
    let desired_spec = serde_json::to_value(&desired.spec).unwrap_or(Value::Null);
    let set_fields_differ = desired_spec
        .as_object()
        .into_iter()
        .flatten()
        .any(|(field, value)| lower_spec.get(field) != Some(value));
    set_fields_differ || meta_differs(&lower.metadata, &desired.metadata)
}

/// [`CopyAction`] for the Service `namespace/name` given the upper Service and our lower copy
/// (either may be absent), for node `owner`. A lower Service that is not ours is never touched,
/// even when it stands where our copy would.
pub fn service_action(
    upper: Option<&Service>,
    lower: Option<&Service>,
    owner: &str,
    filter: &ServiceFilter,
) -> CopyAction<Service> {
    let (upper, lower) = match both_present(
        upper,
        lower,
        owner,
        |u| filter.mirrors_meta(&u.metadata),
        lower_service,
    ) {
        Ok(pair) => pair,
        Err(action) => return action,
    };
    let mut desired = lower_service(upper, owner);
    let (was, will) = (lower.spec.as_ref(), desired.spec.as_ref());
    // The cluster IP is immutable: headless cannot become a virtual IP or back, and an
    // ExternalName Service has none; such a change is a new Service.
    if is_headless(was) != is_headless(will)
        || (service_type(was) == "ExternalName") != (service_type(will) == "ExternalName")
    {
        return CopyAction::Replace(desired);
    }
    // Otherwise the lower cluster's address stands (the upper one, or another when it was
    // refused), and only the rest is compared.
    if let (Some(spec), Some(lower_spec)) = (desired.spec.as_mut(), lower.spec.as_ref()) {
        spec.cluster_ip = lower_spec.cluster_ip.clone();
        spec.cluster_ips = lower_spec.cluster_ips.clone();
        spec.ip_families = lower_spec.ip_families.clone();
        spec.ip_family_policy = lower_spec.ip_family_policy.clone();
    }
    if !service_needs_update(lower, &desired) {
        return CopyAction::Nothing;
    }
    desired.metadata.resource_version = lower.metadata.resource_version.clone();
    CopyAction::Update(desired)
}

/// The steps every mirrored kind shares: a lower object that is not ours is never touched; our
/// copy of an upper object that is gone, deleting or filtered out is deleted; a missing copy is
/// created. What is left (`Ok`) is an upper object and our copy, to compare.
fn both_present<'a, T: Metadata<Ty = ObjectMeta>>(
    upper: Option<&'a T>,
    lower: Option<&'a T>,
    owner: &str,
    mirrored: impl Fn(&T) -> bool,
    build: fn(&T, &str) -> T,
) -> Result<(&'a T, &'a T), CopyAction<T>> {
    if lower.is_some_and(|l| !is_owned_by(l.metadata(), owner)) {
        return Err(CopyAction::Nothing);
    }
    let upper = upper.filter(|u| u.metadata().deletion_timestamp.is_none() && mirrored(u));
    match (upper, lower) {
        (None, None) => Err(CopyAction::Nothing),
        (None, Some(_)) => Err(CopyAction::Delete),
        (Some(upper), None) => Err(CopyAction::Create(build(upper, owner))),
        (Some(upper), Some(lower)) => Ok((upper, lower)),
    }
}

fn without_controller_keys(map: &mut Option<BTreeMap<String, String>>) {
    if let Some(map) = map {
        map.retain(|k, _| !CONTROLLER_KEY_PREFIXES.iter().any(|p| k.starts_with(p)));
    }
}

/// An upper address as the lower cluster should see it: the IP and hostname (headless DNS) are
/// kept; the node name (an upper node, often a virtual one) is not, and the target reference
/// keeps the pod's kind, namespace and name but not its upper uid and resourceVersion.
fn lower_address(upper: &EndpointAddress) -> EndpointAddress {
    EndpointAddress {
        ip: upper.ip.clone(),
        hostname: upper.hostname.clone(),
        node_name: None,
        target_ref: upper.target_ref.as_ref().map(|r| ObjectReference {
            kind: r.kind.clone(),
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            ..ObjectReference::default()
        }),
    }
}

/// The lower copy of upper Endpoints made by node `owner`: the subsets (see [`lower_address`]),
/// trimmed metadata without the upper controllers' keys, `global` and our ownership marks.
pub fn lower_endpoints(upper: &Endpoints, owner: &str) -> Endpoints {
    let mut metadata = lower_meta(&upper.metadata, owner);
    without_controller_keys(&mut metadata.labels);
    without_controller_keys(&mut metadata.annotations);
    let subsets = upper.subsets.as_ref().map(|subsets| {
        subsets
            .iter()
            .map(|s| EndpointSubset {
                addresses: s
                    .addresses
                    .as_ref()
                    .map(|a| a.iter().map(lower_address).collect()),
                not_ready_addresses: s
                    .not_ready_addresses
                    .as_ref()
                    .map(|a| a.iter().map(lower_address).collect()),
                ports: s.ports.clone(),
            })
            .collect()
    });
    Endpoints { metadata, subsets }
}

/// An absent subset list, an empty one and empty address lists are the same to the API server.
fn normalized_subsets(endpoints: &Endpoints) -> Value {
    let mut value = serde_json::to_value(endpoints.subsets.as_deref().unwrap_or_default())
        .unwrap_or(Value::Null);
    for subset in value.as_array_mut().into_iter().flatten() {
        if let Some(fields) = subset.as_object_mut() {
            fields.retain(|_, v| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty()));
        }
    }
    value
}

/// [`CopyAction`] for the Endpoints `namespace/name`, as [`service_action`].
pub fn endpoints_action(
    upper: Option<&Endpoints>,
    lower: Option<&Endpoints>,
    owner: &str,
    filter: &ServiceFilter,
) -> CopyAction<Endpoints> {
    let (upper, lower) = match both_present(
        upper,
        lower,
        owner,
        |u| filter.mirrors_meta(&u.metadata),
        lower_endpoints,
    ) {
        Ok(pair) => pair,
        Err(action) => return action,
    };
    let mut desired = lower_endpoints(upper, owner);
    if normalized_subsets(lower) == normalized_subsets(&desired)
        && !meta_differs(&lower.metadata, &desired.metadata)
    {
        return CopyAction::Nothing;
    }
    desired.metadata.resource_version = lower.metadata.resource_version.clone();
    CopyAction::Update(desired)
}

/// The label of an EndpointSlice naming its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// The label of an EndpointSlice naming the controller (or user) that manages it.
pub const LABEL_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
/// The managers of the EndpointSlices Kubernetes makes itself: for a Service with a selector
/// and for user-written Endpoints. Both kinds of slice downstairs come from the Endpoints we
/// copy, so only the others, written by users and their controllers, are copied as slices.
pub const KUBERNETES_SLICE_MANAGERS: [&str; 2] = [
    "endpointslice-controller.k8s.io",
    "endpointslicemirroring-controller.k8s.io",
];
/// The manager of our EndpointSlice copies: the lower controllers leave them alone.
pub const SLICE_MANAGER: &str = "tensile-kube";

/// The label selector of the upper EndpointSlices that are copied (see [`slice_mirrored`]).
pub fn mirrored_slices_selector() -> String {
    format!(
        "{LABEL_SERVICE_NAME},{LABEL_MANAGED_BY} notin ({})",
        KUBERNETES_SLICE_MANAGERS.join(",")
    )
}

/// Whether the upper EndpointSlice is copied downstairs: it belongs to a Service the filter
/// mirrors, and Kubernetes did not make it from a selector or from Endpoints.
pub fn slice_mirrored(slice: &EndpointSlice, filter: &ServiceFilter) -> bool {
    let labels = slice.metadata.labels.as_ref();
    let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    let Some(service) = label(LABEL_SERVICE_NAME).filter(|s| !s.is_empty()) else {
        return false;
    };
    !label(LABEL_MANAGED_BY).is_some_and(|m| KUBERNETES_SLICE_MANAGERS.contains(&m))
        && filter.mirrors(
            slice.metadata.namespace.as_deref().unwrap_or_default(),
            service,
        )
}

/// The lower copy of an upper EndpointSlice made by node `owner`: its address type, ports and
/// endpoints (addresses, conditions, hostname; the target reference without upper uid; no node
/// name, zone or hints, which name upper topology), trimmed metadata managed by us.
pub fn lower_endpoint_slice(upper: &EndpointSlice, owner: &str) -> EndpointSlice {
    let mut metadata = lower_meta(&upper.metadata, owner);
    without_controller_keys(&mut metadata.labels);
    without_controller_keys(&mut metadata.annotations);
    metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(LABEL_MANAGED_BY.to_owned(), SLICE_MANAGER.to_owned());
    let endpoints = upper
        .endpoints
        .iter()
        .map(|e| Endpoint {
            addresses: e.addresses.clone(),
            conditions: e.conditions.clone(),
            hostname: e.hostname.clone(),
            target_ref: e.target_ref.as_ref().map(|r| ObjectReference {
                kind: r.kind.clone(),
                namespace: r.namespace.clone(),
                name: r.name.clone(),
                ..ObjectReference::default()
            }),
            ..Endpoint::default()
        })
        .collect();
    EndpointSlice {
        metadata,
        address_type: upper.address_type.clone(),
        endpoints,
        ports: upper.ports.clone(),
    }
}

/// Whether a lower EndpointSlice is one of our copies by its manager label (see
/// [`lower_slices_selector`]).
pub fn slice_managed_by_us(slice: &EndpointSlice) -> bool {
    slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_MANAGED_BY))
        .is_some_and(|m| m == SLICE_MANAGER)
}

/// The label selector that narrows a watch of lower EndpointSlices to our copies.
pub fn lower_slices_selector() -> String {
    format!("{LABEL_MANAGED_BY}={SLICE_MANAGER}")
}

/// [`CopyAction`] for the EndpointSlice `namespace/name`, as [`service_action`]; the address
/// type is immutable, so a change of it is a new slice.
pub fn endpoint_slice_action(
    upper: Option<&EndpointSlice>,
    lower: Option<&EndpointSlice>,
    owner: &str,
    filter: &ServiceFilter,
) -> CopyAction<EndpointSlice> {
    // Kubernetes' own slices of a lower Service carry its labels, our owner label among them
    // (the slice and mirroring controllers copy the Service's or the Endpoints' labels): only
    // the slices we manage are copies.
    if lower.is_some_and(|l| !slice_managed_by_us(l)) {
        return CopyAction::Nothing;
    }
    let (upper, lower) = match both_present(
        upper,
        lower,
        owner,
        |u| slice_mirrored(u, filter),
        lower_endpoint_slice,
    ) {
        Ok(pair) => pair,
        Err(action) => return action,
    };
    let mut desired = lower_endpoint_slice(upper, owner);
    if desired.address_type != lower.address_type {
        return CopyAction::Replace(desired);
    }
    let same = |a: &EndpointSlice| {
        (
            serde_json::to_value(&a.endpoints).unwrap_or(Value::Null),
            serde_json::to_value(a.ports.as_deref().unwrap_or_default()).unwrap_or(Value::Null),
        )
    };
    if same(lower) == same(&desired) && !meta_differs(&lower.metadata, &desired.metadata) {
        return CopyAction::Nothing;
    }
    desired.metadata.resource_version = lower.metadata.resource_version.clone();
    CopyAction::Update(desired)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    const OWNER: &str = "vk-lower-a";

    fn service(spec: Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {
                "name": "web", "namespace": "shop", "uid": "svc-uid", "resourceVersion": "7",
                "labels": {"app": "web"}, "annotations": {"team": "a"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Foo", "name": "f", "uid": "u"}],
            },
            "spec": spec,
            "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.9"}]}},
        }))
        .unwrap()
    }

    fn web_spec() -> Value {
        json!({
            "type": "ClusterIP",
            "selector": {"app": "web"},
            "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
            "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
            "ports": [
                {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                {"name": "dns", "port": 53, "targetPort": 53, "protocol": "UDP"},
            ],
            "sessionAffinity": "None",
            "internalTrafficPolicy": "Cluster",
        })
    }

    /// The copy as the lower API server returns it after creation: with its own cluster IP.
    fn created(copy: &Service, cluster_ip: &str) -> Service {
        let mut lower = copy.clone();
        lower.metadata.resource_version = Some("100".into());
        lower.metadata.uid = Some("lower-uid".into());
        let spec = lower.spec.as_mut().unwrap();
        if spec.cluster_ip.is_none() {
            spec.cluster_ip = Some(cluster_ip.into());
            spec.cluster_ips = Some(vec![cluster_ip.into()]);
        }
        spec.ip_families = Some(vec!["IPv4".into()]);
        spec.ip_family_policy = Some("SingleStack".into());
        lower
    }

    #[test]
    fn checklist_68_copy_has_no_selector_keeps_it_as_json_asks_for_the_cluster_ip_and_is_global() {
        let copy = lower_service(&service(web_spec()), OWNER);
        let json = serde_json::to_value(&copy).unwrap();
        assert_eq!(
            json,
            json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {
                    "name": "web", "namespace": "shop",
                    "labels": {"app": "web", keys::LABEL_OWNER: keys::owner_label_value(OWNER)},
                    "annotations": {
                        "team": "a", "global": "true", "labelSelector": "{\"app\":\"web\"}",
                        keys::ANNOTATION_UPPER_UID: "svc-uid",
                    },
                },
                "spec": {
                    "type": "ClusterIP",
                    "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
                    "ports": [
                        {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                        {"name": "dns", "port": 53, "targetPort": 53, "protocol": "UDP"},
                    ],
                    "sessionAffinity": "None",
                    "internalTrafficPolicy": "Cluster",
                },
            })
        );
    }

    #[test]
    fn a_refused_cluster_ip_is_left_to_the_lower_cluster_and_never_rewritten() {
        let upper = service(web_spec());
        let copy = lower_service(&upper, OWNER);
        let other = without_cluster_ip(&copy).unwrap();
        let spec = other.spec.as_ref().unwrap();
        assert_eq!(
            (spec.cluster_ip.as_ref(), spec.cluster_ips.as_ref()),
            (None, None)
        );
        assert_eq!(other.metadata, copy.metadata);
        // Made with another address, the copy is in step: no update asks for the upper one.
        let lower = created(&other, "10.200.0.7");
        assert!(matches!(
            service_action(Some(&upper), Some(&lower), OWNER, &ServiceFilter::default()),
            CopyAction::Nothing
        ));
        // Headless and ExternalName copies ask for no address.
        let mut headless = web_spec();
        headless["clusterIP"] = json!("None");
        headless["clusterIPs"] = json!(["None"]);
        assert_eq!(
            without_cluster_ip(&lower_service(&service(headless), OWNER)),
            None
        );
        let external = json!({"type": "ExternalName", "externalName": "db.example.com",
            "clusterIP": ""});
        assert_eq!(
            without_cluster_ip(&lower_service(&service(external), OWNER)),
            None
        );
        // The lower API server's refusals, as kube-apiserver words them.
        assert!(cluster_ip_refused(
            422,
            "Service \"web\" is invalid: spec.clusterIPs: Invalid value: [\"198.19.0.10\"]: \
             failed to allocate IP 198.19.0.10: provided IP is already allocated"
        ));
        assert!(cluster_ip_refused(
            422,
            "Service \"web\" is invalid: spec.clusterIPs: Invalid value: [\"10.96.0.10\"]: \
             failed to allocate IP 10.96.0.10: the provided IP (10.96.0.10) is not in the valid range"
        ));
        assert!(!cluster_ip_refused(
            422,
            "spec.ports[0].port: Invalid value: 0"
        ));
        assert!(!cluster_ip_refused(409, "spec.clusterIP"));
    }

    #[test]
    fn headless_stays_headless() {
        let mut spec = web_spec();
        spec["clusterIP"] = json!("None");
        spec["clusterIPs"] = json!(["None"]);
        let copy = lower_service(&service(spec), OWNER);
        let spec = copy.spec.unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.cluster_ips, Some(vec!["None".to_owned()]));
    }

    #[test]
    fn node_port_and_load_balancer_become_cluster_ip_without_node_ports_or_external_ips() {
        let mut spec = web_spec();
        spec["type"] = json!("LoadBalancer");
        spec["ports"][0]["nodePort"] = json!(30080);
        spec["externalIPs"] = json!(["198.51.100.1"]);
        spec["externalTrafficPolicy"] = json!("Local");
        spec["healthCheckNodePort"] = json!(31000);
        spec["loadBalancerClass"] = json!("x");
        let copy = lower_service(&service(spec), OWNER);
        let spec = serde_json::to_value(copy.spec.unwrap()).unwrap();
        assert_eq!(spec["type"], "ClusterIP");
        assert_eq!(spec["ports"][0].get("nodePort"), None);
        for gone in [
            "externalIPs",
            "externalTrafficPolicy",
            "healthCheckNodePort",
            "loadBalancerClass",
        ] {
            assert_eq!(spec.get(gone), None, "{gone}");
        }
        assert_eq!(copy.status, None);
    }

    #[test]
    fn external_name_stays_external_name() {
        let spec = json!({"type": "ExternalName", "externalName": "db.example.com"});
        let copy = lower_service(&service(spec), OWNER);
        let spec = copy.spec.unwrap();
        assert_eq!(spec.type_.as_deref(), Some("ExternalName"));
        assert_eq!(spec.external_name.as_deref(), Some("db.example.com"));
        assert!(
            !copy
                .metadata
                .annotations
                .unwrap()
                .contains_key("labelSelector")
        );
    }

    #[test]
    fn default_filter_keeps_kube_system_and_the_api_server_service_upstairs() {
        let filter = ServiceFilter::default();
        assert!(!filter.mirrors("kube-system", "kube-dns"));
        assert!(!filter.mirrors("default", "kubernetes"));
        assert!(filter.mirrors("shop", "kubernetes"));
        assert!(filter.mirrors("default", "web"));
    }

    #[test]
    fn a_missing_copy_is_created_and_an_unchanged_one_is_left_alone() {
        let filter = ServiceFilter::default();
        let upper = service(web_spec());
        let CopyAction::Create(copy) = service_action(Some(&upper), None, OWNER, &filter) else {
            panic!("expected Create");
        };
        let lower = created(&copy, "10.0.0.5");
        assert_eq!(
            service_action(Some(&upper), Some(&lower), OWNER, &filter),
            CopyAction::Nothing
        );
    }

    #[test]
    fn a_port_change_updates_the_copy_keeping_the_lower_cluster_ip() {
        let filter = ServiceFilter::default();
        let upper = service(web_spec());
        // Made with an address of the lower cluster's (the upper one was refused).
        let asked = without_cluster_ip(&lower_service(&upper, OWNER)).unwrap();
        let lower = created(&asked, "10.0.0.5");
        let mut changed = web_spec();
        changed["ports"][0]["port"] = json!(81);
        let CopyAction::Update(desired) =
            service_action(Some(&service(changed)), Some(&lower), OWNER, &filter)
        else {
            panic!("expected Update");
        };
        let spec = desired.spec.unwrap();
        assert_eq!(spec.ports.unwrap()[0].port, 81);
        assert_eq!(spec.cluster_ip.as_deref(), Some("10.0.0.5"));
        assert_eq!(spec.ip_families, Some(vec!["IPv4".to_owned()]));
        assert_eq!(desired.metadata.resource_version.as_deref(), Some("100"));
    }

    #[test]
    fn headless_to_virtual_ip_is_a_replacement() {
        let filter = ServiceFilter::default();
        let lower = created(&lower_service(&service(web_spec()), OWNER), "10.0.0.5");
        let mut headless = web_spec();
        headless["clusterIP"] = json!("None");
        assert!(matches!(
            service_action(Some(&service(headless)), Some(&lower), OWNER, &filter),
            CopyAction::Replace(_)
        ));
    }

    #[test]
    fn checklist_71_a_gone_or_deleting_or_excluded_upper_deletes_only_our_copy() {
        let filter = ServiceFilter::default();
        let upper = service(web_spec());
        let ours = created(&lower_service(&upper, OWNER), "10.0.0.5");
        assert_eq!(
            service_action(None, Some(&ours), OWNER, &filter),
            CopyAction::Delete
        );
        let mut deleting = upper.clone();
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
        );
        assert_eq!(
            service_action(Some(&deleting), Some(&ours), OWNER, &filter),
            CopyAction::Delete
        );
        let excluded = ServiceFilter {
            excluded_namespaces: vec!["shop".into()],
            ..ServiceFilter::default()
        };
        assert_eq!(
            service_action(Some(&upper), Some(&ours), OWNER, &excluded),
            CopyAction::Delete
        );
        // Someone else's Service of the same name, or another node's copy: never touched.
        let mut theirs = ours.clone();
        theirs.metadata.labels = Some(BTreeMap::from([("app".into(), "web".into())]));
        assert_eq!(
            service_action(None, Some(&theirs), OWNER, &filter),
            CopyAction::Nothing
        );
        assert_eq!(
            service_action(Some(&upper), Some(&theirs), OWNER, &filter),
            CopyAction::Nothing
        );
        assert_eq!(
            service_action(None, Some(&ours), "vk-other", &filter),
            CopyAction::Nothing
        );
        assert_eq!(
            service_action(None, None, OWNER, &filter),
            CopyAction::Nothing
        );
    }

    fn endpoints(addresses: Value) -> Endpoints {
        serde_json::from_value(json!({
            "metadata": {
                "name": "web", "namespace": "shop", "uid": "ep-uid", "resourceVersion": "9",
                "labels": {"app": "web", "endpoints.kubernetes.io/managed-by": "endpoint-controller"},
                "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-01-01T00:00:00Z"},
            },
            "subsets": [{
                "addresses": addresses,
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            }],
        }))
        .unwrap()
    }

    fn address(ip: &str, node: &str) -> Value {
        json!({
            "ip": ip, "nodeName": node,
            "targetRef": {"kind": "Pod", "namespace": "shop", "name": format!("web-{ip}"), "uid": "pod-uid", "resourceVersion": "3"},
        })
    }

    #[test]
    fn checklist_70_endpoints_copy_is_global_with_every_address_and_no_upper_bookkeeping() {
        let upper = endpoints(json!([
            address("10.1.0.5", "vk-lower-a"),
            address("10.2.0.7", "vk-lower-b")
        ]));
        let copy = lower_endpoints(&upper, OWNER);
        let json = serde_json::to_value(&copy).unwrap();
        assert_eq!(
            json,
            json!({
                "apiVersion": "v1", "kind": "Endpoints",
                "metadata": {
                    "name": "web", "namespace": "shop",
                    "labels": {"app": "web", keys::LABEL_OWNER: keys::owner_label_value(OWNER)},
                    "annotations": {"global": "true", keys::ANNOTATION_UPPER_UID: "ep-uid"},
                },
                "subsets": [{
                    "addresses": [
                        {"ip": "10.1.0.5", "targetRef": {"kind": "Pod", "namespace": "shop", "name": "web-10.1.0.5"}},
                        {"ip": "10.2.0.7", "targetRef": {"kind": "Pod", "namespace": "shop", "name": "web-10.2.0.7"}},
                    ],
                    "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                }],
            })
        );
    }

    #[test]
    fn checklist_70_later_address_changes_are_propagated() {
        let filter = ServiceFilter::default();
        let upper = endpoints(json!([address("10.1.0.5", "vk-lower-a")]));
        let CopyAction::Create(copy) = endpoints_action(Some(&upper), None, OWNER, &filter) else {
            panic!("expected Create");
        };
        let mut lower = copy.clone();
        lower.metadata.resource_version = Some("50".into());
        assert_eq!(
            endpoints_action(Some(&upper), Some(&lower), OWNER, &filter),
            CopyAction::Nothing
        );
        let moved = endpoints(json!([
            address("10.1.0.5", "vk-lower-a"),
            address("10.2.0.7", "x")
        ]));
        let CopyAction::Update(desired) =
            endpoints_action(Some(&moved), Some(&lower), OWNER, &filter)
        else {
            panic!("expected Update");
        };
        assert_eq!(
            desired.subsets.unwrap()[0]
                .addresses
                .as_ref()
                .unwrap()
                .len(),
            2
        );
        assert_eq!(desired.metadata.resource_version.as_deref(), Some("50"));
        assert_eq!(
            endpoints_action(None, Some(&lower), OWNER, &filter),
            CopyAction::Delete
        );
        let mut theirs = lower.clone();
        theirs.metadata.labels = None;
        assert_eq!(
            endpoints_action(None, Some(&theirs), OWNER, &filter),
            CopyAction::Nothing
        );
    }

    #[test]
    fn empty_and_absent_subsets_are_the_same() {
        let filter = ServiceFilter::default();
        let mut upper = endpoints(json!([]));
        upper.subsets = Some(vec![]);
        let mut lower = lower_endpoints(&upper, OWNER);
        lower.subsets = None;
        assert_eq!(
            endpoints_action(Some(&upper), Some(&lower), OWNER, &filter),
            CopyAction::Nothing
        );
    }

    fn slice(name: &str, labels: Value, endpoints: Value) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop", "uid": "u-1", "resourceVersion": "7",
                "labels": labels},
            "addressType": "IPv4",
            "endpoints": endpoints,
            "ports": [{"name": "port80", "port": 8090, "protocol": "TCP"}],
        }))
        .unwrap()
    }

    #[test]
    fn only_slices_users_write_for_a_mirrored_service_are_copied() {
        let filter = ServiceFilter::default();
        let with = |labels: Value| slice("s-1", labels, json!([]));
        assert!(slice_mirrored(
            &with(
                json!({"kubernetes.io/service-name": "web", "endpointslice.kubernetes.io/managed-by": "e2e-test"})
            ),
            &filter
        ));
        assert!(slice_mirrored(
            &with(json!({"kubernetes.io/service-name": "web"})),
            &filter
        ));
        for manager in KUBERNETES_SLICE_MANAGERS {
            assert!(!slice_mirrored(
                &with(
                    json!({"kubernetes.io/service-name": "web", "endpointslice.kubernetes.io/managed-by": manager})
                ),
                &filter
            ));
        }
        assert!(!slice_mirrored(&with(json!({})), &filter), "no Service");
        let mut kube_system = with(json!({"kubernetes.io/service-name": "dns"}));
        kube_system.metadata.namespace = Some("kube-system".into());
        assert!(!slice_mirrored(&kube_system, &filter), "filtered out");
        assert_eq!(
            mirrored_slices_selector(),
            "kubernetes.io/service-name,endpointslice.kubernetes.io/managed-by notin (endpointslice-controller.k8s.io,endpointslicemirroring-controller.k8s.io)"
        );
    }

    #[test]
    fn a_slice_copy_is_ours_managed_by_us_without_upper_topology_and_follows_changes() {
        let filter = ServiceFilter::default();
        let upper = slice(
            "s-1",
            json!({"kubernetes.io/service-name": "web", "endpointslice.kubernetes.io/managed-by": "e2e-test"}),
            json!([{"addresses": ["198.18.1.5"], "conditions": {"ready": true}, "nodeName": "vk-1",
                "zone": "upper-zone", "targetRef": {"kind": "Pod", "namespace": "shop", "name": "p", "uid": "x"}}]),
        );
        let CopyAction::Create(copy) = endpoint_slice_action(Some(&upper), None, OWNER, &filter)
        else {
            panic!("a missing copy is created")
        };
        assert!(is_owned_by(&copy.metadata, OWNER));
        let labels = copy.metadata.labels.clone().unwrap();
        assert_eq!(labels[LABEL_MANAGED_BY], SLICE_MANAGER);
        assert_eq!(labels[LABEL_SERVICE_NAME], "web");
        assert_eq!(copy.metadata.uid, None);
        let e = &copy.endpoints[0];
        assert_eq!(e.addresses, vec!["198.18.1.5".to_owned()]);
        assert_eq!(e.conditions.as_ref().unwrap().ready, Some(true));
        assert_eq!((e.node_name.as_deref(), e.zone.as_deref()), (None, None));
        assert_eq!(e.target_ref.as_ref().unwrap().uid, None);
        assert_eq!(copy.ports, upper.ports);
        // In step: nothing; an address change: an update; another address type: a new slice.
        let mut lower = copy.clone();
        lower.metadata.resource_version = Some("50".into());
        assert_eq!(
            endpoint_slice_action(Some(&upper), Some(&lower), OWNER, &filter),
            CopyAction::Nothing
        );
        let mut moved = upper.clone();
        moved.endpoints[0].addresses = vec!["198.18.2.6".into()];
        let CopyAction::Update(update) =
            endpoint_slice_action(Some(&moved), Some(&lower), OWNER, &filter)
        else {
            panic!("an address change is an update")
        };
        assert_eq!(update.metadata.resource_version.as_deref(), Some("50"));
        let mut v6 = upper.clone();
        v6.address_type = "IPv6".into();
        assert!(matches!(
            endpoint_slice_action(Some(&v6), Some(&lower), OWNER, &filter),
            CopyAction::Replace(_)
        ));
        // Gone upstairs: our copy goes; a slice not ours is never touched.
        assert_eq!(
            endpoint_slice_action(None, Some(&lower), OWNER, &filter),
            CopyAction::Delete
        );
        let mut theirs = lower.clone();
        theirs.metadata.labels = None;
        assert_eq!(
            endpoint_slice_action(Some(&upper), Some(&theirs), OWNER, &filter),
            CopyAction::Nothing
        );
    }

    #[test]
    fn kubernetes_own_slices_of_our_service_copies_are_never_taken_for_copies() {
        // The lower slice and mirroring controllers copy our Service's (or Endpoints') labels,
        // our owner label among them, onto the slices they make: with no upper slice of that
        // name they must stay (deleting them left the lower Services without backends).
        let filter = ServiceFilter::default();
        let copy = lower_service(&service(web_spec()), OWNER);
        for manager in KUBERNETES_SLICE_MANAGERS {
            let mut labels = copy.metadata.labels.clone().unwrap();
            labels.insert(LABEL_SERVICE_NAME.into(), "web".into());
            labels.insert(LABEL_MANAGED_BY.into(), manager.into());
            let made = slice("web-x7k2p", json!(labels), json!([]));
            assert!(is_owned_by(&made.metadata, OWNER), "it carries our label");
            assert!(!slice_managed_by_us(&made));
            assert_eq!(
                endpoint_slice_action(None, Some(&made), OWNER, &filter),
                CopyAction::Nothing,
                "{manager}"
            );
        }
        assert_eq!(
            lower_slices_selector(),
            "endpointslice.kubernetes.io/managed-by=tensile-kube"
        );
    }
}
