//! The subset of KKP's `Project`, `Seed`, `Cluster` and `KubermaticSetting` this project reads or
//! writes. Unknown fields are ignored when reading, and every write is a patch of the fields we
//! own, so nothing we do not model is ever dropped. What is written is only what KKP's own CRDs
//! declare (their schemas prune everything else): see [`crate::kkp_shape`] for those shapes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

use crate::resources::ResourceDetails;

/// Label on a `Cluster` naming its project.
pub const PROJECT_ID_LABEL: &str = "project-id";
/// Secret in a cluster's namespace on the seed holding the user cluster's admin kubeconfig.
pub const ADMIN_KUBECONFIG_SECRET: &str = "admin-kubeconfig";
/// Key of the kubeconfig in KKP's kubeconfig Secrets (seed and user cluster alike).
pub const KUBECONFIG_KEY: &str = "kubeconfig";
/// Name of KKP's platform settings object.
pub const GLOBAL_SETTINGS_NAME: &str = "globalsettings";

/// A KKP project (cluster-scoped, on the master); its name is the project ID.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kubermatic.k8c.io",
    version = "v1",
    kind = "Project",
    plural = "projects",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct ProjectSpec {
    /// Human-readable name.
    #[serde(default)]
    pub name: String,
}

/// A KKP seed (namespaced, on the master).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kubermatic.k8c.io",
    version = "v1",
    kind = "Seed",
    plural = "seeds",
    schema = "disabled",
    namespaced
)]
#[serde(rename_all = "camelCase")]
pub struct SeedSpec {
    /// Reference to the Secret (key `kubeconfig`) with the seed's kubeconfig. An empty
    /// namespace means the Seed's own.
    #[serde(default)]
    pub kubeconfig: ObjectReference,
}

/// A KKP user cluster (cluster-scoped, on its seed).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kubermatic.k8c.io",
    version = "v1",
    kind = "Cluster",
    plural = "clusters",
    schema = "disabled",
    status = "ClusterStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    #[serde(default)]
    pub human_readable_name: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// `cluster-<id>`: the namespace on the seed with the user cluster's control plane.
    #[serde(default)]
    pub namespace_name: String,
    /// Sum of the cluster's Machines (KKP's cpu, memory and storage only). Written by
    /// seed-controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_usage: Option<ResourceDetails>,
    /// KKP keeps cluster conditions as a map keyed by condition type.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub conditions: BTreeMap<String, ClusterCondition>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterCondition {
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Required by KKP's schema: the version of the component that set the condition.
    #[serde(default)]
    pub kubermatic_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl Cluster {
    pub fn project_id(&self) -> Option<&str> {
        self.metadata
            .labels
            .as_ref()?
            .get(PROJECT_ID_LABEL)
            .map(String::as_str)
    }

    /// The namespace holding the admin kubeconfig: `status.namespaceName`, else KKP's default.
    pub fn control_plane_namespace(&self) -> String {
        match &self.status {
            Some(status) if !status.namespace_name.is_empty() => status.namespace_name.clone(),
            _ => format!("cluster-{}", self.metadata.name.as_deref().unwrap_or_default()),
        }
    }
}

/// KKP's platform settings (`globalsettings`, cluster-scoped, on the master).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kubermatic.k8c.io",
    version = "v1",
    kind = "KubermaticSetting",
    plural = "kubermaticsettings",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct KubermaticSettingSpec {
    /// The quota every project without a quota of its own gets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_quota: Option<DefaultProjectResourceQuota>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct DefaultProjectResourceQuota {
    /// Read leniently, like a `ResourceQuota`'s: a value this project cannot hold exactly lands
    /// in [`crate::KkpQuota::unreadable`] instead of failing the whole listing of settings.
    #[serde(default)]
    pub quota: crate::quota::KkpQuota,
}
