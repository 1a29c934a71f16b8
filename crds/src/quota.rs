//! KKP's own `kubermatic.k8c.io/v1` `ResourceQuota`, exactly in the shape KKP's CRD declares.
//!
//! KKP's operator installs and keeps reconciling this CRD on the master and every seed, and its
//! structural schema prunes every field it does not declare. So this type holds only what KKP
//! has: `spec.subject`, `spec.quota {cpu, memory, storage}` and `status.{globalUsage,
//! localUsage}`. Everything else this system needs lives in its own API group
//! ([`crate::project_quota`], [`crate::quota_ledger`]). This project never installs this CRD in
//! a real installation; only the local fleet does, in KKP's shape ([`crate::kkp_shape`]).

use std::collections::BTreeMap;

use kube::CustomResource;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::resources::{Resource, ResourceDetails};

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
/// The resources KKP's `ResourceDetails` declares; the others are this project's own.
pub const KKP_RESOURCES: &[Resource] = &[Resource::Cpu, Resource::Memory, Resource::Storage];

/// The amount of node resources a project may use, across every seed (KKP's object).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "kubermatic.k8c.io",
    version = "v1",
    kind = "ResourceQuota",
    plural = "resourcequotas",
    status = "ResourceQuotaStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct ResourceQuotaSpec {
    /// The entity the quota applies to. Immutable.
    pub subject: Subject,
    /// The maximum usage allowed; an absent resource is unlimited.
    #[serde(default)]
    pub quota: KkpQuota,
}

/// `spec.quota`: KKP's `{cpu, memory, storage}`, plus whatever newer KKP versions add there
/// (accelerators), carried unchanged to the seed copies and never dropped.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct KkpQuota {
    #[serde(flatten)]
    pub limits: ResourceDetails,
    /// Fields this project does not model; written back as they were read.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

impl KkpQuota {
    pub fn new(limits: &ResourceDetails) -> KkpQuota {
        KkpQuota {
            limits: limits.kkp_subset(),
            other: BTreeMap::new(),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Subject {
    /// The project ID.
    pub name: String,
    /// The kind of subject; only `project` exists.
    #[serde(default = "project_kind")]
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

/// KKP's status: `globalUsage` written by master-controller (master and seed copies),
/// `localUsage` by seed-controller (seed copies). Only KKP's three resources are ever written.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResourceQuotaStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_usage: Option<ResourceDetails>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_usage: Option<ResourceDetails>,
}

impl ResourceQuota {
    /// The project this quota applies to.
    pub fn project(&self) -> &str {
        &self.spec.subject.name
    }
}

impl ResourceDetails {
    /// Only the resources KKP's `ResourceDetails` declares (what KKP's CRDs keep).
    #[must_use]
    pub fn kkp_subset(&self) -> ResourceDetails {
        let mut out = ResourceDetails::default();
        for &r in KKP_RESOURCES {
            out.set(r, self.get(r));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Quantity;

    #[test]
    fn unknown_quota_fields_are_carried_unchanged() {
        let json = serde_json::json!({
            "subject": {"name": "demo", "kind": "project"},
            "quota": {"cpu": "4", "memory": "8Gi", "accelerators": [{"provider": "kubevirt", "resources": {"nvidia.com/gpu": "2"}}]},
        });
        let spec: ResourceQuotaSpec = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(spec.quota.limits.cpu, Some(Quantity::from_units(4)));
        assert!(spec.quota.other.contains_key("accelerators"));
        assert_eq!(serde_json::to_value(&spec).unwrap(), json);
    }

    #[test]
    fn the_kkp_subset_drops_only_our_own_resources() {
        let mut d = ResourceDetails::zero();
        d.cpu = Some(Quantity::from_units(2));
        let subset = d.kkp_subset();
        assert_eq!(subset.cpu, d.cpu);
        assert_eq!(subset.gpu, None);
        assert_eq!(subset.machines, None);
        assert_eq!(subset.memory, d.memory);
    }
}
