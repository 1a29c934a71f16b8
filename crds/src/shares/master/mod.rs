//! The master's side: free headroom, and the plan of grants and targets that moves shares to
//! where they are wanted.
//!
//! The master's view mixes two sources. `granted` and `target` come from its own record (the
//! master object, written with compare-and-swap before anything is sent to a seed).
//! `report` is what it last read from the seed and may be stale; every use of it is safe when
//! stale: `released` only grows, so an old one over-counts what the seed holds and under-counts
//! free headroom.

use std::collections::BTreeMap;

use super::seed::{MasterWord, SeedReport};
use crate::quantity::{Quantity, QuantityError};
use crate::resources::{Resource, ResourceDetails};
use plan::plan_resource;

mod plan;

/// Record versions carry an epoch in their upper half ([`epoch_start`]).
const EPOCH_SHIFT: u32 = 32;

/// The first version of the epoch `version` belongs to. A record rebuilt after it was lost
/// starts the next epoch, so versions never repeat with other content, and nothing the lost
/// record sent can be newer than what the rebuilt one sends.
pub fn epoch_start(version: u64) -> u64 {
    (version >> EPOCH_SHIFT) << EPOCH_SHIFT
}

/// The master's record of one seed, plus what it last read from it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeedRecord {
    /// Cumulative grants, as persisted in the master's record; only grows.
    pub granted: ResourceDetails,
    /// The target last persisted (absent: no ceiling).
    pub target: ResourceDetails,
    /// The newest `released` read from the seed when the record was last written: a floor
    /// under its `released`, persisted with the record and sent to the seed.
    pub released_floor: ResourceDetails,
    /// The newest report read since this master started; `None` until one is read.
    pub report: Option<SeedReport>,
    /// Whether the seed answers; an unreachable seed's share stays its own.
    pub reachable: bool,
    /// The seed is being removed: it gets no grants and is asked to release everything it does
    /// not use.
    pub retiring: bool,
    /// The most the holder can ever use, per resource (a member project of a group: its own
    /// limit); it is never granted beyond it, since what it could not spend would sit idle
    /// while others wait. Empty: no ceiling (a seed). Not persisted: read afresh every round.
    pub ceiling: ResourceDetails,
    /// What else bounds what the holder could spend, per resource (a member project: the limits
    /// of the other groups that select it); empty: nothing. Like the ceiling it caps grants and
    /// what a holder that wants more keeps ([`SeedRecord::spendable`]), but not what a group
    /// counts a member at that has not reported (`group::holdings_kept`): its seeds may hold
    /// share from before those groups bound it. Not persisted: read afresh every round.
    pub usable: ResourceDetails,
    /// A group's record only (`GrantRecord::counted`): the most a word of the record that kept
    /// holdings counted this member at ([`super::group::remember_counts`]). Persisted.
    pub counted: ResourceDetails,
}

impl SeedRecord {
    /// A seed the master has just learnt of: no share.
    pub fn new() -> SeedRecord {
        SeedRecord {
            reachable: true,
            ..SeedRecord::default()
        }
    }

    /// Keeps `report` if it is newer than the one held (reports may arrive out of order).
    pub fn observe(&mut self, report: SeedReport) {
        if self
            .report
            .as_ref()
            .is_none_or(|old| report.version > old.version)
        {
            self.report = Some(report);
        }
    }

    /// What the record at `version` says to this seed: its grants, target and released floor.
    pub fn word(&self, version: u64) -> MasterWord {
        MasterWord {
            version,
            granted: self.granted.clone(),
            target: self.target.clone(),
            released: self.released_floor.clone(),
        }
    }

    /// `granted - released` as the master sees it: at least what the seed holds. `released` is
    /// the newer of the seed's report and the persisted floor, so a seed not heard from since
    /// this master started counts what it held at the last write, not every grant it ever had.
    pub fn share_seen(&self) -> ResourceDetails {
        self.granted.saturating_sub(&self.released_seen())
    }

    /// The most the master knows the seed released: its report or the persisted floor.
    pub fn released_seen(&self) -> ResourceDetails {
        match &self.report {
            Some(report) => super::seed::larger(&self.released_floor, &report.released),
            None => self.released_floor.clone(),
        }
    }

    /// What the seed holds as far as headroom goes: per resource the larger of
    /// [`SeedRecord::share_seen`] and what it reported committed. Usage can exceed a share
    /// without any admission (catalog edits, a limit added to a resource in use, a cluster
    /// moved); that usage fills the quota all the same, so it is never free to grant.
    pub fn held_seen(&self) -> ResourceDetails {
        let share = self.share_seen();
        match &self.report {
            Some(report) => {
                let mut held = share.clone();
                for (resource, committed) in report.committed.iter() {
                    held.set(resource, Some(share.amount(resource).max(committed)));
                }
                held
            }
            None => share,
        }
    }

    /// [`SeedRecord::share_seen`] for the resources `limit` limits: the figure status, metrics
    /// and logs show.
    pub fn share_within(&self, limit: &ResourceDetails) -> ResourceDetails {
        super::bounded_by(limit, &self.share_seen())
    }

    pub(super) fn committed_seen(&self, resource: Resource) -> Option<Quantity> {
        self.report.as_ref().map(|r| r.committed.amount(resource))
    }

    /// The most the holder could ever spend of `resource`: the smaller of its ceiling and what
    /// else bounds it ([`SeedRecord::usable`]); `None` where nothing does (a seed).
    pub(super) fn spendable(&self, resource: Resource) -> Option<Quantity> {
        match (self.ceiling.get(resource), self.usable.get(resource)) {
            (Some(ceiling), Some(usable)) => Some(ceiling.min(usable)),
            (ceiling, usable) => ceiling.or(usable),
        }
    }

    pub(super) fn demand(&self, resource: Resource) -> Option<Quantity> {
        let demand = self.report.as_ref()?.demand.as_ref()?;
        Some(demand.amount(resource))
    }

    /// Whether the seed asks for more of `resource` than the master sees it hold (a demand its
    /// share already covers asks for nothing).
    pub fn wants_more(&self, resource: Resource) -> bool {
        self.demand(resource)
            .is_some_and(|want| want > self.share_seen().amount(resource))
    }

    /// Whether its demand is above its share for any resource `limit` limits.
    pub fn unmet(&self, limit: &ResourceDetails) -> bool {
        limit.iter().any(|(resource, _)| self.wants_more(resource))
    }
}

/// The master's view of one project quota.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MasterView {
    /// The quota (an absent resource is unlimited and needs no share).
    pub limit: ResourceDetails,
    pub seeds: BTreeMap<String, SeedRecord>,
}

/// What the master should do next. Grants and targets must be persisted in the master's record
/// ([`MasterView::apply`], then a compare-and-swap write) before any of them is sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Amounts to add to seeds' `granted` (only seeds that get something).
    pub grants: BTreeMap<String, ResourceDetails>,
    /// The new target of every seed.
    pub targets: BTreeMap<String, ResourceDetails>,
    /// Share held by unreachable seeds (for status and metrics).
    pub stuck: BTreeMap<String, ResourceDetails>,
    /// Retiring seeds that hold nothing and use nothing: their record can go.
    pub forget: Vec<String>,
}

impl MasterView {
    /// `sum(max(granted - released_seen, committed_seen))`, per limited resource: at least what
    /// seeds hold or use.
    pub fn held(&self) -> Result<ResourceDetails, QuantityError> {
        let shares: Vec<ResourceDetails> = self.seeds.values().map(SeedRecord::held_seen).collect();
        let sum = ResourceDetails::checked_sum(&shares)?;
        Ok(super::bounded_by(&self.limit, &sum))
    }

    /// `limit - held`, never below zero: headroom no seed holds, so it may be granted.
    pub fn free(&self) -> Result<ResourceDetails, QuantityError> {
        Ok(self.limit.saturating_sub(&self.held()?))
    }

    /// Takes into the record what the seeds' copies hold, for a record that is behind them: the
    /// `ProjectQuota` deleted and re-created (its status, the record, gone), its CRD
    /// re-installed, the master restored from a backup without status or from an older etcd
    /// snapshot. Behind means there is no record, a copy holds a newer word than the record, one
    /// of the record's own version that says something else (rebuilt before without it), or one
    /// granting more than the record ever granted that seed (a lost record's word at a version
    /// this record reached too). Per
    /// seed, `granted` becomes the larger of the record's and the copy's, and the floor the
    /// larger of the record's and what the seed released; both only raise what the master
    /// counts as held, so nothing a seed holds is counted free.
    ///
    /// Returns the version the next record must exceed, and whether the record was behind. A
    /// rebuilt record starts the next epoch ([`epoch_start`]): words the lost record may still
    /// have in flight are all older than its first one, so a seed that took the new epoch
    /// refuses them.
    pub fn adopt(&mut self, record_version: u64) -> (u64, bool) {
        let held = |r: &SeedRecord| r.report.as_ref().and_then(|rep| rep.holds.clone());
        let newest = self
            .seeds
            .values()
            .filter_map(|r| held(r).map(|w| w.version))
            .max();
        let newest = newest.unwrap_or(0);
        // A word this record cannot have sent: one of its own version that says something
        // else, or one granting more than the record ever granted that seed (`granted` only
        // grows within a record, and a rebuild adopts what seeds hold): a lost record's word
        // that took the same version as this one (a rebuild without reading every seed).
        let contradicts = self.seeds.values().any(|r| {
            held(r).is_some_and(|w| {
                !r.granted.covers(&w.granted)
                    || (record_version > 0
                        && w.version == record_version
                        && (w.granted != r.granted || w.target != r.target))
            })
        });
        // No record at all (version 0): a new quota, or a lost record whose last words may
        // still be in flight; either way the first record starts an epoch of its own.
        if record_version > 0 && newest <= record_version && !contradicts {
            return (record_version, false);
        }
        for record in self.seeds.values_mut() {
            let Some(report) = &record.report else { continue };
            if let Some(word) = &report.holds {
                record.granted = super::seed::larger(&record.granted, &word.granted);
                if record.target.is_empty() {
                    record.target = word.target.clone();
                }
            }
            record.released_floor = super::seed::larger(&record.released_floor, &report.released);
        }
        let next_epoch = ((newest.max(record_version) >> EPOCH_SHIFT) + 1) << EPOCH_SHIFT;
        (next_epoch - 1, true)
    }

    /// Whether a record at `version` must not grant yet: it was rebuilt ([`MasterView::adopt`])
    /// and a seed has not been heard holding a word of its epoch. Until then that seed could
    /// still take a word the lost record had in flight, and hold share the rebuilt record does
    /// not count. An unreachable seed holds grants back until it is back (so a quota created
    /// while a seed is down grants nowhere until it returns: its epoch starts then too), and so
    /// does a retiring one that still reports; one that left the fleet (retiring, unreachable,
    /// never read by this master) does not: nobody writes to it any more.
    pub fn awaiting_epoch(&self, version: u64) -> bool {
        !self.awaited(version).is_empty()
    }

    /// The seeds [`MasterView::awaiting_epoch`] waits for (none in epoch 0): for status and
    /// logs, which say who holds grants back.
    pub fn awaited(&self, version: u64) -> Vec<&str> {
        let start = epoch_start(version);
        if start == 0 {
            return Vec::new();
        }
        self.seeds
            .iter()
            .filter(|(_, r)| {
                // A seed that left the fleet is neither read nor written: it takes no word, so
                // it holds nothing back (its share stays counted as the record has it).
                let left = r.retiring && !r.reachable && r.report.is_none();
                !left
                    && r.report
                        .as_ref()
                        .is_none_or(|rep| rep.holds.as_ref().map_or(0, |w| w.version) < start)
            })
            .map(|(name, _)| name.as_str())
            .collect()
    }

    /// [`MasterView::plan`] for a record at `version`: while it awaits its epoch
    /// ([`MasterView::awaiting_epoch`]) without grants, and without forgetting retired seeds
    /// (a word in flight could still give one share the record would no longer count); targets
    /// are planned as usual.
    pub fn plan_at(&self, version: u64, slack: &ResourceDetails) -> Result<Plan, QuantityError> {
        let mut plan = self.plan(slack)?;
        if self.awaiting_epoch(version) {
            plan.grants.clear();
            plan.forget.clear();
        }
        Ok(plan)
    }

    /// Grants from free headroom to seeds with a demand; lower targets of seeds with idle share
    /// (idle above `slack` first) when free headroom does not cover the demand or the limit was
    /// lowered below what seeds hold. Targets are recomputed from the view every time, so a
    /// target lowered to move share rises again once the move is done.
    pub fn plan(&self, slack: &ResourceDetails) -> Result<Plan, QuantityError> {
        let names: Vec<&String> = self.seeds.keys().collect();
        let records: Vec<&SeedRecord> = self.seeds.values().collect();
        let mut grants = vec![ResourceDetails::default(); records.len()];
        let mut targets = vec![ResourceDetails::default(); records.len()];
        for (resource, limit) in self.limit.iter() {
            let planned = plan_resource(&records, resource, limit, slack.amount(resource))?;
            for (i, (grant, target)) in planned.into_iter().enumerate() {
                if grant > Quantity::ZERO {
                    grants[i].set(resource, Some(grant));
                }
                targets[i].set(resource, Some(target));
            }
        }
        let mut plan = Plan::default();
        for (i, name) in names.into_iter().enumerate() {
            let record = records[i];
            if !grants[i].is_empty() {
                plan.grants.insert(name.clone(), grants[i].clone());
            }
            plan.targets.insert(name.clone(), targets[i].clone());
            let share = record.share_within(&self.limit);
            if !record.reachable && !share.is_empty() {
                plan.stuck.insert(name.clone(), share.clone());
            }
            let unused = record
                .report
                .as_ref()
                .is_some_and(|r| r.uses_nothing_of(&self.limit));
            if record.retiring && share.is_empty() && unused {
                plan.forget.push(name.clone());
            }
        }
        Ok(plan)
    }

    /// Puts `plan` into the record: grants added, targets replaced, forgotten seeds dropped,
    /// and every seed's released floor raised to what the master read. Returns whether grants,
    /// targets, seeds or floors changed (nothing to persist or send otherwise). A release is
    /// persisted as a floor as soon as it is read, not only with the grant that spends it: a
    /// seed that then leaves the fleet, or a master that restarts and has not read it yet,
    /// counts what the seed holds now, not what it held at the last grant.
    pub fn apply(&mut self, plan: &Plan) -> Result<bool, QuantityError> {
        let mut changed = false;
        for record in self.seeds.values_mut() {
            let seen = record.released_seen();
            changed |= !record.released_floor.covers(&seen);
            record.released_floor = seen;
        }
        for (name, grant) in &plan.grants {
            if let Some(record) = self.seeds.get_mut(name) {
                record.granted = record.granted.checked_add(grant)?;
                changed = true;
            }
        }
        for (name, target) in &plan.targets {
            if let Some(record) = self.seeds.get_mut(name)
                && record.target != *target
            {
                record.target = target.clone();
                changed = true;
            }
        }
        for name in &plan.forget {
            changed |= self.seeds.remove(name).is_some();
        }
        Ok(changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shares::tests::cpu;

    pub(super) fn seed(granted: i64, released: i64, committed: i64, demand: Option<i64>) -> SeedRecord {
        SeedRecord {
            granted: cpu(granted),
            report: Some(SeedReport {
                version: 1,
                released: cpu(released),
                committed: cpu(committed),
                demand: demand.map(cpu),
                holds: None,
            }),
            ..SeedRecord::new()
        }
    }

    pub(super) fn view(limit: i64, seeds: Vec<(&str, SeedRecord)>) -> MasterView {
        MasterView {
            limit: cpu(limit),
            seeds: seeds.into_iter().map(|(n, s)| (n.to_owned(), s)).collect(),
        }
    }

    #[test]
    fn a_lost_record_is_rebuilt_from_what_the_seeds_hold() {
        // The record is gone (version 0, nothing granted); the seeds' copies hold words of
        // version 7: a has 6 granted and released 2, b 4 granted.
        let holding = |granted: i64, released: i64, committed: i64| {
            let mut r = seed(0, released, committed, None);
            r.report.as_mut().unwrap().holds = Some(crate::shares::MasterWord {
                version: 7,
                granted: cpu(granted),
                target: cpu(granted - released),
                released: ResourceDetails::default(),
            });
            r
        };
        let mut v = view(10, vec![("a", holding(6, 2, 3)), ("b", holding(4, 0, 4))]);
        // Before: only what the seeds use (3 + 4) counts; their idle share looks free.
        assert_eq!(v.free().unwrap(), cpu(3));
        let epoch_1 = 1 << 32;
        assert_eq!(v.adopt(0), (epoch_1 - 1, true));
        assert_eq!(
            view(10, vec![]).adopt(0),
            (epoch_1 - 1, true),
            "a new record starts epoch 1"
        );
        assert_eq!(v.free().unwrap(), cpu(2));
        assert_eq!(v.seeds["a"].share_seen(), cpu(4));
        // No grants until both seeds hold a word of the new epoch.
        assert!(v.awaiting_epoch(epoch_1));
        assert!(!v.awaiting_epoch(7), "epoch 0 never waits");
        for r in v.seeds.values_mut() {
            r.report.as_mut().unwrap().holds.as_mut().unwrap().version = epoch_1;
        }
        assert!(!v.awaiting_epoch(epoch_1 + 3));
        // A record at or past the copies' words, saying the same, is left alone.
        assert_eq!(v.adopt(epoch_1), (epoch_1, false));
        assert_eq!(v.adopt(epoch_1 + 2), (epoch_1 + 2, false));
        // One at their version saying something else (rebuilt, then lost again) is not.
        v.seeds.get_mut("a").unwrap().granted = cpu(1);
        assert_eq!(v.adopt(epoch_1), ((2 << 32) - 1, true));
        assert_eq!(v.seeds["a"].granted, cpu(6));
        // Nor is one behind a copy's word at an older version granting more than the record
        // ever granted that seed: a lost record's word, from an epoch this one reused.
        v.seeds.get_mut("b").unwrap().granted = cpu(3);
        assert_eq!(v.adopt(epoch_1 + 5), ((2 << 32) - 1, true));
        assert_eq!(v.seeds["b"].granted, cpu(4));
    }

    #[test]
    fn retiring_seed_is_forgotten_once_empty() {
        let mut r = seed(5, 5, 0, None);
        r.retiring = true;
        let mut v = view(10, vec![("a", seed(2, 0, 0, None)), ("r", r)]);
        let plan = v.plan(&cpu(0)).unwrap();
        assert_eq!(plan.forget, vec!["r".to_owned()]);
        assert!(v.apply(&plan).unwrap());
        assert!(!v.seeds.contains_key("r"));
    }

    #[test]
    fn retiring_seed_using_only_what_is_unlimited_is_forgotten() {
        let mut r = seed(5, 5, 0, None);
        r.retiring = true;
        let report = r.report.as_mut().unwrap();
        report
            .committed
            .set(Resource::Clusters, Some(Quantity::from_units(1)));
        let v = view(10, vec![("a", seed(2, 0, 0, None)), ("r", r.clone())]);
        assert_eq!(v.plan(&cpu(0)).unwrap().forget, vec!["r".to_owned()]);
        // Once clusters are limited, its cluster is use that keeps it.
        let mut limit = cpu(10);
        limit.set(Resource::Clusters, Some(Quantity::from_units(4)));
        let v = MasterView {
            limit,
            seeds: [("a".to_owned(), seed(2, 0, 0, None)), ("r".to_owned(), r)].into(),
        };
        assert!(v.plan(&cpu(0)).unwrap().forget.is_empty());
    }
}
