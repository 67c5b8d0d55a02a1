//! RBAC enforcement of the embedded API server, through kube-rs: identities outside
//! `system:masters` get exactly what roles and bindings grant, refusals are 403 Status errors
//! worded like the real server's, and every refusal is recorded.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::core::Status;
use serde_json::json;
use tensile_sim::apiserver::{ApiServer, ApiServerConfig, UserInfo};

const SA: &str = "system:serviceaccount:kube-system:vn";

async fn server() -> (ApiServer, kube::Client) {
    let server = tensile_testenv::start_apiserver(ApiServerConfig::default())
        .await
        .unwrap()
        .0;
    let client = server.client().await.unwrap();
    (server, client)
}

fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap()
}

fn api_error(e: kube::Error) -> Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn raw(client: &kube::Client, method: &str, path: &str) -> Result<String, Status> {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(b"{}".to_vec())
        .unwrap();
    client.request_text(req).await.map_err(api_error)
}

/// A ServiceAccount `kube-system/vn` that may read pods in `default` (RoleBinding to a
/// ClusterRole) and update leases in `kube-node-lease` (Role), like our manifests grant.
async fn grant(admin: &kube::Client) {
    Api::<ServiceAccount>::namespaced(admin.clone(), "kube-system")
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "vn"}})),
        )
        .await
        .unwrap();
    Api::<ClusterRole>::all(admin.clone())
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "pod-reader"},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
                          {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}]})),
        )
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), "default")
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "vn-reads-pods"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "pod-reader"},
                "subjects": [{"kind": "ServiceAccount", "name": "vn", "namespace": "kube-system"}]})),
        )
        .await
        .unwrap();
    Api::<Role>::namespaced(admin.clone(), "kube-node-lease")
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "leases"},
                "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                           "verbs": ["get", "create", "update", "patch"]}]})),
        )
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), "kube-node-lease")
        .create(
            &PostParams::default(),
            // The second subject's namespace is omitted: for a RoleBinding it is the binding's
            // own, so it is kube-node-lease's `vn`.
            &from(json!({"metadata": {"name": "leases"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "leases"},
                "subjects": [{"kind": "ServiceAccount", "name": "vn", "namespace": "kube-system"},
                             {"kind": "ServiceAccount", "name": "vn"}]})),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn service_accounts_get_what_their_bindings_grant_and_nothing_else() {
    let (s, admin) = server().await;
    grant(&admin).await;
    let token = s.service_account_token("kube-system", "vn");
    let vn = s.client_with_token(&token).await.unwrap();

    // Granted: list, get (404 is past authorization), watch, in `default`.
    let pods = Api::<Pod>::namespaced(vn.clone(), "default");
    pods.list(&ListParams::default()).await.unwrap();
    let e = api_error(pods.get("web-1").await.unwrap_err());
    assert_eq!(e.code, 404, "{}", e.message);
    raw(
        &vn,
        "GET",
        "/api/v1/namespaces/default/pods?watch=true&timeoutSeconds=1",
    )
    .await
    .unwrap();
    // Discovery and version are every authenticated user's.
    raw(&vn, "GET", "/api").await.unwrap();
    raw(&vn, "GET", "/apis").await.unwrap();
    raw(&vn, "GET", "/version").await.unwrap();
    raw(&vn, "GET", "/openapi/v3").await.unwrap();
    assert!(s.forbidden().is_empty(), "{:?}", s.forbidden());

    // Not granted: another namespace, a write, the cluster scope.
    let e = api_error(
        Api::<Pod>::namespaced(vn.clone(), "shop")
            .get("web-1")
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        e.message,
        "pods \"web-1\" is forbidden: User \"system:serviceaccount:kube-system:vn\" cannot get resource \"pods\" in API group \"\" in the namespace \"shop\""
    );
    let details = e.details.unwrap();
    assert_eq!(
        (
            details.name.as_str(),
            details.group.as_str(),
            details.kind.as_str()
        ),
        ("web-1", "", "pods")
    );
    let e = api_error(
        Api::<Pod>::all(vn.clone())
            .list(&ListParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(
        e.message,
        "pods is forbidden: User \"system:serviceaccount:kube-system:vn\" cannot list resource \"pods\" in API group \"\" at the cluster scope"
    );
    // Subresources are their own resources: the method gives the verb.
    let e = raw(
        &vn,
        "POST",
        "/api/v1/namespaces/default/pods/web-1/exec?command=ls",
    )
    .await
    .unwrap_err();
    assert_eq!(
        e.message,
        "pods \"web-1\" is forbidden: User \"system:serviceaccount:kube-system:vn\" cannot create resource \"pods/exec\" in API group \"\" in the namespace \"default\""
    );
    let e = raw(
        &vn,
        "GET",
        "/api/v1/namespaces/default/pods/web-1/exec?command=ls",
    )
    .await
    .unwrap_err();
    assert!(
        e.message.contains("cannot get resource \"pods/exec\""),
        "{}",
        e.message
    );
    // pods/log is granted: past authorization, the pod does not exist.
    let e = raw(&vn, "GET", "/api/v1/namespaces/default/pods/web-1/log")
        .await
        .unwrap_err();
    assert_eq!(e.code, 404, "{}", e.message);
    // A dry run is authorized like the real thing.
    let e = api_error(
        Api::<ConfigMap>::namespaced(vn.clone(), "default")
            .create(
                &PostParams {
                    dry_run: true,
                    ..PostParams::default()
                },
                &from(json!({"metadata": {"name": "c"}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 403);
    // Computed, read-only resources and proxies are checked too.
    let e = raw(&vn, "GET", "/apis/metrics.k8s.io/v1beta1/nodes")
        .await
        .unwrap_err();
    assert_eq!(
        e.message,
        "nodes.metrics.k8s.io is forbidden: User \"system:serviceaccount:kube-system:vn\" cannot list resource \"nodes\" in API group \"metrics.k8s.io\" at the cluster scope"
    );
    let e = raw(&vn, "GET", "/api/v1/nodes/n1/proxy/stats/summary")
        .await
        .unwrap_err();
    assert!(
        e.message.contains("cannot get resource \"nodes/proxy\""),
        "{}",
        e.message
    );
    // Non-resource paths outside the discovery policy.
    let e = raw(&vn, "GET", "/healthz/ping").await.unwrap_err();
    assert_eq!(
        e.message,
        "forbidden: User \"system:serviceaccount:kube-system:vn\" cannot get path \"/healthz/ping\""
    );

    // The Role in kube-node-lease, for both subjects of its binding.
    let local = s
        .client_with_token(&s.service_account_token("kube-node-lease", "vn"))
        .await
        .unwrap();
    let before = s.forbidden().len();
    let e = api_error(
        Api::<Lease>::namespaced(local, "kube-node-lease")
            .get("n1")
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 404, "{}", e.message);
    assert_eq!(s.forbidden().len(), before);
    let leases = Api::<Lease>::namespaced(vn.clone(), "kube-node-lease");
    leases
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "n1"}, "spec": {"holderIdentity": "n1"}})),
        )
        .await
        .unwrap();
    let e = api_error(leases.list(&ListParams::default()).await.unwrap_err());
    assert!(e.message.contains("cannot list resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"kube-node-lease\""), "{}", e.message);

    // Every refusal was recorded, in order.
    let denied = s.forbidden();
    let got: Vec<(String, String, String, String)> = denied
        .iter()
        .map(|d| {
            (
                d.verb.clone(),
                d.resource.clone(),
                d.namespace.clone(),
                d.name.clone(),
            )
        })
        .collect();
    let want: Vec<(String, String, String, String)> = [
        ("get", "pods", "shop", "web-1"),
        ("list", "pods", "", ""),
        ("create", "pods/exec", "default", "web-1"),
        ("get", "pods/exec", "default", "web-1"),
        ("create", "configmaps", "default", ""),
        ("list", "nodes", "", ""),
        ("get", "nodes/proxy", "", "n1"),
        ("get", "", "", ""),
        ("list", "leases", "kube-node-lease", ""),
    ]
    .iter()
    .map(|(a, b, c, d)| ((*a).into(), (*b).into(), (*c).into(), (*d).into()))
    .collect();
    assert_eq!(got, want);
    assert!(denied.iter().all(|d| d.user == SA));
    assert_eq!(denied[5].group, "metrics.k8s.io");
    assert_eq!(denied[7].path, "/healthz/ping");
    assert_eq!(
        denied[0].to_string(),
        "User \"system:serviceaccount:kube-system:vn\" cannot get resource \"pods\" in API group \"\" in the namespace \"shop\" (name \"web-1\")"
    );
    s.clear_forbidden();
    assert!(s.forbidden().is_empty());

    // Administrators were never refused nor recorded.
    Api::<Pod>::all(admin)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(s.forbidden().is_empty());
}

#[tokio::test]
async fn grants_take_effect_at_once_and_resource_names_narrow_them() {
    let (s, admin) = server().await;
    let token = s.issue_token(UserInfo {
        username: "alice".into(),
        uid: String::new(),
        groups: vec!["dev".into()],
    });
    let alice = s.client_with_token(&token).await.unwrap();
    let cms = Api::<ConfigMap>::namespaced(alice.clone(), "default");
    assert_eq!(api_error(cms.get("cfg").await.unwrap_err()).code, 403);

    Api::<ClusterRole>::all(admin.clone())
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "one-cm"},
                "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["cfg"],
                           "verbs": ["get", "list", "watch", "patch"]}]})),
        )
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "dev-one-cm"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "one-cm"},
                "subjects": [{"kind": "Group", "name": "dev"}]})),
        )
        .await
        .unwrap();
    // The binding's Group subject got its apiGroup by defaulting.
    let b = Api::<ClusterRoleBinding>::all(admin.clone())
        .get("dev-one-cm")
        .await
        .unwrap();
    assert_eq!(
        b.subjects.unwrap()[0].api_group.as_deref(),
        Some("rbac.authorization.k8s.io")
    );

    assert_eq!(api_error(cms.get("cfg").await.unwrap_err()).code, 404);
    assert_eq!(api_error(cms.get("other").await.unwrap_err()).code, 403);
    // A list is not narrowed by a name, unless its field selector names it.
    assert_eq!(
        api_error(cms.list(&ListParams::default()).await.unwrap_err()).code,
        403
    );
    cms.list(&ListParams::default().fields("metadata.name=cfg"))
        .await
        .unwrap();
    assert_eq!(
        api_error(
            cms.create(
                &PostParams::default(),
                &from(json!({"metadata": {"name": "cfg"}}))
            )
            .await
            .unwrap_err()
        )
        .code,
        403
    );

    // Revoked as fast as granted.
    Api::<ClusterRoleBinding>::all(admin.clone())
        .delete("dev-one-cm", &Default::default())
        .await
        .unwrap();
    assert_eq!(api_error(cms.get("cfg").await.unwrap_err()).code, 403);

    // SubjectAccessReviews give the same answers.
    let review = |user: &str, groups: &[&str], verb: &str, name: &str| {
        from::<SubjectAccessReview>(json!({"spec": {"user": user, "groups": groups,
            "resourceAttributes": {"namespace": "default", "verb": verb, "resource": "configmaps",
                "name": name}}}))
    };
    let reviews = &Api::<SubjectAccessReview>::all(admin.clone());
    let answer = |r: SubjectAccessReview| async move {
        reviews
            .create(&PostParams::default(), &r)
            .await
            .unwrap()
            .status
            .unwrap()
    };
    assert!(
        !answer(review("alice", &["dev"], "get", "cfg"))
            .await
            .allowed
    );
    assert!(
        answer(review("root", &["system:masters"], "delete", "x"))
            .await
            .allowed
    );
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "alice-one-cm"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "one-cm"},
                "subjects": [{"kind": "User", "name": "alice"}]})),
        )
        .await
        .unwrap();
    let yes = answer(review("alice", &[], "get", "cfg")).await;
    assert!(yes.allowed);
    assert_eq!(
        yes.reason.as_deref(),
        Some(
            "RBAC: allowed by ClusterRoleBinding \"alice-one-cm\" of ClusterRole \"one-cm\" to User \"alice\""
        )
    );
    assert!(!answer(review("alice", &[], "get", "other")).await.allowed);
    assert_eq!(s.forbidden().len(), 5, "{:?}", s.forbidden());
}

#[tokio::test]
async fn rbac_objects_are_validated_like_the_real_server() {
    let (_s, admin) = server().await;
    // The bootstrap policy is there, with names that are not DNS subdomains.
    let roles = Api::<ClusterRole>::all(admin.clone());
    let discovery = roles.get("system:discovery").await.unwrap();
    assert!(
        discovery.rules.unwrap()[0]
            .non_resource_urls
            .as_ref()
            .unwrap()
            .contains(&"/apis/*".to_owned())
    );
    roles.get("cluster-admin").await.unwrap();
    let bindings = Api::<ClusterRoleBinding>::all(admin.clone());
    assert_eq!(
        bindings
            .get("cluster-admin")
            .await
            .unwrap()
            .subjects
            .unwrap()[0]
            .name,
        "system:masters"
    );

    let e = api_error(
        bindings
            .create(
                &PostParams::default(),
                &from(json!({"metadata": {"name": "b"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
                    "subjects": [{"kind": "ServiceAccount", "name": "sa"}]})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert!(
        e.message
            .contains("roleRef.kind: Unsupported value: \"Role\""),
        "{}",
        e.message
    );
    assert!(
        e.message.contains("subjects[0].namespace: Required value"),
        "{}",
        e.message
    );

    let e = api_error(
        Api::<Role>::namespaced(admin.clone(), "default")
            .create(
                &PostParams::default(),
                &from(json!({"metadata": {"name": "r"},
                    "rules": [{"nonResourceURLs": ["/healthz"], "verbs": ["get"]}, {"apiGroups": [""], "verbs": []}]})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert!(
        e.message
            .contains("namespaced rules cannot apply to non-resource URLs"),
        "{}",
        e.message
    );
    assert!(
        e.message.contains("rules[1].verbs: Required value"),
        "{}",
        e.message
    );
    assert!(
        e.message.contains("rules[1].resources: Required value"),
        "{}",
        e.message
    );

    bindings
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "b"},
                "roleRef": {"kind": "ClusterRole", "name": "view"},
                "subjects": [{"kind": "User", "name": "u"}]})),
        )
        .await
        .unwrap();
    // Subjects may change; the roleRef may not.
    bindings
        .patch(
            "b",
            &PatchParams::default(),
            &Patch::Merge(json!({"subjects": [{"kind": "User", "name": "v"}]})),
        )
        .await
        .unwrap();
    let e = api_error(
        bindings
            .patch(
                "b",
                &PatchParams::default(),
                &Patch::Merge(json!({"roleRef": {"name": "edit"}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert!(e.message.contains("cannot change roleRef"), "{}", e.message);
}
