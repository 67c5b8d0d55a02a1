//! `kubectl explain` with the machine's kubectl, which reads the API server's OpenAPI v3
//! documents: a kind's fields and a nested field's, with their types, `-required-` marks and
//! descriptions. On the simulator, and on real control planes in the `real` profile, where
//! kube-apiserver's own documents are the reference the same checks hold on.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use tensile_testenv::{ClusterSpec, TestEnv};

/// `kubectl explain ARGS` with its words joined by single spaces (explain separates a field
/// from its type with a tab and wraps descriptions at 80 columns).
fn explain(kubeconfig: &std::path::Path, args: &[&str]) -> String {
    let mut all = vec!["explain"];
    all.extend_from_slice(args);
    let (ok, out, err) = common::kubectl(kubeconfig, &all);
    assert!(ok, "kubectl explain {args:?}: {err}");
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn shows(out: &str, what: &[&str]) {
    for w in what {
        assert!(out.contains(w), "`{w}` missing from:\n{out}");
    }
}

#[test]
fn kubectl_explain_shows_the_fields_of_a_kind_and_of_nested_fields() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let env = runtime
        .block_on(TestEnv::start_with(vec![ClusterSpec::new("upper", 0)]))
        .unwrap();
    let kc = &env.clusters[0].kubeconfig;

    let spec = explain(kc, &["deployment.spec"]);
    shows(
        &spec,
        &[
            "GROUP: apps KIND: Deployment VERSION: v1",
            "FIELD: spec <DeploymentSpec>",
            // The field's own description, then its type's.
            "DESCRIPTION: Specification of the desired behavior of the Deployment. \
             DeploymentSpec is the specification of the desired behavior of the Deployment.",
            "FIELDS: minReadySeconds <integer>",
            "replicas <integer> Number of desired pods.",
            "selector <LabelSelector> -required- Label selector for pods.",
            "strategy <DeploymentStrategy> The deployment strategy to use",
            "template <PodTemplateSpec> -required- Template describes the pods",
        ],
    );

    // Through a pod template, a list and a map.
    let resources = explain(kc, &["deployment.spec.template.spec.containers.resources"]);
    shows(
        &resources,
        &[
            "KIND: Deployment",
            "FIELD: resources <ResourceRequirements>",
            "Compute Resources required by this container.",
            "limits <map[string]Quantity> Limits describes the maximum amount",
            "requests <map[string]Quantity>",
        ],
    );

    let containers = explain(kc, &["pod.spec.containers"]);
    shows(
        &containers,
        &[
            "KIND: Pod VERSION: v1",
            "FIELD: containers <[]Container>",
            "List of containers belonging to the pod.",
            "image <string> Container image name.",
            "name <string> -required- Name of the container",
            "ports <[]ContainerPort>",
        ],
    );

    // Every field at once, names and types only; the kind's metadata is not required.
    let hpa = explain(kc, &["hpa", "--recursive"]);
    shows(
        &hpa,
        &[
            "GROUP: autoscaling KIND: HorizontalPodAutoscaler VERSION: v2",
            "kind <string> metadata <ObjectMeta> annotations <map[string]string>",
            "scaleTargetRef <CrossVersionObjectReference> -required- apiVersion <string> \
             kind <string> -required- name <string> -required-",
            "maxReplicas <integer> -required-",
            "conditions <[]HorizontalPodAutoscalerCondition>",
        ],
    );

    let (ok, _, err) = common::kubectl(kc, &["explain", "deployment.spec.nosuch"]);
    assert!(!ok);
    assert!(err.contains(r#"field "nosuch" does not exist"#), "{err}");
}
