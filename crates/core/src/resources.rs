//! Resource vectors and a pod's effective requests, computed like Kubernetes'
//! `resourcehelper.PodRequests` (k8s 1.33, `component-helpers/resource/helpers.go`).
//!
//! Every amount is an `i128` count of nano-units (see [`crate::quantity`]); one pod slot is
//! [`POD_SLOT`] nano-pods.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::quantity::{
    NANOS_PER_MILLI, NANOS_PER_UNIT, QuantityError, QuantityFormat, format_quantity, from_quantity,
    milli_value, value,
};

/// CPU, in cores.
pub const RESOURCE_CPU: &str = "cpu";
/// Memory, in bytes.
pub const RESOURCE_MEMORY: &str = "memory";
/// Local ephemeral storage, in bytes.
pub const RESOURCE_EPHEMERAL_STORAGE: &str = "ephemeral-storage";
/// Number of pods.
pub const RESOURCE_PODS: &str = "pods";
/// Prefix of huge page resources (`hugepages-2Mi`).
pub const HUGEPAGES_PREFIX: &str = "hugepages-";
/// Prefix of the legacy per-driver volume limits.
const ATTACHABLE_VOLUMES_PREFIX: &str = "attachable-volumes-";
/// Resource names containing this are Kubernetes' own prefixed native resources.
const NATIVE_RESOURCE_PREFIX: &str = "kubernetes.io/";
/// Quota prefix; `requests.<name>` must be a qualified name for an extended resource.
const QUOTA_REQUESTS_PREFIX: &str = "requests.";
/// The resources a node status always carries, even at zero.
pub const BASE_RESOURCES: [&str; 4] = [
    RESOURCE_CPU,
    RESOURCE_MEMORY,
    RESOURCE_PODS,
    RESOURCE_EPHEMERAL_STORAGE,
];
/// One pod slot in the `pods` resource.
pub const POD_SLOT: i128 = NANOS_PER_UNIT;
/// The largest magnitude accepted for one resource amount: 2^63-1 units, the most any
/// Kubernetes component can hold in an `int64`. Bounding inputs keeps sums of billions of them
/// far from the `i128` limit.
pub const MAX_RESOURCE_NANOS: i128 = i64::MAX as i128 * NANOS_PER_UNIT;

/// Why resources could not be read or added up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    /// The pod has no spec or no (regular) containers.
    #[error("pod {pod} has no containers")]
    NoContainers {
        /// `namespace/name` of the pod.
        pod: String,
    },
    /// A quantity in a resource map (node capacity or allocatable, a standalone list) is bad.
    #[error("resource {resource:?}: {reason}")]
    InvalidQuantity {
        /// The resource name.
        resource: String,
        /// What is wrong with the quantity; names its text.
        reason: Box<QuantityError>,
    },
    /// A quantity in a pod is bad.
    #[error(
        "pod {pod}: {}{field}[{resource:?}]: {reason}",
        ContainerPrefix(.container.as_deref())
    )]
    InvalidPodQuantity {
        /// `namespace/name` of the pod.
        pod: String,
        /// The container (`init container "x"` or `container "x"`), if the quantity is in one.
        container: Option<String>,
        /// Where the quantity is: `resources.requests`, `resources.limits` or `overhead`.
        field: &'static str,
        /// The resource name.
        resource: String,
        /// What is wrong with the quantity; names its text.
        reason: Box<QuantityError>,
    },
    /// A sum or difference left the representable range.
    #[error("resource {resource:?}: sum out of range")]
    Overflow {
        /// The resource name.
        resource: String,
    },
}

/// Prints the optional container part of an [`ResourceError::InvalidPodQuantity`].
struct ContainerPrefix<'a>(Option<&'a str>);

impl fmt::Display for ContainerPrefix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(container) => write!(f, "{container} "),
            None => f.write_str("spec."),
        }
    }
}

/// Amounts per resource name, in nano-units. A missing resource and a zero amount are the same
/// value (equality treats them alike), but keys are kept as inserted so that "specified as
/// zero" stays visible, as it is in Kubernetes resource lists.
#[derive(Debug, Clone, Default)]
pub struct ResourceVector(BTreeMap<String, i128>);

impl PartialEq for ResourceVector {
    fn eq(&self, other: &Self) -> bool {
        self.0
            .keys()
            .chain(other.0.keys())
            .all(|name| self.get(name) == other.get(name))
    }
}

impl Eq for ResourceVector {}

impl ResourceVector {
    /// The empty vector.
    pub fn new() -> Self {
        Self::default()
    }

    /// The amount of a resource, zero if absent.
    pub fn get(&self, name: &str) -> i128 {
        self.0.get(name).copied().unwrap_or(0)
    }

    /// Whether the resource is present (possibly at zero).
    pub fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    /// Sets the amount of a resource.
    pub fn set(&mut self, name: impl Into<String>, nanos: i128) {
        self.0.insert(name.into(), nanos);
    }

    /// Removes a resource, returning its amount.
    pub fn remove(&mut self, name: &str) -> Option<i128> {
        self.0.remove(name)
    }

    /// The resources and amounts, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, i128)> + '_ {
        self.0.iter().map(|(name, nanos)| (name.as_str(), *nanos))
    }

    /// The resource names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> + '_ {
        self.0.keys().map(String::as_str)
    }

    /// Number of resources present.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no resource is present.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether every amount is zero.
    pub fn is_zero(&self) -> bool {
        self.0.values().all(|nanos| *nanos == 0)
    }

    /// The underlying map.
    pub fn as_map(&self) -> &BTreeMap<String, i128> {
        &self.0
    }

    /// The same amounts without the zero entries.
    pub fn without_zeros(&self) -> Self {
        Self(
            self.0
                .iter()
                .filter(|(_, n)| **n != 0)
                .map(|(k, n)| (k.clone(), *n))
                .collect(),
        )
    }

    /// `self + other`, or the first resource whose sum leaves the `i128` range.
    pub fn checked_add(&self, other: &Self) -> Result<Self, ResourceError> {
        self.checked_combine(other, i128::checked_add)
    }

    /// `self - other`, or the first resource whose difference leaves the `i128` range.
    pub fn checked_sub(&self, other: &Self) -> Result<Self, ResourceError> {
        self.checked_combine(other, i128::checked_sub)
    }

    /// Adds `other` in place; on overflow `self` is left unchanged.
    pub fn try_add_assign(&mut self, other: &Self) -> Result<(), ResourceError> {
        *self = self.checked_add(other)?;
        Ok(())
    }

    /// Adds `other` in place, saturating at the `i128` bounds (unreachable for amounts bounded
    /// by [`MAX_RESOURCE_NANOS`] unless billions of them are summed).
    pub fn saturating_add_assign(&mut self, other: &Self) {
        for (name, nanos) in &other.0 {
            let entry = self.0.entry(name.clone()).or_insert(0);
            *entry = entry.saturating_add(*nanos);
        }
    }

    /// Subtracts `other` in place, saturating at the `i128` bounds.
    pub fn saturating_sub_assign(&mut self, other: &Self) {
        for (name, nanos) in &other.0 {
            let entry = self.0.entry(name.clone()).or_insert(0);
            *entry = entry.saturating_sub(*nanos);
        }
    }

    /// For each resource of `other`, keeps the larger amount; a resource missing from `self`
    /// takes `other`'s amount (upstream's `maxResourceList`).
    pub fn max_assign(&mut self, other: &Self) {
        for (name, nanos) in &other.0 {
            self.0
                .entry(name.clone())
                .and_modify(|mine| *mine = (*mine).max(*nanos))
                .or_insert(*nanos);
        }
    }

    fn checked_combine(
        &self,
        other: &Self,
        op: fn(i128, i128) -> Option<i128>,
    ) -> Result<Self, ResourceError> {
        let mut result = self.clone();
        for (name, nanos) in &other.0 {
            let entry = result.0.entry(name.clone()).or_insert(0);
            *entry = op(*entry, *nanos).ok_or_else(|| ResourceError::Overflow {
                resource: name.clone(),
            })?;
        }
        Ok(result)
    }

    /// Reads a resource list (node capacity or allocatable, container requests). The first bad
    /// quantity is an error naming the resource and its text.
    pub fn from_quantities(map: &BTreeMap<String, Quantity>) -> Result<Self, ResourceError> {
        let mut vector = Self::new();
        for (name, quantity) in map {
            let nanos = parse_resource_quantity(quantity).map_err(|reason| {
                ResourceError::InvalidQuantity {
                    resource: name.clone(),
                    reason: Box::new(reason),
                }
            })?;
            vector.set(name.clone(), nanos);
        }
        Ok(vector)
    }

    /// Reads a resource list, skipping bad quantities and returning them as errors, so that one
    /// odd extended resource does not hide a whole node.
    pub fn from_quantities_lenient(map: &BTreeMap<String, Quantity>) -> (Self, Vec<ResourceError>) {
        let mut vector = Self::new();
        let mut errors = Vec::new();
        for (name, quantity) in map {
            match parse_resource_quantity(quantity) {
                Ok(nanos) => vector.set(name.clone(), nanos),
                Err(reason) => errors.push(ResourceError::InvalidQuantity {
                    resource: name.clone(),
                    reason: Box::new(reason),
                }),
            }
        }
        (vector, errors)
    }

    /// The amounts as a Kubernetes resource list, each in canonical form with the format
    /// Kubernetes uses for that resource (see [`format_for_resource`]).
    pub fn to_quantities(&self) -> BTreeMap<String, Quantity> {
        self.0
            .iter()
            .map(|(name, nanos)| {
                let text = format_quantity(*nanos, format_for_resource(name));
                (name.clone(), Quantity(text))
            })
            .collect()
    }

    /// The amounts as kube-scheduler accounts them: CPU rounded up to whole millicores
    /// (`MilliValue`), everything else up to whole units (`Value`). Summing rounded values per
    /// pod is what makes our totals match the scheduler's to the unit.
    pub fn scheduler_rounded(&self) -> Self {
        Self(
            self.0
                .iter()
                .map(|(name, nanos)| {
                    let rounded = if name == RESOURCE_CPU {
                        milli_value(*nanos).saturating_mul(NANOS_PER_MILLI)
                    } else {
                        value(*nanos).saturating_mul(NANOS_PER_UNIT)
                    };
                    (name.clone(), rounded)
                })
                .collect(),
        )
    }
}

impl FromIterator<(String, i128)> for ResourceVector {
    fn from_iter<I: IntoIterator<Item = (String, i128)>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl From<BTreeMap<String, i128>> for ResourceVector {
    fn from(map: BTreeMap<String, i128>) -> Self {
        Self(map)
    }
}

impl<'a> IntoIterator for &'a ResourceVector {
    type Item = (&'a String, &'a i128);
    type IntoIter = std::collections::btree_map::Iter<'a, String, i128>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// Parses one resource amount, bounded by [`MAX_RESOURCE_NANOS`].
pub fn parse_resource_quantity(quantity: &Quantity) -> Result<i128, QuantityError> {
    let parsed = from_quantity(quantity)?;
    if parsed.nanos.unsigned_abs() > MAX_RESOURCE_NANOS.unsigned_abs() {
        return Err(QuantityError::OutOfRange {
            input: quantity.0.clone(),
        });
    }
    Ok(parsed.nanos)
}

/// The format Kubernetes writes a resource in: bytes (memory, ephemeral storage, huge pages)
/// as BinarySI, everything else (cpu, pods, extended resources) as DecimalSI.
pub fn format_for_resource(name: &str) -> QuantityFormat {
    if name == RESOURCE_MEMORY
        || name == RESOURCE_EPHEMERAL_STORAGE
        || name.starts_with(HUGEPAGES_PREFIX)
    {
        QuantityFormat::BinarySI
    } else {
        QuantityFormat::DecimalSI
    }
}

/// A node status resource list: every resource of `vector`, plus the [`BASE_RESOURCES`] at
/// `"0"` when absent (the original always publishes those four).
pub fn node_status_quantities(vector: &ResourceVector) -> BTreeMap<String, Quantity> {
    let mut map = vector.to_quantities();
    for name in BASE_RESOURCES {
        map.entry(name.to_owned())
            .or_insert_with(|| Quantity("0".to_owned()));
    }
    map
}

/// Whether kube-scheduler's resource fit checks this resource beyond cpu, memory and
/// ephemeral-storage (`v1helper.IsScalarResourceName`): extended resources, huge pages,
/// `kubernetes.io/`-prefixed native resources and attachable volume limits.
pub fn is_scalar_resource_name(name: &str) -> bool {
    is_extended_resource_name(name)
        || name.starts_with(HUGEPAGES_PREFIX)
        || name.contains(NATIVE_RESOURCE_PREFIX)
        || name.starts_with(ATTACHABLE_VOLUMES_PREFIX)
}

/// Whether the name is an extended resource (`example.com/gpu`): not native (native names have
/// no `/` or contain `kubernetes.io/`), not a quota `requests.` name, and `requests.<name>` is a
/// qualified name.
pub fn is_extended_resource_name(name: &str) -> bool {
    let native = !name.contains('/') || name.contains(NATIVE_RESOURCE_PREFIX);
    !native
        && !name.starts_with(QUOTA_REQUESTS_PREFIX)
        && crate::names::is_qualified_name(&format!("{QUOTA_REQUESTS_PREFIX}{name}"))
}

/// `namespace/name` of a pod, for messages and as a map key.
pub fn pod_key(pod: &Pod) -> String {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    match pod.metadata.namespace.as_deref() {
        Some(namespace) if !namespace.is_empty() => format!("{namespace}/{name}"),
        _ => name.to_owned(),
    }
}

/// The effective resource requests of a pod, as the scheduler and kubelet admission see them
/// (`resourcehelper.PodRequests` with default options):
///
/// 1. the sum of the regular containers;
/// 2. restartable init containers (sidecars, `restartPolicy: Always`) add to that sum, and each
///    regular init container needs its own requests plus those of the sidecars started before
///    it; the result is the per-resource maximum of the sum and those init peaks;
/// 3. pod-level `spec.resources.requests` for cpu and memory replace the aggregate;
/// 4. `spec.overhead` is added.
///
/// A resource with a limit but no request counts its limit, as API defaulting would have made
/// it. The pod's own slot is not included: see [`pod_requests_with_pod`].
pub fn pod_requests(pod: &Pod) -> Result<ResourceVector, ResourceError> {
    let key = pod_key(pod);
    let spec = match pod.spec.as_ref() {
        Some(spec) if !spec.containers.is_empty() => spec,
        _ => return Err(ResourceError::NoContainers { pod: key }),
    };

    let mut total = ResourceVector::new();
    for container in &spec.containers {
        let requests = container_requests(&key, container, "container")?;
        total.try_add_assign(&requests)?;
    }

    let mut sidecars = ResourceVector::new();
    let mut init_peak = ResourceVector::new();
    for container in spec.init_containers.iter().flatten() {
        let requests = container_requests(&key, container, "init container")?;
        if container.restart_policy.as_deref() == Some("Always") {
            // A sidecar keeps running next to the app containers and every later init container.
            total.try_add_assign(&requests)?;
            sidecars.try_add_assign(&requests)?;
            init_peak.max_assign(&sidecars);
        } else {
            init_peak.max_assign(&requests.checked_add(&sidecars)?);
        }
    }
    total.max_assign(&init_peak);

    if let Some(resources) = spec.resources.as_ref() {
        let requests = resources.requests.as_ref();
        let limits = resources.limits.as_ref();
        for name in [RESOURCE_CPU, RESOURCE_MEMORY] {
            // Defaulting gives a pod-level request equal to the pod-level limit when no
            // container asks for the resource.
            let (quantity, field) = match (requests.and_then(|r| r.get(name)), limits) {
                (Some(quantity), _) => (quantity, "resources.requests"),
                (None, Some(limits)) if !total.contains(name) => match limits.get(name) {
                    Some(quantity) => (quantity, "resources.limits"),
                    None => continue,
                },
                _ => continue,
            };
            let nanos = pod_quantity(&key, None, field, name, quantity)?;
            total.set(name, nanos);
        }
    }

    if let Some(overhead) = spec.overhead.as_ref() {
        for (name, quantity) in overhead {
            let nanos = pod_quantity(&key, None, "overhead", name, quantity)?;
            let single: ResourceVector = [(name.clone(), nanos)].into_iter().collect();
            total.try_add_assign(&single)?;
        }
    }
    Ok(total)
}

/// [`pod_requests`] plus the pod's own slot: `pods` = 1. This is what a pod takes from a node.
pub fn pod_requests_with_pod(pod: &Pod) -> Result<ResourceVector, ResourceError> {
    let mut requests = pod_requests(pod)?;
    requests.set(RESOURCE_PODS, POD_SLOT);
    Ok(requests)
}

/// A container's requests, with limits standing in for missing requests.
fn container_requests(
    pod: &str,
    container: &Container,
    kind: &str,
) -> Result<ResourceVector, ResourceError> {
    let mut vector = ResourceVector::new();
    let Some(resources) = container.resources.as_ref() else {
        return Ok(vector);
    };
    let label = || format!("{kind} {:?}", container.name);
    // The extender's marker is not a node resource.
    let marker = |name: &String| name == crate::keys::RESOURCE_VIRTUAL_POD;
    for (name, quantity) in resources.requests.iter().flatten() {
        if marker(name) {
            continue;
        }
        let nanos = pod_quantity(pod, Some(label()), "resources.requests", name, quantity)?;
        vector.set(name.clone(), nanos);
    }
    for (name, quantity) in resources.limits.iter().flatten() {
        if !vector.contains(name) && !marker(name) {
            let nanos = pod_quantity(pod, Some(label()), "resources.limits", name, quantity)?;
            vector.set(name.clone(), nanos);
        }
    }
    Ok(vector)
}

fn pod_quantity(
    pod: &str,
    container: Option<String>,
    field: &'static str,
    resource: &str,
    quantity: &Quantity,
) -> Result<i128, ResourceError> {
    parse_resource_quantity(quantity).map_err(|reason| ResourceError::InvalidPodQuantity {
        pod: pod.to_owned(),
        container,
        field,
        resource: resource.to_owned(),
        reason: Box::new(reason),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use pretty_assertions::assert_eq;
    use proptest::prelude::*;

    const U: i128 = NANOS_PER_UNIT;
    const M: i128 = NANOS_PER_MILLI;
    const GI: i128 = 1 << 30;

    fn list(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
            .collect()
    }

    fn vector(pairs: &[(&str, i128)]) -> ResourceVector {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    }

    fn container(name: &str, requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
        Container {
            name: name.to_owned(),
            resources: Some(ResourceRequirements {
                requests: (!requests.is_empty()).then(|| list(requests)),
                limits: (!limits.is_empty()).then(|| list(limits)),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn sidecar(name: &str, requests: &[(&str, &str)]) -> Container {
        Container {
            restart_policy: Some("Always".to_owned()),
            ..container(name, requests, &[])
        }
    }

    fn pod(containers: Vec<Container>, init: Vec<Container>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".to_owned()),
                namespace: Some("default".to_owned()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers,
                init_containers: (!init.is_empty()).then_some(init),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn with_spec(mut p: Pod, f: impl FnOnce(&mut PodSpec)) -> Pod {
        if let Some(spec) = p.spec.as_mut() {
            f(spec);
        }
        p
    }

    #[test]
    fn checklist_10_pod_request_is_containers_sum_maxed_with_init_containers_plus_overhead() {
        let p = pod(
            vec![
                container("a", &[("cpu", "500m"), ("memory", "1Gi")], &[]),
                container("b", &[("cpu", "250m"), ("memory", "512Mi")], &[]),
            ],
            vec![
                container("init-cpu", &[("cpu", "2")], &[]),
                container("init-mem", &[("memory", "1Gi")], &[]),
            ],
        );
        let p = with_spec(p, |s| {
            s.overhead = Some(list(&[("cpu", "100m"), ("memory", "64Mi")]))
        });
        let requests = pod_requests(&p).unwrap();
        // cpu: max(750m, 2) + 100m; memory: max(1.5Gi, 1Gi) + 64Mi.
        assert_eq!(
            requests,
            vector(&[("cpu", 2_100 * M), ("memory", (1536 + 64) * (1 << 20) * U)])
        );
        assert_eq!(
            requests.get(RESOURCE_PODS),
            0,
            "the pod slot is not part of the requests"
        );
        let with_pod = pod_requests_with_pod(&p).unwrap();
        assert_eq!(with_pod.get(RESOURCE_PODS), U);
        assert_eq!(with_pod.get(RESOURCE_CPU), 2_100 * M);
    }

    #[test]
    fn checklist_11_custom_resources_are_summed_and_exposed() {
        let p = pod(
            vec![
                container("a", &[("nvidia.com/gpu", "1"), ("cpu", "1")], &[]),
                container("b", &[], &[("nvidia.com/gpu", "2")]),
            ],
            vec![container("init", &[("nvidia.com/gpu", "2")], &[])],
        );
        let requests = pod_requests_with_pod(&p).unwrap();
        assert_eq!(
            requests,
            vector(&[("cpu", U), ("nvidia.com/gpu", 3 * U), ("pods", U)])
        );
        assert_eq!(
            requests.to_quantities(),
            list(&[("cpu", "1"), ("nvidia.com/gpu", "3"), ("pods", "1")])
        );
    }

    #[test]
    fn sidecars_accumulate_and_raise_later_init_containers() {
        // The KEP-753 example: init1 (1 cpu), sidecar (2), init2 (5); app 3.
        let p = pod(
            vec![container("app", &[("cpu", "3")], &[])],
            vec![
                container("init1", &[("cpu", "1")], &[]),
                sidecar("sidecar", &[("cpu", "2")]),
                container("init2", &[("cpu", "5")], &[]),
            ],
        );
        // Running: app 3 + sidecar 2 = 5; init2 runs next to the sidecar: 5 + 2 = 7.
        assert_eq!(pod_requests(&p).unwrap(), vector(&[("cpu", 7 * U)]));

        // A sidecar started after every init container only adds to the running sum.
        let p = pod(
            vec![container("app", &[("cpu", "3"), ("memory", "1Gi")], &[])],
            vec![
                container("init", &[("cpu", "4")], &[]),
                sidecar("proxy", &[("cpu", "1"), ("memory", "1Gi")]),
                sidecar("logs", &[("memory", "512Mi")]),
            ],
        );
        assert_eq!(
            pod_requests(&p).unwrap(),
            vector(&[("cpu", 4 * U), ("memory", 2560 * (1 << 20) * U)])
        );
        assert_eq!(
            pod_requests(&p).unwrap().get("memory"),
            (2 * GI + GI / 2) * U
        );
    }

    #[test]
    fn limit_without_request_counts_as_the_request() {
        let p = pod(
            vec![container(
                "a",
                &[("cpu", "100m")],
                &[("cpu", "1"), ("memory", "2Gi")],
            )],
            vec![],
        );
        assert_eq!(
            pod_requests(&p).unwrap(),
            vector(&[("cpu", 100 * M), ("memory", 2 * GI * U)])
        );
    }

    #[test]
    fn pod_level_requests_override_cpu_and_memory_only() {
        let p = pod(
            vec![container(
                "a",
                &[
                    ("cpu", "1"),
                    ("memory", "1Gi"),
                    ("ephemeral-storage", "1Gi"),
                ],
                &[],
            )],
            vec![],
        );
        let p = with_spec(p, |s| {
            s.resources = Some(ResourceRequirements {
                requests: Some(list(&[("cpu", "3"), ("ephemeral-storage", "5Gi")])),
                ..Default::default()
            });
            s.overhead = Some(list(&[("cpu", "250m")]));
        });
        assert_eq!(
            pod_requests(&p).unwrap(),
            vector(&[
                ("cpu", 3_250 * M),
                ("memory", GI * U),
                ("ephemeral-storage", GI * U)
            ])
        );
    }

    #[test]
    fn pod_level_limit_stands_in_when_no_container_asks() {
        let p = pod(vec![container("a", &[("cpu", "1")], &[])], vec![]);
        let p = with_spec(p, |s| {
            s.resources = Some(ResourceRequirements {
                limits: Some(list(&[("cpu", "4"), ("memory", "4Gi")])),
                ..Default::default()
            });
        });
        // cpu was asked by a container, so its aggregate stays; memory takes the pod limit.
        assert_eq!(
            pod_requests(&p).unwrap(),
            vector(&[("cpu", U), ("memory", 4 * GI * U)])
        );
    }

    #[test]
    fn zero_requests_are_kept_as_specified() {
        let p = pod(vec![container("a", &[("cpu", "0")], &[])], vec![]);
        let requests = pod_requests(&p).unwrap();
        assert!(requests.contains("cpu"));
        assert!(requests.is_zero());
        assert_eq!(requests, ResourceVector::new());
    }

    #[test]
    fn pod_without_containers_is_an_error() {
        let empty = pod(vec![], vec![container("init", &[("cpu", "1")], &[])]);
        assert_eq!(
            pod_requests(&empty),
            Err(ResourceError::NoContainers {
                pod: "default/web".to_owned()
            })
        );
        let no_spec = Pod {
            spec: None,
            ..empty
        };
        assert_eq!(
            pod_requests(&no_spec).unwrap_err().to_string(),
            "pod default/web has no containers"
        );
    }

    #[test]
    fn unparsable_container_quantity_names_pod_container_resource_and_text() {
        let p = pod(vec![], vec![container("setup", &[], &[("memory", "1GB")])]);
        let p = with_spec(p, |s| {
            s.containers = vec![container("app", &[("cpu", "1")], &[])]
        });
        let err = pod_requests(&p).unwrap_err();
        assert_eq!(
            err,
            ResourceError::InvalidPodQuantity {
                pod: "default/web".to_owned(),
                container: Some("init container \"setup\"".to_owned()),
                field: "resources.limits",
                resource: "memory".to_owned(),
                reason: Box::new(QuantityError::InvalidSuffix {
                    input: "1GB".to_owned(),
                    suffix: "GB".to_owned()
                }),
            }
        );
        assert_eq!(
            err.to_string(),
            "pod default/web: init container \"setup\" resources.limits[\"memory\"]: quantity \
             \"1GB\" has an invalid suffix \"GB\""
        );
    }

    #[test]
    fn unparsable_overhead_names_the_field() {
        let p = pod(vec![container("a", &[], &[])], vec![]);
        let p = with_spec(p, |s| s.overhead = Some(list(&[("cpu", "lots")])));
        assert_eq!(
            pod_requests(&p).unwrap_err().to_string(),
            "pod default/web: spec.overhead[\"cpu\"]: quantity \"lots\" is malformed: no digits"
        );
    }

    #[test]
    fn amounts_beyond_int64_units_are_rejected() {
        assert_eq!(
            parse_resource_quantity(&Quantity("10E".to_owned())),
            Err(QuantityError::OutOfRange {
                input: "10E".to_owned()
            })
        );
        assert_eq!(
            parse_resource_quantity(&Quantity("9Ei".to_owned())),
            Ok(MAX_RESOURCE_NANOS)
        );
    }

    #[test]
    fn resource_lists_parse_and_format_with_kubernetes_formats() {
        let map = list(&[
            ("cpu", "1.5"),
            ("memory", "1073741824"),
            ("ephemeral-storage", "100Gi"),
            ("hugepages-2Mi", "2097152"),
            ("pods", "110"),
            ("nvidia.com/gpu", "8"),
        ]);
        let parsed = ResourceVector::from_quantities(&map).unwrap();
        assert_eq!(parsed.get("cpu"), 1_500 * M);
        assert_eq!(
            parsed.to_quantities(),
            list(&[
                ("cpu", "1500m"),
                ("memory", "1Gi"),
                ("ephemeral-storage", "100Gi"),
                ("hugepages-2Mi", "2Mi"),
                ("pods", "110"),
                ("nvidia.com/gpu", "8"),
            ])
        );
        assert_eq!(
            node_status_quantities(&vector(&[("nvidia.com/gpu", 2 * U)])),
            list(&[
                ("cpu", "0"),
                ("memory", "0"),
                ("pods", "0"),
                ("ephemeral-storage", "0"),
                ("nvidia.com/gpu", "2"),
            ])
        );
    }

    #[test]
    fn bad_resource_list_entry_names_resource_and_text() {
        let map = list(&[("cpu", "1"), ("memory", "12 Gi")]);
        let err = ResourceVector::from_quantities(&map).unwrap_err();
        assert_eq!(
            err.to_string(),
            "resource \"memory\": quantity \"12 Gi\" has an invalid suffix \" Gi\""
        );
        let (parsed, errors) = ResourceVector::from_quantities_lenient(&map);
        assert_eq!(parsed, vector(&[("cpu", U)]));
        assert_eq!(errors, vec![err]);
    }

    #[test]
    fn arithmetic_is_checked_or_saturating_never_panicking() {
        let a = vector(&[("cpu", 2 * U), ("memory", 5)]);
        let b = vector(&[("cpu", U), ("pods", U)]);
        assert_eq!(
            a.checked_add(&b).unwrap(),
            vector(&[("cpu", 3 * U), ("memory", 5), ("pods", U)])
        );
        assert_eq!(
            a.checked_sub(&b).unwrap(),
            vector(&[("cpu", U), ("memory", 5), ("pods", -U)])
        );
        let huge = vector(&[("cpu", i128::MAX)]);
        let mut c = huge.clone();
        assert_eq!(
            c.try_add_assign(&a),
            Err(ResourceError::Overflow {
                resource: "cpu".to_owned()
            })
        );
        assert_eq!(c, huge, "unchanged on error");
        c.saturating_add_assign(&a);
        assert_eq!(c.get("cpu"), i128::MAX);
        let mut m = a.clone();
        m.max_assign(&vector(&[("cpu", U), ("memory", 9), ("gpu", 0)]));
        assert_eq!(m, vector(&[("cpu", 2 * U), ("memory", 9)]));
        assert!(m.contains("gpu"));
    }

    #[test]
    fn scheduler_rounding_is_milli_for_cpu_and_units_elsewhere() {
        let v = vector(&[
            ("cpu", 1_500_001),
            ("memory", U / 2),
            ("pods", U),
            ("x/y", -1),
        ]);
        assert_eq!(
            v.scheduler_rounded(),
            vector(&[("cpu", 2 * M), ("memory", U), ("pods", U), ("x/y", -U)])
        );
    }

    #[test]
    fn scalar_resource_names_match_kube_scheduler() {
        for name in [
            "nvidia.com/gpu",
            "hugepages-2Mi",
            "kubernetes.io/batch",
            "attachable-volumes-aws-ebs",
            "example.com/foo",
        ] {
            assert!(is_scalar_resource_name(name), "{name}");
        }
        for name in [
            "cpu",
            "memory",
            "pods",
            "storage",
            "requests.example.com/foo",
            "example.com/-bad",
            "a/b/c",
        ] {
            assert!(!is_scalar_resource_name(name), "{name}");
        }
        assert!(is_extended_resource_name("nvidia.com/gpu"));
        assert!(!is_extended_resource_name("kubernetes.io/batch"));
    }

    #[test]
    fn equality_ignores_zero_entries() {
        assert_eq!(vector(&[("cpu", 0)]), ResourceVector::new());
        assert_ne!(vector(&[("cpu", 1)]), ResourceVector::new());
        assert_eq!(
            vector(&[("cpu", 0), ("memory", 3)]).without_zeros().len(),
            1
        );
    }

    fn small_vector() -> impl Strategy<Value = ResourceVector> {
        prop::collection::btree_map(
            prop::sample::select(vec![
                "cpu",
                "memory",
                "pods",
                "nvidia.com/gpu",
                "hugepages-1Gi",
            ]),
            -MAX_RESOURCE_NANOS..=MAX_RESOURCE_NANOS,
            0..5,
        )
        .prop_map(|m| m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
    }

    proptest! {
        #[test]
        fn add_then_sub_is_identity(a in small_vector(), b in small_vector()) {
            let sum = a.checked_add(&b).unwrap();
            prop_assert_eq!(sum.checked_sub(&b).unwrap(), a.clone());
            let mut s = a.clone();
            s.saturating_add_assign(&b);
            s.saturating_sub_assign(&b);
            prop_assert_eq!(s, a);
        }

        #[test]
        fn max_is_commutative_for_requests(a in small_vector(), b in small_vector()) {
            // Requests are never negative.
            let a: ResourceVector = a.iter().map(|(k, v)| (k.to_owned(), v.abs())).collect();
            let b: ResourceVector = b.iter().map(|(k, v)| (k.to_owned(), v.abs())).collect();
            let mut ab = a.clone();
            ab.max_assign(&b);
            let mut ba = b.clone();
            ba.max_assign(&a);
            prop_assert_eq!(ab, ba);
        }

        #[test]
        fn quantities_round_trip(a in small_vector()) {
            let back = ResourceVector::from_quantities(&a.to_quantities()).unwrap();
            prop_assert_eq!(back, a);
        }
    }
}
