//! How the writer and the allotments behave.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
pub use kkp_quota_crds::shares::allotment::AllotmentConfig;

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
    /// Added to this process's wall clock where it dates ledger entries: for tests of clock skew
    /// only (`--test-clock-offset`).
    pub clock_offset: SignedDuration,
}

impl ReserverConfig {
    /// This process's wall clock, as it dates ledger entries.
    pub fn now(&self) -> Timestamp {
        let now = Timestamp::now();
        now.checked_add(self.clock_offset).unwrap_or(now)
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
            clock_offset: SignedDuration::ZERO,
        }
    }
}
