//! One pass over a batch: the plan decided on one copy of the ledger, and its compare-and-swap
//! write (retried on conflicts).

use kkp_quota_crds::ledger::carried_holder;
use kkp_quota_crds::shares::allotment::CarriedChange;
use kkp_quota_runtime::chain::Chain;

use super::*;

/// Why a write could not be planned on a copy of the ledger (the batch is answered "try again").
#[derive(Debug, thiserror::Error)]
pub(super) enum PlanError {
    #[error(transparent)]
    Ledger(#[from] crate::decision::StateError),
    #[error("adding up sizes")]
    Quantity(#[from] kkp_quota_crds::QuantityError),
    #[error("encoding this process's allotment")]
    Encode(#[from] serde_json::Error),
}

impl Reserver {
    /// The reservation an admission of `machine` records (none for a denial or a dry run).
    pub(super) fn reservation_of(
        machine: &MachineRef,
        request: &Request,
        verdict: &Verdict,
        now: Timestamp,
    ) -> Option<Reservation> {
        let reserve = verdict.reserve.as_ref().filter(|_| verdict.allowed)?;
        (!request.dry_run).then(|| Reservation {
            cluster: machine.cluster.clone(),
            uid: reserve.uid.clone().unwrap_or_else(|| machine.uid.clone()),
            size: reserve.size.clone(),
            reserved: reserve.reserved.clone(),
            created_at: now,
            deployment: reserve.deployment.clone(),
        })
    }

    /// Decides the batch on one copy, under the escrow lock: records every admission made from
    /// the allotment, decides the batch against everything but our own allotment, and sizes the
    /// allotment anew (or gives it back). Marks the escrow as writing, so that admissions from
    /// the allotment meanwhile stay covered whether the write lands or not.
    pub(super) fn plan(
        &self,
        project: &str,
        copy: &QuotaCopy,
        batch: &[Pending],
        requests: &[Request],
        escrow: &mut Escrow,
    ) -> Result<Plan, PlanError> {
        let holder = self.inner.holder.as_str();
        let now = self.inner.config.now();
        let instant = Instant::now();
        // An admission already in the ledger was recorded by a write whose answer was lost (it
        // timed out but landed): not again.
        let in_ledger: HashSet<(&str, &str)> = copy
            .status
            .iter()
            .flat_map(|s| &s.reservations)
            .map(|r| (r.cluster.as_str(), r.uid.as_str()))
            .collect();
        let (unrecorded, unrecorded_total) = escrow
            .holder
            .unrecorded(|r| in_ledger.contains(&(r.cluster.as_str(), r.uid.as_str())))?;
        // Recorded at this write's time, so that one write's reservations of a cluster at one
        // size are one group on the wire (expiry counts from a moment later: harmless).
        let mut new_reservations: Vec<Reservation> = unrecorded
            .into_iter()
            .map(|r| Reservation { created_at: now, ..r })
            .collect();
        let state = QuotaState::for_holder(&copy.spec, copy.status.as_ref(), holder, &unrecorded_total)?;
        let verdicts = decide_batch(project, Some(&state), requests);
        let mut admitted = ResourceDetails::zero();
        for (pending, verdict) in batch.iter().zip(&verdicts) {
            if let Some(reservation) = Self::reservation_of(&pending.machine, &pending.request, verdict, now)
            {
                admitted = admitted.checked_add(&reservation.reserved)?;
                new_reservations.push(reservation);
            }
        }
        let own = copy
            .status
            .as_ref()
            .and_then(|s| s.allotments.iter().find(|a| a.holder == holder));
        // Our entry carried from a deleted ledger: what we record of our admissions there moves
        // out of it (decided before `begin_write`, while we know which ledger we last wrote).
        let carried_name = carried_holder(holder);
        let carried = copy
            .status
            .as_ref()
            .and_then(|s| s.allotments.iter().find(|a| a.holder == carried_name))
            .and_then(|entry| {
                let left = escrow.holder.carried_after(
                    copy.uid.as_deref(),
                    Some(&entry.granted),
                    &unrecorded_total,
                )?;
                Some((entry, left))
            });
        let (grant, demands) =
            self.grant_and_demand(copy, escrow, requests, &verdicts, &state, &admitted, now, instant);
        let renewal_due = self
            .inner
            .config
            .allotments
            .as_ref()
            .is_none_or(|c| escrow.holder.renewal_due(instant, c.ttl));
        let (allotments, writes_own) = self.allotments_after(
            copy,
            own,
            grant.as_ref(),
            renewal_due,
            !new_reservations.is_empty(),
            now,
            carried,
        )?;
        let own_granted = own.map(|a| a.granted.clone()).unwrap_or_default();
        let writes = !new_reservations.is_empty() || allotments.is_some() || demands.is_some();
        let start = escrow.holder.begin_write(
            instant,
            Planned {
                copy_uid: copy.uid.as_deref(),
                own_granted: &own_granted,
                grant,
                writes_allotment: writes_own,
                writes,
                requests: !requests.is_empty(),
            },
        );
        Ok(Plan {
            verdicts,
            new_reservations,
            allotments,
            demands,
            start,
        })
    }

    /// Our allotment after this write (`None`: none) and the new `status.demands` if our demand
    /// changes. Requests waiting for share make a demand, so that the master moves share here
    /// and the other processes give their allotments back; while another process waits, we hold
    /// none (what we admitted from it is recorded by this very write).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn grant_and_demand(
        &self,
        copy: &QuotaCopy,
        escrow: &mut Escrow,
        requests: &[Request],
        verdicts: &[Verdict],
        state: &QuotaState,
        admitted: &ResourceDetails,
        now: Timestamp,
        instant: Instant,
    ) -> (Option<ResourceDetails>, Option<Value>) {
        let holder = self.inner.holder.as_str();
        let wants = largest(verdicts.iter().filter_map(|v| v.wants_share.as_ref()));
        let others = self
            .inner
            .demand_clock
            .others_waiting(&copy.name, copy.status.as_ref(), holder, now);
        let waiting_elsewhere = allotment_wanted_back(&copy.spec, copy.status.as_ref(), others);
        let grant = self.inner.config.allotments.as_ref().and_then(|config| {
            let pass = Pass {
                requests: !requests.is_empty(),
                wanted_elsewhere: waiting_elsewhere,
                wants_share: wants.is_some(),
                stopping: self.inner.stopping.load(Ordering::SeqCst),
            };
            escrow
                .holder
                .next_grant(instant, config, pass, || state.allotment_room(admitted).ok())
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
        if let (Some(_), Some(wants)) = (&demands, &wants) {
            self.inner.metrics.share_demands.inc();
            debug!(wants = %wants, waiting = requests.len(), "demand for share recorded");
        }
        (grant, demands)
    }

    /// The new `status.allotments`, when it changes: the others' entries as they are, ours with
    /// `grant` (renewed), or without ours when `grant` is `None`, and our carried entry as
    /// `carried` leaves it; and whether our own entry is written.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn allotments_after(
        &self,
        copy: &QuotaCopy,
        own: Option<&Allotment>,
        grant: Option<&ResourceDetails>,
        renewal_due: bool,
        recording: bool,
        now: Timestamp,
        carried: Option<(&Allotment, CarriedChange)>,
    ) -> Result<(Option<Value>, bool), PlanError> {
        let holder = self.inner.holder.as_str();
        let own_changes = match (own, grant) {
            (None, None) => false,
            (Some(own), Some(grant)) => own.granted != *grant || renewal_due || recording,
            _ => true,
        };
        if !own_changes && carried.is_none() {
            return Ok((None, false));
        }
        let mut list = copy.raw_allotments.clone();
        if own_changes {
            let own = match (grant, &self.inner.config.allotments) {
                (Some(grant), Some(config)) => {
                    let expires_at = now
                        .saturating_add(SignedDuration::try_from(config.ttl).unwrap_or(SignedDuration::MAX))
                        .unwrap_or(now);
                    let allotment = Allotment {
                        holder: holder.to_owned(),
                        granted: grant.clone(),
                        expires_at,
                        // Readers judge by this, not by our clock (issue #32, finding 8).
                        ttl_seconds: Some(kkp_quota_crds::ledger::lifetimes::ttl_seconds(config.ttl)),
                    };
                    Some(serde_json::to_value(allotment)?)
                }
                _ => None,
            };
            list = entries(with_own_entry(&list, holder, own));
        }
        if let Some((entry, change)) = carried {
            let kept = change
                .left()
                .map(|granted| {
                    serde_json::to_value(Allotment {
                        granted: granted.clone(),
                        ..entry.clone()
                    })
                })
                .transpose()?;
            list = entries(with_own_entry(&list, &entry.holder, kept));
        }
        let value = if list.is_empty() {
            Value::Null
        } else {
            Value::Array(list)
        };
        Ok((Some(value), own_changes))
    }

    pub(super) fn set_ledger_size(&self, project: &str, count: usize) {
        self.inner
            .metrics
            .reservations
            .with_label_values(&[project])
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// Writes the plan, conditioned on the copy's resourceVersion.
    pub(super) async fn write(&self, copy: &QuotaCopy, plan: &Plan) -> Result<DynamicObject, kube::Error> {
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

    /// The write landed: what it recorded leaves the holder, the allotment is what it wrote.
    pub(super) fn written(
        &self,
        project: &str,
        copy: &QuotaCopy,
        plan: &Plan,
        started: Instant,
        written: DynamicObject,
    ) {
        let mut escrows = lock(&self.inner.escrows);
        let escrow = escrows.entry(project.to_owned()).or_default();
        let ttl = self
            .inner
            .config
            .allotments
            .as_ref()
            .map_or(Duration::ZERO, |c| c.ttl);
        match escrow
            .holder
            .landed(started, copy.uid.as_deref(), &plan.start, ttl)
        {
            Holding::Taken => debug!(granted = %escrow.holder.granted(), "allotment taken"),
            Holding::GivenBack => info!(quota = %copy.name, "allotment given back"),
            Holding::Kept | Holding::None => {}
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

    /// The project has no ledger (any more): nothing to hold. Admissions not recorded yet stay,
    /// to be recorded if a ledger comes back (they are Machines that exist); meanwhile upkeep
    /// backs off.
    pub(super) fn forget(&self, project: &str) {
        let mut escrows = lock(&self.inner.escrows);
        if let Some(escrow) = escrows.get_mut(project) {
            escrow.holder.forget(Instant::now());
            escrow.last_written = None;
            escrow.parsed = None;
        }
    }

    /// Notes a pass that gave up, for the project's upkeep backoff; `maybe_landed`: a write of
    /// it may still land.
    pub(super) fn note_failure(&self, project: &str, maybe_landed: bool) {
        if let Some(escrow) = lock(&self.inner.escrows).get_mut(project) {
            escrow.holder.gave_up(Instant::now(), maybe_landed);
        }
    }

    /// A write failed: a conflict certainly did not land, anything else may have.
    pub(super) fn write_failed(&self, project: &str, plan: &Plan, error: &kube::Error) {
        if let Some(escrow) = lock(&self.inner.escrows).get_mut(project) {
            let conflict = matches!(error, kube::Error::Api(s) if s.code == 409);
            escrow.holder.write_failed(&plan.start, conflict);
        }
    }

    /// Whether every request of the pass waits on for share (none admitted or denied for good):
    /// then nothing is answered now, and the next change of the ledger decides them again, so
    /// confirming on a fresh read would only add a read per change while share moves.
    fn all_keep_waiting(&self, batch: &[Pending], verdicts: &[Verdict]) -> bool {
        !self.inner.stopping.load(Ordering::SeqCst)
            && batch.iter().zip(verdicts).all(|(pending, verdict)| {
                verdict.waits_for_share() && pending.received.elapsed() < self.inner.config.share_wait
            })
    }

    /// Whether the project's quota is here without a usable ledger ([`LedgerGap`]), and the
    /// quota's name (the ledger's and KKP's copy's alike). Nothing is decided, reserved or
    /// allotted then: a ledger not counted yet holds nothing of what already runs.
    fn ledger_gap(&self, project: &str, snapshot: Option<&DynamicObject>) -> Option<(LedgerGap, String)> {
        match snapshot {
            None => {
                let kkp = self.inner.cache.kkp_quota_for(project)?;
                // The ledger is gone, and any allotment of ours with it.
                self.forget(project);
                Some((LedgerGap::Missing, kkp))
            }
            Some(ledger) => self
                .inner
                .cache
                .ledger_gap(ledger)
                .map(|gap| (gap, ledger.name_any())),
        }
    }

    /// The ledger to decide the batch on, or the batch's verdicts without one: passed when the
    /// project has no quota; refused when its quota is here without a usable ledger, once a
    /// fresh read confirms it (the cache may be behind a ledger re-created or counted meanwhile:
    /// `snapshot` is then that read, and `verified`).
    pub(super) async fn usable_ledger(
        &self,
        project: &str,
        snapshot: &mut Option<Arc<DynamicObject>>,
        verified: &mut bool,
        requests: &[Request],
    ) -> Result<Arc<DynamicObject>, Vec<Verdict>> {
        while let Some((gap, name)) = self.ledger_gap(project, snapshot.as_deref()) {
            if *verified {
                return Err(decide_batch_without_ledger(project, &name, gap, requests));
            }
            // A failed read leaves it unverified: refused all the same.
            match self.fresh_copy(&name).await {
                Ok(fresh) => *snapshot = fresh.map(Arc::new),
                Err(_) => return Err(decide_batch_without_ledger(project, &name, gap, requests)),
            }
            *verified = true;
        }
        snapshot.clone().ok_or_else(|| {
            // No quota: nothing to reserve.
            self.forget(project);
            decide_batch(project, None, requests)
        })
    }

    pub(super) async fn decide_and_write(
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
            let usable = self.usable_ledger(project, &mut snapshot, &mut verified, requests);
            let object = match usable.await {
                Ok(object) => object,
                Err(verdicts) => return verdicts,
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
                self.notice_restore(escrow);
                self.plan(project, &copy, batch, requests, escrow)
            };
            let plan = match planned {
                Ok(plan) => plan,
                Err(why) => {
                    self.note_failure(project, false);
                    return Self::error_verdicts(requests, project, &Chain(&why).to_string());
                }
            };
            let result = if plan.writes() {
                let started = Instant::now();
                match self.write(&copy, &plan).await {
                    Ok(written) => {
                        self.written(project, &copy, &plan, started, written);
                        debug!(batch = requests.len(), recorded = plan.start.recorded, attempt, quota = %copy.name, quota_uid = ?copy.uid,
                            reservations = ?plan.new_reservations.iter().map(|r| r.uid.as_str()).collect::<Vec<_>>(),
                            allotment = ?plan.start.grant, "ledger written");
                        return plan.verdicts;
                    }
                    Err(e) => {
                        self.write_failed(project, &plan, &e);
                        Err(e)
                    }
                }
            } else {
                if let Some(escrow) = lock(&self.inner.escrows).get_mut(project) {
                    escrow
                        .holder
                        .nothing_written(plan.start.grant.is_some(), verified);
                }
                if verified || requests.is_empty() || self.all_keep_waiting(batch, &plan.verdicts) {
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

/// The entries of a holder list as [`with_own_entry`] returns it (`null`: none).
fn entries(list: Value) -> Vec<Value> {
    match list {
        Value::Array(list) => list,
        _ => Vec::new(),
    }
}
