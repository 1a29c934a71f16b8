//! Machines as users create them, for the end-to-end tests and the demo.

use kkp_quota_crds::machine::Machine;
use kube::Api;
use serde_json::json;

use crate::Fleet;

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

/// The Machines of user cluster `cluster`, in [`NAMESPACE`].
pub fn api(fleet: &Fleet, cluster: &str) -> Api<Machine> {
    Api::namespaced(fleet.user_cluster(cluster).client(), NAMESPACE)
}

/// Whether `error` is the webhook denying a Machine of `project` for its quota or for share in
/// transit (the message names what the project uses).
pub fn is_quota_denial(error: &kube::Error, project: &str) -> bool {
    matches!(error, kube::Error::Api(s) if s.message.contains(&format!("project {project:?} uses"))
        || s.message.contains(&format!("project {project:?} is within its own quota, but group")))
}
