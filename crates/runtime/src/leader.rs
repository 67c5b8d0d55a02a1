//! Leader election on a `coordination.k8s.io` Lease (`--leader-elect`), for the components that
//! run as several replicas of which one works: the virtual node, the descheduler and the
//! scheduler extender. The decisions are [`tensile_core::lease::elect`]; this module reads and
//! writes the Lease. Every write carries the resourceVersion read, so of two processes that
//! decide to take a free lease at the same moment only one succeeds (the other gets a conflict
//! and reads again).
//!
//! A leader renews every retry period. When it could not renew within the renew deadline, or
//! finds the lease held by another, it has lost: [`Leader::hold`] returns and the caller must
//! stop writing at once (the binary exits; Kubernetes restarts it as a standby). Because the
//! renew deadline is shorter than the lease duration, the old leader has stopped before a
//! standby may take the lease. Times in the Lease are compared with this host's clock: keep the
//! clocks of the hosts synchronised (NTP), as Kubernetes' own node leases assume.
//!
//! Not a crate: kube-leader-election 0.44 depends on kube 4; kube-lease-manager 0.13 fits kube 5
//! but is configured by a duration and a grace period (no renew deadline after which a leader
//! stops) and applies the Lease server-side instead of writing with the resourceVersion read.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tensile_core::lease::{Election, Timings, elect, release};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What `/readyz` answers while a `--leader-elect` standby waits for the Lease.
pub const STANDBY: &str = "standby: not the leader";

/// Where and as whom to run for leader.
#[derive(Clone)]
pub struct LeaderElection {
    api: Api<Lease>,
    namespace: String,
    name: String,
    identity: String,
    timings: Timings,
}

impl std::fmt::Debug for LeaderElection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElection")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("identity", &self.identity)
            .field("timings", &self.timings)
            .finish_non_exhaustive()
    }
}

/// The Prometheus gauge `tensile_leader{lease}`: 1 while this process does the component's
/// work (it holds the election Lease `lease`, as `namespace/name`, or runs without
/// `--leader-elect`, `lease` then empty), 0 while it stands by. Registered before the election
/// so that a standby reports 0: an alert on "no replica leads" needs the standbys' zeros.
#[derive(Clone, Debug)]
pub struct LeaderGauge(prometheus_client::metrics::gauge::Gauge);

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct LeaseLabel {
    lease: String,
}

impl LeaderGauge {
    /// At 0, registered in `registry` for `lease` (`namespace/name`; empty: no election).
    pub fn new(registry: &mut prometheus_client::registry::Registry, lease: &str) -> Self {
        let family = prometheus_client::metrics::family::Family::<
            LeaseLabel,
            prometheus_client::metrics::gauge::Gauge,
        >::default();
        let gauge = family.get_or_create_owned(&LeaseLabel {
            lease: lease.to_owned(),
        });
        registry.register(
            "tensile_leader",
            "1 while this process does the work (holds the election Lease named by lease, or runs without --leader-elect), 0 while it stands by",
            family,
        );
        Self(gauge)
    }

    /// This process leads (or works alone) from now on.
    pub fn set_leading(&self) {
        self.0.set(1);
    }

    /// The value served.
    pub fn get(&self) -> i64 {
        self.0.get()
    }
}

/// Leadership was lost: the process must stop writing.
#[derive(Debug, thiserror::Error)]
pub enum LostLeadership {
    /// Another process holds the lease now.
    #[error("lost leadership: the lease {namespace}/{name} is held by {holder}")]
    TakenOver {
        /// The lease's namespace.
        namespace: String,
        /// The lease's name.
        name: String,
        /// Its new holder.
        holder: String,
    },
    /// The lease could not be renewed within the renew deadline.
    #[error(
        "lost leadership: could not renew the lease {namespace}/{name} within the renew deadline ({deadline:?}): {last_error}"
    )]
    Deadline {
        /// The lease's namespace.
        namespace: String,
        /// The lease's name.
        name: String,
        /// `--leader-elect-renew-deadline`.
        deadline: Duration,
        /// What the last try met.
        last_error: String,
    },
}

/// What one write attempt met.
enum Attempt {
    /// Our lease, as written.
    Ours(Box<Lease>),
    /// Another process holds it.
    Held(tensile_core::lease::HeldBy),
    /// The write failed; try again.
    Failed(String),
}

/// This process holds the lease.
#[derive(Debug)]
pub struct Leader {
    election: LeaderElection,
    lease: Lease,
    /// When the request of the last successful write was sent: the hold counts from there.
    renewed_at: Instant,
}

impl LeaderElection {
    /// The election on `namespace/name` of the upper cluster, as `identity` (unique per
    /// process, e.g. [`holder_identity`]).
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        identity: String,
        timings: Timings,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            identity,
            timings,
        }
    }

    /// This process's identity in the lease.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    fn duration_seconds(&self) -> i32 {
        // Checked by Timings::check; a longer one is capped rather than wrapped.
        i32::try_from(self.timings.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }

    /// Reads the lease and writes it if [`elect`] says we may.
    async fn attempt(&self, known: Option<Lease>) -> Attempt {
        let current = match known {
            Some(l) => Some(l),
            None => match self.api.get_opt(&self.name).await {
                Ok(l) => l,
                Err(e) => return Attempt::Failed(format!("reading it: {e}")),
            },
        };
        let spec = current.as_ref().and_then(|l| l.spec.as_ref());
        let now = Timestamp::now();
        let decision = match elect(spec, &self.identity, now, self.duration_seconds()) {
            // The holder is this process's dead predecessor (its container restarted in the
            // same pod, or its pid gone on this host): no other process leads, take it now.
            Election::Wait(held)
                if locate(&held.holder, &self.identity)
                    == tensile_core::lease::HolderIs::DeadHere =>
            {
                tracing::info!(lease = %format!("{}/{}", self.namespace, self.name), holder = %held.holder,
                    "the election lease's holder is this process's predecessor, gone: taking it over at once");
                Election::Write(tensile_core::lease::take(
                    spec,
                    &self.identity,
                    now,
                    self.duration_seconds(),
                ))
            }
            other => other,
        };
        match decision {
            Election::Wait(held) => Attempt::Held(held),
            Election::Write(spec) => {
                let written = match current {
                    Some(mut lease) => {
                        lease.spec = Some(spec);
                        self.api
                            .replace(&self.name, &PostParams::default(), &lease)
                            .await
                    }
                    None => {
                        let lease = Lease {
                            metadata: ObjectMeta {
                                name: Some(self.name.clone()),
                                namespace: Some(self.namespace.clone()),
                                ..ObjectMeta::default()
                            },
                            spec: Some(spec),
                        };
                        self.api.create(&PostParams::default(), &lease).await
                    }
                };
                match written {
                    Ok(lease) => Attempt::Ours(Box::new(lease)),
                    // Another process wrote it since we read it: read again.
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        Attempt::Failed("another process wrote it first".to_owned())
                    }
                    Err(e) => Attempt::Failed(format!("writing it: {e}")),
                }
            }
        }
    }

    /// Waits until this process holds the lease; None when `stop` comes first. A standby reads
    /// the lease every retry period, and at the moment the holder's hold ends.
    pub async fn acquire(self, stop: &CancellationToken) -> Option<Leader> {
        let mut waiting_for: Option<String> = None;
        loop {
            let sent = Instant::now();
            let pause = match self.attempt(None).await {
                Attempt::Ours(lease) => {
                    tracing::info!(lease = %format!("{}/{}", self.namespace, self.name), identity = %self.identity, "became the leader");
                    return Some(Leader {
                        election: self,
                        lease: *lease,
                        renewed_at: sent,
                    });
                }
                Attempt::Held(held) => {
                    if waiting_for.as_deref() != Some(held.holder.as_str()) {
                        tracing::info!(lease = %format!("{}/{}", self.namespace, self.name), leader = %held.holder, "standing by: another process leads");
                        waiting_for = Some(held.holder.clone());
                    }
                    // Wake when its hold ends if that comes before the next retry.
                    let left = held.until.duration_since(Timestamp::now());
                    Duration::try_from(left)
                        .unwrap_or_default()
                        .min(self.timings.retry_period)
                }
                Attempt::Failed(why) => {
                    tracing::warn!(lease = %format!("{}/{}", self.namespace, self.name), error = %why, "leader election");
                    self.timings.retry_period
                }
            };
            tokio::select! {
                () = stop.cancelled() => return None,
                () = tokio::time::sleep(pause) => {}
            }
        }
    }
}

impl Leader {
    /// The identity that holds the lease.
    pub fn identity(&self) -> &str {
        &self.election.identity
    }

    /// Renews the lease every retry period until `stop` (then gives it up, so a standby takes
    /// over at once, and returns Ok) or until leadership is lost.
    pub async fn hold(mut self, stop: CancellationToken) -> Result<(), LostLeadership> {
        let timings = self.election.timings;
        let mut known = Some(self.lease.clone());
        loop {
            tokio::select! {
                () = stop.cancelled() => {
                    self.release().await;
                    return Ok(());
                }
                () = tokio::time::sleep(timings.retry_period) => {}
            }
            let deadline = self.renewed_at + timings.renew_deadline;
            let sent = Instant::now();
            let attempt = tokio::time::timeout_at(deadline, self.election.attempt(known.take()))
                .await
                .unwrap_or_else(|_| Attempt::Failed("the request timed out".to_owned()));
            match attempt {
                Attempt::Ours(lease) => {
                    self.lease = *lease;
                    self.renewed_at = sent;
                    known = Some(self.lease.clone());
                }
                Attempt::Held(held) => {
                    return Err(LostLeadership::TakenOver {
                        namespace: self.election.namespace.clone(),
                        name: self.election.name.clone(),
                        holder: held.holder,
                    });
                }
                Attempt::Failed(why) => {
                    if Instant::now() >= deadline {
                        return Err(LostLeadership::Deadline {
                            namespace: self.election.namespace.clone(),
                            name: self.election.name.clone(),
                            deadline: timings.renew_deadline,
                            last_error: why,
                        });
                    }
                    tracing::warn!(lease = %format!("{}/{}", self.election.namespace, self.election.name), error = %why, "renewing the leader election lease");
                }
            }
        }
    }

    /// Gives the lease up if it is still ours, best effort and briefly.
    async fn release(&self) {
        let Some(spec) = self
            .lease
            .spec
            .as_ref()
            .and_then(|s| release(s, &self.election.identity, Timestamp::now()))
        else {
            return;
        };
        let mut lease = self.lease.clone();
        lease.spec = Some(spec);
        let released = tokio::time::timeout(
            Duration::from_secs(2),
            self.election
                .api
                .replace(&self.election.name, &PostParams::default(), &lease),
        )
        .await;
        match released {
            Ok(Ok(_)) => {
                tracing::info!(lease = %format!("{}/{}", self.election.namespace, self.election.name), "gave leadership up")
            }
            Ok(Err(e)) => tracing::debug!(error = %e, "releasing the leader election lease"),
            Err(_) => tracing::debug!("releasing the leader election lease timed out"),
        }
    }
}

/// A `holderIdentity` naming this process, `<node>_<host>_<scope>_<pid>_<process>.<n>` (see
/// [`tensile_core::lease::parse_holder`]): a restarted process reads its dead predecessor's
/// back and takes the lease over at once, and two live processes for one node never take each
/// other for themselves.
pub fn holder_identity(node: &str) -> String {
    static PROCESS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static STARTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    // In a pod (POD_NAME from the downward API, as deploy/ sets it) the pod names the place:
    // its container restarts keep it, and a pod runs one container of a name at a time.
    let (host, scope) = match env("POD_NAME") {
        Some(pod) => (
            match env("POD_NAMESPACE") {
                Some(ns) => format!("{}.{}", pod.trim(), ns.trim()),
                None => pod.trim().to_owned(),
            },
            tensile_core::lease::SCOPE_POD.to_owned(),
        ),
        None => (
            env("HOSTNAME")
                .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
                .map(|h| h.trim().to_owned())
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "unknown-host".to_owned()),
            pid_scope().unwrap_or_else(|| tensile_core::lease::SCOPE_UNKNOWN.to_owned()),
        ),
    };
    let process = PROCESS.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        // std's randomly keyed hasher over the clock: enough to tell two processes of one
        // host and pid (a container restarted) apart.
        std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), nanos)
            & 0xff_ffff
    });
    let n = STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!(
        "{node}_{host}_{scope}_{}_{process:06x}.{n}",
        std::process::id()
    )
}

/// Where this process's pid means something: the kernel's boot and the PID namespace (a pid
/// of another boot or namespace says nothing here). None without procfs.
fn pid_scope() -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let boot: String = boot.trim().chars().filter(|c| *c != '-').take(8).collect();
    let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
    // "pid:[4026531836]": the namespace's inode.
    let ns: String = ns
        .to_string_lossy()
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    (!boot.is_empty() && !ns.is_empty()).then(|| format!("{boot}.{ns}"))
}

/// Whether another process with this pid runs here and may be the holder (a virtual node, a
/// descheduler, ...): it exists, is
/// not a zombie (killed, not yet reaped), and runs our program (or we cannot see which
/// program; then it may). None without procfs.
fn pid_running(pid: u32) -> Option<bool> {
    let me = std::fs::read_link("/proc/self/exe").ok()?;
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Some(false);
    };
    // "pid (comm) state ...": the state follows the last ')'.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    if matches!(state, Some('Z' | 'X')) {
        return Some(false);
    }
    Some(std::fs::read_link(format!("/proc/{pid}/exe")).map_or(true, |exe| exe == me))
}

/// Where the holder of a lease runs, seen from `me`, both identities of [`holder_identity`]
/// (another format: [`HolderIs::Elsewhere`]).
pub fn locate(holder: &str, me: &str) -> tensile_core::lease::HolderIs {
    use tensile_core::lease::{locate_holder, parse_holder};
    locate_holder(parse_holder(holder), parse_holder(me), pid_running)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pid is a possible holder only while a process of our program has it: this process
    /// is; another program, a killed and unreaped child (a zombie) or no process is not.
    #[test]
    #[allow(clippy::unwrap_used)] // test code
    fn a_pid_runs_a_possible_holder_only_while_our_program_has_it() {
        assert_eq!(pid_running(std::process::id()), Some(true));
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        assert_eq!(pid_running(child.id()), Some(false), "another program");
        child.kill().unwrap();
        let zombie = || {
            std::fs::read_to_string(format!("/proc/{}/stat", child.id())).is_ok_and(|s| {
                s.rsplit_once(')')
                    .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
            })
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !zombie() {
            assert!(std::time::Instant::now() < deadline, "the child never died");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(pid_running(child.id()), Some(false), "a zombie");
        child.wait().unwrap();
        assert_eq!(pid_running(child.id()), Some(false), "gone");
        let me = holder_identity("vk");
        let again = holder_identity("vk");
        assert_ne!(me, again);
        assert_eq!(
            locate(&again, &me),
            tensile_core::lease::HolderIs::ThisProcess,
            "{me} {again}"
        );
    }
}
