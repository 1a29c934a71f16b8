//! The example Machines and `MachineDeployment` in `deploy/examples` are what machine-controller
//! needs (a kubelet version, the operating system's settings, a `MachineDeployment` whose selector
//! matches its template) and are sized as their comments say.

#![allow(clippy::unwrap_used)]

use kkp_quota_crds::machine::Machine;
use kkp_quota_crds::{Quantity, Resource};
use provider_sizes::{SizeCatalog, size_machine, size_provider_spec};
use serde_json::Value;

fn example(file: &str) -> Value {
    let path = format!("{}/../deploy/examples/{file}", env!("CARGO_MANIFEST_DIR"));
    serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// What machine-controller refuses a Machine spec without.
fn assert_complete(spec: &Value, what: &str) {
    assert!(
        spec["versions"]["kubelet"]
            .as_str()
            .is_some_and(|v| !v.is_empty()),
        "{what}: no spec.versions.kubelet"
    );
    let value = &spec["providerSpec"]["value"];
    for field in [
        "cloudProvider",
        "cloudProviderSpec",
        "operatingSystem",
        "operatingSystemSpec",
    ] {
        assert!(!value[field].is_null(), "{what}: no providerSpec.value.{field}");
    }
}

fn cpu(value: &Value) -> Quantity {
    size_provider_spec(value, &SizeCatalog::shipped(), None)
        .unwrap()
        .amount(Resource::Cpu)
}

#[test]
fn example_machines_are_complete_and_sized_as_described() {
    for (file, cpus) in [("machine-small.yaml", 2), ("machine-too-big.yaml", 32)] {
        let object = example(file);
        assert_eq!(object["kind"], "Machine", "{file}");
        assert_eq!(object["metadata"]["namespace"], "kube-system", "{file}");
        assert_complete(&object["spec"], file);
        let machine: Machine = serde_json::from_value(object).unwrap();
        let size = size_machine(&machine, &SizeCatalog::shipped(), None).unwrap();
        assert_eq!(size.amount(Resource::Cpu), Quantity::from_units(cpus), "{file}");
    }
}

#[test]
fn example_machine_deployment_is_complete_and_rolls_out_without_a_surge() {
    let object = example("machinedeployment-small.yaml");
    assert_eq!(object["kind"], "MachineDeployment");
    let spec = &object["spec"];
    let selector = spec["selector"]["matchLabels"].as_object().unwrap();
    let labels = spec["template"]["metadata"]["labels"].as_object().unwrap();
    for (key, value) in selector {
        assert_eq!(
            labels.get(key),
            Some(value),
            "the selector does not match the template"
        );
    }
    assert_eq!(spec["strategy"]["rollingUpdate"]["maxSurge"], 0);
    assert_complete(&spec["template"]["spec"], "the template");
    assert_eq!(
        cpu(&spec["template"]["spec"]["providerSpec"]["value"]),
        Quantity::from_units(2)
    );
}
