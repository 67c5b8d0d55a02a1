//! The protobuf body decoder: typed objects built with k8s-pb, encoded with prost, wrapped in
//! the `k8s\0` + `runtime.Unknown` envelope, decoded, and compared with the JSON a client would
//! have sent. Objects are filled like Go's encoder fills them: every non-pointer field is on the
//! wire, empty or not, which is what the zero-value rules are for.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use k8s_pb::api::apps::v1 as apps;
use k8s_pb::api::autoscaling::v2 as autoscaling;
use k8s_pb::api::batch::v1 as batch;
use k8s_pb::api::core::v1 as core;
use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
use pretty_assertions::assert_eq;
use proptest::prelude::*;
use prost::Message as _;
use serde_json::{Value, json};
use tensile_sim::apiserver::protobuf::{ProtobufError, WireProblem, decode_k8s_protobuf};

// ---------------------------------------------------------------------------------------------
// Helpers: the envelope by hand, as apimachinery's protobuf serializer writes it.

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_bytes(out: &mut Vec<u8>, tag: u32, bytes: &[u8]) {
    put_varint(out, u64::from(tag << 3 | 2));
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
    let mut type_meta = Vec::new();
    put_bytes(&mut type_meta, 1, api_version.as_bytes());
    put_bytes(&mut type_meta, 2, kind.as_bytes());
    let mut body = b"k8s\0".to_vec();
    put_bytes(&mut body, 1, &type_meta);
    put_bytes(&mut body, 2, raw);
    // Go writes contentEncoding and contentType too, empty.
    put_bytes(&mut body, 3, b"");
    put_bytes(&mut body, 4, b"");
    body
}

fn encode(api_version: &str, kind: &str, object: &impl prost::Message) -> Vec<u8> {
    envelope(api_version, kind, &object.encode_to_vec())
}

fn decode(body: &[u8]) -> Value {
    decode_k8s_protobuf(body).unwrap_or_else(|e| panic!("decoding failed: {e}"))
}

fn s(v: &str) -> Option<String> {
    Some(v.to_owned())
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// ObjectMeta as Go writes it: all non-pointer fields present, a zero creationTimestamp.
fn go_meta(name: &str, labels: &[(&str, &str)]) -> meta::ObjectMeta {
    meta::ObjectMeta {
        name: s(name),
        generate_name: s(""),
        namespace: s(""),
        self_link: s(""),
        uid: s(""),
        resource_version: s(""),
        generation: Some(0),
        creation_timestamp: Some(meta::Time::default()),
        labels: map(labels),
        ..Default::default()
    }
}

/// A container as kubectl's generators build it, with Go's always-written empty fields.
fn go_container(name: &str, image: &str) -> core::Container {
    core::Container {
        name: s(name),
        image: s(image),
        working_dir: s(""),
        resources: Some(core::ResourceRequirements::default()),
        termination_message_path: s(""),
        termination_message_policy: s(""),
        image_pull_policy: s(""),
        stdin: Some(false),
        stdin_once: Some(false),
        tty: Some(false),
        ..Default::default()
    }
}

fn go_port(port: i32) -> core::ContainerPort {
    core::ContainerPort {
        name: s(""),
        host_port: Some(0),
        container_port: Some(port),
        protocol: s(""),
        host_ip: s(""),
    }
}

/// A PodSpec with Go's always-written empty non-pointer fields.
fn go_pod_spec(containers: Vec<core::Container>, restart_policy: &str) -> core::PodSpec {
    core::PodSpec {
        containers,
        restart_policy: s(restart_policy),
        dns_policy: s(""),
        service_account_name: s(""),
        service_account: s(""),
        node_name: s(""),
        host_network: Some(false),
        host_pid: Some(false),
        host_ipc: Some(false),
        hostname: s(""),
        subdomain: s(""),
        scheduler_name: s(""),
        priority_class_name: s(""),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Objects.

#[test]
fn namespace() {
    let ns = core::Namespace {
        metadata: Some(go_meta("shop", &[])),
        spec: Some(core::NamespaceSpec::default()),
        status: Some(core::NamespaceStatus {
            phase: s(""),
            conditions: vec![],
        }),
    };
    assert_eq!(
        decode(&encode("v1", "Namespace", &ns)),
        json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": "shop", "creationTimestamp": null},
            "spec": {},
            "status": {},
        })
    );
}

#[test]
fn pod_like_kubectl_run() {
    // kubectl run web --image=nginx:1.27 --port=80 --env=A=B --labels=app=web -- sleep 1
    let mut container = go_container("web", "nginx:1.27");
    container.args = vec!["sleep".into(), "1".into()];
    container.ports = vec![go_port(80)];
    container.env = vec![core::EnvVar {
        name: s("A"),
        value: s("B"),
        value_from: None,
    }];
    let mut spec = go_pod_spec(vec![container], "Always");
    spec.dns_policy = s("ClusterFirst");
    let pod = core::Pod {
        metadata: Some(go_meta("web", &[("app", "web")])),
        spec: Some(spec),
        status: Some(core::PodStatus {
            phase: s(""),
            message: s(""),
            reason: s(""),
            nominated_node_name: s(""),
            host_ip: s(""),
            pod_ip: s(""),
            qos_class: s(""),
            ..Default::default()
        }),
    };
    assert_eq!(
        decode(&encode("v1", "Pod", &pod)),
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web", "creationTimestamp": null, "labels": {"app": "web"}},
            "spec": {
                "containers": [{
                    "name": "web",
                    "image": "nginx:1.27",
                    "args": ["sleep", "1"],
                    "ports": [{"containerPort": 80}],
                    "env": [{"name": "A", "value": "B"}],
                    "resources": {},
                }],
                "restartPolicy": "Always",
                "dnsPolicy": "ClusterFirst",
            },
            "status": {},
        })
    );
}

#[test]
fn deployment_like_kubectl_create_deployment() {
    // kubectl create deployment web --image=nginx --replicas=3 --port=80, plus a rolling update
    // strategy and resources for IntOrString and Quantity.
    let labels = [("app", "web")];
    let mut container = go_container("nginx", "nginx");
    container.ports = vec![go_port(80)];
    container.resources = Some(core::ResourceRequirements {
        limits: [
            ("cpu".to_owned(), Quantity { string: s("500m") }),
            ("memory".to_owned(), Quantity { string: s("128Mi") }),
        ]
        .into(),
        requests: [("cpu".to_owned(), Quantity::default())].into(),
        claims: vec![],
    });
    let deployment = apps::Deployment {
        metadata: Some(go_meta("web", &labels)),
        spec: Some(apps::DeploymentSpec {
            replicas: Some(3),
            selector: Some(meta::LabelSelector {
                match_labels: map(&labels),
                match_expressions: vec![],
            }),
            template: Some(core::PodTemplateSpec {
                metadata: Some(go_meta("", &labels)),
                spec: Some(go_pod_spec(vec![container], "")),
            }),
            strategy: Some(apps::DeploymentStrategy {
                r#type: s("RollingUpdate"),
                rolling_update: Some(apps::RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString {
                        r#type: Some(0),
                        int_val: Some(1),
                        str_val: s(""),
                    }),
                    max_surge: Some(IntOrString {
                        r#type: Some(1),
                        int_val: Some(0),
                        str_val: s("25%"),
                    }),
                }),
            }),
            min_ready_seconds: Some(0),
            paused: Some(false),
            ..Default::default()
        }),
        status: Some(apps::DeploymentStatus {
            observed_generation: Some(0),
            replicas: Some(0),
            updated_replicas: Some(0),
            ready_replicas: Some(0),
            available_replicas: Some(0),
            unavailable_replicas: Some(0),
            ..Default::default()
        }),
    };
    assert_eq!(
        decode(&encode("apps/v1", "Deployment", &deployment)),
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "creationTimestamp": null, "labels": {"app": "web"}},
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"creationTimestamp": null, "labels": {"app": "web"}},
                    "spec": {
                        "containers": [{
                            "name": "nginx",
                            "image": "nginx",
                            "ports": [{"containerPort": 80}],
                            "resources": {
                                "limits": {"cpu": "500m", "memory": "128Mi"},
                                "requests": {"cpu": "0"},
                            },
                        }],
                    },
                },
                "strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxUnavailable": 1, "maxSurge": "25%"},
                },
            },
            "status": {},
        })
    );
}

#[test]
fn autoscaler_like_kubectl_autoscale() {
    // kubectl autoscale deployment web --cpu-percent=60 --min=1 --max=4: Go writes the
    // non-pointer fields (the status' replica counts, empty strings) and leaves the metric
    // sources it did not set out.
    let hpa = autoscaling::HorizontalPodAutoscaler {
        metadata: Some(go_meta("web", &[])),
        spec: Some(autoscaling::HorizontalPodAutoscalerSpec {
            scale_target_ref: Some(autoscaling::CrossVersionObjectReference {
                kind: s("Deployment"),
                name: s("web"),
                api_version: s("apps/v1"),
            }),
            min_replicas: Some(1),
            max_replicas: Some(4),
            metrics: vec![autoscaling::MetricSpec {
                r#type: s("Resource"),
                resource: Some(autoscaling::ResourceMetricSource {
                    name: s("cpu"),
                    target: Some(autoscaling::MetricTarget {
                        r#type: s("Utilization"),
                        average_utilization: Some(60),
                        ..Default::default()
                    }),
                }),
                ..Default::default()
            }],
            behavior: None,
        }),
        status: Some(autoscaling::HorizontalPodAutoscalerStatus {
            current_replicas: Some(0),
            desired_replicas: Some(0),
            ..Default::default()
        }),
    };
    assert_eq!(
        decode(&encode("autoscaling/v2", "HorizontalPodAutoscaler", &hpa)),
        json!({
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web", "creationTimestamp": null},
            "spec": {
                "scaleTargetRef": {"kind": "Deployment", "name": "web", "apiVersion": "apps/v1"},
                "minReplicas": 1,
                "maxReplicas": 4,
                "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                    "target": {"type": "Utilization", "averageUtilization": 60}}}],
            },
            "status": {"desiredReplicas": 0},
        })
    );
}

#[test]
fn secret_with_binary_data() {
    let secret = core::Secret {
        metadata: Some(go_meta("s", &[])),
        immutable: None,
        data: [
            ("bin".to_owned(), vec![0u8, 1, 2, 0xff]),
            ("p".to_owned(), b"q".to_vec()),
            ("empty".to_owned(), vec![]),
        ]
        .into(),
        string_data: BTreeMap::new(),
        r#type: s("Opaque"),
    };
    assert_eq!(
        decode(&encode("v1", "Secret", &secret)),
        json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "s", "creationTimestamp": null},
            "data": {"bin": "AAEC/w==", "p": "cQ==", "empty": ""},
            "type": "Opaque",
        })
    );
}

#[test]
fn configmap_with_text_and_binary_data() {
    let cm = core::ConfigMap {
        metadata: Some(go_meta("cfg", &[])),
        immutable: Some(true),
        data: map(&[("a", "b"), ("multi", "line 1\nline 2\n")]),
        binary_data: [("blob".to_owned(), b"hello".to_vec())].into(),
    };
    assert_eq!(
        decode(&encode("v1", "ConfigMap", &cm)),
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "cfg", "creationTimestamp": null},
            "immutable": true,
            "data": {"a": "b", "multi": "line 1\nline 2\n"},
            "binaryData": {"blob": "aGVsbG8="},
        })
    );
}

#[test]
fn service_with_string_and_int_target_ports() {
    let port = |name: &str, port: i32, target: IntOrString| core::ServicePort {
        name: s(name),
        protocol: s("TCP"),
        app_protocol: None,
        port: Some(port),
        target_port: Some(target),
        node_port: Some(0),
    };
    let svc = core::Service {
        metadata: Some(go_meta("web", &[("app", "web")])),
        spec: Some(core::ServiceSpec {
            ports: vec![
                port(
                    "http",
                    80,
                    IntOrString {
                        r#type: Some(1),
                        int_val: Some(0),
                        str_val: s("http"),
                    },
                ),
                port(
                    "metrics",
                    9090,
                    IntOrString {
                        r#type: Some(0),
                        int_val: Some(9091),
                        str_val: s(""),
                    },
                ),
                // kubectl create service leaves targetPort zero when not given: Go writes it.
                port("raw", 81, IntOrString::default()),
            ],
            selector: map(&[("app", "web")]),
            cluster_ip: s(""),
            r#type: s("ClusterIP"),
            session_affinity: s(""),
            load_balancer_ip: s(""),
            external_name: s(""),
            external_traffic_policy: s(""),
            health_check_node_port: Some(0),
            publish_not_ready_addresses: Some(false),
            ..Default::default()
        }),
        status: Some(core::ServiceStatus::default()),
    };
    assert_eq!(
        decode(&encode("v1", "Service", &svc)),
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web", "creationTimestamp": null, "labels": {"app": "web"}},
            "spec": {
                "ports": [
                    {"name": "http", "protocol": "TCP", "port": 80, "targetPort": "http"},
                    {"name": "metrics", "protocol": "TCP", "port": 9090, "targetPort": 9091},
                    {"name": "raw", "protocol": "TCP", "port": 81, "targetPort": 0},
                ],
                "selector": {"app": "web"},
                "type": "ClusterIP",
            },
            "status": {},
        })
    );
}

#[test]
fn job_keeps_zero_pointer_fields() {
    // kubectl create job j --image=busybox -- echo hi, with backoffLimit 0 and suspend false:
    // pointers in Go, so zero is a value, not an absence.
    let mut container = go_container("j", "busybox");
    container.command = vec!["echo".into(), "hi".into()];
    let job = batch::Job {
        metadata: Some(go_meta("j", &[])),
        spec: Some(batch::JobSpec {
            backoff_limit: Some(0),
            suspend: Some(false),
            template: Some(core::PodTemplateSpec {
                metadata: Some(go_meta("", &[])),
                spec: Some(go_pod_spec(vec![container], "Never")),
            }),
            ..Default::default()
        }),
        status: Some(batch::JobStatus {
            active: Some(0),
            succeeded: Some(0),
            failed: Some(0),
            ..Default::default()
        }),
    };
    assert_eq!(
        decode(&encode("batch/v1", "Job", &job)),
        json!({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "j", "creationTimestamp": null},
            "spec": {
                "backoffLimit": 0,
                "suspend": false,
                "template": {
                    "metadata": {"creationTimestamp": null},
                    "spec": {
                        "containers": [{
                            "name": "j",
                            "image": "busybox",
                            "command": ["echo", "hi"],
                            "resources": {},
                        }],
                        "restartPolicy": "Never",
                    },
                },
            },
            "status": {},
        })
    );
}

#[test]
fn booleans_false_versus_absent_and_negative_numbers() {
    let mut container = go_container("c", "i");
    container.ports = vec![go_port(-80)];
    container.security_context = Some(core::SecurityContext {
        run_as_user: Some(-5),
        privileged: Some(false),
        ..Default::default()
    });
    let mut spec = go_pod_spec(vec![container], "");
    spec.automount_service_account_token = Some(false); // *bool: false is kept
    spec.host_network = Some(false); // bool,omitempty: false is dropped
    spec.priority = Some(-2_000_000_000);
    spec.active_deadline_seconds = Some(i64::MIN);
    spec.security_context = Some(core::PodSecurityContext {
        supplemental_groups: vec![-1, 0, 7],
        ..Default::default()
    });
    let pod = core::Pod {
        metadata: Some(meta::ObjectMeta {
            name: s("p"),
            generation: Some(-3),
            deletion_grace_period_seconds: Some(0),
            ..Default::default()
        }),
        spec: Some(spec),
        status: None,
    };
    assert_eq!(
        decode(&encode("v1", "Pod", &pod)),
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "generation": -3, "deletionGracePeriodSeconds": 0},
            "spec": {
                "containers": [{
                    "name": "c",
                    "image": "i",
                    "ports": [{"containerPort": -80}],
                    "resources": {},
                    "securityContext": {"runAsUser": -5, "privileged": false},
                }],
                "automountServiceAccountToken": false,
                "priority": -2_000_000_000,
                "activeDeadlineSeconds": i64::MIN,
                "securityContext": {"supplementalGroups": [-1, 0, 7]},
            },
        })
    );
}

#[test]
fn times_and_maps_and_repeated_messages() {
    let pod = core::Pod {
        metadata: Some(meta::ObjectMeta {
            name: s("t"),
            creation_timestamp: Some(meta::Time {
                seconds: Some(1_795_341_600),
                nanos: Some(0),
            }),
            // Time keeps whole seconds, like Go's.
            deletion_timestamp: Some(meta::Time {
                seconds: Some(1_795_341_601),
                nanos: Some(999_999_999),
            }),
            annotations: map(&[("a", "1"), ("b", "")]),
            owner_references: vec![
                meta::OwnerReference {
                    api_version: s("apps/v1"),
                    kind: s("ReplicaSet"),
                    name: s("rs"),
                    uid: s("u1"),
                    controller: Some(true),
                    block_owner_deletion: None,
                },
                meta::OwnerReference {
                    api_version: s("v1"),
                    kind: s("Node"),
                    name: s("n"),
                    uid: s("u2"),
                    controller: None,
                    block_owner_deletion: Some(false),
                },
            ],
            finalizers: vec!["x/y".into()],
            ..Default::default()
        }),
        spec: None,
        status: Some(core::PodStatus {
            start_time: Some(meta::Time {
                seconds: Some(0),
                nanos: None,
            }),
            conditions: vec![core::PodCondition {
                r#type: s("Ready"),
                status: s("True"),
                last_probe_time: Some(meta::Time::default()),
                last_transition_time: Some(meta::Time {
                    seconds: Some(1_795_341_600),
                    nanos: Some(0),
                }),
                reason: s(""),
                message: s(""),
                observed_generation: None,
            }],
            ..Default::default()
        }),
    };
    assert_eq!(
        decode(&encode("v1", "Pod", &pod)),
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "t",
                "creationTimestamp": "2026-11-22T10:00:00Z",
                "deletionTimestamp": "2026-11-22T10:00:01Z",
                "annotations": {"a": "1", "b": ""},
                "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u1",
                     "controller": true},
                    {"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "u2",
                     "blockOwnerDeletion": false},
                ],
                "finalizers": ["x/y"],
            },
            "status": {
                "startTime": "1970-01-01T00:00:00Z",
                "conditions": [{
                    "type": "Ready",
                    "status": "True",
                    "lastProbeTime": null,
                    "lastTransitionTime": "2026-11-22T10:00:00Z",
                }],
            },
        })
    );
}

#[test]
fn delete_options_in_any_group_version() {
    let opts = meta::DeleteOptions {
        grace_period_seconds: Some(0),
        preconditions: Some(meta::Preconditions {
            uid: s("u"),
            resource_version: None,
        }),
        propagation_policy: s("Foreground"),
        dry_run: vec!["All".into()],
        ..Default::default()
    };
    for api_version in ["v1", "apps/v1", "meta.k8s.io/v1"] {
        assert_eq!(
            decode(&encode(api_version, "DeleteOptions", &opts)),
            json!({
                "apiVersion": api_version,
                "kind": "DeleteOptions",
                "gracePeriodSeconds": 0,
                "preconditions": {"uid": "u"},
                "propagationPolicy": "Foreground",
                "dryRun": ["All"],
            })
        );
    }
}

#[test]
fn inlined_messages_share_their_parent_object() {
    // Volume inlines VolumeSource, ConfigMapVolumeSource inlines LocalObjectReference, Probe
    // inlines ProbeHandler.
    let mut container = go_container("c", "i");
    container.liveness_probe = Some(core::Probe {
        handler: Some(core::ProbeHandler {
            http_get: Some(core::HttpGetAction {
                path: s("/healthz"),
                port: Some(IntOrString {
                    r#type: Some(0),
                    int_val: Some(8080),
                    str_val: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        period_seconds: Some(5),
        ..Default::default()
    });
    let mut spec = go_pod_spec(vec![container], "");
    spec.volumes = vec![core::Volume {
        name: s("cfg"),
        volume_source: Some(core::VolumeSource {
            config_map: Some(core::ConfigMapVolumeSource {
                local_object_reference: Some(core::LocalObjectReference { name: s("cm") }),
                default_mode: Some(0o644),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }];
    let pod = core::Pod {
        metadata: Some(meta::ObjectMeta {
            name: s("v"),
            ..Default::default()
        }),
        spec: Some(spec),
        status: None,
    };
    let got = decode(&encode("v1", "Pod", &pod));
    assert_eq!(
        got["spec"]["volumes"],
        json!([{"name": "cfg", "configMap": {"name": "cm", "defaultMode": 420}}])
    );
    assert_eq!(
        got["spec"]["containers"][0]["livenessProbe"],
        json!({"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 5})
    );
}

// ---------------------------------------------------------------------------------------------
// Wire-level behaviour.

fn namespace_raw() -> Vec<u8> {
    core::Namespace {
        metadata: Some(meta::ObjectMeta {
            name: s("n"),
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

#[test]
fn unknown_fields_are_skipped() {
    let mut raw = namespace_raw();
    put_varint(&mut raw, 99 << 3); // varint field 99
    put_varint(&mut raw, 12345);
    put_bytes(&mut raw, 98, b"whatever");
    put_varint(&mut raw, 97 << 3 | 1); // fixed64
    raw.extend_from_slice(&[1; 8]);
    put_varint(&mut raw, 96 << 3 | 5); // fixed32
    raw.extend_from_slice(&[1; 4]);
    assert_eq!(
        decode(&envelope("v1", "Namespace", &raw)),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n"}})
    );
}

#[test]
fn a_message_that_occurs_twice_is_merged_and_scalars_last_wins() {
    let mut raw = Vec::new();
    let first = meta::ObjectMeta {
        name: s("a"),
        labels: map(&[("x", "1")]),
        ..Default::default()
    };
    let second = meta::ObjectMeta {
        name: s("b"),
        labels: map(&[("y", "2")]),
        ..Default::default()
    };
    put_bytes(&mut raw, 1, &first.encode_to_vec());
    put_bytes(&mut raw, 1, &second.encode_to_vec());
    assert_eq!(
        decode(&envelope("v1", "Namespace", &raw)),
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": "b", "labels": {"x": "1", "y": "2"}}})
    );
}

#[test]
fn packed_and_unpacked_repeated_numbers_are_both_read() {
    // PodSpec.securityContext (14) -> PodSecurityContext.supplementalGroups (4), packed.
    let mut packed = Vec::new();
    for v in [1u64, 2, 300] {
        put_varint(&mut packed, v);
    }
    let mut psc = Vec::new();
    put_bytes(&mut psc, 4, &packed);
    put_varint(&mut psc, 4 << 3); // and one more, unpacked
    put_varint(&mut psc, 5);
    let mut spec = Vec::new();
    put_bytes(&mut spec, 14, &psc);
    let mut raw = Vec::new();
    put_bytes(&mut raw, 2, &spec);
    let got = decode(&envelope("v1", "Pod", &raw));
    assert_eq!(
        got["spec"]["securityContext"]["supplementalGroups"],
        json!([1, 2, 300, 5])
    );
}

#[test]
fn map_entries_with_missing_keys_or_values_get_zero_values() {
    // ObjectMeta.labels (11): an entry with only a key, one with only a value.
    let mut only_key = Vec::new();
    put_bytes(&mut only_key, 1, b"k");
    let mut only_value = Vec::new();
    put_bytes(&mut only_value, 2, b"v");
    let mut meta_raw = Vec::new();
    put_bytes(&mut meta_raw, 11, &only_key);
    put_bytes(&mut meta_raw, 11, &only_value);
    let mut raw = Vec::new();
    put_bytes(&mut raw, 1, &meta_raw);
    let got = decode(&envelope("v1", "Namespace", &raw));
    assert_eq!(got["metadata"]["labels"], json!({"k": "", "": "v"}));
}

#[test]
fn invalid_utf8_becomes_replacement_characters_like_go_json() {
    let mut meta_raw = Vec::new();
    put_bytes(&mut meta_raw, 1, b"a\xffb");
    let mut raw = Vec::new();
    put_bytes(&mut raw, 1, &meta_raw);
    let got = decode(&envelope("v1", "Namespace", &raw));
    assert_eq!(got["metadata"]["name"], json!("a\u{fffd}b"));
}

// ---------------------------------------------------------------------------------------------
// Malformed input.

fn error(body: &[u8]) -> ProtobufError {
    match decode_k8s_protobuf(body) {
        Ok(v) => panic!("expected an error, got {v}"),
        Err(e) => e,
    }
}

fn wire_problem(body: &[u8]) -> (String, WireProblem) {
    match error(body) {
        ProtobufError::Malformed {
            message,
            field,
            problem,
        } => (format!("{message} {field}"), problem),
        other => panic!("expected a wire problem, got {other}"),
    }
}

#[test]
fn bad_magic() {
    let mut body = envelope("v1", "Namespace", &namespace_raw());
    body[2] = b'x';
    assert!(matches!(error(&body), ProtobufError::BadMagic));
    assert!(matches!(error(b""), ProtobufError::BadMagic));
    assert!(matches!(
        error(b"{\"kind\":\"Pod\"}"),
        ProtobufError::BadMagic
    ));
}

#[test]
fn truncated_varint() {
    // ObjectMeta.generation (7), a varint cut short.
    let mut meta_raw = vec![7 << 3, 0x80, 0x80];
    let mut raw = Vec::new();
    put_bytes(&mut raw, 1, &meta_raw);
    let (place, problem) = wire_problem(&envelope("v1", "Namespace", &raw));
    assert_eq!(problem, WireProblem::TruncatedVarint);
    assert!(place.contains("ObjectMeta"), "{place}");
    // And one that never ends.
    meta_raw = vec![7 << 3];
    meta_raw.extend_from_slice(&[0xff; 11]);
    raw.clear();
    put_bytes(&mut raw, 1, &meta_raw);
    let (_, problem) = wire_problem(&envelope("v1", "Namespace", &raw));
    assert_eq!(problem, WireProblem::OverlongVarint);
}

#[test]
fn wrong_wire_type() {
    // Namespace.metadata (1) as a varint.
    let (place, problem) = wire_problem(&envelope("v1", "Namespace", &[1 << 3, 1]));
    assert_eq!(
        problem,
        WireProblem::WrongWireType {
            got: 0,
            expected: "length-delimited (2)"
        }
    );
    assert_eq!(place, "k8s.io.api.core.v1.Namespace metadata (1)");
    // ObjectMeta.generation (7) as a string.
    let mut raw = Vec::new();
    let mut meta_raw = Vec::new();
    put_bytes(&mut meta_raw, 7, b"1");
    put_bytes(&mut raw, 1, &meta_raw);
    let err = error(&envelope("v1", "Namespace", &raw)).to_string();
    assert!(err.contains("ObjectMeta, generation (7)"), "{err}");
}

#[test]
fn length_past_the_end() {
    let (place, problem) = wire_problem(&envelope("v1", "Namespace", &[1 << 3 | 2, 5, 1]));
    assert_eq!(
        problem,
        WireProblem::LengthPastEnd {
            len: 5,
            remaining: 1
        }
    );
    assert!(place.starts_with("k8s.io.api.core.v1.Namespace"), "{place}");
    // A length near u64::MAX must not overflow anything.
    let mut raw = vec![1 << 3 | 2];
    put_varint(&mut raw, u64::MAX);
    let (_, problem) = wire_problem(&envelope("v1", "Namespace", &raw));
    assert!(matches!(problem, WireProblem::LengthPastEnd { .. }));
    // The envelope itself truncated.
    let body = envelope("v1", "Namespace", &namespace_raw());
    let (place, _) = wire_problem(&body[..body.len() - 8]);
    assert!(place.contains("runtime.Unknown"), "{place}");
}

#[test]
fn unknown_kind_and_missing_type_meta() {
    let err = error(&envelope("v1", "Bogus", &[]));
    assert!(
        matches!(&err, ProtobufError::UnknownKind { kind, api_version } if kind == "Bogus" && api_version == "v1"),
        "{err}"
    );
    let err = error(&envelope("apps/v1", "Pod", &[]));
    assert!(matches!(err, ProtobufError::UnknownKind { .. }), "{err}");
    let err = error(&envelope("v1", "", &[]));
    assert!(
        matches!(err, ProtobufError::MissingTypeMeta("kind")),
        "{err}"
    );
    let err = error(&envelope("", "Pod", &[]));
    assert!(
        matches!(err, ProtobufError::MissingTypeMeta("apiVersion")),
        "{err}"
    );
    assert!(matches!(error(b"k8s\0"), ProtobufError::MissingTypeMeta(_)));
}

#[test]
fn groups_and_invalid_wire_types_and_field_zero() {
    for (raw, want) in [
        (vec![1 << 3 | 3], WireProblem::Group),
        (vec![1 << 3 | 6], WireProblem::InvalidWireType(6)),
        (vec![2], WireProblem::InvalidFieldNumber(0)),
    ] {
        let (_, problem) = wire_problem(&envelope("v1", "Namespace", &raw));
        assert_eq!(problem, want);
    }
}

#[test]
fn values_without_a_json_form_are_errors() {
    // IntOrString type 2 does not exist.
    let mut ios = Vec::new();
    put_varint(&mut ios, 1 << 3);
    put_varint(&mut ios, 2);
    let mut port = Vec::new();
    put_bytes(&mut port, 4, &ios); // ServicePort.targetPort
    let mut spec = Vec::new();
    put_bytes(&mut spec, 1, &port); // ServiceSpec.ports
    let mut raw = Vec::new();
    put_bytes(&mut raw, 2, &spec);
    let err = error(&envelope("v1", "Service", &raw));
    assert!(matches!(err, ProtobufError::InvalidValue { .. }), "{err}");
    assert!(err.to_string().contains("targetPort (4)"), "{err}");
    // A Time after year 9999.
    let mut time = Vec::new();
    put_varint(&mut time, 1 << 3);
    put_varint(&mut time, 300_000_000_000);
    let mut meta_raw = Vec::new();
    put_bytes(&mut meta_raw, 8, &time);
    raw.clear();
    put_bytes(&mut raw, 1, &meta_raw);
    let err = error(&envelope("v1", "Namespace", &raw));
    assert!(err.to_string().contains("creationTimestamp"), "{err}");
}

#[test]
fn deep_nesting_in_unknown_fields_does_not_recurse() {
    // 10,000 nested length-delimited unknown fields: skipped, never descended into.
    let mut inner = Vec::new();
    for _ in 0..10_000 {
        let mut outer = Vec::new();
        put_bytes(&mut outer, 99, &inner);
        inner = outer;
    }
    let got = decode(&envelope("v1", "Namespace", &inner));
    assert_eq!(got, json!({"apiVersion": "v1", "kind": "Namespace"}));
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_k8s_protobuf(&bytes);
        let mut body = b"k8s\0".to_vec();
        body.extend_from_slice(&bytes);
        let _ = decode_k8s_protobuf(&body);
        let _ = decode_k8s_protobuf(&envelope("v1", "Pod", &bytes));
        let _ = decode_k8s_protobuf(&envelope("apps/v1", "Deployment", &bytes));
    }

    #[test]
    fn mutated_pods_never_panic(
        cut in 0usize..2000,
        flips in proptest::collection::vec((0usize..2000, any::<u8>()), 0..8),
    ) {
        let mut container = go_container("web", "nginx:1.27");
        container.ports = vec![go_port(80)];
        let pod = core::Pod {
            metadata: Some(go_meta("web", &[("app", "web")])),
            spec: Some(go_pod_spec(vec![container], "Always")),
            status: Some(core::PodStatus::default()),
        };
        let mut raw = pod.encode_to_vec();
        for (at, byte) in flips {
            let len = raw.len();
            if let Some(b) = raw.get_mut(at % len) {
                *b = byte;
            }
        }
        raw.truncate(cut.min(raw.len()));
        let _ = decode_k8s_protobuf(&envelope("v1", "Pod", &raw));
    }
}

#[test]
fn embedded_json_and_string_lists() {
    // FieldsV1 holds JSON; ExtraValue is a Go []string.
    let pod = core::Pod {
        metadata: Some(meta::ObjectMeta {
            name: s("m"),
            managed_fields: vec![meta::ManagedFieldsEntry {
                manager: s("kubectl"),
                operation: s("Apply"),
                api_version: s("v1"),
                fields_type: s("FieldsV1"),
                fields_v1: Some(meta::FieldsV1 {
                    raw: Some(br#"{"f:metadata":{"f:labels":{}}}"#.to_vec()),
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let got = decode(&encode("v1", "Pod", &pod));
    assert_eq!(
        got["metadata"]["managedFields"],
        json!([{"manager": "kubectl", "operation": "Apply", "apiVersion": "v1",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {}}}}])
    );

    let mut bad = pod.clone();
    if let Some(m) = bad.metadata.as_mut() {
        m.managed_fields[0].fields_v1 = Some(meta::FieldsV1 {
            raw: Some(b"\x0a\x01x".to_vec()),
        });
    }
    let err = error(&encode("v1", "Pod", &bad));
    assert!(err.to_string().contains("fieldsV1"), "{err}");

    let review = k8s_pb::api::authentication::v1::SelfSubjectReview {
        metadata: Some(meta::ObjectMeta::default()),
        status: Some(k8s_pb::api::authentication::v1::SelfSubjectReviewStatus {
            user_info: Some(k8s_pb::api::authentication::v1::UserInfo {
                username: s("alice"),
                groups: vec!["dev".into()],
                extra: [(
                    "scopes".to_owned(),
                    k8s_pb::api::authentication::v1::ExtraValue {
                        items: vec!["a".into(), "b".into()],
                    },
                )]
                .into(),
                ..Default::default()
            }),
        }),
    };
    assert_eq!(
        decode(&encode(
            "authentication.k8s.io/v1",
            "SelfSubjectReview",
            &review
        )),
        json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "SelfSubjectReview",
            "metadata": {},
            "status": {"userInfo": {
                "username": "alice",
                "groups": ["dev"],
                "extra": {"scopes": ["a", "b"]},
            }},
        })
    );
}

#[test]
fn decode_errors_reach_the_client_as_400() {
    // Through the server: a malformed protobuf body is a BadRequest Status naming the problem.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let server =
            tensile_testenv::start_apiserver(tensile_sim::apiserver::ApiServerConfig::default())
                .await
                .unwrap()
                .0;
        let client = server.client().await.unwrap();
        let body = envelope("v1", "Namespace", &[1 << 3 | 2, 5, 1]);
        let req = http::Request::post("/api/v1/namespaces")
            .header("Content-Type", "application/vnd.kubernetes.protobuf")
            .body(body)
            .unwrap();
        let err = client.request::<Value>(req).await.unwrap_err();
        match err {
            kube::Error::Api(status) => {
                assert_eq!(status.code, 400);
                assert!(status.message.contains("protobuf"), "{}", status.message);
                assert!(
                    status.message.contains("runs past the end"),
                    "{}",
                    status.message
                );
            }
            other => panic!("expected a 400, got {other:?}"),
        }
        // And a good one creates.
        let ns = core::Namespace {
            metadata: Some(go_meta("from-proto", &[])),
            spec: Some(core::NamespaceSpec::default()),
            status: Some(core::NamespaceStatus::default()),
        };
        let req = http::Request::post("/api/v1/namespaces")
            .header("Content-Type", "application/vnd.kubernetes.protobuf")
            .body(encode("v1", "Namespace", &ns))
            .unwrap();
        let created: Value = client.request(req).await.unwrap();
        assert_eq!(created["metadata"]["name"], "from-proto");
        assert_eq!(created["status"]["phase"], "Active");
    });
}
