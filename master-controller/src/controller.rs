//! The wiring: one watch of the master's `ResourceQuota`s (a kube-runtime `Controller`), one
//! watch of quota copies per seed (see [`crate::seeds`]) whose events are merged into that
//! controller, the default-quota loop, the orphan sweep and a periodic resync.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, future, stream};
use jiff::Timestamp;
use kkp_quota_crds::kkp::{KubermaticSetting, Project};
use kkp_quota_crds::project_quota::SeedFigures;
use kkp_quota_crds::quota_ledger::LedgerShares;
use kkp_quota_crds::runtime::leader::{LeaderElector, LeaseConfig};
use kkp_quota_crds::runtime::ops::Readiness;
use kkp_quota_crds::{ProjectQuota, QuotaLedger, ResourceDetails, ResourceQuota};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::{Notify, mpsc};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::fanout::{self, FIELD_MANAGER};
use crate::fold::{self, Health, SeedUsage};
use crate::kkp_copies::{Fingerprint, KkpCopies};
use crate::metrics::Metrics;
use crate::seeds::{self, SeedView, Seeds, Triggers};
use crate::shares::{self, Round, ShareMemory};
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
    /// After how long without a watch event a seed is asked whether it still answers, and how
    /// long it has to answer before it counts as unreachable (its share then shows as stuck).
    pub seed_probe_every: Duration,
    /// Per limited resource, the percent of the limit a seed keeps as slack above what it
    /// committed before it is asked to release idle share (docs/shares.md).
    pub share_slack_percent: u32,
    /// Where each seed's kubeconfig is read from: the Secret of this name in `seed_namespace`,
    /// `{seed}` replaced by the seed's name. `None`: the `Seed`'s own `spec.kubeconfig` (KKP's
    /// admin credential). Lets admins give the master a least-privilege identity on each seed.
    pub seed_kubeconfig_secret: Option<String>,
}

impl Options {
    pub fn new(seed_namespace: impl Into<String>) -> Options {
        Options {
            seed_namespace: seed_namespace.into(),
            resync_period: Duration::from_mins(1),
            lease: None,
            concurrency: 16,
            seed_max_backoff: Duration::from_secs(2),
            seed_probe_every: Duration::from_secs(10),
            share_slack_percent: 10,
            seed_kubeconfig_secret: None,
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
    // Ready as a standby; as the leader, once its caches are synced.
    let elector = LeaderElector::new(master.clone(), lease.clone());
    let work = {
        let (metrics, readiness) = (metrics.clone(), readiness.clone());
        async move {
            info!(identity = %lease.identity, "became leader");
            metrics.leader.set(1);
            Box::pin(run_as_leader(master, options, metrics, readiness)).await
        }
    };
    let result = Box::pin(elector.run(&readiness, work)).await;
    metrics.leader.set(0);
    readiness.set(false);
    result?
}

pub(crate) struct Ctx {
    pub master: Client,
    pub seeds: Seeds,
    pub projects: Store<Project>,
    pub project_quotas: Store<ProjectQuota>,
    pub metrics: Metrics,
    pub kkp_copies: KkpCopies,
    /// What the share rounds remember between reconciles (the newest `ProjectQuota` written).
    pub memory: ShareMemory,
    pub share_slack_percent: u32,
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
        reflector::reflector(
            quota_writer,
            watcher::watcher(quota_api.clone(), wc.clone()).modify(status::keep_usage_writers),
        )
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
            watcher::watcher(Api::<Project>::all(master.clone()), wc.clone()).modify(forget_managed_fields),
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

    let (project_quotas, pq_writer) = reflector::store();
    let project_quota_events = {
        let one_tx = one_tx.clone();
        reflector::reflector(
            pq_writer,
            watcher::watcher(Api::<ProjectQuota>::all(master.clone()), wc.clone())
                .modify(forget_managed_fields),
        )
        .default_backoff()
        .applied_objects()
        .for_each(move |pq| {
            // Same name as the KKP quota it belongs to.
            if let Ok(pq) = pq {
                let _ = one_tx.send(pq.name_any());
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
        project_quotas: project_quotas.clone(),
        metrics: metrics.clone(),
        kkp_copies: KkpCopies::default(),
        memory: ShareMemory::default(),
        share_slack_percent: options.share_slack_percent,
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
        let (quotas, projects, project_quotas, settings, readiness) = (
            quotas.clone(),
            projects.clone(),
            project_quotas.clone(),
            settings.clone(),
            readiness.clone(),
        );
        async move {
            let _ = quotas.wait_until_ready().await;
            let _ = projects.wait_until_ready().await;
            let _ = project_quotas.wait_until_ready().await;
            let _ = settings.wait_until_ready().await;
            readiness.set(true);
            info!("master caches synced");
            future::pending::<()>().await;
        }
    };

    let default_loop = default_quota::run(
        quota_api.clone(),
        settings,
        projects.clone(),
        quotas.clone(),
        defaults,
        metrics.clone(),
    );
    let orphan_loop = crate::sweep::orphan_sweep(
        master.clone(),
        quotas,
        project_quotas,
        seeds.clone(),
        orphans,
        metrics.clone(),
    );
    let seed_manager = seeds::manage(
        master,
        options.seed_namespace.clone(),
        seeds,
        triggers,
        metrics,
        seeds::SeedLink {
            max_backoff: options.seed_max_backoff,
            probe_every: options.seed_probe_every,
        },
        options.seed_kubeconfig_secret.clone(),
    );

    tokio::select! {
        () = controller => Err(Error::Stopped("quota controller")),
        () = project_events => Err(Error::Stopped("project watch")),
        () = project_quota_events => Err(Error::Stopped("ProjectQuota watch")),
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

pub(crate) async fn bounded<T>(
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
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => return Ok(Action::await_change()),
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
        ctx.memory.wrote(&name, applied.clone());
        project_quota = Some(Arc::new(applied));
    }
    let Some(project_quota) = project_quota else {
        // In sync means it exists; the watch brings it otherwise.
        return Ok(Action::await_change());
    };

    // The share round first: grants and targets are persisted in the record before any of it
    // reaches a seed. A round that fails (its write's outcome unknown) sends nothing.
    let settling = views.iter().any(|v| matches!(v.health, Health::Unknown { .. }));
    let round = shares::round(master_rq, project_quota, &views, settling, ctx).await?;
    let limits = round.limits.clone();

    // Fan out to every fresh seed, all at once; one seed's failure does not stop the others.
    let applied = future::join_all(
        views
            .iter()
            .map(|view| fan_out(master_rq, &limits, round.ledger_shares(&view.name), view, ctx)),
    )
    .await;
    let mut failed: Vec<String> = Vec::new();
    let mut views: Vec<SeedView> = Vec::with_capacity(applied.len());
    for (view, result) in applied {
        if let Err(seed) = result {
            failed.push(seed);
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

    if failed.is_empty() {
        Ok(Action::await_change())
    } else {
        Err(Error::Seeds(failed.join(", ")))
    }
}

/// Every seed's `localUsage` of the quota, as its ledger last showed it.
fn usages(views: &[SeedView]) -> Vec<SeedUsage> {
    views
        .iter()
        .map(|v| SeedUsage {
            seed: v.name.clone(),
            health: v.health,
            local: v
                .copy
                .as_ref()
                .and_then(|c| c.status.as_ref()?.local_usage.clone()),
        })
        .collect()
}

/// The master's statuses: the `ProjectQuota`'s limits, usage, per-seed usage and conditions, and
/// KKP's `globalUsage` (unless another controller writes it). Not called while a seed is
/// settling: a seed just added (or just started watching) is listed within moments and its first
/// sync triggers every quota again; writing conditions before that would only flap.
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
    let (pq, limits) = (&*round.project_quota, &round.limits);
    let pq_status = pq.status.clone().unwrap_or_default();
    let usage_for_limit = folded
        .global
        .clone()
        .or_else(|| pq_status.global_usage.clone())
        .unwrap_or_default();
    let foreign = status::foreign_usage_writers(master_rq, &[FIELD_MANAGER]);
    if !foreign.is_empty() {
        warn!(writers = %foreign.join(", "), "another controller writes the usage of KKP's ResourceQuota (KKP Enterprise's quota feature?); not writing it there");
    }
    let desired = [
        status::seeds_stale(&folded.stale),
        status::quota_exceeded(limits, &usage_for_limit),
        status::foreign_quota_controller(&foreign),
    ];
    let mut existing = pq_status.conditions.clone();
    existing.retain(|c| c.type_ != status::SEED_CLEANUP_PENDING);
    let conditions = status::merge_conditions(
        &existing,
        &desired,
        master_rq.metadata.generation,
        Timestamp::now(),
    );
    let figures = fanout::ProjectFigures {
        limits: limits.clone(),
        global: folded.global.clone(),
        seeds: usages
            .iter()
            .filter(|u| u.health.is_known())
            .map(|u| {
                let shares = round.figures(&u.seed);
                SeedFigures {
                    name: u.seed.clone(),
                    usage: Some(u.local.clone().unwrap_or_default()),
                    stale: !u.health.is_fresh(),
                    share: shares.share,
                    demand: shares.demand,
                    stuck: shares.stuck,
                }
            })
            .collect(),
        conditions,
    };
    if let Some(patch) = fanout::project_quota_status_patch(pq, &figures) {
        let params = PatchParams::default();
        let written = ctx
            .metrics
            .timed_write(
                "master",
                "status",
                pq_api.patch_status(&name, &params, &Patch::Merge(&patch)),
            )
            .await?;
        ctx.memory.wrote(&name, written);
    }
    let current = master_rq.status.as_ref().and_then(|s| s.global_usage.as_ref());
    if foreign.is_empty()
        && let Some(patch) = fanout::kkp_status_patch(current, folded.global.as_ref())
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

/// `globalUsage` and `otherSeedsUsage` back onto every fresh seed's ledger, and `globalUsage`
/// onto its KKP copy, where changed. Returns the seeds where a write failed.
async fn write_seed_statuses(
    name: &str,
    views: &[SeedView],
    folded: &fold::Folded,
    ctx: &Ctx,
) -> Vec<String> {
    let writes = views.iter().filter(|v| v.health.is_fresh()).filter_map(|v| {
        let ledger = v.copy.as_ref()?;
        let client = v.client.clone()?;
        let others = folded.others.get(&v.name).cloned().flatten();
        let ledger_patch = fanout::ledger_status_patch(ledger, folded.global.as_ref(), others.as_ref());
        let known = ctx.kkp_copies.get(&v.name, name).global;
        let kkp_patch = fanout::kkp_status_patch(known.as_ref(), folded.global.as_ref());
        if ledger_patch.is_none() && kkp_patch.is_none() {
            return None;
        }
        let seed = v.name.clone();
        let global = folded.global.clone();
        Some(async move {
            let written = async {
                if let Some(patch) = ledger_patch {
                    let api: Api<QuotaLedger> = Api::all(client.clone());
                    let params = PatchParams::default();
                    ignore_missing(
                        ctx.metrics
                            .timed_write(
                                &seed,
                                "status",
                                bounded(api.patch_status(name, &params, &Patch::Merge(&patch))),
                            )
                            .await,
                    )?;
                }
                if let Some(patch) = kkp_patch {
                    let api: Api<ResourceQuota> = Api::all(client);
                    let params = ours();
                    ignore_missing(
                        ctx.metrics
                            .timed_write(
                                &seed,
                                "status",
                                bounded(api.patch_status(name, &params, &Patch::Merge(&patch))),
                            )
                            .await,
                    )?;
                    ctx.kkp_copies.update(&seed, name, |c| c.global = global);
                }
                Ok::<(), kube::Error>(())
            }
            .await;
            written.map_err(|e| {
                warn!(seed = %seed, error = %e, "writing the seed copies' status failed");
                ctx.metrics.sync_error(&seed, "status");
                seed
            })
        })
    });
    future::join_all(writes)
        .await
        .into_iter()
        .filter_map(Result::err)
        .collect()
}

/// Patch parameters naming this controller as the field manager, so that another writer of the
/// same fields shows in `managedFields` ([`status::foreign_usage_writers`]).
pub(crate) fn ours() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    }
}

/// A 404 is success: the object is gone, so there is nothing to write.
pub(crate) fn ignore_missing<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Applies KKP's copy and the ledger on one seed if it is fresh and they are out of date (KKP's
/// first, so the seed-controller finds it when the ledger appears). `shares` is the seed's part
/// of the persisted share record, never of an unpersisted plan. Returns the view with the
/// ledger as it is now, or the seed's name on failure.
async fn fan_out(
    master_rq: &ResourceQuota,
    limits: &ResourceDetails,
    shares: Option<LedgerShares>,
    view: &SeedView,
    ctx: &Ctx,
) -> (SeedView, Result<(), String>) {
    let mut view = view.clone();
    let Some(client) = view.client.clone() else {
        return (view, Ok(()));
    };
    if !view.health.is_fresh() {
        return (view, Ok(()));
    }
    let name = master_rq.name_any();
    let kkp_body = fanout::copy_apply_body(master_rq);
    let kkp_fingerprint = Fingerprint::of(&kkp_body);
    let kkp_due = ctx.kkp_copies.get(&view.name, &name).applied != Some(kkp_fingerprint);
    let ledger_due = !view
        .copy
        .as_ref()
        .is_some_and(|c| fanout::ledger_in_sync(master_rq, limits, shares.as_ref(), c));
    if !kkp_due && !ledger_due {
        return (view, Ok(()));
    }
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let seed = view.name.as_str();
    // Boxed: two API calls held at once make a large future.
    let kkp = Box::pin(async {
        if kkp_due {
            let api: Api<ResourceQuota> = Api::all(client.clone());
            ctx.metrics
                .timed_write(
                    seed,
                    "apply",
                    bounded(api.patch(&name, &params, &Patch::Apply(&kkp_body))),
                )
                .await?;
            ctx.kkp_copies
                .update(seed, &name, |c| c.applied = Some(kkp_fingerprint));
        }
        Ok::<_, kube::Error>(())
    });
    let ledger = Box::pin(async {
        if !ledger_due {
            return Ok(None);
        }
        let api: Api<QuotaLedger> = Api::all(client.clone());
        let body = fanout::ledger_apply_body(master_rq, limits, shares.as_ref());
        ctx.metrics
            .timed_write(
                seed,
                "apply",
                bounded(api.patch(&name, &params, &Patch::Apply(&body))),
            )
            .await
            .map(Some)
    });
    let result = async {
        if view.copy.is_some() {
            // Both exist: neither waits for the other (a quota edit reaches the ledger one
            // write sooner).
            let ((), ledger) = futures::try_join!(kkp, ledger)?;
            Ok(ledger)
        } else {
            // KKP's copy first, so the seed-controller finds it when the ledger appears.
            kkp.await?;
            ledger.await
        }
    }
    .instrument(info_span!("apply", seed = %view.name))
    .await;
    match result {
        Ok(ledger) => {
            debug!(seed = %view.name, "seed copies applied");
            if let Some(ledger) = ledger {
                view.copy = Some(ledger);
            }
            (view, Ok(()))
        }
        Err(e) => {
            warn!(seed = %view.name, error = %e, "applying the seed copies failed");
            ctx.metrics.sync_error(&view.name, "apply");
            let seed = view.name.clone();
            (view, Err(seed))
        }
    }
}

/// Deletes `name` through `api`: `Ok(true)` when it is gone, `Ok(false)` while it is still there
/// (someone else's finalizer).
pub(crate) async fn delete_gone<K>(api: &Api<K>, name: &str, dp: &DeleteParams) -> Result<bool, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match bounded(api.delete(name, dp)).await {
        Ok(either) => Ok(either.is_right()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(true),
        Err(e) => Err(e),
    }
}

/// Drops `managedFields` from a cached object: server-side apply's bookkeeping is often most of
/// an object's size, and with 10,000 quotas the caches hold tens of thousands of objects. Not for
/// the master's KKP quotas, whose `managedFields` tell who else writes their usage (trimmed to
/// that: [`status::keep_usage_writers`]).
pub(crate) fn forget_managed_fields<K: kube::Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}
