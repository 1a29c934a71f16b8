//! A project with a quota on this seed but no usable ledger (issue #32): KKP's `ResourceQuota`
//! copy is here, the `QuotaLedger` is not (deleted, its CRD re-installed), or it is here but
//! seed-controller has not counted it yet (re-created empty: what already runs is not in it).
//! Deciding on it would admit against nothing, so growth fails closed until the ledger is back
//! and counted; what grows nothing passes as always.

use kkp_quota_crds::QuotaLedgerStatus;

use super::{Ask, Reason, Request, Verdict, unsizeable_detail};

/// Why the project's quota on this seed cannot be decided from its ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerGap {
    /// KKP's copy of the quota is on the seed, the ledger is not.
    Missing,
    /// The ledger is there, but seed-controller has not counted it yet.
    Uncounted,
    /// The seed's data went back in time (an etcd restore) and the ledger still carries an
    /// older word of the master than this process saw before: it may hold share the master has
    /// since given to another seed.
    Restored,
}

/// Whether seed-controller has counted the ledger: `status.localUsage` is present. seed-controller
/// alone writes it, on its first write of every ledger, even with nothing running (then zero);
/// the other status fields say nothing of that (`formatVersion` is written by the webhook too,
/// `globalUsage` and `otherSeedsUsage` by the master, which may fold a re-created ledger before
/// seed-controller sees it).
pub fn is_counted(status: Option<&QuotaLedgerStatus>) -> bool {
    status.is_some_and(|s| s.local_usage.is_some())
}

/// [`is_counted`] on a ledger's raw `status` (the hot path reads it before parsing).
pub fn is_counted_json(status: Option<&serde_json::Value>) -> bool {
    status
        .and_then(|s| s.get("localUsage"))
        .is_some_and(|u| !u.is_null())
}

/// The denial text after `machine "<name>"`, naming what to check.
fn gap_detail(project: &str, quota: &str, gap: LedgerGap) -> String {
    match gap {
        LedgerGap::Missing => format!(
            "cannot be admitted yet: the quota ledger of project {project:?} is missing on this seed (KKP's ResourceQuota {quota:?} is here, the QuotaLedger {quota:?} is not) and the quota system is re-creating it; try again in a minute. If this lasts, check that master-controller is running and reaches this seed, and that the CRD quotaledgers.kkp-quota.dev is installed"
        ),
        LedgerGap::Restored => format!(
            "cannot be admitted yet: this seed's data was restored from an older backup, and the quota ledger {quota:?} of project {project:?} still carries an older word of the master (it may hold share already given to another seed); it is admitted again once master-controller has rewritten the ledger. If this lasts, check that master-controller is running and reaches this seed"
        ),
        LedgerGap::Uncounted => format!(
            "cannot be admitted yet: the quota ledger {quota:?} of project {project:?} on this seed has not been counted yet (seed-controller has not written what already runs into it since it was created); try again in a minute. If this lasts, check that seed-controller is running on this seed and reaches the project's user clusters"
        ),
    }
}

/// Decides a request of a project whose quota `quota` (by name) is on the seed without a usable
/// ledger: growth is denied as [`Reason::LedgerMissing`], a Machine that cannot be sized as
/// [`Reason::Unsizeable`] (as under any quota), everything else passes.
pub fn decide_without_ledger(project: &str, quota: &str, gap: LedgerGap, request: &Request) -> Verdict {
    match &request.ask {
        Ask::Delete => Verdict::allow(Reason::Reduction),
        Ask::Unchanged => Verdict::allow(Reason::Unchanged),
        Ask::Unsizeable(why) => request.deny(Reason::Unsizeable, &unsizeable_detail(project, why)),
        ask if ask.growth().is_none() => Verdict::allow(Reason::Reduction),
        _ => request.deny(Reason::LedgerMissing, &gap_detail(project, quota, gap)),
    }
}

/// [`decide_without_ledger`] for each of a batch.
pub fn decide_batch_without_ledger(
    project: &str,
    quota: &str,
    gap: LedgerGap,
    requests: &[Request],
) -> Vec<Verdict> {
    requests
        .iter()
        .map(|r| decide_without_ledger(project, quota, gap, r))
        .collect()
}

#[cfg(test)]
mod tests {
    use kkp_quota_crds::ResourceDetails;

    use super::*;

    use kkp_quota_crds::fixtures::cpu;

    fn request(ask: Ask) -> Request {
        Request {
            machine: "worker-7f".into(),
            ask,
            dry_run: false,
            subject: crate::decision::Subject::Machine,
            autoscaled: None,
        }
    }

    #[test]
    fn growth_without_the_ledger_is_denied_as_ledger_missing() {
        let v = decide_without_ledger(
            "x8k2",
            "project-x8k2",
            LedgerGap::Missing,
            &request(Ask::Create(cpu(2))),
        );
        assert!(!v.allowed);
        assert_eq!(v.reason, Reason::LedgerMissing);
        assert_eq!(v.reason.as_str(), "ledger_missing");
        assert!(v.reserve.is_none(), "nothing may be reserved without a ledger");
        let message = v.message.unwrap();
        assert!(
            message.starts_with(
                r#"machine "worker-7f" cannot be admitted yet: the quota ledger of project "x8k2" is missing on this seed"#
            ),
            "{message}"
        );
        assert!(message.contains("master-controller"), "{message}");
        assert!(
            v.event_message
                .unwrap()
                .starts_with("a Machine cannot be admitted yet")
        );
        let grow = request(Ask::Update {
            old: Some(cpu(2)),
            new: cpu(4),
        });
        let v = decide_without_ledger("x8k2", "project-x8k2", LedgerGap::Missing, &grow);
        assert_eq!((v.allowed, v.reason), (false, Reason::LedgerMissing));
    }

    #[test]
    fn an_uncounted_ledger_denies_growth_naming_seed_controller() {
        let v = decide_without_ledger(
            "x8k2",
            "project-x8k2",
            LedgerGap::Uncounted,
            &request(Ask::Create(cpu(2))),
        );
        assert_eq!((v.allowed, v.reason), (false, Reason::LedgerMissing));
        let message = v.message.unwrap();
        assert!(message.contains("has not been counted yet"), "{message}");
        assert!(message.contains("seed-controller"), "{message}");
    }

    #[test]
    fn what_grows_nothing_passes_and_unsizeable_stays_unsizeable() {
        let pass = [
            (Ask::Delete, Reason::Reduction),
            (Ask::Unchanged, Reason::Unchanged),
            (
                Ask::Update {
                    old: Some(cpu(4)),
                    new: cpu(2),
                },
                Reason::Reduction,
            ),
        ];
        for (ask, reason) in pass {
            for gap in [LedgerGap::Missing, LedgerGap::Uncounted] {
                let v = decide_without_ledger("x8k2", "project-x8k2", gap, &request(ask.clone()));
                assert_eq!((v.allowed, v.reason), (true, reason), "{ask:?}");
            }
        }
        let v = decide_without_ledger(
            "x8k2",
            "project-x8k2",
            LedgerGap::Missing,
            &request(Ask::Unsizeable("no cpus".into())),
        );
        assert_eq!((v.allowed, v.reason), (false, Reason::Unsizeable));
        assert!(v.message.unwrap().ends_with(": no cpus"));
    }

    #[test]
    fn counted_means_local_usage_written() {
        assert!(!is_counted(None));
        let mut status = QuotaLedgerStatus {
            format_version: Some(1),
            global_usage: Some(cpu(4)),
            other_seeds_usage: Some(cpu(4)),
            ..QuotaLedgerStatus::default()
        };
        assert!(!is_counted(Some(&status)), "the master's figures are no count");
        assert!(!is_counted_json(Some(&serde_json::to_value(&status).unwrap())));
        status.local_usage = Some(ResourceDetails::default());
        assert!(is_counted(Some(&status)), "nothing running is a count too");
        assert!(is_counted_json(Some(&serde_json::to_value(&status).unwrap())));
        assert!(!is_counted_json(None));
        assert!(!is_counted_json(Some(&serde_json::json!({"localUsage": null}))));
    }

    #[test]
    fn a_batch_is_decided_request_by_request() {
        let batch = [request(Ask::Create(cpu(1))), request(Ask::Delete)];
        let verdicts = decide_batch_without_ledger("x8k2", "q", LedgerGap::Missing, &batch);
        let reasons: Vec<_> = verdicts.iter().map(|v| v.reason).collect();
        assert_eq!(reasons, [Reason::LedgerMissing, Reason::Reduction]);
    }
}
