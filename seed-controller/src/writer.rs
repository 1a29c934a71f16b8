//! The writes: `Cluster.status.resourceUsage` and its `ResourceQuotaUsage` condition, and the
//! seed quota copy's `status.localUsage` together with the reservations it makes obsolete.
//!
//! The quota copy write is one JSON merge patch on `/status` carrying the `resourceVersion` it
//! was computed from (compare-and-swap): `localUsage` grows by a Machine in the same write that
//! drops the Machine's reservation, so an admitted Machine is never counted zero times or twice.
//! On 409 Conflict the copy is read again and the write recomputed. Nothing is written when
//! nothing changed.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt, stream};
use jiff::{SignedDuration, Timestamp};
use kkp_quota_crds::kkp::Cluster;
use kkp_quota_crds::quota::{PROJECT_KIND, SUBJECT_KIND_LABEL, SUBJECT_NAME_LABEL};
use kkp_quota_crds::{Resource, ResourceDetails, ResourceQuota};
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::ledger::{DropReason, remaining, reservations_to_drop, unadmitted};
use crate::state::CONDITION_TYPE;
use crate::usage::{as_f64, same_usage};
use crate::{Error, Shared};

/// How many writes run at once.
const CONCURRENCY: usize = 16;
/// Compare-and-swap attempts before giving up for this round (the project stays dirty).
const MAX_ATTEMPTS: usize = 20;

type Outcome = (Option<String>, Option<String>, Result<(), Error>);

/// Waits for changes and writes them, until aborted.
pub async fn run(shared: Arc<Shared>) {
    loop {
        shared.notify.notified().await;
        let (clusters, projects) = {
            let mut state = shared.state();
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
        status["resourceUsage"] = serde_json::to_value(usage).unwrap_or(Value::Null);
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

async fn write_project_inner(shared: &Shared, project: &str) -> Result<(), Error> {
    let api: Api<ResourceQuota> = Api::all(shared.seed.clone());
    let selector = format!("{SUBJECT_NAME_LABEL}={project},{SUBJECT_KIND_LABEL}={PROJECT_KIND}");
    let ttl = SignedDuration::try_from(shared.config.reservation_ttl).unwrap_or(SignedDuration::MAX);
    for _ in 0..MAX_ATTEMPTS {
        let quotas = api.list(&ListParams::default().labels(&selector)).await?;
        // The snapshot is taken after the read: every reservation we see was made before it.
        let plan = shared.state().project_plan(project)?;
        set_usage_gauges(&shared.metrics.local_usage, &[project], &plan.local_usage);
        let Some(quota) = quotas.items.into_iter().next() else {
            // No quota for this project on this seed: nothing to write, nothing was admitted
            // against one.
            shared.state().appeared_checked(&plan.appeared, &[]);
            return Ok(());
        };
        let status = quota.status.clone().unwrap_or_default();
        let drops = reservations_to_drop(&status.reservations, &plan.counted, Timestamp::now(), ttl);
        let bypassed = unadmitted(&plan.appeared, &status.reservations);
        let usage_same = status
            .local_usage
            .as_ref()
            .is_some_and(|u| same_usage(u, &plan.local_usage));
        if usage_same && drops.is_empty() {
            note_unadmitted(shared, &plan.appeared, &bypassed);
            return Ok(());
        }
        let mut patch = json!({
            "metadata": { "resourceVersion": quota.resource_version() },
            "status": { "localUsage": plan.local_usage },
        });
        if !drops.is_empty() {
            let kept = remaining(&status.reservations, &drops);
            patch["status"]["reservations"] = if kept.is_empty() {
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
                let counted = drops.iter().filter(|(_, r)| *r == DropReason::Counted).count();
                let expired = drops.len() - counted;
                shared.metrics.reservations_counted.inc_by(counted as u64);
                shared.metrics.reservations_expired.inc_by(expired as u64);
                for (i, reason) in &drops {
                    let r = &status.reservations[*i];
                    if *reason == DropReason::Expired {
                        info!(cluster = %r.cluster, machine = %r.name, uid = %r.uid, created_at = %r.created_at, "reservation expired: its Machine never appeared");
                    }
                }
                debug!(local_usage = %plan.local_usage, counted, expired, "localUsage written");
                note_unadmitted(shared, &plan.appeared, &bypassed);
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

fn note_unadmitted(shared: &Shared, appeared: &[(String, String)], bypassed: &[(String, String)]) {
    for (cluster, _) in bypassed {
        shared.metrics.unadmitted.with_label_values(&[cluster]).inc();
    }
    shared.state().appeared_checked(appeared, bypassed);
}

/// Watches the seed's quota copies: a new copy, a copy whose `localUsage` is not ours, and copies
/// with reservations (for expiry) get a write.
pub async fn watch_quotas(shared: Arc<Shared>) {
    let api: Api<ResourceQuota> = Api::all(shared.seed.clone());
    let mut stream = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    // Project -> the oldest reservation's creation time.
    let mut oldest: HashMap<String, Timestamp> = HashMap::new();
    let ttl = SignedDuration::try_from(shared.config.reservation_ttl).unwrap_or(SignedDuration::MAX);
    let tick = (shared.config.reservation_ttl / 4).clamp(Duration::from_millis(200), Duration::from_secs(10));
    let mut ticker = tokio::time::interval(tick);
    loop {
        tokio::select! {
            event = stream.next() => match event {
                Some(Ok(Event::InitApply(quota) | Event::Apply(quota))) => {
                    let project = quota.project().to_owned();
                    let status = quota.status.clone().unwrap_or_default();
                    match status.reservations.iter().map(|r| r.created_at).min() {
                        Some(t) => { oldest.insert(project.clone(), t); }
                        None => { oldest.remove(&project); }
                    }
                    let stale = {
                        let state = shared.state();
                        let ours = state.projects().contains(&project);
                        let usage = state.project_plan(&project).map(|p| p.local_usage).ok();
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
                Some(Ok(Event::Delete(quota))) => { oldest.remove(quota.project()); }
                Some(Ok(Event::Init | Event::InitDone)) => {}
                Some(Err(e)) => warn!(error = %e, "ResourceQuota watch on the seed failed; retrying"),
                None => return,
            },
            _ = ticker.tick() => {
                let now = Timestamp::now();
                let due: Vec<String> = oldest
                    .iter()
                    .filter(|(_, t)| t.saturating_add(ttl).is_ok_and(|d| d <= now))
                    .map(|(p, _)| p.clone())
                    .collect();
                if !due.is_empty() {
                    shared.state().dirty_projects.extend(due);
                    shared.wake_writer();
                }
            }
        }
    }
}
