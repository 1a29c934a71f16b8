//! Reservations by compare-and-swap, batched per project.
//!
//! Every project with requests in flight has one queue and one worker. Requests that wait at the
//! same time are taken together, decided in order against one snapshot of the quota copy
//! ([`decide_batch`]), and the admitted ones are appended to `status.reservations` in ONE JSON
//! merge patch on `/status` that carries the `metadata.resourceVersion` the decision was made
//! on. A 409 Conflict means someone else wrote in between: the copy is re-read from the API
//! server (never from the cache) and the whole batch is decided again. Each answer waits for its
//! batch's write, so an admitted Machine is always in the ledger before the API server stores it.
//!
//! A denial is only final on a snapshot known to be current: either the batch's write succeeded
//! (so its snapshot was the latest), or the snapshot was just read from the API server.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use kkp_quota_crds::ledger::Reservation;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Api, Client, ResourceExt as _};
use serde_json::json;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, info_span, warn};

use crate::cache::{QuotaCopy, SeedCache};
use crate::decision::{Reason, Request, Verdict, decide_batch};
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
}

impl Default for ReserverConfig {
    fn default() -> Self {
        ReserverConfig {
            max_batch: 256,
            max_attempts: 10,
            idle: Duration::from_mins(1),
            deadline: Duration::from_secs(4),
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
}

struct Inner {
    client: Client,
    cache: Arc<SeedCache>,
    metrics: Metrics,
    config: ReserverConfig,
    queues: Mutex<HashMap<String, mpsc::UnboundedSender<Pending>>>,
    /// Per project: the copy as our last successful write returned it (often newer than the
    /// cache, which would make the next batch's first attempt a certain conflict).
    last_written: Mutex<HashMap<String, Arc<DynamicObject>>>,
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
                queues: Mutex::new(HashMap::new()),
                last_written: Mutex::new(HashMap::new()),
                token,
            }),
        }
    }

    /// Queues a request behind the project's other waiting requests and waits for its verdict
    /// (which, when it admits, is already written to the ledger).
    pub async fn submit(&self, project: &str, machine: MachineRef, request: Request) -> Verdict {
        let (reply, answer) = oneshot::channel();
        let machine_name = request.machine.clone();
        let pending = Pending {
            machine,
            request,
            reply,
        };
        {
            let mut queues = self
                .inner
                .queues
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
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

    async fn work(&self, project: String, mut rx: mpsc::UnboundedReceiver<Pending>) {
        let span = info_span!("project", project = %project);
        async {
            loop {
                let first = match tokio::time::timeout(self.inner.config.idle, rx.recv()).await {
                    Ok(Some(p)) => p,
                    Ok(None) => return,
                    Err(_) => {
                        let mut queues = self
                            .inner
                            .queues
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        if rx.is_empty() {
                            queues.remove(&project);
                            return;
                        }
                        continue;
                    }
                };
                let mut batch = vec![first];
                while batch.len() < self.inner.config.max_batch.max(1) {
                    match rx.try_recv() {
                        Ok(p) => batch.push(p),
                        Err(_) => break,
                    }
                }
                self.process(&project, batch).await;
            }
        }
        .instrument(span)
        .await;
    }

    fn api(&self) -> Api<DynamicObject> {
        Api::all_with(self.inner.client.clone(), self.inner.cache.quota_resource())
    }

    /// The freshest copy we know without asking: the cache's, or our own last write if newer.
    fn known_copy(&self, project: &str) -> Option<Arc<DynamicObject>> {
        let cached = self.inner.cache.quota_for(project);
        let written = self
            .inner
            .last_written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(project)
            .cloned();
        match (cached, written) {
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

    async fn fresh_copy(&self, name: &str) -> Result<Option<DynamicObject>, kube::Error> {
        self.api().get_opt(name).await
    }

    async fn process(&self, project: &str, batch: Vec<Pending>) {
        self.inner
            .metrics
            .batch_size
            .observe(f64::from(u32::try_from(batch.len()).unwrap_or(u32::MAX)));
        let requests: Vec<Request> = batch.iter().map(|p| p.request.clone()).collect();
        let decided = tokio::time::timeout(
            self.inner.config.deadline,
            self.decide_and_write(project, &batch, &requests),
        )
        .await;
        let verdicts = decided.unwrap_or_else(|_| {
            self.inner.metrics.write_errors.inc();
            Self::error_verdicts(&requests, project, "the quota could not be updated in time")
        });
        for (pending, verdict) in batch.into_iter().zip(verdicts) {
            let _ = pending.reply.send(verdict);
        }
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

    /// Decides the batch on one copy; returns the verdicts and the reservations to append.
    fn plan(
        project: &str,
        copy: &QuotaCopy,
        batch: &[Pending],
        requests: &[Request],
    ) -> Result<(Vec<Verdict>, Vec<serde_json::Value>), String> {
        let state = copy.state().map_err(|e| e.to_string())?;
        let verdicts = decide_batch(project, Some(&state), requests);
        let now = Timestamp::now();
        let mut new = Vec::new();
        for (pending, verdict) in batch.iter().zip(&verdicts) {
            let Some(reserve) = verdict.reserve.as_ref().filter(|_| verdict.allowed) else {
                continue;
            };
            if pending.request.dry_run {
                continue;
            }
            let reservation = Reservation {
                cluster: pending.machine.cluster.clone(),
                namespace: pending.machine.namespace.clone(),
                name: pending.machine.name.clone(),
                uid: pending.machine.uid.clone(),
                size: reserve.size.clone(),
                reserved: reserve.reserved.clone(),
                created_at: now,
            };
            new.push(serde_json::to_value(reservation).map_err(|e| e.to_string())?);
        }
        Ok((verdicts, new))
    }

    fn set_ledger_size(&self, project: &str, count: usize) {
        self.inner
            .metrics
            .reservations
            .with_label_values(&[project])
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// Appends `new` to the copy's reservations, conditioned on the copy's resourceVersion.
    async fn append(
        &self,
        project: &str,
        copy: &QuotaCopy,
        new: Vec<serde_json::Value>,
    ) -> Result<(), kube::Error> {
        let count = copy.raw_reservations.len() + new.len();
        let mut reservations = copy.raw_reservations.clone();
        reservations.extend(new);
        let patch = json!({
            "metadata": {"resourceVersion": copy.resource_version},
            "status": {"reservations": reservations},
        });
        let started = std::time::Instant::now();
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
        self.set_ledger_size(project, count);
        self.inner
            .last_written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(project.to_owned(), Arc::new(written));
        Ok(())
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
                return decide_batch(project, None, requests);
            };
            let planned = QuotaCopy::from_dynamic(&object)
                .map_err(|e| e.to_string())
                .and_then(|copy| Self::plan(project, &copy, batch, requests).map(|(v, n)| (copy, v, n)));
            let (copy, verdicts, new) = match planned {
                Ok(planned) => planned,
                Err(why) => return Self::error_verdicts(requests, project, &why),
            };
            if copy.resource_version.is_none() {
                return Self::error_verdicts(requests, project, "the quota copy has no resourceVersion");
            }
            let result = if new.is_empty() {
                if verified {
                    self.set_ledger_size(project, copy.reservation_count());
                    return verdicts;
                }
                // Denials (or nothing to write) on a snapshot that may be stale: confirm them on
                // a fresh read before answering.
                Ok(false)
            } else {
                match self.append(project, &copy, new).await {
                    Ok(()) => {
                        debug!(batch = requests.len(), attempt, quota = %copy.name, "reservations written");
                        return verdicts;
                    }
                    Err(e) => Err(e),
                }
            };
            if let Err(e) = &result {
                let conflict = matches!(e, kube::Error::Api(s) if s.code == 409);
                if conflict {
                    self.inner.metrics.conflicts.inc();
                } else {
                    self.inner.metrics.write_errors.inc();
                    warn!(error = %e, attempt, quota = %copy.name, "reservation write failed");
                }
                if attempt >= max_attempts {
                    let why = if conflict {
                        format!("the quota changed {attempt} times while it was being checked")
                    } else {
                        e.to_string()
                    };
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
                        return Self::error_verdicts(requests, project, &e.to_string());
                    }
                }
            }
        }
    }
}
