//! `/runningpods/`: the pods as the container runtime sees them. A kubelet answers it from its
//! runtime (`GetPods(all=false)`): only pods with a running container, each as a bare pod of
//! name, namespace, UID and the running containers' names and images, with no status. Here it
//! is derived from the pods' statuses, which is what a backend has of its runtime.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The pods of `pods` with a running container, in the shape a kubelet serves them.
pub fn running_pods(pods: &[Pod]) -> Vec<Pod> {
    pods.iter()
        .filter_map(|p| {
            let statuses = p.status.as_ref()?.container_statuses.as_ref()?;
            let containers: Vec<Container> = statuses
                .iter()
                .filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
                .map(|c| Container {
                    name: c.name.clone(),
                    image: Some(c.image.clone()),
                    ..Container::default()
                })
                .collect();
            (!containers.is_empty()).then(|| Pod {
                metadata: ObjectMeta {
                    name: p.metadata.name.clone(),
                    namespace: p.metadata.namespace.clone(),
                    uid: p.metadata.uid.clone(),
                    ..ObjectMeta::default()
                },
                spec: Some(PodSpec {
                    containers,
                    ..PodSpec::default()
                }),
                status: None,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, states: &[(&str, &str)]) -> Pod {
        let statuses: Vec<serde_json::Value> = states
            .iter()
            .map(|(c, state)| {
                serde_json::json!({
                    "name": c, "image": "busybox:1", "imageID": "", "ready": *state == "running",
                    "restartCount": 0, "state": {*state: {}},
                })
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "labels": {"a": "b"}},
            "spec": {"nodeName": "n", "containers": states.iter().map(|(c, _)| serde_json::json!({"name": c, "image": "busybox:1"})).collect::<Vec<_>>()},
            "status": {"phase": "Running", "containerStatuses": statuses},
        }))
        .unwrap()
    }

    #[test]
    fn only_running_containers_of_pods_that_have_one_as_the_runtime_lists_them() {
        let pods = vec![
            pod("web", &[("web", "running"), ("sidecar", "terminated")]),
            pod("done", &[("done", "terminated")]),
            pod("starting", &[("c", "waiting")]),
            Pod::default(),
        ];
        let running = running_pods(&pods);
        assert_eq!(running.len(), 1);
        let web = &running[0];
        assert_eq!(web.metadata.name.as_deref(), Some("web"));
        assert_eq!(web.metadata.uid.as_deref(), Some("uid-web"));
        assert!(
            web.metadata.labels.is_none(),
            "a bare pod, as the runtime knows it"
        );
        assert!(web.status.is_none());
        let containers = &web.spec.as_ref().unwrap().containers;
        assert_eq!(containers.len(), 1);
        assert_eq!(containers[0].name, "web");
        assert_eq!(containers[0].image.as_deref(), Some("busybox:1"));
    }
}
