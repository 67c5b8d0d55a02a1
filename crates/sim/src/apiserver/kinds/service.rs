//! Services: the defaults of `SetDefaults_Service`, cluster IPs from the service CIDR and node
//! ports from 30000-32767, and what `ValidateService` checks of ports and cluster IPs.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use serde_json::{Value, json};

use super::set_default;
use crate::apiserver::State;
use crate::apiserver::errors::ApiError;
use crate::apiserver::meta;
use crate::apiserver::resources::ids;
use crate::apiserver::strategy::{Causes, NameRule, Strategy};

/// The strategy of services.
#[derive(Debug)]
pub(crate) struct Services;

impl Strategy for Services {
    fn name_rule(&self) -> NameRule {
        NameRule::Label
    }

    fn prepare_create(&self, state: &State, obj: &mut Value) -> Result<(), ApiError> {
        prepare_service(state, obj)
    }

    fn validate(&self, obj: &Value, old: Option<&Value>) -> Causes {
        service_causes(obj, old)
    }
}

fn prepare_service(state: &State, obj: &mut Value) -> Result<(), ApiError> {
    if !obj.get("spec").is_some_and(Value::is_object) {
        obj["spec"] = json!({});
    }
    let spec = &mut obj["spec"];
    set_default(spec, "type", json!("ClusterIP"));
    set_default(spec, "sessionAffinity", json!("None"));
    set_default(spec, "internalTrafficPolicy", json!("Cluster"));
    if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports {
            set_default(p, "protocol", json!("TCP"));
            if let Some(port) = p.get("port").cloned() {
                set_default(p, "targetPort", port);
            }
        }
    }
    let svc_type = spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP")
        .to_owned();
    if svc_type != "ExternalName" {
        let requested = spec
            .get("clusterIP")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let ip = if requested == "None" {
            "None".to_owned()
        } else {
            allocate_cluster_ip(state, &requested).map_err(|m| {
                ApiError::invalid(
                    "",
                    "Service",
                    meta::name(obj).unwrap_or_default(),
                    &[("spec.clusterIPs".into(), m)],
                )
            })?
        };
        let spec = &mut obj["spec"];
        spec["clusterIP"] = json!(ip);
        spec["clusterIPs"] = json!([ip]);
        set_default(spec, "ipFamilies", json!(["IPv4"]));
        set_default(spec, "ipFamilyPolicy", json!("SingleStack"));
    }
    if matches!(svc_type.as_str(), "NodePort" | "LoadBalancer") {
        set_default(&mut obj["spec"], "externalTrafficPolicy", json!("Cluster"));
        let mut used = used_node_ports(state);
        if let Some(ports) = obj["spec"].get_mut("ports").and_then(Value::as_array_mut) {
            for p in ports {
                if p.get("nodePort").and_then(Value::as_u64).is_none()
                    && let Some(port) = (30000..=32767u64).find(|n| !used.contains(n))
                {
                    used.insert(port);
                    p["nodePort"] = json!(port);
                }
            }
        }
    }
    obj["status"] = json!({"loadBalancer": {}});
    Ok(())
}

fn used_node_ports(state: &State) -> BTreeSet<u64> {
    let (services, _, _) = state.store.list(*ids::SERVICES, None, None, None, |_| true);
    services
        .iter()
        .flat_map(|s| {
            s.object
                .pointer("/spec/ports")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|p| p.get("nodePort").and_then(Value::as_u64))
        .collect()
}

fn allocate_cluster_ip(state: &State, requested: &str) -> Result<String, String> {
    let (base, prefix) = state.config.service_cidr;
    let size = 1u32 << (32 - u32::from(prefix.min(30)));
    let base = u32::from(base);
    let (services, _, _) = state.store.list(*ids::SERVICES, None, None, None, |_| true);
    let used: BTreeSet<String> = services
        .iter()
        .filter_map(|s| {
            s.object
                .pointer("/spec/clusterIP")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .collect();
    if !requested.is_empty() {
        let ip: Ipv4Addr = requested
            .parse()
            .map_err(|_| format!("Invalid value: {requested:?}: must be a valid IP address"))?;
        let n = u32::from(ip);
        if n <= base || n >= base + size - 1 {
            return Err(format!(
                "Invalid value: {requested:?}: provided IP is not in the valid range"
            ));
        }
        if used.contains(requested) {
            return Err(format!(
                "Invalid value: {requested:?}: provided IP is already allocated"
            ));
        }
        return Ok(requested.to_owned());
    }
    (2..size - 1)
        .map(|i| Ipv4Addr::from(base + i).to_string())
        .find(|ip| !used.contains(ip))
        .ok_or_else(|| "Internal error: range is full".to_owned())
}

/// What `ValidateService` (and its update rule) says of the fields the simulator keeps: port
/// numbers in range, and cluster IPs that never change once set.
fn service_causes(obj: &Value, old: Option<&Value>) -> Vec<(String, String)> {
    let mut causes = Vec::new();
    let in_range = |n: i64| (1..=65535).contains(&n);
    for (i, p) in obj
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        for field in ["port", "targetPort", "nodePort"] {
            // A named targetPort is a string; nodePort 0 means "allocate one".
            let Some(n) = p.get(field).and_then(Value::as_i64) else {
                continue;
            };
            if !(in_range(n) || (field == "nodePort" && n == 0)) {
                causes.push((
                    format!("spec.ports[{i}].{field}"),
                    format!("Invalid value: {n}: must be between 1 and 65535, inclusive"),
                ));
            }
        }
    }
    if let Some(old) = old {
        let ips = |v: &Value| {
            v.pointer("/spec/clusterIPs")
                .cloned()
                .unwrap_or(Value::Null)
        };
        let old_ips = ips(old);
        if old_ips.as_array().is_some_and(|a| !a.is_empty()) && ips(obj).get(0) != old_ips.get(0) {
            causes.push((
                "spec.clusterIPs[0]".into(),
                format!("Invalid value: {}: may not change once set", ips(obj)),
            ));
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_service_gets_a_cluster_ip_node_ports_and_defaults() {
        let state = State::for_tests();
        let mut svc = json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"type": "NodePort", "ports": [{"port": 80}]}});
        Services.prepare_create(&state, &mut svc).unwrap();
        let ip: Ipv4Addr = svc["spec"]["clusterIP"].as_str().unwrap().parse().unwrap();
        assert_eq!(ip.octets()[..2], [10, 96]);
        assert_ne!(
            ip,
            Ipv4Addr::new(10, 96, 0, 1),
            "the kubernetes service has it"
        );
        let port = &svc["spec"]["ports"][0];
        assert_eq!(
            (port["protocol"].clone(), port["targetPort"].clone()),
            (json!("TCP"), json!(80))
        );
        assert!((30000..=32767).contains(&port["nodePort"].as_u64().unwrap()));
        assert_eq!(svc["spec"]["externalTrafficPolicy"], "Cluster");
        let mut taken = json!({"metadata": {"name": "x"}, "spec": {"clusterIP": "10.96.0.1"}});
        assert_eq!(
            Services
                .prepare_create(&state, &mut taken)
                .unwrap_err()
                .code,
            422
        );
    }

    #[test]
    fn ports_are_in_range_and_cluster_ips_immutable() {
        let svc =
            |port: i64, ip: &str| json!({"spec": {"ports": [{"port": port}], "clusterIPs": [ip]}});
        assert!(Services.validate(&svc(80, "10.96.0.9"), None).is_empty());
        assert_eq!(
            Services.validate(&svc(70000, "10.96.0.9"), None)[0].0,
            "spec.ports[0].port"
        );
        let causes = Services.validate(&svc(80, "10.96.0.8"), Some(&svc(80, "10.96.0.9")));
        assert_eq!(causes[0].0, "spec.clusterIPs[0]");
        assert_eq!(Services.name_rule(), NameRule::Label);
    }
}
