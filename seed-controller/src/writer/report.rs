//! What the writes report: the duration and error metrics of every write, the usage gauges, and
//! after a ledger write the metrics and logs of what it dropped, expired and released, and the
//! share held.

use std::time::Instant;

use kkp_quota_crds::quota_ledger::QuotaLedgerSpec;
use kkp_quota_crds::rollout::{self, RolloutSurge};
use kkp_quota_crds::shares::objects::seed_share;
use kkp_quota_crds::{QuotaLedgerStatus, Resource, ResourceDetails};
use tracing::{debug, info, warn};

use super::decision::Decision;
use crate::ledger::DropReason;
use crate::shares::Release;
use crate::usage::as_f64;
use crate::{Error, Shared};

pub(super) fn timed<T>(shared: &Shared, controller: &str, started: Instant, result: &Result<T, Error>) {
    shared
        .metrics
        .reconcile_duration
        .with_label_values(&[controller])
        .observe(started.elapsed().as_secs_f64());
    if result.is_err() {
        shared
            .metrics
            .reconcile_errors
            .with_label_values(&[controller])
            .inc();
    }
}

pub(super) fn set_usage_gauges(gauge: &prometheus::GaugeVec, prefix: &[&str], usage: &ResourceDetails) {
    for &resource in Resource::ALL {
        let mut labels: Vec<&str> = prefix.to_vec();
        labels.push(resource.name());
        gauge
            .with_label_values(&labels)
            .set(as_f64(usage.amount(resource)));
    }
}

/// The rollout surges running after a write (`kkp_quota_crds::rollout`): what they add over the
/// limit, and when the oldest becomes overdue (no series while none runs).
pub(super) fn set_surge_gauges(
    shared: &Shared,
    project: &str,
    spec: &QuotaLedgerSpec,
    surges: &[RolloutSurge],
) {
    match rollout::surge_total(surges) {
        Ok(total) => set_usage_gauges(&shared.metrics.rollout_surge, &[project], &total),
        Err(e) => warn!(%project, error = %e, "rollout surges cannot be summed"),
    }
    let overdue_after = spec
        .rollout_allowance
        .as_ref()
        .map_or(rollout::DEFAULT_OVERDUE_AFTER_SECONDS, |a| {
            a.overdue_after_seconds
        });
    match rollout::oldest(surges) {
        Some(oldest) => {
            let at = oldest
                .as_second()
                .saturating_add(i64::try_from(overdue_after).unwrap_or(i64::MAX));
            #[allow(clippy::cast_precision_loss, reason = "Unix seconds fit a float exactly")]
            shared
                .metrics
                .rollout_surge_overdue_at
                .with_label_values(&[project])
                .set(at as f64);
        }
        None => {
            let _ = shared
                .metrics
                .rollout_surge_overdue_at
                .remove_label_values(&[project]);
        }
    }
}

/// How many reservations a write dropped, by reason.
pub(super) struct Dropped {
    pub(super) counted: usize,
    pub(super) gone: usize,
    pub(super) expired: usize,
}

/// After a successful write: metrics and logs of what it dropped and released; returns the
/// reservations dropped.
pub(super) fn written(
    shared: &Shared,
    project: &str,
    spec: &QuotaLedgerSpec,
    status: &QuotaLedgerStatus,
    decision: &Decision,
    release: Option<&Release>,
) -> Dropped {
    let drops = &decision.drops;
    let count = |reason: DropReason| drops.iter().filter(|(_, r)| *r == reason).count();
    let dropped = Dropped {
        counted: count(DropReason::Counted),
        gone: count(DropReason::Gone),
        expired: count(DropReason::Expired),
    };
    shared.metrics.reservations_counted.inc_by(dropped.counted as u64);
    shared.metrics.reservations_gone.inc_by(dropped.gone as u64);
    shared.metrics.reservations_expired.inc_by(dropped.expired as u64);
    shared
        .metrics
        .allotments_expired
        .inc_by(decision.expired.len() as u64);
    for (i, reason) in drops {
        let r = &status.reservations[*i];
        match reason {
            DropReason::Expired => {
                info!(cluster = %r.cluster, uid = %r.uid, created_at = %r.created_at, "reservation expired: its Machine never appeared");
            }
            DropReason::Gone => {
                debug!(cluster = %r.cluster, uid = %r.uid, "reservation dropped: its Machine was deleted before it was counted");
            }
            DropReason::Counted => {}
        }
    }
    for &i in &decision.expired {
        let a = &status.allotments[i];
        info!(holder = %a.holder, granted = %a.granted, expires_at = %a.expires_at, "allotment expired: its holder stopped renewing it; removed");
    }
    shared
        .metrics
        .demands_expired
        .inc_by(decision.demands_expired.len() as u64);
    for &i in &decision.demands_expired {
        let d = &status.demands[i];
        debug!(holder = %d.holder, amount = %d.amount, expires_at = %d.expires_at, "share demand expired; removed");
    }
    if let Some(release) = release {
        released(shared, project, spec, status, release);
    }
    dropped
}

/// After a write that carried `release`: metrics and the log line.
fn released(
    shared: &Shared,
    project: &str,
    spec: &QuotaLedgerSpec,
    status: &QuotaLedgerStatus,
    release: &Release,
) {
    for (resource, amount) in release.amount.iter() {
        shared
            .metrics
            .share_released
            .with_label_values(&[project, resource.name()])
            .inc_by(as_f64(amount));
    }
    let written = QuotaLedgerStatus {
        released: Some(release.released.clone()),
        ..status.clone()
    };
    set_share_gauges(shared, project, spec, Some(&written));
    let held =
        seed_share(spec, Some(&written)).map(|s| kkp_quota_crds::shares::bounded_by(&spec.quota, &s.share()));
    info!(
        released = %release.amount,
        released_total = %release.released,
        held = %held.unwrap_or_default(),
        target = %spec.shares.as_ref().map(|s| s.target.clone()).unwrap_or_default(),
        why = release.why.as_str(),
        "share released"
    );
}

/// `kkp_quota_share_held` of a project: `granted - released` per limited resource while shares
/// are in force on its ledger, nothing otherwise.
pub(super) fn set_share_gauges(
    shared: &Shared,
    project: &str,
    spec: &QuotaLedgerSpec,
    status: Option<&QuotaLedgerStatus>,
) {
    let held = seed_share(spec, status).map(|s| kkp_quota_crds::shares::bounded_by(&spec.quota, &s.share()));
    for &resource in Resource::ALL {
        let labels = [project, resource.name()];
        match held.as_ref().and_then(|h| h.get(resource)) {
            Some(amount) => shared
                .metrics
                .share_held
                .with_label_values(&labels)
                .set(as_f64(amount)),
            None => {
                let _ = shared.metrics.share_held.remove_label_values(&labels);
            }
        }
    }
}
