//! The master's side of per-seed shares (docs/shares.md): every reconcile of a quota runs one
//! round of the protocol in `kkp_quota_crds::shares` before anything is sent to a seed.
//!
//! 1. **View**: the record (`ProjectQuota.status.shares`) plus what each seed's ledger reports
//!    (`status.released`, what it committed, its live `status.demands`). A seed the master does
//!    not watch (yet) starts with no share; a seed in the record that left the fleet is retiring.
//! 2. **Plan and persist**: grants and targets from the view; when they change anything, the new
//!    record is written with compare-and-swap (a merge patch of `/status` carrying the
//!    `resourceVersion` the view was read from). A conflict re-reads the `ProjectQuota` from the
//!    API server and plans again; any other failure leaves the outcome unknown, so the round
//!    fails and nothing is sent (the next round reads again).
//! 3. **Send** (in [`crate::controller`]): each fresh seed's ledger gets `spec.shares` from the
//!    persisted record only ([`Persisted::ledger_shares`]).
//!
//! The decisions are pure functions below; [`round`] is the I/O around them. [`ShareMemory`]
//! keeps, per quota, the newest `ProjectQuota` this process wrote (the cache lags its own
//! writes, and a compare-and-swap from the cache's older copy would be a certain conflict), and
//! what metrics and logs need from one round to the next.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use kkp_quota_crds::project_quota::{ShareRecord, effective_limits};
use kkp_quota_crds::quota_ledger::LedgerShares;
use kkp_quota_crds::shares::{self, MasterView, Plan, SeedRecord, objects};
use kkp_quota_crds::{ProjectQuota, Quantity, QuantityError, Resource, ResourceDetails, ResourceQuota};
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use tracing::{debug, info};

use crate::Error;
use crate::controller::Ctx;
use crate::seeds::SeedView;

/// Attempts of one round against compare-and-swap conflicts before it gives up (and the
/// reconcile is retried).
pub const MAX_ATTEMPTS: u32 = 5;

/// The slack of every limited resource: `percent` of its limit, rounded down (cpu to whole
/// millicores, every other resource to whole units, so targets stay whole bytes and counts).
pub fn slack(limit: &ResourceDetails, percent: u32) -> ResourceDetails {
    let mut out = ResourceDetails::default();
    for (resource, amount) in limit.iter() {
        let nanos = amount.as_nanos().max(0);
        let pct = i128::from(percent);
        // Exact unless the product overflows; then divide first (an amount that large loses
        // nothing that matters).
        let raw = nanos
            .checked_mul(pct)
            .map_or_else(|| nanos / 100 * pct, |n| n / 100);
        let step = if resource == Resource::Cpu {
            Quantity::from_millis(1).as_nanos()
        } else {
            Quantity::from_units(1).as_nanos()
        };
        out.set(resource, Some(Quantity::from_nanos(raw - raw % step)));
    }
    out
}

/// The master's view of one quota: the record, plus every seed it watches. A seed not in the
/// record starts with no share; `reachable` is whether its watch is fresh; its report is read
/// from its ledger when one is known (a stale seed's last known one: `released` only grows, so
/// an old report is a safe one). A seed in the record that is no longer part of the fleet is
/// retiring and unreachable.
pub fn view(
    limit: &ResourceDetails,
    record: Option<&ShareRecord>,
    seeds: &[SeedView],
    now: Timestamp,
) -> Result<MasterView, QuantityError> {
    let mut records = objects::records(record);
    for seed in seeds {
        #[allow(clippy::unwrap_or_default)] // `new` is not `default`: a new seed is reachable
        let record = records.entry(seed.name.clone()).or_insert_with(SeedRecord::new);
        record.reachable = seed.health.is_fresh();
        if let Some(ledger) = &seed.copy {
            record.observe(objects::report(ledger, now)?);
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
    json!({
        "metadata": {"resourceVersion": resource_version},
        "status": {"shares": record},
    })
}

/// The newer of the cached `ProjectQuota` and the one this process last wrote, by
/// `resourceVersion` (the cache lags this process's own writes).
pub fn newest(
    cached: Option<Arc<ProjectQuota>>,
    written: Option<Arc<ProjectQuota>>,
) -> Option<Arc<ProjectQuota>> {
    let version = |pq: &ProjectQuota| pq.metadata.resource_version.as_deref()?.parse::<u64>().ok();
    match (cached, written) {
        (Some(c), Some(w)) if version(&w) > version(&c) => Some(w),
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
    pub fn ledger_shares(&self, name: &str) -> Option<LedgerShares> {
        objects::ledger_shares(self.version, name, &self.seeds)
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
    /// The persisted record; `None` while there is none.
    pub persisted: Option<Persisted>,
    /// Shares held by unreachable seeds (empty when no plan was made).
    pub stuck: BTreeMap<String, ResourceDetails>,
}

impl Round {
    /// What seed `name`'s ledger spec carries.
    pub fn ledger_shares(&self, name: &str) -> Option<LedgerShares> {
        self.persisted.as_ref()?.ledger_shares(name)
    }

    /// Seed `name`'s figures for the status.
    pub fn figures(&self, name: &str) -> Figures {
        let record = self.persisted.as_ref().and_then(|p| p.seeds.get(name));
        Figures {
            share: record.map(|r| shares::bounded_by(&self.limits, &r.share_seen())),
            demand: record.and_then(|r| r.report.as_ref()?.demand.clone()),
            stuck: self.stuck.contains_key(name),
        }
    }
}

/// A demand the seed's share does not cover yet: for some limited resource it wants more than
/// the master sees it hold.
pub fn unmet(limit: &ResourceDetails, record: &SeedRecord) -> bool {
    let Some(demand) = record.report.as_ref().and_then(|r| r.demand.as_ref()) else {
        return false;
    };
    let share = record.share_seen();
    limit
        .iter()
        .any(|(resource, _)| demand.amount(resource) > share.amount(resource))
}

/// Grant latency bookkeeping. `since` holds, per seed, when the master first saw its demand
/// unmet. `before` is this round's view before the plan (seen at `seen`), `after` the record
/// persisted at `landed` (`None` when nothing was written this round). Returns the latencies
/// of the demands the write covered; a demand that went away, or was met without a write, is
/// dropped without a sample.
pub fn grant_latencies(
    since: &mut BTreeMap<String, Instant>,
    before: &MasterView,
    after: Option<&MasterView>,
    seen: Instant,
    landed: Instant,
) -> Vec<(String, Duration)> {
    since.retain(|name, _| before.seeds.get(name).is_some_and(|r| unmet(&before.limit, r)));
    for (name, record) in &before.seeds {
        if unmet(&before.limit, record) {
            since.entry(name.clone()).or_insert(seen);
        }
    }
    let Some(after) = after else {
        return Vec::new();
    };
    let covered: Vec<String> = since
        .keys()
        .filter(|name| after.seeds.get(*name).is_some_and(|r| !unmet(&after.limit, r)))
        .cloned()
        .collect();
    covered
        .into_iter()
        .filter_map(|name| {
            let at = since.remove(&name)?;
            Some((name, landed.saturating_duration_since(at)))
        })
        .collect()
}

/// The seeds whose reported `released` grew since the last round (`seen` holds the last one
/// read per seed; the first read of a seed is not a release). Seeds gone from the view are
/// forgotten.
pub fn releases(seen: &mut BTreeMap<String, ResourceDetails>, view: &MasterView) -> Vec<String> {
    seen.retain(|name, _| view.seeds.contains_key(name));
    let mut grew = Vec::new();
    for (name, record) in &view.seeds {
        let Some(report) = &record.report else {
            continue;
        };
        if let Some(old) = seen.get(name)
            && Resource::ALL
                .iter()
                .any(|&r| report.released.amount(r) > old.amount(r))
        {
            grew.push(name.clone());
        }
        seen.insert(name.clone(), report.released.clone());
    }
    grew
}

/// Seeds that became stuck, and seeds that no longer are, since the last round (`stuck` holds
/// the last round's).
pub fn stuck_transitions(
    stuck: &mut BTreeSet<String>,
    now_stuck: &BTreeMap<String, ResourceDetails>,
) -> (Vec<String>, Vec<String>) {
    let became: Vec<String> = now_stuck
        .keys()
        .filter(|n| !stuck.contains(*n))
        .cloned()
        .collect();
    let cleared: Vec<String> = stuck
        .iter()
        .filter(|n| !now_stuck.contains_key(*n))
        .cloned()
        .collect();
    *stuck = now_stuck.keys().cloned().collect();
    (became, cleared)
}

/// Seeds whose target the write lowers below the share they hold: they are asked to release.
/// Each with its new target and the share the master sees it hold.
pub fn asked_to_release(
    before: &MasterView,
    after: &MasterView,
) -> Vec<(String, ResourceDetails, ResourceDetails)> {
    after
        .seeds
        .iter()
        .filter_map(|(name, new)| {
            let old = before.seeds.get(name)?;
            let share = shares::bounded_by(&after.limit, &new.share_seen());
            let asks = after.limit.iter().any(|(resource, _)| {
                let Some(target) = new.target.get(resource) else {
                    return false;
                };
                let lowered = old.target.get(resource).is_none_or(|was| target < was);
                lowered && target < share.amount(resource)
            });
            asks.then(|| (name.clone(), new.target.clone(), share))
        })
        .collect()
}

/// What this process remembers of one quota between rounds.
#[derive(Default)]
struct QuotaMemory {
    /// The newest `ProjectQuota` it wrote.
    written: Option<Arc<ProjectQuota>>,
    /// Per seed: when its demand was first seen unmet.
    unmet_since: BTreeMap<String, Instant>,
    /// Per seed: the last `released` read.
    released: BTreeMap<String, ResourceDetails>,
    /// Seeds whose share was stuck in the last round.
    stuck: BTreeSet<String>,
}

/// [`QuotaMemory`] of every quota, by name.
#[derive(Clone, Default)]
pub(crate) struct ShareMemory(Arc<Mutex<BTreeMap<String, QuotaMemory>>>);

impl ShareMemory {
    fn with<T>(&self, quota: &str, f: impl FnOnce(&mut QuotaMemory) -> T) -> T {
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        f(all.entry(quota.to_owned()).or_default())
    }

    /// The newer of `cached` and what this process last wrote of quota `name`; what it wrote is
    /// forgotten once the cache has caught up.
    pub fn newest(&self, name: &str, cached: Option<Arc<ProjectQuota>>) -> Option<Arc<ProjectQuota>> {
        self.with(name, |m| {
            let from_cache = cached.as_ref().map(Arc::as_ptr);
            let chosen = newest(cached, m.written.clone());
            if from_cache.is_some() && chosen.as_ref().map(Arc::as_ptr) == from_cache {
                m.written = None;
            }
            chosen
        })
    }

    /// Remembers `written` as the newest `ProjectQuota` of quota `name`.
    pub fn wrote(&self, name: &str, written: ProjectQuota) {
        self.with(name, |m| m.written = Some(Arc::new(written)));
    }

    /// Forgets quota `name` (deleted).
    pub fn forget(&self, name: &str) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).remove(name);
    }
}

/// One round of the protocol for `master_rq`, starting from `pq` (the newest `ProjectQuota`
/// known). While a seed is settling (not listed since it was added or since this process
/// started) nothing is planned: the record is sent as it is.
pub(crate) async fn round(
    master_rq: &ResourceQuota,
    mut pq: Arc<ProjectQuota>,
    seeds: &[SeedView],
    settling: bool,
    ctx: &Ctx,
) -> Result<Round, Error> {
    let name = master_rq.name_any();
    let project = master_rq.project().to_owned();
    let api: Api<ProjectQuota> = Api::all(ctx.master.clone());
    for _ in 0..MAX_ATTEMPTS {
        let seen = Instant::now();
        let limits = effective_limits(&master_rq.spec.quota.limits, Some(&pq.spec.quota));
        let record = pq.status.as_ref().and_then(|s| s.shares.clone());
        let mut view = view(&limits, record.as_ref(), seeds, Timestamp::now())?;
        if settling {
            let persisted = record.map(|r| {
                view.seeds.retain(|n, _| r.seeds.iter().any(|s| &s.name == n));
                Persisted {
                    version: r.version,
                    seeds: view.seeds,
                }
            });
            return Ok(Round {
                project_quota: pq,
                limits,
                persisted,
                stuck: BTreeMap::new(),
            });
        }
        let before = view.clone();
        let plan = view.plan(&slack(&limits, ctx.share_slack_percent))?;
        let planned_change = view.apply(&plan)?;
        let changed = planned_change || new_seeds(record.as_ref(), &before);
        let old_version = record.as_ref().map_or(0, |r| r.version);
        if !changed {
            after_round(ctx, &name, &project, &before, None, &plan, seen);
            let persisted = record.map(|r| Persisted {
                version: r.version,
                seeds: view.seeds,
            });
            return Ok(Round {
                project_quota: pq,
                limits,
                persisted,
                stuck: plan.stuck,
            });
        }
        let version = old_version + 1;
        let Some(resource_version) = pq.metadata.resource_version.clone() else {
            return Err(Error::ShareRecord(format!(
                "ProjectQuota {name} has no resourceVersion"
            )));
        };
        let patch = record_patch(&resource_version, &objects::record(version, &view.seeds));
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(written) => {
                ctx.metrics.wrote("master", "shares");
                ctx.memory.wrote(&name, written.clone());
                after_round(ctx, &name, &project, &before, Some((&view, version)), &plan, seen);
                return Ok(Round {
                    project_quota: Arc::new(written),
                    limits,
                    persisted: Some(Persisted {
                        version,
                        seeds: view.seeds,
                    }),
                    stuck: plan.stuck,
                });
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                ctx.metrics.share_record_conflicts.inc();
                debug!(version, "share record changed meanwhile; reading it again");
                pq = Arc::new(api.get(&name).await?);
            }
            // Timeout, 5xx, ...: the write may have landed. Send nothing; the next round reads
            // the record again.
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::ShareRecord(format!(
        "the share record of {name} kept changing ({MAX_ATTEMPTS} compare-and-swap conflicts)"
    )))
}

/// Metrics and logs of a round: `after` is the record written (and its version), if any.
fn after_round(
    ctx: &Ctx,
    name: &str,
    project: &str,
    before: &MasterView,
    after: Option<(&MasterView, u64)>,
    plan: &Plan,
    seen: Instant,
) {
    let landed = Instant::now();
    let current = after.map_or(before, |(v, _)| v);
    let (latencies, released, (became, cleared)) = ctx.memory.with(name, |m| {
        (
            grant_latencies(&mut m.unmet_since, before, after.map(|(v, _)| v), seen, landed),
            releases(&mut m.released, before),
            stuck_transitions(&mut m.stuck, &plan.stuck),
        )
    });
    for (_, latency) in latencies {
        ctx.metrics.share_grant_latency.observe(latency.as_secs_f64());
    }
    for seed in released {
        ctx.metrics.share_releases.with_label_values(&[&seed]).inc();
        debug!(seed = %seed, "seed released share");
    }
    for seed in became {
        let share = plan.stuck.get(&seed).cloned().unwrap_or_default();
        info!(seed = %seed, share = %share, "seed unreachable: its share is stuck until it is back");
    }
    for seed in cleared {
        info!(seed = %seed, "share no longer stuck");
    }
    if let Some((view, version)) = after {
        for (seed, amount) in &plan.grants {
            ctx.metrics.share_grants.with_label_values(&[seed]).inc();
            info!(seed = %seed, amount = %amount, version, "share granted");
        }
        for (seed, target, share) in asked_to_release(before, view) {
            info!(seed = %seed, target = %target, share = %share, version, "target lowered: asking the seed to release share");
        }
    }
    let shares: BTreeMap<String, ResourceDetails> = current
        .seeds
        .iter()
        .map(|(seed, r)| (seed.clone(), shares::bounded_by(&current.limit, &r.share_seen())))
        .collect();
    ctx.metrics.set_shares(project, &shares, &plan.stuck);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fold::Health;
    use kkp_quota_crds::project_quota::SeedShareRecord;
    use kkp_quota_crds::quota_ledger::{QuotaLedgerSpec, QuotaLedgerStatus, ShareDemand};
    use kkp_quota_crds::shares::SeedReport;
    use kkp_quota_crds::{LedgerSubject, QuotaLedger};

    fn cpu(n: i64) -> ResourceDetails {
        ResourceDetails {
            cpu: Some(Quantity::from_units(n)),
            ..ResourceDetails::default()
        }
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn ledger(rv: &str, status: QuotaLedgerStatus) -> QuotaLedger {
        let mut l = QuotaLedger::new(
            "project-demo",
            QuotaLedgerSpec {
                subject: LedgerSubject::project("demo"),
                quota: cpu(10),
                shares: None,
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
            copy,
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
                .map(|(n, g, t)| SeedShareRecord {
                    name: (*n).into(),
                    granted: cpu(*g),
                    target: cpu(*t),
                })
                .collect(),
        }
    }

    #[test]
    fn slack_is_a_percentage_of_each_limit_rounded_down() {
        let limit = ResourceDetails {
            cpu: Some(Quantity::from_millis(2500)),
            memory: Some(Quantity::from_gibibytes(8)),
            machines: Some(Quantity::from_units(3)),
            ..ResourceDetails::default()
        };
        let s = slack(&limit, 10);
        assert_eq!(s.cpu, Some(Quantity::from_millis(250)));
        // 858993459.2 bytes: whole bytes only.
        assert_eq!(s.memory, Some(Quantity::from_units(858_993_459)));
        assert_eq!(s.machines, Some(Quantity::ZERO));
        assert_eq!(s.storage, None, "unlimited resources have no slack");
        assert_eq!(slack(&cpu(10), 0), cpu(0));
        assert_eq!(slack(&cpu(10), 100), cpu(10));
        let huge = ResourceDetails {
            cpu: Some(Quantity::from_nanos(i128::MAX)),
            ..ResourceDetails::default()
        };
        assert!(
            slack(&huge, 50).cpu.is_some_and(|q| q > Quantity::ZERO),
            "no overflow"
        );
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
        let v = view(&cpu(10), Some(&rec), &seeds, at(1)).unwrap();
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
        // An expired demand is no demand.
        let later = view(&cpu(10), Some(&rec), &seeds, at(61)).unwrap();
        assert_eq!(later.seeds["a"].report.as_ref().unwrap().demand, None);
        // No record: every seed is new.
        let v = view(&cpu(10), None, &seeds[2..], at(1)).unwrap();
        assert!(new_seeds(None, &v));
        assert!(!new_seeds(Some(&objects::record(1, &v.seeds)), &v));
    }

    #[test]
    fn a_first_round_records_every_seed_with_no_share() {
        let seeds = vec![seed("a", fresh(), None), seed("b", fresh(), None)];
        let mut v = view(&cpu(10), None, &seeds, at(0)).unwrap();
        let plan = v.plan(&slack(&cpu(10), 10)).unwrap();
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
    fn record_patch_is_conditioned_on_the_resource_version() {
        let p = record_patch("123", &record(&[("a", 4, 4)]));
        assert_eq!(p["metadata"]["resourceVersion"], "123");
        assert_eq!(p["status"]["shares"]["version"], 3);
        assert_eq!(p["status"]["shares"]["seeds"][0]["granted"]["cpu"], "4");
    }

    #[test]
    fn newest_prefers_the_higher_resource_version() {
        let pq = |rv: &str| {
            let mut p = ProjectQuota::new(
                "q",
                kkp_quota_crds::ProjectQuotaSpec {
                    subject: LedgerSubject::project("demo"),
                    quota: ResourceDetails::default(),
                },
            );
            p.metadata.resource_version = Some(rv.into());
            Arc::new(p)
        };
        let rv = |p: Option<Arc<ProjectQuota>>| p.and_then(|p| p.metadata.resource_version.clone());
        assert_eq!(rv(newest(Some(pq("10")), Some(pq("12")))), Some("12".into()));
        assert_eq!(rv(newest(Some(pq("13")), Some(pq("12")))), Some("13".into()));
        assert_eq!(rv(newest(None, Some(pq("12")))), Some("12".into()));
        assert_eq!(rv(newest(Some(pq("9")), None)), Some("9".into()));
        let memory = ShareMemory::default();
        memory.wrote("q", (*pq("12")).clone());
        assert_eq!(rv(memory.newest("q", Some(pq("11")))), Some("12".into()));
        assert_eq!(rv(memory.newest("q", Some(pq("12")))), Some("12".into()));
        assert_eq!(
            rv(memory.newest("q", None)),
            None,
            "forgotten once the cache caught up"
        );
    }

    fn with_report(granted: i64, released: i64, demand: Option<i64>) -> SeedRecord {
        SeedRecord {
            granted: cpu(granted),
            target: cpu(granted),
            report: Some(SeedReport {
                version: 1,
                released: cpu(released),
                committed: cpu(0),
                demand: demand.map(cpu),
            }),
            ..SeedRecord::new()
        }
    }

    fn mv(seeds: Vec<(&str, SeedRecord)>) -> MasterView {
        MasterView {
            limit: cpu(10),
            seeds: seeds.into_iter().map(|(n, s)| (n.to_owned(), s)).collect(),
        }
    }

    #[test]
    fn grant_latency_runs_from_first_unmet_to_the_covering_write() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        let t2 = t0 + Duration::from_secs(3);
        let mut since = BTreeMap::new();
        // Round 1: a wants 6, holds 2; nothing written (waiting for a release elsewhere).
        let before = mv(vec![
            ("a", with_report(2, 0, Some(6))),
            ("b", with_report(8, 0, None)),
        ]);
        assert!(grant_latencies(&mut since, &before, None, t0, t0).is_empty());
        assert_eq!(since.get("a"), Some(&t0));
        // Round 2: still unmet; the write grants only part of it.
        let after = mv(vec![("a", with_report(4, 0, Some(6)))]);
        assert!(grant_latencies(&mut since, &before, Some(&after), t1, t1).is_empty());
        assert_eq!(since.get("a"), Some(&t0), "the first sighting counts");
        // Round 3: the write covers it.
        let after = mv(vec![("a", with_report(6, 0, Some(6)))]);
        let samples = grant_latencies(&mut since, &before, Some(&after), t2, t2);
        assert_eq!(samples, vec![("a".to_owned(), Duration::from_secs(3))]);
        assert!(since.is_empty());
        // A demand that goes away is dropped without a sample.
        grant_latencies(&mut since, &before, None, t0, t0);
        let gone = mv(vec![("a", with_report(2, 0, None))]);
        assert!(grant_latencies(&mut since, &gone, None, t1, t1).is_empty());
        assert!(since.is_empty());
    }

    #[test]
    fn releases_count_growth_after_the_first_read() {
        let mut seen = BTreeMap::new();
        assert!(releases(&mut seen, &mv(vec![("a", with_report(5, 1, None))])).is_empty());
        assert!(releases(&mut seen, &mv(vec![("a", with_report(5, 1, None))])).is_empty());
        assert_eq!(
            releases(&mut seen, &mv(vec![("a", with_report(5, 3, None))])),
            vec!["a".to_owned()]
        );
        // No report this round: nothing forgotten, nothing counted.
        assert!(releases(&mut seen, &mv(vec![("a", SeedRecord::new())])).is_empty());
        assert!(releases(&mut seen, &mv(vec![])).is_empty());
        assert!(seen.is_empty());
    }

    #[test]
    fn stuck_is_reported_once_per_transition() {
        let mut stuck = BTreeSet::new();
        let now = BTreeMap::from([("b".to_owned(), cpu(3))]);
        assert_eq!(
            stuck_transitions(&mut stuck, &now),
            (vec!["b".to_owned()], vec![])
        );
        assert_eq!(stuck_transitions(&mut stuck, &now), (vec![], vec![]));
        assert_eq!(
            stuck_transitions(&mut stuck, &BTreeMap::new()),
            (vec![], vec!["b".to_owned()])
        );
    }

    #[test]
    fn a_lowered_target_below_the_share_asks_for_a_release() {
        let before = mv(vec![
            ("a", with_report(6, 0, None)),
            ("b", with_report(2, 0, None)),
        ]);
        let mut after = before.clone();
        after.seeds.get_mut("a").unwrap().target = cpu(1);
        after.seeds.get_mut("b").unwrap().target = cpu(4);
        let asked = asked_to_release(&before, &after);
        assert_eq!(asked, vec![("a".to_owned(), cpu(1), cpu(6))]);
        // Lowered, but not below what it holds (it released already): no ask.
        let mut released = before.clone();
        let a = released.seeds.get_mut("a").unwrap();
        a.report.as_mut().unwrap().released = cpu(5);
        let mut after = released.clone();
        after.seeds.get_mut("a").unwrap().target = cpu(1);
        assert!(asked_to_release(&released, &after).is_empty());
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
                subject: LedgerSubject::project("demo"),
                quota: ResourceDetails::default(),
            },
        );
        let round = Round {
            project_quota: Arc::new(pq),
            limits: cpu(10),
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
