use kkp_quota_crds::fixtures::cpu;
use kkp_quota_crds::machine::MachineSpec;
use kube::api::ObjectMeta;
use serde_json::json;

use super::*;

const API: &str = "cluster.k8s.io/v1alpha1";

fn owned_by(kind: &str, uid: &str) -> Vec<OwnerReference> {
    vec![OwnerReference {
        api_version: API.into(),
        kind: kind.into(),
        name: format!("{kind}-{uid}"),
        uid: uid.into(),
        controller: Some(true),
        ..OwnerReference::default()
    }]
}

fn deployment(replicas: u64) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": API, "kind": "MachineDeployment",
        "metadata": {"name": "workers", "namespace": "kube-system", "uid": "md"},
        "spec": {"replicas": replicas},
    }))
    .unwrap()
}

fn set(uid: &str, deployment: &str) -> DynamicObject {
    let mut set: DynamicObject = serde_json::from_value(json!({
        "apiVersion": API, "kind": "MachineSet",
        "metadata": {"name": uid, "namespace": "kube-system", "uid": uid},
    }))
    .unwrap();
    set.metadata.owner_references = Some(owned_by("MachineDeployment", deployment));
    set
}

/// A Machine of `set` whose name encodes its cpus (`a-2` has 2).
fn machine(name: &str, set: &str, created: i64) -> Machine {
    Machine {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("kube-system".into()),
            uid: Some(format!("uid-{name}")),
            owner_references: Some(owned_by("MachineSet", set)),
            creation_timestamp: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                kkp_quota_crds::fixtures::at(created),
            )),
            ..ObjectMeta::default()
        },
        spec: MachineSpec::default(),
    }
}

fn size_of(m: &Machine) -> Option<ResourceDetails> {
    m.name_any().rsplit('-').next()?.parse().ok().map(cpu)
}

fn find(replicas: u64, machines: &[Machine], growth: i64, taken: &[&str]) -> Result<Replaced, SurgeRefusal> {
    let sets = [set("old", "md"), set("new", "md"), set("other", "elsewhere")];
    let taken: Vec<String> = taken.iter().map(|s| (*s).to_owned()).collect();
    find_replaced(
        &deployment(replicas),
        "new",
        &sets,
        machines,
        &cpu(growth),
        &taken,
        size_of,
    )
}

#[test]
fn the_oldest_machine_of_an_older_set_at_least_as_large_is_replaced() {
    let machines = [
        machine("a-2", "old", 20),
        machine("b-2", "old", 10),
        machine("c-1", "old", 0),
        machine("d-8", "other", 0),
    ];
    let replaced = find(3, &machines, 2, &[]).unwrap();
    assert_eq!(replaced.machine, "kube-system/b-2");
    assert_eq!(replaced.uid, "uid-b-2");
    assert_eq!(replaced.deployment, "kube-system/workers");
    assert_eq!(replaced.size, cpu(2));
    // One already replaced by a running surge is not replaced twice.
    assert_eq!(
        find(3, &machines, 2, &["uid-b-2"]).unwrap().machine,
        "kube-system/a-2"
    );
}

#[test]
fn a_scale_up_or_a_machine_with_nothing_to_replace_is_no_surge() {
    let machines = [machine("a-2", "old", 0), machine("b-2", "new", 0)];
    // Two Machines of three wanted: the new one adds, it does not replace.
    assert!(
        matches!(find(3, &machines, 2, &[]), Err(SurgeRefusal::NoReplacement(m)) if m.contains("has 2 of its 3"))
    );
    // Only Machines of its own (new) set, or smaller ones, or ones of another deployment.
    let machines = [
        machine("a-1", "old", 0),
        machine("b-2", "new", 0),
        machine("c-8", "other", 0),
    ];
    assert!(
        matches!(find(2, &machines, 2, &[]), Err(SurgeRefusal::NoReplacement(m)) if m.contains("no Machine of an older MachineSet"))
    );
    // A Machine being deleted is going anyway: not counted, not replaced.
    let mut going = machine("a-2", "old", 0);
    going.metadata.deletion_timestamp = going.metadata.creation_timestamp.clone();
    assert!(find(1, &[going, machine("b-2", "new", 0)], 2, &[]).is_err());
}
