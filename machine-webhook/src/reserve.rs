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
}

impl Default for ReserverConfig {
    fn default() -> Self {
        ReserverConfig {
            max_batch: 256,
            max_attempts: 10,
            idle: Duration::from_secs(60),
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
        self.inner.metrics.batch_size.observe(batch.len() as f64);
        let requests: Vec<Request> = batch.iter().map(|p| p.request.clone()).collect();
        let verdicts = self.decide_and_write(project, &batch, &requests).await;
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

    async fn decide_and_write(
        &self,
        project: &str,
        batch: &[Pending],
        requests: &[Request],
    ) -> Vec<Verdict> {
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
            let copy = match QuotaCopy::from_dynamic(&object) {
                Ok(copy) => copy,
                Err(e) => return Self::error_verdicts(requests, project, &e.to_string()),
            };
            let state = match copy.state() {
                Ok(state) => state,
                Err(e) => return Self::error_verdicts(requests, project, &e.to_string()),
            };
            let verdicts = decide_batch(project, Some(&state), requests);
            let now = Timestamp::now();
            let new: Vec<serde_json::Value> = batch
                .iter()
                .zip(&verdicts)
                .filter(|(p, _)| !p.request.dry_run)
                .filter_map(|(p, v)| v.reserve.as_ref().filter(|_| v.allowed).map(|r| (p, r)))
                .filter_map(|(p, r)| {
                    serde_json::to_value(Reservation {
                        cluster: p.machine.cluster.clone(),
                        namespace: p.machine.namespace.clone(),
                        name: p.machine.name.clone(),
                        uid: p.machine.uid.clone(),
                        size: r.size.clone(),
                        reserved: r.reserved.clone(),
                        created_at: now,
                    })
                    .ok()
                })
                .collect();
            if new.is_empty() {
                if verified {
                    self.inner
                        .metrics
                        .reservations
                        .with_label_values(&[project])
                        .set(i64::try_from(copy.reservation_count()).unwrap_or(i64::MAX));
                    return verdicts;
                }
                // Denials (or nothing to write) on a snapshot that may be stale: confirm on a
                // fresh read before answering.
                match self.fresh_copy(&copy.name).await {
                    Ok(fresh) => {
                        snapshot = fresh.map(Arc::new);
                        verified = true;
                        continue;
                    }
                    Err(e) => {
                        self.inner.metrics.write_errors.inc();
                        return Self::error_verdicts(requests, project, &e.to_string());
                    }
                }
            }
            let Some(resource_version) = copy.resource_version.clone() else {
                return Self::error_verdicts(requests, project, "the quota copy has no resourceVersion");
            };
            let count = copy.raw_reservations.len() + new.len();
            let mut reservations = copy.raw_reservations.clone();
            reservations.extend(new);
            let patch = json!({
                "metadata": {"resourceVersion": resource_version},
                "status": {"reservations": reservations},
            });
            let result = self
                .api()
                .patch_status(&copy.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
            match result {
                Ok(written) => {
                    self.inner.metrics.writes.inc();
                    self.inner
                        .metrics
                        .reservations
                        .with_label_values(&[project])
                        .set(i64::try_from(count).unwrap_or(i64::MAX));
                    debug!(batch = requests.len(), attempt, quota = %copy.name, "reservations written");
                    self.inner
                        .last_written
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .insert(project.to_owned(), Arc::new(written));
                    return verdicts;
                }
                Err(e) => {
                    let conflict = matches!(&e, kube::Error::Api(s) if s.code == 409);
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
                    match self.fresh_copy(&copy.name).await {
                        Ok(fresh) => {
                            snapshot = fresh.map(Arc::new);
                            verified = true;
                        }
                        Err(e) => {
                            self.inner.metrics.write_errors.inc();
                            if attempt + 1 >= max_attempts {
                                return Self::error_verdicts(requests, project, &e.to_string());
                            }
                        }
                    }
                }
            }
        }
    }
}
