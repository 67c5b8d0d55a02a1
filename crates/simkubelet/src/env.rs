//! A simulated container's environment, built as the kubelet builds it
//! (`kubelet_pods.go`, `makeEnvironmentVariables`): the service links, then `envFrom`, then
//! `env` with `$(VAR)` expansion and `valueFrom` (ConfigMap and Secret keys, the downward API,
//! resource fields). A missing non-optional source is the kubelet's
//! `CreateContainerConfigError` message.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret, Service};
use kube::api::{Api, ListParams};
use tensile_core::quantity::parse_quantity;

/// The API objects a container's environment reads, from the pod's namespace (services also
/// `default/kubernetes`).
#[derive(Debug, Default)]
pub(super) struct EnvObjects {
    pub(super) config_maps: BTreeMap<String, ConfigMap>,
    pub(super) secrets: BTreeMap<String, Secret>,
    pub(super) services: Vec<Service>,
}

/// The names of the ConfigMaps and Secrets `container`'s environment reads.
pub(super) fn referenced(container: &Container) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut maps, mut secrets) = (BTreeSet::new(), BTreeSet::new());
    for from in container.env_from.iter().flatten() {
        if let Some(r) = &from.config_map_ref {
            maps.insert(r.name.clone());
        }
        if let Some(r) = &from.secret_ref {
            secrets.insert(r.name.clone());
        }
    }
    for var in container.env.iter().flatten() {
        let Some(from) = &var.value_from else {
            continue;
        };
        if let Some(r) = &from.config_map_key_ref {
            maps.insert(r.name.clone());
        }
        if let Some(r) = &from.secret_key_ref {
            secrets.insert(r.name.clone());
        }
    }
    (maps, secrets)
}

/// Reads what `container`'s environment needs from the API: its ConfigMaps and Secrets (one
/// that cannot be read counts as missing), and with `services` the service links' Services.
pub(super) async fn objects(
    client: &kube::Client,
    pod: &Pod,
    container: &Container,
    services: bool,
) -> EnvObjects {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let (maps, secrets) = referenced(container);
    let mut objects = EnvObjects::default();
    let map_api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    for name in maps {
        if let Ok(Some(cm)) = map_api.get_opt(&name).await {
            objects.config_maps.insert(name, cm);
        }
    }
    let secret_api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    for name in secrets {
        if let Ok(Some(secret)) = secret_api.get_opt(&name).await {
            objects.secrets.insert(name, secret);
        }
    }
    if services {
        let api: Api<Service> = Api::namespaced(client.clone(), "default");
        if let Ok(Some(kubernetes)) = api.get_opt("kubernetes").await {
            objects.services.push(kubernetes);
        }
        // The pod's namespace's, for the links (`default/kubernetes` again in `default`
        // gives the same variables).
        let links = pod.spec.as_ref().and_then(|s| s.enable_service_links) != Some(false);
        if links {
            let api: Api<Service> = Api::namespaced(client.clone(), namespace);
            if let Ok(list) = api.list(&ListParams::default()).await {
                objects.services.extend(list.items);
            }
        }
    }
    objects
}

/// `container`'s environment (without what the image adds), or why the container cannot start.
pub(super) fn resolve(
    pod: &Pod,
    container: &Container,
    objects: &EnvObjects,
    allocatable: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, String> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let links = pod
        .spec
        .as_ref()
        .and_then(|s| s.enable_service_links)
        .unwrap_or(true);
    let service_env = service_env(&objects.services, namespace, links);
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or_default();
        if let Some(r) = &from.config_map_ref {
            match objects.config_maps.get(&r.name) {
                Some(cm) => {
                    for (k, v) in cm.data.iter().flatten() {
                        // Every key of a ConfigMap or Secret (`[-._a-zA-Z0-9]+`) is a valid name
                        // under Kubernetes' relaxed variable names (on by default since 1.32).
                        env.insert(format!("{prefix}{k}"), v.clone());
                    }
                }
                None if r.optional == Some(true) => {}
                None => return Err(format!("configmap \"{}\" not found", r.name)),
            }
        }
        if let Some(r) = &from.secret_ref {
            match objects.secrets.get(&r.name) {
                Some(secret) => {
                    for (k, v) in secret.data.iter().flatten() {
                        let text = String::from_utf8_lossy(&v.0).into_owned();
                        env.insert(format!("{prefix}{k}"), text);
                    }
                }
                None if r.optional == Some(true) => {}
                None => return Err(format!("secret \"{}\" not found", r.name)),
            }
        }
    }
    for var in container.env.iter().flatten() {
        let value = match &var.value_from {
            None => {
                let raw = var.value.clone().unwrap_or_default();
                expand(&raw, |name| {
                    env.get(name).or_else(|| service_env.get(name)).cloned()
                })
            }
            Some(from) => {
                let key_ref = if let Some(r) = &from.config_map_key_ref {
                    let data = objects
                        .config_maps
                        .get(&r.name)
                        .map(|cm| cm.data.as_ref().and_then(|d| d.get(&r.key)).cloned());
                    Some(("configmap", "ConfigMap", &r.name, &r.key, r.optional, data))
                } else if let Some(r) = &from.secret_key_ref {
                    let data = objects.secrets.get(&r.name).map(|secret| {
                        let value = secret.data.as_ref().and_then(|d| d.get(&r.key));
                        value.map(|v| String::from_utf8_lossy(&v.0).into_owned())
                    });
                    Some(("secret", "Secret", &r.name, &r.key, r.optional, data))
                } else {
                    None
                };
                if let Some((resource, kind, name, key, optional, data)) = key_ref {
                    // data: None when the object is missing, Some(None) when the key is.
                    match data {
                        Some(Some(v)) => v,
                        _ if optional == Some(true) => continue,
                        None => return Err(format!("{resource} \"{name}\" not found")),
                        Some(None) => {
                            return Err(format!(
                                "couldn't find key {key} in {kind} {namespace}/{name}"
                            ));
                        }
                    }
                } else if let Some(r) = &from.field_ref {
                    field_value(pod, &r.field_path)?
                } else if let Some(r) = &from.resource_field_ref {
                    let target = match r.container_name.as_deref().filter(|n| !n.is_empty()) {
                        Some(name) => pod
                            .spec
                            .iter()
                            .flat_map(|s| {
                                s.containers
                                    .iter()
                                    .chain(s.init_containers.iter().flatten())
                            })
                            .find(|c| c.name == name)
                            .ok_or_else(|| format!("container {name} not found in the pod"))?,
                        None => container,
                    };
                    let divisor = r.divisor.as_ref().map(|d| d.0.as_str());
                    resource_value(target, &r.resource, divisor, allocatable)?
                } else {
                    String::new()
                }
            }
        };
        env.insert(var.name.clone(), value);
    }
    let mut all = service_env;
    all.extend(env);
    Ok(all)
}

/// `$(NAME)` replaced by NAME's value where it has one, `$$` by `$`; anything else as written
/// (Kubernetes' `third_party/forked/golang/expansion`).
fn expand(input: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
        {
            let name = &inner[..end];
            match lookup(name) {
                Some(v) => out.push_str(&v),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// A downward API field of the pod, as the kubelet resolves it for the environment.
pub(super) fn field_value(pod: &Pod, path: &str) -> Result<String, String> {
    let meta = &pod.metadata;
    let status = pod.status.as_ref();
    let spec = pod.spec.as_ref();
    let subscript = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|r| r.strip_prefix("['"))
            .and_then(|r| r.strip_suffix("']"))
            .map(str::to_owned)
    };
    if let Some(key) = subscript("metadata.labels") {
        return Ok(meta
            .labels
            .as_ref()
            .and_then(|l| l.get(&key))
            .cloned()
            .unwrap_or_default());
    }
    if let Some(key) = subscript("metadata.annotations") {
        return Ok(meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(&key))
            .cloned()
            .unwrap_or_default());
    }
    let ips = |list: Option<Vec<String>>| list.unwrap_or_default().join(",");
    Ok(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.hostIP" => status.and_then(|s| s.host_ip.clone()).unwrap_or_default(),
        "status.podIP" => status.and_then(|s| s.pod_ip.clone()).unwrap_or_default(),
        "status.hostIPs" => ips(status
            .and_then(|s| s.host_ips.as_ref())
            .map(|l| l.iter().map(|i| i.ip.clone()).collect())),
        "status.podIPs" => ips(status
            .and_then(|s| s.pod_ips.as_ref())
            .map(|l| l.iter().map(|i| i.ip.clone()).collect())),
        other => return Err(format!("unsupported fieldPath: {other}")),
    })
}

/// A resource field of `container` divided by `divisor` and rounded up, as the kubelet's
/// `ExtractContainerResourceValue`; a limit that is not set is the node's allocatable.
fn resource_value(
    container: &Container,
    resource: &str,
    divisor: Option<&str>,
    allocatable: &BTreeMap<String, String>,
) -> Result<String, String> {
    let resources = container.resources.as_ref();
    let get = |which: Option<
        &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >,
               name: &str| which.and_then(|m| m.get(name)).map(|q| q.0.clone());
    let limits = resources.and_then(|r| r.limits.as_ref());
    let requests = resources.and_then(|r| r.requests.as_ref());
    let (kind, name) = resource
        .split_once('.')
        .ok_or_else(|| format!("unsupported container resource: {resource}"))?;
    let quantity = match kind {
        "limits" => get(limits, name).or_else(|| allocatable.get(name).cloned()),
        "requests" => get(requests, name).or_else(|| get(limits, name)),
        _ => None,
    }
    .unwrap_or_else(|| "0".to_owned());
    let nanos = |q: &str| {
        parse_quantity(q)
            .map(|p| p.nanos)
            .map_err(|e| format!("{resource}: {e}"))
    };
    let value = nanos(&quantity)?;
    let divisor = nanos(divisor.filter(|d| !d.is_empty()).unwrap_or("1"))?;
    if divisor <= 0 {
        return Err(format!("{resource}: the divisor must be positive"));
    }
    // Rounded up, as `math.Ceil(value / divisor)`.
    Ok(((value + divisor - 1) / divisor).to_string())
}

/// The service links: `<NAME>_SERVICE_HOST`, `<NAME>_PORT_<port>_<PROTO>` and the rest, for
/// the services of the pod's namespace (when `enableServiceLinks`) and always for
/// `default/kubernetes`.
fn service_env(services: &[Service], namespace: &str, links: bool) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for service in services {
        let Some(name) = service.metadata.name.as_deref() else {
            continue;
        };
        let ns = service.metadata.namespace.as_deref().unwrap_or_default();
        let master = ns == "default" && name == "kubernetes";
        if !(master || (links && ns == namespace)) {
            continue;
        }
        let Some(spec) = &service.spec else { continue };
        let Some(ip) = spec
            .cluster_ip
            .as_deref()
            .filter(|ip| !ip.is_empty() && *ip != "None")
        else {
            continue;
        };
        let prefix = name.to_uppercase().replace('-', "_");
        let ports = spec.ports.iter().flatten();
        for (i, port) in ports.enumerate() {
            let proto = port.protocol.clone().unwrap_or_else(|| "TCP".to_owned());
            let number = port.port;
            if i == 0 {
                env.insert(format!("{prefix}_SERVICE_HOST"), ip.to_owned());
                env.insert(format!("{prefix}_SERVICE_PORT"), number.to_string());
                env.insert(
                    format!("{prefix}_PORT"),
                    format!("{}://{ip}:{number}", proto.to_lowercase()),
                );
            }
            if let Some(port_name) = port.name.as_deref().filter(|n| !n.is_empty()) {
                env.insert(
                    format!(
                        "{prefix}_SERVICE_PORT_{}",
                        port_name.to_uppercase().replace('-', "_")
                    ),
                    number.to_string(),
                );
            }
            let base = format!("{prefix}_PORT_{number}_{}", proto.to_uppercase());
            env.insert(
                base.clone(),
                format!("{}://{ip}:{number}", proto.to_lowercase()),
            );
            env.insert(format!("{base}_PROTO"), proto.to_lowercase());
            env.insert(format!("{base}_PORT"), number.to_string());
            env.insert(format!("{base}_ADDR"), ip.to_owned());
        }
    }
    env
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code
    use super::*;
    use serde_json::json;

    fn pod(container: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web-1", "namespace": "shop", "uid": "u-1",
                "labels": {"app": "web"}, "annotations": {"team": "blue"}},
            "spec": {"nodeName": "vk-lower-1", "serviceAccountName": "builder", "containers": [container]},
            "status": {"podIP": "10.244.0.7", "hostIP": "198.18.0.1", "podIPs": [{"ip": "10.244.0.7"}]},
        }))
        .unwrap()
    }

    fn objects() -> EnvObjects {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "settings", "namespace": "shop"},
            "data": {"MODE": "fast", "LEVEL": "3"},
        }))
        .unwrap();
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "creds", "namespace": "shop"},
            "data": {"password": "czNjcjN0"},
        }))
        .unwrap();
        let kubernetes: Service = serde_json::from_value(json!({
            "metadata": {"name": "kubernetes", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.1", "ports": [{"name": "https", "port": 443, "protocol": "TCP"}]},
        }))
        .unwrap();
        let other_ns: Service = serde_json::from_value(json!({
            "metadata": {"name": "db", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.9", "ports": [{"port": 5432}]},
        }))
        .unwrap();
        let web: Service = serde_json::from_value(json!({
            "metadata": {"name": "my-web", "namespace": "shop"},
            "spec": {"clusterIP": "10.96.3.3", "ports": [{"name": "http", "port": 80}]},
        }))
        .unwrap();
        let headless: Service = serde_json::from_value(json!({
            "metadata": {"name": "peers", "namespace": "shop"},
            "spec": {"clusterIP": "None", "ports": [{"port": 80}]},
        }))
        .unwrap();
        EnvObjects {
            config_maps: [("settings".to_owned(), cm)].into(),
            secrets: [("creds".to_owned(), secret)].into(),
            services: vec![kubernetes, other_ns, web, headless],
        }
    }

    fn alloc() -> BTreeMap<String, String> {
        [
            ("cpu".to_owned(), "8".to_owned()),
            ("memory".to_owned(), "32Gi".to_owned()),
        ]
        .into()
    }

    fn resolved(container: serde_json::Value) -> Result<BTreeMap<String, String>, String> {
        let p = pod(container);
        let c = p.spec.as_ref().unwrap().containers[0].clone();
        resolve(&p, &c, &objects(), &alloc())
    }

    #[test]
    fn values_from_configmaps_secrets_and_the_downward_api_as_the_kubelet_gives_them() {
        let env = resolved(json!({
            "name": "app", "image": "x",
            "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}},
            "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
            "env": [
                {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
                {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "MODE"}}},
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                {"name": "TEAM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['team']"}}},
                {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
                {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "CPU_M", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}}},
                {"name": "CPU_LIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {"resource": "requests.memory", "divisor": "1Mi"}}},
                {"name": "URL", "value": "http://$(POD):$(KUBERNETES_SERVICE_PORT)/$(NOPE)/$$(POD)"},
            ],
        }))
        .unwrap();
        let get = |k: &str| env.get(k).map(String::as_str);
        assert_eq!(get("PASSWORD"), Some("s3cr3t"));
        assert_eq!(get("MODE"), Some("fast"));
        assert_eq!(get("CFG_MODE"), Some("fast"));
        assert_eq!(get("CFG_LEVEL"), Some("3"));
        assert_eq!(get("POD"), Some("web-1"));
        assert_eq!(get("NODE"), Some("vk-lower-1"));
        assert_eq!(get("UID"), Some("u-1"));
        assert_eq!(get("APP"), Some("web"));
        assert_eq!(get("TEAM"), Some("blue"));
        assert_eq!(get("SA"), Some("builder"));
        assert_eq!(get("IP"), Some("10.244.0.7"));
        assert_eq!(get("CPU_M"), Some("250"));
        assert_eq!(
            get("CPU_LIMIT"),
            Some("8"),
            "no limit: the node's allocatable"
        );
        assert_eq!(get("MEM_MI"), Some("64"));
        assert_eq!(get("URL"), Some("http://web-1:443/$(NOPE)/$(POD)"));
    }

    #[test]
    fn service_links_of_the_namespace_and_always_the_api_server() {
        let env = resolved(json!({"name": "app", "image": "x"})).unwrap();
        let get = |k: &str| env.get(k).map(String::as_str);
        assert_eq!(get("KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
        assert_eq!(get("KUBERNETES_SERVICE_PORT"), Some("443"));
        assert_eq!(get("KUBERNETES_SERVICE_PORT_HTTPS"), Some("443"));
        assert_eq!(get("KUBERNETES_PORT"), Some("tcp://10.96.0.1:443"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP_ADDR"), Some("10.96.0.1"));
        assert_eq!(get("MY_WEB_SERVICE_HOST"), Some("10.96.3.3"));
        assert_eq!(get("MY_WEB_PORT_80_TCP_PROTO"), Some("tcp"));
        assert_eq!(get("DB_SERVICE_HOST"), None, "another namespace");
        assert!(!env.keys().any(|k| k.starts_with("PEERS_")), "headless");

        let mut p = pod(json!({"name": "app", "image": "x"}));
        p.spec.as_mut().unwrap().enable_service_links = Some(false);
        let c = p.spec.as_ref().unwrap().containers[0].clone();
        let env = resolve(&p, &c, &objects(), &alloc()).unwrap();
        assert!(env.contains_key("KUBERNETES_SERVICE_HOST"));
        assert!(!env.contains_key("MY_WEB_SERVICE_HOST"));
    }

    #[test]
    fn a_missing_source_is_the_kubelets_create_container_config_error_unless_optional() {
        let missing =
            |v: serde_json::Value| resolved(json!({"name": "app", "image": "x", "env": [v]}));
        assert_eq!(
            missing(
                json!({"name": "A", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "k"}}})
            ),
            Err("configmap \"nope\" not found".to_owned())
        );
        assert_eq!(
            missing(
                json!({"name": "A", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "user"}}})
            ),
            Err("couldn't find key user in Secret shop/creds".to_owned())
        );
        let env = missing(json!({"name": "A", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k", "optional": true}}}))
            .unwrap();
        assert!(!env.contains_key("A"));
        assert_eq!(
            resolved(
                json!({"name": "app", "image": "x", "envFrom": [{"secretRef": {"name": "nope"}}]})
            ),
            Err("secret \"nope\" not found".to_owned())
        );
    }

    #[test]
    fn referenced_names_every_configmap_and_secret() {
        let p = pod(json!({"name": "app", "image": "x",
            "envFrom": [{"configMapRef": {"name": "a"}}, {"secretRef": {"name": "b"}}],
            "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
                    {"name": "Y", "valueFrom": {"secretKeyRef": {"name": "d", "key": "k"}}}]}));
        let (maps, secrets) = referenced(&p.spec.unwrap().containers[0]);
        assert_eq!(maps, ["a", "c"].map(str::to_owned).into());
        assert_eq!(secrets, ["b", "d"].map(str::to_owned).into());
    }
}
