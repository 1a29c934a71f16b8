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
//! The decisions are pure: [`view`] (the view, the record patch, the figures) and
//! [`bookkeeping`] (metrics and logs across rounds); [`round`] is the I/O around them. [`ShareMemory`]
//! keeps, per quota, the newest `ProjectQuota` this process wrote (the cache lags its own
//! writes, and a compare-and-swap from the cache's older copy would be a certain conflict), and
//! what metrics and logs need from one round to the next.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use jiff::Timestamp;
use kkp_quota_crds::project_quota::{ShareRecord, effective_limits};
use kkp_quota_crds::shares::{self, MasterView, Plan, objects};
use kkp_quota_crds::{ProjectQuota, QuotaGroup, ResourceDetails, ResourceQuota};
use kkp_quota_runtime::watch::resource_version;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tracing::{debug, info, warn};

pub mod bookkeeping;
pub mod view;

pub use bookkeeping::{asked_to_release, grant_latencies, releases, stuck_transitions};
pub use view::{Figures, Persisted, Round, gone_to_forget, new_seeds, newest, record_patch};

use crate::Error;
use crate::budgets::Holdings;
use crate::ctx::Ctx;
use crate::seeds::SeedView;

/// Attempts of one round against compare-and-swap conflicts before it gives up (and the
/// reconcile is retried).
pub const MAX_ATTEMPTS: u32 = 5;

/// How long a round waits for the group loop's first listing before it fails (and is retried).
const GROUPS_LISTED_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// What this process remembers of one quota between rounds.
#[derive(Default)]
struct QuotaMemory {
    /// The newest `ProjectQuota` it wrote.
    written: Option<Arc<ProjectQuota>>,
    /// Per seed: when its demand was first seen unmet.
    unmet_since: BTreeMap<String, Instant>,
    /// Per seed: the last `released` read.
    released: Vec<(String, ResourceDetails)>,
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

    /// Forgets what this process wrote of `cached`'s quota once the cache holds it or newer
    /// (called from the `ProjectQuota` watch, for its changes: a relist's objects reach the
    /// store only at the relist's end). Without it a written copy was kept until the
    /// quota's next round: with its turns first come, first served, that is after every other
    /// quota's round at a cold start, and at 10,000 quotas the copies held the master's memory
    /// at more than twice its size.
    pub fn caught_up(&self, cached: &ProjectQuota) {
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(m) = all.get_mut(&cached.name_any())
            && m.written.as_deref().is_some_and(|w| holds(cached, w))
        {
            m.written = None;
        }
    }

    /// Remembers `written` as the newest `ProjectQuota` of quota `name`, unless the cache
    /// (`cached`, read under this memory's lock, which [`ShareMemory::caught_up`] takes after
    /// the cache was updated) holds it or newer already. The watch's event for a write can come
    /// before the write's answer is handled; a copy kept then was never forgotten until the
    /// quota's next round, and at a cold start of 10,000 quotas nearly every quota's copy was
    /// kept that way (39 MB at the master's peak heap, its profile against 19d7fe0's).
    pub fn wrote(
        &self,
        name: &str,
        written: ProjectQuota,
        cached: impl FnOnce() -> Option<Arc<ProjectQuota>>,
    ) {
        self.with(name, |m| {
            let held = cached().is_some_and(|c| holds(&c, &written));
            m.written = (!held).then(|| Arc::new(written));
        });
    }

    /// Forgets quota `name` (deleted).
    pub fn forget(&self, name: &str) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).remove(name);
    }
}

/// Whether `cached` is `written` or newer, by `resourceVersion`.
fn holds(cached: &ProjectQuota, written: &ProjectQuota) -> bool {
    resource_version(written) <= resource_version(cached)
}

/// One round of the protocol for `master_rq`, starting from `pq` (the newest `ProjectQuota`
/// known). While a seed is settling (not listed since it was added or since this process
/// started) nothing is planned: the record is sent as it is.
///
/// `status_with` gives the rest of the `ProjectQuota`'s status patch for a round (its figures,
/// [`crate::reconcile`]): a round that writes the record writes it in the same write, so that a
/// new quota's record and status cost one write, not two.
#[allow(clippy::too_many_lines)] // one round's steps, in the order they run
pub(crate) async fn round<F>(
    master_rq: &ResourceQuota,
    mut pq: Arc<ProjectQuota>,
    seeds: &[SeedView],
    settling: bool,
    status_with: F,
    ctx: &Ctx,
) -> Result<Round, Error>
where
    F: Fn(&Round) -> Option<serde_json::Value> + Sync,
{
    let name = master_rq.name_any();
    let project = master_rq.project().to_owned();
    let api: Api<ProjectQuota> = Api::all(ctx.master.clone());
    let groups = bounding_groups(ctx, &project).await?;
    let carried = crate::budgets::ledger_groups(&groups, &project);
    for _ in 0..MAX_ATTEMPTS {
        let seen = Instant::now();
        let limits = effective_limits(&master_rq.spec.quota.limits, Some(&pq.spec.quota));
        let seed_limits = crate::budgets::seed_limits(&limits, &groups);
        let record = pq.status.as_ref().and_then(|s| s.shares.clone());
        let mut view = view::view(
            &limits,
            record.as_ref(),
            seeds,
            &ctx.draining_seeds,
            Timestamp::now(),
        )?;
        if settling {
            return Ok(Round {
                project_quota: pq,
                limits,
                seed_limits,
                groups: carried.clone(),
                persisted: as_recorded(record, view),
                stuck: BTreeMap::new(),
            });
        }
        let (old_version, adopted) = adopt(&mut view, record.as_ref(), &name, ctx);
        // Planned within the budget of every group selecting the project.
        let old_groups = record.as_ref().map(|r| r.groups.clone()).unwrap_or_default();
        let awaiting = view.awaiting_epoch(old_version + 1);
        let mut holdings = Holdings::take(
            &groups,
            &project,
            &old_groups,
            &view,
            awaiting,
            ctx.share_slack_percent,
        )?;
        view.limit = holdings.member_limit(&limits, &view)?;
        let before = view.clone();
        let mut plan = view.plan_at(
            old_version + 1,
            &shares::slack(&view.limit, ctx.share_slack_percent),
        )?;
        for seed in view::gone_to_forget(&view, seeds, &ctx.gone_seeds) {
            info!(quota = %name, %seed, "seed declared gone (--gone-seeds): forgetting its share, which returns to the quota");
            ctx.metrics.gone_seeds_forgotten.inc();
            plan.forget.push(seed);
        }
        let planned_change = view.apply(&plan)?;
        // Budget released in the same write as the grants it was computed beside.
        let copies = holdings.settle(&view, crate::budgets::quiet(&view))?;
        let seeds_changed = adopted || planned_change || new_seeds(record.as_ref(), &before);
        if !seeds_changed && copies == old_groups {
            after_round(ctx, &name, &project, &before, None, &plan, seen);
            return Ok(Round {
                project_quota: pq,
                limits,
                seed_limits,
                groups: carried.clone(),
                persisted: as_recorded(record, view),
                stuck: plan.stuck,
            });
        }
        // Only group copies changed (a report): the seeds' words keep their version.
        let version = old_version + u64::from(seeds_changed);
        let Some(resource_version) = pq.metadata.resource_version.clone() else {
            return Err(Error::ShareRecord(format!(
                "ProjectQuota {name} has no resourceVersion"
            )));
        };
        let mut written_record = objects::record(version, &view.seeds);
        written_record.groups = copies;
        // The round as it will be once written, its project's status planned from it.
        let planned = Round {
            project_quota: pq.clone(),
            limits,
            seed_limits,
            groups: carried.clone(),
            persisted: Some(Persisted {
                version,
                seeds: view.seeds.clone(),
            }),
            stuck: plan.stuck.clone(),
        };
        let patch = view::with_status(
            record_patch(&resource_version, &written_record),
            status_with(&planned),
        );
        match write_record(ctx, &api, &name, &patch).await {
            Ok(written) => {
                ctx.wrote_project_quota(&name, written.clone());
                after_round(ctx, &name, &project, &before, Some((&view, version)), &plan, seen);
                return Ok(Round {
                    project_quota: Arc::new(written),
                    ..planned
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

/// The record written with compare-and-swap (`patch`: a merge patch of `/status` carrying the
/// `resourceVersion` it was planned from, [`record_patch`]).
async fn write_record(
    ctx: &Ctx,
    api: &Api<ProjectQuota>,
    name: &str,
    patch: &serde_json::Value,
) -> Result<ProjectQuota, kube::Error> {
    let params = PatchParams::default();
    ctx.metrics
        .timed_write(
            "master",
            "shares",
            api.patch_status(name, &params, &Patch::Merge(patch)),
        )
        .await
}

/// The groups that bound `project` (docs/groups.md, "Shared mode"), once the group loop has
/// listed them: none may be missed for a cache not listed yet, or the project would plan within
/// its own limit alone.
async fn bounding_groups(ctx: &Ctx, project: &str) -> Result<Vec<Arc<QuotaGroup>>, Error> {
    if tokio::time::timeout(GROUPS_LISTED_WITHIN, ctx.groups.wait_ready())
        .await
        .is_err()
    {
        return Err(Error::ShareRecord(
            "the QuotaGroups are not listed yet (is their CRD installed, may master-controller list them?): nothing is planned without them".to_owned(),
        ));
    }
    Ok(ctx
        .projects
        .get(&ObjectRef::new(project))
        .map(|p| ctx.groups.selecting(&p))
        .unwrap_or_default())
}

/// A record behind what the seeds hold (lost or restored) is rebuilt from their copies before
/// anything is planned, and written at a version past theirs. Returns the version the next
/// record must exceed, and whether it was rebuilt.
fn adopt(view: &mut MasterView, record: Option<&ShareRecord>, name: &str, ctx: &Ctx) -> (u64, bool) {
    // A new quota has no record either, but no seed holds a word of one: nothing was lost.
    let seeds_hold = view
        .seeds
        .values()
        .any(|r| r.report.as_ref().is_some_and(|rep| rep.holds.is_some()));
    let (old_version, adopted) = view.adopt(record.map_or(0, |r| r.version));
    if adopted && (record.is_some() || seeds_hold) {
        warn!(
            quota = %name,
            version = old_version,
            "the share record is behind what the seeds hold (ProjectQuota re-created or restored): rebuilding it from their ledgers"
        );
        ctx.metrics.share_records_rebuilt.inc();
    }
    (old_version, adopted)
}

/// The record as it is persisted, with this round's reports: what is sent when this round wrote
/// nothing. Only the seeds the record holds (a seed not recorded yet has nothing to be sent).
fn as_recorded(record: Option<ShareRecord>, mut view: MasterView) -> Option<Persisted> {
    let record = record?;
    view.seeds
        .retain(|name, _| record.seeds.iter().any(|s| &s.name == name));
    Some(Persisted {
        version: record.version,
        seeds: view.seeds,
    })
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
            let demand = before
                .seeds
                .get(seed)
                .and_then(|r| r.report.as_ref()?.demand.clone())
                .unwrap_or_default();
            info!(seed = %seed, amount = %amount, demand = %demand, version, "share granted");
        }
        for (seed, target, share) in asked_to_release(before, view) {
            info!(seed = %seed, target = %target, share = %share, version, "target lowered: asking the seed to release share");
        }
    }
    let shares: BTreeMap<String, ResourceDetails> = current
        .seeds
        .iter()
        .map(|(seed, r)| (seed.clone(), r.share_within(&current.limit)))
        .collect();
    ctx.metrics.set_shares(project, &shares, &plan.stuck);
}

#[cfg(test)]
mod tests {
    use super::*;
    use kkp_quota_crds::LedgerSubject;

    #[test]
    fn newest_prefers_the_higher_resource_version() {
        let pq = |rv: &str| {
            let mut p = ProjectQuota::new(
                "q",
                kkp_quota_crds::ProjectQuotaSpec {
                    rollout_allowance: None,
                    subject: LedgerSubject::project("demo"),
                    quota: ResourceDetails::default(),
                    reserved_counts: false,
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
        memory.wrote("q", (*pq("12")).clone(), || None);
        assert_eq!(rv(memory.newest("q", Some(pq("11")))), Some("12".into()));
        assert_eq!(rv(memory.newest("q", Some(pq("12")))), Some("12".into()));
        assert_eq!(
            rv(memory.newest("q", None)),
            None,
            "forgotten once the cache caught up"
        );
        // The watch sees the cache catch up: forgotten without a round, and only then.
        memory.wrote("q", (*pq("14")).clone(), || Some(pq("13")));
        memory.caught_up(&pq("13"));
        assert_eq!(rv(memory.newest("q", None)), Some("14".into()));
        memory.caught_up(&pq("14"));
        assert!(
            memory.0.lock().unwrap()["q"].written.is_none(),
            "the cache holds it"
        );
        // The watch's event for a write came before its answer: nothing to keep.
        memory.wrote("q", (*pq("15")).clone(), || Some(pq("15")));
        assert!(
            memory.0.lock().unwrap()["q"].written.is_none(),
            "the cache held it first"
        );
    }
}
