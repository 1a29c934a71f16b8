//! `QuotaGroup` (`kkp-quota.dev/v1alpha1`, cluster-scoped, on the master): one limit over every
//! KKP `Project` a label selector picks (a customer, a team, a user; issue #36, docs/groups.md).
//!
//! master-controller keeps its status (the projects selected, their usage together, by project
//! and by seed, their quota limits added up, and conditions) from the members' quotas. In
//! `allocation` mode the limit caps the sum of the projects' quota limits, enforced by
//! master-controller's webhook on quota edits; in `shared` mode (the default) it caps their
//! usage, through budgets: each member project's seeds get shares within the project's budget
//! of the group (`status.budgets`, docs/groups.md "Shared mode").

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::project_quota::GrantRecord;
use crate::resources::ResourceDetails;

/// A limit over several projects.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "kkp-quota.dev",
    version = "v1alpha1",
    kind = "QuotaGroup",
    plural = "quotagroups",
    shortname = "qgroup",
    status = "QuotaGroupStatus",
    printcolumn = r#"{"name":"Projects","type":"integer","jsonPath":".status.projectCount"}"#,
    printcolumn = r#"{"name":"CPU used","type":"string","jsonPath":".status.usage.cpu"}"#,
    printcolumn = r#"{"name":"CPU limit","type":"string","jsonPath":".spec.quota.cpu"}"#,
    printcolumn = r#"{"name":"Memory used","type":"string","jsonPath":".status.usage.memory"}"#,
    printcolumn = r#"{"name":"Memory limit","type":"string","jsonPath":".spec.quota.memory"}"#,
    printcolumn = r#"{"name":"CPU reserved","type":"string","jsonPath":".status.reserved.cpu","priority":1}"#,
    printcolumn = r#"{"name":"Memory reserved","type":"string","jsonPath":".status.reserved.memory","priority":1}"#,
    printcolumn = r#"{"name":"Storage used","type":"string","jsonPath":".status.usage.storage","priority":1}"#,
    printcolumn = r#"{"name":"Storage limit","type":"string","jsonPath":".spec.quota.storage","priority":1}"#,
    printcolumn = r#"{"name":"Clusters","type":"string","jsonPath":".status.usage.clusters","priority":1}"#,
    printcolumn = r#"{"name":"Clusters limit","type":"string","jsonPath":".spec.quota.clusters","priority":1}"#,
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.mode","priority":1}"#,
    printcolumn = r#"{"name":"CPU allocated","type":"string","jsonPath":".status.allocated.cpu","priority":1}"#,
    printcolumn = r#"{"name":"Over","type":"string","jsonPath":".status.conditions[?(@.type==\"QuotaExceeded\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct QuotaGroupSpec {
    /// The KKP `Project`s the group covers, by their labels. Never empty: an empty selector
    /// would select every project.
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)",
        "message": "selector must select by at least one label (an empty selector would select every project)"
    }, {
        "rule": "!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist'] && ((e.operator in ['In', 'NotIn']) == (has(e.values) && size(e.values) > 0)))",
        "message": "each matchExpressions operator must be In, NotIn, Exists or DoesNotExist, with values for In and NotIn only"
    }]))]
    pub selector: LabelSelector,
    /// The limit over all selected projects together; absent resources are unlimited.
    #[serde(default)]
    pub quota: ResourceDetails,
    /// What the limit caps: `shared` (the default), what the projects use together; or
    /// `allocation`, the sum of the projects' quota limits (a webhook on the master refuses a
    /// quota edit that would take the sum over it).
    #[serde(default)]
    pub mode: GroupMode,
    /// Users and groups who may edit the quotas of the group's projects within the allocation
    /// (with the `kkp-quota-group-owner` `ClusterRole`), and no other project's. Not Kubernetes'
    /// own (`system:...`): every component and admin would be held to the group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "size(self) == 0 || self.all(o, o.kind in ['User', 'Group'] && size(o.name) > 0 && !o.name.startsWith('system:'))",
        "message": "each owner is a User or a Group, with a name that is not one of Kubernetes' own (system:...)"
    }]))]
    pub owners: Vec<GroupOwner>,
}

/// What a group's limit caps.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum GroupMode {
    /// What the selected projects use together, enforced through each project's budget of it.
    #[default]
    Shared,
    /// The sum of the selected projects' quota limits, enforced when quotas are edited.
    Allocation,
}

/// A user or group of the API server's authentication, as in an RBAC subject.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct GroupOwner {
    /// `User` or `Group`.
    pub kind: String,
    pub name: String,
}

impl GroupOwner {
    /// Whether the requester `username`, a member of `groups`, is this owner.
    pub fn is(&self, username: &str, groups: &[String]) -> bool {
        match self.kind.as_str() {
            "User" => self.name == username,
            "Group" => groups.contains(&self.name),
            _ => false,
        }
    }
}

/// Written by master-controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotaGroupStatus {
    /// The projects the selector picks now, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub projects: Vec<String>,
    /// How many projects it picks (for the printer column).
    #[serde(default)]
    pub project_count: u32,
    /// What the selected projects use together, over every seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<ResourceDetails>,
    /// The selected projects' quota limits added up (what an `allocation` group caps); a
    /// resource is absent when some project has no limit on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated: Option<ResourceDetails>,
    /// What the selected projects' cluster autoscalers may still add together (their quotas'
    /// `status.reserved`), shown beside `usage`, not counted in it; absent when none reports any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved: Option<ResourceDetails>,
    /// Each selected project's usage, over every seed, from its quota in force (projects without
    /// one, or whose quota has no usage yet, are absent: see the `ProjectsUncounted` condition).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub by_project: Vec<NamedUsage>,
    /// What the selected projects use together on each seed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub by_seed: Vec<NamedUsage>,
    /// `Enforced`, `QuotaExceeded`, `AllocationExceeded`, `SeedsStale`, `ProjectsUncounted`,
    /// `SelectorInvalid`, `GrantsHeld`
    /// (docs/groups.md), every one always present.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// A `shared` group's record of its projects' budgets (docs/groups.md, "Shared mode"):
    /// written only with compare-and-swap, and read by each project's share round.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budgets: Option<BudgetRecord>,
}

/// The persisted budgets of a group's projects: the share protocol one level up.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BudgetRecord {
    /// Bumped by every write of the record; projects take only newer versions.
    pub version: u64,
    /// Set while the record grants nothing yet (a member has not reported, or holds no word of
    /// the record's epoch) and what every member is known to hold fits the group's limit: a
    /// member never granted budget here then keeps the shares its seeds hold, nothing more, and
    /// asks for them as its first budget, instead of giving them up while it waits (a group
    /// made over busy projects stalled them until its first grants). Cleared by the first
    /// round that plans grants, or once the members are known to hold more than the limit.
    // Always written, `false` too: the record is written as a merge patch, which keeps a field it
    // does not carry (left out when `false`, an earlier `true` stayed stored).
    #[serde(default)]
    pub holdings_kept: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub projects: Vec<GrantRecord>,
    /// Projects that left the group after a word of it that kept holdings counted them at
    /// something, each with that count (`counted`; granted nothing): a project may still act
    /// on such a word (its master reads the group through a cache that lags), also once it is
    /// selected again, so its new entry starts from it
    /// (`shares::group::remembered_on_leaving`). One small entry per such project; never
    /// pruned (a project deleted leaves its entry).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub departed: Vec<GrantRecord>,
}

/// A project's or a seed's usage.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamedUsage {
    pub name: String,
    #[serde(default)]
    pub usage: ResourceDetails,
}
