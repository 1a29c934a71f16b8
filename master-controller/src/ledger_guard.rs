//! The finalizer on the seeds' ledgers ([`LEDGER_FINALIZER`], issue #32): set by every apply
//! ([`crate::fanout::ledger_apply_body`]), released only here, when this controller deletes a
//! ledger itself because its quota is gone ([`crate::finalize`], [`crate::sweep`]). A ledger
//! deleted by anyone else (by hand, or by removing its CRD) stays, Terminating, with its
//! reservations and allotments, and keeps working; the webhook would otherwise find the seed
//! without an admission ledger.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

use kkp_quota_crds::QuotaLedger;
use kkp_quota_crds::quota_ledger::LEDGER_FINALIZER;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use tracing::warn;

use crate::api::bounded;
use crate::seed_ledger::SeedLedger;

/// Whether the ledger carries our finalizer.
pub fn is_protected(ledger: &QuotaLedger) -> bool {
    ledger.finalizers().iter().any(|f| f == LEDGER_FINALIZER)
}

/// Deletes the seed's ledger `name` and releases our finalizer from it: `Ok(true)` when it is
/// gone, `Ok(false)` while it is still there (someone else's finalizer, or it changed between
/// the delete and the release: the caller tries again).
pub(crate) async fn delete_ledger(
    api: &Api<QuotaLedger>,
    name: &str,
    dp: &DeleteParams,
) -> Result<bool, kube::Error> {
    let ledger = match bounded(api.delete(name, dp)).await {
        Ok(either) => match either.left() {
            Some(ledger) => ledger,
            None => return Ok(true),
        },
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(true),
        Err(e) => return Err(e),
    };
    if !is_protected(&ledger) {
        return Ok(false);
    }
    let rest: Vec<&String> = ledger
        .finalizers()
        .iter()
        .filter(|f| *f != LEDGER_FINALIZER)
        .collect();
    // A merge patch replaces the whole list: conditioned on the version the delete returned, so
    // that a finalizer someone added meanwhile is not dropped.
    let patch = json!({"metadata": {
        "resourceVersion": ledger.resource_version(),
        "finalizers": rest,
    }});
    match bounded(api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))).await {
        Ok(_) => Ok(rest.is_empty()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Ledgers seen being deleted while their quota lives, by (seed, UID): each is warned about once
/// (a reconcile runs on every change of a ledger, many a second under load).
#[derive(Default)]
pub(crate) struct HandDeletes(Mutex<HashSet<(String, String)>>);

impl HandDeletes {
    /// Warns, once per ledger, when the seed's ledger of the live quota `name` is being deleted.
    pub fn note(&self, seed: &str, name: &str, ledger: &SeedLedger) {
        if !ledger.deleting {
            return;
        }
        let key = (seed.to_owned(), ledger.uid.clone().unwrap_or_default());
        if !self.0.lock().unwrap_or_else(PoisonError::into_inner).insert(key) {
            return;
        }
        if ledger.protected {
            warn!(
                seed,
                quota = name,
                project = %ledger.project,
                "someone deleted the QuotaLedger of a live quota (by hand, or by removing its CRD); the finalizer {LEDGER_FINALIZER} keeps it, Terminating, and it keeps working until its quota is deleted"
            );
        } else {
            warn!(
                seed,
                quota = name,
                project = %ledger.project,
                "the QuotaLedger of a live quota is being deleted without the finalizer {LEDGER_FINALIZER}; once it is gone it is re-created, and the seed's webhook refuses growth of the project until seed-controller has counted it"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use kkp_quota_crds::{KkpQuota, Quantity, ResourceDetails, ResourceQuota, ResourceQuotaSpec, Subject};

    use super::*;
    use crate::fanout::{ledger_apply_body, ledger_in_sync};

    fn master() -> ResourceQuota {
        let limits = ResourceDetails {
            cpu: Some(Quantity::from_units(4)),
            ..ResourceDetails::default()
        };
        ResourceQuota::new(
            "project-demo",
            ResourceQuotaSpec {
                subject: Subject::project("demo"),
                quota: KkpQuota::new(&limits),
            },
        )
    }

    fn applied(m: &ResourceQuota) -> QuotaLedger {
        let limits = m.spec.quota.limits.clone();
        serde_json::from_value(ledger_apply_body(
            m,
            &limits,
            None,
            crate::fanout::Policies::rollout_only(None),
        ))
        .unwrap()
    }

    #[test]
    fn every_apply_sets_the_finalizer_and_a_ledger_without_it_gets_it() {
        let m = master();
        let limits = m.spec.quota.limits.clone();
        let mut ledger = applied(&m);
        assert_eq!(ledger.finalizers(), [LEDGER_FINALIZER.to_owned()]);
        assert!(is_protected(&ledger));
        assert!(ledger_in_sync(
            &m,
            &limits,
            None,
            crate::fanout::Policies::rollout_only(None),
            &SeedLedger::from(&ledger)
        ));
        // Applied before the finalizer existed (or it was removed): applied again.
        ledger.metadata.finalizers = Some(vec!["example.com/other".into()]);
        let seen = SeedLedger::from(&ledger);
        assert!(!seen.protected);
        assert!(!ledger_in_sync(
            &m,
            &limits,
            None,
            crate::fanout::Policies::rollout_only(None),
            &seen
        ));
    }

    #[test]
    fn a_ledger_deleted_by_hand_stays_in_sync_while_the_finalizer_holds_it() {
        let m = master();
        let limits = m.spec.quota.limits.clone();
        let mut ledger = applied(&m);
        ledger.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::now(),
        ));
        let seen = SeedLedger::from(&ledger);
        assert!(seen.deleting && seen.protected);
        assert!(
            ledger_in_sync(
                &m,
                &limits,
                None,
                crate::fanout::Policies::rollout_only(None),
                &seen
            ),
            "no apply loop on a Terminating ledger"
        );
    }

    #[test]
    fn hand_deletes_are_noted_once_per_ledger() {
        let notes = HandDeletes::default();
        let mut ledger = applied(&master());
        ledger.metadata.uid = Some("u1".into());
        notes.note("seed-a", "project-demo", &SeedLedger::from(&ledger));
        assert!(notes.0.lock().unwrap().is_empty(), "a live ledger is not noted");
        ledger.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::now(),
        ));
        let seen = SeedLedger::from(&ledger);
        notes.note("seed-a", "project-demo", &seen);
        notes.note("seed-a", "project-demo", &seen);
        assert_eq!(notes.0.lock().unwrap().len(), 1);
    }
}
