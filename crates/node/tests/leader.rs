//! Leader election on a Lease of a real (or simulated) API server: of two candidates one leads;
//! the other takes over only after the leader stops renewing, at once when it gives the lease
//! up; and a leader whose lease is taken by another learns it has lost.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::PostParams;
use tensile_core::lease::Timings;
use tensile_runtime::leader::{LeaderElection, LostLeadership};
use tensile_testenv::{ClusterSpec, TestEnv};
use tokio_util::sync::CancellationToken;

/// Short timings: a lease of 2 s, so a takeover is quick to wait for.
fn timings() -> Timings {
    Timings {
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1500),
        retry_period: Duration::from_millis(250),
    }
}

fn candidate(client: &kube::Client, identity: &str) -> LeaderElection {
    LeaderElection::new(
        client.clone(),
        "kube-system",
        "test-election",
        identity.to_owned(),
        timings(),
    )
}

async fn holder(client: &kube::Client) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), "kube-system")
        .get_opt("test-election")
        .await
        .unwrap()
        .and_then(|l| l.spec?.holder_identity)
}

#[tokio::test]
async fn one_leads_the_other_takes_over_when_it_stops_renewing() {
    let env = TestEnv::start_with(vec![ClusterSpec::new("upper", 0)])
        .await
        .unwrap();
    let client = env.clusters[0].client.clone();
    let never = CancellationToken::new();
    let a = candidate(&client, "a").acquire(&never).await.unwrap();
    assert_eq!(holder(&client).await.as_deref(), Some("a"));

    // b stands by while a renews: well past one lease duration.
    let renewing = CancellationToken::new();
    let a_hold = tokio::spawn(a.hold(renewing.clone()));
    let b = tokio::spawn({
        let b = candidate(&client, "b");
        let never = never.clone();
        async move { b.acquire(&never).await }
    });
    let wait_until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < wait_until {
        assert!(!b.is_finished(), "b took the lease while a renewed it");
        assert_eq!(holder(&client).await.as_deref(), Some("a"));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // a dies (its renewals stop, nothing is released): b leads within the lease duration and
    // a retry period, counted from a's last renewal.
    a_hold.abort();
    let died = Instant::now();
    let b = tokio::time::timeout(Duration::from_secs(10), b)
        .await
        .expect("b takes over")
        .unwrap()
        .unwrap();
    let took = died.elapsed();
    assert!(took <= Duration::from_secs(4), "{took:?}");
    assert_eq!(holder(&client).await.as_deref(), Some("b"));
    let lease = Api::<Lease>::namespaced(client.clone(), "kube-system")
        .get("test-election")
        .await
        .unwrap();
    assert_eq!(lease.spec.unwrap().lease_transitions, Some(1));

    // b stops: it gives the lease up, and a new candidate leads at once.
    let stop_b = CancellationToken::new();
    let b_hold = tokio::spawn(b.hold(stop_b.clone()));
    stop_b.cancel();
    b_hold.await.unwrap().unwrap();
    assert_eq!(holder(&client).await, None);
    let started = Instant::now();
    let c = candidate(&client, "c").acquire(&never).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    drop(c);

    // A process whose container restarted in its pod finds the lease of its predecessor (same
    // pod, another process), renewed just now for a minute: it takes it over at once, while
    // a candidate of another pod would wait the minute out.
    let leases = Api::<Lease>::namespaced(client.clone(), "kube-system");
    let mut lease = leases.get("test-election").await.unwrap();
    let renewed = k8s_openapi::jiff::Timestamp::now();
    let spec = lease.spec.get_or_insert_default();
    spec.holder_identity = Some("vk_vk-7f9c-abcde.ns_pod_1_bbbbbb".into());
    spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        renewed,
    ));
    spec.lease_duration_seconds = Some(60);
    leases
        .replace("test-election", &PostParams::default(), &lease)
        .await
        .unwrap();
    let other_pod = tokio::spawn({
        let other = candidate(&client, "vk_vk-7f9c-fghij.ns_pod_1_cccccc");
        let never = never.clone();
        async move { other.acquire(&never).await }
    });
    let restarted = "vk_vk-7f9c-abcde.ns_pod_1_aaaaaa";
    tokio::time::timeout(
        Duration::from_secs(30),
        candidate(&client, restarted).acquire(&never),
    )
    .await
    .expect("the restarted process takes its predecessor's lease over, not after 60 s")
    .unwrap();
    assert_eq!(holder(&client).await.as_deref(), Some(restarted));
    assert!(
        !other_pod.is_finished(),
        "the other pod's candidate led too"
    );
    other_pod.abort();
}

#[tokio::test]
async fn a_leader_whose_lease_is_taken_has_lost() {
    let env = TestEnv::start_with(vec![ClusterSpec::new("upper", 0)])
        .await
        .unwrap();
    let client = env.clusters[0].client.clone();
    let never = CancellationToken::new();
    let a = candidate(&client, "a").acquire(&never).await.unwrap();
    let hold = tokio::spawn(a.hold(CancellationToken::new()));
    // Someone else writes itself into the lease, fresh.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let mut lease = leases.get("test-election").await.unwrap();
    let spec = lease.spec.as_mut().unwrap();
    spec.holder_identity = Some("intruder".into());
    spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    leases
        .replace("test-election", &PostParams::default(), &lease)
        .await
        .unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(5), hold)
        .await
        .expect("the leader notices")
        .unwrap()
        .unwrap_err();
    match lost {
        LostLeadership::TakenOver { holder, .. } => assert_eq!(holder, "intruder"),
        other => panic!("{other}"),
    }
}
