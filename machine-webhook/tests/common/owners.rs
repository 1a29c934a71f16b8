//! machine-controller's owners of Machines in a user cluster: `MachineSet` and
//! `MachineDeployment`, as bare objects (nothing reconciles them in these tests).

use std::time::Duration;

use anyhow::Result;
use e2e::wait_for;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ApiResource, DynamicObject, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::NS;

/// Minimal `MachineSet` and `MachineDeployment` CRDs (machine-controller's have no schema either).
pub async fn install_owner_crds(user: &Client) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(user.clone());
    for (kind, plural) in [
        ("MachineSet", "machinesets"),
        ("MachineDeployment", "machinedeployments"),
    ] {
        let crd: CustomResourceDefinition = serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {
                "name": format!("{plural}.cluster.k8s.io"),
                "annotations": {"api-approved.kubernetes.io": "unapproved, machine-controller's own group"}
            },
            "spec": {
                "group": "cluster.k8s.io",
                "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
                "scope": "Namespaced",
                "versions": [{"name": "v1alpha1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]
            }
        }))?;
        crds.create(&PostParams::default(), &crd).await?;
    }
    for plural in ["machinesets", "machinedeployments"] {
        let api: Api<DynamicObject> = Api::namespaced_with(user.clone(), NS, &resource(plural));
        wait_for(Duration::from_secs(30), "the owner CRDs to be served", || {
            let api = api.clone();
            async move { api.list(&ListParams::default()).await.is_ok() }
        })
        .await?;
    }
    Ok(())
}

pub fn resource(plural: &str) -> ApiResource {
    let kind = if plural == "machinesets" {
        "MachineSet"
    } else {
        "MachineDeployment"
    };
    ApiResource {
        group: "cluster.k8s.io".into(),
        version: "v1alpha1".into(),
        api_version: "cluster.k8s.io/v1alpha1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

pub fn owner_ref(object: &DynamicObject, kind: &str) -> OwnerReference {
    OwnerReference {
        api_version: "cluster.k8s.io/v1alpha1".into(),
        kind: kind.into(),
        name: object.metadata.name.clone().unwrap_or_default(),
        uid: object.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}
