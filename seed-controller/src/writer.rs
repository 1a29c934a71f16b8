//! The writes: `Cluster.status.resourceUsage` and its `ResourceQuotaUsage` condition (in KKP's
//! shape), the seed's `QuotaLedger` `status.localUsage` together with the reservations and
//! expired allotments it makes obsolete, and the same usage in KKP's shape on KKP's own
//! `ResourceQuota` copy.
//!
//! The quota copy write is one JSON merge patch on `/status` carrying the `resourceVersion` it
//! was computed from (compare-and-swap): `localUsage` grows by a Machine in the same write that
//! drops the Machine's reservation, so an admitted Machine is never counted zero times or twice.
//! While the copy has allotments, a Machine that appeared without a reservation is held back
//! (left out of `localUsage`, not judged) until it is reserved or `--admission-record-grace` has
//! passed; the writer wakes itself when the earliest grace ends. On 409 Conflict the copy is read
//! again and the write recomputed. Nothing is written when nothing changed.
//!
//! Under per-seed shares (`spec.shares` set, docs/shares.md) the same write also removes expired
//! `demands` and releases share (`released` grows) computed from the very status it produces:
//! `crate::shares` decides.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt, stream};
use jiff::{SignedDuration, Timestamp};
use kkp_quota_crds::kkp::Cluster;
use kkp_quota_crds::ledger::group;
use kkp_quota_crds::quota::{PROJECT_KIND, SUBJECT_KIND_LABEL, SUBJECT_NAME_LABEL};
use kkp_quota_crds::quota_ledger::{LEDGER_FORMAT, QuotaLedgerSpec};
use kkp_quota_crds::shares::objects::seed_share;
use kkp_quota_crds::{
    QuantityError, QuotaLedger, QuotaLedgerStatus, Resource, ResourceDetails, ResourceQuota,
};
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::ledger::{
    DropReason, allotments_to_expire, grace_ends, held_back, remaining, reservations_to_drop, unadmitted,
    usage_without_held,
};
use crate::shares::{self, Release};
use crate::state::{CONDITION_TYPE, ProjectPlan};
use crate::usage::{as_f64, same_usage};
use crate::{Config, Error, Shared};

/// How many writes run at once.
const CONCURRENCY: usize = 16;
/// Compare-and-swap attempts before giving up for this round (the project stays dirty).
const MAX_ATTEMPTS: usize = 20;

type Outcome = (Option<String>, Option<String>, Result<(), Error>);

/// Waits for changes and writes them, until aborted.
pub async fn run(shared: Arc<Shared>) {
    loop {
        // Woken by a change, when the grace of a held-back Machine ends, or when a quiet period
        // ends.
        let wakeup = {
            let state = shared.state();
            state
                .grace_wakeups
                .values()
                .chain(state.share_wakeups.values())
                .min()
                .copied()
        };
        match wakeup {
            Some(at) => {
                tokio::select! {
                    () = shared.notify.notified() => {}
                    () = tokio::time::sleep_until(tokio::time::Instant::from_std(at)) => {}
                }
            }
            None => shared.notify.notified().await,
        }
        let (clusters, projects) = {
            let mut state = shared.state();
            let now = Instant::now();
            let state = &mut *state;
            for wakeups in [&mut state.grace_wakeups, &mut state.share_wakeups] {
                let due: Vec<String> = wakeups
                    .iter()
                    .filter(|(_, at)| **at <= now)
                    .map(|(p, _)| p.clone())
                    .collect();
                for project in due {
                    wakeups.remove(&project);
                    state.dirty_projects.insert(project);
                }
            }
            if !(state.clusters_listed && state.catalog_loaded) {
                continue;
            }
            (
                std::mem::take(&mut state.dirty_clusters),
                std::mem::take(&mut state.dirty_projects),
            )
        };
        let mut writes: Vec<futures::future::BoxFuture<'static, Outcome>> = Vec::new();
        for name in clusters {
            let shared = Arc::clone(&shared);
            writes.push(
                async move {
                    let span = info_span!("write_cluster", cluster = %name);
                    let result = write_cluster(&shared, &name).instrument(span).await;
                    (Some(name), None, result)
                }
                .boxed(),
            );
        }
        for project in projects {
            let shared = Arc::clone(&shared);
            writes.push(
                async move {
                    let span = info_span!("write_project", project = %project);
                    let result = write_project(&shared, &project).instrument(span).await;
                    (None, Some(project), result)
                }
                .boxed(),
            );
        }
        let outcomes: Vec<Outcome> = stream::iter(writes).buffer_unordered(CONCURRENCY).collect().await;
        let mut failed = Vec::new();
        for (cluster, project, result) in outcomes {
            if let Err(e) = result {
                warn!(cluster = ?cluster, project = ?project, error = %e, "write failed; will retry");
                failed.push((cluster, project));
            }
        }
        if !failed.is_empty() {
            {
                let mut state = shared.state();
                for (cluster, project) in failed {
                    state.dirty_clusters.extend(cluster);
                    state.dirty_projects.extend(project);
                }
            }
            let retry = Arc::clone(&shared);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                retry.wake_writer();
            });
        }
        if !shared.readiness.is_ready() && shared.state().initially_synced() {
            info!("initial sync complete; ready");
            shared.readiness.set(true);
        }
    }
}

fn timed<T>(shared: &Shared, controller: &str, started: Instant, result: &Result<T, Error>) {
    shared
        .metrics
        .reconcile_duration
        .with_label_values(&[controller])
        .observe(started.elapsed().as_secs_f64());
    if result.is_err() {
        shared
            .metrics
            .reconcile_errors
            .with_label_values(&[controller])
            .inc();
    }
}

fn set_usage_gauges(gauge: &prometheus::GaugeVec, prefix: &[&str], usage: &ResourceDetails) {
    for &resource in Resource::ALL {
        let mut labels: Vec<&str> = prefix.to_vec();
        labels.push(resource.name());
        gauge
            .with_label_values(&labels)
            .set(as_f64(usage.amount(resource)));
    }
}

async fn write_cluster(shared: &Shared, name: &str) -> Result<(), Error> {
    let started = Instant::now();
    let result = write_cluster_inner(shared, name).await;
    timed(shared, "cluster", started, &result);
    result
}

async fn write_cluster_inner(shared: &Shared, name: &str) -> Result<(), Error> {
    let Some(plan) = shared.state().cluster_plan(name) else {
        return Ok(());
    };
    let project = plan.project.clone().unwrap_or_default();
    if let Some(usage) = &plan.usage {
        set_usage_gauges(&shared.metrics.cluster_usage, &[name, &project], usage);
    }
    let labels: BTreeSet<(String, String, String)> = plan.unsizeable.keys().cloned().collect();
    for ((provider, flavour, reason), count) in &plan.unsizeable {
        #[allow(clippy::cast_precision_loss)]
        shared
            .metrics
            .unsizeable
            .with_label_values(&[name, provider, flavour, reason])
            .set(*count as f64);
    }
    for (provider, flavour, reason) in shared.state().exported_unsizeable(name, labels) {
        let _ = shared
            .metrics
            .unsizeable
            .remove_label_values(&[name, &provider, &flavour, &reason]);
    }
    if plan.unchanged {
        return Ok(());
    }
    let mut condition = plan.condition.clone();
    let previous = plan
        .observed
        .as_ref()
        .and_then(|s| s.conditions.get(CONDITION_TYPE));
    condition.last_transition_time = match previous {
        Some(p) if p.status == condition.status => p.last_transition_time.clone(),
        _ => Some(
            Timestamp::now()
                .round(jiff::Unit::Second)
                .unwrap_or_else(|_| Timestamp::now())
                .to_string(),
        ),
    };
    condition.last_heartbeat_time = condition.last_transition_time.clone();
    let mut status = json!({ "conditions": { CONDITION_TYPE: condition } });
    if let Some(usage) = &plan.usage {
        // Only what KKP's Cluster declares; gpu and machine count are in the metrics.
        status["resourceUsage"] = serde_json::to_value(usage.kkp_subset()).unwrap_or(Value::Null);
    }
    let api: Api<Cluster> = Api::all(shared.seed.clone());
    match api
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
    {
        Ok(_) => {}
        // Deleted meanwhile: nothing to write.
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    debug!(usage = ?plan.usage.as_ref().map(ToString::to_string), reason = %condition.reason, "cluster status written");
    shared.state().cluster_written(name, plan.usage, plan.condition);
    Ok(())
}

async fn write_project(shared: &Shared, project: &str) -> Result<(), Error> {
    let started = Instant::now();
    let result = write_project_inner(shared, project).await;
    timed(shared, "project", started, &result);
    result
}

/// What one write of a project's quota copy does, from one snapshot and one read of the copy.
struct Decision {
    /// `localUsage`: the plan's usage without the held-back Machines.
    local_usage: ResourceDetails,
    /// Reservations dropped (by index).
    drops: Vec<(usize, DropReason)>,
    /// Allotments removed (by index).
    expired: Vec<usize>,
    /// Share demands removed (by index): their `expiresAt` has passed.
    demands_expired: Vec<usize>,
    /// The copy read had allotments: a Machine judged unadmitted had its grace to be recorded.
    had_allotments: bool,
    /// `(cluster, uid)` of Machines held back (not counted, not judged).
    held: Vec<(String, String)>,
    /// When the earliest held-back Machine's grace ends.
    grace_end: Option<Instant>,
    /// `(cluster, uid)` of appeared Machines judged now, and those of them with no reservation.
    checked: Vec<(String, String)>,
    bypassed: Vec<(String, String)>,
}

fn decide(
    plan: &ProjectPlan,
    status: &QuotaLedgerStatus,
    config: &Config,
) -> Result<Decision, QuantityError> {
    let ttl = SignedDuration::try_from(config.reservation_ttl).unwrap_or(SignedDuration::MAX);
    let grace = config.admission_record_grace;
    let now = Timestamp::now();
    let instant = Instant::now();
    let drops = reservations_to_drop(&status.reservations, &plan.counted, now, ttl);
    let expired = allotments_to_expire(&status.allotments, plan.project_unsettled, now);
    let demands_expired = shares::demands_to_expire(&status.demands, now);
    // A Machine is left out of the count only while an allotment that stays in the written copy
    // may cover it. In a write that removes an expired allotment nothing is held back: the
    // removed one may have covered it (its holder died), and a Machine counted twice for a moment
    // is safe where one counted nowhere is not. An allotment granting nothing covers nothing
    // (its holder admits nothing from it).
    let has_allotments = expired.is_empty() && status.allotments.iter().any(|a| !a.granted.is_empty());
    let held = held_back(
        &plan.appeared,
        &status.reservations,
        has_allotments,
        instant,
        grace,
    );
    let local_usage = usage_without_held(&plan.local_usage, &plan.counted, &plan.appeared, &held)?;
    let held_set: HashSet<usize> = held.iter().copied().collect();
    let judged: Vec<_> = plan
        .appeared
        .iter()
        .enumerate()
        .filter(|(i, _)| !held_set.contains(i))
        .map(|(_, a)| a)
        .collect();
    Ok(Decision {
        local_usage,
        drops,
        expired,
        demands_expired,
        had_allotments: !status.allotments.is_empty(),
        grace_end: grace_ends(&plan.appeared, &held, grace),
        held: held.iter().map(|&i| plan.appeared[i].key()).collect(),
        checked: judged.iter().map(|a| a.key()).collect(),
        bypassed: unadmitted(judged.iter().copied(), &status.reservations),
    })
}

async fn write_project_inner(shared: &Shared, project: &str) -> Result<(), Error> {
    let api: Api<QuotaLedger> = Api::all(shared.seed.clone());
    let selector = format!("{SUBJECT_NAME_LABEL}={project},{SUBJECT_KIND_LABEL}={PROJECT_KIND}");
    for _ in 0..MAX_ATTEMPTS {
        let quotas = api.list(&ListParams::default().labels(&selector)).await?;
        // The snapshot is taken after the read: every reservation we see was made before it.
        let plan = shared.state().project_plan(project)?;
        let Some(quota) = quotas.items.into_iter().next() else {
            // No quota for this project on this seed: nothing to write, nothing was admitted
            // against one.
            set_usage_gauges(&shared.metrics.local_usage, &[project], &plan.local_usage);
            let checked: Vec<_> = plan.appeared.iter().map(crate::ledger::Appeared::key).collect();
            let mut state = shared.state();
            state.grace_wakeups.remove(project);
            state.appeared_checked(&checked, &[], false, shared.config.admission_record_grace);
            return Ok(());
        };
        let status = quota.status.clone().unwrap_or_default();
        let decision = decide(&plan, &status, &shared.config)?;
        set_usage_gauges(&shared.metrics.local_usage, &[project], &decision.local_usage);
        let usage_same = status
            .local_usage
            .as_ref()
            .is_some_and(|u| same_usage(u, &decision.local_usage));
        let release = share_release(
            shared,
            project,
            &quota.spec,
            &status,
            &decision,
            plan.project_unsettled,
        );
        if usage_same
            && decision.drops.is_empty()
            && decision.expired.is_empty()
            && decision.demands_expired.is_empty()
            && release.is_none()
        {
            judged(shared, project, &decision);
            mirror_to_kkp(shared, &quota.name_any(), project, &decision.local_usage).await?;
            return Ok(());
        }
        let patch = ledger_patch(&quota, &status, &decision, release.as_ref());
        match api
            .patch_status(&quota.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                let Dropped {
                    counted,
                    gone,
                    expired,
                } = written(shared, project, &quota.spec, &status, &decision, release.as_ref());
                debug!(local_usage = %decision.local_usage, counted, gone, expired, allotments_expired = decision.expired.len(), held = decision.held.len(), "localUsage written");
                judged(shared, project, &decision);
                mirror_to_kkp(shared, &quota.name_any(), project, &decision.local_usage).await?;
                return Ok(());
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                debug!("quota copy changed meanwhile; recomputing");
            }
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::Config(format!(
        "quota copy of project {project} kept changing during {MAX_ATTEMPTS} attempts"
    )))
}

/// The compare-and-swap merge patch of a write: `localUsage`, and what the write drops or
/// releases, conditioned on the `resourceVersion` read.
fn ledger_patch(
    quota: &QuotaLedger,
    status: &QuotaLedgerStatus,
    decision: &Decision,
    release: Option<&Release>,
) -> Value {
    let mut patch = json!({
        "metadata": { "resourceVersion": quota.resource_version() },
        "status": { "formatVersion": LEDGER_FORMAT, "localUsage": decision.local_usage },
    });
    if !decision.drops.is_empty() {
        let kept = remaining(&status.reservations, decision.drops.iter().map(|(i, _)| *i));
        patch["status"]["reservations"] = if kept.is_empty() {
            Value::Null
        } else {
            json!(group(&kept))
        };
    }
    // Written only when some go, so an unchanged list (the holders' to change) is never
    // rewritten.
    if !decision.expired.is_empty() {
        let kept = remaining(&status.allotments, decision.expired.iter().copied());
        patch["status"]["allotments"] = if kept.is_empty() {
            Value::Null
        } else {
            serde_json::to_value(&kept).unwrap_or(Value::Null)
        };
    }
    // Likewise the demands (each holder's own to write).
    if !decision.demands_expired.is_empty() {
        let kept = remaining(&status.demands, decision.demands_expired.iter().copied());
        patch["status"]["demands"] = if kept.is_empty() {
            Value::Null
        } else {
            serde_json::to_value(&kept).unwrap_or(Value::Null)
        };
    }
    // The release rides on this compare-and-swap: it was computed from the status this very
    // write produces, so nothing can be admitted against share on its way out.
    if let Some(release) = release {
        patch["status"]["released"] = json!(release.released);
    }
    patch
}

/// How many reservations a write dropped, by reason.
struct Dropped {
    counted: usize,
    gone: usize,
    expired: usize,
}

/// After a successful write: metrics and logs of what it dropped and released; returns the
/// reservations dropped.
fn written(
    shared: &Shared,
    project: &str,
    spec: &QuotaLedgerSpec,
    status: &QuotaLedgerStatus,
    decision: &Decision,
    release: Option<&Release>,
) -> Dropped {
    let drops = &decision.drops;
    let count = |reason: DropReason| drops.iter().filter(|(_, r)| *r == reason).count();
    let dropped = Dropped {
        counted: count(DropReason::Counted),
        gone: count(DropReason::Gone),
        expired: count(DropReason::Expired),
    };
    shared.metrics.reservations_counted.inc_by(dropped.counted as u64);
    shared.metrics.reservations_gone.inc_by(dropped.gone as u64);
    shared.metrics.reservations_expired.inc_by(dropped.expired as u64);
    shared
        .metrics
        .allotments_expired
        .inc_by(decision.expired.len() as u64);
    for (i, reason) in drops {
        let r = &status.reservations[*i];
        match reason {
            DropReason::Expired => {
                info!(cluster = %r.cluster, uid = %r.uid, created_at = %r.created_at, "reservation expired: its Machine never appeared");
            }
            DropReason::Gone => {
                debug!(cluster = %r.cluster, uid = %r.uid, "reservation dropped: its Machine was deleted before it was counted");
            }
            DropReason::Counted => {}
        }
    }
    for &i in &decision.expired {
        let a = &status.allotments[i];
        info!(holder = %a.holder, granted = %a.granted, expires_at = %a.expires_at, "allotment expired: its holder stopped renewing it; removed");
    }
    shared
        .metrics
        .demands_expired
        .inc_by(decision.demands_expired.len() as u64);
    for &i in &decision.demands_expired {
        let d = &status.demands[i];
        debug!(holder = %d.holder, amount = %d.amount, expires_at = %d.expires_at, "share demand expired; removed");
    }
    if let Some(release) = release {
        released(shared, project, spec, status, release);
    }
    dropped
}

/// The share release the write of `decision` carries, if shares are in force on the ledger and
/// one is due: computed from the status that write produces (its `localUsage`, the reservations,
/// allotments and demands it keeps, the `released` read). Share arithmetic that fails releases
/// nothing (logged): it never holds up the write of `localUsage` and the reservations.
fn share_release(
    shared: &Shared,
    project: &str,
    spec: &QuotaLedgerSpec,
    status: &QuotaLedgerStatus,
    decision: &Decision,
    project_unsettled: bool,
) -> Option<Release> {
    spec.shares.as_ref()?;
    let settings = shared.config.shares();
    let now = Timestamp::now();
    let after = QuotaLedgerStatus {
        local_usage: Some(decision.local_usage.clone()),
        reservations: remaining(&status.reservations, decision.drops.iter().map(|(i, _)| *i)),
        allotments: remaining(&status.allotments, decision.expired.iter().copied()),
        demands: remaining(&status.demands, decision.demands_expired.iter().copied()),
        ..status.clone()
    };
    // The status read, then the one the write produces: a write that makes `localUsage` grow is a
    // sign of admissions itself.
    let activity = {
        let mut state = shared.state();
        state.ledger_seen(project, status, now);
        state.ledger_seen(project, &after, now)
    };
    let quiet = activity.quiet(&after, project_unsettled, settings.quiet_period, now);
    let slack = kkp_quota_crds::shares::slack(&spec.quota, settings.slack_percent);
    let release = shares::release(spec, &after, &slack, quiet).unwrap_or_else(|e| {
        warn!(project = %project, error = %e, "share arithmetic failed; releasing nothing");
        None
    });
    // The quota watch sets no timer while a cluster of the project is unsettled, and a project
    // that settles without its ledger changing gives it no event to set one on: the writer wakes
    // itself when the quiet period ends. (A write that changes the ledger, such as a release,
    // gives the watch its event.)
    let wakeup = if release.is_none() {
        shares::upkeep(spec, &after, &activity, project_unsettled, settings, now)
            .ok()
            .and_then(|u| u.next)
            .and_then(|at| Duration::try_from(at.duration_since(now)).ok())
            .and_then(|wait| Instant::now().checked_add(wait))
    } else {
        None
    };
    let mut state = shared.state();
    match wakeup {
        Some(at) => state.share_wakeups.insert(project.to_owned(), at),
        None => state.share_wakeups.remove(project),
    };
    release
}

/// After a write that carried `release`: metrics and the log line.
fn released(
    shared: &Shared,
    project: &str,
    spec: &QuotaLedgerSpec,
    status: &QuotaLedgerStatus,
    release: &Release,
) {
    for (resource, amount) in release.amount.iter() {
        shared
            .metrics
            .share_released
            .with_label_values(&[project, resource.name()])
            .inc_by(as_f64(amount));
    }
    let written = QuotaLedgerStatus {
        released: Some(release.released.clone()),
        ..status.clone()
    };
    set_share_gauges(shared, project, spec, Some(&written));
    let held =
        seed_share(spec, Some(&written)).map(|s| kkp_quota_crds::shares::bounded_by(&spec.quota, &s.share()));
    info!(
        released = %release.amount,
        released_total = %release.released,
        held = %held.unwrap_or_default(),
        target = %spec.shares.as_ref().map(|s| s.target.clone()).unwrap_or_default(),
        why = release.why.as_str(),
        "share released"
    );
}

/// `kkp_quota_share_held` of a project: `granted - released` per limited resource while shares
/// are in force on its ledger, nothing otherwise.
fn set_share_gauges(
    shared: &Shared,
    project: &str,
    spec: &QuotaLedgerSpec,
    status: Option<&QuotaLedgerStatus>,
) {
    let held = seed_share(spec, status).map(|s| kkp_quota_crds::shares::bounded_by(&spec.quota, &s.share()));
    for &resource in Resource::ALL {
        let labels = [project, resource.name()];
        match held.as_ref().and_then(|h| h.get(resource)) {
            Some(amount) => shared
                .metrics
                .share_held
                .with_label_values(&labels)
                .set(as_f64(amount)),
            None => {
                let _ = shared.metrics.share_held.remove_label_values(&labels);
            }
        }
    }
}

/// KKP's own `ResourceQuota` copy on this seed (same name as the ledger) gets the seed's usage in
/// KKP's shape, so KKP's views show it. Only cpu, memory and storage; written when it changed
/// since the last write of this process. A copy not there (yet) is skipped: master-controller
/// creates it before the ledger, and the next change writes it.
async fn mirror_to_kkp(
    shared: &Shared,
    name: &str,
    project: &str,
    usage: &ResourceDetails,
) -> Result<(), Error> {
    let usage = usage.kkp_subset();
    if shared.state().kkp_usage_written.get(project) == Some(&usage) {
        return Ok(());
    }
    let api: Api<ResourceQuota> = Api::all(shared.seed.clone());
    let patch = json!({ "status": { "localUsage": usage } });
    let params = PatchParams {
        field_manager: Some(crate::webhook_config::FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    match api.patch_status(name, &params, &Patch::Merge(&patch)).await {
        Ok(_) => {
            shared.state().kkp_usage_written.insert(project.to_owned(), usage);
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// After a write (or none needed): the judged Machines are flagged if unadmitted and forgotten,
/// the held-back ones stay, and the writer is to wake when the earliest grace ends.
fn judged(shared: &Shared, project: &str, decision: &Decision) {
    for (cluster, _) in &decision.bypassed {
        shared.metrics.unadmitted.with_label_values(&[cluster]).inc();
    }
    if !decision.held.is_empty() {
        debug!(
            held = decision.held.len(),
            "Machines without reservation held back while allotments may cover them"
        );
    }
    let mut state = shared.state();
    state.held_back(&decision.held);
    state.appeared_checked(
        &decision.checked,
        &decision.bypassed,
        decision.had_allotments,
        shared.config.admission_record_grace,
    );
    match decision.grace_end {
        Some(at) => {
            state.grace_wakeups.insert(project.to_owned(), at);
        }
        None => {
            state.grace_wakeups.remove(project);
        }
    }
}

/// When a quota copy's ledger next needs a write although nothing changes: its oldest
/// reservation's TTL ends, or its earliest allotment expires.
fn ledger_due(status: &QuotaLedgerStatus, ttl: SignedDuration) -> Option<Timestamp> {
    let reservation = status
        .reservations
        .iter()
        .map(|r| r.created_at.saturating_add(ttl).unwrap_or(Timestamp::MAX))
        .min();
    let allotment = status.allotments.iter().map(|a| a.expires_at).min();
    reservation.into_iter().chain(allotment).min()
}

/// Watches the seed's quota copies: a new copy, a copy whose `localUsage` is not ours, copies
/// with reservations, with an expired demand or with share to release get a write; so does a copy
/// when its oldest reservation's TTL ends, its earliest allotment or live demand expires, or its
/// quiet period ends while it holds share above `committed + slack` (and again every little while
/// as long as a write stays due without changing the copy, e.g. a reservation past its TTL while
/// its cluster is unsettled).
pub async fn watch_quotas(shared: Arc<Shared>) {
    let api: Api<QuotaLedger> = Api::all(shared.seed.clone());
    let mut stream = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    // Project -> when its ledger is next due for a write.
    let mut due: HashMap<String, Timestamp> = HashMap::new();
    let ttl = SignedDuration::try_from(shared.config.reservation_ttl).unwrap_or(SignedDuration::MAX);
    let again =
        (shared.config.reservation_ttl / 4).clamp(Duration::from_millis(200), Duration::from_secs(10));
    let again_signed = SignedDuration::try_from(again).unwrap_or(SignedDuration::from_secs(10));
    let settings = shared.config.shares();
    loop {
        let now = Timestamp::now();
        let wait = due.values().min().map_or(Duration::from_hours(1), |t| {
            Duration::try_from(t.duration_since(now)).unwrap_or(Duration::ZERO)
        });
        tokio::select! {
            event = stream.next() => match event {
                Some(Ok(Event::InitApply(quota) | Event::Apply(quota))) => {
                    let project = quota.project().to_owned();
                    let status = quota.status.clone().unwrap_or_default();
                    set_share_gauges(&shared, &project, &quota.spec, Some(&status));
                    let now = Timestamp::now();
                    let (stale, share_next) = {
                        let mut state = shared.state();
                        let activity = state.ledger_seen(&project, &status, now);
                        let ours = state.projects().contains(&project);
                        let plan = state.project_plan(&project).ok();
                        let usage = plan
                            .as_ref()
                            .and_then(|plan| decide(plan, &status, &shared.config).ok())
                            .map(|d| d.local_usage);
                        let differs = match (&status.local_usage, &usage) {
                            (Some(a), Some(b)) => !same_usage(a, b),
                            _ => true,
                        };
                        let unsettled = plan.as_ref().is_some_and(|p| p.project_unsettled);
                        let upkeep = shares::upkeep(&quota.spec, &status, &activity, unsettled, settings, now)
                            .unwrap_or_else(|e| {
                                warn!(project = %project, error = %e, "share arithmetic failed; releasing nothing");
                                shares::Upkeep::default()
                            });
                        let write_due = (ours || status.local_usage.is_some()) && differs
                            || !status.reservations.is_empty()
                            || upkeep.due_now;
                        (write_due, upkeep.next)
                    };
                    match ledger_due(&status, ttl).into_iter().chain(share_next).min() {
                        Some(t) => { due.insert(project.clone(), t); }
                        None => { due.remove(&project); }
                    }
                    if stale {
                        shared.state().dirty_projects.insert(project);
                        shared.wake_writer();
                    }
                }
                Some(Ok(Event::Delete(quota))) => {
                    let project = quota.project();
                    due.remove(project);
                    shared.state().share_activity.remove(project);
                    for &resource in Resource::ALL {
                        let _ = shared.metrics.share_held.remove_label_values(&[project, resource.name()]);
                    }
                }
                Some(Ok(Event::Init | Event::InitDone)) => {}
                Some(Err(e)) => warn!(error = %e, "QuotaLedger watch on the seed failed; retrying"),
                None => return,
            },
            () = tokio::time::sleep(wait) => {
                let now = Timestamp::now();
                let mut fired = Vec::new();
                for (project, at) in &mut due {
                    if *at <= now {
                        fired.push(project.clone());
                        // Due again a little later, unless a write changes the copy meanwhile.
                        *at = now.saturating_add(again_signed).unwrap_or(Timestamp::MAX);
                    }
                }
                if !fired.is_empty() {
                    shared.state().dirty_projects.extend(fired);
                    shared.wake_writer();
                }
            }
        }
    }
}
