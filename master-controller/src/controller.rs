//! The wiring: one watch of the master's `ResourceQuota`s, whose reconciles take turns first
//! asked first served ([`kkp_quota_runtime::work_queue`]), one watch of quota copies per seed
//! (see [`crate::seeds`]) whose events ask for turns too, the default-quota loop, the orphan sweep, the quota groups' statuses
//! ([`crate::groups`]) and a periodic resync spread over its period ([`crate::resync`]).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, future, stream};
use kkp_quota_crds::kkp::{KubermaticSetting, Project};
use kkp_quota_crds::quota::PROJECT_KIND;
use kkp_quota_crds::{ProjectQuota, ResourceQuota};
use kkp_quota_runtime::leader::{LeaderElector, LeaseConfig};
use kkp_quota_runtime::ops::Readiness;
use kkp_quota_runtime::watch::relisting_watcher;
use kkp_quota_runtime::work_queue::{self, Next};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::{Notify, mpsc};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::by_subject::QuotasBySubject;
use crate::ctx::Ctx;
use crate::ledger_guard::HandDeletes;
use crate::metrics::Metrics;
use crate::seeds::{self, Seeds, Triggers};
use crate::shares::ShareMemory;
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
    /// Quotas reconciled at the same time; the others wait their turn in the order they were
    /// asked for.
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
    /// Seeds the admin declared gone for good, with every Machine of their user clusters: once
    /// such a seed is no longer among the `Seed`s, every record forgets it and its share returns
    /// to the quota (docs/operations.md). A listed seed is never forgotten this way.
    pub gone_seeds: BTreeSet<String>,
    /// Seeds the admin is draining before they leave: no more share, all they do not use handed
    /// back, and forgotten by every record once they use nothing (docs/operations.md).
    pub draining_seeds: BTreeSet<String>,
    /// Whether this process serves the allocation webhook (`--tls-cert-file`): an `allocation`
    /// group says it is enforced only then.
    pub allocation_webhook: bool,
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
            gone_seeds: BTreeSet::new(),
            draining_seeds: BTreeSet::new(),
            allocation_webhook: false,
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
    run_until(master, options, metrics, readiness, std::future::pending()).await
}

/// [`run`] until `shutdown` resolves; a leader then stops its work and releases the Lease, so
/// the standby takes over within one renewal period instead of a whole lease duration.
pub async fn run_until(
    master: Client,
    options: Options,
    metrics: Metrics,
    readiness: Readiness,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let Some(lease) = options.lease.clone() else {
        metrics.leader.set(1);
        return tokio::select! {
            result = Box::pin(run_as_leader(master, options, metrics, readiness)) => result,
            () = shutdown => Ok(()),
        };
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
    let result = Box::pin(elector.run_until(&readiness, work, shutdown)).await;
    metrics.leader.set(0);
    readiness.set(false);
    result?.unwrap_or(Ok(()))
}

fn channel_stream<T: Send + 'static>(
    rx: mpsc::UnboundedReceiver<T>,
) -> impl futures::Stream<Item = T> + Send {
    stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|v| (v, rx)) })
}

/// The quotas whose subject is `project`.
fn quotas_of_project(quotas: &QuotasBySubject, project: &str) -> Vec<ObjectRef<ResourceQuota>> {
    quotas
        .of(PROJECT_KIND, project)
        .iter()
        .map(|name| ObjectRef::new(name))
        .collect()
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
    // Any change of a Project or ProjectQuota may change a QuotaGroup's status.
    let groups_changed = Arc::new(Notify::new());
    let triggers = Triggers {
        one: one_tx.clone(),
        all: all_tx.clone(),
        orphans: orphans.clone(),
    };
    let wc = watcher::Config::default();

    let quota_api: Api<ResourceQuota> = Api::all(master.clone());
    let (quotas, quota_writer) = reflector::store();
    let quotas_by_subject = QuotasBySubject::default();
    let quota_events = {
        let (defaults, orphans) = (defaults.clone(), orphans.clone());
        let (by_subject, one_tx) = (quotas_by_subject.clone(), one_tx.clone());
        reflector::reflector(
            quota_writer,
            relisting_watcher(quota_api.clone(), wc.clone(), None).modify(status::keep_usage_writers),
        )
        .default_backoff()
        .inspect(move |event| {
            defaults.notify_one();
            orphans.notify_one();
            let Ok(event) = event else { return };
            by_subject.observe(event);
            // Which of a project's quotas is in force depends on the others
            // (`crate::not_in_force`): a change of one is a change for its siblings. A
            // deleted quota has left the index already: its siblings are asked for before.
            if let watcher::Event::Apply(q) | watcher::Event::Delete(q) = event {
                for sibling in by_subject.siblings(q) {
                    let _ = one_tx.send(sibling);
                }
            }
        })
        .applied_objects()
    };

    // A Project's change is a change of each of its quotas (their default and subject checks
    // read it); a ProjectQuota has its quota's name. Both are reflected into stores the
    // reconciler reads, and mapped onto the controller's own triggers.
    let (projects, project_writer) = reflector::store();
    let project_triggers = {
        let (defaults, quotas, groups_changed) = (
            defaults.clone(),
            quotas_by_subject.clone(),
            groups_changed.clone(),
        );
        reflector::reflector(
            project_writer,
            relisting_watcher(Api::<Project>::all(master.clone()), wc.clone(), None)
                .modify(crate::api::forget_managed_fields),
        )
        .default_backoff()
        // Every event, deletions too (`applied_objects` drops them), may change a group.
        .inspect(move |_| groups_changed.notify_one())
        .applied_objects()
        .inspect(move |_| defaults.notify_one())
        .filter_map(|p| future::ready(p.ok()))
        .flat_map(move |p| stream::iter(quotas_of_project(&quotas, &p.name_any())))
    };

    let memory = ShareMemory::default();
    let (project_quotas, pq_writer) = reflector::store();
    let project_quota_triggers = {
        let (groups_changed, memory) = (groups_changed.clone(), memory.clone());
        reflector::reflector(
            pq_writer,
            relisting_watcher(Api::<ProjectQuota>::all(master.clone()), wc.clone(), None)
                .modify(crate::api::forget_managed_fields),
        )
        .default_backoff()
        .inspect(move |event| {
            groups_changed.notify_one();
            // Not a relist's objects (`InitApply`): the store swaps them in only at its end,
            // and until then a round still reads the older snapshot.
            if let Ok(watcher::Event::Apply(pq)) = event {
                memory.caught_up(pq);
            }
        })
        .applied_objects()
        .filter_map(|pq| future::ready(pq.ok().map(|pq| pq.name_any())))
    };

    let (settings, settings_writer) = reflector::store();
    let settings_events = {
        let defaults = defaults.clone();
        reflector::reflector(
            settings_writer,
            relisting_watcher(Api::<KubermaticSetting>::all(master.clone()), wc.clone(), None),
        )
        .default_backoff()
        .for_each(move |_| {
            defaults.notify_one();
            future::ready(())
        })
    };

    let unreadable = Arc::new(crate::unreadable::Unreadable::new(master.clone()));
    let group_book = crate::group_book::GroupBook::default();
    let ctx = Arc::new(Ctx {
        master: master.clone(),
        seeds: seeds.clone(),
        projects: projects.clone(),
        project_quotas: project_quotas.clone(),
        metrics: metrics.clone(),
        kkp_copies: seeds.kkp_copies().clone(),
        hand_deletes: HandDeletes::default(),
        memory,
        share_slack_percent: options.share_slack_percent,
        gone_seeds: options.gone_seeds.clone(),
        draining_seeds: options.draining_seeds.clone(),
        unreadable: Arc::clone(&unreadable),
        quotas: quotas.clone(),
        quotas_by_subject: quotas_by_subject.clone(),
        not_in_force: crate::not_in_force::NotInForce::default(),
        groups: group_book.clone(),
    });
    // Every source of a quota's turn, by name: its own watch (which also fills the store the
    // turns read), its project's, its `ProjectQuota`'s, the seeds' and the other loops' asks
    // (`one`), and "every quota" (`all`).
    let every_quota = {
        let quotas = quotas.clone();
        channel_stream(all_rx)
            .flat_map(move |()| stream::iter(quotas.state().iter().map(|q| q.name_any()).collect::<Vec<_>>()))
    };
    let requests = stream::select_all([
        quota_events
            .filter_map(|q| {
                future::ready(match q {
                    Ok(q) => Some(q.name_any()),
                    Err(e) => {
                        debug!(error = %e, "quota watch");
                        None
                    }
                })
            })
            .boxed(),
        project_triggers.map(|r| r.name).boxed(),
        project_quota_triggers.boxed(),
        channel_stream(one_rx).boxed(),
        every_quota.boxed(),
    ]);
    let controller = {
        let (quotas, ready) = (quotas.clone(), quotas.clone());
        work_queue::run(
            requests,
            usize::from(options.concurrency),
            async move {
                let _ = ready.wait_until_ready().await;
            },
            move |name| turn(name, quotas.clone(), Arc::clone(&ctx)),
        )
    };

    let resync = crate::resync::run(quotas.clone(), one_tx.clone(), options.resync_period);

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
        unreadable,
    );
    let group_loop = crate::groups::run(
        master.clone(),
        crate::groups::Sources {
            projects: projects.clone(),
            project_quotas: project_quotas.clone(),
            kkp_quotas: quotas.clone(),
            allocation_webhook: options.allocation_webhook,
            changed: groups_changed,
            resync: options.resync_period,
            book: group_book,
            reconcile: one_tx.clone(),
            share_slack_percent: options.share_slack_percent,
        },
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
        () = settings_events => Err(Error::Stopped("settings watch")),
        () = resync => Err(Error::Stopped("resync")),
        () = ready => Err(Error::Stopped("readiness")),
        () = default_loop => Err(Error::Stopped("default quota loop")),
        () = orphan_loop => Err(Error::Stopped("orphan sweep")),
        () = group_loop => Err(Error::Stopped("quota group loop")),
        () = seed_manager => Err(Error::Stopped("seed manager")),
    }
}

/// One turn of the quota named `name` ([`work_queue::run`]): its reconcile, if the quota is
/// still there; on an error, another turn after 2 s.
async fn turn(name: String, quotas: Store<ResourceQuota>, ctx: Arc<Ctx>) -> Next {
    let Some(quota) = quotas.get(&ObjectRef::new(&name)) else {
        return Next::AwaitChange;
    };
    match reconcile(Arc::clone(&quota), Arc::clone(&ctx)).await {
        Ok(next) => next,
        Err(error) => {
            warn!(quota = %quota.name_any(), project = %quota.project(), error = %error, "reconcile failed; retrying");
            ctx.metrics.reconcile_errors.with_label_values(&["quota"]).inc();
            Next::After(Duration::from_secs(2))
        }
    }
}

async fn reconcile(quota: Arc<ResourceQuota>, ctx: Arc<Ctx>) -> Result<Next, Error> {
    let span = info_span!("reconcile", quota = %quota.name_any(), project = %quota.project());
    let start = Instant::now();
    ctx.unreadable.track(&quota, &ctx.metrics);
    let result = crate::reconcile::reconcile_quota(&quota, &ctx)
        .instrument(span)
        .await;
    // A write to the `ProjectQuota` found it gone (deleted by hand, its CRD re-installed): what
    // this process remembers writing of it is gone too, so the retry re-creates it instead of
    // writing to that copy forever.
    if let Err(Error::Kube(kube::Error::Api(e))) = &result
        && e.code == 404
    {
        ctx.memory.forget(&quota.name_any());
    }
    ctx.metrics
        .reconcile_duration
        .with_label_values(&["quota"])
        .observe(start.elapsed().as_secs_f64());
    result
}
