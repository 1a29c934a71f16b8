//! machine-controller's `cluster.k8s.io/v1alpha1` `Machine`, as far as sizing needs it.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A node of a user cluster. Only the provider spec is modelled; the CRD keeps every other field.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cluster.k8s.io",
    version = "v1alpha1",
    kind = "Machine",
    plural = "machines",
    namespaced
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct MachineSpec {
    #[serde(default)]
    pub provider_spec: ProviderSpecHolder,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct ProviderSpecHolder {
    /// Free JSON: `{cloudProvider, cloudProviderSpec, operatingSystem, ...}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_object")]
    pub value: Option<Value>,
}

impl Machine {
    /// `spec.providerSpec.value`, if the Machine has one.
    pub fn provider_spec(&self) -> Option<&Value> {
        self.spec.provider_spec.value.as_ref()
    }
}

/// Any JSON object, kept verbatim at every depth (machine-controller's CRD does the same): a
/// schema with `additionalProperties` would make the API server prune nested objects such as
/// `cloudProviderSpec`.
fn free_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "nullable": true,
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// A provider setting given as `{value, secretKeyRef, configMapKeyRef}` (the other form is a plain
/// JSON value); provider-sizes reads both.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConfigValueRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<GlobalKeyRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<GlobalKeyRef>,
}

/// machine-controller's `GlobalSecretKeySelector` / `GlobalConfigMapKeySelector`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct GlobalKeyRef {
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub key: String,
}

/// machine-controller's `MachineSet`, as far as the local fleet needs it: an owner of Machines
/// (a stand-in; nothing of its spec is read, and the CRD keeps every field).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cluster.k8s.io",
    version = "v1alpha1",
    kind = "MachineSet",
    plural = "machinesets",
    namespaced
)]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct MachineSetSpec {}

/// machine-controller's `MachineDeployment`, as far as this project reads it: the owner of
/// `MachineSet`s, and for the capacity reserved for the cluster autoscaler (`crate::reserved`)
/// its replica count and the template its Machines are made from. The CRD keeps every other
/// field.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cluster.k8s.io",
    version = "v1alpha1",
    kind = "MachineDeployment",
    plural = "machinedeployments",
    namespaced
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct MachineDeploymentSpec {
    /// Absent means 1, as machine-controller defaults it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default)]
    pub template: MachineTemplate,
}

/// A `MachineDeployment`'s template: the spec each of its Machines gets.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct MachineTemplate {
    #[serde(default)]
    pub spec: MachineSpec,
}

/// machine-controller's API group.
pub const GROUP: &str = "cluster.k8s.io";

/// The controller owner of `kind` in machine-controller's group among `owners`: the one a
/// Machine (or `MachineSet`) belongs to. Seed-controller counts a Machine as a member of a
/// deployment's room, and the webhook admits it from that room, only by this chain.
pub fn controller_ref<'a>(
    owners: &'a [k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference],
    kind: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    owners.iter().find(|o| {
        o.kind == kind
            && o.controller == Some(true)
            && o.api_version.split_once('/').is_some_and(|(g, _)| g == GROUP)
    })
}

impl MachineDeployment {
    /// The replicas it asks for (absent: 1; a negative count, which the API refuses, as 0).
    pub fn replicas(&self) -> u32 {
        self.spec.replicas.map_or(1, |r| u32::try_from(r).unwrap_or(0))
    }

    /// One Machine as its template makes it, for sizing.
    pub fn template_machine(&self) -> Machine {
        Machine::new(
            &self.metadata.name.clone().unwrap_or_default(),
            self.spec.template.spec.clone(),
        )
    }
}
