//! Ledger upkeep, pure: which admission reservations and allotments a write of `localUsage`
//! drops, which newly seen Machines it holds back, and which were never admitted.
//!
//! A reservation is dropped when
//! - **counted**: its Machine (same cluster and UID) is counted, at the reserved `size`, in the
//!   very `localUsage` the same write carries (so the Machine is never counted zero times nor
//!   twice), or
//! - **gone**: its Machine was seen deleted (a UID never comes back), which happens when a
//!   Machine is deleted before the reservation that admitted it is recorded, or
//! - **expired**: it is older than the TTL and its cluster is not unsettled (unreachable or not
//!   synced yet), since the Machine may exist there uncounted.
//!
//! An allotment (headroom a webhook process holds) is removed once its `expiresAt` has passed,
//! but never while one of the project's own clusters is unsettled: a Machine admitted from it may
//! exist there uncounted, covered only by the allotment.
//!
//! A Machine that appeared while watched with no reservation, while the quota copy keeps an
//! allotment, is **held back** (not counted, not judged for bypass) for a grace period: it may
//! have been admitted from an allotment, whose `granted` covers it until the webhook records it as
//! a reservation. Counting it before that would count it twice, judging it a false alarm.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use jiff::{SignedDuration, Timestamp};
use kkp_quota_crds::autoscaled::change_is_counted;
use kkp_quota_crds::ledger::{Allotment, Reservation};
use kkp_quota_crds::{QuantityError, ResourceDetails};

use crate::usage::same_usage;

/// Why a reservation goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    Counted,
    Gone,
    Expired,
}

/// What the seed-controller knows about a project's Machines on this seed at one instant.
#[derive(Debug, Clone, Default)]
pub struct Counted {
    /// `(cluster, uid)` -> the size the Machine is counted at; also each `Cluster` of the
    /// project, as `(seed name, its uid)` -> one cluster (the key of its reservation).
    pub machines: HashMap<(String, String), ResourceDetails>,
    /// Clusters whose Machines may exist uncounted (unreachable, not synced yet).
    pub unsettled: HashSet<String>,
    /// `(cluster, uid)` of Machines seen deleted (or missing from a complete listing) lately.
    pub gone: HashSet<(String, String)>,
    /// `(cluster, uid)` of every `MachineDeployment` seen -> its `resourceVersion`: the
    /// reservation of a change made on an earlier version is counted
    /// ([`kkp_quota_crds::autoscaled::change_is_counted`]).
    pub deployments: HashMap<(String, String), String>,
}

impl Counted {
    fn counts(&self, reservation: &Reservation) -> bool {
        if let Some(deployment) = reservation.deployment.as_deref()
            && let Some(seen) = self
                .deployments
                .get(&(reservation.cluster.clone(), deployment.to_owned()))
            && change_is_counted(deployment, seen, reservation)
        {
            return true;
        }
        self.machines
            .get(&(reservation.cluster.clone(), reservation.uid.clone()))
            .is_some_and(|size| same_usage(size, &reservation.size))
    }
}

/// A Machine that appeared while its cluster was watched (not in a first listing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appeared {
    pub cluster: String,
    pub uid: String,
    /// When the controller first saw it.
    pub at: Instant,
}

impl Appeared {
    pub fn key(&self) -> (String, String) {
        (self.cluster.clone(), self.uid.clone())
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
            if counted
                .gone
                .contains(&(reservation.cluster.clone(), reservation.uid.clone()))
            {
                return Some((i, DropReason::Gone));
            }
            let expired = reservation
                .created_at
                .saturating_add(ttl)
                .is_ok_and(|deadline| deadline <= now);
            (expired && !counted.unsettled.contains(&reservation.cluster)).then_some((i, DropReason::Expired))
        })
        .collect()
}

/// The items of `list` whose index is not in `gone` (reservations after their drops,
/// allotments after their expiry).
pub fn remaining<T: Clone>(list: &[T], gone: impl IntoIterator<Item = usize>) -> Vec<T> {
    let gone: HashSet<usize> = gone.into_iter().collect();
    list.iter()
        .enumerate()
        .filter(|(i, _)| !gone.contains(i))
        .map(|(_, item)| item.clone())
        .collect()
}

/// The allotments (by index) to remove: `expiresAt` has passed, and none of the project's own
/// clusters is unsettled (`project_unsettled`).
pub fn allotments_to_expire(allotments: &[Allotment], project_unsettled: bool, now: Timestamp) -> Vec<usize> {
    if project_unsettled {
        return Vec::new();
    }
    allotments
        .iter()
        .enumerate()
        .filter(|(_, a)| a.expires_at <= now)
        .map(|(i, _)| i)
        .collect()
}

fn reserved_keys(reservations: &[Reservation]) -> HashSet<(&str, &str)> {
    reservations
        .iter()
        .map(|r| (r.cluster.as_str(), r.uid.as_str()))
        .collect()
}

/// The appeared Machines (by index) held back: no reservation for them, an allotment stays in the
/// quota copy (`has_allotments`), and their grace has not ended.
pub fn held_back(
    appeared: &[Appeared],
    reservations: &[Reservation],
    has_allotments: bool,
    now: Instant,
    grace: Duration,
) -> Vec<usize> {
    if !has_allotments {
        return Vec::new();
    }
    let reserved = reserved_keys(reservations);
    appeared
        .iter()
        .enumerate()
        .filter(|(_, a)| !reserved.contains(&(a.cluster.as_str(), a.uid.as_str())))
        .filter(|(_, a)| a.at.checked_add(grace).is_none_or(|end| now < end))
        .map(|(i, _)| i)
        .collect()
}

/// When the earliest grace of the `held` Machines ends (the write to make then).
pub fn grace_ends(appeared: &[Appeared], held: &[usize], grace: Duration) -> Option<Instant> {
    held.iter()
        .filter_map(|&i| appeared.get(i))
        .filter_map(|a| a.at.checked_add(grace))
        .min()
}

/// `local_usage` without the `held` Machines (each counted in it at its size in `counted`, if it
/// could be sized).
pub fn usage_without_held(
    local_usage: &ResourceDetails,
    counted: &Counted,
    appeared: &[Appeared],
    held: &[usize],
) -> Result<ResourceDetails, QuantityError> {
    let sizes: Vec<&ResourceDetails> = held
        .iter()
        .filter_map(|&i| appeared.get(i))
        .filter_map(|a| counted.machines.get(&a.key()))
        .collect();
    if sizes.is_empty() {
        return Ok(local_usage.clone());
    }
    Ok(local_usage.saturating_sub(&ResourceDetails::checked_sum(sizes)?))
}

/// Of Machines that appeared while the watch was running, those with no reservation: the webhook
/// never admitted them (or a webhook process admitted them from its allotment and stopped before
/// recording them).
pub fn unadmitted<'a>(
    appeared: impl IntoIterator<Item = &'a Appeared>,
    reservations: &[Reservation],
) -> Vec<(String, String)> {
    let reserved = reserved_keys(reservations);
    appeared
        .into_iter()
        .filter(|a| !reserved.contains(&(a.cluster.as_str(), a.uid.as_str())))
        .map(Appeared::key)
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
            uid: uid.into(),
            size: size(cpu),
            reserved: size(cpu),
            created_at: now - SignedDuration::from_secs(age_secs),
            deployment: None,
        }
    }

    const TTL: SignedDuration = SignedDuration::from_secs(120);

    #[test]
    fn a_reservation_whose_machine_was_seen_deleted_is_dropped() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let reservations = vec![reservation("a", "1", 1, 0, now), reservation("a", "2", 1, 0, now)];
        let mut counted = Counted::default();
        counted.gone.insert(("a".to_owned(), "2".to_owned()));
        // Even while the cluster is unsettled: a deleted UID cannot come back.
        counted.unsettled.insert("a".to_owned());
        let drops = reservations_to_drop(&reservations, &counted, now, SignedDuration::from_mins(2));
        assert_eq!(drops, vec![(1, DropReason::Gone)]);
    }

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
        assert_eq!(remaining(&rs, [0]).len(), 3);
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

    fn appeared(cluster: &str, uid: &str, at: Instant) -> Appeared {
        Appeared {
            cluster: cluster.into(),
            uid: uid.into(),
            at,
        }
    }

    fn allotment(holder: &str, cpu: i64, expires_at: Timestamp) -> Allotment {
        Allotment {
            holder: holder.into(),
            granted: size(cpu),
            expires_at,
            ttl_seconds: None,
        }
    }

    const GRACE: Duration = Duration::from_secs(5);

    #[test]
    fn unadmitted_are_those_without_reservation() {
        let now = Timestamp::now();
        let at = Instant::now();
        let rs = vec![reservation("alpha", "u1", 2, 1, now)];
        let appeared = [
            appeared("alpha", "u1", at),
            appeared("alpha", "u2", at),
            appeared("beta", "u1", at),
        ];
        assert_eq!(
            unadmitted(&appeared, &rs),
            vec![
                ("alpha".to_owned(), "u2".to_owned()),
                ("beta".to_owned(), "u1".to_owned())
            ]
        );
    }

    #[test]
    fn allotments_expire_after_expires_at_and_only_when_the_project_is_settled() {
        let now = Timestamp::now();
        let allotments = vec![
            allotment("gone", 2, now - SignedDuration::from_secs(1)),
            allotment("live", 2, now + SignedDuration::from_secs(30)),
            allotment("just", 2, now),
        ];
        assert_eq!(allotments_to_expire(&allotments, false, now), vec![0, 2]);
        assert!(allotments_to_expire(&allotments, true, now).is_empty());
        let kept = remaining(&allotments, [0, 2]);
        assert_eq!(kept, vec![allotments[1].clone()]);
    }

    #[test]
    fn held_back_until_reserved_or_the_grace_ends_and_only_with_allotments() {
        let now = Timestamp::now();
        let start = Instant::now() + Duration::from_mins(1);
        let rs = vec![reservation("alpha", "reserved", 2, 1, now)];
        let list = [
            appeared("alpha", "reserved", start),
            appeared("alpha", "fresh", start),
            appeared("beta", "old", start.checked_sub(GRACE).unwrap()),
            appeared(
                "beta",
                "fresh",
                start.checked_sub(Duration::from_secs(4)).unwrap(),
            ),
        ];
        let held = held_back(&list, &rs, true, start, GRACE);
        assert_eq!(held, vec![1, 3]);
        assert_eq!(
            grace_ends(&list, &held, GRACE),
            Some(start + Duration::from_secs(1))
        );
        assert!(
            held_back(&list, &rs, false, start, GRACE).is_empty(),
            "no allotment"
        );
        assert_eq!(
            held_back(&list, &rs, true, start + GRACE, GRACE),
            Vec::<usize>::new()
        );
        // Judged: what is not held; of that, what has no reservation is unadmitted.
        let judged: Vec<&Appeared> = list
            .iter()
            .enumerate()
            .filter(|(i, _)| !held.contains(i))
            .map(|(_, a)| a)
            .collect();
        assert_eq!(
            unadmitted(judged, &rs),
            vec![("beta".to_owned(), "old".to_owned())]
        );

        let mut counted = Counted::default();
        for (a, cpu) in list.iter().zip([1, 2, 4, 8]) {
            counted.machines.insert(a.key(), size(cpu));
        }
        let total = ResourceDetails::checked_sum(counted.machines.values()).unwrap();
        let without = usage_without_held(&total, &counted, &list, &held).unwrap();
        assert_eq!(without.amount(Resource::Cpu), Quantity::from_units(5));
        assert_eq!(without.amount(Resource::Machines), Quantity::from_units(2));
        // An unsizeable held Machine is not in the usage: nothing to take out.
        counted.machines.remove(&list[1].key());
        let total = ResourceDetails::checked_sum(counted.machines.values()).unwrap();
        let without = usage_without_held(&total, &counted, &list, &held).unwrap();
        assert_eq!(without.amount(Resource::Cpu), Quantity::from_units(5));
    }

    proptest! {
        /// A held-back Machine is never counted and never judged; nothing with a reservation, and
        /// nothing without an allotment in the quota copy, is held back; every hold ends with the
        /// grace.
        #[test]
        fn held_back_machines_are_neither_counted_nor_flagged(
            machines in proptest::collection::vec((0u8..3, 0u8..8, 1i64..4, 0u64..10_000, any::<bool>()), 0..30),
            has_allotments in any::<bool>(),
        ) {
            let now = Instant::now() + Duration::from_secs(20);
            let ts = Timestamp::now();
            let mut list = Vec::new();
            let mut rs = Vec::new();
            let mut counted = Counted::default();
            for (c, u, cpu, age_ms, reserved) in &machines {
                let key = (format!("c{c}"), format!("u{u}"));
                if counted.machines.contains_key(&key) {
                    continue;
                }
                let a = appeared(&key.0, &key.1, now.checked_sub(Duration::from_millis(*age_ms)).unwrap());
                if *reserved {
                    rs.push(reservation(&key.0, &key.1, *cpu, 1, ts));
                }
                counted.machines.insert(key, size(*cpu));
                list.push(a);
            }
            let held = held_back(&list, &rs, has_allotments, now, GRACE);
            let total = ResourceDetails::checked_sum(counted.machines.values()).unwrap();
            let written = usage_without_held(&total, &counted, &list, &held).unwrap();
            let judged: Vec<&Appeared> = list.iter().enumerate().filter(|(i, _)| !held.contains(i)).map(|(_, a)| a).collect();
            let flagged = unadmitted(judged.iter().copied(), &rs);
            let not_held = ResourceDetails::checked_sum(judged.iter().map(|a| &counted.machines[&a.key()])).unwrap();
            prop_assert!(same_usage(&written, &not_held), "written {written}, not held {not_held}");
            for &i in &held {
                let a = &list[i];
                prop_assert!(has_allotments);
                prop_assert!(!rs.iter().any(|r| r.cluster == a.cluster && r.uid == a.uid));
                prop_assert!(now < a.at + GRACE);
                prop_assert!(!flagged.contains(&a.key()));
            }
            // When the earliest grace ends, that Machine is held no more (and nothing new is).
            if let Some(end) = grace_ends(&list, &held, GRACE) {
                let later = held_back(&list, &rs, has_allotments, end, GRACE);
                prop_assert!(later.len() < held.len());
                prop_assert!(later.iter().all(|i| held.contains(i)));
            }
            prop_assert!(held_back(&list, &rs, has_allotments, now + GRACE, GRACE).is_empty());
        }

        /// An allotment is never removed before `expiresAt` nor while the project has an
        /// unsettled cluster; every other expired one is.
        #[test]
        fn allotment_expiry_is_justified(
            offsets in proptest::collection::vec(-120i64..120, 0..20),
            project_unsettled in any::<bool>(),
        ) {
            let now = Timestamp::now();
            let allotments: Vec<Allotment> = offsets
                .iter()
                .enumerate()
                .map(|(i, s)| allotment(&format!("h{i}"), 1, now + SignedDuration::from_secs(*s)))
                .collect();
            let expired = allotments_to_expire(&allotments, project_unsettled, now);
            for (i, a) in allotments.iter().enumerate() {
                let gone = expired.contains(&i);
                prop_assert_eq!(gone, !project_unsettled && a.expires_at <= now);
            }
            prop_assert_eq!(remaining(&allotments, expired.iter().copied()).len() + expired.len(), allotments.len());
        }

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
                    DropReason::Gone => {
                        prop_assert!(counted.gone.contains(&(r.cluster.clone(), r.uid.clone())));
                    }
                    DropReason::Expired => {
                        prop_assert!(!counted.unsettled.contains(&r.cluster));
                        prop_assert!(r.created_at + TTL <= now);
                    }
                }
            }
            prop_assert_eq!(remaining(&rs, drops.iter().map(|(i, _)| *i)).len() + drops.len(), rs.len());
        }
    }
}
