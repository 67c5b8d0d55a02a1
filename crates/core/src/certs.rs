//! When a serving certificate kept in a Secret (`--tls-secret`) is renewed, and when its CA is.
//! Functions of the validity periods read from the certificates and the time; the Secret, the
//! keys and the signing are `tensile_placement::tls_secret`.
//!
//! The Secret holds a bundle of CAs (`ca.crt`, their keys in `ca.key`) and one serving
//! certificate (`tls.crt`/`tls.key`) signed by one of them:
//!
//! - The serving certificate is renewed, by the same CA, once less than
//!   [`LEAF_RENEW_PERCENT`] of its lifetime remains (kubelet renews its own between 70 % and 90 %
//!   of its lifetime; cert-manager at two thirds). A year's certificate is renewed about three
//!   months before it expires, so a renewal that keeps failing has months to be noticed.
//! - The next CA joins the bundle once the newest has less than [`CA_NEXT_PERCENT`] of its
//!   lifetime left (two years of ten). The serving certificate stays signed by the old CA: clients
//!   that trust the bundle get the new CA first (the webhook's `caBundle` at once,
//!   kube-scheduler's `caData` when an operator copies it).
//! - Once the old CA has less than [`CA_SWITCH_PERCENT`] left (the last year), the serving
//!   certificate is issued again by the new one. Clients that took the bundle since it changed
//!   keep working; the old CA stays in the bundle until it expires, then leaves it.
//!
//! A CA that joins the bundle, a serving certificate signed by a CA that is not the one to sign
//! with, one that lacks a name the server answers to, and an expired one are renewed at once;
//! nothing else is written. Every replica decides alike from the same Secret, and the one that
//! writes first wins (the others' writes carry an older resourceVersion and are refused).

use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// The serving certificate is renewed once less than this percentage of its lifetime remains.
pub const LEAF_RENEW_PERCENT: i64 = 25;
/// A new CA joins the bundle once the newest has less than this percentage of its lifetime left.
pub const CA_NEXT_PERCENT: i64 = 20;
/// The serving certificate is signed by a CA only while it has at least this percentage of its
/// lifetime left and a newer CA exists; it is signed by the newer one after.
pub const CA_SWITCH_PERCENT: i64 = 10;

/// How long what is issued lasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Lifetime of a CA.
    pub ca_lifetime: SignedDuration,
    /// Lifetime of a serving certificate (cut at its CA's end).
    pub leaf_lifetime: SignedDuration,
    /// How far in the past a certificate's validity starts, so that a replica whose clock is
    /// a little behind the writer's already accepts it.
    pub backdate: SignedDuration,
}

impl Default for Policy {
    /// Ten years for a CA, one for a serving certificate, five minutes of clock skew.
    fn default() -> Self {
        Self {
            ca_lifetime: SignedDuration::from_hours(24 * 3650),
            leaf_lifetime: SignedDuration::from_hours(24 * 365),
            backdate: SignedDuration::from_mins(5),
        }
    }
}

/// A certificate's validity period (`notBefore`, `notAfter`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    /// First valid instant.
    pub not_before: Timestamp,
    /// Last valid instant.
    pub not_after: Timestamp,
}

impl Validity {
    /// Seconds from `not_before` to `not_after` (at least 1).
    fn lifetime(&self) -> i64 {
        (self.not_after.as_second() - self.not_before.as_second()).max(1)
    }

    /// The instant when less than `percent` of the lifetime is left.
    fn threshold(&self, percent: i64) -> Timestamp {
        let before = self.lifetime().saturating_mul(percent) / 100;
        Timestamp::from_second(self.not_after.as_second().saturating_sub(before))
            .unwrap_or(self.not_after)
    }

    /// Whether less than `percent` of the lifetime is left at `now`.
    fn below(&self, percent: i64, now: Timestamp) -> bool {
        now >= self.threshold(percent)
    }

    /// Whether it has ended at `now`.
    fn expired(&self, now: Timestamp) -> bool {
        now >= self.not_after
    }
}

/// The serving certificate found in the Secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leaf {
    /// Its validity.
    pub validity: Validity,
    /// The CA of the bundle that signed it (index into [`Observed::cas`]), if any.
    pub issuer: Option<usize>,
    /// Whether it is valid for every name the server answers to.
    pub has_names: bool,
}

/// What the Secret holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observed<'a> {
    /// The CAs of the bundle, in its order.
    pub cas: &'a [Validity],
    /// The serving certificate, if there is a readable one.
    pub leaf: Option<Leaf>,
}

/// Which CA is to sign the serving certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signer {
    /// A CA of the bundle (index into [`Observed::cas`]).
    Existing(usize),
    /// The CA that [`Plan::add_ca`] asks for.
    New,
}

/// Why the serving certificate is issued again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// There is none (or it cannot be read).
    Missing,
    /// It has expired.
    Expired,
    /// Less than [`LEAF_RENEW_PERCENT`] of its lifetime is left.
    Due,
    /// It is signed by another CA than the one to sign with.
    OtherCa,
    /// It lacks a name the server answers to.
    Names,
}

impl std::fmt::Display for Renewal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Missing => "there is no readable serving certificate",
            Self::Expired => "the serving certificate has expired",
            Self::Due => "the serving certificate is near its end",
            Self::OtherCa => "the serving certificate is to be signed by another CA",
            Self::Names => "the serving certificate lacks a name",
        })
    }
}

/// What to change in the Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Generate a CA and add it to the bundle.
    pub add_ca: bool,
    /// The CAs to remove from the bundle (expired), indexes into [`Observed::cas`].
    pub drop_cas: Vec<usize>,
    /// Issue the serving certificate again, for this reason, signed by [`Plan::signer`].
    pub renew: Option<Renewal>,
    /// The CA that signs serving certificates.
    pub signer: Signer,
    /// When to decide again if the Secret does not change meanwhile: the next instant something
    /// falls due.
    pub next: Timestamp,
}

impl Plan {
    /// Whether the Secret is to be written.
    pub fn writes(&self) -> bool {
        self.add_ca || !self.drop_cas.is_empty() || self.renew.is_some()
    }
}

/// What to do with `observed` at `now`.
pub fn plan(observed: &Observed<'_>, now: Timestamp, policy: &Policy) -> Plan {
    let cas = observed.cas;
    let drop_cas: Vec<usize> = (0..cas.len()).filter(|&i| cas[i].expired(now)).collect();
    let live: Vec<usize> = (0..cas.len()).filter(|i| !drop_cas.contains(i)).collect();
    let newest = live.iter().copied().max_by_key(|&i| cas[i].not_after);
    let add_ca = newest.is_none_or(|n| cas[n].below(CA_NEXT_PERCENT, now));
    // The oldest CA with enough life left signs; when none has, the newest (the new one, which
    // `add_ca` brings whenever every live CA is that close to its end).
    let mut by_age = live.clone();
    by_age.sort_by_key(|&i| cas[i].not_after);
    let signer = match by_age
        .iter()
        .copied()
        .find(|&i| !cas[i].below(CA_SWITCH_PERCENT, now))
    {
        Some(i) => Signer::Existing(i),
        None if add_ca => Signer::New,
        None => newest.map_or(Signer::New, Signer::Existing),
    };
    let renew = match observed.leaf {
        None => Some(Renewal::Missing),
        Some(leaf) if leaf.validity.expired(now) => Some(Renewal::Expired),
        Some(leaf) if leaf.issuer.map(Signer::Existing) != Some(signer) => Some(Renewal::OtherCa),
        Some(leaf) if !leaf.has_names => Some(Renewal::Names),
        Some(leaf) if leaf.validity.below(LEAF_RENEW_PERCENT, now) => Some(Renewal::Due),
        Some(_) => None,
    };
    let mut next = Vec::new();
    for &i in &live {
        next.extend([
            cas[i].threshold(CA_NEXT_PERCENT),
            cas[i].threshold(CA_SWITCH_PERCENT),
            cas[i].not_after,
        ]);
    }
    if let Some(leaf) = observed.leaf {
        next.extend([
            leaf.validity.threshold(LEAF_RENEW_PERCENT),
            leaf.validity.not_after,
        ]);
    }
    let next = next
        .into_iter()
        .filter(|t| *t > now)
        .min()
        .unwrap_or_else(|| now.saturating_add(policy.leaf_lifetime).unwrap_or(now));
    Plan {
        add_ca,
        drop_cas,
        renew,
        signer,
        next,
    }
}

/// When a CA valid for `ca` stops signing serving certificates if a newer CA is in the bundle
/// by then: what clients that were given the CA by hand must take the new bundle before.
pub fn signing_ends(ca: &Validity) -> Timestamp {
    ca.threshold(CA_SWITCH_PERCENT)
}

/// The validity of a CA issued at `now`.
pub fn ca_validity(now: Timestamp, policy: &Policy) -> Validity {
    Validity {
        not_before: now.saturating_sub(policy.backdate).unwrap_or(now),
        not_after: now.saturating_add(policy.ca_lifetime).unwrap_or(now),
    }
}

/// The validity of a serving certificate issued at `now` by a CA valid for `signer`: it ends
/// with its CA at the latest.
pub fn leaf_validity(now: Timestamp, policy: &Policy, signer: &Validity) -> Validity {
    let not_after = now.saturating_add(policy.leaf_lifetime).unwrap_or(now);
    Validity {
        not_before: now.saturating_sub(policy.backdate).unwrap_or(now),
        not_after: not_after.min(signer.not_after),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86_400;
    const YEAR: i64 = 365 * DAY;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).unwrap()
    }

    fn valid(from: i64, to: i64) -> Validity {
        Validity {
            not_before: at(from),
            not_after: at(to),
        }
    }

    fn leaf(from: i64, to: i64, issuer: usize) -> Option<Leaf> {
        Some(Leaf {
            validity: valid(from, to),
            issuer: Some(issuer),
            has_names: true,
        })
    }

    #[test]
    fn an_empty_secret_gets_a_ca_and_a_certificate_it_signs() {
        let p = plan(
            &Observed {
                cas: &[],
                leaf: None,
            },
            at(0),
            &Policy::default(),
        );
        assert!(p.add_ca && p.writes());
        assert_eq!(p.signer, Signer::New);
        assert_eq!(p.renew, Some(Renewal::Missing));
    }

    #[test]
    fn a_fresh_certificate_is_kept_and_the_next_look_is_when_a_quarter_is_left() {
        let cas = [valid(0, 10 * YEAR)];
        let p = plan(
            &Observed {
                cas: &cas,
                leaf: leaf(0, 400 * DAY, 0),
            },
            at(DAY),
            &Policy::default(),
        );
        assert!(!p.writes(), "{p:?}");
        assert_eq!(p.signer, Signer::Existing(0));
        assert_eq!(p.next, at(300 * DAY));
    }

    #[test]
    fn the_certificate_is_renewed_by_the_same_ca_once_less_than_a_quarter_is_left() {
        let cas = [valid(0, 10 * YEAR)];
        let obs = Observed {
            cas: &cas,
            leaf: leaf(0, 400 * DAY, 0),
        };
        let policy = Policy::default();
        assert_eq!(plan(&obs, at(300 * DAY - 1), &policy).renew, None);
        let p = plan(&obs, at(300 * DAY), &policy);
        assert_eq!(p.renew, Some(Renewal::Due));
        assert_eq!(p.signer, Signer::Existing(0));
        assert!(!p.add_ca && p.drop_cas.is_empty());
        assert_eq!(
            plan(&obs, at(400 * DAY), &policy).renew,
            Some(Renewal::Expired)
        );
    }

    #[test]
    fn a_certificate_without_every_name_or_of_an_unknown_ca_is_renewed() {
        let cas = [valid(0, 10 * YEAR)];
        let mut obs = Observed {
            cas: &cas,
            leaf: leaf(0, YEAR, 0),
        };
        if let Some(l) = obs.leaf.as_mut() {
            l.has_names = false;
        }
        let policy = Policy::default();
        assert_eq!(plan(&obs, at(DAY), &policy).renew, Some(Renewal::Names));
        if let Some(l) = obs.leaf.as_mut() {
            l.has_names = true;
            l.issuer = None;
        }
        assert_eq!(plan(&obs, at(DAY), &policy).renew, Some(Renewal::OtherCa));
    }

    /// The CA's whole life: alone, then with its successor in the bundle while it still signs,
    /// then signing no more, then gone.
    #[test]
    fn a_ca_near_its_end_is_joined_by_the_next_then_replaced_with_an_overlap() {
        let policy = Policy::default();
        let old = valid(0, 10 * YEAR);
        // Eight years on: the next CA joins, the old one keeps signing.
        let cas = [old];
        let p = plan(
            &Observed {
                cas: &cas,
                leaf: leaf(7 * YEAR + 200 * DAY, 8 * YEAR + 200 * DAY, 0),
            },
            at(8 * YEAR),
            &policy,
        );
        assert!(p.add_ca);
        assert_eq!(p.signer, Signer::Existing(0));
        assert_eq!(p.renew, None, "clients must learn the new CA first");
        // Between eight and nine years: both in the bundle, still the old one signs.
        let new = valid(8 * YEAR, 18 * YEAR);
        let cas = [old, new];
        let leaf_of_old = leaf(8 * YEAR + 330 * DAY, 9 * YEAR + 330 * DAY, 0);
        let p = plan(
            &Observed {
                cas: &cas,
                leaf: leaf_of_old,
            },
            at(8 * YEAR + 331 * DAY),
            &policy,
        );
        assert!(!p.writes(), "{p:?}");
        assert_eq!(p.next, at(9 * YEAR), "wakes when the old CA stops signing");
        // Nine years: the new one signs; the certificate is issued again at once.
        let p = plan(
            &Observed {
                cas: &cas,
                leaf: leaf_of_old,
            },
            at(9 * YEAR),
            &policy,
        );
        assert_eq!(p.signer, Signer::Existing(1));
        assert_eq!(p.renew, Some(Renewal::OtherCa));
        assert!(
            !p.add_ca && p.drop_cas.is_empty(),
            "the old CA stays trusted"
        );
        // Ten years: the old CA leaves the bundle.
        let p = plan(
            &Observed {
                cas: &cas,
                leaf: leaf(9 * YEAR + 100 * DAY, 10 * YEAR + 100 * DAY, 1),
            },
            at(10 * YEAR),
            &policy,
        );
        assert_eq!(p.drop_cas, [0]);
        assert_eq!(p.signer, Signer::Existing(1));
        assert_eq!(p.renew, None);
        assert!(!p.add_ca);
    }

    #[test]
    fn a_bundle_of_expired_cas_starts_again() {
        let cas = [valid(0, YEAR)];
        let p = plan(
            &Observed {
                cas: &cas,
                leaf: leaf(0, YEAR, 0),
            },
            at(2 * YEAR),
            &Policy::default(),
        );
        assert!(p.add_ca);
        assert_eq!(p.drop_cas, [0]);
        assert_eq!(p.signer, Signer::New);
        assert_eq!(p.renew, Some(Renewal::Expired));
    }

    #[test]
    fn what_a_plan_writes_is_what_the_next_plan_keeps() {
        // After each write the replicas must agree there is nothing more to do, or they would
        // write for ever.
        let policy = Policy::default();
        for now in [0, 100 * DAY, 8 * YEAR, 9 * YEAR + DAY, 10 * YEAR + DAY] {
            let now = at(now);
            let cas = [valid(0, 10 * YEAR), valid(8 * YEAR, 18 * YEAR)];
            let p = plan(
                &Observed {
                    cas: &cas[..1],
                    leaf: leaf(0, YEAR, 0),
                },
                now,
                &policy,
            );
            let mut after: Vec<Validity> = (0..1)
                .filter(|i| !p.drop_cas.contains(i))
                .map(|i| cas[i])
                .collect();
            if p.add_ca {
                after.push(ca_validity(now, &policy));
            }
            let signer = match p.signer {
                Signer::New => after.len() - 1,
                Signer::Existing(i) => after.iter().position(|c| *c == cas[i]).unwrap(),
            };
            let leaf = match p.renew {
                Some(_) => Leaf {
                    validity: leaf_validity(now, &policy, &after[signer]),
                    issuer: Some(signer),
                    has_names: true,
                },
                None => leaf(0, YEAR, 0).unwrap(),
            };
            let again = plan(
                &Observed {
                    cas: &after,
                    leaf: Some(leaf),
                },
                now,
                &policy,
            );
            assert!(!again.writes(), "at {now}: {p:?} then {again:?}");
            assert!(again.next > now);
        }
    }

    #[test]
    fn a_certificate_ends_with_its_ca_and_starts_a_little_early() {
        let policy = Policy::default();
        let ca = valid(0, 100 * DAY);
        let v = leaf_validity(at(50 * DAY), &policy, &ca);
        assert_eq!(v.not_after, ca.not_after);
        assert_eq!(v.not_before, at(50 * DAY - 300));
        let ca = ca_validity(at(0), &policy);
        assert_eq!(ca.not_after, at(3650 * DAY));
    }

    #[test]
    fn a_certificate_from_a_replica_whose_clock_is_ahead_is_kept() {
        let cas = [valid(-DAY, 10 * YEAR)];
        let p = plan(
            &Observed {
                cas: &cas,
                leaf: leaf(60, YEAR, 0),
            },
            at(0),
            &Policy::default(),
        );
        assert!(!p.writes(), "{p:?}");
    }
}
