//! The per-project worker: batches waiting requests, keeps requests that wait for share, and
//! wakes for upkeep and for changes of the project's ledger.

use super::*;

impl Reserver {
    pub(super) async fn work(&self, project: String, mut rx: mpsc::UnboundedReceiver<Pending>) {
        let span = info_span!("project", project = %project);
        async {
            // Requests waiting for share, decided again on every change of the project's ledger.
            let mut waiting: Vec<Pending> = Vec::new();
            let mut changes = self.inner.cache.quota_changes();
            let mut seen_version = self.known_version(&project);
            loop {
                let (wake, due, holding) = {
                    let mut escrows = lock(&self.inner.escrows);
                    let escrow = escrows.entry(project.clone()).or_default();
                    let stopping = self.inner.stopping.load(Ordering::SeqCst);
                    let due = self
                        .inner
                        .config
                        .allotments
                        .as_ref()
                        .and_then(|c| escrow.holder.upkeep_due(Instant::now(), c, stopping));
                    (Arc::clone(&escrow.wake), due, escrow.holder.holding())
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
                        let mut queued = 1;
                        self.admit_or_batch(&project, first, &mut batch);
                        while queued < self.inner.config.max_batch.max(1) {
                            match rx.try_recv() {
                                Ok(p) => {
                                    queued += 1;
                                    self.admit_or_batch(&project, p, &mut batch);
                                }
                                Err(_) => break,
                            }
                        }
                        if !batch.is_empty() {
                            waiting = self.process(&project, batch).await;
                        }
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
                        } else if self.allotment_wanted_back(&project) {
                            // Headroom is wanted elsewhere: our allotment goes back now.
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

    /// Answers a queued request from the allotment when it now fits there (it was queued while
    /// there was none, or while the write that takes one was in flight: the first wave of a
    /// burst), else adds it to the batch for the next write.
    fn admit_or_batch(&self, project: &str, pending: Pending, batch: &mut Vec<Pending>) {
        match self.admit_from_allotment(project, &pending.machine, &pending.request) {
            Some(verdict) => {
                let _ = pending.reply.send(verdict);
            }
            None => batch.push(pending),
        }
    }

    /// The resourceVersion of the project's ledger as the cache has it.
    pub(super) fn known_version(&self, project: &str) -> Option<String> {
        self.inner
            .cache
            .quota_for(project)
            .and_then(|q| q.metadata.resource_version.clone())
    }

    /// Whether our allotment is wanted back ([`allotment_wanted_back`]; marks it to go back).
    pub(super) fn allotment_wanted_back(&self, project: &str) -> bool {
        let Some(view) = self.newest_view(project, false) else {
            return false;
        };
        let copy = &view.copy;
        let waiting = view.share_wanted_back
            || self.inner.demand_clock.others_waiting(
                &copy.name,
                copy.status.as_ref(),
                &self.inner.holder,
                self.inner.config.now(),
            );
        let mut escrows = lock(&self.inner.escrows);
        let Some(escrow) = escrows.get_mut(project) else {
            return false;
        };
        escrow.holder.wanted_back(waiting)
    }

    /// Stops the project's worker when nothing is queued, recorded or held.
    pub(super) fn retire(&self, project: &str, rx: &mpsc::UnboundedReceiver<Pending>) -> bool {
        let mut queues = lock(&self.inner.queues);
        let mut escrows = lock(&self.inner.escrows);
        let quiet = escrows
            .get(project)
            .is_none_or(|e| e.holder.quiet(self.inner.config.idle, Instant::now()));
        if quiet && rx.is_empty() {
            queues.remove(project);
            escrows.remove(project);
            return true;
        }
        false
    }

    /// Decides and writes one batch, answers every request that is decided, and returns those
    /// still waiting for share (their wait not over yet).
    pub(super) async fn process(&self, project: &str, batch: Vec<Pending>) -> Vec<Pending> {
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
            let waited = now.saturating_duration_since(pending.received);
            if verdict.waits_for_share() && !stopping && waited < self.inner.config.share_wait {
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

    pub(super) fn error_verdicts(requests: &[Request], project: &str, why: &str) -> Vec<Verdict> {
        requests
            .iter()
            .map(|r| {
                r.deny(
                    Reason::Error,
                    &format!("could not be reserved in the quota of project {project:?}: {why}; try again"),
                )
            })
            .collect()
    }
}
