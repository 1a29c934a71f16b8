//! Asking for share, pure: the entry this process keeps in the ledger's `status.demands` while
//! its requests wait for share, and whether another process is waiting (by this process's clock,
//! [`DemandClock`]; no I/O here).
//!
//! A request that fits the project's quota but not what this seed may commit
//! ([`crate::decision::Verdict::waits_for_share`]) waits, and this process records a demand: the
//! absolute share the seed would need. Two things answer it: the master grants share to the seed
//! (or asks idle seeds to release theirs first, docs/shares.md), and every other webhook process
//! of the seed gives its allotment back and stops admitting from it, so that headroom a process
//! holds idle never starves another. The demand stays until this process has a batch with no
//! waiting request, or until it expires, so a retry after a denial still finds it.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use kkp_quota_crds::ledger::lifetimes::{Lifetimes, ttl_seconds};
use kkp_quota_crds::ledger::with_own_entry;
use kkp_quota_crds::quota_ledger::ShareDemand;
use kkp_quota_crds::shares::objects::{committed, seed_share};
use kkp_quota_crds::shares::{SeedShare, bounded_by};
use kkp_quota_crds::{QuotaLedgerSpec, QuotaLedgerStatus, ResourceDetails};
use serde_json::Value;

/// Other processes' demands judged by this process's clock (issue #32, finding 8): a demand that
/// carries `ttlSeconds` lives that long from when this process first saw it, not until the
/// `expiresAt` its writer's clock wrote. Judged by the writer's clock, a webhook whose clock is
/// 30 s ahead would see every fresh demand of another webhook as expired, and keep its idle
/// allotment from the process that waits for it until the allotment idled out. First sight is at
/// or after the write, so a demand never lives shorter here than its writer meant.
#[derive(Debug, Default)]
pub struct DemandClock(std::sync::Mutex<Lifetimes>);

impl DemandClock {
    /// Whether a process other than `holder` waits for share in `ledger`, as this process judges.
    pub fn others_waiting(
        &self,
        ledger: &str,
        status: Option<&QuotaLedgerStatus>,
        holder: &str,
        now: Timestamp,
    ) -> bool {
        let Some(status) = status else { return false };
        // The common case, and the admission fast path: nobody else waits.
        if !status.demands.iter().any(|d| d.holder != holder) {
            return false;
        }
        let demands_only = QuotaLedgerStatus {
            demands: status.demands.clone(),
            ..QuotaLedgerStatus::default()
        };
        let judged = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .observe(ledger, &demands_only, now);
        judged
            .demands
            .iter()
            .any(|d| d.holder != holder && d.expires_at > now)
    }
}

/// Whether headroom this process holds is wanted elsewhere, so that its allotment must go back
/// and nothing more be admitted from it: another process of the seed waits for share, the
/// master asks the seed to release share (its target is below what it holds), which the seed
/// can only do for headroom no allotment holds, or the seed commits more than it may (usage
/// that appeared without admission, such as a catalog edit that made running Machines bigger,
/// now fills the room the allotment was cut from: holding it would keep that headroom from the
/// quota until the allotment idles out).
pub fn allotment_wanted_back(
    spec: &QuotaLedgerSpec,
    status: Option<&QuotaLedgerStatus>,
    others_waiting: bool,
) -> bool {
    others_waiting || share_wanted_back(spec, status)
}

/// The part of [`allotment_wanted_back`] that depends on the ledger alone (the master asks share
/// back, or the seed commits more than it may): the admission fast path works it out once per
/// copy, since it sums every reservation.
pub fn share_wanted_back(spec: &QuotaLedgerSpec, status: Option<&QuotaLedgerStatus>) -> bool {
    seed_share(spec, status)
        .is_some_and(|share| share.asked_back(&spec.quota) || overcommitted(spec, status, &share))
}

/// Whether the seed's committed usage (`localUsage`, reservations and allotments) is above its
/// capacity beside the other seeds' usage, for a resource the quota limits.
fn overcommitted(spec: &QuotaLedgerSpec, status: Option<&QuotaLedgerStatus>, share: &SeedShare) -> bool {
    let Some(status) = status else { return false };
    let Ok(committed) = committed(status) else {
        return false;
    };
    let others = status.other_seeds_usage.clone().unwrap_or_default();
    let capacity = share.capacity_beside(&spec.quota, &others);
    !capacity.covers(&bounded_by(&spec.quota, &committed))
}

/// The new `status.demands` when this process's entry changes, else `None`.
///
/// - `wants`: the share this pass's waiting requests need (`None`: nothing waits).
/// - `decided_requests`: the pass decided requests (an upkeep pass without any leaves the entry
///   as it is).
///
/// The entry is renewed once half of `ttl` has passed, so that waiting requests do not write on
/// every pass. Other processes' entries are kept exactly as read (`raw`).
pub fn demands_after(
    status: Option<&QuotaLedgerStatus>,
    raw: &[Value],
    holder: &str,
    wants: Option<&ResourceDetails>,
    decided_requests: bool,
    now: Timestamp,
    ttl: Duration,
) -> Option<Value> {
    let own = status.and_then(|s| s.demands.iter().find(|d| d.holder == holder));
    let meant = ttl;
    let ttl = SignedDuration::try_from(ttl).unwrap_or(SignedDuration::from_secs(30));
    let entry = match (wants, own) {
        (Some(wants), Some(own)) => {
            let renew_after = own.expires_at.saturating_sub(ttl / 2).unwrap_or(own.expires_at);
            if own.amount == *wants && now < renew_after {
                return None;
            }
            Some(wants)
        }
        (Some(wants), None) => Some(wants),
        (None, Some(_)) if decided_requests => None,
        (None, _) => return None,
    };
    let own = entry.and_then(|amount| {
        serde_json::to_value(ShareDemand {
            holder: holder.to_owned(),
            amount: amount.clone(),
            expires_at: now.saturating_add(ttl).unwrap_or(now),
            // Readers judge by this, not by our clock (issue #32, finding 8).
            ttl_seconds: Some(ttl_seconds(meant)),
        })
        .ok()
    });
    Some(with_own_entry(raw, holder, own))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kkp_quota_crds::shares::objects::live_demands;

    use kkp_quota_crds::fixtures::cpu;

    use kkp_quota_crds::fixtures::at;

    fn status(demands: Vec<(&str, i64, i64)>) -> (QuotaLedgerStatus, Vec<Value>) {
        let demands: Vec<ShareDemand> = demands
            .into_iter()
            .map(|(holder, amount, expires)| ShareDemand {
                holder: holder.to_owned(),
                amount: cpu(amount),
                expires_at: at(expires),
                ttl_seconds: None,
            })
            .collect();
        let raw = demands.iter().map(|d| serde_json::to_value(d).unwrap()).collect();
        (
            QuotaLedgerStatus {
                demands,
                ..QuotaLedgerStatus::default()
            },
            raw,
        )
    }

    const TTL: Duration = Duration::from_secs(30);

    #[test]
    fn a_waiting_request_records_the_demand_and_renews_it_at_half_life() {
        let (s, raw) = status(vec![("other", 3, 100)]);
        let list = demands_after(Some(&s), &raw, "me", Some(&cpu(7)), true, at(0), TTL).unwrap();
        assert_eq!(list.as_array().unwrap().len(), 2);
        assert_eq!(list[1]["holder"], "me");
        assert_eq!(list[1]["amount"]["cpu"], "7");
        let (s, raw) = status(vec![("me", 7, 30)]);
        assert!(demands_after(Some(&s), &raw, "me", Some(&cpu(7)), true, at(10), TTL).is_none());
        assert!(demands_after(Some(&s), &raw, "me", Some(&cpu(7)), true, at(16), TTL).is_some());
        assert!(demands_after(Some(&s), &raw, "me", Some(&cpu(8)), true, at(1), TTL).is_some());
    }

    #[test]
    fn the_demand_goes_with_a_pass_that_has_nothing_waiting() {
        let (s, raw) = status(vec![("me", 7, 30), ("other", 3, 100)]);
        // Upkeep (no requests): kept.
        assert!(demands_after(Some(&s), &raw, "me", None, false, at(1), TTL).is_none());
        let list = demands_after(Some(&s), &raw, "me", None, true, at(1), TTL).unwrap();
        assert_eq!(list.as_array().unwrap().len(), 1);
        assert_eq!(list[0]["holder"], "other");
        let (s, raw) = status(vec![("me", 7, 30)]);
        assert_eq!(
            demands_after(Some(&s), &raw, "me", None, true, at(1), TTL),
            Some(Value::Null)
        );
        assert!(demands_after(None, &[], "me", None, true, at(1), TTL).is_none());
    }

    fn plain_spec() -> QuotaLedgerSpec {
        QuotaLedgerSpec {
            rollout_allowance: None,
            subject: kkp_quota_crds::quota_ledger::LedgerSubject {
                name: "demo".to_owned(),
                kind: "project".to_owned(),
            },
            quota: cpu(10),
            shares: None,
            reserved_counts: false,
        }
    }

    #[test]
    fn a_target_below_the_share_wants_allotments_back() {
        use kkp_quota_crds::quota_ledger::LedgerShares;
        let spec = |target: i64| QuotaLedgerSpec {
            rollout_allowance: None,
            quota: cpu(10),
            shares: Some(LedgerShares {
                version: 3,
                granted: cpu(6),
                target: cpu(target),
                ..LedgerShares::default()
            }),
            ..plain_spec()
        };
        let (s, _) = status(vec![]);
        assert!(!allotment_wanted_back(&spec(6), Some(&s), false));
        assert!(!allotment_wanted_back(&spec(8), Some(&s), false));
        assert!(allotment_wanted_back(&spec(4), Some(&s), false));
        // Released down to the target: nothing more is asked.
        let released = QuotaLedgerStatus {
            released: Some(cpu(2)),
            ..QuotaLedgerStatus::default()
        };
        assert!(!allotment_wanted_back(&spec(4), Some(&released), false));
        // Without shares nothing is asked back.
        assert!(!allotment_wanted_back(&plain_spec(), Some(&s), false));
        // Usage that grew without admission (a catalog edit) above the share: back it goes.
        let grown = |local: i64| QuotaLedgerStatus {
            local_usage: Some(cpu(local)),
            allotments: vec![kkp_quota_crds::ledger::Allotment {
                holder: "me".to_owned(),
                granted: cpu(1),
                expires_at: at(60),
                ttl_seconds: None,
            }],
            ..QuotaLedgerStatus::default()
        };
        assert!(!allotment_wanted_back(&spec(6), Some(&grown(5)), false));
        assert!(allotment_wanted_back(&spec(6), Some(&grown(8)), false));
    }

    #[test]
    fn only_live_demands_of_others_count() {
        // Written without ttlSeconds (an older webhook): judged by their expiresAt.
        let (s, _) = status(vec![("me", 7, 30), ("other", 3, 10)]);
        let clock = DemandClock::default();
        assert!(clock.others_waiting("q", Some(&s), "me", at(5)));
        assert!(!clock.others_waiting("q", Some(&s), "me", at(10)));
        assert!(!clock.others_waiting("q", Some(&s), "other", at(40)));
    }

    #[test]
    fn another_process_demand_lives_its_ttl_from_first_sight_whatever_its_writer_s_clock() {
        let demand = |expires: i64| ShareDemand {
            holder: "other".to_owned(),
            amount: cpu(3),
            expires_at: at(expires),
            ttl_seconds: Some(30),
        };
        let with = |d: ShareDemand| QuotaLedgerStatus {
            demands: vec![d],
            ..QuotaLedgerStatus::default()
        };
        let clock = DemandClock::default();
        // Written by a clock 40 s behind ours: by its expiresAt it expired 10 s ago.
        let behind = with(demand(-10));
        assert!(live_demands(&behind, at(0)).next().is_none());
        assert!(clock.others_waiting("q", Some(&behind), "me", at(0)));
        assert!(clock.others_waiting("q", Some(&behind), "me", at(29)));
        assert!(!clock.others_waiting("q", Some(&behind), "me", at(30)));
        // Its renewal is a new entry, seen now: waiting again for 30 s.
        let renewed = with(demand(20));
        assert!(clock.others_waiting("q", Some(&renewed), "me", at(31)));
        // Our own demand never counts; another ledger is judged apart.
        assert!(!clock.others_waiting("q", Some(&renewed), "other", at(31)));
        assert!(clock.others_waiting("r", Some(&behind), "me", at(100)));
        assert!(!clock.others_waiting("q", None, "me", at(31)));
    }
}
