//! Prometheus metrics (names agreed across the project; base units: cores, bytes).

use kkp_quota_crds::{Quantity, ResourceDetails};
use kkp_quota_runtime::RuntimeError;
use kkp_quota_runtime::ops::{ExtraSeries, Readiness, bind_with_series};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::group_series::GroupSeries;
use crate::project_series::ProjectSeries;
use prometheus::{
    GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};

/// Every metric this controller exports.
#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    /// Per project: `kkp_quota_limit{project,resource}` (limited resources only),
    /// `kkp_quota_usage{project,resource,scope}` (scope `global` or a seed name),
    /// `kkp_quota_reserved{project,resource,scope}`, `kkp_quota_over_limit{project,resource}`,
    /// `kkp_quota_share{project,seed,resource}` and
    /// `kkp_quota_share_stuck{project,seed,resource}`; written into `/metrics` beside the
    /// registry's (see [`ProjectSeries`] for why).
    pub projects: Arc<ProjectSeries>,
    /// Per quota group: `kkp_quota_group_limit`, `_usage`, `_over_limit` and `_budget`.
    pub groups: Arc<GroupSeries>,
    /// `kkp_quota_seed_stale{seed}`: 1 while the seed's usage is not current.
    pub seed_stale: GaugeVec,
    /// `kkp_quota_seed_last_sync_timestamp_seconds{seed}`.
    pub seed_last_sync: GaugeVec,
    /// `kkp_quota_sync_errors_total{seed,operation}`.
    pub sync_errors: IntCounterVec,
    /// `kkp_quota_reconcile_duration_seconds{controller}`.
    pub reconcile_duration: HistogramVec,
    /// `kkp_quota_reconcile_errors_total{controller}`.
    pub reconcile_errors: IntCounterVec,
    /// `kkp_quota_master_writes_total{target,operation}`: writes this replica made (target
    /// `master` or a seed name).
    pub writes: IntCounterVec,
    /// `kkp_quota_master_write_duration_seconds{target,operation}`: how long the reconcile's
    /// writes took, answered or failed (where a quota edit's time goes, per seed).
    pub write_duration: HistogramVec,
    /// `kkp_quota_master_leader`: 1 while this replica holds the leader lease.
    pub leader: IntGauge,
    /// `kkp_quota_share_grants_total{seed}`: grants persisted in the master's record.
    pub share_grants: IntCounterVec,
    /// `kkp_quota_share_grant_latency_seconds`: from the master first seeing a seed's demand
    /// above its share to the persisted write that covers it.
    pub share_grant_latency: Histogram,
    /// `kkp_quota_share_releases_total{seed}`: times a seed's reported `released` grew.
    pub share_releases: IntCounterVec,
    /// `kkp_quota_share_record_conflicts_total`: share record writes that lost their
    /// compare-and-swap (the record is read again and the round planned again).
    pub share_record_conflicts: IntCounter,
    /// `kkp_quota_share_records_rebuilt_total`: share records found behind what the seeds hold
    /// (the `ProjectQuota` re-created or restored) and rebuilt from their ledgers.
    pub share_records_rebuilt: IntCounter,
    /// `kkp_quota_gone_seeds_forgotten_total`: seeds forgotten from a quota's share record
    /// because the admin declared them gone (`--gone-seeds`); their share returned to the quota.
    pub gone_seeds_forgotten: IntCounter,
    /// `kkp_quota_master_unreadable_quotas`: KKP quotas with a limit this system cannot read
    /// exactly (`1e40`, `0.5n`); they are not fanned out until fixed.
    pub unreadable_quotas: IntGauge,
    /// `kkp_quota_master_quotas_not_in_force`: KKP quotas of a project that has several, other
    /// than the first by name (the one enforced); not fanned out.
    pub quotas_not_in_force: IntGauge,
    /// `kkp_quota_observed_clock_skew_seconds{seed,entry}`: this master's clock minus a
    /// webhook's at the write, as the newest demand or allotment first seen on the seed shows
    /// it (delay included).
    pub clock_skew: GaugeVec,
    /// `kkp_quota_allocation_decisions_total{verdict}`: the allocation webhook's answers
    /// (`allowed`, `refused`), in this replica.
    pub allocation_decisions: IntCounterVec,
    /// `kkp_quota_allocation_record_conflicts_total`: record writes that lost their
    /// compare-and-swap (another replica decided meanwhile) and were decided again.
    pub allocation_record_conflicts: IntCounter,
}

fn must<T>(r: Result<T, prometheus::Error>) -> T {
    // Metric definitions are static; a failure here is a programming error caught by tests.
    r.unwrap_or_else(|e| panic!("invalid metric definition: {e}"))
}

impl Metrics {
    /// Creates the metrics and registers them in a new registry.
    #[allow(clippy::too_many_lines)] // one definition after the other
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            let g = must(GaugeVec::new(Opts::new(name, help), labels));
            must(registry.register(Box::new(g.clone())));
            g
        };
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = must(IntCounterVec::new(Opts::new(name, help), labels));
            must(registry.register(Box::new(c.clone())));
            c
        };
        // A reconcile and one of its writes: milliseconds to the seed calls' 10 s bound.
        let duration = |name: &str, help: &str, labels: &[&str]| {
            let buckets = vec![
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ];
            let h = must(HistogramVec::new(
                HistogramOpts::new(name, help).buckets(buckets),
                labels,
            ));
            must(registry.register(Box::new(h.clone())));
            h
        };
        let seed_stale = gauge(
            "kkp_quota_seed_stale",
            "1 while a seed's usage is not current (unreachable).",
            &["seed"],
        );
        let seed_last_sync = gauge(
            "kkp_quota_seed_last_sync_timestamp_seconds",
            "Unix time of the last successful sync with a seed.",
            &["seed"],
        );
        let sync_errors = counter(
            "kkp_quota_sync_errors_total",
            "Failed operations against a seed.",
            &["seed", "operation"],
        );
        let reconcile_errors = counter(
            "kkp_quota_reconcile_errors_total",
            "Failed reconciles.",
            &["controller"],
        );
        let writes = counter(
            "kkp_quota_master_writes_total",
            "Writes made by this replica; target is \"master\" or a seed name.",
            &["target", "operation"],
        );
        let write_duration = duration(
            "kkp_quota_master_write_duration_seconds",
            "Duration of one write of a reconcile, answered or failed; target is \"master\" or a seed name.",
            &["target", "operation"],
        );
        let reconcile_duration = duration(
            "kkp_quota_reconcile_duration_seconds",
            "Duration of one reconcile.",
            &["controller"],
        );
        let leader = must(IntGauge::new(
            "kkp_quota_master_leader",
            "1 while this replica holds the leader lease.",
        ));
        must(registry.register(Box::new(leader.clone())));
        let share_grants = counter(
            "kkp_quota_share_grants_total",
            "Share grants persisted in the master's record, per seed.",
            &["seed"],
        );
        let share_releases = counter(
            "kkp_quota_share_releases_total",
            "Releases seen: times a seed's reported released share grew.",
            &["seed"],
        );
        let share_record_conflicts = must(IntCounter::new(
            "kkp_quota_share_record_conflicts_total",
            "Share record writes that lost their compare-and-swap and were planned again.",
        ));
        must(registry.register(Box::new(share_record_conflicts.clone())));
        let share_records_rebuilt = must(IntCounter::new(
            "kkp_quota_share_records_rebuilt_total",
            "Share records found behind what the seeds hold (ProjectQuota re-created or restored) and rebuilt from their ledgers.",
        ));
        must(registry.register(Box::new(share_records_rebuilt.clone())));
        let gone_seeds_forgotten = must(IntCounter::new(
            "kkp_quota_gone_seeds_forgotten_total",
            "Seeds forgotten from a quota's share record because the admin declared them gone (--gone-seeds).",
        ));
        must(registry.register(Box::new(gone_seeds_forgotten.clone())));
        let unreadable_quotas = must(IntGauge::new(
            "kkp_quota_master_unreadable_quotas",
            "KKP quotas with a limit this system cannot read exactly; not fanned out until fixed.",
        ));
        must(registry.register(Box::new(unreadable_quotas.clone())));
        let quotas_not_in_force = must(IntGauge::new(
            "kkp_quota_master_quotas_not_in_force",
            "KKP quotas of a project that has several, other than the one enforced (the first by name); not fanned out.",
        ));
        must(registry.register(Box::new(quotas_not_in_force.clone())));
        let share_grant_latency = must(Histogram::with_opts(
            HistogramOpts::new(
                "kkp_quota_share_grant_latency_seconds",
                "From the master first seeing a seed's demand above its share to the persisted grant that covers it.",
            )
            .buckets(vec![
                0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
            ]),
        ));
        must(registry.register(Box::new(share_grant_latency.clone())));
        let clock_skew = gauge(
            "kkp_quota_observed_clock_skew_seconds",
            "This component's clock minus a webhook's when it wrote the newest demand or allotment (entry) first seen, delay included; lifetimes are judged by this component's own clock.",
            &["seed", "entry"],
        );
        let allocation_decisions = counter(
            "kkp_quota_allocation_decisions_total",
            "The allocation webhook's answers to quota and group edits, by verdict (allowed, refused).",
            &["verdict"],
        );
        let allocation_record_conflicts = must(IntCounter::new(
            "kkp_quota_allocation_record_conflicts_total",
            "Allocation record writes that lost their compare-and-swap and were decided again.",
        ));
        must(registry.register(Box::new(allocation_record_conflicts.clone())));
        let groups = Arc::new(GroupSeries::new(&registry));
        Metrics {
            registry,
            projects: Arc::default(),
            groups,
            seed_stale,
            seed_last_sync,
            sync_errors,
            reconcile_duration,
            reconcile_errors,
            writes,
            write_duration,
            leader,
            share_grants,
            share_grant_latency,
            share_releases,
            share_record_conflicts,
            share_records_rebuilt,
            gone_seeds_forgotten,
            unreadable_quotas,
            quotas_not_in_force,
            clock_skew,
            allocation_decisions,
            allocation_record_conflicts,
        }
    }

    /// Records the clock skew a ledger entry of `seed` showed when first seen.
    pub fn observed_skew(&self, seed: &str, skew: kkp_quota_crds::ledger::lifetimes::Skew) {
        self.clock_skew
            .with_label_values(&[seed, skew.kind.as_str()])
            .set(skew.seconds);
    }

    pub fn sync_error(&self, seed: &str, operation: &str) {
        self.sync_errors.with_label_values(&[seed, operation]).inc();
    }

    pub fn wrote(&self, target: &str, operation: &str) {
        self.writes.with_label_values(&[target, operation]).inc();
    }

    /// Binds the operations server (`/metrics`: the registry's series, then the per-project
    /// ones) on `address`; see [`bind_with_series`].
    pub async fn bind_ops(
        &self,
        address: SocketAddr,
        readiness: Readiness,
    ) -> Result<(SocketAddr, impl Future<Output = Result<(), RuntimeError>> + use<>), RuntimeError> {
        let projects: Arc<dyn ExtraSeries> = self.projects.clone();
        bind_with_series(address, self.registry.clone(), Some(projects), readiness).await
    }

    /// Awaits `write`, timing it in `write_duration` and counting it in `writes` when it
    /// succeeds.
    pub async fn timed_write<T, E>(
        &self,
        target: &str,
        operation: &str,
        write: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let start = std::time::Instant::now();
        let result = write.await;
        self.write_duration
            .with_label_values(&[target, operation])
            .observe(start.elapsed().as_secs_f64());
        if result.is_ok() {
            self.wrote(target, operation);
        }
        result
    }

    /// Limit, global usage and over-limit series of one project.
    pub fn set_quota(&self, project: &str, limit: &ResourceDetails, global: Option<&ResourceDetails>) {
        self.projects.set_quota(project, limit, global);
    }

    /// Per-seed usage of one project.
    pub fn set_seed_usage(&self, project: &str, seed: &str, local: &ResourceDetails) {
        self.projects.set_seed_usage(project, seed, local);
    }

    /// The reserved series of one project (`kkp_quota_reserved`).
    pub fn set_reserved<'a>(
        &self,
        project: &str,
        global: Option<&ResourceDetails>,
        seeds: impl IntoIterator<Item = (&'a str, &'a ResourceDetails)>,
    ) {
        self.projects.set_reserved(project, global, seeds);
    }

    /// The share series of one project: `shares` per seed in the record (limited resources
    /// only), `stuck` for the unreachable ones. Series of seeds and resources no longer there go.
    pub fn set_shares(
        &self,
        project: &str,
        shares: &BTreeMap<String, ResourceDetails>,
        stuck: &BTreeMap<String, ResourceDetails>,
    ) {
        self.projects.set_shares(project, shares, stuck);
    }

    /// Drops every series of a project (its quota is gone).
    pub fn forget_project(&self, project: &str) {
        self.projects.forget_project(project);
    }

    /// Drops a seed's series (removed from the fleet), including its per-project usage.
    pub fn forget_seed(&self, seed: &str) {
        let _ = self.seed_stale.remove_label_values(&[seed]);
        let _ = self.seed_last_sync.remove_label_values(&[seed]);
        for entry in kkp_quota_crds::ledger::lifetimes::EntryKind::ALL {
            let _ = self.clock_skew.remove_label_values(&[seed, entry.as_str()]);
        }
        self.projects.forget_seed(seed);
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// A quantity in base units as a float (for metrics only; decisions never use floats).
#[allow(clippy::cast_precision_loss)]
pub fn as_f64(q: Quantity) -> f64 {
    q.as_nanos() as f64 / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::Encoder;

    #[test]
    fn exports_agreed_names() {
        let m = Metrics::new();
        let limit = ResourceDetails {
            cpu: Some(Quantity::from_units(4)),
            ..ResourceDetails::default()
        };
        let used = ResourceDetails {
            cpu: Some(Quantity::from_millis(6500)),
            memory: Some(Quantity::from_gibibytes(1)),
            ..ResourceDetails::default()
        };
        m.set_quota("demo", &limit, Some(&used));
        m.set_seed_usage("demo", "seed-a", &used);
        m.set_reserved("demo", Some(&limit), [("seed-a", &limit)]);
        let nothing = ResourceDetails::zero();
        m.set_reserved("idle", Some(&nothing), [("seed-a", &nothing)]);
        m.seed_stale.with_label_values(&["seed-a"]).set(1.0);
        m.sync_error("seed-a", "watch");
        m.reconcile_duration.with_label_values(&["quota"]).observe(0.01);
        m.reconcile_errors.with_label_values(&["quota"]).inc();
        m.seed_last_sync.with_label_values(&["seed-a"]).set(1.0);
        let text = exposition(&m);
        for needle in [
            "kkp_quota_limit{project=\"demo\",resource=\"cpu\"} 4",
            "kkp_quota_usage{project=\"demo\",resource=\"cpu\",scope=\"global\"} 6.5",
            "kkp_quota_usage{project=\"demo\",resource=\"memory\",scope=\"seed-a\"} 1073741824",
            "kkp_quota_over_limit{project=\"demo\",resource=\"cpu\"} 1",
            "kkp_quota_reserved{project=\"demo\",resource=\"cpu\",scope=\"global\"} 4",
            "kkp_quota_reserved{project=\"demo\",resource=\"cpu\",scope=\"seed-a\"} 4",
            "kkp_quota_seed_stale{seed=\"seed-a\"} 1",
            "kkp_quota_sync_errors_total{operation=\"watch\",seed=\"seed-a\"} 1",
            "kkp_quota_reconcile_duration_seconds_bucket",
            "kkp_quota_reconcile_errors_total{controller=\"quota\"} 1",
            "kkp_quota_seed_last_sync_timestamp_seconds{seed=\"seed-a\"} 1",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
        assert!(
            !text.contains("kkp_quota_limit{project=\"demo\",resource=\"memory\"}"),
            "unlimited resources have no limit series"
        );
        assert!(
            !text.contains("kkp_quota_reserved{project=\"idle\""),
            "nothing reserved, no reserved series"
        );
        m.forget_seed("seed-a");
        let text = exposition(&m);
        assert!(
            !text.contains("scope=\"seed-a\""),
            "seed-a's usage series are gone:\n{text}"
        );
        assert!(text.contains("scope=\"global\""));
        assert!(!text.contains("kkp_quota_seed_stale{seed=\"seed-a\"}"));
    }

    /// What `/metrics` serves: the registry's series, then the per-project ones.
    fn exposition(m: &Metrics) -> String {
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&m.registry.gather(), &mut out)
            .unwrap();
        let mut text = String::from_utf8(out).unwrap();
        kkp_quota_runtime::ops::encode_all(&*m.projects, &mut text);
        text
    }

    #[test]
    fn share_series_follow_the_record() {
        let m = Metrics::new();
        let cpu = |n: i64| ResourceDetails {
            cpu: Some(Quantity::from_units(n)),
            ..ResourceDetails::default()
        };
        let shares = BTreeMap::from([("seed-a".to_owned(), cpu(6)), ("seed-b".to_owned(), cpu(4))]);
        let stuck = BTreeMap::from([("seed-b".to_owned(), cpu(4))]);
        m.set_shares("demo", &shares, &stuck);
        m.set_shares("other", &shares, &BTreeMap::new());
        m.share_grants.with_label_values(&["seed-a"]).inc();
        m.share_releases.with_label_values(&["seed-b"]).inc();
        m.share_record_conflicts.inc();
        m.share_grant_latency.observe(0.2);
        let text = exposition(&m);
        for needle in [
            "kkp_quota_share{project=\"demo\",resource=\"cpu\",seed=\"seed-a\"} 6",
            "kkp_quota_share_stuck{project=\"demo\",resource=\"cpu\",seed=\"seed-b\"} 4",
            "kkp_quota_share_stuck{project=\"demo\",resource=\"cpu\",seed=\"seed-a\"} 0",
            "kkp_quota_share_grants_total{seed=\"seed-a\"} 1",
            "kkp_quota_share_releases_total{seed=\"seed-b\"} 1",
            "kkp_quota_share_record_conflicts_total 1",
            "kkp_quota_share_grant_latency_seconds_bucket{le=\"0.25\"} 1",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
        // seed-b forgotten from demo's record: its series go, other projects' stay.
        m.set_shares(
            "demo",
            &BTreeMap::from([("seed-a".to_owned(), cpu(6))]),
            &BTreeMap::new(),
        );
        let text = exposition(&m);
        assert!(!text.contains("kkp_quota_share{project=\"demo\",resource=\"cpu\",seed=\"seed-b\"}"));
        assert!(text.contains("kkp_quota_share{project=\"other\",resource=\"cpu\",seed=\"seed-b\"} 4"));
        m.forget_project("demo");
        let text = exposition(&m);
        assert!(!text.contains("project=\"demo\""), "{text}");
        assert!(text.contains("project=\"other\""));
    }
}
