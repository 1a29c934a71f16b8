//! KKP's CRDs in the shape KKP installs them, for the local fleet and tests only.
//!
//! A real KKP installation has KKP's own CRDs, installed and reconciled by KKP's operator: this
//! project never installs or patches a `kubermatic.k8c.io` CRD there. The fleet must behave the
//! same, so these stand-ins are structural like KKP's: every field this project writes is
//! declared exactly as KKP declares it, nothing is `x-kubernetes-preserve-unknown-fields`, and
//! the API server prunes anything else, as it would in KKP. Specs declare only the fields the
//! fleet sets (KKP's specs are far larger; none of them is written by this project).
//!
//! Facts, from KKP's published CRDs (`pkg/crd/k8c.io/` in KKP's repository):
//! - `ResourceQuota`: `spec.subject {name, kind (enum project, default project)}` (both
//!   required), `spec.quota {cpu, memory, storage}`, `spec.subject` and `spec.quota` required;
//!   `status.globalUsage` and `status.localUsage`, each `{cpu, memory, storage}`; status
//!   subresource; printer columns Age, Subject Name, Subject Kind.
//! - `Cluster`: `status.resourceUsage {cpu, memory, storage}`, `status.namespaceName`,
//!   `status.conditions` a map from condition type to `{kubermaticVersion, status,
//!   lastHeartbeatTime, lastTransitionTime, reason, message}` with `kubermaticVersion` and
//!   `status` required; status subresource.
//! - `Seed` (namespaced): `spec.kubeconfig` an object reference to a Secret.
//! - `Project`: `spec.name`. `KubermaticSetting`: `spec.defaultQuota.quota {cpu, memory,
//!   storage}`.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};

/// Kubernetes' quantity pattern, as KKP's CRDs carry it beside `x-kubernetes-int-or-string`.
const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

fn quantity() -> Value {
    json!({
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": QUANTITY_PATTERN,
        "x-kubernetes-int-or-string": true,
    })
}

/// KKP's `ResourceDetails`: cpu, memory and storage, nothing else.
fn resource_details() -> Value {
    json!({
        "type": "object",
        "properties": {"cpu": quantity(), "memory": quantity(), "storage": quantity()},
    })
}

fn string() -> Value {
    json!({"type": "string"})
}

/// One CRD of group `kubermatic.k8c.io`, version `v1`.
fn crd(
    kind: &str,
    plural: &str,
    namespaced: bool,
    schema: &Value,
    extra_version: &Value,
) -> CustomResourceDefinition {
    let mut version = json!({
        "name": "v1",
        "served": true,
        "storage": true,
        "schema": {"openAPIV3Schema": schema},
    });
    if let (Some(v), Some(extra)) = (version.as_object_mut(), extra_version.as_object()) {
        v.extend(extra.clone());
    }
    let body = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.kubermatic.k8c.io")},
        "spec": {
            "group": "kubermatic.k8c.io",
            "names": {
                "kind": kind,
                "listKind": format!("{kind}List"),
                "plural": plural,
                "singular": kind.to_lowercase(),
            },
            "scope": if namespaced { "Namespaced" } else { "Cluster" },
            "versions": [version],
        },
    });
    // The literal above is a valid CRD by construction; a failure here is a bug in this file.
    serde_json::from_value(body).unwrap_or_else(|e| unreachable!("KKP-shaped CRD for {kind}: {e}"))
}

fn object(spec: &Value, status: Option<&Value>) -> Value {
    let mut properties = json!({
        "apiVersion": string(),
        "kind": string(),
        "metadata": {"type": "object"},
        "spec": spec,
    });
    if let Some(status) = status {
        properties["status"] = status.clone();
    }
    json!({"type": "object", "properties": properties})
}

pub fn resource_quota() -> CustomResourceDefinition {
    let spec = json!({
        "type": "object",
        "required": ["quota", "subject"],
        "properties": {
            "quota": resource_details(),
            "subject": {
                "type": "object",
                "required": ["kind", "name"],
                "properties": {
                    "kind": {"type": "string", "default": "project", "enum": ["project"]},
                    "name": string(),
                },
            },
        },
    });
    let status = json!({
        "type": "object",
        "properties": {"globalUsage": resource_details(), "localUsage": resource_details()},
    });
    crd(
        "ResourceQuota",
        "resourcequotas",
        false,
        &object(&spec, Some(&status)),
        &json!({
            "subresources": {"status": {}},
            "additionalPrinterColumns": [
                {"jsonPath": ".metadata.creationTimestamp", "name": "Age", "type": "date"},
                {"jsonPath": ".spec.subject.name", "name": "Subject Name", "type": "string"},
                {"jsonPath": ".spec.subject.kind", "name": "Subject Kind", "type": "string"},
            ],
        }),
    )
}

pub fn cluster() -> CustomResourceDefinition {
    let spec = json!({
        "type": "object",
        "properties": {"humanReadableName": string(), "version": string()},
    });
    let condition = json!({
        "type": "object",
        "required": ["kubermaticVersion", "status"],
        "properties": {
            "kubermaticVersion": string(),
            "status": string(),
            "lastHeartbeatTime": {"type": "string", "format": "date-time"},
            "lastTransitionTime": {"type": "string", "format": "date-time"},
            "reason": string(),
            "message": string(),
        },
    });
    let status = json!({
        "type": "object",
        "properties": {
            "namespaceName": string(),
            "resourceUsage": resource_details(),
            "conditions": {"type": "object", "additionalProperties": condition},
        },
    });
    crd(
        "Cluster",
        "clusters",
        false,
        &object(&spec, Some(&status)),
        &json!({"subresources": {"status": {}}}),
    )
}

pub fn seed() -> CustomResourceDefinition {
    let reference = json!({
        "type": "object",
        "properties": {
            "apiVersion": string(), "fieldPath": string(), "kind": string(), "name": string(),
            "namespace": string(), "resourceVersion": string(), "uid": string(),
        },
        "x-kubernetes-map-type": "atomic",
    });
    let spec = json!({"type": "object", "properties": {"kubeconfig": reference}});
    crd("Seed", "seeds", true, &object(&spec, None), &json!({}))
}

pub fn project() -> CustomResourceDefinition {
    let spec = json!({"type": "object", "required": ["name"], "properties": {"name": string()}});
    crd("Project", "projects", false, &object(&spec, None), &json!({}))
}

pub fn kubermatic_setting() -> CustomResourceDefinition {
    let spec = json!({
        "type": "object",
        "properties": {
            "defaultQuota": {"type": "object", "properties": {"quota": resource_details()}},
        },
    });
    crd(
        "KubermaticSetting",
        "kubermaticsettings",
        false,
        &object(&spec, None),
        &json!({}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml_text(crd: &CustomResourceDefinition) -> String {
        serde_json::to_string(crd).unwrap()
    }

    #[test]
    fn nothing_is_left_open_to_unknown_fields() {
        for crd in [
            resource_quota(),
            cluster(),
            seed(),
            project(),
            kubermatic_setting(),
        ] {
            let text = yaml_text(&crd);
            assert!(
                !text.contains("preserve-unknown-fields"),
                "{}",
                crd.spec.names.kind
            );
        }
    }

    #[test]
    fn the_quota_has_only_kkps_three_resources() {
        let json = serde_json::to_value(resource_quota()).unwrap();
        let schema = &json["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        let quota = schema["properties"]["spec"]["properties"]["quota"]["properties"]
            .as_object()
            .unwrap();
        assert_eq!(quota.keys().collect::<Vec<_>>(), ["cpu", "memory", "storage"]);
        let status = schema["properties"]["status"]["properties"].as_object().unwrap();
        assert_eq!(status.keys().collect::<Vec<_>>(), ["globalUsage", "localUsage"]);
    }
}
