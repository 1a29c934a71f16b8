//! `kubermatic.k8c.io/v1` `ResourceQuota`: wire-compatible with KKP, plus additive status fields.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::resources::ResourceDetails;

/// Label with the project ID a quota applies to (how KKP looks quotas up, never by name).
pub const SUBJECT_NAME_LABEL: &str = "subject-name";
/// Label with the subject kind (`project`).
pub const SUBJECT_KIND_LABEL: &str = "subject-kind";
/// Label set to `"true"` on quotas made from the platform default.
pub const DEFAULT_QUOTA_LABEL: &str = "kkp-default-resource-quota";
/// Finalizer on the master object: seed copies are deleted first.
pub const SEED_CLEANUP_FINALIZER: &str = "kubermatic.k8c.io/cleanup-seed-resource-quota";
/// The only subject kind KKP has.
pub const PROJECT_KIND: &str = "project";

/// The amount of node resources a project may use, across every seed.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "kubermatic.k8c.io",
    version = "v1",
    kind = "ResourceQuota",
    plural = "resourcequotas",
    // `kubectl get resourcequotas` means Kubernetes' own core ResourceQuota; this is unambiguous.
    shortname = "pquota",
    status = "ResourceQuotaStatus",
    printcolumn = r#"{"name":"Subject","type":"string","jsonPath":".spec.subject.name"}"#,
    printcolumn = r#"{"name":"CPU used","type":"string","jsonPath":".status.globalUsage.cpu"}"#,
    printcolumn = r#"{"name":"CPU limit","type":"string","jsonPath":".spec.quota.cpu"}"#,
    printcolumn = r#"{"name":"Memory used","type":"string","jsonPath":".status.globalUsage.memory"}"#,
    printcolumn = r#"{"name":"Memory limit","type":"string","jsonPath":".spec.quota.memory"}"#,
    printcolumn = r#"{"name":"Storage used","type":"string","jsonPath":".status.globalUsage.storage","priority":1}"#,
    printcolumn = r#"{"name":"Storage limit","type":"string","jsonPath":".spec.quota.storage","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ResourceQuotaSpec {
    /// The entity the quota applies to. Immutable.
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "subject is immutable"}]))]
    pub subject: Subject,
    /// The maximum usage allowed; an absent resource is unlimited.
    #[serde(default)]
    pub quota: ResourceDetails,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct Subject {
    /// The project ID.
    #[schemars(length(min = 1))]
    pub name: String,
    /// The kind of subject; only `project` exists.
    #[serde(default = "project_kind")]
    #[schemars(extend("enum" = ["project"]))]
    pub kind: String,
}

fn project_kind() -> String {
    PROJECT_KIND.to_owned()
}

impl Subject {
    pub fn project(name: impl Into<String>) -> Subject {
        Subject {
            name: name.into(),
            kind: project_kind(),
        }
    }
}

/// Each field has exactly one writer (see README, "Who writes what").
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceQuotaStatus {
    /// Usage summed over every seed. Written by master-controller (on the master and on every
    /// seed copy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_usage: Option<ResourceDetails>,
    /// Usage on this seed. Written by seed-controller on the seed copy; on the master object
    /// it is not used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_usage: Option<ResourceDetails>,
    /// On a seed copy: the usage of every other seed as the master last folded it, so that the
    /// webhook can add this seed's own, fresher `localUsage`. Written by master-controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other_seeds_usage: Option<ResourceDetails>,
    /// On a seed copy: Machines admitted by the webhook and not yet counted in `localUsage`.
    /// Added by machine-webhook, removed by seed-controller when it counts the Machine, both
    /// with writes conditioned on `resourceVersion`. Written as groups: one entry per cluster,
    /// size and time, listing the UIDs of the Machines admitted so.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "crate::ledger::grouped"
    )]
    #[schemars(with = "Vec<crate::ledger::ReservationGroup>")]
    pub reservations: Vec<crate::ledger::Reservation>,
    /// On a seed copy: headroom held by webhook processes, each admitting from its own without
    /// a write per Machine. Written by machine-webhook (its holder); expired ones are removed by
    /// seed-controller.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allotments: Vec<crate::ledger::Allotment>,
    /// `Ready`, `SeedsStale`, `QuotaExceeded`, ... (see README).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

impl ResourceQuota {
    /// The project this quota applies to.
    pub fn project(&self) -> &str {
        &self.spec.subject.name
    }
}
