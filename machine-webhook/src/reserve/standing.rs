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

use kkp_quota_crds::ResourceDetails;

use crate::cache::{CopyError, QuotaCopy};
use crate::decision::{QuotaState, Verdict};
use crate::demand::share_wanted_back;

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
    /// The newest copy, read once per resourceVersion.
    pub(super) parsed: Option<Arc<HolderView>>,
    /// Wakes the worker when there is something to record.
    pub(super) wake: Arc<Notify>,
}

/// One copy of the ledger as this process's fast path reads it, worked out once per
/// resourceVersion (outside the lock every request takes): parsing a ledger with a thousand
/// reservations, or summing them, takes long enough to queue every other request behind it.
#[derive(Debug)]
pub(super) struct HolderView {
    pub(super) copy: QuotaCopy,
    /// The quota as this process sees it with nothing admitted from its own allotment
    /// ([`QuotaState::for_holder`]); `None`: the ledger cannot be read, nothing is admitted
    /// without a write.
    pub(super) state: Option<QuotaState>,
    /// Headroom we hold is wanted back by the master or the seed's own commitments
    /// ([`share_wanted_back`]); other processes' demands are judged per request.
    pub(super) share_wanted_back: bool,
}

impl HolderView {
    pub(super) fn of(object: &DynamicObject, holder: &str) -> Result<HolderView, CopyError> {
        let copy = QuotaCopy::from_dynamic(object)?;
        let state = QuotaState::for_holder(
            &copy.spec,
            copy.status.as_ref(),
            holder,
            &ResourceDetails::default(),
        )
        .ok();
        let share_wanted_back = share_wanted_back(&copy.spec, copy.status.as_ref());
        Ok(HolderView {
            copy,
            state,
            share_wanted_back,
        })
    }

    /// It was read from `object` (the same UID and resourceVersion).
    pub(super) fn is_of(&self, object: &DynamicObject) -> bool {
        self.copy.uid == object.metadata.uid && self.copy.resource_version == object.metadata.resource_version
    }
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
