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

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt, stream};
use jiff::{SignedDuration, Timestamp};
use kkp_quota_crds::kkp::Cluster;
use kkp_quota_crds::ledger::group;
use kkp_quota_crds::quota::{PROJECT_KIND, SUBJECT_KIND_LABEL, SUBJECT_NAME_LABEL};
use kkp_quota_crds::quota_ledger::LEDGER_FORMAT;
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
        // Woken by a change, or when the grace of a held-back Machine ends.
        let wakeup = shared.state().grace_wakeups.values().min().copied();
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
            let due: Vec<String> = state
                .grace_wakeups
                .iter()
                .filter(|(_, at)| **at <= now)
                .map(|(p, _)| p.clone())
                .collect();
            for project in due {
                state.grace_wakeups.remove(&project);
                state.dirty_projects.insert(project);
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
        if usage_same && decision.drops.is_empty() && decision.expired.is_empty() {
            judged(shared, project, &decision);
            mirror_to_kkp(shared, &quota.name_any(), project, &decision.local_usage).await?;
            return Ok(());
        }
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
        match api
            .patch_status(&quota.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                let drops = &decision.drops;
                let counted = drops.iter().filter(|(_, r)| *r == DropReason::Counted).count();
                let expired = drops.len() - counted;
                shared.metrics.reservations_counted.inc_by(counted as u64);
                shared.metrics.reservations_expired.inc_by(expired as u64);
                shared
                    .metrics
                    .allotments_expired
                    .inc_by(decision.expired.len() as u64);
                for (i, reason) in drops {
                    let r = &status.reservations[*i];
                    if *reason == DropReason::Expired {
                        info!(cluster = %r.cluster, uid = %r.uid, created_at = %r.created_at, "reservation expired: its Machine never appeared");
                    }
                }
                for &i in &decision.expired {
                    let a = &status.allotments[i];
                    info!(holder = %a.holder, granted = %a.granted, expires_at = %a.expires_at, "allotment expired: its holder stopped renewing it; removed");
                }
                debug!(local_usage = %decision.local_usage, counted, expired, allotments_expired = decision.expired.len(), held = decision.held.len(), "localUsage written");
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

/// Watches the seed's quota copies: a new copy, a copy whose `localUsage` is not ours, and copies
/// with reservations get a write; so does a copy when its oldest reservation's TTL ends or its
/// earliest allotment expires (and again every little while as long as that stays due, e.g. while
/// a cluster is unsettled).
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
                    match ledger_due(&status, ttl) {
                        Some(t) => { due.insert(project.clone(), t); }
                        None => { due.remove(&project); }
                    }
                    let stale = {
                        let state = shared.state();
                        let ours = state.projects().contains(&project);
                        let usage = state
                            .project_plan(&project)
                            .ok()
                            .and_then(|plan| decide(&plan, &status, &shared.config).ok())
                            .map(|d| d.local_usage);
                        let differs = match (&status.local_usage, &usage) {
                            (Some(a), Some(b)) => !same_usage(a, b),
                            _ => true,
                        };
                        (ours || status.local_usage.is_some()) && differs || !status.reservations.is_empty()
                    };
                    if stale {
                        shared.state().dirty_projects.insert(project);
                        shared.wake_writer();
                    }
                }
                Some(Ok(Event::Delete(quota))) => { due.remove(quota.project()); }
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
