//! What a user cluster's `QuotaView` says, pure: from the seed's ledger of the project as last
//! seen, the usage of the project's clusters on this seed, and whether the seed can be read.

use jiff::Timestamp;
use kkp_quota_crds::ledger::reserved_total;
use kkp_quota_crds::{
    ClusterUse, Quantity, QuotaLedger, QuotaViewStatus, Resource, ResourceDetails, ViewState,
};

/// The view's status without `confirmedAt` (the writer stamps it).
pub fn build(
    ledger: Option<&QuotaLedger>,
    mut clusters: Vec<ClusterUse>,
    seed: &str,
    seed_unreadable_since: Option<Timestamp>,
) -> QuotaViewStatus {
    clusters.sort_by(|a, b| a.cluster.cmp(&b.cluster));
    // What the project's clusters here use, the clusters themselves counted (as `localUsage`
    // counts them, which stands in for this until the seed has counted).
    let mut here = ResourceDetails::checked_sum(clusters.iter().map(|c| &c.usage)).unwrap_or_default();
    here.set(
        Resource::Clusters,
        Some(Quantity::from_units(
            i64::try_from(clusters.len()).unwrap_or(i64::MAX),
        )),
    );
    let Some(ledger) = ledger else {
        return QuotaViewStatus {
            state: if seed_unreadable_since.is_some() {
                ViewState::Stale
            } else {
                ViewState::NoQuota
            },
            message: Some(match seed_unreadable_since {
                Some(since) => unreadable(seed, since),
                None => "the project has no quota: nothing limits its Machines".to_owned(),
            }),
            used: here,
            clusters,
            ..QuotaViewStatus::default()
        };
    };
    let status = ledger.status.clone().unwrap_or_default();
    let local = status.local_usage.clone();
    let other_seeds = match &status.other_seeds_usage {
        Some(other) => other.clone(),
        None => status
            .global_usage
            .clone()
            .unwrap_or_default()
            .saturating_sub(local.as_ref().unwrap_or(&ResourceDetails::default())),
    };
    let reserved = reserved_total(&status.reservations).unwrap_or_default();
    let used = other_seeds
        .checked_add(local.as_ref().unwrap_or(&here))
        .and_then(|sum| sum.checked_add(&reserved))
        .unwrap_or_default();
    let limits = ledger.spec.quota.clone();
    let free = kkp_quota_crds::fit::room(&limits, &used);
    let (state, message) = match (seed_unreadable_since, &local) {
        (Some(since), _) => (ViewState::Stale, Some(unreadable(seed, since))),
        (None, None) => (
            ViewState::Counting,
            Some(format!(
                "seed {seed:?} has not counted the project's Machines yet; new Machines are refused until it has"
            )),
        ),
        (None, Some(_)) => (ViewState::Current, None),
    };
    QuotaViewStatus {
        state,
        message,
        limits,
        used,
        free,
        autoscaler_reserved: status.reserved_usage.clone().unwrap_or_default(),
        reserved_counts: ledger.spec.reserved_counts,
        clusters,
        other_seeds,
        confirmed_at: None,
    }
}

fn unreadable(seed: &str, since: Timestamp) -> String {
    format!(
        "seed {seed:?} cannot be read since {since}: these numbers are as they were then, and Machines may not be admitted"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use kkp_quota_crds::fixtures::cpu;
    use kkp_quota_crds::{LedgerSubject, QuotaLedgerSpec, QuotaLedgerStatus};

    fn ledger(limit: i64, local: Option<i64>, other: i64) -> QuotaLedger {
        let mut ledger = QuotaLedger::new(
            "project-demo",
            QuotaLedgerSpec {
                subject: LedgerSubject::project("demo"),
                quota: cpu(limit),
                shares: None,
                rollout_allowance: None,
                reserved_counts: false,
            },
        );
        ledger.status = Some(QuotaLedgerStatus {
            local_usage: local.map(cpu),
            other_seeds_usage: Some(cpu(other)),
            ..QuotaLedgerStatus::default()
        });
        ledger
    }

    /// The cpu of each, in whole cpus.
    fn cpus(details: &[&ResourceDetails]) -> Vec<i128> {
        details
            .iter()
            .map(|d| d.amount(kkp_quota_crds::Resource::Cpu).as_nanos() / 1_000_000_000)
            .collect()
    }

    fn used_by(cluster: &str, n: i64) -> ClusterUse {
        ClusterUse {
            cluster: cluster.to_owned(),
            usage: cpu(n),
        }
    }

    #[test]
    fn limits_usage_over_every_seed_and_the_room_left() {
        let view = build(
            Some(&ledger(16, Some(6), 4)),
            vec![used_by("beta", 2), used_by("alpha", 4)],
            "seed-a",
            None,
        );
        assert_eq!(view.state, ViewState::Current);
        assert_eq!(cpus(&[&view.limits, &view.used, &view.free]), [16, 10, 6]);
        assert_eq!(view.other_seeds, cpu(4));
        assert_eq!(view.clusters, [used_by("alpha", 4), used_by("beta", 2)]);
        assert_eq!(view.message, None);
    }

    #[test]
    fn over_the_limit_leaves_no_room_rather_than_less_than_none() {
        let view = build(Some(&ledger(8, Some(6), 4)), vec![], "seed-a", None);
        assert_eq!(cpus(&[&view.used, &view.free]), [10, 0]);
    }

    #[test]
    fn not_counted_yet_and_no_quota_say_so() {
        let counting = build(
            Some(&ledger(16, None, 0)),
            vec![used_by("alpha", 2)],
            "seed-a",
            None,
        );
        assert_eq!(counting.state, ViewState::Counting);
        assert!(counting.message.unwrap().contains("has not counted"));
        assert_eq!(
            counting.used.amount(Resource::Clusters),
            Quantity::from_units(1),
            "the cluster itself counts before the seed has counted"
        );
        let none = build(None, vec![used_by("alpha", 2)], "seed-a", None);
        assert_eq!((none.state, cpus(&[&none.used])), (ViewState::NoQuota, vec![2]));
        assert_eq!(none.limits, ResourceDetails::default());
    }

    #[test]
    fn an_unreadable_seed_makes_every_view_stale_and_says_since_when() {
        let since: Timestamp = "2026-11-27T04:00:00Z".parse().unwrap();
        for ledger in [Some(ledger(16, Some(6), 4)), Some(ledger(16, None, 0)), None] {
            let view = build(ledger.as_ref(), vec![], "seed-b", Some(since));
            assert_eq!(view.state, ViewState::Stale);
            assert!(
                view.message
                    .as_deref()
                    .unwrap()
                    .starts_with(r#"seed "seed-b" cannot be read since 2026-11-27T04:00:00Z"#),
                "{view:?}"
            );
        }
    }
}
