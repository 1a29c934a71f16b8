//! What the master keeps of each seed's `QuotaLedger`: only what it reads back. At 10,000
//! quotas over 3 seeds the cache holds 30,000 ledgers; kept whole, they took 73 MB of the heap
//! (issue #16's second heap profile), most of it fields the master never reads (metadata,
//! reservations and allotments one by one).

use jiff::Timestamp;
use kkp_quota_crds::ledger::lifetimes::{Lifetimes, Skew};
use kkp_quota_crds::shares::objects::LedgerReading;
use kkp_quota_crds::{LedgerGroup, QuotaLedger, ResourceDetails};
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
    /// Whether it carries master-controller's finalizer ([`crate::ledger_guard`]).
    pub protected: bool,
    /// What the master writes into it (subject, limits, share, labels), as
    /// [`fanout::ledger_word`] fingerprints it: compared, never read back.
    pub word: Fingerprint,
    /// Whether `status.globalUsage` is set: older masters wrote it, the next status write
    /// removes it ([`crate::status_patches::ledger_status_patch`]).
    pub has_global_usage: bool,
    /// `status.otherSeedsUsage`.
    pub other_seeds_usage: Option<ResourceDetails>,
    /// `status.localUsage`, what the fold sums.
    pub local_usage: Option<ResourceDetails>,
    /// `status.reservedUsage`, shown beside it.
    pub reserved_usage: Option<ResourceDetails>,
    /// What the share round reads.
    pub reading: LedgerReading,
    /// `spec.shares.groups`, refreshed while a demand waits ([`crate::seed_writes::fan_out`]).
    pub groups: Vec<LedgerGroup>,
}

impl From<&QuotaLedger> for SeedLedger {
    fn from(ledger: &QuotaLedger) -> SeedLedger {
        let status = ledger.status.as_ref();
        let spec = &ledger.spec;
        SeedLedger {
            uid: ledger.uid(),
            project: ledger.project().to_owned(),
            deleting: ledger.metadata.deletion_timestamp.is_some(),
            protected: crate::ledger_guard::is_protected(ledger),
            word: fanout::ledger_word(
                &spec.subject,
                &spec.quota,
                spec.shares.as_ref(),
                fanout::Policies {
                    rollout: spec.rollout_allowance.as_ref(),
                    reserved_counts: spec.reserved_counts,
                },
                ledger.labels(),
            ),
            has_global_usage: status.is_some_and(|s| s.global_usage.is_some()),
            other_seeds_usage: status.and_then(|s| s.other_seeds_usage.clone()),
            local_usage: status.and_then(|s| s.local_usage.clone()),
            reserved_usage: status.and_then(|s| s.reserved_usage.clone()),
            reading: LedgerReading::of(ledger),
            groups: spec.shares.as_ref().map(|s| s.groups.clone()).unwrap_or_default(),
        }
    }
}

impl SeedLedger {
    /// The ledger as this master judges it at `now` (its own clock): each demand with
    /// `ttlSeconds` lives that long from when this master first saw it (`lifetimes`), whatever
    /// the webhook's clock wrote in `expiresAt`. `skew` gets what new entries show of the
    /// writers' clocks.
    pub fn observed(
        ledger: &QuotaLedger,
        lifetimes: &mut Lifetimes,
        now: Timestamp,
        skew: impl FnMut(Skew),
    ) -> SeedLedger {
        let mut seen = SeedLedger::from(ledger);
        let name = ledger.name_any();
        match &ledger.status {
            Some(status) => {
                let observed = lifetimes.observe(&name, status, now);
                observed.skews.into_iter().for_each(skew);
                seen.reading.demands = observed.demands;
            }
            None => lifetimes.forget(&name),
        }
        seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kkp_quota_crds::quota_ledger::{LedgerSubject, QuotaLedgerSpec, ShareDemand};
    use kkp_quota_crds::{QuotaLedgerStatus, Resource};

    fn with_demand(expires_at: Timestamp, ttl_seconds: Option<u64>) -> QuotaLedger {
        let mut ledger = QuotaLedger::new(
            "project-demo",
            QuotaLedgerSpec {
                rollout_allowance: None,
                subject: LedgerSubject::project("demo"),
                quota: ResourceDetails::default(),
                shares: None,
                reserved_counts: false,
            },
        );
        let mut amount = ResourceDetails::default();
        amount.set(Resource::Cpu, Some(kkp_quota_crds::Quantity::from_units(4)));
        ledger.status = Some(QuotaLedgerStatus {
            local_usage: Some(ResourceDetails::default()),
            demands: vec![ShareDemand {
                holder: "w".into(),
                amount,
                expires_at,
                ttl_seconds,
            }],
            ..QuotaLedgerStatus::default()
        });
        ledger
    }

    #[test]
    fn a_demand_lives_its_lifetime_by_the_masters_clock() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let secs = |s: i64| now.checked_add(jiff::SignedDuration::from_secs(s)).unwrap();
        // Written by a webhook 40 s behind: already past its `expiresAt` by our clock.
        let ledger = with_demand(secs(-10), Some(30));
        let mut lifetimes = Lifetimes::new();
        let mut skews = Vec::new();
        let seen = SeedLedger::observed(&ledger, &mut lifetimes, now, |s| skews.push(s));
        assert!(seen.reading.report(secs(29)).unwrap().demand.is_some());
        assert!(seen.reading.report(secs(30)).unwrap().demand.is_none());
        assert_eq!(skews.len(), 1);
        assert!((skews[0].seconds - 40.0).abs() < 1e-9);
        // Without a lifetime (an older webhook), `expiresAt` as written.
        let old = with_demand(secs(-10), None);
        let seen = SeedLedger::observed(&old, &mut lifetimes, now, |_| {});
        assert!(seen.reading.report(now).unwrap().demand.is_none());
        assert!(
            SeedLedger::from(&ledger)
                .reading
                .report(now)
                .unwrap()
                .demand
                .is_none()
        );
    }
}
