//! The protocol's state read from, and written to, the objects that hold it: a seed's
//! `QuotaLedger` (spec `shares`, status `released`, `demands`, and what is committed) and the
//! master's `ProjectQuota` status (`shares`, the record). Every component reads them through
//! these functions, so the protocol has one reading of its objects.

use std::collections::BTreeMap;

use jiff::Timestamp;

use super::master::SeedRecord;
use super::seed::{MasterWord, SeedReport, SeedShare};
use crate::ledger::{allotted_total, reserved_total};
use crate::project_quota::{GrantRecord, ShareRecord};
use crate::quantity::QuantityError;
use crate::quota_ledger::{LedgerShares, QuotaLedger, QuotaLedgerSpec, QuotaLedgerStatus, ShareDemand};
use crate::resources::ResourceDetails;

/// The seed's share as its ledger holds it; `None` while shares are not in force on it (no
/// `spec.shares` yet).
pub fn seed_share(spec: &QuotaLedgerSpec, status: Option<&QuotaLedgerStatus>) -> Option<SeedShare> {
    let shares = spec.shares.as_ref()?;
    let own = status.and_then(|s| s.released.clone()).unwrap_or_default();
    Some(SeedShare {
        granted: shares.granted.clone(),
        // The record's floor: a ledger re-created (status empty) or restored from an older
        // backup holds no share the master already counted as released.
        released: super::seed::larger(&own, &shares.released),
        target: shares.target.clone(),
        version: shares.version,
    })
}

/// What the seed has committed: `localUsage + reservations + allotments`.
pub fn committed(status: &QuotaLedgerStatus) -> Result<ResourceDetails, QuantityError> {
    let local = status.local_usage.clone().unwrap_or_default();
    local
        .checked_add(&reserved_total(&status.reservations)?)?
        .checked_add(&allotted_total(&status.allotments)?)
}

/// The demands that have not expired at `now`: by their `expiresAt` as given, so a reader on
/// another clock than the writer's passes the status as it judges it
/// (`crate::ledger::lifetimes::Lifetimes::observe`).
pub fn live_demands(status: &QuotaLedgerStatus, now: Timestamp) -> impl Iterator<Item = &ShareDemand> {
    live(&status.demands, now)
}

fn live(demands: &[ShareDemand], now: Timestamp) -> impl Iterator<Item = &ShareDemand> {
    demands.iter().filter(move |d| d.expires_at > now)
}

/// The seed's demand: per resource the largest live one; `None` when none is live.
pub fn demand(status: &QuotaLedgerStatus, now: Timestamp) -> Option<ResourceDetails> {
    largest_live(&status.demands, now)
}

fn largest_live(demands: &[ShareDemand], now: Timestamp) -> Option<ResourceDetails> {
    super::largest(live(demands, now).map(|d| &d.amount))
}

/// What the master reads from a seed's ledger ([`LedgerReading::report`]), kept apart from the
/// ledger: a master that caches thousands of ledgers keeps this instead of each whole object.
/// The demand is not folded in, because whether a demand still counts depends on when the
/// reading is used.
#[derive(Debug, Clone, PartialEq)]
pub struct LedgerReading {
    /// The ledger's `resourceVersion`: it only orders reads of one object; an unreadable one
    /// counts as the oldest.
    pub version: u64,
    /// `status.released`; absent is none released.
    pub released: Option<ResourceDetails>,
    /// [`committed`], or why it cannot be summed.
    pub committed: Result<ResourceDetails, QuantityError>,
    /// `status.demands`, expired or not; a reader that judges lifetimes by its own clock
    /// (`crate::ledger::lifetimes`) puts its judgement in their `expiresAt`.
    pub demands: Vec<ShareDemand>,
    /// The master's word in `spec.shares` (without `others`).
    pub holds: Option<MasterWord>,
}

impl LedgerReading {
    pub fn of(ledger: &QuotaLedger) -> LedgerReading {
        let empty = QuotaLedgerStatus::default();
        let status = ledger.status.as_ref().unwrap_or(&empty);
        let shares = ledger.spec.shares.as_ref();
        LedgerReading {
            version: ledger
                .metadata
                .resource_version
                .as_deref()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            // What the seed counts as released: its own, or the record's floor if that is more.
            released: super::largest(
                status
                    .released
                    .iter()
                    .chain(shares.map(|s| &s.released).filter(|r| !r.is_empty())),
            ),
            committed: committed(status),
            demands: status.demands.clone(),
            holds: shares.map(|s| MasterWord {
                version: s.version,
                granted: s.granted.clone(),
                target: s.target.clone(),
                released: s.released.clone(),
            }),
        }
    }

    /// The report as of `now` (demands expired by then do not count).
    pub fn report(&self, now: Timestamp) -> Result<SeedReport, QuantityError> {
        Ok(SeedReport {
            version: self.version,
            released: self.released.clone().unwrap_or_default(),
            committed: self.committed.clone()?,
            demand: largest_live(&self.demands, now),
            holds: self.holds.clone(),
        })
    }
}

/// The master's record as per-seed records (no reports yet; every seed reachable).
pub fn records(record: Option<&ShareRecord>) -> BTreeMap<String, SeedRecord> {
    record.map(|r| from_entries(&r.seeds)).unwrap_or_default()
}

/// A record's entries (a project's seeds, or a group's projects) as the master's view holds
/// them: no reports yet, every holder reachable.
pub fn from_entries(entries: &[GrantRecord]) -> BTreeMap<String, SeedRecord> {
    entries
        .iter()
        .map(|e| {
            let holder = SeedRecord {
                granted: e.granted.clone(),
                target: e.target.clone(),
                released_floor: e.released.clone(),
                counted: e.counted.clone(),
                ..SeedRecord::new()
            };
            (e.name.clone(), holder)
        })
        .collect()
}

/// The entries to persist for these holders.
pub fn entries(holders: &BTreeMap<String, SeedRecord>) -> Vec<GrantRecord> {
    holders
        .iter()
        .map(|(name, h)| GrantRecord {
            name: name.clone(),
            granted: h.granted.clone(),
            target: h.target.clone(),
            released: h.released_floor.clone(),
            counted: h.counted.clone(),
        })
        .collect()
}

/// The record to persist at `version` for these per-seed records.
pub fn record(version: u64, seeds: &BTreeMap<String, SeedRecord>) -> ShareRecord {
    ShareRecord {
        version,
        seeds: entries(seeds),
        groups: Vec::new(),
    }
}

/// What the master writes into seed `name`'s ledger spec from a persisted record: its grants and
/// target, and what the other seeds hold as the master sees it.
pub fn ledger_shares(version: u64, name: &str, seeds: &BTreeMap<String, SeedRecord>) -> Option<LedgerShares> {
    let word = seeds.get(name)?.word(version);
    Some(LedgerShares {
        version: word.version,
        granted: word.granted,
        target: word.target,
        released: word.released,
        others: seeds
            .iter()
            .filter(|(other, _)| other.as_str() != name)
            .map(|(other, s)| (other.clone(), s.share_seen()))
            .filter(|(_, share)| !share.is_empty())
            .collect(),
        groups: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Resource;
    use crate::ledger::Allotment;
    use crate::quota_ledger::LedgerSubject;
    use crate::shares::tests::cpu;

    use crate::fixtures::at;

    #[test]
    fn a_ledger_without_shares_is_not_under_shares() {
        let spec = QuotaLedgerSpec {
            rollout_allowance: None,
            subject: LedgerSubject::project("p"),
            quota: cpu(16),
            shares: None,
            reserved_counts: false,
        };
        assert!(seed_share(&spec, None).is_none());
        let spec = QuotaLedgerSpec {
            rollout_allowance: None,
            shares: Some(LedgerShares {
                version: 3,
                granted: cpu(6),
                target: cpu(5),
                ..LedgerShares::default()
            }),
            ..spec
        };
        let status = QuotaLedgerStatus {
            released: Some(cpu(2)),
            ..QuotaLedgerStatus::default()
        };
        let share = seed_share(&spec, Some(&status)).unwrap();
        assert_eq!(share.share(), cpu(4));
        assert_eq!(share.capacity(&cpu(16)), cpu(4));
    }

    #[test]
    fn committed_counts_usage_reservations_and_allotments_and_demand_the_largest_live() {
        let status = QuotaLedgerStatus {
            local_usage: Some(cpu(3)),
            allotments: vec![Allotment {
                holder: "a".into(),
                granted: cpu(2),
                expires_at: at(100),
                ttl_seconds: None,
            }],
            demands: vec![
                ShareDemand {
                    holder: "a".into(),
                    amount: cpu(7),
                    expires_at: at(10),
                    ttl_seconds: None,
                },
                ShareDemand {
                    holder: "b".into(),
                    amount: cpu(9),
                    expires_at: at(5),
                    ttl_seconds: None,
                },
            ],
            ..QuotaLedgerStatus::default()
        };
        assert_eq!(
            committed(&status).unwrap().amount(Resource::Cpu),
            cpu(5).amount(Resource::Cpu)
        );
        assert!(committed(&status).unwrap().saturating_sub(&cpu(5)).is_empty());
        assert_eq!(demand(&status, at(0)), Some(cpu(9)));
        assert_eq!(demand(&status, at(6)), Some(cpu(7)));
        assert_eq!(demand(&status, at(11)), None);
    }

    #[test]
    fn records_round_trip_and_seeds_see_what_others_hold() {
        let mut seeds = BTreeMap::new();
        seeds.insert(
            "a".to_owned(),
            SeedRecord {
                granted: cpu(6),
                target: cpu(6),
                ..SeedRecord::new()
            },
        );
        seeds.insert(
            "b".to_owned(),
            SeedRecord {
                granted: cpu(4),
                target: cpu(4),
                ..SeedRecord::new()
            },
        );
        let r = record(7, &seeds);
        assert_eq!(records(Some(&r)), seeds);
        let word = ledger_shares(7, "a", &seeds).unwrap();
        assert_eq!((word.version, word.granted, word.target), (7, cpu(6), cpu(6)));
        assert_eq!(word.others["b"], cpu(4));
        assert!(ledger_shares(7, "c", &seeds).is_none());
    }
}
