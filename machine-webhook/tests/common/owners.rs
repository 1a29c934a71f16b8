//! machine-controller's owners of Machines in a user cluster: `MachineSet` and
//! `MachineDeployment`, as bare objects (the fleet installs their stand-in CRDs; nothing
//! reconciles them in these tests).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ApiResource, DynamicObject};

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
