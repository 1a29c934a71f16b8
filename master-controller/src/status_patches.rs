//! The status the master writes: the merge patches of a seed ledger's, a KKP copy's and a
//! `ProjectQuota`'s `/status`, each `None` (or a remembered reading) when nothing would change.
//! Pure; the writes are in `reconcile` and `seed_writes`, the figures from `fold` and `status`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kkp_quota_crds::project_quota::SeedFigures;
use kkp_quota_crds::{ProjectQuota, Quantity, Resource, ResourceDetails};
use serde_json::{Value, json};

use crate::fingerprint::Fingerprint;
use crate::seed_ledger::SeedLedger;

/// The merge patch of a seed ledger's `/status`, or `None` when nothing changed: the other
/// seeds' usage (`None`: not known, the status is left alone). The ledger's own `globalUsage`
/// is not written (its readers add their seed's fresher `localUsage` to `otherSeedsUsage`): a
/// change of one seed's usage then rewrites only the other seeds' ledgers, not its own too, as
/// each such write is a large object sent to every watcher of the seed. One an older master
/// wrote is removed at the first fold after an upgrade, so that no stale figure is left to
/// read. Nothing is written either where the field is absent and the others use nothing: every
/// reader takes an absent one as none (`globalUsage - localUsage`, and there is no
/// `globalUsage`), and most projects use nothing on most seeds, so a fleet's cold start skips
/// most of these writes.
pub fn ledger_status_patch(ledger: &SeedLedger, others: Option<&ResourceDetails>) -> Option<Value> {
    let others = others?;
    let changed = match &ledger.other_seeds_usage {
        Some(current) => current != others,
        None => others.iter().any(|(_, q)| !q.is_zero()),
    };
    if !changed && !ledger.has_global_usage {
        return None;
    }
    let mut patch = serde_json::Map::new();
    patch.insert("otherSeedsUsage".into(), json!(others));
    if ledger.has_global_usage {
        patch.insert("globalUsage".into(), Value::Null);
    }
    Some(json!({ "status": patch }))
}

/// The merge patch of `status.globalUsage` on a KKP `ResourceQuota` (KKP's resources only), or
/// `None` when `current` already says so.
pub fn kkp_status_patch(
    current: Option<&ResourceDetails>,
    global: Option<&ResourceDetails>,
) -> Option<Value> {
    let global = global?.kkp_subset();
    (current.map(ResourceDetails::kkp_subset).as_ref() != Some(&global))
        .then(|| json!({ "status": { "globalUsage": global } }))
}

/// `globalUsage` on a KKP `ResourceQuota` as KKP's readers take it: its resources only, and one
/// absent as none used (KKP's Go reads a nil quantity as zero).
fn kkp_usage_as_read(details: Option<&ResourceDetails>) -> ResourceDetails {
    let mut read = ResourceDetails::default();
    for &r in kkp_quota_crds::quota::KKP_RESOURCES {
        read.set(r, Some(details.and_then(|d| d.get(r)).unwrap_or(Quantity::ZERO)));
    }
    read
}

/// What a seed's KKP copy says to KKP about usage (`status.globalUsage` as read), remembered
/// instead of the figure. A copy whose reading already matches needs no write: a copy just
/// created, with no status, already says "nothing used", which is what most projects use on
/// most seeds.
pub fn kkp_copy_reading(global_usage: Option<&ResourceDetails>) -> Fingerprint {
    Fingerprint::of(&json!(kkp_usage_as_read(global_usage)))
}

/// The merge patch of a seed's KKP copy's `/status` for `global`, with its reading: every one of
/// KKP's resources written, a zero too, so none is left from an earlier figure.
pub fn kkp_copy_status_patch(global: &ResourceDetails) -> (Fingerprint, Value) {
    let read = kkp_usage_as_read(Some(global));
    (
        Fingerprint::of(&json!(read)),
        json!({ "status": { "globalUsage": read } }),
    )
}

/// What master-controller writes into a `ProjectQuota`'s status.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ProjectFigures {
    pub limits: ResourceDetails,
    /// `None` when a seed's usage is unknown: the field is left as it is.
    pub global: Option<ResourceDetails>,
    /// The room left under the limits, once the global usage is known (`None`: left as it is).
    pub free: Option<ResourceDetails>,
    /// The seeds' reserved capacity summed; `None` when no seed reports any.
    pub reserved: Option<ResourceDetails>,
    pub seeds: Vec<SeedFigures>,
    pub conditions: Vec<Condition>,
}

/// Amounts as a merge-patch value that replaces the ones there: a resource absent here is `null`,
/// so that a limit removed (or its room) goes instead of staying from before.
fn replacing(details: &ResourceDetails) -> Value {
    Resource::ALL
        .iter()
        .map(|&r| {
            let amount = details.get(r).map_or(Value::Null, |q| Value::String(r.amount(q)));
            (r.name().to_owned(), amount)
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// The merge patch of a `ProjectQuota`'s `/status`, or `None` when nothing changed.
pub fn project_quota_status_patch(pq: &ProjectQuota, figures: &ProjectFigures) -> Option<Value> {
    let status = pq.status.clone().unwrap_or_default();
    let mut patch = serde_json::Map::new();
    if status.limits.as_ref() != Some(&figures.limits) {
        patch.insert("limits".into(), replacing(&figures.limits));
    }
    if let Some(g) = &figures.global
        && status.global_usage.as_ref() != Some(g)
    {
        patch.insert("globalUsage".into(), json!(g));
    }
    if let Some(free) = &figures.free
        && status.free.as_ref() != Some(free)
    {
        patch.insert("free".into(), replacing(free));
    }
    if status.reserved != figures.reserved {
        patch.insert("reserved".into(), json!(figures.reserved));
    }
    if status.seeds != figures.seeds {
        patch.insert("seeds".into(), json!(figures.seeds));
    }
    if !crate::status::same_conditions(&status.conditions, &figures.conditions) {
        patch.insert("conditions".into(), json!(figures.conditions));
    }
    (!patch.is_empty()).then(|| json!({ "status": patch }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fanout::tests::{limits, master};
    use crate::fanout::{Policies, ledger_apply_body};
    use kkp_quota_crds::fixtures::cpu;
    use kkp_quota_crds::{QuotaLedger, QuotaLedgerStatus};

    #[test]
    fn status_patches_only_when_changed() {
        let mut ledger: QuotaLedger = serde_json::from_value(ledger_apply_body(
            &master(),
            &limits(4),
            None,
            Policies::rollout_only(None),
        ))
        .unwrap();
        let g = ResourceDetails::zero();
        // Absent reads as none: nothing to write while the others use nothing.
        let new = SeedLedger::from(&ledger);
        assert_eq!(ledger_status_patch(&new, Some(&g)), None);
        assert_eq!(ledger_status_patch(&new, Some(&ResourceDetails::default())), None);
        let patch = ledger_status_patch(&new, Some(&cpu(2))).unwrap();
        assert_eq!(patch, json!({"status": {"otherSeedsUsage": cpu(2)}}));
        ledger.status = Some(QuotaLedgerStatus {
            other_seeds_usage: Some(g.clone()),
            ..QuotaLedgerStatus::default()
        });
        let current = SeedLedger::from(&ledger);
        assert_eq!(ledger_status_patch(&current, Some(&g)), None);
        assert_eq!(ledger_status_patch(&current, None), None);
        assert!(ledger_status_patch(&current, Some(&cpu(1))).is_some());
        // An older master's ledger with a globalUsage and no otherSeedsUsage: written, even
        // with none used elsewhere (its readers would take globalUsage - localUsage).
        ledger.status = Some(QuotaLedgerStatus {
            global_usage: Some(cpu(3)),
            ..QuotaLedgerStatus::default()
        });
        let patch = ledger_status_patch(&SeedLedger::from(&ledger), Some(&g)).unwrap();
        assert_eq!(
            patch,
            json!({"status": {"otherSeedsUsage": g, "globalUsage": null}})
        );
        // An older master's globalUsage goes at the first fold that knows the others' usage,
        // whether it changed or not.
        ledger.status = Some(QuotaLedgerStatus {
            global_usage: Some(cpu(3)),
            other_seeds_usage: Some(g.clone()),
            ..QuotaLedgerStatus::default()
        });
        let older = SeedLedger::from(&ledger);
        assert_eq!(ledger_status_patch(&older, None), None);
        let patch = ledger_status_patch(&older, Some(&g)).unwrap();
        assert_eq!(
            patch,
            json!({"status": {"otherSeedsUsage": g, "globalUsage": null}})
        );
        let patch = ledger_status_patch(&older, Some(&cpu(1))).unwrap();
        assert_eq!(
            patch,
            json!({"status": {"otherSeedsUsage": cpu(1), "globalUsage": null}})
        );
        // KKP's status: only cpu, memory, storage are written, and compared.
        let patch = kkp_status_patch(None, Some(&g)).unwrap();
        assert!(patch["status"]["globalUsage"].get("machines").is_none());
        assert_eq!(kkp_status_patch(Some(&g.kkp_subset()), Some(&g)), None);
        assert_eq!(kkp_status_patch(None, None), None);
    }

    /// A copy with no `globalUsage` already says "nothing used" to KKP, so the zero a cold start
    /// folds is not written onto it; any use is.
    #[test]
    fn kkp_reads_an_absent_usage_as_none_used() {
        let zero = ResourceDetails {
            cpu: Some(Quantity::ZERO),
            memory: Some(Quantity::ZERO),
            storage: Some(Quantity::ZERO),
            machines: Some(Quantity::ZERO),
            ..ResourceDetails::default()
        };
        assert_eq!(kkp_copy_reading(None), kkp_copy_reading(Some(&zero)));
        assert_eq!(
            kkp_copy_reading(Some(&ResourceDetails::default())),
            kkp_copy_reading(Some(&zero))
        );
        // Machines are not KKP's: a count there is nothing KKP reads.
        let machines = ResourceDetails {
            machines: Some(Quantity::from_units(2)),
            ..zero.clone()
        };
        assert_eq!(kkp_copy_reading(Some(&machines)), kkp_copy_reading(None));
        assert_ne!(kkp_copy_reading(Some(&cpu(1))), kkp_copy_reading(None));
        // The patch writes that reading, a zero for what is not used, and says so.
        let (reading, patch) = kkp_copy_status_patch(&cpu(1));
        assert_eq!(reading, kkp_copy_reading(Some(&cpu(1))));
        assert_eq!(patch["status"]["globalUsage"]["storage"], json!("0"));
        assert!(patch["status"]["globalUsage"].get("machines").is_none());
    }

    /// A limit removed goes from `status.limits` and `status.free` (a merge patch keeps what it
    /// does not name), and the room is the limit minus the global usage.
    #[test]
    fn a_removed_limit_goes_from_the_status() {
        let mut pq = ProjectQuota::new(
            "project-demo",
            kkp_quota_crds::ProjectQuotaSpec {
                subject: kkp_quota_crds::LedgerSubject::project("demo"),
                quota: ResourceDetails::default(),
                rollout_allowance: None,
                reserved_counts: false,
            },
        );
        let mut both = limits(4);
        both.set(Resource::Memory, Some(Quantity::from_gibibytes(8)));
        pq.status = Some(kkp_quota_crds::ProjectQuotaStatus {
            limits: Some(both.clone()),
            free: Some(both),
            ..kkp_quota_crds::ProjectQuotaStatus::default()
        });
        let mut used = ResourceDetails::zero();
        used.set(Resource::Cpu, Some(Quantity::from_units(1)));
        let figures = ProjectFigures {
            limits: limits(4),
            global: Some(used.clone()),
            free: Some(kkp_quota_crds::fit::room(&limits(4), &used)),
            reserved: None,
            seeds: Vec::new(),
            conditions: Vec::new(),
        };
        let patch = project_quota_status_patch(&pq, &figures).unwrap();
        assert_eq!(patch["status"]["limits"]["cpu"], "4");
        assert_eq!(
            patch["status"]["limits"].get("memory"),
            Some(&Value::Null),
            "{patch}"
        );
        assert_eq!(patch["status"]["free"]["cpu"], "3");
        assert_eq!(
            patch["status"]["free"].get("memory"),
            Some(&Value::Null),
            "{patch}"
        );
    }
}
