//! What the master keeps of each seed's `QuotaLedger`: only what it reads back. At 10,000
//! quotas over 3 seeds the cache holds 30,000 ledgers; kept whole, they took 73 MB of the heap
//! (issue #16's second heap profile), most of it fields the master never reads (metadata,
//! reservations and allotments one by one).

use kkp_quota_crds::shares::objects::LedgerReading;
use kkp_quota_crds::{QuotaLedger, ResourceDetails};
use kube::ResourceExt;

use crate::fanout;
use crate::fingerprint::Fingerprint;

/// One seed's ledger of one quota, as last seen.
#[derive(Clone, Debug, PartialEq)]
pub struct SeedLedger {
    pub uid: Option<String>,
    /// The project (`spec.subject.name`).
    pub project: String,
    /// Whether it is being deleted.
    pub deleting: bool,
    /// What the master writes into it (subject, limits, share, labels), as
    /// [`fanout::ledger_word`] fingerprints it: compared, never read back.
    pub word: Fingerprint,
    /// `status.globalUsage`.
    pub global_usage: Option<ResourceDetails>,
    /// `status.otherSeedsUsage`.
    pub other_seeds_usage: Option<ResourceDetails>,
    /// `status.localUsage`, what the fold sums.
    pub local_usage: Option<ResourceDetails>,
    /// What the share round reads.
    pub reading: LedgerReading,
}

impl From<&QuotaLedger> for SeedLedger {
    fn from(ledger: &QuotaLedger) -> SeedLedger {
        let status = ledger.status.as_ref();
        let spec = &ledger.spec;
        SeedLedger {
            uid: ledger.uid(),
            project: ledger.project().to_owned(),
            deleting: ledger.metadata.deletion_timestamp.is_some(),
            word: fanout::ledger_word(&spec.subject, &spec.quota, spec.shares.as_ref(), ledger.labels()),
            global_usage: status.and_then(|s| s.global_usage.clone()),
            other_seeds_usage: status.and_then(|s| s.other_seeds_usage.clone()),
            local_usage: status.and_then(|s| s.local_usage.clone()),
            reading: LedgerReading::of(ledger),
        }
    }
}
