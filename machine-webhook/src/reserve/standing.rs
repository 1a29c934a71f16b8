//! This process's standing in one project's ledger: the allotment state machine
//! ([`AllotmentHolder`], pure, in `kkp_quota_crds::shares::allotment`) and the I/O state beside
//! it (the worker's wake-up, the copies it last saw), and what one write changes.

use std::sync::Arc;

use kkp_quota_crds::ledger::Reservation;
use kkp_quota_crds::shares::AllotmentHolder;
use kkp_quota_crds::shares::allotment::WriteStart;
use kube::api::DynamicObject;
use serde_json::Value;
use tokio::sync::Notify;

use crate::cache::QuotaCopy;
use crate::decision::Verdict;

/// This process's standing in one project's ledger.
#[derive(Debug, Default)]
pub(super) struct Escrow {
    pub(super) holder: AllotmentHolder,
    /// The copy as our last successful write returned it (often newer than the cache, which
    /// would make the next write's first attempt a certain conflict).
    pub(super) last_written: Option<Arc<DynamicObject>>,
    /// [`crate::cache::SeedCache::restores`] when this standing was last confirmed: a restore of
    /// the seed's etcd since makes our last write and our allotment unknown.
    pub(super) restores_seen: u64,
    /// The newest copy, parsed once per resourceVersion.
    pub(super) parsed: Option<Arc<QuotaCopy>>,
    /// Wakes the worker when there is something to record.
    pub(super) wake: Arc<Notify>,
}

/// What one write changes, decided on one copy.
pub(super) struct Plan {
    pub(super) verdicts: Vec<Verdict>,
    /// Reservations to append (recorded admissions, then this batch's).
    pub(super) new_reservations: Vec<Reservation>,
    /// The new `status.allotments`, when it changes.
    pub(super) allotments: Option<Value>,
    /// The new `status.demands`, when our entry changes.
    pub(super) demands: Option<Value>,
    /// What the write records of the holder's admissions, and the allotment it sets.
    pub(super) start: WriteStart,
}

impl Plan {
    pub(super) fn writes(&self) -> bool {
        !self.new_reservations.is_empty() || self.allotments.is_some() || self.demands.is_some()
    }
}
