//! The webhook's Prometheus metrics (names agreed across the project; no Machine name is ever a
//! label).

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use crate::decision::{Reason, Subject, Verdict};

#[derive(Clone, Debug)]
pub struct Metrics {
    pub registry: Registry,
    /// `kkp_quota_admissions_total{result, reason}`: Machines.
    pub admissions: IntCounterVec,
    /// `kkp_quota_cluster_admissions_total{result, reason}`: `Cluster` creates on the seed.
    pub cluster_admissions: IntCounterVec,
    /// `kkp_quota_deployment_admissions_total{result, reason}`: autoscaled `MachineDeployment`
    /// creates and changes (the policy `reservedCounts`).
    pub deployment_admissions: IntCounterVec,
    /// `kkp_quota_group_denials_total{group, resource, kind}`: denials naming a quota group, one
    /// per group and resource the denial names, by the kind of object refused (`machine`,
    /// `cluster`, `machinedeployment`: the answers of the three counters above).
    pub group_denials: IntCounterVec,
    /// `kkp_quota_admission_duration_seconds`
    pub duration: Histogram,
    /// `kkp_quota_reservation_conflicts_total`
    pub conflicts: IntCounter,
    /// `kkp_quota_reservation_writes_total`
    pub writes: IntCounter,
    /// `kkp_quota_reservation_write_duration_seconds`: one compare-and-swap write of a batch.
    pub write_duration: Histogram,
    /// `kkp_quota_reservation_write_errors_total`
    pub write_errors: IntCounter,
    /// `kkp_quota_reservations{project}`: the ledger size as last read or written.
    pub reservations: IntGaugeVec,
    /// `kkp_quota_admission_batch_size`: requests decided in one pass.
    pub batch_size: Histogram,
    /// `kkp_quota_webhook_connections_total`: TLS connections accepted (API servers keep them
    /// alive, so this grows slowly when all is well).
    pub connections: IntCounter,
    /// `kkp_quota_denial_events_total{result}`: created, updated (deduplicated), failed, dropped.
    pub events: IntCounterVec,
    /// `kkp_quota_allotment_admissions_total`: admitted from this process's allotment, without
    /// waiting for a ledger write.
    pub allotment_admissions: IntCounter,
    /// `kkp_quota_share_demands_total`: writes of this process's demand for share (requests
    /// that fit the quota but not this seed's share, or not beside other processes' allotments).
    pub share_demands: IntCounter,
    /// `kkp_quota_share_wait_seconds{result}`: how long a request waited for share before it was
    /// admitted (`allowed`) or denied (`denied`: as `share_in_transit`, or naming a shared group
    /// its ledger's figures leave no room in).
    pub share_wait: HistogramVec,
    /// `kkp_quota_reservation_wait_seconds{path}`: the part of a growing request's decision
    /// spent in the reserver, by path: `allotment` (admitted from this process's allotment in
    /// memory) or `write` (queued for a batch's compare-and-swap write, share waits included).
    pub reservation_wait: HistogramVec,
    /// `kkp_quota_webhook_auth_failures_total{reason}`: calls refused before any decision
    /// (`missing_token`, `unknown_cluster`, `invalid_token`, `not_ready`).
    pub auth_failures: IntCounterVec,
    /// `kkp_quota_webhook_authenticated_total{key}`: calls whose token verified, by key
    /// (`signing`: the first key; `older`: any other). During a rotation, `older` stops growing
    /// once every user cluster's API server uses its new URL: then the old key can go.
    pub authenticated: IntCounterVec,
    /// `kkp_quota_webhook_invalid_requests_total{reason}`: authenticated calls answered 4xx
    /// without a decision (`too_large`, `read_timeout`, `malformed`).
    pub invalid_requests: IntCounterVec,
    /// `kkp_quota_webhook_wakes_total{result}`: owners of refused Machines nudged because room
    /// appeared (`sent`), found deleted or replaced (`gone`), or not reached (`failed`).
    pub wakes: IntCounterVec,
    /// `kkp_quota_webhook_wake_checks_total{result}`: waiting owners checked against a project's
    /// room in a wake pass, by whether their Machine now fits (`fits`, `no_room`).
    pub wake_checks: IntCounterVec,
    /// `kkp_quota_webhook_waiting_owners`: owners of Machines refused for room in the last hour,
    /// remembered to be woken.
    pub waiting_owners: IntGauge,
}

impl Metrics {
    // A flat list of metric definitions; splitting it further would only scatter them.
    #[allow(clippy::too_many_lines)]
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new();
        let admissions = IntCounterVec::new(
            Opts::new(
                "kkp_quota_admissions_total",
                "Machine admission requests answered, by result and reason",
            ),
            &["result", "reason"],
        )?;
        let cluster_admissions = IntCounterVec::new(
            Opts::new(
                "kkp_quota_cluster_admissions_total",
                "Cluster create requests of the seed answered, by result and reason",
            ),
            &["result", "reason"],
        )?;
        let deployment_admissions = IntCounterVec::new(
            Opts::new(
                "kkp_quota_deployment_admissions_total",
                "Autoscaled MachineDeployment creates and changes answered, by result and reason",
            ),
            &["result", "reason"],
        )?;
        let group_denials = IntCounterVec::new(
            Opts::new(
                "kkp_quota_group_denials_total",
                "Denials naming a quota group that has no room (the request fits its project's own quota; or, waiting for share, its other projects hold the rest as budget), one per group and resource named, by kind of object (machine, cluster, machinedeployment)",
            ),
            &["group", "resource", "kind"],
        )?;
        let duration = Histogram::with_opts(
            HistogramOpts::new(
                "kkp_quota_admission_duration_seconds",
                "Time from receiving an admission request to answering it",
            )
            .buckets(vec![
                0.000_25, 0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03,
                0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
        )?;
        let conflicts = IntCounter::new(
            "kkp_quota_reservation_conflicts_total",
            "Reservation writes refused with 409 Conflict (then re-read and re-decided)",
        )?;
        let writes = IntCounter::new(
            "kkp_quota_reservation_writes_total",
            "Successful reservation writes (one per batch)",
        )?;
        let write_duration = Histogram::with_opts(
            HistogramOpts::new(
                "kkp_quota_reservation_write_duration_seconds",
                "Duration of one reservation write (a batch's compare-and-swap patch), conflicts included",
            )
            .buckets(vec![
                0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25,
                0.5, 1.0,
            ]),
        )?;
        let write_errors = IntCounter::new(
            "kkp_quota_reservation_write_errors_total",
            "Reservation reads or writes that failed for another reason than a conflict",
        )?;
        let reservations = IntGaugeVec::new(
            Opts::new(
                "kkp_quota_reservations",
                "Reservations in the project's ledger on this seed, as last read or written",
            ),
            &["project"],
        )?;
        let batch_size = Histogram::with_opts(
            HistogramOpts::new(
                "kkp_quota_admission_batch_size",
                "Requests of one project decided together and written in one patch",
            )
            .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0]),
        )?;
        let connections = IntCounter::new(
            "kkp_quota_webhook_connections_total",
            "TLS connections accepted by the admission server",
        )?;
        let allotment_admissions = IntCounter::new(
            "kkp_quota_allotment_admissions_total",
            "Machines admitted from this webhook process's allotment without waiting for a ledger write",
        )?;
        let share_demands = IntCounter::new(
            "kkp_quota_share_demands_total",
            "Writes of this webhook process's demand for share (requests waiting for share to move to this seed or process)",
        )?;
        let share_wait = HistogramVec::new(
            HistogramOpts::new(
                "kkp_quota_share_wait_seconds",
                "Time a request waited for share, by result (allowed once it fitted, denied when the wait ended)",
            )
            .buckets(vec![0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0]),
            &["result"],
        )?;
        let reservation_wait = HistogramVec::new(
            HistogramOpts::new(
                "kkp_quota_reservation_wait_seconds",
                "Time a growing request spent in the reserver, by path (allotment: admitted from this process's allotment in memory; write: queued for a batch's ledger write)",
            )
            .buckets(vec![
                0.000_01, 0.000_025, 0.000_05, 0.0001, 0.000_25, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02,
                0.05, 0.1, 0.5, 1.0, 5.0,
            ]),
            &["path"],
        )?;
        let events = IntCounterVec::new(
            Opts::new(
                "kkp_quota_denial_events_total",
                "Events about denials, by result (created, updated, failed, dropped)",
            ),
            &["result"],
        )?;
        let (auth_failures, authenticated, invalid_requests) = auth_metrics(&registry)?;
        let (wakes, wake_checks, waiting_owners) = wake_metrics(&registry)?;
        registry.register(Box::new(admissions.clone()))?;
        registry.register(Box::new(cluster_admissions.clone()))?;
        registry.register(Box::new(deployment_admissions.clone()))?;
        registry.register(Box::new(group_denials.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(conflicts.clone()))?;
        registry.register(Box::new(writes.clone()))?;
        registry.register(Box::new(write_errors.clone()))?;
        registry.register(Box::new(write_duration.clone()))?;
        registry.register(Box::new(reservations.clone()))?;
        registry.register(Box::new(batch_size.clone()))?;
        registry.register(Box::new(events.clone()))?;
        registry.register(Box::new(connections.clone()))?;
        registry.register(Box::new(allotment_admissions.clone()))?;
        registry.register(Box::new(share_demands.clone()))?;
        registry.register(Box::new(share_wait.clone()))?;
        registry.register(Box::new(reservation_wait.clone()))?;
        for path in ["allotment", "write"] {
            reservation_wait.with_label_values(&[path]);
        }
        // Every label value up front, so dashboards see zeros rather than gaps.
        for reason in Reason::ALL {
            for result in ["allowed", "denied"] {
                admissions.with_label_values(&[result, reason.as_str()]);
                cluster_admissions.with_label_values(&[result, reason.as_str()]);
            }
        }
        Ok(Metrics {
            registry,
            admissions,
            cluster_admissions,
            deployment_admissions,
            group_denials,
            duration,
            conflicts,
            writes,
            write_duration,
            write_errors,
            reservations,
            batch_size,
            connections,
            events,
            allotment_admissions,
            share_demands,
            share_wait,
            reservation_wait,
            auth_failures,
            authenticated,
            invalid_requests,
            wakes,
            wake_checks,
            waiting_owners,
        })
    }

    pub fn record(&self, subject: Subject, verdict: &Verdict) {
        let result = if verdict.allowed { "allowed" } else { "denied" };
        let counter = match subject {
            Subject::Machine => &self.admissions,
            Subject::Cluster => &self.cluster_admissions,
            Subject::Deployment => &self.deployment_admissions,
        };
        counter
            .with_label_values(&[result, verdict.reason.as_str()])
            .inc();
        // Groups are few (an admin makes each one); projects are never a label here.
        for (group, resource) in verdict.group_denials() {
            self.group_denials
                .with_label_values(&[group, resource.name(), subject.noun()])
                .inc();
        }
    }

    /// Admission requests answered so far, over every reason; only those with `result`
    /// (`allowed`, `denied`) when given.
    pub fn answered(&self, result: Option<&str>) -> u64 {
        Reason::ALL
            .iter()
            .flat_map(|reason| {
                ["allowed", "denied"]
                    .into_iter()
                    .filter(move |r| result.is_none_or(|want| want == *r))
                    .map(move |r| self.admissions.with_label_values(&[r, reason.as_str()]).get())
            })
            .sum()
    }
}

/// The metrics of refused and authenticated calls, registered and with every label value.
fn auth_metrics(
    registry: &Registry,
) -> Result<(IntCounterVec, IntCounterVec, IntCounterVec), prometheus::Error> {
    let auth_failures = IntCounterVec::new(
        Opts::new(
            "kkp_quota_webhook_auth_failures_total",
            "Admission calls refused without a decision because their credentials are missing or invalid, by reason",
        ),
        &["reason"],
    )?;
    let authenticated = IntCounterVec::new(
        Opts::new(
            "kkp_quota_webhook_authenticated_total",
            "Admission calls whose URL token verified, by key (signing: the first key; older: another one)",
        ),
        &["key"],
    )?;
    let invalid_requests = IntCounterVec::new(
        Opts::new(
            "kkp_quota_webhook_invalid_requests_total",
            "Authenticated admission calls answered with a 4xx status and no decision, by reason",
        ),
        &["reason"],
    )?;
    registry.register(Box::new(auth_failures.clone()))?;
    registry.register(Box::new(authenticated.clone()))?;
    registry.register(Box::new(invalid_requests.clone()))?;
    for reason in kkp_quota_runtime::webhook_auth::AuthFailure::ALL {
        auth_failures.with_label_values(&[reason.as_str()]);
    }
    for key in ["signing", "older"] {
        authenticated.with_label_values(&[key]);
    }
    for reason in ["too_large", "read_timeout", "malformed"] {
        invalid_requests.with_label_values(&[reason]);
    }
    Ok((auth_failures, authenticated, invalid_requests))
}

fn wake_metrics(registry: &Registry) -> Result<(IntCounterVec, IntCounterVec, IntGauge), prometheus::Error> {
    let wakes = IntCounterVec::new(
        Opts::new(
            "kkp_quota_webhook_wakes_total",
            "Owners of Machines refused for room, nudged when room appeared, by result (sent, gone, failed)",
        ),
        &["result"],
    )?;
    let wake_checks = IntCounterVec::new(
        Opts::new(
            "kkp_quota_webhook_wake_checks_total",
            "Waiting owners checked against their project's room, by whether their Machine now fits (fits, no_room)",
        ),
        &["result"],
    )?;
    let waiting_owners = IntGauge::new(
        "kkp_quota_webhook_waiting_owners",
        "Owners of Machines refused for room in the last hour, remembered to be woken when room appears",
    )?;
    for result in ["sent", "gone", "failed"] {
        wakes.with_label_values(&[result]);
    }
    for result in ["fits", "no_room"] {
        wake_checks.with_label_values(&[result]);
    }
    registry.register(Box::new(wakes.clone()))?;
    registry.register(Box::new(wake_checks.clone()))?;
    registry.register(Box::new(waiting_owners.clone()))?;
    Ok((wakes, wake_checks, waiting_owners))
}

#[cfg(test)]
mod tests {
    use kkp_quota_crds::Resource;

    use super::*;
    use crate::decision::GroupRefusal;

    /// Every `kkp_quota_group_denials_total` series: `(group, resource, kind, count)`.
    fn group_denials(metrics: &Metrics) -> Vec<(String, String, String, u64)> {
        let mut series = Vec::new();
        for family in metrics.registry.gather() {
            if family.name() != "kkp_quota_group_denials_total" {
                continue;
            }
            for m in family.get_metric() {
                let label = |name: &str| {
                    m.get_label()
                        .iter()
                        .find(|l| l.name() == name)
                        .map(|l| l.value().to_owned())
                        .unwrap_or_default()
                };
                // Whole counts only: each is a number of denials.
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let count = m.get_counter().get_value() as u64;
                series.push((label("group"), label("resource"), label("kind"), count));
            }
        }
        series.sort();
        series
    }

    fn refusal(group: &str, resources: &[Resource]) -> GroupRefusal {
        GroupRefusal {
            group: group.into(),
            resources: resources.to_vec(),
        }
    }

    #[test]
    fn a_denial_counts_every_group_and_resource_it_names_and_no_other() {
        let metrics = Metrics::new().unwrap();
        // A denial for the project's own quota names no group: nothing is counted.
        metrics.record(
            Subject::Machine,
            &Verdict::deny(Reason::QuotaExceeded, "m", "needs 3 cpu"),
        );
        assert!(group_denials(&metrics).is_empty());
        // One naming two groups counts both, each for what it has no room for.
        let named = Verdict {
            refused_by_groups: vec![
                refusal("acme", &[Resource::Cpu, Resource::Memory]),
                refusal("team", &[Resource::Cpu]),
            ],
            ..Verdict::deny(Reason::QuotaExceeded, "m", "needs 3 cpu")
        };
        metrics.record(Subject::Machine, &named);
        metrics.record(Subject::Machine, &named);
        let cluster = Verdict {
            refused_by_groups: vec![refusal("acme", &[Resource::Clusters])],
            ..Verdict::deny_subject(Subject::Cluster, Reason::QuotaExceeded, "c", "cannot be created")
        };
        metrics.record(Subject::Cluster, &cluster);
        // An admission counts nothing, whatever it carries.
        let allowed = Verdict {
            refused_by_groups: vec![refusal("team", &[Resource::Cpu])],
            ..Verdict::allow(Reason::Fits)
        };
        metrics.record(Subject::Deployment, &allowed);
        let series = |g: &str, r: &str, k: &str, n| (g.to_owned(), r.to_owned(), k.to_owned(), n);
        assert_eq!(
            group_denials(&metrics),
            vec![
                series("acme", "clusters", "cluster", 1),
                series("acme", "cpu", "machine", 2),
                series("acme", "memory", "machine", 2),
                series("team", "cpu", "machine", 2),
            ]
        );
        // The admissions themselves are counted as before.
        assert_eq!(metrics.answered(Some("denied")), 3);
    }
}
