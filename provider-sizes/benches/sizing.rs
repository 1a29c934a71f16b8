//! Sizing throughput: how long one Machine takes on the admission path.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kkp_quota_crds::machine::Machine;
use provider_sizes::{AdminCatalog, SizeCatalog, size_machine, size_provider_spec};
use serde_json::{Value, json};

fn machines() -> Vec<(&'static str, Value)> {
    vec![
        (
            "aws",
            json!({"cloudProvider": "aws", "cloudProviderSpec": {"instanceType": "m5.xlarge", "diskSize": 50, "region": "eu-central-1"}}),
        ),
        (
            "azure",
            json!({"cloudProvider": "azure", "cloudProviderSpec": {"vmSize": "Standard_D4s_v5", "osDiskSize": 64, "dataDiskSize": 128}}),
        ),
        (
            "gce-custom",
            json!({"cloudProvider": "gce", "cloudProviderSpec": {"machineType": "n2-custom-8-16384", "diskSize": 50}}),
        ),
        (
            "hetzner",
            json!({"cloudProvider": "hetzner", "cloudProviderSpec": {"serverType": "cx32"}}),
        ),
        (
            "openstack-admin",
            json!({"cloudProvider": "openstack", "cloudProviderSpec": {"flavor": "m1.large", "rootDiskSizeGB": 40}}),
        ),
        (
            "kubevirt",
            json!({"cloudProvider": "kubevirt", "cloudProviderSpec": {"virtualMachine": {"template": {
            "cpus": "4", "memory": "8Gi", "primaryDisk": {"size": "20Gi"}, "secondaryDisks": [{"size": "50Gi"}]}}}}),
        ),
        (
            "vsphere",
            json!({"cloudProvider": "vsphere", "cloudProviderSpec": {"cpus": 4, "memoryMB": 8192, "diskSizeGB": 40}}),
        ),
    ]
}

fn bench(c: &mut Criterion) {
    let admin =
        AdminCatalog::parse("providers:\n  openstack:\n    m1.large: {cpu: 4, memory: 8Gi, storage: 80Gi}\n")
            .expect("the benchmark's admin catalog parses");
    let catalog = SizeCatalog::shipped().with_admin(&admin);
    let mut group = c.benchmark_group("size_provider_spec");
    group.throughput(Throughput::Elements(1));
    for (name, spec) in machines() {
        group.bench_function(name, |b| {
            b.iter(|| size_provider_spec(black_box(&spec), &catalog, None).expect("sized"));
        });
    }
    // The denial path: an unknown type, message rendered as the webhook would.
    let unknown =
        json!({"cloudProvider": "aws", "cloudProviderSpec": {"instanceType": "m9.huge", "diskSize": 50}});
    group.bench_function("aws-unknown-type-error", |b| {
        b.iter(|| {
            size_provider_spec(black_box(&unknown), &catalog, None)
                .expect_err("unknown")
                .to_string()
        });
    });
    // A whole Machine object, as the webhook decodes it.
    let machine: Machine = serde_json::from_value(json!({
        "apiVersion": "cluster.k8s.io/v1alpha1", "kind": "Machine",
        "metadata": {"name": "worker-1", "namespace": "kube-system"},
        "spec": {"providerSpec": {"value": machines()[0].1.clone()}}
    }))
    .expect("the benchmark Machine decodes");
    group.bench_function("size_machine-aws", |b| {
        b.iter(|| size_machine(black_box(&machine), &catalog, None).expect("sized"));
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
