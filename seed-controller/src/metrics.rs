//! The seed-controller's Prometheus metrics (names agreed across the project; base units).

use prometheus::{
    CounterVec, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry,
};

use crate::Error;

/// Every metric this component exports, registered in one [`Registry`].
#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    /// `kkp_quota_cluster_usage{cluster,project,resource}`
    pub cluster_usage: GaugeVec,
    /// `kkp_quota_local_usage{project,resource}`
    pub local_usage: GaugeVec,
    /// `kkp_quota_unsizeable_machines{cluster,provider,flavour,reason}`
    pub unsizeable: GaugeVec,
    /// `kkp_quota_machines_counted_at_last_size{cluster,project,provider,flavour,reason}`
    pub counted_at_last_size: GaugeVec,
    /// `kkp_quota_user_cluster_unreachable{cluster}`
    pub unreachable: GaugeVec,
    /// `kkp_quota_watch_restarts_total{cluster}`
    pub watch_restarts: IntCounterVec,
    /// `kkp_quota_unadmitted_machines_total{cluster}`
    pub unadmitted: IntCounterVec,
    /// `kkp_quota_usage_drift_corrections_total`
    pub drift_corrections: IntCounter,
    /// `kkp_quota_reservations_expired_total`
    pub reservations_expired: IntCounter,
    /// `kkp_quota_reservations_counted_total`
    pub reservations_counted: IntCounter,
    /// `kkp_quota_reservations_gone_total`
    pub reservations_gone: IntCounter,
    /// `kkp_quota_allotments_expired_total`
    pub allotments_expired: IntCounter,
    /// `kkp_quota_demands_expired_total`
    pub demands_expired: IntCounter,
    /// `kkp_quota_share_released_total{project,resource}`
    pub share_released: CounterVec,
    /// `kkp_quota_share_held{project,resource}`
    pub share_held: GaugeVec,
    /// `kkp_quota_rollout_surge{project,resource}`
    pub rollout_surge: GaugeVec,
    /// `kkp_quota_rollout_surge_overdue_at_seconds{project}`
    pub rollout_surge_overdue_at: GaugeVec,
    /// `kkp_quota_size_catalog_errors_total`
    pub catalog_errors: IntCounter,
    /// `kkp_quota_reconcile_duration_seconds{controller}`
    pub reconcile_duration: HistogramVec,
    /// `kkp_quota_reconcile_errors_total{controller}`
    pub reconcile_errors: CounterVec,
    /// `kkp_quota_observed_clock_skew_seconds{entry}`
    pub clock_skew: GaugeVec,
}

impl Metrics {
    // One declaration per metric: long, and flat.
    #[allow(clippy::too_many_lines)]
    pub fn new() -> Result<Metrics, Error> {
        let registry = Registry::new();
        let m = Metrics {
            cluster_usage: GaugeVec::new(
                Opts::new(
                    "kkp_quota_cluster_usage",
                    "Usage of a user cluster's Machines (cores, bytes, machines)",
                ),
                &["cluster", "project", "resource"],
            )?,
            local_usage: GaugeVec::new(
                Opts::new(
                    "kkp_quota_local_usage",
                    "Usage of a project on this seed, as written to localUsage",
                ),
                &["project", "resource"],
            )?,
            unsizeable: GaugeVec::new(
                Opts::new(
                    "kkp_quota_unsizeable_machines",
                    "Machines that cannot be sized and are not counted",
                ),
                &["cluster", "provider", "flavour", "reason"],
            )?,
            counted_at_last_size: GaugeVec::new(
                Opts::new(
                    "kkp_quota_machines_counted_at_last_size",
                    "Machines that can no longer be sized (their catalog entry was removed or their flavour renamed), counted at their last known size until they are deleted",
                ),
                &["cluster", "project", "provider", "flavour", "reason"],
            )?,
            unreachable: GaugeVec::new(
                Opts::new(
                    "kkp_quota_user_cluster_unreachable",
                    "1 while a user cluster's apiserver cannot be watched",
                ),
                &["cluster"],
            )?,
            watch_restarts: IntCounterVec::new(
                Opts::new(
                    "kkp_quota_watch_restarts_total",
                    "Machine watch failures (each followed by a retry)",
                ),
                &["cluster"],
            )?,
            unadmitted: IntCounterVec::new(
                Opts::new(
                    "kkp_quota_unadmitted_machines_total",
                    "Machines that appeared without an admission reservation (webhook bypassed)",
                ),
                &["cluster"],
            )?,
            drift_corrections: IntCounter::new(
                "kkp_quota_usage_drift_corrections_total",
                "Full recounts that found and corrected a difference from the incremental count",
            )?,
            reservations_expired: IntCounter::new(
                "kkp_quota_reservations_expired_total",
                "Admission reservations dropped because their Machine never appeared",
            )?,
            reservations_counted: IntCounter::new(
                "kkp_quota_reservations_counted_total",
                "Admission reservations dropped in the same write that counted their Machine",
            )?,
            reservations_gone: IntCounter::new(
                "kkp_quota_reservations_gone_total",
                "Admission reservations dropped because their Machine was seen deleted before it was counted",
            )?,
            allotments_expired: IntCounter::new(
                "kkp_quota_allotments_expired_total",
                "Webhook allotments (held headroom) removed after their expiresAt passed",
            )?,
            demands_expired: IntCounter::new(
                "kkp_quota_demands_expired_total",
                "Share demands of webhook processes removed after their expiresAt passed",
            )?,
            share_released: CounterVec::new(
                Opts::new(
                    "kkp_quota_share_released_total",
                    "Share of a project quota this seed released back to the master (cores, bytes, machines)",
                ),
                &["project", "resource"],
            )?,
            share_held: GaugeVec::new(
                Opts::new(
                    "kkp_quota_share_held",
                    "Share of a project quota this seed holds (granted - released; cores, bytes, machines)",
                ),
                &["project", "resource"],
            )?,
            rollout_surge: GaugeVec::new(
                Opts::new(
                    "kkp_quota_rollout_surge",
                    "What surge Machines admitted by a project's rollout allowance add over its limit on this seed, until the Machines they replace are gone (cores, bytes, machines)",
                ),
                &["project", "resource"],
            )?,
            rollout_surge_overdue_at: GaugeVec::new(
                Opts::new(
                    "kkp_quota_rollout_surge_overdue_at_seconds",
                    "When the oldest running rollout surge of a project outlives its allowance's overdueAfterSeconds (Unix time; absent while no surge runs)",
                ),
                &["project"],
            )?,
            catalog_errors: IntCounter::new(
                "kkp_quota_size_catalog_errors_total",
                "Admin size catalogs that could not be loaded (the previous one stays in use)",
            )?,
            reconcile_duration: HistogramVec::new(
                HistogramOpts::new(
                    "kkp_quota_reconcile_duration_seconds",
                    "Duration of one write of usage",
                ),
                &["controller"],
            )?,
            reconcile_errors: CounterVec::new(
                Opts::new("kkp_quota_reconcile_errors_total", "Writes of usage that failed"),
                &["controller"],
            )?,
            clock_skew: GaugeVec::new(
                Opts::new(
                    "kkp_quota_observed_clock_skew_seconds",
                    "This component's clock minus a webhook's when it wrote the newest demand or allotment (entry) first seen, delay included; lifetimes are judged by this component's own clock",
                ),
                &["entry"],
            )?,
            registry,
        };
        m.registry.register(Box::new(m.cluster_usage.clone()))?;
        m.registry.register(Box::new(m.local_usage.clone()))?;
        m.registry.register(Box::new(m.unsizeable.clone()))?;
        m.registry.register(Box::new(m.counted_at_last_size.clone()))?;
        m.registry.register(Box::new(m.unreachable.clone()))?;
        m.registry.register(Box::new(m.watch_restarts.clone()))?;
        m.registry.register(Box::new(m.unadmitted.clone()))?;
        m.registry.register(Box::new(m.drift_corrections.clone()))?;
        m.registry.register(Box::new(m.reservations_expired.clone()))?;
        m.registry.register(Box::new(m.reservations_counted.clone()))?;
        m.registry.register(Box::new(m.reservations_gone.clone()))?;
        m.registry.register(Box::new(m.allotments_expired.clone()))?;
        m.registry.register(Box::new(m.demands_expired.clone()))?;
        m.registry.register(Box::new(m.share_released.clone()))?;
        m.registry.register(Box::new(m.share_held.clone()))?;
        m.registry.register(Box::new(m.rollout_surge.clone()))?;
        m.registry
            .register(Box::new(m.rollout_surge_overdue_at.clone()))?;
        m.registry.register(Box::new(m.catalog_errors.clone()))?;
        m.registry.register(Box::new(m.reconcile_duration.clone()))?;
        m.registry.register(Box::new(m.reconcile_errors.clone()))?;
        m.registry.register(Box::new(m.clock_skew.clone()))?;
        Ok(m)
    }
}
