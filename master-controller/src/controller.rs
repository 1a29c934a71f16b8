//! The wiring: one watch of the master's `ResourceQuota`s (a kube-runtime `Controller`), one
//! watch of quota copies per seed (see [`crate::seeds`]) whose events are merged into that
//! controller, the default-quota loop, the orphan sweep and a periodic resync.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, future, stream};
use jiff::Timestamp;
use kkp_quota_crds::ResourceQuota;
use kkp_quota_crds::kkp::{KubermaticSetting, Project};
use kkp_quota_crds::runtime::leader::{LeaderElector, LeaseConfig};
use kkp_quota_crds::runtime::ops::Readiness;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::{Notify, mpsc};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::fanout::{self, FIELD_MANAGER};
use crate::fold::{self, Health, SeedUsage};
use crate::metrics::Metrics;
use crate::seeds::{self, SeedView, Seeds, Triggers};
use crate::status;
use crate::{Error, default_quota};

/// How the controller runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// Namespace of the `Seed` objects on the master.
    pub seed_namespace: String,
    /// Every quota is reconciled at least this often (a safety net; work is event-driven).
    pub resync_period: Duration,
    /// Leader election; `None` runs without (a single replica, or tests).
    pub lease: Option<LeaseConfig>,
    /// Quotas reconciled at the same time.
    pub concurrency: u16,
    /// Longest wait between two attempts to reach an unreachable seed.
    pub seed_max_backoff: Duration,
}

impl Options {
    pub fn new(seed_namespace: impl Into<String>) -> Options {
        Options {
            seed_namespace: seed_namespace.into(),
            resync_period: Duration::from_mins(1),
            lease: None,
            concurrency: 16,
            seed_max_backoff: Duration::from_secs(2),
        }
    }
}

/// Runs the controller until it fails or the lease is lost. With a lease configured, it first
/// waits to become leader; a replica that is not the leader writes nothing.
pub async fn run(
    master: Client,
    options: Options,
    metrics: Metrics,
    readiness: Readiness,
) -> Result<(), Error> {
    let Some(lease) = options.lease.clone() else {
        metrics.leader.set(1);
        return Box::pin(run_as_leader(master, options, metrics, readiness)).await;
    };
    // A standby replica is healthy and ready; it becomes not-ready while taking over.
    readiness.set(true);
    let elector = LeaderElector::new(master.clone(), lease.clone());
    let work = {
        let (metrics, readiness) = (metrics.clone(), readiness.clone());
        async move {
            info!(identity = %lease.identity, "became leader");
            metrics.leader.set(1);
            readiness.set(false);
            Box::pin(run_as_leader(master, options, metrics, readiness)).await
        }
    };
    let result = Box::pin(elector.run(work)).await;
    metrics.leader.set(0);
    readiness.set(false);
    result?
}

struct Ctx {
    master: Client,
    seeds: Seeds,
    projects: Store<Project>,
    metrics: Metrics,
}

fn channel_stream<T: Send + 'static>(
    rx: mpsc::UnboundedReceiver<T>,
) -> impl futures::Stream<Item = T> + Send {
    stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|v| (v, rx)) })
}

#[allow(clippy::too_many_lines)] // the wiring reads best in one place
async fn run_as_leader(
    master: Client,
    options: Options,
    metrics: Metrics,
    readiness: Readiness,
) -> Result<(), Error> {
    let seeds = Seeds::default();
    let (one_tx, one_rx) = mpsc::unbounded_channel::<String>();
    let (all_tx, all_rx) = mpsc::unbounded_channel::<()>();
    let orphans = Arc::new(Notify::new());
    let defaults = Arc::new(Notify::new());
    let triggers = Triggers {
        one: one_tx.clone(),
        all: all_tx.clone(),
        orphans: orphans.clone(),
    };
    let wc = watcher::Config::default();

    let quota_api: Api<ResourceQuota> = Api::all(master.clone());
    let (quotas, quota_writer) = reflector::store();
    let quota_events = {
        let (defaults, orphans) = (defaults.clone(), orphans.clone());
        reflector::reflector(quota_writer, watcher::watcher(quota_api.clone(), wc.clone()))
            .default_backoff()
            .inspect(move |_| {
                defaults.notify_one();
                orphans.notify_one();
            })
            .applied_objects()
    };

    let (projects, project_writer) = reflector::store();
    let project_events = {
        let (defaults, quotas, one_tx) = (defaults.clone(), quotas.clone(), one_tx.clone());
        reflector::reflector(
            project_writer,
            watcher::watcher(Api::<Project>::all(master.clone()), wc.clone()),
        )
        .default_backoff()
        .applied_objects()
        .for_each(move |p| {
            defaults.notify_one();
            if let Ok(p) = p {
                let project = p.name_any();
                for q in quotas.state() {
                    if q.spec.subject.name == project {
                        let _ = one_tx.send(q.name_any());
                    }
                }
            }
            future::ready(())
        })
    };

    let (settings, settings_writer) = reflector::store();
    let settings_events = {
        let defaults = defaults.clone();
        reflector::reflector(
            settings_writer,
            watcher::watcher(Api::<KubermaticSetting>::all(master.clone()), wc.clone()),
        )
        .default_backoff()
        .for_each(move |_| {
            defaults.notify_one();
            future::ready(())
        })
    };

    let ctx = Arc::new(Ctx {
        master: master.clone(),
        seeds: seeds.clone(),
        projects: projects.clone(),
        metrics: metrics.clone(),
    });
    let controller = Controller::for_stream(quota_events, quotas.clone())
        .with_config(ControllerConfig::default().concurrency(options.concurrency))
        .reconcile_on(channel_stream(one_rx).map(|name| ObjectRef::new(&name)))
        .reconcile_all_on(channel_stream(all_rx))
        .run(reconcile, error_policy, ctx)
        .for_each(|result| {
            if let Err(e) = result {
                debug!(error = %e, "controller event");
            }
            future::ready(())
        });

    let resync = {
        let all_tx = all_tx.clone();
        let period = options.resync_period;
        async move {
            let mut ticker = tokio::time::interval(period);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                let _ = all_tx.send(());
            }
        }
    };

    let ready = {
        let (quotas, projects, settings, readiness) = (
            quotas.clone(),
            projects.clone(),
            settings.clone(),
            readiness.clone(),
        );
        async move {
            let _ = quotas.wait_until_ready().await;
            let _ = projects.wait_until_ready().await;
            let _ = settings.wait_until_ready().await;
            readiness.set(true);
            info!("master caches synced");
            future::pending::<()>().await;
        }
    };

    let default_loop = default_quota_loop(
        quota_api.clone(),
        settings,
        projects.clone(),
        quotas.clone(),
        defaults,
        metrics.clone(),
    );
    let orphan_loop = orphan_sweep(quotas, seeds.clone(), orphans, metrics.clone());
    let seed_manager = seeds::manage(
        master,
        options.seed_namespace.clone(),
        seeds,
        triggers,
        metrics,
        options.seed_max_backoff,
    );

    tokio::select! {
        () = controller => Err(Error::Stopped("quota controller")),
        () = project_events => Err(Error::Stopped("project watch")),
        () = settings_events => Err(Error::Stopped("settings watch")),
        () = resync => Err(Error::Stopped("resync")),
        () = ready => Err(Error::Stopped("readiness")),
        () = default_loop => Err(Error::Stopped("default quota loop")),
        () = orphan_loop => Err(Error::Stopped("orphan sweep")),
        () = seed_manager => Err(Error::Stopped("seed manager")),
    }
}

/// Longest wait for one call to a seed: a seed that hangs must not hold up a reconcile (and so
/// the other seeds' view of that quota) for the client's much longer default timeouts.
const SEED_CALL_TIMEOUT: Duration = Duration::from_secs(10);

async fn bounded<T>(
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    match tokio::time::timeout(SEED_CALL_TIMEOUT, call).await {
        Ok(result) => result,
        Err(_) => Err(kube::Error::Service(Box::new(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer from the seed within {SEED_CALL_TIMEOUT:?}"),
        )))),
    }
}

#[allow(clippy::needless_pass_by_value)] // the signature kube-runtime asks for
fn error_policy(quota: Arc<ResourceQuota>, error: &Error, ctx: Arc<Ctx>) -> Action {
    warn!(quota = %quota.name_any(), project = %quota.project(), error = %error, "reconcile failed; retrying");
    ctx.metrics.reconcile_errors.with_label_values(&["quota"]).inc();
    Action::requeue(Duration::from_secs(2))
}

async fn reconcile(quota: Arc<ResourceQuota>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let span = info_span!("reconcile", quota = %quota.name_any(), project = %quota.project());
    let start = Instant::now();
    let result = reconcile_quota(&quota, &ctx).instrument(span).await;
    ctx.metrics
        .reconcile_duration
        .with_label_values(&["quota"])
        .observe(start.elapsed().as_secs_f64());
    result
}

async fn reconcile_quota(master_rq: &ResourceQuota, ctx: &Ctx) -> Result<Action, Error> {
    let name = master_rq.name_any();
    let project_name = master_rq.project().to_owned();
    let api: Api<ResourceQuota> = Api::all(ctx.master.clone());
    if !ctx.seeds.resolved() {
        // Seeds not listed yet: an empty seed set here means "unknown", not "none".
        return Ok(Action::await_change());
    }
    let views = ctx.seeds.views(&name);
    let project = ctx
        .projects
        .get(&ObjectRef::new(&project_name))
        .filter(|p| p.metadata.deletion_timestamp.is_none());

    if master_rq.metadata.deletion_timestamp.is_some() {
        return finalize(master_rq, &api, &views, project.as_deref(), ctx).await;
    }

    if !fanout::master_metadata_in_sync(master_rq, project.as_deref()) {
        let body = fanout::master_metadata_apply(master_rq, project.as_deref(), true);
        if let Err(e) = api
            .patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
        {
            // Deleted meanwhile (the apply cannot re-create it: the schema requires a spec).
            if api.get_opt(&name).await?.is_none() {
                return Ok(Action::await_change());
            }
            return Err(e.into());
        }
        ctx.metrics.wrote("master", "apply");
        debug!("master metadata applied");
    }

    // Fan out to every fresh seed, all at once; one seed's failure does not stop the others.
    let applied = future::join_all(views.iter().map(|view| fan_out(master_rq, view, ctx))).await;
    let mut failed: Vec<String> = Vec::new();
    let mut views: Vec<SeedView> = Vec::with_capacity(applied.len());
    for (view, result) in applied {
        if let Err(seed) = result {
            failed.push(seed);
        }
        views.push(view);
    }

    let usages: Vec<SeedUsage> = views
        .iter()
        .map(|v| SeedUsage {
            seed: v.name.clone(),
            health: v.health,
            local: v
                .copy
                .as_ref()
                .and_then(|c| c.status.as_ref()?.local_usage.clone()),
        })
        .collect();
    let folded = fold::fold(&usages)?;

    let status_now = master_rq.status.clone().unwrap_or_default();
    let usage_for_limit = folded
        .global
        .clone()
        .or_else(|| status_now.global_usage.clone())
        .unwrap_or_default();
    let desired = [
        status::seeds_stale(&folded.stale),
        status::quota_exceeded(&master_rq.spec.quota, &usage_for_limit),
    ];
    let mut existing = status_now.conditions.clone();
    existing.retain(|c| c.type_ != status::SEED_CLEANUP_PENDING);
    let conditions = status::merge_conditions(
        &existing,
        &desired,
        master_rq.metadata.generation,
        Timestamp::now(),
    );
    // A seed just added (or just started watching) is listed within moments; its first sync
    // triggers every quota again. Writing conditions before that would only flap.
    let settling = views.iter().any(|v| matches!(v.health, Health::Unknown { .. }));
    let patch = if settling {
        None
    } else {
        fanout::master_status_patch(master_rq, folded.global.as_ref(), &conditions)
    };
    if let Some(patch) = patch {
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        ctx.metrics.wrote("master", "status");
        debug!(global = ?folded.global.as_ref().map(ToString::to_string), "master status written");
    }

    failed.extend(write_seed_statuses(&name, &views, &folded, ctx).await);

    ctx.metrics
        .set_quota(&project_name, &master_rq.spec.quota, folded.global.as_ref());
    for u in &usages {
        if u.health.is_known() {
            ctx.metrics
                .set_seed_usage(&project_name, &u.seed, &u.local.clone().unwrap_or_default());
        }
    }

    if failed.is_empty() {
        Ok(Action::await_change())
    } else {
        Err(Error::Seeds(failed.join(", ")))
    }
}

/// `globalUsage` and `otherSeedsUsage` back onto every fresh seed's copy, where changed.
/// Returns the seeds where the write failed.
async fn write_seed_statuses(
    name: &str,
    views: &[SeedView],
    folded: &fold::Folded,
    ctx: &Ctx,
) -> Vec<String> {
    let writes = views.iter().filter(|v| v.health.is_fresh()).filter_map(|v| {
        let copy = v.copy.as_ref()?;
        let client = v.client.clone()?;
        let others = folded.others.get(&v.name).cloned().flatten();
        let patch = fanout::seed_status_patch(copy, folded.global.as_ref(), others.as_ref())?;
        let seed = v.name.clone();
        Some(async move {
            let api: Api<ResourceQuota> = Api::all(client);
            match bounded(api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))).await {
                Ok(_) => {
                    ctx.metrics.wrote(&seed, "status");
                    Ok(())
                }
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                Err(e) => {
                    warn!(seed = %seed, error = %e, "writing the seed copy's status failed");
                    ctx.metrics.sync_error(&seed, "status");
                    Err(seed)
                }
            }
        })
    });
    future::join_all(writes)
        .await
        .into_iter()
        .filter_map(Result::err)
        .collect()
}

/// Applies the copy on one seed if it is fresh and out of date. Returns the view with the copy
/// as it is now, or the seed's name on failure.
async fn fan_out(master_rq: &ResourceQuota, view: &SeedView, ctx: &Ctx) -> (SeedView, Result<(), String>) {
    let mut view = view.clone();
    let Some(client) = view.client.clone() else {
        return (view, Ok(()));
    };
    if !view.health.is_fresh()
        || view
            .copy
            .as_ref()
            .is_some_and(|c| fanout::copy_in_sync(master_rq, c))
    {
        return (view, Ok(()));
    }
    let api: Api<ResourceQuota> = Api::all(client);
    let body = fanout::copy_apply_body(master_rq);
    let result = bounded(api.patch(
        &master_rq.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    ))
    .instrument(info_span!("apply", seed = %view.name))
    .await;
    match result {
        Ok(copy) => {
            debug!(seed = %view.name, "seed copy applied");
            ctx.metrics.wrote(&view.name, "apply");
            view.copy = Some(copy);
            (view, Ok(()))
        }
        Err(e) => {
            warn!(seed = %view.name, error = %e, "applying the seed copy failed");
            ctx.metrics.sync_error(&view.name, "apply");
            let seed = view.name.clone();
            (view, Err(seed))
        }
    }
}

/// Deletion: every seed's copy first, then the finalizer. A seed that cannot delete its copy
/// holds the finalizer, and the `SeedCleanupPending` condition says which.
async fn finalize(
    master_rq: &ResourceQuota,
    api: &Api<ResourceQuota>,
    views: &[SeedView],
    project: Option<&Project>,
    ctx: &Ctx,
) -> Result<Action, Error> {
    if !fanout::has_finalizer(master_rq) {
        return Ok(Action::await_change());
    }
    let name = master_rq.name_any();
    let deletes = views.iter().map(|view| {
        let name = name.clone();
        async move {
            let Some(client) = view.client.clone() else {
                return Err(view.name.clone());
            };
            let api: Api<ResourceQuota> = Api::all(client);
            match bounded(api.delete(&name, &DeleteParams::default())).await {
                Ok(either) => {
                    ctx.metrics.wrote(&view.name, "delete");
                    // Still there (someone else's finalizer): not done yet.
                    if either.is_left() {
                        Err(view.name.clone())
                    } else {
                        Ok(())
                    }
                }
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                Err(e) => {
                    warn!(seed = %view.name, error = %e, "deleting the seed copy failed");
                    ctx.metrics.sync_error(&view.name, "delete");
                    Err(view.name.clone())
                }
            }
        }
    });
    let pending: Vec<String> = future::join_all(deletes)
        .await
        .into_iter()
        .filter_map(Result::err)
        .collect();
    if pending.is_empty() {
        let body = fanout::master_metadata_apply(master_rq, project, false);
        match api
            .patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
        {
            Ok(_) => {}
            Err(_) if api.get_opt(&name).await?.is_none() => {}
            Err(e) => return Err(e.into()),
        }
        ctx.metrics.wrote("master", "finalize");
        ctx.metrics
            .forget_project(master_rq.project(), &ctx.seeds.names());
        info!("seed copies deleted; finalizer released");
        return Ok(Action::await_change());
    }
    let status_now = master_rq.status.clone().unwrap_or_default();
    let conditions = status::merge_conditions(
        &status_now.conditions,
        &[status::cleanup_pending(&pending)],
        master_rq.metadata.generation,
        Timestamp::now(),
    );
    if let Some(patch) = fanout::master_status_patch(master_rq, None, &conditions) {
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        ctx.metrics.wrote("master", "status");
    }
    warn!(seeds = %pending.join(", "), "seed copies not deleted yet; holding the finalizer");
    Ok(Action::requeue(Duration::from_secs(2)))
}

/// Deletes seed copies that have no master object. Runs after the master cache is complete.
async fn orphan_sweep(quotas: Store<ResourceQuota>, seeds: Seeds, wake: Arc<Notify>, metrics: Metrics) {
    let _ = quotas.wait_until_ready().await;
    loop {
        wake.notified().await;
        let masters: BTreeSet<String> = quotas.state().iter().map(|q| q.name_any()).collect();
        for (seed, client, copies) in seeds.fresh_copies() {
            let api: Api<ResourceQuota> = Api::all(client);
            for copy in copies {
                let name = copy.name_any();
                if masters.contains(&name) || copy.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                // Conditioned on the copy's UID: a copy re-created meanwhile is not touched.
                let dp = DeleteParams {
                    preconditions: Some(kube::api::Preconditions {
                        uid: copy.uid(),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                match bounded(api.delete(&name, &dp)).await {
                    Ok(_) => {
                        info!(seed = %seed, quota = %name, project = %copy.project(), "deleted seed copy without a master object");
                        metrics.wrote(&seed, "delete");
                    }
                    Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                    Err(e) => {
                        warn!(seed = %seed, quota = %name, error = %e, "deleting an orphaned copy failed");
                        metrics.sync_error(&seed, "delete");
                    }
                }
            }
        }
    }
}

async fn default_quota_loop(
    api: Api<ResourceQuota>,
    settings: Store<KubermaticSetting>,
    projects: Store<Project>,
    quotas: Store<ResourceQuota>,
    wake: Arc<Notify>,
    metrics: Metrics,
) {
    let _ = quotas.wait_until_ready().await;
    let _ = projects.wait_until_ready().await;
    let _ = settings.wait_until_ready().await;
    loop {
        wake.notified().await;
        let start = Instant::now();
        let result = default_quota::reconcile(&api, &settings, &projects, &quotas)
            .instrument(info_span!("default_quota"))
            .await;
        metrics
            .reconcile_duration
            .with_label_values(&["default_quota"])
            .observe(start.elapsed().as_secs_f64());
        match result {
            Ok(0) => {}
            Ok(n) => {
                metrics
                    .writes
                    .with_label_values(&["master", "default_quota"])
                    .inc_by(n as u64);
            }
            Err(e) => {
                warn!(error = %e, "default quota reconcile failed; retrying");
                metrics
                    .reconcile_errors
                    .with_label_values(&["default_quota"])
                    .inc();
                tokio::time::sleep(Duration::from_secs(1)).await;
                wake.notify_one();
            }
        }
    }
}
