//! `tensile bench failover`: two `tensile virtual-node --leader-elect` processes for one node;
//! the leader is killed (SIGKILL) in the middle of a burst of pods. Measures the takeover (kill
//! to the standby holding the election Lease, and to its first write: the Node's kubelet
//! endpoint pointing at it), and checks what the takeover must never do: every pod exists
//! exactly once downstairs, no lower pod of ours is deleted, every upper pod ends Running. A
//! violation is an error (exit status 1), so `crates/cli/tests/failover.rs` runs this program.

#![allow(clippy::print_stdout)] // the report is what the command prints

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use tensile_testenv::TestEnv;

use crate::plot::{Marker, Timeline};
use crate::support::{
    NODE, burst_clusters, burst_pod, free_port, holder_pid, replica, spawn_watch, wait_for, with,
};

/// Flags of `tensile bench failover`.
#[derive(Debug, clap::Args)]
pub struct FailoverArgs {
    /// Pods of the burst.
    #[arg(long, default_value_t = 200)]
    pods: usize,
    /// Concurrent creations upstairs.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Kill the leader when this many of the burst's lower pods exist (default: half).
    #[arg(long)]
    kill_after: Option<usize>,
    /// How long to wait for every upper pod to be Running after the kill.
    #[arg(long, default_value = "300s", value_parser = tensile_core::duration::parse_duration)]
    timeout: Duration,
    /// A crash restart instead: one process without --leader-elect, killed and started again
    /// at once with the same flags.
    #[arg(long)]
    restart: bool,
    /// Write an SVG timeline to this file: the burst's pods created upstairs, downstairs and
    /// Running, and those not Running yet, around the kill and the takeover.
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
}

const LEASE: &str = "tensile-virtual-node-vk";
const LEASE_NAMESPACE: &str = "kube-system";

/// What the watches saw, with when.
#[derive(Default)]
struct Seen {
    /// Lower pods of the burst by name: every UID seen.
    lower_uids: BTreeMap<String, BTreeSet<String>>,
    /// When each lower pod of the burst was first seen.
    lower_first_seen: BTreeMap<String, Instant>,
    /// Lower pods of the burst deleted (watch DELETED events).
    lower_deleted: Vec<String>,
    /// Upper pods of the burst first seen, and first seen Running.
    upper_first_seen: BTreeMap<String, Instant>,
    upper_running: BTreeMap<String, Instant>,
    /// The election Lease's holder, and since when.
    holder: Option<(String, Instant)>,
    /// The Node's kubelet port, and since when.
    kubelet_port: Option<(i32, Instant)>,
}

type Shared = Arc<Mutex<Seen>>;

/// Watches what the benchmark checks, recording into `seen`.
/// `lease` is the Lease whose holder is recorded: (namespace, name).
fn watch_all(
    env: &TestEnv,
    seen: &Shared,
    lease: (&'static str, &'static str),
) -> Vec<tokio::task::JoinHandle<()>> {
    let (upper, lower) = (
        env.clusters[0].client.clone(),
        env.clusters[1].client.clone(),
    );
    let mut tasks = Vec::new();
    let s = seen.clone();
    tasks.push(spawn_watch(
        Api::<Pod>::namespaced(lower, "default"),
        move |event| {
            let Ok(mut s) = s.lock() else { return };
            match event {
                watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                    if let (Some(name), Some(uid)) = (p.metadata.name, p.metadata.uid)
                        && name.starts_with("burst-")
                    {
                        s.lower_first_seen
                            .entry(name.clone())
                            .or_insert_with(Instant::now);
                        s.lower_uids.entry(name).or_default().insert(uid);
                    }
                }
                watcher::Event::Delete(p) => {
                    if let Some(name) = p.metadata.name.filter(|n| n.starts_with("burst-")) {
                        s.lower_deleted.push(name);
                    }
                }
                watcher::Event::Init | watcher::Event::InitDone => {}
            }
        },
    ));
    let s = seen.clone();
    tasks.push(spawn_watch(
        Api::<Pod>::namespaced(upper.clone(), "default"),
        move |event| {
            if let watcher::Event::Apply(p) | watcher::Event::InitApply(p) = event
                && let Some(name) = p.metadata.name.clone()
                && let Ok(mut s) = s.lock()
            {
                let now = Instant::now();
                s.upper_first_seen.entry(name.clone()).or_insert(now);
                if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
                    s.upper_running.entry(name).or_insert(now);
                }
            }
        },
    ));
    let s = seen.clone();
    tasks.push(spawn_watch(
        Api::<Lease>::namespaced(upper.clone(), lease.0),
        move |event| {
            let (watcher::Event::Apply(l) | watcher::Event::InitApply(l)) = event else {
                return;
            };
            if l.metadata.name.as_deref() != Some(lease.1) {
                return;
            }
            let holder = l.spec.and_then(|s| s.holder_identity).unwrap_or_default();
            if let Ok(mut s) = s.lock()
                && s.holder.as_ref().map(|(h, _)| h) != Some(&holder)
            {
                s.holder = Some((holder, Instant::now()));
            }
        },
    ));
    let s = seen.clone();
    tasks.push(spawn_watch(Api::<Node>::all(upper), move |event| {
        let (watcher::Event::Apply(n) | watcher::Event::InitApply(n)) = event else {
            return;
        };
        if n.metadata.name.as_deref() != Some(NODE) {
            return;
        }
        let port = n
            .status
            .and_then(|s| s.daemon_endpoints)
            .and_then(|d| d.kubelet_endpoint)
            .map(|e| e.port);
        if let (Some(port), Ok(mut s)) = (port, s.lock())
            && s.kubelet_port.map(|(p, _)| p) != Some(port)
        {
            s.kubelet_port = Some((port, Instant::now()));
        }
    }));
    tasks
}

pub async fn run(args: FailoverArgs) -> anyhow::Result<()> {
    if args.restart {
        return run_restart(args).await;
    }
    let n = args.pods;
    let kill_after = args.kill_after.unwrap_or(n / 2).clamp(1, n.max(1));
    let env = burst_clusters(n).await?;
    let seen: Shared = Arc::default();
    let watches = watch_all(&env, &seen, (LEASE_NAMESPACE, LEASE));
    let logs = [
        env.dir().join("replica-a.log"),
        env.dir().join("replica-b.log"),
    ];
    let ports = [free_port()?, free_port()?];
    let metrics_ports = [free_port()?, free_port()?];

    // The first replica leads once it registered the node with its kubelet port.
    let mut a = holding_replica(
        (&env, &seen, &logs),
        0,
        (ports[0], metrics_ports[0]),
        Some("vk-a"),
    )
    .await?;
    let mut b = replica(
        &env,
        &env.clusters[1].kubeconfig,
        &logs[1],
        ports[1],
        metrics_ports[1],
        Some("vk-b"),
    )?;
    let b_pid = b.id().context("replica b exited at once")?;
    wait_for("replica b to stand by", 60, &logs, || {
        Ok(std::fs::read_to_string(&logs[1])?.contains("standing by"))
    })
    .await?;
    // The probes: the standby is alive and not ready, the leader ready.
    let probe = |i: usize, path: &'static str| {
        tensile_testenv::http_get(SocketAddr::from(([127, 0, 0, 1], metrics_ports[i])), path)
    };
    let standby_probes = (
        probe(1, "/healthz").await.context("replica b's /healthz")?,
        probe(1, "/readyz").await.context("replica b's /readyz")?,
    );
    if standby_probes
        != (
            (200, "ok".into()),
            (503, tensile_runtime::leader::STANDBY.into()),
        )
    {
        bail!("the standby answers its probes with {standby_probes:?}");
    }
    let leader_ready = probe(0, "/readyz").await.context("replica a's /readyz")?;
    if leader_ready.0 != 200 {
        bail!("the leader answers /readyz with {leader_ready:?}");
    }

    let concurrency = args.concurrency.max(1);
    let (burst, start, killed, (lower_at_kill, running_at_kill)) =
        burst_then_kill((&env, &seen, &logs), &mut a, (n, concurrency, kill_after)).await?;

    wait_for("replica b to take the lease over", 60, &logs, || {
        with(&seen, |s| {
            s.holder.as_ref().and_then(|(h, _)| holder_pid(h)) == Some(b_pid)
        })
    })
    .await?;
    wait_for(
        "the node's kubelet endpoint to point at replica b",
        60,
        &logs,
        || {
            with(&seen, |s| {
                s.kubelet_port.map(|(p, _)| p) == Some(i32::from(ports[1]))
            })
        },
    )
    .await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match probe(1, "/readyz").await {
            Ok((200, _)) => break,
            other if Instant::now() > deadline => {
                bail!("the new leader answers /readyz with {other:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let (all_running, lower) = burst_done(
        burst,
        (n, args.timeout.as_secs()),
        (&env, &seen, &logs),
        (&mut b, "the new leader"),
        killed,
    )
    .await?;
    let (acquired, first_write) = with(&seen, |s| {
        let at = |t: Instant| t.saturating_duration_since(killed);
        (
            s.holder.as_ref().map(|(_, t)| at(*t)),
            s.kubelet_port.map(|(_, t)| at(t)),
        )
    })?;
    for w in watches {
        w.abort();
    }
    let _ = b.kill().await;

    println!(
        "failover benchmark on {}: {n} pods ({concurrency} concurrent creates) upstairs through one virtual node run by 2 replicas with --leader-elect (defaults: lease 15s, renew deadline 10s, retry 2s)",
        backend()
    );
    println!(
        "leader killed (SIGKILL) {:.2?} into the burst, with {lower_at_kill} lower pods created and {running_at_kill} upper pods Running",
        killed.saturating_duration_since(start)
    );
    let secs = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64());
    println!(
        "takeover: kill -> election lease held by the standby {:.2} s",
        secs(acquired)
    );
    println!(
        "takeover: kill -> first write of the new leader (node kubelet endpoint rewritten) {:.2} s",
        secs(first_write)
    );
    println!(
        "kill -> all {n} upper pods Running {:.2} s",
        all_running.as_secs_f64()
    );
    if let Some(path) = &args.plot {
        let at = |after: Option<Duration>| {
            (killed + after.unwrap_or_default())
                .saturating_duration_since(start)
                .as_secs_f64()
        };
        let markers = vec![
            Marker {
                label: "leader killed".into(),
                at: at(Some(Duration::ZERO)),
            },
            Marker {
                label: format!("standby holds the Lease (+{:.1} s)", secs(acquired)),
                at: at(acquired),
            },
            Marker {
                label: format!("its first write (+{:.1} s)", secs(first_write)),
                at: at(first_write),
            },
        ];
        let title = format!(
            "tensile bench failover: {n} pods, two replicas with --leader-elect ({}, {} build)",
            backend_short(),
            crate::plot::build()
        );
        write_plot(path, title, &seen, start, markers)?;
    }
    lower.check(n)
}

/// Writes the timeline of `--plot`: the burst's pods from `start` on, with `markers`.
fn write_plot(
    path: &std::path::Path,
    title: String,
    seen: &Shared,
    start: Instant,
    markers: Vec<Marker>,
) -> anyhow::Result<()> {
    let since = |m: &BTreeMap<String, Instant>| -> Vec<f64> {
        m.iter()
            .filter(|(name, _)| name.starts_with("burst-"))
            .map(|(_, t)| t.saturating_duration_since(start).as_secs_f64())
            .collect()
    };
    let panels = with(seen, |s| {
        crate::plot::burst_panels(
            &since(&s.upper_first_seen),
            &since(&s.lower_first_seen),
            &since(&s.upper_running),
        )
    })?;
    let svg = crate::plot::timeline(&Timeline {
        title,
        x_desc: "seconds since the burst began".into(),
        panels,
        spans: Vec::new(),
        markers,
        alarms: None,
    })?;
    crate::plot::write(path, &svg)?;
    println!("timeline written to {}", path.display());
    Ok(())
}

/// The burst's lower pods at the end: listed now, and what the watch saw.
struct LowerPods {
    listed: usize,
    seen: usize,
    twice: Vec<String>,
    deleted: Vec<String>,
}

impl LowerPods {
    /// The lower cluster as it is now, by one LIST, against what the watch saw.
    async fn now(env: &TestEnv, seen: &Shared) -> anyhow::Result<Self> {
        let listed = Api::<Pod>::namespaced(env.clusters[1].client.clone(), "default")
            .list(&kube::api::ListParams::default())
            .await
            .context("listing the lower pods")?;
        let listed = listed
            .items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .filter(|n| n.starts_with("burst-"))
            .count();
        with(seen, |s| Self {
            listed,
            seen: s.lower_uids.len(),
            twice: s
                .lower_uids
                .iter()
                .filter(|(_, uids)| uids.len() > 1)
                .map(|(n, _)| n.clone())
                .collect(),
            deleted: s.lower_deleted.clone(),
        })
    }

    /// Prints the last line of the report; an error when a pod is missing, doubled or deleted.
    fn check(&self, n: usize) -> anyhow::Result<()> {
        println!(
            "lower pods: {} listed, {} seen, {} created more than once, {} deleted",
            self.listed,
            self.seen,
            self.twice.len(),
            self.deleted.len()
        );
        if self.listed != n || self.seen != n {
            bail!(
                "expected {n} lower pods, listed {} and seen {}",
                self.listed,
                self.seen
            );
        }
        if !self.twice.is_empty() {
            bail!("lower pods created more than once: {:?}", self.twice);
        }
        if !self.deleted.is_empty() {
            bail!("lower pods deleted during the failover: {:?}", self.deleted);
        }
        Ok(())
    }
}

/// `--restart`: one `tensile virtual-node` without `--leader-elect`, killed (SIGKILL) in the
/// middle of the burst and started again at once with the same flags, as an operator or a
/// container restart would. Its predecessor gone, it takes the node lease over at once. Before,
/// a second process started while the first runs must be refused.
async fn run_restart(args: FailoverArgs) -> anyhow::Result<()> {
    let n = args.pods;
    let kill_after = args.kill_after.unwrap_or(n / 2).clamp(1, n.max(1));
    let env = burst_clusters(n).await?;
    let seen: Shared = Arc::default();
    let watches = watch_all(&env, &seen, ("kube-node-lease", NODE));
    let logs = [env.dir().join("first.log"), env.dir().join("restarted.log")];
    let (port, metrics_port) = (free_port()?, free_port()?);
    let mut a = holding_replica((&env, &seen, &logs), 0, (port, metrics_port), None).await?;
    // A second live process with the same flags on this host is refused, before it serves or
    // writes anything.
    let second_log = env.dir().join("second.log");
    let mut second = replica(
        &env,
        &env.clusters[1].kubeconfig,
        &second_log,
        port,
        metrics_port,
        None,
    )?;
    let status = tokio::time::timeout(Duration::from_secs(60), second.wait())
        .await
        .context("a second process for the node did not exit")?
        .context("waiting for the second process")?;
    let refusal = std::fs::read_to_string(&second_log).unwrap_or_default();
    if status.success() || !refusal.contains("already run by another process") {
        bail!("a second process for the node was not refused ({status}):\n{refusal}");
    }
    let concurrency = args.concurrency.max(1);
    let (burst, start, killed, (lower_at_kill, running_at_kill)) =
        burst_then_kill((&env, &seen, &logs), &mut a, (n, concurrency, kill_after)).await?;
    // What the dead process created, by one LIST: the first create of the new one is the first
    // pod seen that is not among them (a watch event of the old one may come late).
    let before: BTreeSet<String> =
        Api::<Pod>::namespaced(env.clusters[1].client.clone(), "default")
            .list(&kube::api::ListParams::default())
            .await
            .context("listing the lower pods after the kill")?
            .items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
    let mut b = replica(
        &env,
        &env.clusters[1].kubeconfig,
        &logs[1],
        port,
        metrics_port,
        None,
    )?;
    let restarted = Instant::now();
    let b_pid = b.id().context("the restarted process exited at once")?;
    wait_for(
        "the restarted process to hold the node lease",
        60,
        &logs,
        || {
            if let Some(status) = b.try_wait()? {
                bail!("the restarted process exited: {status}");
            }
            with(&seen, |s| {
                s.holder.as_ref().and_then(|(h, _)| holder_pid(h)) == Some(b_pid)
            })
        },
    )
    .await?;
    let (all_running, lower) = burst_done(
        burst,
        (n, args.timeout.as_secs()),
        (&env, &seen, &logs),
        (&mut b, "the restarted process"),
        restarted,
    )
    .await?;
    let (lease, first_create) = with(&seen, |s| {
        let after = |t: Instant| t.checked_duration_since(restarted);
        (
            s.holder.as_ref().and_then(|(_, t)| after(*t)),
            s.lower_first_seen
                .iter()
                .filter(|(name, _)| !before.contains(*name))
                .filter_map(|(_, t)| after(*t))
                .min(),
        )
    })?;
    for w in watches {
        w.abort();
    }
    let _ = b.kill().await;
    println!(
        "restart benchmark on {}: {n} pods ({concurrency} concurrent creates) upstairs through one virtual node (no --leader-elect)",
        backend()
    );
    println!("a second live process for the node on this host: refused ({status})");
    println!(
        "killed (SIGKILL) {:.2?} into the burst, with {lower_at_kill} lower pods created and {running_at_kill} upper pods Running; restarted {:.2?} after the kill",
        killed.saturating_duration_since(start),
        restarted.saturating_duration_since(killed)
    );
    let secs = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64());
    println!(
        "restart -> node lease held by the new process {:.2} s",
        secs(lease)
    );
    println!(
        "restart -> first lower pod created {:.2} s",
        secs(first_create)
    );
    println!(
        "restart -> all {n} upper pods Running {:.2} s",
        all_running.as_secs_f64()
    );
    if let Some(path) = &args.plot {
        let at = |t: Instant| t.saturating_duration_since(start).as_secs_f64();
        let mut markers = vec![
            Marker {
                label: "killed".into(),
                at: at(killed),
            },
            Marker {
                label: format!(
                    "restarted (+{:.1} s)",
                    restarted.saturating_duration_since(killed).as_secs_f64()
                ),
                at: at(restarted),
            },
        ];
        for (what, after) in [
            ("node lease held", lease),
            ("first lower create", first_create),
        ] {
            if let Some(after) = after {
                markers.push(Marker {
                    label: format!("{what} (+{:.1} s after the restart)", after.as_secs_f64()),
                    at: at(restarted + after),
                });
            }
        }
        let title = format!(
            "tensile bench failover --restart: {n} pods, one process killed and restarted ({}, {} build)",
            backend_short(),
            crate::plot::build()
        );
        write_plot(path, title, &seen, start, markers)?;
    }
    lower.check(n)
}

/// Which backend the clusters run on, for a plot's title.
fn backend_short() -> &'static str {
    if tensile_testenv::real::bin_dir().is_some() {
        "real control planes"
    } else {
        "simulated clusters"
    }
}

/// Which backend the clusters run on, for the report.
fn backend() -> &'static str {
    if tensile_testenv::real::bin_dir().is_some() {
        "real control planes (TENSILE_K8S_BIN)"
    } else {
        "simulated clusters"
    }
}

/// Starts replica `i` (log `logs[i]`) and waits until it holds the watched lease and has
/// registered the node with its kubelet port.
async fn holding_replica(
    (env, seen, logs): (&TestEnv, &Shared, &[PathBuf]),
    i: usize,
    (port, metrics_port): (u16, u16),
    pod_name: Option<&str>,
) -> anyhow::Result<tokio::process::Child> {
    let child = replica(
        env,
        &env.clusters[1].kubeconfig,
        &logs[i],
        port,
        metrics_port,
        pod_name,
    )?;
    let pid = child.id().context("the process exited at once")?;
    wait_for(
        "the process to hold the lease and register the node",
        60,
        logs,
        || {
            with(seen, |s| {
                s.holder.as_ref().and_then(|(h, _)| holder_pid(h)) == Some(pid)
                    && s.kubelet_port.map(|(p, _)| p) == Some(i32::from(port))
            })
        },
    )
    .await?;
    Ok(child)
}

/// Starts a burst of `n` pods and kills (SIGKILL) `victim` once `kill_after` lower pods exist:
/// the burst, when it started, when the kill was, and the lower pods created and upper pods
/// Running at the kill.
async fn burst_then_kill(
    (env, seen, logs): (&TestEnv, &Shared, &[PathBuf]),
    victim: &mut tokio::process::Child,
    (n, concurrency, kill_after): (usize, usize, usize),
) -> anyhow::Result<(
    tokio::task::JoinHandle<usize>,
    Instant,
    Instant,
    (usize, usize),
)> {
    let burst = burst(env, n, concurrency);
    let start = Instant::now();
    wait_for(
        &format!("{kill_after} lower pods before the kill"),
        120,
        logs,
        || with(seen, |s| s.lower_uids.len() >= kill_after),
    )
    .await?;
    victim.start_kill().context("killing the process")?;
    let killed = Instant::now();
    let at_kill = with(seen, |s| (s.lower_uids.len(), s.upper_running.len()))?;
    let _ = victim.wait().await;
    Ok((burst, start, killed, at_kill))
}

/// The end of a burst through the surviving process `b`: every pod created upstairs, all
/// Running (within `secs`), `b` still running; how long after `since` that was, and the lower
/// pods then.
async fn burst_done(
    burst: tokio::task::JoinHandle<usize>,
    (n, secs): (usize, u64),
    (env, seen, logs): (&TestEnv, &Shared, &[PathBuf]),
    (b, who): (&mut tokio::process::Child, &str),
    since: Instant,
) -> anyhow::Result<(Duration, LowerPods)> {
    let failures = burst.await.context("the burst task")?;
    if failures > 0 {
        bail!("{failures} pod creations failed upstairs");
    }
    wait_for(&format!("all {n} upper pods Running"), secs, logs, || {
        with(seen, |s| s.upper_running.len() >= n)
    })
    .await?;
    let all_running = since.elapsed();
    if let Some(status) = b.try_wait()? {
        bail!("{who} exited: {status}");
    }
    Ok((all_running, LowerPods::now(env, seen).await?))
}

/// Creates `n` pods upstairs, `concurrency` at a time, in the background; counts the failures.
fn burst(env: &TestEnv, n: usize, concurrency: usize) -> tokio::task::JoinHandle<usize> {
    let creator: Api<Pod> = Api::namespaced(env.clusters[0].client.clone(), "default");
    tokio::spawn(async move {
        futures::stream::iter(0..n)
            .map(|i| {
                let api = creator.clone();
                async move {
                    let pod = burst_pod(&format!("burst-{i}"), None)?;
                    api.create(&PostParams::default(), &pod).await?;
                    anyhow::Ok(())
                }
            })
            .buffer_unordered(concurrency)
            .filter(|r| futures::future::ready(r.is_err()))
            .count()
            .await
    })
}
