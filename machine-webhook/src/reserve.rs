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
//! in allotments) waits up to [`ReserverConfig::share_wait`]: the batch's write records this
//! process's demand ([`crate::demand`]), and the request is decided again on every change of the
//! project's ledger until it fits or its wait ends. Meanwhile the master moves share to the seed
//! and the other processes give their allotments back.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use jiff::{SignedDuration, Timestamp};
use kkp_quota_crds::ResourceDetails;
use kkp_quota_crds::ledger::{Allotment, Reservation, group};
use kkp_quota_crds::quota_ledger::LEDGER_FORMAT;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Api, Client, ResourceExt as _};
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, info, info_span, warn};

use crate::cache::{QuotaCopy, SeedCache};
use crate::decision::{QuotaState, Reason, Request, Verdict, decide, decide_batch};
use crate::demand::{demands_after, largest, others_waiting};
use crate::escrow::{cap_while_writing, fits_within};
use crate::metrics::Metrics;

/// How the writer behaves.
#[derive(Debug, Clone)]
pub struct ReserverConfig {
    /// Most requests decided in one pass (and written in one patch).
    pub max_batch: usize,
    /// Writes tried per batch before its requests are denied with reason `error`.
    pub max_attempts: u32,
    /// A project's worker stops after this long without requests.
    pub idle: Duration,
    /// A batch not decided and written within this time is denied with reason `error` (the API
    /// server gives up on the webhook after its `timeoutSeconds`, 5 s, anyway).
    pub deadline: Duration,
    /// Allotments; `None`: every admission waits for its own batch's write.
    pub allotments: Option<AllotmentConfig>,
    /// How long a request that fits the quota but not this seed's share (or not beside other
    /// processes' allotments) waits for the share to move here before it is denied. Within
    /// `deadline`, which is within the API server's `timeoutSeconds`.
    pub share_wait: Duration,
    /// A demand for share not renewed within this time no longer counts.
    pub demand_ttl: Duration,
}

/// How allotments are held.
#[derive(Debug, Clone)]
pub struct AllotmentConfig {
    /// An allotment not renewed within this time expires (seed-controller removes it); the
    /// holder admits from it only during the first half, and renews it after a quarter.
    pub ttl: Duration,
    /// Admissions from the allotment are recorded as reservations this soon.
    pub record_after: Duration,
    /// An allotment is given back after this long without requests for its project.
    pub release_after: Duration,
}

impl Default for AllotmentConfig {
    fn default() -> Self {
        AllotmentConfig {
            ttl: Duration::from_mins(2),
            record_after: Duration::from_millis(500),
            release_after: Duration::from_secs(10),
        }
    }
}

impl Default for ReserverConfig {
    fn default() -> Self {
        ReserverConfig {
            max_batch: 256,
            max_attempts: 10,
            idle: Duration::from_mins(1),
            deadline: Duration::from_secs(4),
            allotments: Some(AllotmentConfig::default()),
            share_wait: Duration::from_secs(3),
            demand_ttl: Duration::from_secs(30),
        }
    }
}

/// Where an admitted Machine lives (for its reservation).
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

/// This process's standing in one project's ledger.
#[derive(Debug, Default)]
struct Escrow {
    /// The quota copy our allotment is in.
    quota_uid: Option<String>,
    /// Our allotment is in the ledger, granting `granted`.
    holding: bool,
    granted: ResourceDetails,
    /// Fast admissions stop at this instant unless a write renews the allotment.
    usable_until: Option<Instant>,
    /// The last write that renewed it began here.
    renewed: Option<Instant>,
    /// Admitted from the allotment, not yet recorded as reservations (oldest first).
    admitted: Vec<(Instant, Reservation)>,
    admitted_total: ResourceDetails,
    /// While a write is in flight: the most `admitted_total` may reach.
    cap_in_flight: Option<ResourceDetails>,
    last_request: Option<Instant>,
    /// A write that set our allotment ended without telling whether it landed: one may be in the
    /// ledger although `holding` is false, so upkeep writes again soon.
    maybe_holding: bool,
    /// Failed writes in a row, and no upkeep before this (backoff).
    failures: u32,
    not_before: Option<Instant>,
    /// The copy as our last successful write returned it (often newer than the cache, which
    /// would make the next write's first attempt a certain conflict).
    last_written: Option<Arc<DynamicObject>>,
    /// The newest copy, parsed once per resourceVersion.
    parsed: Option<Arc<QuotaCopy>>,
    /// Wakes the worker when there is something to record.
    wake: Arc<Notify>,
    /// Another process waits for headroom: give our allotment back at once.
    give_back: bool,
}

impl Escrow {
    fn idle_since(&self, since: Duration, now: Instant) -> bool {
        self.last_request
            .is_none_or(|t| now.saturating_duration_since(t) >= since)
    }

    /// When the worker has upkeep to do without requests: record admissions, renew or give
    /// back the allotment.
    fn upkeep_due(&self, config: &AllotmentConfig, stopping: bool) -> Option<Instant> {
        let due = self.upkeep_wanted(config, stopping)?;
        Some(self.not_before.map_or(due, |t| due.max(t)))
    }

    fn upkeep_wanted(&self, config: &AllotmentConfig, stopping: bool) -> Option<Instant> {
        let now = Instant::now();
        if stopping && (self.holding || self.maybe_holding || !self.admitted.is_empty()) {
            return Some(now);
        }
        if let Some((first, _)) = self.admitted.first() {
            return Some(*first + config.record_after);
        }
        if self.maybe_holding {
            return Some(now + config.record_after);
        }
        if self.give_back && self.holding {
            return Some(now);
        }
        if !self.holding {
            return None;
        }
        let renew = self.renewed.map(|t| t + config.ttl / 4);
        let release = self.last_request.map(|t| t + config.release_after);
        match (renew, release) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A write failed or its outcome is unknown: wait longer before the next upkeep.
    fn failed(&mut self) {
        self.failures = self.failures.saturating_add(1);
        let backoff = Duration::from_millis(100)
            .saturating_mul(1 << self.failures.min(6))
            .min(Duration::from_secs(5));
        self.not_before = Some(Instant::now() + backoff);
    }

    fn succeeded(&mut self) {
        self.failures = 0;
        self.not_before = None;
    }
}

/// What one write changes, decided on one copy.
struct Plan {
    verdicts: Vec<Verdict>,
    /// Reservations to append (recorded admissions, then this batch's).
    new_reservations: Vec<Reservation>,
    /// The new `status.allotments`, when it changes.
    allotments: Option<Value>,
    /// The new `status.demands`, when our entry changes.
    demands: Option<Value>,
    /// How many of the escrow's admissions this write records, and their total.
    recorded: usize,
    recorded_total: ResourceDetails,
    /// Our allotment after the write (`None`: not holding one).
    grant: Option<ResourceDetails>,
    /// The in-flight cap before this plan set its own (restored when the write certainly did
    /// not land).
    prior_cap: Option<ResourceDetails>,
}

impl Plan {
    fn writes(&self) -> bool {
        !self.new_reservations.is_empty() || self.allotments.is_some() || self.demands.is_some()
    }
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

fn rv_number(object: &DynamicObject) -> Option<u64> {
    object.metadata.resource_version.as_deref()?.parse().ok()
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
                escrows
                    .values()
                    .filter(|e| e.holding || e.maybe_holding || !e.admitted.is_empty())
                    .count()
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
        if let Some(verdict) = self.admit_from_allotment(project, &machine, &request) {
            return verdict;
        }
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
        if self.inner.stopping.load(Ordering::SeqCst) {
            return None;
        }
        let growth = request.ask.growth()?;
        let now = Instant::now();
        let mut escrows = lock(&self.inner.escrows);
        let escrow = escrows.get_mut(project)?;
        escrow.last_request = Some(now);
        if !escrow.holding || escrow.usable_until.is_none_or(|t| now >= t) {
            return None;
        }
        let copy = self.newest_parsed(project, escrow)?;
        if copy.uid != escrow.quota_uid {
            return None;
        }
        // Another process waits for headroom: ours goes back at our next write, and nothing more
        // is admitted from it meanwhile.
        if others_waiting(copy.status.as_ref(), &self.inner.holder, Timestamp::now()) {
            escrow.wake.notify_one();
            return None;
        }
        // Our allotment must still be in the ledger as we wrote it (seed-controller removes
        // expired ones).
        let own = copy
            .status
            .as_ref()?
            .allotments
            .iter()
            .find(|a| a.holder == self.inner.holder)?;
        if own.granted != escrow.granted {
            return None;
        }
        let state = QuotaState::for_holder(
            &copy.spec,
            copy.status.as_ref(),
            &self.inner.holder,
            &escrow.admitted_total,
        )
        .ok()?;
        let verdict = decide(project, Some(&state), request);
        if !verdict.allowed || verdict.reason != Reason::Fits {
            return None;
        }
        let cap = escrow.cap_in_flight.as_ref().unwrap_or(&escrow.granted);
        if !fits_within(&state.limit, cap, &escrow.admitted_total, &growth) {
            return None;
        }
        if !request.dry_run {
            let reserve = verdict.reserve.as_ref()?;
            let total = escrow.admitted_total.checked_add(&reserve.reserved).ok()?;
            escrow.admitted_total = total;
            if escrow.admitted.is_empty() {
                escrow.wake.notify_one();
            }
            escrow.admitted.push((
                now,
                Reservation {
                    cluster: machine.cluster.clone(),
                    uid: machine.uid.clone(),
                    size: reserve.size.clone(),
                    reserved: reserve.reserved.clone(),
                    created_at: Timestamp::now(),
                },
            ));
        }
        self.inner.metrics.allotment_admissions.inc();
        Some(verdict)
    }

    async fn work(&self, project: String, mut rx: mpsc::UnboundedReceiver<Pending>) {
        let span = info_span!("project", project = %project);
        async {
            // Requests waiting for share, decided again on every change of the project's ledger.
            let mut waiting: Vec<Pending> = Vec::new();
            let mut changes = self.inner.cache.quota_changes();
            let mut seen_version = self.known_version(&project);
            loop {
                let (wake, due, holding) =
                    {
                        let mut escrows = lock(&self.inner.escrows);
                        let escrow = escrows.entry(project.clone()).or_default();
                        let due =
                            self.inner.config.allotments.as_ref().and_then(|c| {
                                escrow.upkeep_due(c, self.inner.stopping.load(Ordering::SeqCst))
                            });
                        (Arc::clone(&escrow.wake), due, escrow.holding)
                    };
                let upkeep = async {
                    match due {
                        Some(at) => tokio::time::sleep_until(at.into()).await,
                        None => std::future::pending().await,
                    }
                };
                let wait_ends = waiting
                    .iter()
                    .map(|p| p.received + self.inner.config.share_wait)
                    .min();
                let wait_over = async {
                    match wait_ends {
                        Some(at) => tokio::time::sleep_until(at.into()).await,
                        None => std::future::pending().await,
                    }
                };
                let watch_ledger = !waiting.is_empty() || holding;
                tokio::select! {
                    received = rx.recv() => {
                        let Some(first) = received else { return };
                        let mut batch = std::mem::take(&mut waiting);
                        batch.push(first);
                        while batch.len() < self.inner.config.max_batch.max(1) {
                            match rx.try_recv() {
                                Ok(p) => batch.push(p),
                                Err(_) => break,
                            }
                        }
                        waiting = self.process(&project, batch).await;
                    }
                    () = wake.notified() => {}
                    () = upkeep => waiting = self.process(&project, std::mem::take(&mut waiting)).await,
                    () = wait_over => waiting = self.process(&project, std::mem::take(&mut waiting)).await,
                    event = changes.changed(), if watch_ledger => {
                        if event.is_err() {
                            return;
                        }
                        // Only a change of this project's ledger matters.
                        let version = self.known_version(&project);
                        if version == seen_version {
                            continue;
                        }
                        seen_version = version;
                        if !waiting.is_empty() {
                            waiting = self.process(&project, std::mem::take(&mut waiting)).await;
                        } else if self.others_waiting(&project) {
                            // Another process waits for headroom: our allotment goes back now.
                            self.process(&project, Vec::new()).await;
                        }
                    }
                    () = tokio::time::sleep(self.inner.config.idle), if waiting.is_empty() => {
                        if self.retire(&project, &rx) {
                            return;
                        }
                    }
                }
            }
        }
        .instrument(span)
        .await;
    }

    /// The resourceVersion of the project's ledger as the cache has it.
    fn known_version(&self, project: &str) -> Option<String> {
        self.inner
            .cache
            .quota_for(project)
            .and_then(|q| q.metadata.resource_version.clone())
    }

    /// Whether another process's demand is in the project's ledger (and marks our allotment to
    /// go back).
    fn others_waiting(&self, project: &str) -> bool {
        let mut escrows = lock(&self.inner.escrows);
        let Some(escrow) = escrows.get_mut(project) else {
            return false;
        };
        let Some(copy) = self.newest_parsed(project, escrow) else {
            return false;
        };
        let waiting = others_waiting(copy.status.as_ref(), &self.inner.holder, Timestamp::now());
        escrow.give_back |= waiting && escrow.holding;
        waiting && escrow.holding
    }

    /// Stops the project's worker when nothing is queued, recorded or held.
    fn retire(&self, project: &str, rx: &mpsc::UnboundedReceiver<Pending>) -> bool {
        let mut queues = lock(&self.inner.queues);
        let mut escrows = lock(&self.inner.escrows);
        let quiet = escrows.get(project).is_none_or(|e| {
            !e.holding && e.admitted.is_empty() && e.idle_since(self.inner.config.idle, Instant::now())
        });
        if quiet && rx.is_empty() {
            queues.remove(project);
            escrows.remove(project);
            return true;
        }
        false
    }

    fn api(&self) -> Api<DynamicObject> {
        Api::all_with(self.inner.client.clone(), self.inner.cache.quota_resource())
    }

    /// The freshest copy we know without asking: the cache's, or our own last write if newer.
    fn newest_copy(&self, project: &str, escrow: &Escrow) -> Option<Arc<DynamicObject>> {
        let cached = self.inner.cache.quota_for(project);
        match (cached, escrow.last_written.clone()) {
            (Some(c), Some(w)) if c.name_any() == w.name_any() && c.uid() == w.uid() => {
                if rv_number(&w) > rv_number(&c) {
                    Some(w)
                } else {
                    Some(c)
                }
            }
            (cached, _) => cached,
        }
    }

    /// [`Self::newest_copy`], parsed (once per resourceVersion).
    fn newest_parsed(&self, project: &str, escrow: &mut Escrow) -> Option<Arc<QuotaCopy>> {
        let object = self.newest_copy(project, escrow)?;
        if let Some(parsed) = &escrow.parsed
            && parsed.uid == object.metadata.uid
            && parsed.resource_version == object.metadata.resource_version
        {
            return Some(Arc::clone(parsed));
        }
        let parsed = Arc::new(QuotaCopy::from_dynamic(&object).ok()?);
        escrow.parsed = Some(Arc::clone(&parsed));
        Some(parsed)
    }

    fn known_copy(&self, project: &str) -> Option<Arc<DynamicObject>> {
        let escrows = lock(&self.inner.escrows);
        match escrows.get(project) {
            Some(escrow) => self.newest_copy(project, escrow),
            None => self.inner.cache.quota_for(project),
        }
    }

    async fn fresh_copy(&self, name: &str) -> Result<Option<DynamicObject>, kube::Error> {
        self.api().get_opt(name).await
    }

    /// Decides and writes one batch, answers every request that is decided, and returns those
    /// still waiting for share (their wait not over yet).
    async fn process(&self, project: &str, batch: Vec<Pending>) -> Vec<Pending> {
        if !batch.is_empty() {
            self.inner
                .metrics
                .batch_size
                .observe(f64::from(u32::try_from(batch.len()).unwrap_or(u32::MAX)));
        }
        let requests: Vec<Request> = batch.iter().map(|p| p.request.clone()).collect();
        // Within the deadline of the oldest request (the API server gives up on the webhook
        // after its timeoutSeconds), but never less than a write needs.
        let now = Instant::now();
        let deadline = batch
            .iter()
            .map(|p| (p.received + self.inner.config.deadline).saturating_duration_since(now))
            .min()
            .unwrap_or(self.inner.config.deadline)
            .max(Duration::from_millis(500));
        let decided = tokio::time::timeout(deadline, self.decide_and_write(project, &batch, &requests)).await;
        let verdicts = decided.unwrap_or_else(|_| {
            // The write may still land: the escrow keeps its in-flight cap until one succeeds,
            // and an allotment of ours may be in the ledger.
            self.inner.metrics.write_errors.inc();
            self.note_failure(project, true);
            Self::error_verdicts(&requests, project, "the quota could not be updated in time")
        });
        let stopping = self.inner.stopping.load(Ordering::SeqCst);
        let now = Instant::now();
        let mut waiting = Vec::new();
        for (pending, verdict) in batch.into_iter().zip(verdicts) {
            let in_transit = verdict.reason == Reason::ShareInTransit;
            let waited = now.saturating_duration_since(pending.received);
            if in_transit && !stopping && waited < self.inner.config.share_wait {
                waiting.push(Pending {
                    waited_for_share: true,
                    ..pending
                });
                continue;
            }
            if pending.waited_for_share {
                let result = if verdict.allowed { "allowed" } else { "denied" };
                self.inner
                    .metrics
                    .share_wait
                    .with_label_values(&[result])
                    .observe(waited.as_secs_f64());
            }
            let _ = pending.reply.send(verdict);
        }
        self.inner.passed.notify_waiters();
        waiting
    }

    fn error_verdicts(requests: &[Request], project: &str, why: &str) -> Vec<Verdict> {
        requests
            .iter()
            .map(|r| {
                Verdict::deny(
                    Reason::Error,
                    &r.machine,
                    &format!("could not be reserved in the quota of project {project:?}: {why}; try again"),
                )
            })
            .collect()
    }

    fn reservation_of(pending: &Pending, verdict: &Verdict, now: Timestamp) -> Option<Reservation> {
        let reserve = verdict.reserve.as_ref().filter(|_| verdict.allowed)?;
        (!pending.request.dry_run).then(|| Reservation {
            cluster: pending.machine.cluster.clone(),
            uid: pending.machine.uid.clone(),
            size: reserve.size.clone(),
            reserved: reserve.reserved.clone(),
            created_at: now,
        })
    }

    /// Decides the batch on one copy, under the escrow lock: records every admission made from
    /// the allotment, decides the batch against everything but our own allotment, and sizes the
    /// allotment anew (or gives it back). Marks the escrow as writing, so that admissions from
    /// the allotment meanwhile stay covered whether the write lands or not.
    fn plan(
        &self,
        project: &str,
        copy: &QuotaCopy,
        batch: &[Pending],
        requests: &[Request],
        escrow: &mut Escrow,
    ) -> Result<Plan, String> {
        let holder = self.inner.holder.as_str();
        let now = Timestamp::now();
        let recorded = escrow.admitted.len();
        let recorded_total = escrow.admitted_total.clone();
        // An admission already in the ledger was recorded by a write whose answer was lost (it
        // timed out but landed): not again.
        let in_ledger: HashSet<(&str, &str)> = copy
            .status
            .iter()
            .flat_map(|s| &s.reservations)
            .map(|r| (r.cluster.as_str(), r.uid.as_str()))
            .collect();
        let mut new_reservations = Vec::new();
        let mut unrecorded = ResourceDetails::zero();
        for (_, reservation) in &escrow.admitted {
            if in_ledger.contains(&(reservation.cluster.as_str(), reservation.uid.as_str())) {
                continue;
            }
            unrecorded = unrecorded
                .checked_add(&reservation.reserved)
                .map_err(|e| e.to_string())?;
            // Recorded at this write's time, so that one write's reservations of a cluster at one
            // size are one group on the wire (expiry counts from a moment later: harmless).
            new_reservations.push(Reservation {
                created_at: now,
                ..reservation.clone()
            });
        }
        let state = QuotaState::for_holder(&copy.spec, copy.status.as_ref(), holder, &unrecorded)
            .map_err(|e| e.to_string())?;
        let verdicts = decide_batch(project, Some(&state), requests);
        let mut admitted = ResourceDetails::zero();
        for (pending, verdict) in batch.iter().zip(&verdicts) {
            if let Some(reservation) = Self::reservation_of(pending, verdict, now) {
                admitted = admitted
                    .checked_add(&reservation.reserved)
                    .map_err(|e| e.to_string())?;
                new_reservations.push(reservation);
            }
        }
        let own = copy
            .status
            .as_ref()
            .and_then(|s| s.allotments.iter().find(|a| a.holder == holder));
        let (grant, demands) =
            self.grant_and_demand(copy, escrow, requests, &verdicts, &state, &admitted, now);
        let renewal_due = escrow.renewed.is_none_or(|t| {
            t.elapsed()
                >= self
                    .inner
                    .config
                    .allotments
                    .as_ref()
                    .map_or(Duration::ZERO, |c| c.ttl / 4)
        });
        let allotments = self.allotments_after(
            copy,
            own,
            grant.as_ref(),
            renewal_due,
            !new_reservations.is_empty(),
            now,
        )?;
        let own_granted = own.map(|a| a.granted.clone()).unwrap_or_default();
        let plan = Plan {
            verdicts,
            new_reservations,
            allotments,
            demands,
            recorded,
            recorded_total,
            grant,
            prior_cap: escrow.cap_in_flight.clone(),
        };
        if plan.writes() {
            // A cap still set is from a write whose outcome is unknown (it timed out or failed
            // without a conflict): it may have landed, so it bounds this one too. Otherwise the
            // grant we hold, as far as the copy still shows it.
            let old = match &escrow.cap_in_flight {
                Some(cap) => cap.clone(),
                None if escrow.holding && escrow.quota_uid == copy.uid => {
                    cap_while_writing(&escrow.granted, &own_granted, &ResourceDetails::default())
                }
                None => ResourceDetails::default(),
            };
            let new = plan.grant.clone().unwrap_or_default();
            escrow.cap_in_flight = Some(cap_while_writing(&old, &new, &plan.recorded_total));
        }
        if !requests.is_empty() {
            escrow.last_request = Some(Instant::now());
        }
        Ok(plan)
    }

    /// Our allotment after this write (`None`: none) and the new `status.demands` if our demand
    /// changes. Requests waiting for share make a demand, so that the master moves share here
    /// and the other processes give their allotments back; while another process waits, we hold
    /// none (what we admitted from it is recorded by this very write).
    #[allow(clippy::too_many_arguments)]
    fn grant_and_demand(
        &self,
        copy: &QuotaCopy,
        escrow: &mut Escrow,
        requests: &[Request],
        verdicts: &[Verdict],
        state: &QuotaState,
        admitted: &ResourceDetails,
        now: Timestamp,
    ) -> (Option<ResourceDetails>, Option<Value>) {
        let holder = self.inner.holder.as_str();
        let wants = largest(verdicts.iter().filter_map(|v| v.wants_share.as_ref()));
        let waiting_elsewhere = others_waiting(copy.status.as_ref(), holder, now);
        escrow.give_back = false;
        let grant = self.inner.config.allotments.as_ref().and_then(|config| {
            let idle = requests.is_empty() && escrow.idle_since(config.release_after, Instant::now());
            if idle || waiting_elsewhere || wants.is_some() || self.inner.stopping.load(Ordering::SeqCst) {
                return None;
            }
            state.allotment_room(admitted).ok()
        });
        let demands = demands_after(
            copy.status.as_ref(),
            &copy.raw_demands,
            holder,
            wants.as_ref(),
            !requests.is_empty(),
            now,
            self.inner.config.demand_ttl,
        );
        if demands.is_some() && wants.is_some() {
            self.inner.metrics.share_demands.inc();
        }
        (grant, demands)
    }

    /// The new `status.allotments`, when it changes: the others' entries as they are, and ours
    /// with `grant` (renewed), or without ours when `grant` is `None`.
    fn allotments_after(
        &self,
        copy: &QuotaCopy,
        own: Option<&Allotment>,
        grant: Option<&ResourceDetails>,
        renewal_due: bool,
        recording: bool,
        now: Timestamp,
    ) -> Result<Option<Value>, String> {
        let holder = self.inner.holder.as_str();
        let changes = match (own, grant) {
            (None, None) => false,
            (Some(own), Some(grant)) => own.granted != *grant || renewal_due || recording,
            _ => true,
        };
        if !changes {
            return Ok(None);
        }
        let mut list: Vec<Value> = copy
            .raw_allotments
            .iter()
            .filter(|a| a.get("holder").and_then(Value::as_str) != Some(holder))
            .cloned()
            .collect();
        if let (Some(grant), Some(config)) = (grant, &self.inner.config.allotments) {
            let expires_at = now
                .saturating_add(SignedDuration::try_from(config.ttl).unwrap_or(SignedDuration::MAX))
                .unwrap_or(now);
            let allotment = Allotment {
                holder: holder.to_owned(),
                granted: grant.clone(),
                expires_at,
            };
            list.push(serde_json::to_value(allotment).map_err(|e| e.to_string())?);
        }
        Ok(Some(if list.is_empty() {
            Value::Null
        } else {
            Value::Array(list)
        }))
    }

    fn set_ledger_size(&self, project: &str, count: usize) {
        self.inner
            .metrics
            .reservations
            .with_label_values(&[project])
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// Writes the plan, conditioned on the copy's resourceVersion.
    async fn write(&self, copy: &QuotaCopy, plan: &Plan) -> Result<DynamicObject, kube::Error> {
        let mut status = serde_json::Map::new();
        status.insert("formatVersion".into(), json!(LEDGER_FORMAT));
        if !plan.new_reservations.is_empty() {
            let mut reservations = copy.raw_reservations.clone();
            for group in group(&plan.new_reservations) {
                reservations.push(serde_json::to_value(group).map_err(kube::Error::SerdeError)?);
            }
            status.insert("reservations".into(), Value::Array(reservations));
        }
        if let Some(allotments) = &plan.allotments {
            status.insert("allotments".into(), allotments.clone());
        }
        if let Some(demands) = &plan.demands {
            status.insert("demands".into(), demands.clone());
        }
        let patch = json!({
            "metadata": {"resourceVersion": copy.resource_version},
            "status": status,
        });
        let started = Instant::now();
        let written = self
            .api()
            .patch_status(&copy.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
        self.inner
            .metrics
            .write_duration
            .observe(started.elapsed().as_secs_f64());
        let written = written?;
        self.inner.metrics.writes.inc();
        Ok(written)
    }

    /// The write landed: what it recorded leaves the escrow, the allotment is what it wrote.
    fn written(
        &self,
        project: &str,
        copy: &QuotaCopy,
        plan: &Plan,
        started: Instant,
        written: DynamicObject,
    ) {
        let mut escrows = lock(&self.inner.escrows);
        let escrow = escrows.entry(project.to_owned()).or_default();
        escrow.admitted.drain(..plan.recorded.min(escrow.admitted.len()));
        escrow.admitted_total = escrow.admitted_total.saturating_sub(&plan.recorded_total);
        escrow.cap_in_flight = None;
        escrow.maybe_holding = false;
        escrow.succeeded();
        escrow.quota_uid.clone_from(&copy.uid);
        let ttl = self.inner.config.allotments.as_ref().map(|c| c.ttl);
        if let (Some(grant), Some(ttl)) = (&plan.grant, ttl) {
            if plan.allotments.is_some() {
                escrow.renewed = Some(started);
                escrow.usable_until = Some(started + ttl / 2);
            }
            if !escrow.holding {
                debug!(granted = %grant, "allotment taken");
            }
            escrow.holding = true;
            escrow.granted = grant.clone();
        } else {
            if escrow.holding {
                info!(quota = %copy.name, "allotment given back");
            }
            escrow.holding = false;
            escrow.granted = ResourceDetails::default();
            escrow.usable_until = None;
            escrow.renewed = None;
        }
        let count = written
            .data
            .get("status")
            .and_then(|s| s.get("reservations"))
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        escrow.last_written = Some(Arc::new(written));
        drop(escrows);
        self.set_ledger_size(project, count);
    }

    /// The project has no quota (any more): nothing to hold. Admissions not recorded yet stay,
    /// to be recorded if a copy comes back (they are Machines that exist); meanwhile upkeep backs
    /// off.
    fn forget(&self, project: &str) {
        let mut escrows = lock(&self.inner.escrows);
        if let Some(escrow) = escrows.get_mut(project) {
            let mut kept = Escrow {
                last_request: escrow.last_request,
                wake: Arc::clone(&escrow.wake),
                admitted: std::mem::take(&mut escrow.admitted),
                admitted_total: std::mem::take(&mut escrow.admitted_total),
                failures: escrow.failures,
                ..Escrow::default()
            };
            if !kept.admitted.is_empty() {
                kept.failed();
            }
            *escrow = kept;
        }
    }

    /// Notes a failed (or unknown) write for the project's upkeep backoff.
    fn note_failure(&self, project: &str, maybe_holding: bool) {
        if let Some(escrow) = lock(&self.inner.escrows).get_mut(project) {
            escrow.failed();
            escrow.maybe_holding |= maybe_holding;
        }
    }

    /// A write failed. A conflict certainly did not land: the bound in force before its plan is
    /// back. Anything else may have landed: its bound stays, and so may our allotment.
    fn write_failed(&self, project: &str, plan: &Plan, error: &kube::Error) {
        if let Some(escrow) = lock(&self.inner.escrows).get_mut(project) {
            if matches!(error, kube::Error::Api(s) if s.code == 409) {
                escrow.cap_in_flight.clone_from(&plan.prior_cap);
            } else {
                escrow.maybe_holding |= plan.allotments.is_some();
            }
        }
    }

    async fn decide_and_write(&self, project: &str, batch: &[Pending], requests: &[Request]) -> Vec<Verdict> {
        let max_attempts = self.inner.config.max_attempts.max(1);
        let mut snapshot = self.known_copy(project);
        let mut verified = false;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let Some(object) = snapshot.clone() else {
                // No quota: nothing to reserve.
                self.forget(project);
                return decide_batch(project, None, requests);
            };
            let copy = match QuotaCopy::from_dynamic(&object) {
                Ok(copy) => copy,
                Err(e) => {
                    self.note_failure(project, false);
                    return Self::error_verdicts(requests, project, &e.to_string());
                }
            };
            if copy.resource_version.is_none() {
                self.note_failure(project, false);
                return Self::error_verdicts(requests, project, "the quota copy has no resourceVersion");
            }
            let planned = {
                let mut escrows = lock(&self.inner.escrows);
                let escrow = escrows.entry(project.to_owned()).or_default();
                self.plan(project, &copy, batch, requests, escrow)
            };
            let plan = match planned {
                Ok(plan) => plan,
                Err(why) => {
                    self.note_failure(project, false);
                    return Self::error_verdicts(requests, project, &why);
                }
            };
            let result = if plan.writes() {
                let started = Instant::now();
                match self.write(&copy, &plan).await {
                    Ok(written) => {
                        self.written(project, &copy, &plan, started, written);
                        debug!(batch = requests.len(), recorded = plan.recorded, attempt, quota = %copy.name, "ledger written");
                        return plan.verdicts;
                    }
                    Err(e) => {
                        self.write_failed(project, &plan, &e);
                        Err(e)
                    }
                }
            } else {
                if let Some(escrow) = lock(&self.inner.escrows).get_mut(project) {
                    if plan.grant.is_none() {
                        // Nothing of ours in this copy (seed-controller removed it, or we gave
                        // it back): not holding; certain only on a fresh read.
                        escrow.holding = false;
                        escrow.usable_until = None;
                        escrow.maybe_holding &= !verified;
                    }
                    escrow.succeeded();
                }
                if verified || requests.is_empty() {
                    self.set_ledger_size(project, copy.reservation_count());
                    return plan.verdicts;
                }
                // Denials (or nothing to write) on a snapshot that may be stale: confirm them on
                // a fresh read before answering.
                Ok(())
            };
            if let Err(e) = &result {
                let conflict = matches!(e, kube::Error::Api(s) if s.code == 409);
                if conflict {
                    self.inner.metrics.conflicts.inc();
                } else {
                    self.inner.metrics.write_errors.inc();
                    warn!(error = %e, attempt, quota = %copy.name, "ledger write failed");
                }
                if attempt >= max_attempts {
                    let why = if conflict {
                        format!("the quota changed {attempt} times while it was being checked")
                    } else {
                        e.to_string()
                    };
                    self.note_failure(project, false);
                    return Self::error_verdicts(requests, project, &why);
                }
                if !conflict {
                    tokio::time::sleep(Duration::from_millis(20 * u64::from(attempt))).await;
                }
            }
            match self.fresh_copy(&copy.name).await {
                Ok(fresh) => {
                    snapshot = fresh.map(Arc::new);
                    verified = true;
                }
                Err(e) => {
                    self.inner.metrics.write_errors.inc();
                    if attempt >= max_attempts {
                        self.note_failure(project, false);
                        return Self::error_verdicts(requests, project, &e.to_string());
                    }
                }
            }
        }
    }
}
