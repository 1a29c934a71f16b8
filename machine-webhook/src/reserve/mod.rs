//! Reservations by compare-and-swap, batched per project, and allotments (escrow).
//!
//! Every project with requests in flight has one queue and one worker. Requests that wait at the
//! same time are taken together, decided in order against one snapshot of the quota copy
//! ([`decide_batch`]), and the admitted ones are appended to `status.reservations` in ONE JSON
//! merge patch on `/status` that carries the `metadata.resourceVersion` the decision was made
//! on. A 409 Conflict means someone else wrote in between: the copy is re-read from the API
//! server (never from the cache) and the whole batch is decided again. Each answer waits for its
//! batch's write, so an admitted Machine is always in the ledger before the API server stores it.
//!
//! With allotments on (the default), the same write also takes an allotment for this process
//! (see [`crate::escrow`]): half of the headroom left. Later requests that fit in it are admitted
//! at once, in memory ([`Reserver::submit`]'s fast path), and the worker records them as
//! reservations a moment later in its next write, moving their size out of the allotment. Only
//! requests that do not fit in the allotment wait for a write, and they are decided exactly
//! against everything but this process's own allotment, so one process never denies a Machine
//! that fits.
//!
//! A denial is only final on a snapshot known to be current: either the batch's write succeeded
//! (so its snapshot was the latest), or the snapshot was just read from the API server.
//!
//! A request that fits the quota but not the headroom this seed and process may use
//! ([`Reason::ShareInTransit`]: the seed's share is too small, or other processes hold the rest
//! in allotments), or that a shared group refuses by the figures the ledger carries (they lag),
//! waits up to [`ReserverConfig::share_wait`] ([`Verdict::waits_for_share`]): the batch's write records this
//! process's demand ([`crate::demand`]), and the request is decided again on every change of the
//! project's ledger until it fits or its wait ends. Meanwhile the master moves share to the seed
//! and the other processes give their allotments back.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use jiff::{SignedDuration, Timestamp};
use kkp_quota_crds::ResourceDetails;
use kkp_quota_crds::ledger::{Allotment, Reservation, group, with_own_entry};
use kkp_quota_crds::quota_ledger::LEDGER_FORMAT;
use kkp_quota_runtime::watch::resource_version;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Api, Client, ResourceExt as _};
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, info, info_span, warn};

use kkp_quota_crds::shares::allotment::{FastAdmission, Holding, LedgerSight, Pass, Planned};
use kkp_quota_crds::shares::largest;

use crate::cache::{QuotaCopy, SeedCache};
use crate::decision::{
    LedgerGap, QuotaState, Reason, Request, Verdict, decide, decide_batch, decide_batch_without_ledger,
    is_counted,
};
use crate::demand::{DemandClock, allotment_wanted_back, demands_after};
use crate::metrics::Metrics;

mod config;
mod dry_run;
mod ledger_write;
mod standing;
mod surge;
mod worker;

pub use config::{AllotmentConfig, ReserverConfig};
use standing::{Escrow, HolderView, Plan};

/// Where an admitted Machine lives (for its reservation). A `Cluster` is referred to the same
/// way: the seed's name in place of the user cluster's, no namespace ([`crate::clusters`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineRef {
    pub cluster: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

struct Pending {
    machine: MachineRef,
    request: Request,
    reply: oneshot::Sender<Verdict>,
    /// When it was received; it waits for share until `received + share_wait`.
    received: Instant,
    /// It has waited for share at least once.
    waited_for_share: bool,
}

struct Inner {
    client: Client,
    cache: Arc<SeedCache>,
    metrics: Metrics,
    config: ReserverConfig,
    /// This process in `status.allotments`: new on every start.
    holder: String,
    queues: Mutex<HashMap<String, mpsc::UnboundedSender<Pending>>>,
    escrows: Mutex<HashMap<String, Escrow>>,
    /// Other processes' demands judged by this process's clock.
    demand_clock: DemandClock,
    /// Set by [`Reserver::release_all`]: no more admissions from allotments; workers record
    /// and give back.
    stopping: AtomicBool,
    /// Signalled after every pass of a worker (what [`Reserver::release_all`] waits on).
    passed: Notify,
    token: CancellationToken,
}

/// Decides and reserves requests that grow a project's usage.
#[derive(Clone)]
pub struct Reserver {
    inner: Arc<Inner>,
}

/// A name for this process in the ledger: the pod (host) name, the process and the start time,
/// so that a restarted process never takes its predecessor's allotment for its own.
fn holder_identity() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "machine-webhook".to_owned());
    format!(
        "{host}-{}-{:x}",
        std::process::id(),
        Timestamp::now().as_nanosecond()
    )
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Reserver {
    pub fn new(
        client: Client,
        cache: Arc<SeedCache>,
        metrics: Metrics,
        config: ReserverConfig,
        token: CancellationToken,
    ) -> Reserver {
        Reserver {
            inner: Arc::new(Inner {
                client,
                cache,
                metrics,
                config,
                holder: holder_identity(),
                queues: Mutex::new(HashMap::new()),
                escrows: Mutex::new(HashMap::new()),
                demand_clock: DemandClock::default(),
                stopping: AtomicBool::new(false),
                passed: Notify::new(),
                token,
            }),
        }
    }

    /// This process's name in `status.allotments`.
    pub fn holder(&self) -> &str {
        &self.inner.holder
    }

    /// For a clean stop: stops admitting from allotments, lets every project's worker record what
    /// was admitted and give its allotment back, and waits for that up to `timeout`. Returns how
    /// many projects still hold something (their allotments expire on their own).
    pub async fn release_all(&self, timeout: Duration) -> usize {
        self.inner.stopping.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + timeout;
        loop {
            // Armed before the check, so that a pass ending in between is not missed.
            let passed = self.inner.passed.notified();
            tokio::pin!(passed);
            passed.as_mut().enable();
            let pending = {
                let escrows = lock(&self.inner.escrows);
                for escrow in escrows.values() {
                    escrow.wake.notify_one();
                }
                escrows.values().filter(|e| e.holder.holds_anything()).count()
            };
            if pending == 0 || Instant::now() >= deadline {
                if pending > 0 {
                    warn!(
                        projects = pending,
                        "stopping with allotments not given back; they expire on their own"
                    );
                } else {
                    info!("allotments given back");
                }
                return pending;
            }
            let _ = tokio::time::timeout_at(deadline.into(), passed).await;
        }
    }

    /// Decides a request: at once from this process's allotment when it fits there, else queued
    /// behind the project's other waiting requests until its verdict (which, when it admits, is
    /// already written to the ledger).
    pub async fn submit(&self, project: &str, machine: MachineRef, request: Request) -> Verdict {
        let started = Instant::now();
        if let Some(verdict) = self.admit_from_allotment(project, &machine, &request) {
            self.observe_wait("allotment", started);
            return verdict;
        }
        let verdict = self.submit_to_writer(project, machine, request).await;
        self.observe_wait("write", started);
        verdict
    }

    fn observe_wait(&self, path: &str, started: Instant) {
        self.inner
            .metrics
            .reservation_wait
            .with_label_values(&[path])
            .observe(started.elapsed().as_secs_f64());
    }

    /// Queues `request` behind the project's other waiting requests until its verdict.
    async fn submit_to_writer(&self, project: &str, machine: MachineRef, request: Request) -> Verdict {
        let (reply, answer) = oneshot::channel();
        let machine_name = request.machine.clone();
        let pending = Pending {
            machine,
            request,
            reply,
            received: Instant::now(),
            waited_for_share: false,
        };
        {
            let mut queues = lock(&self.inner.queues);
            // Sending under the lock: a worker only retires under the same lock, after checking
            // that its queue is empty, so no request is ever left in a dead queue.
            let pending = match queues.get(project) {
                Some(queue) => match queue.send(pending) {
                    Ok(()) => None,
                    Err(mpsc::error::SendError(p)) => Some(p),
                },
                None => Some(pending),
            };
            if let Some(pending) = pending {
                let (tx, rx) = mpsc::unbounded_channel();
                let _ = tx.send(pending);
                queues.insert(project.to_owned(), tx);
                let worker = self.clone();
                let project = project.to_owned();
                let token = self.inner.token.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        () = token.cancelled() => {}
                        () = worker.work(project, rx) => {}
                    }
                });
            }
        }
        answer.await.unwrap_or_else(|_| {
            Verdict::deny(
                Reason::Error,
                &machine_name,
                "could not be checked against its project's quota: the webhook is shutting down",
            )
        })
    }

    /// The fast path: admits `request` from this process's allotment when the allotment is
    /// current and the Machine fits both the quota (as everything else in the ledger leaves it)
    /// and what is left of the allotment. `None`: the request must wait for a write.
    fn admit_from_allotment(
        &self,
        project: &str,
        machine: &MachineRef,
        request: &Request,
    ) -> Option<Verdict> {
        self.inner.config.allotments.as_ref()?;
        // A Machine from a deployment's room, or a deployment's change, is decided on the ledger
        // as it is, by compare-and-swap: the room is the deployment's, not this process's.
        if self.inner.stopping.load(Ordering::SeqCst) || request.autoscaled.is_some() {
            return None;
        }
        let growth = request.ask.growth()?;
        // Read outside the lock (at most once per resourceVersion), then checked still newest.
        let view = self.newest_view(project, true);
        let now = Instant::now();
        let holder = self.inner.holder.as_str();
        let mut escrows = lock(&self.inner.escrows);
        let escrow = escrows.get_mut(project)?;
        let view = view.filter(|view| {
            escrow.holder.holding()
                && self
                    .newest_copy(project, escrow)
                    .is_some_and(|newest| view.is_of(&newest))
        });
        let wall = self.inner.config.now();
        let sight = view.as_ref().map(|view| {
            let copy = &view.copy;
            LedgerSight {
                quota_uid: copy.uid.as_deref(),
                counted: is_counted(copy.status.as_ref()),
                wanted_back: view.share_wanted_back
                    || self
                        .inner
                        .demand_clock
                        .others_waiting(&copy.name, copy.status.as_ref(), holder, wall),
                own_granted: copy
                    .status
                    .as_ref()
                    .and_then(|s| s.allotments.iter().find(|a| a.holder == holder))
                    .map(|a| &a.granted),
            }
        });
        let mut verdict = None;
        let limit = view
            .as_ref()
            .map(|v| v.copy.spec.quota.clone())
            .unwrap_or_default();
        let answer = escrow
            .holder
            .admit(now, sight.as_ref(), &limit, &growth, |admitted| {
                let base = view.as_ref()?.state.clone()?;
                let state = base.with_own_admitted(admitted).ok()?;
                let decided = decide(project, Some(&state), request);
                if !decided.allowed || decided.reason != Reason::Fits {
                    return None;
                }
                let reservation = Self::reservation_of(machine, request, &decided, wall);
                if reservation.is_none() && !request.dry_run {
                    return None;
                }
                verdict = Some(decided);
                Some(reservation)
            });
        match answer {
            FastAdmission::Admitted { record } => {
                debug!(machine = %machine.name, uid = %machine.uid, quota_uid = ?escrow.holder.quota_uid(), "admitted from the allotment");
                if record {
                    escrow.wake.notify_one();
                }
                self.inner.metrics.allotment_admissions.inc();
                verdict
            }
            FastAdmission::WantedBack => {
                escrow.wake.notify_one();
                None
            }
            FastAdmission::Wait => None,
        }
    }

    fn api(&self) -> Api<DynamicObject> {
        Api::all_with(self.inner.client.clone(), self.inner.cache.quota_resource())
    }

    /// The freshest copy we know without asking: the cache's, or our own last write if newer.
    fn newest_copy(&self, project: &str, escrow: &Escrow) -> Option<Arc<DynamicObject>> {
        let cached = self.inner.cache.quota_for(project);
        match (cached, escrow.last_written.clone()) {
            (Some(c), Some(w)) if c.name_any() == w.name_any() && c.uid() == w.uid() => {
                if resource_version(&*w) > resource_version(&*c) {
                    Some(w)
                } else {
                    Some(c)
                }
            }
            (cached, _) => cached,
        }
    }

    /// [`Self::newest_copy`] as the fast path reads it ([`HolderView`]), worked out once per
    /// resourceVersion and outside the lock; `None` when there is no copy, it cannot be read,
    /// or (`holding_only`) we hold no allotment in it.
    fn newest_view(&self, project: &str, holding_only: bool) -> Option<Arc<HolderView>> {
        let object = {
            let mut escrows = lock(&self.inner.escrows);
            let escrow = escrows.get_mut(project)?;
            if holding_only && !escrow.holder.holding() {
                return None;
            }
            self.notice_restore(escrow);
            let object = self.newest_copy(project, escrow)?;
            if let Some(view) = &escrow.parsed
                && view.is_of(&object)
            {
                return Some(Arc::clone(view));
            }
            object
        };
        let view = Arc::new(HolderView::of(&object, &self.inner.holder).ok()?);
        // Kept even if another request read a newer copy meanwhile: the next one reads again.
        if let Some(escrow) = lock(&self.inner.escrows).get_mut(project) {
            escrow.parsed = Some(Arc::clone(&view));
        }
        Some(view)
    }

    fn known_copy(&self, project: &str) -> Option<Arc<DynamicObject>> {
        let mut escrows = lock(&self.inner.escrows);
        match escrows.get_mut(project) {
            Some(escrow) => {
                self.notice_restore(escrow);
                self.newest_copy(project, escrow)
            }
            None => self.inner.cache.quota_for(project),
        }
    }

    /// After the seed's etcd went back in time (the cache listed again), what this process wrote
    /// before is no guide: resourceVersions started over (our old write would look newest
    /// forever) and our allotment may not be in the restored ledger. It is forgotten like a
    /// missing ledger's (admissions not recorded yet stay, to be recorded); the next write
    /// starts from the restored ledger.
    fn notice_restore(&self, escrow: &mut Escrow) {
        let restores = self.inner.cache.restores();
        if escrow.restores_seen != restores {
            if escrow.last_written.is_some() || escrow.holder.holds_anything() {
                warn!(
                    "the seed's data went back in time (an etcd restore?): forgetting this process's allotment"
                );
            }
            escrow.restores_seen = restores;
            escrow.last_written = None;
            escrow.parsed = None;
            escrow.holder.forget(Instant::now());
        }
    }

    /// The ledger as the API server has it now. One older than what the cache held before the
    /// read (the same object) can only come from a seed whose data went back in time
    /// (resourceVersions are etcd's revisions and only grow): noted at once, before the watch
    /// notices. The cache is read first: during the read it may receive newer versions.
    async fn fresh_copy(&self, name: &str) -> Result<Option<DynamicObject>, kube::Error> {
        let before = self.inner.cache.quotas.get(name);
        let fresh = self.api().get_opt(name).await?;
        if let (Some(fresh), Some(before)) = (&fresh, before)
            && fresh.uid() == before.uid()
            && resource_version(fresh) < resource_version(&*before)
        {
            self.inner.cache.note_restore();
        }
        Ok(fresh)
    }
}
