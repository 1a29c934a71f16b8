//! The master's view of one quota and what a round persists, pure: the record plus what each
//! seed's ledger reports, the compare-and-swap patch of the record, and the figures the status
//! shows. No I/O (see [`super::round`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use jiff::Timestamp;
use kkp_quota_crds::project_quota::ShareRecord;
use kkp_quota_crds::quota_ledger::LedgerShares;
use kkp_quota_crds::shares::objects::LedgerReading;
use kkp_quota_crds::shares::{MasterView, MasterWord, SeedRecord, objects};
use kkp_quota_crds::{LedgerGroup, ProjectQuota, QuantityError, ResourceDetails};
use kkp_quota_runtime::watch::resource_version;
use serde_json::{Value, json};

use crate::seeds::SeedView;

/// The master's view of one quota: the record, plus every seed it watches. A seed not in the
/// record starts with no share; `reachable` is whether its watch is fresh; its report is read
/// from its ledger when one is known (a stale seed's last known one: `released` only grows, so
/// an old report is a safe one). A seed in the record that is no longer part of the fleet is
/// retiring and unreachable. A seed being drained (`draining`) is retiring while it is in the
/// record, and is not put back into it once the plan forgot it (it used nothing by then).
pub fn view(
    limit: &ResourceDetails,
    record: Option<&ShareRecord>,
    seeds: &[SeedView],
    draining: &BTreeSet<String>,
    now: Timestamp,
) -> Result<MasterView, QuantityError> {
    let mut records = objects::records(record);
    for seed in seeds {
        let report = match &seed.copy {
            Some(ledger) => Some(ledger.reading.report(now)?),
            None => None,
        };
        let draining = draining.contains(&seed.name);
        // A drained seed the plan forgot stays out of the record while it uses nothing the
        // quota limits.
        if draining
            && !records.contains_key(&seed.name)
            && report.as_ref().is_none_or(|r| r.uses_nothing_of(limit))
        {
            continue;
        }
        #[allow(clippy::unwrap_or_default)] // `new` is not `default`: a new seed is reachable
        let record = records.entry(seed.name.clone()).or_insert_with(SeedRecord::new);
        record.retiring = draining;
        record.reachable = seed.health.is_fresh();
        if let Some(report) = report {
            record.observe(report);
        }
    }
    for (name, record) in &mut records {
        if !seeds.iter().any(|s| &s.name == name) {
            record.retiring = true;
            record.reachable = false;
        }
    }
    Ok(MasterView {
        limit: limit.clone(),
        seeds: records,
    })
}

/// The seeds of `view` to forget because the admin declared them gone (`--gone-seeds`): in the
/// record, and no longer among the fleet's seeds. Their share returns to the quota at once,
/// whatever they held or used: the admin said their Machines are gone with them. A seed still
/// listed is kept (and counted) whatever the flag says.
pub fn gone_to_forget(view: &MasterView, seeds: &[SeedView], gone: &BTreeSet<String>) -> Vec<String> {
    view.seeds
        .keys()
        .filter(|name| gone.contains(*name) && !seeds.iter().any(|s| &s.name == *name))
        .cloned()
        .collect()
}

/// Whether the view has seeds the record does not (they must be recorded before their
/// ledgers can carry a share).
pub fn new_seeds(record: Option<&ShareRecord>, view: &MasterView) -> bool {
    let recorded: BTreeSet<&str> = record
        .map(|r| r.seeds.iter().map(|s| s.name.as_str()).collect())
        .unwrap_or_default();
    view.seeds.keys().any(|name| !recorded.contains(name.as_str()))
}

/// The compare-and-swap write of the record: a merge patch of the `ProjectQuota`'s `/status`
/// that the API server refuses (409) unless the object is still at `resource_version`.
pub fn record_patch(resource_version: &str, record: &ShareRecord) -> Value {
    let mut shares = json!(record);
    // A merge patch keeps a list it does not carry: an emptied one is sent as such.
    shares["seeds"] = json!(record.seeds);
    shares["groups"] = json!(record.groups);
    json!({
        "metadata": {"resourceVersion": resource_version},
        "status": {"shares": shares},
    })
}

/// `patch` (a [`record_patch`]) with the fields of `status` (`{"status": {...}}`) in its status
/// too, so that one write carries both.
pub fn with_status(mut patch: Value, status: Option<Value>) -> Value {
    if let Some(Value::Object(fields)) = status.and_then(|mut s| s.get_mut("status").map(Value::take))
        && let Some(target) = patch.get_mut("status").and_then(Value::as_object_mut)
    {
        for (key, value) in fields {
            target.entry(key).or_insert(value);
        }
    }
    patch
}

/// The newer of the cached object (a `ProjectQuota`, a `QuotaGroup`) and the one this process
/// last wrote, by `resourceVersion` (the cache lags this process's own writes).
pub fn newest<K: kube::Resource>(cached: Option<Arc<K>>, written: Option<Arc<K>>) -> Option<Arc<K>> {
    match (cached, written) {
        (Some(c), Some(w)) if resource_version(&*w) > resource_version(&*c) => Some(w),
        (None, w) => w,
        (c, _) => c,
    }
}

/// The record as persisted (read back, or just written) with the reports of this round, the
/// only source of what is sent to the seeds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Persisted {
    pub version: u64,
    pub seeds: BTreeMap<String, SeedRecord>,
}

impl Persisted {
    /// What seed `name`'s ledger spec carries; `None` for a seed the record does not hold.
    /// A ledger that holds a newer word than this record (the record was lost or restored and
    /// is not rebuilt yet) keeps its own: the API server refuses an older one, and with it the
    /// whole apply, limits included, so a lowered limit would never reach the seed.
    pub fn ledger_shares(&self, name: &str) -> Option<LedgerShares> {
        let seed = self.seeds.get(name)?;
        let held = seed.report.as_ref().and_then(|r| r.holds.as_ref());
        if let Some(word) = held.filter(|w| w.version > self.version) {
            return Some(kept(word));
        }
        objects::ledger_shares(self.version, name, &self.seeds)
    }
}

/// The shares a ledger holds, to write back unchanged: while there is no record to send from
/// (the `ProjectQuota` re-created and no round has rebuilt it yet), an apply without them would
/// be refused whole, limits included.
pub fn held_shares(reading: &LedgerReading) -> Option<LedgerShares> {
    reading.holds.as_ref().map(kept)
}

fn kept(word: &MasterWord) -> LedgerShares {
    LedgerShares {
        version: word.version,
        granted: word.granted.clone(),
        target: word.target.clone(),
        released: word.released.clone(),
        ..LedgerShares::default()
    }
}

/// One seed's share figures for `ProjectQuota.status.seeds[]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    /// `granted - released` as the master sees it, for the limited resources; `None` while the
    /// record does not hold the seed.
    pub share: Option<ResourceDetails>,
    /// The seed's live demand.
    pub demand: Option<ResourceDetails>,
    /// Its share cannot be moved: the seed is unreachable.
    pub stuck: bool,
}

/// What one round decided and persisted.
#[derive(Clone, Debug)]
pub struct Round {
    /// The newest `ProjectQuota` known after the round (the one written, or re-read).
    pub project_quota: Arc<ProjectQuota>,
    /// The limits in force, from that object.
    pub limits: ResourceDetails,
    /// The limits the seeds' ledgers carry: `limits`, and the limit of any group selecting the
    /// project on a resource the project does not limit itself (docs/groups.md).
    pub seed_limits: ResourceDetails,
    /// The groups bounding the project, as its ledgers carry them (for denials).
    pub groups: Vec<LedgerGroup>,
    /// The persisted record; `None` while there is none.
    pub persisted: Option<Persisted>,
    /// Shares held by unreachable seeds (empty when no plan was made).
    pub stuck: BTreeMap<String, ResourceDetails>,
}

impl Round {
    /// What seed `name`'s ledger spec carries.
    pub fn ledger_shares(&self, name: &str) -> Option<LedgerShares> {
        let mut shares = self.persisted.as_ref()?.ledger_shares(name)?;
        shares.groups.clone_from(&self.groups);
        Some(shares)
    }

    /// Seed `name`'s figures for the status.
    pub fn figures(&self, name: &str) -> Figures {
        let record = self.persisted.as_ref().and_then(|p| p.seeds.get(name));
        Figures {
            share: record.map(|r| r.share_within(&self.limits)),
            demand: record.and_then(|r| r.report.as_ref()?.demand.clone()),
            stuck: self.stuck.contains_key(name),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::fold::Health;
    use crate::seed_ledger::SeedLedger;
    use kkp_quota_crds::project_quota::GrantRecord;
    use kkp_quota_crds::quota_ledger::{QuotaLedgerSpec, QuotaLedgerStatus, ShareDemand};
    use kkp_quota_crds::shares::SeedReport;
    use kkp_quota_crds::{LedgerSubject, Quantity, QuotaLedger, Resource};

    pub(crate) use kkp_quota_crds::fixtures::cpu;

    use kkp_quota_crds::fixtures::at;

    fn ledger(rv: &str, status: QuotaLedgerStatus) -> QuotaLedger {
        let mut l = QuotaLedger::new(
            "project-demo",
            QuotaLedgerSpec {
                rollout_allowance: None,
                subject: LedgerSubject::project("demo"),
                quota: cpu(10),
                shares: None,
                reserved_counts: false,
            },
        );
        l.metadata.resource_version = Some(rv.into());
        l.status = Some(status);
        l
    }

    fn seed(name: &str, health: Health, copy: Option<QuotaLedger>) -> SeedView {
        SeedView {
            name: name.into(),
            client: None,
            health,
            copy: copy.map(|c| Arc::new(SeedLedger::from(&c))),
        }
    }

    fn fresh() -> Health {
        Health::Fresh { last_sync: at(0) }
    }

    fn record(seeds: &[(&str, i64, i64)]) -> ShareRecord {
        ShareRecord {
            version: 3,
            seeds: seeds
                .iter()
                .map(|(n, g, t)| GrantRecord {
                    name: (*n).into(),
                    granted: cpu(*g),
                    target: cpu(*t),
                    ..GrantRecord::default()
                })
                .collect(),
            groups: Vec::new(),
        }
    }

    pub(crate) fn with_report(granted: i64, released: i64, demand: Option<i64>) -> SeedRecord {
        SeedRecord {
            granted: cpu(granted),
            target: cpu(granted),
            report: Some(SeedReport {
                version: 1,
                released: cpu(released),
                committed: cpu(0),
                demand: demand.map(cpu),
                holds: None,
            }),
            ..SeedRecord::new()
        }
    }

    pub(crate) fn mv(seeds: Vec<(&str, SeedRecord)>) -> MasterView {
        MasterView {
            limit: cpu(10),
            seeds: seeds.into_iter().map(|(n, s)| (n.to_owned(), s)).collect(),
        }
    }

    /// A seed being drained (`--draining-seeds`) while still in the fleet: no grant and a zero
    /// target while it uses something; forgotten once it holds and uses nothing, and not put
    /// back into the record while it stays listed and unused; back, retiring, if usage shows up.
    #[test]
    fn a_draining_seed_hands_its_share_back_and_leaves_the_record() {
        let draining: BTreeSet<String> = ["b".to_owned()].into();
        let using = |committed: i64, released: i64| QuotaLedgerStatus {
            local_usage: Some(cpu(committed)),
            released: Some(cpu(released)),
            demands: vec![ShareDemand {
                holder: "w".into(),
                amount: cpu(9),
                expires_at: at(60),
                ttl_seconds: None,
            }],
            ..QuotaLedgerStatus::default()
        };
        let rec = record(&[("a", 5, 5), ("b", 5, 5)]);
        let seeds = vec![
            seed("a", fresh(), Some(ledger("1", QuotaLedgerStatus::default()))),
            seed("b", fresh(), Some(ledger("2", using(2, 0)))),
        ];
        let v = view(&cpu(10), Some(&rec), &seeds, &draining, at(1)).unwrap();
        assert!(v.seeds["b"].retiring && v.seeds["b"].reachable);
        let plan = v.plan(&cpu(0)).unwrap();
        assert_eq!(plan.targets["b"], cpu(0), "{plan:?}");
        assert!(
            !plan.grants.contains_key("b") && plan.forget.is_empty(),
            "{plan:?}"
        );

        // Everything released and nothing used: forgotten, and kept out while it stays so.
        let seeds = vec![
            seed("a", fresh(), Some(ledger("1", QuotaLedgerStatus::default()))),
            seed(
                "b",
                fresh(),
                Some(ledger(
                    "3",
                    QuotaLedgerStatus {
                        released: Some(cpu(5)),
                        ..using(0, 5)
                    },
                )),
            ),
        ];
        let mut v = view(&cpu(10), Some(&rec), &seeds, &draining, at(2)).unwrap();
        let plan = v.plan(&cpu(0)).unwrap();
        assert_eq!(plan.forget, ["b"]);
        v.apply(&plan).unwrap();
        let rec = objects::record(4, &v.seeds);
        let v = view(&cpu(10), Some(&rec), &seeds, &draining, at(3)).unwrap();
        assert!(!v.seeds.contains_key("b") && !new_seeds(Some(&rec), &v), "{v:?}");

        // Usage appearing on it without an admission (a catalog edit) puts it back, retiring.
        let seeds = vec![seed("b", fresh(), Some(ledger("4", using(1, 5))))];
        let v = view(&cpu(10), Some(&rec), &seeds, &draining, at(4)).unwrap();
        assert!(v.seeds["b"].retiring, "{v:?}");
    }

    #[test]
    fn view_reads_the_record_and_the_ledgers() {
        let status = QuotaLedgerStatus {
            local_usage: Some(cpu(2)),
            released: Some(cpu(1)),
            demands: vec![ShareDemand {
                holder: "w".into(),
                amount: cpu(6),
                expires_at: at(60),
                ttl_seconds: None,
            }],
            ..QuotaLedgerStatus::default()
        };
        let seeds = vec![
            seed("a", fresh(), Some(ledger("42", status))),
            seed(
                "b",
                Health::Stale {
                    since: at(0),
                    last_sync: Some(at(-5)),
                },
                Some(ledger("7", QuotaLedgerStatus::default())),
            ),
            seed("new", fresh(), None),
        ];
        let rec = record(&[("a", 5, 5), ("b", 3, 3), ("gone", 2, 2)]);
        let v = view(&cpu(10), Some(&rec), &seeds, &BTreeSet::new(), at(1)).unwrap();
        assert_eq!(v.limit, cpu(10));
        let a = &v.seeds["a"];
        assert_eq!((a.granted.clone(), a.target.clone()), (cpu(5), cpu(5)));
        assert!(a.reachable && !a.retiring);
        let report = a.report.clone().unwrap();
        assert_eq!(
            (report.version, report.released, report.demand),
            (42, cpu(1), Some(cpu(6)))
        );
        assert_eq!(report.committed.amount(Resource::Cpu), Quantity::from_units(2));
        assert!(report.committed.saturating_sub(&cpu(2)).is_empty());
        assert_eq!(a.share_seen(), cpu(4));
        let b = &v.seeds["b"];
        assert!(!b.reachable, "a stale seed is unreachable");
        assert!(b.report.is_some(), "its last known ledger still reports");
        let new = &v.seeds["new"];
        assert_eq!(*new, SeedRecord::new(), "a new seed starts with no share");
        let gone = &v.seeds["gone"];
        assert!(gone.retiring && !gone.reachable && gone.report.is_none());
        assert_eq!(gone.granted, cpu(2));
        assert!(new_seeds(Some(&rec), &v));
        // Declared gone: forgotten once unlisted; a listed seed never is.
        let declared: BTreeSet<String> = ["gone", "b", "elsewhere"].map(String::from).into();
        assert_eq!(gone_to_forget(&v, &seeds, &declared), vec!["gone".to_owned()]);
        assert!(gone_to_forget(&v, &seeds, &BTreeSet::new()).is_empty());
        // An expired demand is no demand.
        let later = view(&cpu(10), Some(&rec), &seeds, &BTreeSet::new(), at(61)).unwrap();
        assert_eq!(later.seeds["a"].report.as_ref().unwrap().demand, None);
        // No record: every seed is new.
        let v = view(&cpu(10), None, &seeds[2..], &BTreeSet::new(), at(1)).unwrap();
        assert!(new_seeds(None, &v));
        assert!(!new_seeds(Some(&objects::record(1, &v.seeds)), &v));
    }

    #[test]
    fn a_first_round_records_every_seed_with_no_share() {
        let seeds = vec![seed("a", fresh(), None), seed("b", fresh(), None)];
        let mut v = view(&cpu(10), None, &seeds, &BTreeSet::new(), at(0)).unwrap();
        let plan = v.plan(&kkp_quota_crds::shares::slack(&cpu(10), 10)).unwrap();
        assert!(plan.grants.is_empty());
        assert!(v.apply(&plan).unwrap());
        let persisted = Persisted {
            version: 1,
            seeds: v.seeds,
        };
        let word = persisted.ledger_shares("a").unwrap();
        assert_eq!(
            (word.version, word.granted.amount(Resource::Cpu)),
            (1, Quantity::ZERO)
        );
        assert!(persisted.ledger_shares("c").is_none());
    }

    #[test]
    fn the_status_rides_in_the_record_write() {
        let patch = with_status(
            record_patch("7", &record(&[("a", 4, 4)])),
            Some(json!({"status": {"globalUsage": {"cpu": "1"}, "shares": "never over the record"}})),
        );
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
        assert_eq!(patch["status"]["globalUsage"], json!({"cpu": "1"}));
        assert_eq!(
            patch["status"]["shares"],
            record_patch("7", &record(&[("a", 4, 4)]))["status"]["shares"]
        );
        assert_eq!(
            with_status(record_patch("7", &record(&[])), None),
            record_patch("7", &record(&[]))
        );
    }

    #[test]
    fn record_patch_is_conditioned_on_the_resource_version() {
        let p = record_patch("123", &record(&[("a", 4, 4)]));
        assert_eq!(p["metadata"]["resourceVersion"], "123");
        assert_eq!(p["status"]["shares"]["version"], 3);
        assert_eq!(p["status"]["shares"]["seeds"][0]["granted"]["cpu"], "4");
    }

    #[test]
    fn figures_come_from_the_persisted_record_and_the_plan() {
        let persisted = Persisted {
            version: 2,
            seeds: mv(vec![("a", with_report(6, 1, Some(7)))]).seeds,
        };
        let pq = ProjectQuota::new(
            "q",
            kkp_quota_crds::ProjectQuotaSpec {
                rollout_allowance: None,
                subject: LedgerSubject::project("demo"),
                quota: ResourceDetails::default(),
                reserved_counts: false,
            },
        );
        let round = Round {
            project_quota: Arc::new(pq),
            limits: cpu(10),
            seed_limits: cpu(10),
            groups: Vec::new(),
            persisted: Some(persisted),
            stuck: BTreeMap::from([("a".to_owned(), cpu(5))]),
        };
        assert_eq!(
            round.figures("a"),
            Figures {
                share: Some(cpu(5)),
                demand: Some(cpu(7)),
                stuck: true,
            }
        );
        assert_eq!(round.figures("x"), Figures::default());
        assert_eq!(round.ledger_shares("a").map(|s| s.version), Some(2));
    }
}
