//! `QuotaView` (`kkp-quota.dev/v1alpha1`, cluster-scoped, in every user cluster): the project's
//! quota as the people who create Machines there may read it. The limits in force, what the
//! project uses over all seeds (admitted Machines included), the room left, what each of the
//! project's clusters on this seed uses, and when this was last confirmed.
//!
//! Written by the seed's seed-controller, which installs this CRD in the user cluster and a
//! `ClusterRole` that lets every authenticated user get, list and watch it; nobody else is given
//! write access. A CRD rather than a `ConfigMap` in `kube-public` so that `kubectl get quotaviews`
//! prints the numbers at a glance (printer columns), and so that its fields are typed and
//! validated.

use jiff::Timestamp;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::resources::ResourceDetails;

/// The view of one project's quota, in a cluster of that project.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "kkp-quota.dev",
    version = "v1alpha1",
    kind = "QuotaView",
    plural = "quotaviews",
    shortname = "qview",
    status = "QuotaViewStatus",
    printcolumn = r#"{"name":"Project","type":"string","jsonPath":".spec.project"}"#,
    printcolumn = r#"{"name":"CPU used","type":"string","jsonPath":".status.used.cpu"}"#,
    printcolumn = r#"{"name":"CPU limit","type":"string","jsonPath":".status.limits.cpu"}"#,
    printcolumn = r#"{"name":"Memory used","type":"string","jsonPath":".status.used.memory"}"#,
    printcolumn = r#"{"name":"Memory limit","type":"string","jsonPath":".status.limits.memory"}"#,
    printcolumn = r#"{"name":"Storage used","type":"string","jsonPath":".status.used.storage","priority":1}"#,
    printcolumn = r#"{"name":"Storage limit","type":"string","jsonPath":".status.limits.storage","priority":1}"#,
    printcolumn = r#"{"name":"CPU reserved","type":"string","jsonPath":".status.autoscalerReserved.cpu","priority":1}"#,
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"Confirmed","type":"date","jsonPath":".status.confirmedAt"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct QuotaViewSpec {
    /// The project (KKP's project ID) the cluster belongs to.
    pub project: String,
}

/// Written by seed-controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotaViewStatus {
    /// Whether the numbers can be trusted now.
    pub state: ViewState,
    /// Why the view is not `Current`, in a sentence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The limits in force; an absent resource is unlimited.
    #[serde(default)]
    pub limits: ResourceDetails,
    /// What the project uses over every seed, Machines admitted and not counted yet included.
    #[serde(default)]
    pub used: ResourceDetails,
    /// What the project's cluster autoscalers on this seed may still add (its ledger's
    /// `reservedUsage`), beside `used`: not counted in it, nor taken from `free`; under
    /// `reservedCounts`, held for them inside `used`.
    #[serde(default, skip_serializing_if = "ResourceDetails::is_empty")]
    pub autoscaler_reserved: ResourceDetails,
    /// The project's policy `reservedCounts`: the autoscalers' room counts in `used`
    /// (docs/capacity.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reserved_counts: bool,
    /// The room left under each limit (`limits - used`, never below zero).
    #[serde(default)]
    pub free: ResourceDetails,
    /// What each of the project's clusters on this seed uses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<ClusterUse>,
    /// What the project's clusters on other seeds use together, as last reported.
    #[serde(default)]
    pub other_seeds: ResourceDetails,
    /// When seed-controller last confirmed these numbers against the seed; it does so at least
    /// every few minutes while it can, so an old time means nobody keeps this view any more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub confirmed_at: Option<Timestamp>,
}

/// One cluster's usage.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterUse {
    pub cluster: String,
    pub usage: ResourceDetails,
}

/// Whether the view's numbers can be trusted now.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ViewState {
    /// Confirmed against the seed now.
    #[default]
    Current,
    /// The project's quota is on this seed but its usage is not counted yet.
    Counting,
    /// The seed cannot be read now: the numbers are as they were when last confirmed.
    Stale,
    /// The project has no quota: nothing limits its Machines.
    NoQuota,
}
