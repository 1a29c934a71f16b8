//! Ledger upkeep, pure: which admission reservations a write of `localUsage` drops, and which
//! newly seen Machines were never admitted.
//!
//! A reservation is dropped when
//! - **counted**: its Machine (same cluster and UID) is counted, at the reserved `size`, in the
//!   very `localUsage` the same write carries (so the Machine is never counted zero times nor
//!   twice), or
//! - **expired**: it is older than the TTL and its cluster is not unsettled (unreachable or not
//!   synced yet), since the Machine may exist there uncounted.

use std::collections::{HashMap, HashSet};

use jiff::{SignedDuration, Timestamp};
use kkp_quota_crds::ResourceDetails;
use kkp_quota_crds::ledger::Reservation;

use crate::usage::same_usage;

/// Why a reservation goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    Counted,
    Expired,
}

/// What the seed-controller knows about a project's Machines on this seed at one instant.
#[derive(Debug, Clone, Default)]
pub struct Counted {
    /// `(cluster, uid)` -> the size the Machine is counted at.
    pub machines: HashMap<(String, String), ResourceDetails>,
    /// Clusters whose Machines may exist uncounted (unreachable, not synced yet).
    pub unsettled: HashSet<String>,
}

impl Counted {
    fn counts(&self, reservation: &Reservation) -> bool {
        self.machines
            .get(&(reservation.cluster.clone(), reservation.uid.clone()))
            .is_some_and(|size| same_usage(size, &reservation.size))
    }
}

/// For every reservation (by index), whether and why it is dropped.
pub fn reservations_to_drop(
    reservations: &[Reservation],
    counted: &Counted,
    now: Timestamp,
    ttl: SignedDuration,
) -> Vec<(usize, DropReason)> {
    reservations
        .iter()
        .enumerate()
        .filter_map(|(i, reservation)| {
            if counted.counts(reservation) {
                return Some((i, DropReason::Counted));
            }
            let expired = reservation
                .created_at
                .saturating_add(ttl)
                .is_ok_and(|deadline| deadline <= now);
            (expired && !counted.unsettled.contains(&reservation.cluster)).then_some((i, DropReason::Expired))
        })
        .collect()
}

/// The reservations that stay after dropping `drops`.
pub fn remaining(reservations: &[Reservation], drops: &[(usize, DropReason)]) -> Vec<Reservation> {
    let dropped: HashSet<usize> = drops.iter().map(|(i, _)| *i).collect();
    reservations
        .iter()
        .enumerate()
        .filter(|(i, _)| !dropped.contains(i))
        .map(|(_, r)| r.clone())
        .collect()
}

/// Of Machines that appeared while the watch was running (`(cluster, uid)`), those with no
/// reservation: the webhook never admitted them.
pub fn unadmitted<'a>(
    appeared: impl IntoIterator<Item = &'a (String, String)>,
    reservations: &[Reservation],
) -> Vec<(String, String)> {
    let reserved: HashSet<(&str, &str)> = reservations
        .iter()
        .map(|r| (r.cluster.as_str(), r.uid.as_str()))
        .collect();
    appeared
        .into_iter()
        .filter(|(cluster, uid)| !reserved.contains(&(cluster.as_str(), uid.as_str())))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kkp_quota_crds::{Quantity, Resource};
    use proptest::prelude::*;

    fn size(cpu: i64) -> ResourceDetails {
        let mut d = ResourceDetails::zero();
        d.set(Resource::Cpu, Some(Quantity::from_units(cpu)));
        d.set(Resource::Machines, Some(Quantity::from_units(1)));
        d
    }

    fn reservation(cluster: &str, uid: &str, cpu: i64, age_secs: i64, now: Timestamp) -> Reservation {
        Reservation {
            cluster: cluster.into(),
            namespace: "kube-system".into(),
            name: format!("m-{uid}"),
            uid: uid.into(),
            size: size(cpu),
            reserved: size(cpu),
            created_at: now - SignedDuration::from_secs(age_secs),
        }
    }

    const TTL: SignedDuration = SignedDuration::from_secs(120);

    #[test]
    fn counted_at_the_reserved_size_is_dropped() {
        let now = Timestamp::now();
        let mut counted = Counted::default();
        counted.machines.insert(("alpha".into(), "u1".into()), size(2));
        counted.machines.insert(("alpha".into(), "u2".into()), size(2));
        let rs = vec![
            reservation("alpha", "u1", 2, 1, now),
            reservation("alpha", "u2", 4, 1, now), // resize not seen yet
            reservation("beta", "u1", 2, 1, now),  // other cluster, same uid
            reservation("alpha", "u3", 2, 1, now), // not there yet
        ];
        assert_eq!(
            reservations_to_drop(&rs, &counted, now, TTL),
            vec![(0, DropReason::Counted)]
        );
        assert_eq!(remaining(&rs, &[(0, DropReason::Counted)]).len(), 3);
    }

    #[test]
    fn expiry_waits_for_ttl_and_for_unreachable_clusters() {
        let now = Timestamp::now();
        let mut counted = Counted::default();
        counted.unsettled.insert("beta".into());
        let rs = vec![
            reservation("alpha", "u1", 2, 121, now),
            reservation("alpha", "u2", 2, 119, now),
            reservation("beta", "u3", 2, 600, now),
            reservation("gone", "u4", 2, 120, now),
        ];
        assert_eq!(
            reservations_to_drop(&rs, &counted, now, TTL),
            vec![(0, DropReason::Expired), (3, DropReason::Expired)]
        );
    }

    #[test]
    fn unadmitted_are_those_without_reservation() {
        let now = Timestamp::now();
        let rs = vec![reservation("alpha", "u1", 2, 1, now)];
        let appeared = [
            ("alpha".to_owned(), "u1".to_owned()),
            ("alpha".to_owned(), "u2".to_owned()),
            ("beta".to_owned(), "u1".to_owned()),
        ];
        assert_eq!(
            unadmitted(&appeared, &rs),
            vec![
                ("alpha".to_owned(), "u2".to_owned()),
                ("beta".to_owned(), "u1".to_owned())
            ]
        );
    }

    proptest! {
        /// A reservation is never dropped as counted unless its Machine is counted at its size,
        /// and never expires for an unsettled cluster.
        #[test]
        fn drops_are_justified(
            entries in proptest::collection::vec((0u8..3, 0u8..8, 1i64..4, 0i64..400, proptest::option::of(1i64..4)), 0..40),
            unsettled in proptest::collection::hash_set(0u8..3, 0..3),
        ) {
            let now = Timestamp::now();
            let mut counted = Counted {
                unsettled: unsettled.iter().map(|c| format!("c{c}")).collect(),
                ..Counted::default()
            };
            let mut rs = Vec::new();
            for (c, u, cpu, age, machine) in &entries {
                rs.push(reservation(&format!("c{c}"), &format!("u{u}"), *cpu, *age, now));
                if let Some(m) = machine {
                    counted.machines.insert((format!("c{c}"), format!("u{u}")), size(*m));
                }
            }
            let drops = reservations_to_drop(&rs, &counted, now, TTL);
            for (i, why) in &drops {
                let r = &rs[*i];
                match why {
                    DropReason::Counted => {
                        let s = counted.machines.get(&(r.cluster.clone(), r.uid.clone()));
                        prop_assert!(s.is_some_and(|s| same_usage(s, &r.size)));
                    }
                    DropReason::Expired => {
                        prop_assert!(!counted.unsettled.contains(&r.cluster));
                        prop_assert!(r.created_at + TTL <= now);
                    }
                }
            }
            prop_assert_eq!(remaining(&rs, &drops).len() + drops.len(), rs.len());
        }
    }
}
