//! This process's standing in one project's ledger (its allotment, what it admitted from it,
//! its write backoff), and what one write changes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kkp_quota_crds::ResourceDetails;
use kkp_quota_crds::ledger::Reservation;
use kube::api::DynamicObject;
use serde_json::Value;
use tokio::sync::Notify;

use super::AllotmentConfig;
use crate::cache::QuotaCopy;
use crate::decision::Verdict;

/// This process's standing in one project's ledger.
#[derive(Debug, Default)]
pub(super) struct Escrow {
    /// The quota copy our allotment is in.
    pub(super) quota_uid: Option<String>,
    /// Our allotment is in the ledger, granting `granted`.
    pub(super) holding: bool,
    pub(super) granted: ResourceDetails,
    /// Fast admissions stop at this instant unless a write renews the allotment.
    pub(super) usable_until: Option<Instant>,
    /// The last write that renewed it began here.
    pub(super) renewed: Option<Instant>,
    /// Admitted from the allotment, not yet recorded as reservations (oldest first).
    pub(super) admitted: Vec<(Instant, Reservation)>,
    pub(super) admitted_total: ResourceDetails,
    /// While a write is in flight: the most `admitted_total` may reach.
    pub(super) cap_in_flight: Option<ResourceDetails>,
    pub(super) last_request: Option<Instant>,
    /// A write that set our allotment ended without telling whether it landed: one may be in the
    /// ledger although `holding` is false, so upkeep writes again soon.
    pub(super) maybe_holding: bool,
    /// Failed writes in a row, and no upkeep before this (backoff).
    pub(super) failures: u32,
    pub(super) not_before: Option<Instant>,
    /// The copy as our last successful write returned it (often newer than the cache, which
    /// would make the next write's first attempt a certain conflict).
    pub(super) last_written: Option<Arc<DynamicObject>>,
    /// The newest copy, parsed once per resourceVersion.
    pub(super) parsed: Option<Arc<QuotaCopy>>,
    /// Wakes the worker when there is something to record.
    pub(super) wake: Arc<Notify>,
    /// Another process waits for headroom: give our allotment back at once.
    pub(super) give_back: bool,
}

impl Escrow {
    pub(super) fn idle_since(&self, since: Duration, now: Instant) -> bool {
        self.last_request
            .is_none_or(|t| now.saturating_duration_since(t) >= since)
    }

    /// When the worker has upkeep to do without requests: record admissions, renew or give
    /// back the allotment.
    pub(super) fn upkeep_due(&self, config: &AllotmentConfig, stopping: bool) -> Option<Instant> {
        let due = self.upkeep_wanted(config, stopping)?;
        Some(self.not_before.map_or(due, |t| due.max(t)))
    }

    pub(super) fn upkeep_wanted(&self, config: &AllotmentConfig, stopping: bool) -> Option<Instant> {
        let now = Instant::now();
        if stopping && (self.holding || self.maybe_holding || !self.admitted.is_empty()) {
            return Some(now);
        }
        // Headroom wanted elsewhere goes back at once (recording what we admitted with it).
        if self.give_back && self.holding {
            return Some(now);
        }
        if let Some((first, _)) = self.admitted.first() {
            return Some(*first + config.record_after);
        }
        if self.maybe_holding {
            return Some(now + config.record_after);
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
    pub(super) fn failed(&mut self) {
        self.failures = self.failures.saturating_add(1);
        let backoff = Duration::from_millis(100)
            .saturating_mul(1 << self.failures.min(6))
            .min(Duration::from_secs(5));
        self.not_before = Some(Instant::now() + backoff);
    }

    pub(super) fn succeeded(&mut self) {
        self.failures = 0;
        self.not_before = None;
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
    /// How many of the escrow's admissions this write records, and their total.
    pub(super) recorded: usize,
    pub(super) recorded_total: ResourceDetails,
    /// Our allotment after the write (`None`: not holding one).
    pub(super) grant: Option<ResourceDetails>,
    /// The in-flight cap before this plan set its own (restored when the write certainly did
    /// not land).
    pub(super) prior_cap: Option<ResourceDetails>,
}

impl Plan {
    pub(super) fn writes(&self) -> bool {
        !self.new_reservations.is_empty() || self.allotments.is_some() || self.demands.is_some()
    }
}
