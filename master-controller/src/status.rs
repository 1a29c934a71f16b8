//! The master object's conditions. Pure; no I/O.
//!
//! - `SeedsStale`: `True` while a seed's usage is counted from its last known view (or is not
//!   known at all); the message names each seed and since when.
//! - `QuotaExceeded`: `True` while `globalUsage` is above the limit for some resource. Lowering a
//!   quota below current usage is allowed (as in KKP): nothing is deleted, new Machines that need
//!   that resource are denied until usage drops below the limit.
//! - `ForeignQuotaController`: `True` while another writer (KKP Enterprise's own resource-quota
//!   controllers) also writes the usage of KKP's `ResourceQuota`; this system then stops writing
//!   it there (it keeps enforcing), and the message says what to turn off.
//! - `SeedCleanupPending`: only while the master object is being deleted and some seed could not
//!   delete its copy yet; the finalizer stays until the seed is back or removed from the fleet.
//! - `QuotaInvalid`: only while KKP's quota has a limit this system cannot read exactly (KKP's
//!   CRD accepts `1e40` and `0.5n`); the message names each field and what to write instead.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kkp_quota_crds::project_quota::QuotaCondition;
use kkp_quota_crds::{Resource, ResourceDetails};

use crate::fold::StaleSeed;

pub const SEEDS_STALE: &str = QuotaCondition::SeedsStale.as_str();
pub const QUOTA_EXCEEDED: &str = QuotaCondition::QuotaExceeded.as_str();
pub const SEED_CLEANUP_PENDING: &str = QuotaCondition::SeedCleanupPending.as_str();
pub const FOREIGN_QUOTA_CONTROLLER: &str = QuotaCondition::ForeignQuotaController.as_str();
pub const QUOTA_INVALID: &str = QuotaCondition::QuotaInvalid.as_str();
pub const NOT_IN_FORCE: &str = QuotaCondition::NotInForce.as_str();

/// A condition without its transition time (filled in by [`merge_conditions`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub type_: &'static str,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

/// `SeedsStale` for the stale seeds of one quota.
pub fn seeds_stale(stale: &[StaleSeed]) -> Desired {
    if stale.is_empty() {
        return Desired {
            type_: SEEDS_STALE,
            status: false,
            reason: "AllSeedsSynced".into(),
            message: "every seed's usage is current".into(),
        };
    }
    let parts: Vec<String> = stale
        .iter()
        .map(|s| {
            if s.unknown {
                format!(
                    "{} not reachable since {} and its usage is not known yet (globalUsage is left unchanged until it is)",
                    s.seed,
                    s.since.strftime("%Y-%m-%dT%H:%M:%SZ")
                )
            } else {
                format!(
                    "{} unreachable since {} (its last known usage is still counted)",
                    s.seed,
                    s.since.strftime("%Y-%m-%dT%H:%M:%SZ")
                )
            }
        })
        .collect();
    Desired {
        type_: SEEDS_STALE,
        status: true,
        reason: "SeedsUnreachable".into(),
        message: parts.join("; "),
    }
}

/// The field managers, other than `ours`, that wrote `status.globalUsage` or `status.localUsage`
/// of KKP's `ResourceQuota` (from its `managedFields`): KKP Enterprise's quota controllers
/// write the same fields, and two writers would overwrite each other's figures.
pub fn foreign_usage_writers(rq: &kkp_quota_crds::ResourceQuota, ours: &[&str]) -> Vec<String> {
    let mut writers: Vec<String> = rq
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| m.manager.as_deref().is_none_or(|name| !ours.contains(&name)))
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .is_some_and(|f| !usage_fields_written(f).is_empty())
        })
        .map(|m| {
            m.manager
                .clone()
                .unwrap_or_else(|| "an unnamed writer".to_owned())
        })
        .collect();
    writers.sort();
    writers.dedup();
    writers
}

/// The usage fields of KKP's `ResourceQuota` (another quota controller writes these too).
const USAGE_FIELDS: [&str; 2] = ["f:globalUsage", "f:localUsage"];

/// Which of [`USAGE_FIELDS`] one `managedFields` entry wrote.
fn usage_fields_written(
    fields: &k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1,
) -> Vec<&'static str> {
    USAGE_FIELDS
        .into_iter()
        .filter(|field| fields.0.get("f:status").is_some_and(|s| s.get(field).is_some()))
        .collect()
}

/// Shrinks the `managedFields` of a cached KKP `ResourceQuota` to what
/// [`foreign_usage_writers`] reads: the entries that wrote its usage, each reduced to those
/// fields. Server-side apply's bookkeeping is often most of an object's size, and the master
/// caches one such object per project.
pub fn keep_usage_writers(rq: &mut kkp_quota_crds::ResourceQuota) {
    let Some(entries) = rq.metadata.managed_fields.take() else {
        return;
    };
    let kept: Vec<_> = entries
        .into_iter()
        .filter_map(|mut entry| {
            let written = usage_fields_written(entry.fields_v1.as_ref()?);
            if written.is_empty() {
                return None;
            }
            let usage: serde_json::Map<String, serde_json::Value> = written
                .into_iter()
                .map(|field| (field.to_owned(), serde_json::json!({})))
                .collect();
            entry.fields_v1 = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1(
                serde_json::json!({ "f:status": usage }),
            ));
            entry.time = None;
            Some(entry)
        })
        .collect();
    rq.metadata.managed_fields = (!kept.is_empty()).then_some(kept);
}

/// `ForeignQuotaController` for the writers [`foreign_usage_writers`] found.
pub fn foreign_quota_controller(writers: &[String]) -> Desired {
    if writers.is_empty() {
        return Desired {
            type_: FOREIGN_QUOTA_CONTROLLER,
            status: false,
            reason: "NoOtherWriter".into(),
            message: "only this system writes the usage of KKP's ResourceQuota".into(),
        };
    }
    Desired {
        type_: FOREIGN_QUOTA_CONTROLLER,
        status: true,
        reason: "OtherUsageWriter".into(),
        message: format!(
            "the usage of KKP's ResourceQuota is also written by {}, most likely KKP Enterprise's resource-quota controllers; this system has stopped writing it there (it keeps enforcing and reports usage in the ProjectQuota). Run only one: turn off KKP's quota feature, or do not install this system",
            writers.join(", ")
        ),
    }
}

/// "6 cpu used of 4 cpu" for each resource of `over`.
pub fn overrun_parts(over: &[Resource], limit: &ResourceDetails, usage: &ResourceDetails) -> Vec<String> {
    over.iter()
        .map(|&r| {
            format!(
                "{} used of {}",
                r.describe(usage.amount(r)),
                r.describe(limit.amount(r))
            )
        })
        .collect()
}

/// `QuotaExceeded`: usage above the limit for some resource.
pub fn quota_exceeded(limit: &ResourceDetails, usage: &ResourceDetails) -> Desired {
    let over = limit.overrun_by(usage);
    if over.is_empty() {
        return Desired {
            type_: QUOTA_EXCEEDED,
            status: false,
            reason: "WithinLimit".into(),
            message: "usage is within the quota".into(),
        };
    }
    let parts = overrun_parts(&over, limit, usage);
    Desired {
        type_: QUOTA_EXCEEDED,
        status: true,
        reason: "UsageAboveLimit".into(),
        message: format!(
            "usage is above the quota: {}. Lowering a quota below usage is allowed: nothing is removed, \
             but new Machines needing these resources are denied until usage drops{}",
            parts.join(", "),
            if over.iter().all(|r| r.asked_by_machines()) {
                ""
            } else {
                " (a cluster count over its limit denies new clusters, never Machines)"
            }
        ),
    }
}

/// `QuotaInvalid` for the limits of KKP's quota that cannot be read.
pub fn quota_invalid(unreadable: &[kkp_quota_crds::quota::UnreadableQuantity]) -> Desired {
    let problems: Vec<String> = unreadable
        .iter()
        .map(kkp_quota_crds::quota::UnreadableQuantity::problem)
        .collect();
    Desired {
        type_: QUOTA_INVALID,
        status: true,
        reason: "UnreadableQuantity".into(),
        message: format!(
            "{}. Nothing of this quota reaches the seeds until it is fixed: they keep the limits they \
             last had from it (none if it never had readable ones)",
            problems.join("; ")
        ),
    }
}

/// `NotInForce` for a quota of `project` while `in_force`, another of its quotas, is enforced.
pub fn not_in_force(project: &str, in_force: &str) -> Desired {
    Desired {
        type_: NOT_IN_FORCE,
        status: true,
        reason: "AnotherQuotaInForce".into(),
        message: format!(
            "project {project} has several quotas; {in_force:?}, the first by name, is the one \
             enforced, and nothing of this one reaches the seeds. Delete the quotas the project \
             should not have (or merge their limits into {in_force:?})"
        ),
    }
}

/// `SeedCleanupPending` while deleting: the seeds that still hold a copy.
pub fn cleanup_pending(seeds: &[String]) -> Desired {
    Desired {
        type_: SEED_CLEANUP_PENDING,
        status: true,
        reason: "SeedsUnreachable".into(),
        message: format!(
            "waiting for seed(s) {} to delete their copy; the finalizer stays until each is reachable again or removed from the fleet",
            seeds.join(", ")
        ),
    }
}

/// The new condition list: every desired condition, keeping `lastTransitionTime` where the status
/// did not change, and keeping conditions of other types (not ours) as they are.
pub fn merge_conditions(
    existing: &[Condition],
    desired: &[Desired],
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    let mut out: Vec<Condition> = existing
        .iter()
        .filter(|c| !desired.iter().any(|d| d.type_ == c.type_))
        .cloned()
        .collect();
    for d in desired {
        let status = if d.status { "True" } else { "False" };
        let previous = existing.iter().find(|c| c.type_ == d.type_);
        let since = match previous {
            Some(p) if p.status == status => p.last_transition_time.clone(),
            _ => Time(now),
        };
        out.push(Condition {
            type_: d.type_.to_owned(),
            status: status.to_owned(),
            reason: d.reason.clone(),
            message: d.message.clone(),
            observed_generation: generation,
            last_transition_time: since,
        });
    }
    out.sort_by(|a, b| a.type_.cmp(&b.type_));
    out
}

/// True when two condition lists say the same (ignoring order).
pub fn same_conditions(a: &[Condition], b: &[Condition]) -> bool {
    a.len() == b.len() && a.iter().all(|x| b.iter().any(|y| y == x))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kkp_quota_crds::Quantity;

    #[test]
    fn quota_invalid_names_every_unreadable_field() {
        let spec: kkp_quota_crds::ResourceQuotaSpec = serde_json::from_value(serde_json::json!({
            "subject": {"name": "demo"}, "quota": {"cpu": "1e40", "memory": "0.5n", "storage": "1Ti"},
        }))
        .unwrap();
        let c = quota_invalid(&spec.quota.unreadable);
        assert!(c.status);
        assert_eq!(c.reason, "UnreadableQuantity");
        assert!(
            c.message.starts_with("spec.quota.cpu \"1e40\" is out of range"),
            "{}",
            c.message
        );
        assert!(
            c.message
                .contains("; spec.quota.memory \"0.5n\" is finer than 1n"),
            "{}",
            c.message
        );
        assert!(!c.message.contains("storage"), "{}", c.message);
        assert!(
            c.message.contains("Nothing of this quota reaches the seeds"),
            "{}",
            c.message
        );
    }

    #[test]
    fn other_writers_of_kkps_usage_are_found() {
        let rq: kkp_quota_crds::ResourceQuota = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubermatic.k8c.io/v1", "kind": "ResourceQuota",
            "metadata": {"name": "project-a", "managedFields": [
                {"manager": "kkp-quota-master", "operation": "Update", "subresource": "status",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:globalUsage": {"f:cpu": {}}}}},
                {"manager": "kubermatic-master-controller-manager", "operation": "Update", "subresource": "status",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:globalUsage": {"f:cpu": {}}}}},
                {"manager": "kubectl", "operation": "Update",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:quota": {"f:cpu": {}}}}},
            ]},
            "spec": {"subject": {"name": "a", "kind": "project"}, "quota": {}},
        }))
        .unwrap();
        let writers = foreign_usage_writers(&rq, &["kkp-quota-master"]);
        assert_eq!(writers, ["kubermatic-master-controller-manager"]);
        let c = foreign_quota_controller(&writers);
        assert!(c.status && c.message.contains("kubermatic-master-controller-manager"));
        assert!(!foreign_quota_controller(&[]).status);
        assert!(
            foreign_usage_writers(&rq, &["kkp-quota-master", "kubermatic-master-controller-manager"])
                .is_empty()
        );
        // The cache's trimmed copy tells the same, and keeps nothing else.
        let mut trimmed = rq.clone();
        keep_usage_writers(&mut trimmed);
        for ours in [&["kkp-quota-master"][..], &["kubectl"], &[]] {
            assert_eq!(
                foreign_usage_writers(&trimmed, ours),
                foreign_usage_writers(&rq, ours)
            );
        }
        let kept = trimmed.metadata.managed_fields.unwrap();
        assert_eq!(kept.len(), 2, "the spec writer is dropped");
        assert!(kept.iter().all(
            |m| m.fields_v1.as_ref().unwrap().0 == serde_json::json!({"f:status": {"f:globalUsage": {}}})
        ));
        let mut untouched = rq.clone();
        untouched.metadata.managed_fields = None;
        keep_usage_writers(&mut untouched);
        assert!(untouched.metadata.managed_fields.is_none());
    }

    #[test]
    fn exceeded_names_each_resource_over_its_limit() {
        let limit = ResourceDetails {
            cpu: Some(Quantity::from_units(4)),
            memory: Some(Quantity::from_gibibytes(8)),
            ..ResourceDetails::default()
        };
        let usage = ResourceDetails {
            cpu: Some(Quantity::from_units(6)),
            memory: Some(Quantity::from_gibibytes(8)),
            storage: Some(Quantity::from_gibibytes(900)),
            ..ResourceDetails::default()
        };
        let d = quota_exceeded(&limit, &usage);
        assert!(d.status);
        assert!(d.message.contains("6 cpu used of 4 cpu"), "{}", d.message);
        assert!(
            !d.message.contains("memory"),
            "memory is at, not above, its limit"
        );
        assert!(!quota_exceeded(&limit, &ResourceDetails::default()).status);
        let clusters = |n| ResourceDetails {
            clusters: Some(Quantity::from_units(n)),
            ..ResourceDetails::default()
        };
        let d = quota_exceeded(&clusters(2), &clusters(3));
        assert!(d.status);
        assert!(
            d.message.contains("3 clusters used of 2 clusters"),
            "{}",
            d.message
        );
        assert!(d.message.contains("denies new clusters"), "{}", d.message);
        assert!(!quota_exceeded(&limit, &usage).message.contains("clusters"));
    }

    #[test]
    fn stale_message_names_seed_and_time() {
        let since = Timestamp::from_second(1_700_000_000).unwrap();
        let d = seeds_stale(&[StaleSeed {
            seed: "seed-b".into(),
            since,
            unknown: false,
        }]);
        assert!(d.status);
        assert!(
            d.message
                .contains("seed-b unreachable since 2023-11-14T22:13:20Z"),
            "{}",
            d.message
        );
        assert!(!seeds_stale(&[]).status);
    }

    #[test]
    fn transition_time_kept_while_status_unchanged() {
        let t0 = Timestamp::from_second(100).unwrap();
        let t1 = Timestamp::from_second(200).unwrap();
        let foreign = Condition {
            type_: "Other".into(),
            status: "True".into(),
            reason: "X".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time(t0),
        };
        let first = merge_conditions(std::slice::from_ref(&foreign), &[seeds_stale(&[])], Some(1), t0);
        assert_eq!(first.len(), 2);
        let again = merge_conditions(&first, &[seeds_stale(&[])], Some(1), t1);
        assert!(same_conditions(&first, &again));
        let stale = seeds_stale(&[StaleSeed {
            seed: "b".into(),
            since: t1,
            unknown: false,
        }]);
        let flipped = merge_conditions(&again, &[stale], Some(1), t1);
        let c = flipped.iter().find(|c| c.type_ == SEEDS_STALE).unwrap();
        assert_eq!(c.last_transition_time, Time(t1));
        assert!(flipped.contains(&foreign));
    }
}
