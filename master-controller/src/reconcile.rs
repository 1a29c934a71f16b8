//! One reconcile of a master `ResourceQuota`: the master's own objects in order, the share
//! round, the fan-out to every seed ([`crate::seed_writes`]), the fold of the seeds' usage,
//! and the statuses and metrics that follow from it.

use futures::future;
use jiff::Timestamp;
use kkp_quota_crds::project_quota::SeedFigures;
use kkp_quota_crds::{ProjectQuota, ResourceQuota};
use kkp_quota_runtime::work_queue::Next;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use std::sync::Arc;
use std::time::Instant;
use tracing::{debug, warn};

use crate::Error;
use crate::api::ours;
use crate::ctx::Ctx;
use crate::fanout::{self, FIELD_MANAGER};
use crate::fold::{self, Health, SeedUsage};
use crate::kkp_copies::Retake;
use crate::seed_writes::{fan_out, write_seed_statuses};
use crate::seeds::SeedView;
use crate::shares::{self, Round};
use crate::status;
use crate::status_patches;

#[allow(clippy::too_many_lines)] // one quota's steps, in the order they run
pub(crate) async fn reconcile_quota(master_rq: &ResourceQuota, ctx: &Ctx) -> Result<Next, Error> {
    let name = master_rq.name_any();
    let project_name = master_rq.project().to_owned();
    let api: Api<ResourceQuota> = Api::all(ctx.master.clone());
    if !ctx.seeds.resolved() {
        // Seeds not listed yet: an empty seed set here means "unknown", not "none".
        return Ok(Next::AwaitChange);
    }
    let views = ctx.seeds.views(&name);
    let project = ctx
        .projects
        .get(&ObjectRef::new(&project_name))
        .filter(|p| p.metadata.deletion_timestamp.is_none());
    // The cache lags this process's own writes of the share record; the newer copy counts.
    let mut project_quota = ctx
        .memory
        .newest(&name, ctx.project_quotas.get(&ObjectRef::new(&name)));

    if master_rq.metadata.deletion_timestamp.is_some() {
        return crate::finalize::finalize(
            master_rq,
            &api,
            &views,
            project.as_deref(),
            project_quota.as_deref(),
            ctx,
        )
        .await;
    }

    if !fanout::master_metadata_in_sync(master_rq, project.as_deref()) {
        let patch = fanout::master_metadata_patch(master_rq, project.as_deref(), true);
        let written = ctx
            .metrics
            .timed_write(
                "master",
                "apply",
                api.patch(&name, &ours(), &Patch::Merge(&patch)),
            )
            .await;
        match written {
            Ok(_) => {}
            // Deleted meanwhile, or changed: the watch brings the new state.
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => return Ok(Next::AwaitChange),
            Err(e) => return Err(e.into()),
        }
        debug!("master metadata written");
    }

    let pq_api: Api<ProjectQuota> = Api::all(ctx.master.clone());
    if !fanout::project_quota_in_sync(master_rq, project_quota.as_deref()) {
        let body = fanout::project_quota_apply_body(master_rq);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let applied = ctx
            .metrics
            .timed_write(
                "master",
                "apply",
                pq_api.patch(&name, &params, &Patch::Apply(&body)),
            )
            .await?;
        debug!("ProjectQuota applied");
        ctx.wrote_project_quota(&name, applied.clone());
        project_quota = Some(Arc::new(applied));
    }
    let Some(project_quota) = project_quota else {
        // In sync means it exists; the watch brings it otherwise.
        return Ok(Next::AwaitChange);
    };
    // The quota's siblings from the index, each read from the store (a scan of every quota per
    // reconcile was most of the controller's CPU at 10,000 quotas).
    let siblings: Vec<Arc<ResourceQuota>> = ctx
        .quotas_by_subject
        .siblings(master_rq)
        .iter()
        .filter_map(|name| ctx.quotas.get(&ObjectRef::new(name)))
        .collect();
    if let Some(in_force) = crate::not_in_force::in_force_instead(master_rq, siblings.iter().map(|q| &**q)) {
        return crate::not_in_force::report(master_rq, &project_quota, &in_force, &views, ctx).await;
    }
    ctx.not_in_force.track(&name, false, &ctx.metrics);
    if !master_rq.spec.quota.unreadable.is_empty() {
        return crate::unreadable::report(master_rq, &project_quota, ctx).await;
    }

    // The share round first: grants and targets are persisted in the record before any of it
    // reaches a seed. A round that fails (its write's outcome unknown) sends nothing.
    let settling = views.iter().any(|v| matches!(v.health, Health::Unknown { .. }));
    let policy_spec = project_quota.spec.clone();
    // The figures as the seeds show them now ride in the round's write of the record, when it
    // writes one; the status write after the fan-out then only catches up what changed since.
    let seen_usages = usages(&views);
    let seen = fold::fold(&seen_usages)?;
    let status_with = |round: &Round| {
        let figures = project_figures(master_rq, round, &seen, &seen_usages);
        status_patches::project_quota_status_patch(&round.project_quota, &figures)
    };
    let round = shares::round(master_rq, project_quota, &views, settling, status_with, ctx).await?;
    let limits = round.limits.clone();
    let seed_limits = round.seed_limits.clone();

    // Fan out to every fresh seed, all at once; one seed's failure does not stop the others.
    let applied = future::join_all(views.iter().map(|view| {
        let held = view
            .copy
            .as_ref()
            .and_then(|c| shares::view::held_shares(&c.reading));
        let shares = round.ledger_shares(&view.name).or(held);
        let waiting = round.figures(&view.name).demand.is_some();
        fan_out(
            master_rq,
            &seed_limits,
            shares,
            crate::fanout::Policies::of(Some(&policy_spec)),
            view,
            waiting,
            ctx,
        )
    }))
    .await;
    let mut failed: Vec<String> = Vec::new();
    let mut views: Vec<SeedView> = Vec::with_capacity(applied.len());
    // When a KKP copy is to be applied again (changed by someone else while it was applied, or
    // its retake waiting out its pause).
    let mut retake: Option<Instant> = None;
    for (view, result) in applied {
        match result {
            Err(_) => failed.push(view.name.clone()),
            Ok(Some(Retake::Now)) => retake = Some(Instant::now()),
            Ok(Some(Retake::At(at))) => retake = Some(retake.map_or(at, |r| r.min(at))),
            Ok(None) => {}
        }
        views.push(view);
    }

    let usages = usages(&views);
    let folded = fold::fold(&usages)?;

    if !settling {
        write_master_status(master_rq, &round, &folded, &usages, ctx).await?;
    }

    failed.extend(write_seed_statuses(&name, &views, &folded, ctx).await);

    ctx.metrics
        .set_quota(&project_name, &limits, folded.global.as_ref());
    for u in &usages {
        if u.health.is_known() {
            ctx.metrics
                .set_seed_usage(&project_name, &u.seed, &u.local.clone().unwrap_or_default());
        }
    }
    // Like the global usage, left as it is while some seed's figures are not known. Under the
    // policy `reservedCounts` the room is held inside the usage: no series says it may be short.
    if policy_spec.reserved_counts {
        ctx.metrics.set_reserved(&project_name, None, std::iter::empty());
    } else if folded.global.is_some() {
        ctx.metrics.set_reserved(
            &project_name,
            folded.reserved.as_ref(),
            usages
                .iter()
                .filter_map(|u| Some((u.seed.as_str(), u.reserved.as_ref()?))),
        );
    }

    if failed.is_empty() {
        Ok(retake.map_or(Next::AwaitChange, |at| {
            Next::After(at.saturating_duration_since(Instant::now()))
        }))
    } else {
        Err(Error::Seeds(failed.join(", ")))
    }
}

/// The figures of seeds the record holds that are no longer in the fleet (retired, renamed,
/// or gone): no usage known, and the share they still hold, stuck until they release it or are
/// declared gone (`--gone-seeds`), so that an admin sees where that share went.
fn retired_figures<'a>(round: &'a Round, usages: &'a [SeedUsage]) -> impl Iterator<Item = SeedFigures> + 'a {
    round
        .persisted
        .iter()
        .flat_map(|p| p.seeds.keys())
        .filter(|name| !usages.iter().any(|u| &u.seed == *name))
        .map(|name| {
            let shares = round.figures(name);
            SeedFigures {
                name: name.clone(),
                usage: None,
                reserved: None,
                stale: true,
                share: shares.share,
                demand: None,
                stuck: shares.stuck,
            }
        })
}

/// Every seed's `localUsage` of the quota, as its ledger last showed it.
fn usages(views: &[SeedView]) -> Vec<SeedUsage> {
    views
        .iter()
        .map(|v| SeedUsage {
            seed: v.name.clone(),
            health: v.health,
            local: v.copy.as_ref().and_then(|c| c.local_usage.clone()),
            reserved: v.copy.as_ref().and_then(|c| c.reserved_usage.clone()),
        })
        .collect()
}

/// What the `ProjectQuota`'s status should say after `round`, from `folded` of `usages`: limits,
/// usage, room, per-seed figures and conditions.
fn project_figures(
    master_rq: &ResourceQuota,
    round: &Round,
    folded: &fold::Folded,
    usages: &[SeedUsage],
) -> status_patches::ProjectFigures {
    let (pq, limits) = (&*round.project_quota, &round.limits);
    let pq_status = pq.status.clone().unwrap_or_default();
    let usage_for_limit = folded
        .global
        .clone()
        .or_else(|| pq_status.global_usage.clone())
        .unwrap_or_default();
    let foreign = status::foreign_usage_writers(master_rq, &[FIELD_MANAGER]);
    let desired = [
        status::seeds_stale(&folded.stale),
        status::quota_exceeded(limits, &usage_for_limit),
        status::foreign_quota_controller(&foreign),
    ];
    let mut existing = pq_status.conditions.clone();
    existing.retain(|c| {
        ![
            status::SEED_CLEANUP_PENDING,
            status::QUOTA_INVALID,
            status::NOT_IN_FORCE,
        ]
        .contains(&c.type_.as_str())
    });
    let conditions = status::merge_conditions(
        &existing,
        &desired,
        master_rq.metadata.generation,
        Timestamp::now(),
    );
    status_patches::ProjectFigures {
        limits: limits.clone(),
        global: folded.global.clone(),
        free: folded
            .global
            .as_ref()
            .map(|g| kkp_quota_crds::fit::room(limits, g)),
        reserved: folded.reserved.clone(),
        seeds: usages
            .iter()
            .filter(|u| u.health.is_known())
            .map(|u| {
                let shares = round.figures(&u.seed);
                SeedFigures {
                    name: u.seed.clone(),
                    usage: Some(u.local.clone().unwrap_or_default()),
                    reserved: u.reserved.clone(),
                    stale: !u.health.is_fresh(),
                    share: shares.share,
                    demand: shares.demand,
                    stuck: shares.stuck,
                }
            })
            .chain(retired_figures(round, usages))
            .collect(),
        conditions,
    }
}

/// The master's statuses: the `ProjectQuota`'s ([`project_figures`]) and KKP's `globalUsage`
/// (unless another controller writes it). Not called while a seed is settling: a seed just
/// added (or just started watching) is listed within moments and its first sync triggers every
/// quota again; writing conditions before that would only flap.
async fn write_master_status(
    master_rq: &ResourceQuota,
    round: &Round,
    folded: &fold::Folded,
    usages: &[SeedUsage],
    ctx: &Ctx,
) -> Result<(), Error> {
    let name = master_rq.name_any();
    let api: Api<ResourceQuota> = Api::all(ctx.master.clone());
    let pq_api: Api<ProjectQuota> = Api::all(ctx.master.clone());
    let pq = &*round.project_quota;
    let foreign = status::foreign_usage_writers(master_rq, &[FIELD_MANAGER]);
    if !foreign.is_empty() {
        warn!(writers = %foreign.join(", "), "another controller writes the usage of KKP's ResourceQuota (KKP Enterprise's quota feature?); not writing it there");
    }
    let figures = project_figures(master_rq, round, folded, usages);
    if let Some(patch) = status_patches::project_quota_status_patch(pq, &figures) {
        let params = PatchParams::default();
        let written = ctx
            .metrics
            .timed_write(
                "master",
                "status",
                pq_api.patch_status(&name, &params, &Patch::Merge(&patch)),
            )
            .await?;
        ctx.wrote_project_quota(&name, written);
    }
    let current = master_rq.status.as_ref().and_then(|s| s.global_usage.as_ref());
    if foreign.is_empty()
        && let Some(patch) = status_patches::kkp_status_patch(current, folded.global.as_ref())
    {
        ctx.metrics
            .timed_write(
                "master",
                "status",
                api.patch_status(&name, &ours(), &Patch::Merge(&patch)),
            )
            .await?;
        debug!(global = ?folded.global.as_ref().map(ToString::to_string), "master status written");
    }
    Ok(())
}
