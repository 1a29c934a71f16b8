//! The write of a surge admitted by the rollout allowance: its reservation and its
//! `status.rolloutSurges` entry in one compare-and-swap, decided on a copy read from the API
//! server (never the cache), so that two surges never both see the project at its limit.
//! Apart from the batch worker: surges are rare, and their rule counts every allotment whole,
//! this process's own included, so nothing the worker holds or admits can meet a surge unseen.

use kkp_quota_crds::ledger::group;
use kkp_quota_crds::quota_ledger::LEDGER_FORMAT;
use kkp_quota_crds::rollout::{RolloutSurge, SurgeRefusal};
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use tracing::info;

use super::{MachineRef, Reserver};
use crate::cache::QuotaCopy;
use crate::decision::{Replaced, Request, Verdict, decide_surge};

impl Reserver {
    /// Admits `request` over the limit as a surge replacing `replaced`, if the ledger `name`
    /// (project `project`) allows it now; writes it unless it is a dry run.
    pub async fn admit_surge(
        &self,
        project: &str,
        name: &str,
        machine: &MachineRef,
        request: &Request,
        replaced: &Replaced,
    ) -> Result<Verdict, SurgeRefusal> {
        let unreadable = |e: &dyn std::fmt::Display| SurgeRefusal::Unreadable(e.to_string());
        let attempts = self.inner.config.max_attempts.max(1);
        for _ in 0..attempts {
            let object = self
                .fresh_copy(name)
                .await
                .map_err(|e| unreadable(&e))?
                .ok_or(SurgeRefusal::NotAllowed)?;
            let copy = QuotaCopy::from_dynamic(&object).map_err(|e| unreadable(&e))?;
            if copy.spec.rollout_allowance.is_none() {
                return Err(SurgeRefusal::NotAllowed);
            }
            let surges = copy
                .status
                .as_ref()
                .map(|s| s.rollout_surges.as_slice())
                .unwrap_or_default();
            if let Some(running) = surges.iter().find(|s| s.replaces == replaced.uid) {
                return Err(SurgeRefusal::NoReplacement(format!(
                    "machine {:?} is already being replaced by {:?}",
                    replaced.machine, running.machine
                )));
            }
            let state = copy.state().map_err(|e| unreadable(&e))?;
            let verdict = decide_surge(project, &state, request, replaced)?;
            let now = self.inner.config.now();
            let Some(reservation) = Self::reservation_of(machine, request, &verdict, now) else {
                return Ok(verdict); // a dry run: decided, nothing to write
            };
            let surge = RolloutSurge {
                cluster: machine.cluster.clone(),
                uid: machine.uid.clone(),
                machine: format!("{}/{}", machine.namespace, machine.name),
                deployment: replaced.deployment.clone(),
                replaces: replaced.uid.clone(),
                replaces_machine: replaced.machine.clone(),
                size: reservation.reserved.clone(),
                admitted_at: now,
            };
            let raw = |field: &str| {
                object
                    .data
                    .pointer(&format!("/status/{field}"))
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
            };
            let mut reservations = raw("reservations");
            reservations.extend(group(&[reservation]).iter().map(|g| json!(g)));
            let mut rollout_surges = raw("rolloutSurges");
            rollout_surges.push(json!(surge));
            let patch = json!({
                "metadata": {"resourceVersion": copy.resource_version},
                "status": {
                    "formatVersion": LEDGER_FORMAT,
                    "reservations": reservations,
                    "rolloutSurges": rollout_surges,
                },
            });
            match self
                .api()
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.inner.metrics.writes.inc();
                    info!(
                        machine = %surge.machine,
                        replaces = %surge.replaces_machine,
                        deployment = %surge.deployment,
                        size = %surge.size,
                        "surge admitted over the quota by the rollout allowance"
                    );
                    return Ok(verdict);
                }
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => {
                    return Err(SurgeRefusal::Lookup(format!(
                        "the surge could not be written to the quota ledger: {e}"
                    )));
                }
            }
        }
        Err(SurgeRefusal::Lookup(format!(
            "the quota ledger changed under each of {attempts} tries"
        )))
    }
}
