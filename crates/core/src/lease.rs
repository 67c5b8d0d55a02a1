//! Who holds a Lease. A virtual node's (`kube-node-lease/<node>`): two processes started with
//! the same `--nodename` would overwrite each other's kubelet endpoint, pods and lease; the
//! second one must not start while the first still runs. [`locate_holder`] tells a live holder
//! (refuse) from a dead predecessor on the same host or pod (take over at once) and from one
//! this process cannot look at (wait until its lease lapses). And the election Lease
//! of `--leader-elect`: [`elect`] decides, from the lease read and the time, whether this
//! process may write it (take or renew leadership) or must wait.

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// Another process's hold on the lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldBy {
    /// Its `holderIdentity`.
    pub holder: String,
    /// When it last renewed.
    pub renewed: Timestamp,
    /// Until when the hold lasts without another renewal.
    pub until: Timestamp,
}

/// Whether the lease (its spec, if it exists) is held by someone other than `me`: a holder is
/// set, it is not `me`, and its last renewal (or acquisition) is less than
/// `leaseDurationSeconds` old at `now`. An expired, released (no holder) or missing lease, or
/// one without a renewal time or duration, may be taken over.
pub fn held_by_other(spec: Option<&LeaseSpec>, me: &str, now: Timestamp) -> Option<HeldBy> {
    let spec = spec?;
    let holder = spec.holder_identity.as_deref().filter(|h| !h.is_empty())?;
    if holder == me {
        return None;
    }
    let renewed = spec
        .renew_time
        .as_ref()
        .or(spec.acquire_time.as_ref())
        .map(|t| t.0)?;
    let duration = spec.lease_duration_seconds.filter(|d| *d > 0)?;
    let until = renewed
        .checked_add(SignedDuration::from_secs(i64::from(duration)))
        .ok()?;
    (now < until).then(|| HeldBy {
        holder: holder.to_owned(),
        renewed,
        until,
    })
}

/// The parts of a `holderIdentity` written by tensile (node leases, election leases):
/// `<name>_<host>_<scope>_<pid>_<process>[.<n>]`, `name` the node's or the component's. `host` is the pod (`<name>.<namespace>`, from
/// the downward API) or the host name; `scope` says where `pid` means something: [`SCOPE_POD`]
/// (the pod's container), or the kernel boot and PID namespace (`<boot>.<pidns>`), or
/// [`SCOPE_UNKNOWN`]; `process` is random per process, so a process knows its own identities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HolderId<'a> {
    /// The node or component (a DNS name: no `_`).
    pub name: &'a str,
    /// The pod or host.
    pub host: &'a str,
    /// Where the pid is valid.
    pub scope: &'a str,
    /// The process id.
    pub pid: u32,
    /// Random per process.
    pub process: &'a str,
}

/// The scope of a holder running in a pod: the pod's own container.
pub const SCOPE_POD: &str = "pod";
/// The scope of a holder that could not tell its boot or PID namespace: its pid says nothing.
pub const SCOPE_UNKNOWN: &str = "unknown";

/// Reads a `holderIdentity` back (None: another format, e.g. an older version's or another
/// program's). The name ends at the first `_`; the rest is parsed from the right, so a host
/// name with a `_` is read whole.
pub fn parse_holder(holder: &str) -> Option<HolderId<'_>> {
    let (name, rest) = holder.split_once('_')?;
    let mut parts = rest.rsplitn(4, '_');
    let last = parts.next()?;
    let pid = parts.next()?.parse().ok()?;
    let scope = parts.next()?;
    let host = parts.next()?;
    let process = last.split_once('.').map_or(last, |(p, _)| p);
    (!name.is_empty() && !host.is_empty() && !scope.is_empty() && !process.is_empty()).then_some(
        HolderId {
            name,
            host,
            scope,
            pid,
            process,
        },
    )
}

/// Where the holder of a node's lease runs, seen from the process about to start the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HolderIs {
    /// This very process (another start of the node in it): refuse.
    ThisProcess,
    /// Another live process here (same host, same PID namespace): refuse.
    LiveHere,
    /// A process here that is gone (crashed, killed, its container restarted): take over now.
    DeadHere,
    /// Somewhere this process cannot look (another host or pod, or an identity it cannot
    /// read): wait until the lease lapses.
    Elsewhere,
}

/// Where `holder` runs, seen from `me` (both parsed by [`parse_holder`]). `running(pid)` says
/// whether another process with that pid runs here and may be the holder (None: cannot tell).
/// A pod runs one container of a name at a time, so an older process of the same pod is gone;
/// in one PID namespace a pid that is ours, or that no process has, is gone too.
pub fn locate_holder(
    holder: Option<HolderId<'_>>,
    me: Option<HolderId<'_>>,
    running: impl FnOnce(u32) -> Option<bool>,
) -> HolderIs {
    let (Some(h), Some(me)) = (holder, me) else {
        return HolderIs::Elsewhere;
    };
    if h.name != me.name || h.host != me.host || h.scope != me.scope || me.scope == SCOPE_UNKNOWN {
        return HolderIs::Elsewhere;
    }
    if h.pid == me.pid && h.process == me.process {
        return HolderIs::ThisProcess;
    }
    if me.scope == SCOPE_POD || h.pid == me.pid {
        return HolderIs::DeadHere;
    }
    match running(h.pid) {
        Some(false) => HolderIs::DeadHere,
        Some(true) | None => HolderIs::LiveHere,
    }
}

/// The three timings of `--leader-elect`, as kube-controller-manager names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timings {
    /// How long a standby waits after the last renewal before it takes the lease
    /// (`--leader-elect-lease-duration`).
    pub lease_duration: std::time::Duration,
    /// How long the leader keeps trying to renew before it gives up leadership
    /// (`--leader-elect-renew-deadline`).
    pub renew_deadline: std::time::Duration,
    /// The time between two tries, to renew or to acquire (`--leader-elect-retry-period`).
    pub retry_period: std::time::Duration,
}

impl Default for Timings {
    /// kube-controller-manager's defaults: 15 s, 10 s, 2 s.
    fn default() -> Self {
        Self {
            lease_duration: std::time::Duration::from_secs(15),
            renew_deadline: std::time::Duration::from_secs(10),
            retry_period: std::time::Duration::from_secs(2),
        }
    }
}

impl Timings {
    /// The rules that keep two leaders apart: a leader stops before its lease may be taken
    /// (renew deadline < lease duration), and tries more than once before it stops (retry
    /// period < renew deadline). Whole seconds: the Lease counts in seconds.
    pub fn check(&self) -> Result<(), String> {
        if self.lease_duration.subsec_nanos() != 0 || self.lease_duration.as_secs() == 0 {
            return Err(format!(
                "--leader-elect-lease-duration {:?} must be a whole number of seconds, at least 1",
                self.lease_duration
            ));
        }
        if i32::try_from(self.lease_duration.as_secs()).is_err() {
            return Err("--leader-elect-lease-duration is too long".to_owned());
        }
        if self.renew_deadline >= self.lease_duration {
            return Err(format!(
                "--leader-elect-renew-deadline {:?} must be shorter than --leader-elect-lease-duration {:?}: a leader that cannot renew must stop before another may take over",
                self.renew_deadline, self.lease_duration
            ));
        }
        if self.retry_period.is_zero() || self.retry_period >= self.renew_deadline {
            return Err(format!(
                "--leader-elect-retry-period {:?} must be positive and shorter than --leader-elect-renew-deadline {:?}",
                self.retry_period, self.renew_deadline
            ));
        }
        Ok(())
    }
}

/// What a process may do with an election Lease.
#[derive(Clone, Debug, PartialEq)]
pub enum Election {
    /// Write this spec: a renewal of our own hold, or the acquisition of a free or expired
    /// lease. Written with the resourceVersion read (or created when there was none), so of
    /// two processes deciding alike only one succeeds.
    Write(LeaseSpec),
    /// Another process holds it; look again by `until` at the latest.
    Wait(HeldBy),
}

/// The decision of `me` at `now` on the election Lease `spec` (None: it does not exist yet).
/// Renewing keeps `acquireTime` and the transition count; acquiring counts one transition
/// more when the lease had another holder.
pub fn elect(
    spec: Option<&LeaseSpec>,
    me: &str,
    now: Timestamp,
    lease_duration_seconds: i32,
) -> Election {
    if let Some(held) = held_by_other(spec, me, now) {
        return Election::Wait(held);
    }
    Election::Write(take(spec, me, now, lease_duration_seconds))
}

/// The spec by which `me` holds the lease from `now`: a renewal of its own hold, or an
/// acquisition (whoever held it: [`elect`] or [`locate_holder`] decided it may be taken).
pub fn take(
    spec: Option<&LeaseSpec>,
    me: &str,
    now: Timestamp,
    lease_duration_seconds: i32,
) -> LeaseSpec {
    let old = spec.cloned().unwrap_or_default();
    let ours = old.holder_identity.as_deref() == Some(me);
    let now = MicroTime(now);
    let mut new = LeaseSpec {
        holder_identity: Some(me.to_owned()),
        lease_duration_seconds: Some(lease_duration_seconds),
        renew_time: Some(now.clone()),
        ..old.clone()
    };
    if !ours {
        new.acquire_time = Some(now);
        let had_holder = old
            .holder_identity
            .as_deref()
            .is_some_and(|h| !h.is_empty());
        let transitions = old.lease_transitions.unwrap_or(0);
        new.lease_transitions = Some(if had_holder {
            transitions.saturating_add(1)
        } else {
            transitions
        });
    }
    new
}

/// The spec that gives our hold up (no holder, a duration of 1 s), so that a standby takes
/// over at its next try instead of after the lease duration; None when the lease is not ours.
pub fn release(spec: &LeaseSpec, me: &str, now: Timestamp) -> Option<LeaseSpec> {
    (spec.holder_identity.as_deref() == Some(me)).then(|| LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        renew_time: Some(MicroTime(now)),
        ..spec.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn spec(holder: Option<&str>, renewed: Option<i64>, duration: Option<i32>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            renew_time: renewed.map(|s| MicroTime(at(s))),
            lease_duration_seconds: duration,
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn a_fresh_lease_of_another_holder_is_held() {
        let s = spec(Some("vk@host-a"), Some(0), Some(40));
        let held = held_by_other(Some(&s), "vk@host-b", at(39)).unwrap();
        assert_eq!(held.holder, "vk@host-a");
        assert_eq!(held.until, at(40));
    }

    #[test]
    fn expired_released_missing_or_own_leases_may_be_taken() {
        let me = "vk@host-b";
        let now = at(40);
        for s in [
            spec(Some("vk@host-a"), Some(0), Some(40)),
            spec(None, Some(39), Some(40)),
            spec(Some(""), Some(39), Some(40)),
            spec(Some(me), Some(39), Some(40)),
            spec(Some("vk@host-a"), None, Some(40)),
            spec(Some("vk@host-a"), Some(39), None),
            spec(Some("vk@host-a"), Some(39), Some(0)),
        ] {
            assert_eq!(held_by_other(Some(&s), me, now), None, "{s:?}");
        }
        assert_eq!(held_by_other(None, me, now), None);
    }

    #[test]
    fn an_acquired_but_never_renewed_lease_counts_from_its_acquisition() {
        let s = LeaseSpec {
            holder_identity: Some("vk@host-a".into()),
            acquire_time: Some(MicroTime(at(0))),
            lease_duration_seconds: Some(40),
            ..LeaseSpec::default()
        };
        assert!(held_by_other(Some(&s), "vk@host-b", at(10)).is_some());
    }

    fn written(e: Election) -> LeaseSpec {
        match e {
            Election::Write(s) => s,
            Election::Wait(h) => panic!("expected a write, got a wait for {h:?}"),
        }
    }

    #[test]
    fn a_missing_or_free_lease_is_acquired_without_a_transition() {
        let s = written(elect(None, "b", at(5), 15));
        assert_eq!(s.holder_identity.as_deref(), Some("b"));
        assert_eq!(s.acquire_time, Some(MicroTime(at(5))));
        assert_eq!(s.renew_time, Some(MicroTime(at(5))));
        assert_eq!(s.lease_duration_seconds, Some(15));
        assert_eq!(s.lease_transitions, Some(0));
        let released = release(&s, "b", at(6)).unwrap();
        let again = written(elect(Some(&released), "c", at(6), 15));
        assert_eq!(again.holder_identity.as_deref(), Some("c"));
        assert_eq!(again.lease_transitions, Some(0));
    }

    #[test]
    fn the_holder_renews_and_keeps_its_acquisition() {
        let first = written(elect(None, "a", at(0), 15));
        let renewed = written(elect(Some(&first), "a", at(2), 15));
        assert_eq!(renewed.acquire_time, Some(MicroTime(at(0))));
        assert_eq!(renewed.renew_time, Some(MicroTime(at(2))));
        assert_eq!(renewed.lease_transitions, Some(0));
    }

    #[test]
    fn a_standby_waits_for_the_lease_duration_then_takes_over() {
        let held = written(elect(None, "a", at(0), 15));
        match elect(Some(&held), "b", at(14), 15) {
            Election::Wait(h) => {
                assert_eq!(h.holder, "a");
                assert_eq!(h.until, at(15));
            }
            Election::Write(s) => panic!("took a fresh lease: {s:?}"),
        }
        let taken = written(elect(Some(&held), "b", at(15), 15));
        assert_eq!(taken.holder_identity.as_deref(), Some("b"));
        assert_eq!(taken.acquire_time, Some(MicroTime(at(15))));
        assert_eq!(taken.lease_transitions, Some(1));
    }

    #[test]
    fn only_the_holder_releases() {
        let held = written(elect(None, "a", at(0), 15));
        assert_eq!(release(&held, "b", at(1)), None);
        let released = release(&held, "a", at(1)).unwrap();
        assert_eq!(released.holder_identity, None);
        assert_eq!(held_by_other(Some(&released), "b", at(1)), None);
    }

    #[test]
    fn timings_keep_two_leaders_apart() {
        let s = std::time::Duration::from_secs;
        assert_eq!(Timings::default().check(), Ok(()));
        let t = |d, r, p| Timings {
            lease_duration: d,
            renew_deadline: r,
            retry_period: p,
        };
        assert!(t(s(10), s(10), s(2)).check().is_err());
        assert!(t(s(15), s(10), s(10)).check().is_err());
        assert!(t(s(15), s(10), s(0)).check().is_err());
        assert!(
            t(std::time::Duration::from_millis(1500), s(1), s(0))
                .check()
                .is_err()
        );
        assert!(t(s(3), s(2), s(1)).check().is_ok());
    }

    #[test]
    fn holder_identities_are_read_back_from_the_right() {
        assert_eq!(
            parse_holder("vk_host_a.b_my_ns_1f2e3d4c.4026531836_42_0a1b2c.3"),
            Some(HolderId {
                name: "vk",
                host: "host_a.b_my_ns",
                scope: "1f2e3d4c.4026531836",
                pid: 42,
                process: "0a1b2c",
            })
        );
        assert_eq!(
            parse_holder("vk_vn-5d9f-x2.tensile_pod_1_abcdef").map(|h| (h.host, h.scope)),
            Some(("vn-5d9f-x2.tensile", SCOPE_POD))
        );
        for other in [
            "vk_test",
            "_h_s_1_p",
            "vk_h_s_notapid_p",
            "vk__s_1_p",
            "vk_h_s_1_",
            "vk@host",
            "",
        ] {
            assert_eq!(parse_holder(other), None, "{other}");
        }
    }

    #[test]
    fn a_holder_is_located_from_host_scope_pid_and_process() {
        let me = parse_holder("vk_h_b.1_100_aaaaaa.1");
        let at = parse_holder;
        let never = |_| panic!("no need to look at the pid");
        // Another start in this process.
        assert_eq!(
            locate_holder(at("vk_h_b.1_100_aaaaaa.0"), me, never),
            HolderIs::ThisProcess
        );
        // Our pid but another process: our predecessor had it and is gone.
        assert_eq!(
            locate_holder(at("vk_h_b.1_100_bbbbbb"), me, never),
            HolderIs::DeadHere
        );
        assert_eq!(
            locate_holder(at("vk_h_b.1_7_bbbbbb"), me, |_| Some(false)),
            HolderIs::DeadHere
        );
        assert_eq!(
            locate_holder(at("vk_h_b.1_7_bbbbbb"), me, |_| Some(true)),
            HolderIs::LiveHere
        );
        assert_eq!(
            locate_holder(at("vk_h_b.1_7_bbbbbb"), me, |_| None),
            HolderIs::LiveHere
        );
        // Another host, boot or PID namespace, or an identity we cannot read: wait.
        for other in [
            "vk_g_b.1_7_bbbbbb",
            "vk_h_b.2_7_bbbbbb",
            "vk2_h_b.1_7_bbbbbb",
            "vk_test",
        ] {
            assert_eq!(
                locate_holder(at(other), me, never),
                HolderIs::Elsewhere,
                "{other}"
            );
        }
        assert_eq!(
            locate_holder(at("vk_h_b.1_7_bbbbbb"), at("vk_test"), never),
            HolderIs::Elsewhere
        );
        // Without a PID namespace to compare, a pid says nothing.
        let lost = at("vk_h_unknown_100_aaaaaa.1");
        assert_eq!(
            locate_holder(at("vk_h_unknown_7_bbbbbb"), lost, never),
            HolderIs::Elsewhere
        );
    }

    #[test]
    fn an_older_container_of_the_same_pod_is_gone() {
        let me = parse_holder("vk_vn-1.ns_pod_1_aaaaaa");
        let never = |_| panic!("no need to look at the pid");
        for older in ["vk_vn-1.ns_pod_1_bbbbbb", "vk_vn-1.ns_pod_9_bbbbbb"] {
            assert_eq!(
                locate_holder(parse_holder(older), me, never),
                HolderIs::DeadHere
            );
        }
        assert_eq!(
            locate_holder(parse_holder("vk_vn-2.ns_pod_1_bbbbbb"), me, never),
            HolderIs::Elsewhere
        );
    }
}
