//! `ProjectQuota` (`kkp-quota.dev/v1alpha1`, cluster-scoped, on the master): this system's side
//! of one project's quota, beside KKP's `ResourceQuota` of the same name.
//!
//! - `spec.quota`: limits KKP's quota cannot express (`gpu`, `machines`), or stricter ones for
//!   KKP's resources. Admins edit it; per resource the lower of KKP's and this one applies.
//! - `status`: the effective limits, the usage of every resource summed over all seeds, each
//!   seed's usage, and the conditions (`SeedsStale`, `QuotaExceeded`, `SeedCleanupPending`).
//!   Written by master-controller.
//!
//! master-controller creates it for every KKP `ResourceQuota` (owned by it, so it goes with
//! it); one made by an admin beforehand is adopted. One without a KKP `ResourceQuota` limits
//! nothing.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::quota_ledger::LedgerSubject;
use crate::resources::ResourceDetails;
use crate::rollout::RolloutAllowance;

/// The project's quota as this system sees it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "kkp-quota.dev",
    version = "v1alpha1",
    kind = "ProjectQuota",
    plural = "projectquotas",
    // `kubectl get resourcequotas` means Kubernetes' own core ResourceQuota; this is unambiguous.
    shortname = "pquota",
    status = "ProjectQuotaStatus",
    printcolumn = r#"{"name":"Subject","type":"string","jsonPath":".spec.subject.name"}"#,
    printcolumn = r#"{"name":"CPU used","type":"string","jsonPath":".status.globalUsage.cpu"}"#,
    printcolumn = r#"{"name":"CPU limit","type":"string","jsonPath":".status.limits.cpu"}"#,
    printcolumn = r#"{"name":"Memory used","type":"string","jsonPath":".status.globalUsage.memory"}"#,
    printcolumn = r#"{"name":"Memory limit","type":"string","jsonPath":".status.limits.memory"}"#,
    printcolumn = r#"{"name":"CPU free","type":"string","jsonPath":".status.free.cpu","priority":1}"#,
    printcolumn = r#"{"name":"Memory free","type":"string","jsonPath":".status.free.memory","priority":1}"#,
    printcolumn = r#"{"name":"CPU reserved","type":"string","jsonPath":".status.reserved.cpu","priority":1}"#,
    printcolumn = r#"{"name":"Memory reserved","type":"string","jsonPath":".status.reserved.memory","priority":1}"#,
    printcolumn = r#"{"name":"Storage used","type":"string","jsonPath":".status.globalUsage.storage","priority":1}"#,
    printcolumn = r#"{"name":"Storage limit","type":"string","jsonPath":".status.limits.storage","priority":1}"#,
    printcolumn = r#"{"name":"Clusters","type":"string","jsonPath":".status.globalUsage.clusters","priority":1}"#,
    printcolumn = r#"{"name":"Clusters limit","type":"string","jsonPath":".status.limits.clusters","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ProjectQuotaSpec {
    /// The project. Immutable.
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "subject is immutable"}]))]
    pub subject: LedgerSubject,
    /// Limits beside KKP's quota (gpu, machines, or stricter cpu/memory/storage); absent means
    /// no further limit.
    #[serde(default)]
    pub quota: ResourceDetails,
    /// Opt-in: a surge Machine replacing one of the same `MachineDeployment` may take the
    /// project over its limit by its own size until the replaced Machine is gone
    /// (docs/architecture.md, "Rollouts at full quota"). Absent: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_allowance: Option<RolloutAllowance>,
    /// Opt-in: the room the project's cluster autoscalers may grow into (a `MachineDeployment`'s
    /// max size, less the Machines it has) counts as usage, so a deployment is admitted only if
    /// its max fits, and then its autoscaler's Machines up to that max are always admitted
    /// (docs/capacity.md, "Choosing the policy"). Absent or false: only what runs counts, and the
    /// room is shown apart (`status.reserved`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reserved_counts: bool,
}

/// Written by master-controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProjectQuotaStatus {
    /// The limits in force: per resource the lower of KKP's quota and `spec.quota`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ResourceDetails>,
    /// Usage of every resource summed over every seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_usage: Option<ResourceDetails>,
    /// The room left under each limit: `limits - globalUsage`, never below zero; unlimited
    /// resources are absent. Capacity reserved for cluster autoscalers is not taken off it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free: Option<ResourceDetails>,
    /// What the project's cluster autoscalers may still add, summed over the seeds that report
    /// it (their ledgers' `reservedUsage`): shown beside the usage, not counted in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved: Option<ResourceDetails>,
    /// Each seed's usage as last seen (`stale` when the seed cannot be reached).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub seeds: Vec<SeedFigures>,
    /// `SeedsStale`, `QuotaExceeded`, `SeedCleanupPending`, `ForeignQuotaController`,
    /// `QuotaInvalid`, `NotInForce` (docs/how-it-works.md, "Conditions").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The master's record of every seed's share (docs/shares.md). Written only with
    /// compare-and-swap, and always before any of it reaches a seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shares: Option<ShareRecord>,
}

/// The persisted grants and targets of every seed.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShareRecord {
    /// Bumped by every write of the record; seeds take only newer versions.
    pub version: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub seeds: Vec<GrantRecord>,
    /// This project's budget in each `shared` group that selects it (docs/groups.md): the
    /// group's word, what the project released, and what it reports. Written in the same
    /// compare-and-swap as the seeds' grants.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["group"]))]
    pub groups: Vec<GroupBudget>,
}

/// A project's copy of its budget in one group, and its report to the group.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupBudget {
    /// The `QuotaGroup`'s name.
    pub group: String,
    /// The version of the group's record `granted` and `target` come from.
    pub version: u64,
    /// Everything the group ever granted this project (cumulative).
    #[serde(default)]
    pub granted: ResourceDetails,
    /// The budget the group wants this project to hold.
    #[serde(default)]
    pub target: ResourceDetails,
    /// Everything this project gave back to the group (cumulative, only grows).
    #[serde(default, skip_serializing_if = "ResourceDetails::is_empty")]
    pub released: ResourceDetails,
    /// What the project's seeds commit, added up (what the group asks idle budget back above).
    #[serde(default)]
    pub committed: ResourceDetails,
    /// The absolute budget wanted while a seed waits for more than the project may grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub demand: Option<ResourceDetails>,
}

/// One holder in a record of grants: a seed in a project's [`ShareRecord`], or a member project
/// in a group's `BudgetRecord` (the same protocol one level up, docs/groups.md).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrantRecord {
    /// The seed's or the project's name.
    pub name: String,
    /// Everything ever granted to the holder (cumulative, only grows).
    #[serde(default)]
    pub granted: ResourceDetails,
    /// What the record wants the holder to hold.
    #[serde(default)]
    pub target: ResourceDetails,
    /// The newest `released` the record's writer had read from the holder when it wrote this
    /// record: a floor under the holder's own `released`, so that a copy re-created (or restored
    /// from an older backup) cannot hold again what was already counted as returned.
    #[serde(default, skip_serializing_if = "ResourceDetails::is_empty")]
    pub released: ResourceDetails,
    /// A group's record only: the most any of its words that kept holdings counted this project
    /// at (the target of a word granting it nothing while `holdingsKept`), never lowered, also
    /// once the project is granted budget or leaves the group: a project without a copy of its
    /// budget (new, its `ProjectQuota` re-created, or back in the group) may take such a word
    /// from a lagging cache and keep up to its target, so the group never counts it lower.
    #[serde(default, skip_serializing_if = "ResourceDetails::is_empty")]
    pub counted: ResourceDetails,
}

/// One seed's figures for one project.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SeedFigures {
    pub name: String,
    /// The seed's usage; absent when never seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<ResourceDetails>,
    /// The seed's reserved capacity (its ledger's `reservedUsage`); absent when it reports none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved: Option<ResourceDetails>,
    /// True when the seed cannot be reached and `usage` is the last one seen.
    #[serde(default)]
    pub stale: bool,
    /// The share of the limit the seed holds as the master last saw it (granted minus
    /// released); absent before shares are in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<ResourceDetails>,
    /// What the seed asks for while its requests wait for share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub demand: Option<ResourceDetails>,
    /// True when the seed cannot be reached: its share stays its own until it can.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stuck: bool,
}

impl ProjectQuota {
    /// The project this quota applies to.
    pub fn project(&self) -> &str {
        &self.spec.subject.name
    }
}

/// The limits in force: per resource, the lower of the two where both limit it, else the one
/// that does.
pub fn effective_limits(kkp: &ResourceDetails, ours: Option<&ResourceDetails>) -> ResourceDetails {
    let mut out = kkp.kkp_subset();
    let Some(ours) = ours else {
        return out;
    };
    for (resource, amount) in ours.iter() {
        let lower = match out.get(resource) {
            Some(kkp_amount) if kkp_amount <= amount => kkp_amount,
            _ => amount,
        };
        out.set(resource, Some(lower));
    }
    out
}

/// The conditions a `ProjectQuota` reports (`status.conditions[].type`): one vocabulary for
/// their writer (master-controller), their readers and docs/how-it-works.md, "Conditions".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuotaCondition {
    /// A seed's usage is counted from its last known view, or not known at all.
    SeedsStale,
    /// Global usage is above the limit for some resource.
    QuotaExceeded,
    /// The quota is being deleted and some seed could not delete its copy yet.
    SeedCleanupPending,
    /// Another writer (KKP Enterprise's quota controllers) writes KKP's quota usage too.
    ForeignQuotaController,
    /// KKP's quota has a limit this system cannot read exactly.
    QuotaInvalid,
    /// Another KKP quota of the same project is the one in force.
    NotInForce,
}

impl QuotaCondition {
    pub const ALL: [QuotaCondition; 6] = [
        QuotaCondition::SeedsStale,
        QuotaCondition::QuotaExceeded,
        QuotaCondition::SeedCleanupPending,
        QuotaCondition::ForeignQuotaController,
        QuotaCondition::QuotaInvalid,
        QuotaCondition::NotInForce,
    ];

    /// The condition's `type` on the wire.
    pub const fn as_str(self) -> &'static str {
        match self {
            QuotaCondition::SeedsStale => "SeedsStale",
            QuotaCondition::QuotaExceeded => "QuotaExceeded",
            QuotaCondition::SeedCleanupPending => "SeedCleanupPending",
            QuotaCondition::ForeignQuotaController => "ForeignQuotaController",
            QuotaCondition::QuotaInvalid => "QuotaInvalid",
            QuotaCondition::NotInForce => "NotInForce",
        }
    }
}

#[cfg(test)]
mod tests {
    /// Every condition is documented, each under its own name.
    #[test]
    fn every_condition_is_documented() {
        let docs = include_str!("../../docs/how-it-works.md");
        let section = docs.split("## Conditions").nth(1).expect("a Conditions section");
        let mut names: Vec<&str> = super::QuotaCondition::ALL.iter().map(|c| c.as_str()).collect();
        for name in &names {
            assert!(
                section.contains(&format!("- `{name}`")),
                "{name} is not in docs/how-it-works.md"
            );
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), super::QuotaCondition::ALL.len());
    }

    use super::*;
    use crate::{Quantity, Resource};

    fn details(pairs: &[(Resource, i64)]) -> ResourceDetails {
        let mut d = ResourceDetails::default();
        for (r, n) in pairs {
            d.set(*r, Some(Quantity::from_units(*n)));
        }
        d
    }

    #[test]
    fn the_lower_limit_wins_and_ours_adds_gpu_and_machines() {
        let kkp = details(&[(Resource::Cpu, 16), (Resource::Memory, 64), (Resource::Gpu, 9)]);
        let ours = details(&[
            (Resource::Cpu, 8),
            (Resource::Memory, 100),
            (Resource::Machines, 3),
        ]);
        let e = effective_limits(&kkp, Some(&ours));
        assert_eq!(
            e,
            details(&[
                (Resource::Cpu, 8),
                (Resource::Memory, 64),
                (Resource::Machines, 3)
            ])
        );
        assert_eq!(
            effective_limits(&kkp, None),
            details(&[(Resource::Cpu, 16), (Resource::Memory, 64)]),
            "gpu on KKP's object is not KKP's: it would be pruned, so it does not count"
        );
    }
}
