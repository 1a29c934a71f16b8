//! The fold: every seed's `localUsage` of one quota becomes the master's `globalUsage`, and each
//! seed gets the usage of all the *other* seeds (`otherSeedsUsage`). Pure; no I/O.
//!
//! Staleness bookkeeping lives here too: a seed whose watch failed is [`Health::Stale`], and its
//! last known usage keeps counting; a seed never listed since this process started is
//! [`Health::Unknown`], and then the sums it is part of are not written at all (writing them
//! without it would silently drop its usage).

use std::collections::BTreeMap;

use jiff::Timestamp;
use kkp_quota_crds::{QuantityError, ResourceDetails};

/// What the controller knows about one seed's connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// Not listed yet since this process started (or since the seed appeared): usage unknown.
    Unknown { since: Timestamp },
    /// The watch is up; `last_sync` is the last time it delivered anything.
    Fresh { last_sync: Timestamp },
    /// The watch failed at `since`; the copies in the cache are the last ones seen
    /// (`last_sync` is when, if ever).
    Stale {
        since: Timestamp,
        last_sync: Option<Timestamp>,
    },
}

impl Health {
    /// The health after the watch failed at `now`. A seed already stale keeps its `since`.
    #[must_use]
    pub fn failed(self, now: Timestamp) -> Health {
        match self {
            Health::Fresh { last_sync } => Health::Stale {
                since: now,
                last_sync: Some(last_sync),
            },
            Health::Unknown { since } => Health::Stale {
                since,
                last_sync: None,
            },
            stale @ Health::Stale { .. } => stale,
        }
    }

    /// The health after the watch delivered a complete, current view at `now`.
    #[must_use]
    pub fn synced(self, now: Timestamp) -> Health {
        Health::Fresh { last_sync: now }
    }

    /// The health after a single watch event at `now`: it only refreshes a fresh seed (a stale
    /// or unknown seed becomes fresh again only after a complete re-list).
    #[must_use]
    pub fn touched(self, now: Timestamp) -> Health {
        match self {
            Health::Fresh { .. } => Health::Fresh { last_sync: now },
            other => other,
        }
    }

    pub fn is_fresh(self) -> bool {
        matches!(self, Health::Fresh { .. })
    }

    /// Whether this seed's cached usage can be counted (fresh, or stale with a last known view).
    pub fn is_known(self) -> bool {
        match self {
            Health::Fresh { .. } => true,
            Health::Stale { last_sync, .. } => last_sync.is_some(),
            Health::Unknown { .. } => false,
        }
    }

    /// Since when the seed has been out of date (stale or unknown).
    pub fn out_of_date_since(self) -> Option<Timestamp> {
        match self {
            Health::Fresh { .. } => None,
            Health::Unknown { since } | Health::Stale { since, .. } => Some(since),
        }
    }

    pub fn last_sync(self) -> Option<Timestamp> {
        match self {
            Health::Fresh { last_sync } => Some(last_sync),
            Health::Stale { last_sync, .. } => last_sync,
            Health::Unknown { .. } => None,
        }
    }
}

/// One seed's view of one quota.
#[derive(Clone, Debug, PartialEq)]
pub struct SeedUsage {
    pub seed: String,
    pub health: Health,
    /// The copy's `status.localUsage`; `None` when the copy or its usage does not exist (zero).
    pub local: Option<ResourceDetails>,
    /// The copy's `status.reservedUsage` (shown, never folded into the usage).
    pub reserved: Option<ResourceDetails>,
}

/// The result of folding one quota.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Folded {
    /// The sum over every seed; `None` when a seed's usage is unknown.
    pub global: Option<ResourceDetails>,
    /// Per seed: the sum over every other seed; `None` when another seed's usage is unknown.
    pub others: BTreeMap<String, Option<ResourceDetails>>,
    /// Seeds whose usage is counted from a stale view, or not known at all, with since when.
    pub stale: Vec<StaleSeed>,
    /// The capacity every seed reserves for cluster autoscalers, summed: shown, never folded
    /// into the usage (docs/capacity.md). `None` when a seed's figures are unknown (as `global`
    /// is), or when no seed reports any (ledgers of older seed-controllers).
    pub reserved: Option<ResourceDetails>,
}

/// A seed whose data is not current.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaleSeed {
    pub seed: String,
    pub since: Timestamp,
    /// True when its usage is not known at all (never listed since start-up).
    pub unknown: bool,
}

/// [`Folded::reserved`], for seeds whose figures are all known.
fn reserved(seeds: &[SeedUsage]) -> Result<Option<ResourceDetails>, QuantityError> {
    let reported: Vec<&ResourceDetails> = seeds.iter().filter_map(|s| s.reserved.as_ref()).collect();
    if reported.is_empty() {
        return Ok(None);
    }
    ResourceDetails::checked_sum(reported).map(Some)
}

/// Folds the seeds' usage of one quota.
pub fn fold(seeds: &[SeedUsage]) -> Result<Folded, QuantityError> {
    let known = |s: &SeedUsage| s.health.is_known();
    let usage = |s: &SeedUsage| s.local.clone().unwrap_or_default();
    let global = if seeds.iter().all(known) {
        Some(ResourceDetails::checked_sum(
            seeds.iter().map(usage).collect::<Vec<_>>().iter(),
        )?)
    } else {
        None
    };
    let mut others = BTreeMap::new();
    for (i, seed) in seeds.iter().enumerate() {
        let rest: Vec<&SeedUsage> = seeds
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, s)| s)
            .collect();
        let sum = if rest.iter().all(|s| known(s)) {
            Some(ResourceDetails::checked_sum(
                rest.iter().map(|s| usage(s)).collect::<Vec<_>>().iter(),
            )?)
        } else {
            None
        };
        others.insert(seed.seed.clone(), sum);
    }
    let stale = seeds
        .iter()
        .filter_map(|s| {
            s.health.out_of_date_since().map(|since| StaleSeed {
                seed: s.seed.clone(),
                since,
                unknown: !s.health.is_known(),
            })
        })
        .collect();
    let reserved = if global.is_some() { reserved(seeds)? } else { None };
    Ok(Folded {
        global,
        others,
        stale,
        reserved,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kkp_quota_crds::{Quantity, Resource};
    use proptest::prelude::*;

    fn usage(cpu: i64, mem_gib: i64) -> ResourceDetails {
        ResourceDetails {
            cpu: Some(Quantity::from_units(cpu)),
            memory: Some(Quantity::from_gibibytes(mem_gib)),
            ..ResourceDetails::default()
        }
    }

    fn fresh(seed: &str, local: Option<ResourceDetails>) -> SeedUsage {
        SeedUsage {
            seed: seed.into(),
            health: Health::Fresh {
                last_sync: Timestamp::UNIX_EPOCH,
            },
            local,
            reserved: None,
        }
    }

    #[test]
    fn sums_every_seed_and_gives_each_the_others() {
        let folded = fold(&[
            fresh("a", Some(usage(2, 4))),
            fresh("b", Some(usage(3, 8))),
            fresh("c", None),
        ])
        .unwrap();
        let global = folded.global.unwrap();
        assert_eq!(global.amount(Resource::Cpu), Quantity::from_units(5));
        assert_eq!(global.amount(Resource::Memory), Quantity::from_gibibytes(12));
        assert_eq!(
            folded.others["a"].clone().unwrap().amount(Resource::Cpu),
            Quantity::from_units(3)
        );
        assert_eq!(
            folded.others["b"].clone().unwrap().amount(Resource::Cpu),
            Quantity::from_units(2)
        );
        assert_eq!(
            folded.others["c"].clone().unwrap().amount(Resource::Cpu),
            Quantity::from_units(5)
        );
        assert!(folded.stale.is_empty());
    }

    #[test]
    fn stale_seed_keeps_counting_and_is_reported() {
        let since = Timestamp::from_second(1_000).unwrap();
        let mut b = fresh("b", Some(usage(3, 8)));
        b.health = b.health.failed(since);
        let folded = fold(&[fresh("a", Some(usage(2, 4))), b]).unwrap();
        assert_eq!(
            folded.global.unwrap().amount(Resource::Cpu),
            Quantity::from_units(5)
        );
        assert_eq!(
            folded.stale,
            vec![StaleSeed {
                seed: "b".into(),
                since,
                unknown: false
            }]
        );
    }

    #[test]
    fn unknown_seed_blocks_the_sums_it_is_part_of() {
        let since = Timestamp::from_second(1_000).unwrap();
        let b = SeedUsage {
            seed: "b".into(),
            health: Health::Unknown { since },
            local: None,
            reserved: None,
        };
        let folded = fold(&[fresh("a", Some(usage(2, 4))), b]).unwrap();
        assert_eq!(folded.global, None);
        assert_eq!(folded.others["a"], None);
        assert_eq!(
            folded.others["b"].clone().unwrap().amount(Resource::Cpu),
            Quantity::from_units(2)
        );
        assert!(folded.stale[0].unknown);
    }

    #[test]
    fn reserved_sums_the_seeds_that_report_it_once_all_are_known() {
        let since = Timestamp::UNIX_EPOCH;
        let reserved = |seeds: &[SeedUsage]| fold(seeds).map(|f| f.reserved);
        let mut a = fresh("a", Some(usage(2, 4)));
        let b = fresh("b", Some(usage(1, 1)));
        assert_eq!(
            reserved(&[a.clone(), b.clone()]).unwrap(),
            None,
            "no seed reports any"
        );
        a.reserved = Some(usage(8, 32));
        let mut c = SeedUsage {
            seed: "c".into(),
            health: Health::Unknown { since },
            local: None,
            reserved: Some(usage(100, 100)),
        };
        let cpu_mem =
            |r: Option<ResourceDetails>| r.map(|r| (r.amount(Resource::Cpu), r.amount(Resource::Memory)));
        let amounts = |cpu, gib| Some((Quantity::from_units(cpu), Quantity::from_gibibytes(gib)));
        assert_eq!(
            cpu_mem(reserved(&[a.clone(), b.clone(), c.clone()]).unwrap()),
            None,
            "not known while a seed's figures are not, as the global usage"
        );
        assert_eq!(
            cpu_mem(reserved(&[a.clone(), b.clone()]).unwrap()),
            amounts(8, 32)
        );
        c.health = Health::Fresh { last_sync: since };
        assert_eq!(cpu_mem(reserved(&[a.clone(), b, c]).unwrap()), amounts(108, 132));
        let folded = fold(&[a]).unwrap();
        assert_eq!(
            cpu_mem(folded.global),
            amounts(2, 4),
            "reserved is not folded into usage"
        );
    }

    #[test]
    fn health_transitions() {
        let t1 = Timestamp::from_second(1).unwrap();
        let t2 = Timestamp::from_second(2).unwrap();
        let t3 = Timestamp::from_second(3).unwrap();
        let h = Health::Unknown { since: t1 };
        assert!(!h.is_known());
        let h = h.failed(t2);
        assert_eq!(
            h.out_of_date_since(),
            Some(t1),
            "unknown then failed keeps the first time"
        );
        assert!(!h.is_known());
        assert_eq!(
            h.touched(t3),
            h,
            "a single event does not make a stale seed fresh"
        );
        let h = h.synced(t2);
        assert!(h.is_fresh());
        let h = h.failed(t3).failed(Timestamp::from_second(9).unwrap());
        assert_eq!(h.out_of_date_since(), Some(t3));
        assert_eq!(h.last_sync(), Some(t2));
        assert!(h.is_known());
    }

    proptest! {
        #[test]
        fn global_is_each_seed_plus_its_others(cpus in proptest::collection::vec(0i64..10_000, 1..6)) {
            let seeds: Vec<SeedUsage> = cpus
                .iter()
                .enumerate()
                .map(|(i, &c)| fresh(&format!("s{i}"), Some(usage(c, c))))
                .collect();
            let folded = fold(&seeds).unwrap();
            let global = folded.global.clone().unwrap();
            prop_assert_eq!(global.amount(Resource::Cpu), Quantity::from_units(cpus.iter().sum()));
            for (i, seed) in seeds.iter().enumerate() {
                let other = folded.others[&seed.seed].clone().unwrap();
                let back = other.checked_add(&usage(cpus[i], cpus[i])).unwrap();
                prop_assert_eq!(back.amount(Resource::Cpu), global.amount(Resource::Cpu));
                prop_assert_eq!(back.amount(Resource::Memory), global.amount(Resource::Memory));
            }
        }
    }
}
