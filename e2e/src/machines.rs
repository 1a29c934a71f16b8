//! Machines as users create them, for the end-to-end tests and the demo.

use kkp_quota_crds::machine::Machine;
use serde_json::json;

/// The namespace machine-controller keeps a user cluster's Machines in.
pub const NAMESPACE: &str = "kube-system";

fn machine(name: &str, provider: &str, spec: &serde_json::Value) -> Machine {
    serde_json::from_value(json!({
        "apiVersion": "cluster.k8s.io/v1alpha1",
        "kind": "Machine",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"providerSpec": {"value": {
            "cloudProvider": provider,
            "cloudProviderSpec": spec,
            "operatingSystem": "ubuntu"
        }}}
    }))
    .expect("a valid Machine")
}

/// An AWS Machine of `instance_type` (e.g. `t3.medium`: 2 cpu, 4Gi) with a 50 GB disk.
pub fn aws(name: &str, instance_type: &str) -> Machine {
    machine(
        name,
        "aws",
        &json!({"instanceType": instance_type, "diskSize": 50, "region": "eu-central-1"}),
    )
}

/// A vSphere Machine of `cpus` vCPUs, 1 GiB and a 10 GiB disk.
pub fn vsphere(name: &str, cpus: i64) -> Machine {
    machine(
        name,
        "vsphere",
        &json!({"templateVMName": "ubuntu", "cpus": cpus, "memoryMB": 1024, "diskSizeGB": 10}),
    )
}
