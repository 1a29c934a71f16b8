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
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::quantity::{Quantity, QuantityError};
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
///
/// Read leniently, one field at a time: a value KKP's CRD accepts but this project cannot read
/// exactly (`1e40`, `0.5n`) lands in [`KkpQuota::unreadable`], as written, instead of failing
/// the whole object (and with it a watch's whole listing).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KkpQuota {
    pub limits: ResourceDetails,
    /// Limits that could not be read; never taken for "no limit", written back as they were.
    pub unreadable: Vec<UnreadableQuantity>,
    /// Fields this project does not model; written back as they were read.
    pub other: BTreeMap<String, Value>,
}

impl KkpQuota {
    pub fn new(limits: &ResourceDetails) -> KkpQuota {
        KkpQuota {
            limits: limits.kkp_subset(),
            unreadable: Vec::new(),
            other: BTreeMap::new(),
        }
    }
}

impl<'de> Deserialize<'de> for KkpQuota {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut fields = BTreeMap::<String, Value>::deserialize(deserializer)?;
        let mut quota = KkpQuota::default();
        for &resource in Resource::ALL {
            match fields.remove(resource.name()) {
                None | Some(Value::Null) => {}
                Some(raw) => match quantity_of(&raw) {
                    Ok(amount) => quota.limits.set(resource, Some(amount)),
                    Err(error) => quota.unreadable.push(UnreadableQuantity { resource, raw, error }),
                },
            }
        }
        quota.other = fields;
        Ok(quota)
    }
}

impl Serialize for KkpQuota {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        for &resource in Resource::ALL {
            if let Some(amount) = self.limits.get(resource) {
                map.serialize_entry(resource.name(), &resource.amount(amount))?;
            }
        }
        for u in self
            .unreadable
            .iter()
            .filter(|u| self.limits.get(u.resource).is_none())
        {
            map.serialize_entry(u.resource.name(), &u.raw)?;
        }
        for (key, value) in &self.other {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

/// A quantity as Kubernetes writes one: a JSON string or number.
fn quantity_of(raw: &Value) -> Result<Quantity, QuantityError> {
    match raw {
        Value::String(text) => text.parse(),
        Value::Number(n) => match n.as_i64() {
            Some(units) => Ok(Quantity::from_units(units)),
            None => n.to_string().parse(),
        },
        other => Err(QuantityError::Invalid {
            text: other.to_string(),
            reason: "expected a string or a number",
        }),
    }
}

/// One limit in `spec.quota` that this project cannot read exactly.
#[derive(Clone, Debug, PartialEq)]
pub struct UnreadableQuantity {
    pub resource: Resource,
    /// The value as written.
    pub raw: Value,
    pub error: QuantityError,
}

impl UnreadableQuantity {
    /// The field's path, as `kubectl explain` names it: `spec.quota.cpu`.
    pub fn field(&self) -> String {
        format!("spec.quota.{}", self.resource.name())
    }

    /// What is wrong with the value and what to write instead.
    pub fn problem(&self) -> String {
        let raw = match &self.raw {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        let (what, instead) = match &self.error {
            QuantityError::OutOfRange { .. } | QuantityError::Overflow(_) => (
                "is out of range".to_owned(),
                "a quantity of at most 1e29, such as 64, 100k or 8Gi",
            ),
            QuantityError::TooPrecise { .. } => (
                "is finer than 1n (one billionth)".to_owned(),
                "a multiple of 1n (at most nine decimal places), such as 0.5, 500m or 1n",
            ),
            QuantityError::Invalid { reason, .. } => (
                format!("is not a quantity ({reason})"),
                "a Kubernetes quantity such as 4, 500m or 8Gi",
            ),
        };
        format!(
            "{} {raw:?} {what}: write {instead}, or leave the field out for no limit",
            self.field()
        )
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
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "usage_or_none"
    )]
    pub global_usage: Option<ResourceDetails>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "usage_or_none"
    )]
    pub local_usage: Option<ResourceDetails>,
}

/// A usage another writer left unreadable reads as absent: this system only writes these
/// figures (it counts from its ledgers), and one odd object must not fail a whole listing.
fn usage_or_none<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<ResourceDetails>, D::Error> {
    let raw = Option::<Value>::deserialize(deserializer)?;
    Ok(raw.and_then(|raw| serde_json::from_value(raw).ok()))
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

    fn spec(quota: &Value) -> ResourceQuotaSpec {
        serde_json::from_value(serde_json::json!({"subject": {"name": "demo"}, "quota": quota})).unwrap()
    }

    #[test]
    fn an_unreadable_limit_is_kept_as_written_and_the_rest_is_read() {
        let quota =
            serde_json::json!({"cpu": "1e40", "memory": "0.5n", "storage": "1Ti", "accelerators": []});
        let spec = spec(&quota);
        assert_eq!(spec.quota.limits.storage, Some(Quantity::from_gibibytes(1024)));
        assert_eq!(spec.quota.limits.cpu, None);
        let fields: Vec<String> = spec
            .quota
            .unreadable
            .iter()
            .map(UnreadableQuantity::field)
            .collect();
        assert_eq!(fields, ["spec.quota.cpu", "spec.quota.memory"]);
        // Written back exactly as read: nothing lost, nothing rounded.
        let back = serde_json::to_value(&spec.quota).unwrap();
        assert_eq!(
            back,
            serde_json::json!({"cpu": "1e40", "memory": "0.5n", "storage": "1Ti", "accelerators": []})
        );
    }

    #[test]
    fn numbers_and_nulls_read_as_before() {
        let spec = spec(&serde_json::json!({"cpu": 4, "memory": null, "storage": 1.5}));
        assert_eq!(spec.quota.limits.cpu, Some(Quantity::from_units(4)));
        assert_eq!(spec.quota.limits.memory, None);
        assert_eq!(spec.quota.limits.storage, Some(Quantity::from_millis(1500)));
        assert!(spec.quota.unreadable.is_empty());
    }

    #[test]
    fn each_problem_names_the_field_the_value_and_what_to_write() {
        let spec = spec(&serde_json::json!({"cpu": "1e40", "memory": "1.0000000001", "storage": true}));
        let problems: Vec<String> = spec
            .quota
            .unreadable
            .iter()
            .map(UnreadableQuantity::problem)
            .collect();
        assert_eq!(
            problems,
            [
                "spec.quota.cpu \"1e40\" is out of range: write a quantity of at most 1e29, such as 64, 100k or 8Gi, or leave the field out for no limit",
                "spec.quota.memory \"1.0000000001\" is finer than 1n (one billionth): write a multiple of 1n (at most nine decimal places), such as 0.5, 500m or 1n, or leave the field out for no limit",
                "spec.quota.storage \"true\" is not a quantity (expected a string or a number): write a Kubernetes quantity such as 4, 500m or 8Gi, or leave the field out for no limit",
            ]
        );
    }

    #[test]
    fn an_unreadable_usage_reads_as_absent() {
        let status: ResourceQuotaStatus = serde_json::from_value(serde_json::json!({
            "globalUsage": {"cpu": "1e40"}, "localUsage": {"cpu": "2"},
        }))
        .unwrap();
        assert_eq!(status.global_usage, None);
        assert_eq!(status.local_usage.unwrap().cpu, Some(Quantity::from_units(2)));
    }

    #[test]
    fn the_largest_value_the_messages_promise_is_read() {
        let spec = spec(&serde_json::json!({"cpu": "1e29"}));
        assert!(spec.quota.unreadable.is_empty());
        assert!(spec.quota.limits.cpu.is_some());
    }
}
