//! Who holds a virtual node's Lease (`kube-node-lease/<node>`). Two processes started with the
//! same `--nodename` would overwrite each other's kubelet endpoint, pods and lease; the second
//! one refuses to start while the first still renews the lease.

use k8s_openapi::api::coordination::v1::LeaseSpec;
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

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
}
