//! Table tests: realistic Machine manifests of every machine-controller provider (field names as
//! machine-controller's provider types spell them), with exact expected quantities.

#![allow(clippy::unwrap_used)] // test code: a panic is a test failure

use std::collections::HashMap;

use kkp_quota_crds::machine::{GlobalKeyRef, Machine};
use kkp_quota_crds::{Quantity, Resource, ResourceDetails};
use provider_sizes::{
    AdminCatalog, ResolveError, SizeCatalog, SizingError, ValueRef, ValueResolver, size_machine,
    size_provider_spec,
};
use serde_json::json;

/// Wraps a provider spec into a full Machine manifest, as machine-controller's `MachineDeployment`
/// would create it.
fn machine(cloud_provider: &str, cloud_provider_spec: &str) -> Machine {
    let indented: String = cloud_provider_spec.lines().fold(String::new(), |mut out, l| {
        out.push_str("          ");
        out.push_str(l);
        out.push('\n');
        out
    });
    let manifest = format!(
        "apiVersion: cluster.k8s.io/v1alpha1
kind: Machine
metadata:
  name: worker-abc12
  namespace: kube-system
spec:
  metadata:
    labels: {{system/cluster: x}}
  providerSpec:
    value:
      cloudProvider: {cloud_provider}
      operatingSystem: ubuntu
      operatingSystemSpec: {{distUpgradeOnBoot: false}}
      sshPublicKeys: [\"ssh-ed25519 AAAA test\"]
      cloudProviderSpec:
{indented}  versions:
    kubelet: 1.33.0
"
    );
    serde_saphyr::from_str(&manifest)
        .unwrap_or_else(|e| panic!("test manifest does not parse: {e}\n{manifest}"))
}

fn q(text: &str) -> Quantity {
    text.parse().unwrap()
}

/// Asserts every resource exactly: cpu, memory, storage, gpu, and machines = 1.
#[track_caller]
fn assert_size(got: &ResourceDetails, cpu: &str, memory: &str, storage: &str, gpu: u32) {
    assert_eq!(got.get(Resource::Cpu), Some(q(cpu)), "cpu of {got}");
    assert_eq!(got.get(Resource::Memory), Some(q(memory)), "memory of {got}");
    assert_eq!(got.get(Resource::Storage), Some(q(storage)), "storage of {got}");
    assert_eq!(
        got.get(Resource::Gpu),
        Some(Quantity::from_units(gpu.into())),
        "gpu of {got}"
    );
    assert_eq!(
        got.get(Resource::Machines),
        Some(Quantity::from_units(1)),
        "machines of {got}"
    );
}

fn shipped() -> SizeCatalog {
    SizeCatalog::shipped()
}

#[track_caller]
fn sized(provider: &str, spec: &str) -> ResourceDetails {
    size_machine(&machine(provider, spec), &shipped(), None).unwrap_or_else(|e| panic!("{e}"))
}

#[track_caller]
fn sized_with(catalog: &SizeCatalog, provider: &str, spec: &str) -> ResourceDetails {
    size_machine(&machine(provider, spec), catalog, None).unwrap_or_else(|e| panic!("{e}"))
}

#[track_caller]
fn refused(provider: &str, spec: &str) -> SizingError {
    refused_with(&shipped(), provider, spec)
}

#[track_caller]
fn refused_with(catalog: &SizeCatalog, provider: &str, spec: &str) -> SizingError {
    match size_machine(&machine(provider, spec), catalog, None) {
        Ok(size) => panic!("expected an error, got {size}"),
        Err(e) => e,
    }
}

fn admin(text: &str) -> SizeCatalog {
    shipped().with_admin(&AdminCatalog::parse(text).unwrap_or_else(|e| panic!("{e}")))
}

// ---------------------------------------------------------------- AWS

#[test]
fn aws() {
    let s = sized(
        "aws",
        "region: eu-central-1\ninstanceType: t3.medium\ndiskSize: 25\ndiskType: gp3\nvpcId: vpc-1\nsubnetId: subnet-1",
    );
    assert_size(&s, "2", "4Gi", "25Gi", 0);
    assert_size(
        &sized("aws", "instanceType: c5.large\ndiskSize: 50"),
        "2",
        "4Gi",
        "50Gi",
        0,
    );
    // 8 A100s; the 8000 GB of instance store is not counted (the root volume is diskSize).
    assert_size(
        &sized("aws", "instanceType: p4d.24xlarge\ndiskSize: 100"),
        "96",
        "1152Gi",
        "100Gi",
        8,
    );
    // Memory exact, not truncated to whole GB as KKP does: m1.medium has 3788 MiB.
    assert_size(
        &sized("aws", "instanceType: m1.medium\ndiskSize: 8"),
        "1",
        "3788Mi",
        "8Gi",
        0,
    );
    assert_eq!(
        sized("aws", "instanceType: r3.large\ndiskSize: 8").get(Resource::Memory),
        Some(q("15Gi"))
    );
    // The flavour as {value: ...} (a provider value). diskSize is a Go int32: machine-controller
    // refuses "50" as a string, so does provider-sizes (see tests/conformance/aws.json).
    assert_size(
        &sized("aws", "instanceType: {value: m5.xlarge}\ndiskSize: 50"),
        "4",
        "16Gi",
        "50Gi",
        0,
    );
}

#[test]
fn aws_refusals() {
    let e = refused("aws", "instanceType: m9.huge\ndiskSize: 50");
    assert_eq!(e.reason(), "UnknownFlavour");
    assert_eq!(e.provider(), "aws");
    assert_eq!(e.flavour(), Some("m9.huge"));
    assert_eq!(
        e.to_string(),
        "aws instance type \"m9.huge\" (cloudProviderSpec.instanceType) is not in the size catalog; add it to \
         the admin size catalog (ConfigMap kubermatic/kkp-quota-size-catalog, key catalog.yaml) under \
         providers.aws or use a known instance type"
    );
    let e = refused("aws", "instanceType: t3.medium");
    assert_eq!((e.reason(), e.flavour()), ("MissingField", Some("t3.medium")));
    assert!(e.to_string().contains("diskSize"), "{e}");
    let e = refused("aws", "diskSize: 10");
    assert_eq!(e.reason(), "MissingField");
    assert!(e.to_string().contains("instanceType"), "{e}");
    let e = refused("aws", "instanceType: t3.medium\ndiskSize: [1]");
    assert_eq!(e.reason(), "InvalidField");
    assert!(
        e.to_string()
            .contains("diskSize must be a JSON number such as 50"),
        "{e}"
    );
    assert_eq!(
        refused("aws", "instanceType: t3.medium\ndiskSize: -5").reason(),
        "InvalidField"
    );
    assert_eq!(
        refused("aws", "instanceType: t3.medium\ndiskSize: 2.5").reason(),
        "InvalidField"
    );
    assert_eq!(
        refused("aws", "instanceType: t3.medium\ndiskSize: \"fifty\"").reason(),
        "InvalidField"
    );
    assert_eq!(
        refused("aws", "instanceType: 42\ndiskSize: 5").reason(),
        "UnknownFlavour"
    );
    // A string is refused before its digits are read (machine-controller wants a number).
    assert_eq!(
        refused(
            "aws",
            "instanceType: t3.medium\ndiskSize: \"99999999999999999999\""
        )
        .reason(),
        "InvalidField"
    );
    assert_eq!(
        refused("aws", "instanceType: t3.medium\ndiskSize: 18446744073709551615").reason(),
        "Overflow"
    );
}

// ---------------------------------------------------------------- Azure

#[test]
fn azure() {
    let s = sized(
        "azure",
        "location: westeurope\nresourceGroup: rg\nvmSize: Standard_D4s_v5\nosDiskSize: 64\ndataDiskSize: 128\nassignPublicIP: false",
    );
    assert_size(&s, "4", "16Gi", "192Gi", 0);
    // Unset OS disk: the 30 GiB of the Linux marketplace images; no data disk.
    assert_size(&sized("azure", "vmSize: Standard_D4s_v5"), "4", "16Gi", "30Gi", 0);
    // Azure matches sizes case-insensitively.
    assert_size(
        &sized("azure", "vmSize: standard_d4s_v5\nosDiskSize: 30"),
        "4",
        "16Gi",
        "30Gi",
        0,
    );
    // The temp disk (958 GiB) is not counted; one A100.
    assert_size(
        &sized("azure", "vmSize: Standard_NC24ads_A100_v4\nosDiskSize: 100"),
        "24",
        "220Gi",
        "100Gi",
        1,
    );
    // 3.5 GiB stays exact.
    assert_eq!(
        sized("azure", "vmSize: Standard_D1_v2").get(Resource::Memory),
        Some(q("3584Mi"))
    );
    let c = admin("rootDiskDefaults: {azure: 64Gi}");
    assert_size(
        &sized_with(&c, "azure", "vmSize: Standard_D4s_v5"),
        "4",
        "16Gi",
        "64Gi",
        0,
    );
    assert_eq!(
        refused("azure", "vmSize: Standard_Z99").reason(),
        "UnknownFlavour"
    );
    assert_eq!(
        refused("azure", "vmSize: Standard_D4s_v5\ndataDiskSize: {a: 1}").reason(),
        "InvalidField"
    );
}

// ---------------------------------------------------------------- GCE

#[test]
fn gce() {
    let s = sized(
        "gce",
        "zone: europe-west3-a\nmachineType: n2-standard-8\ndiskSize: 50\ndiskType: pd-ssd\npreemptible: false",
    );
    assert_size(&s, "8", "32Gi", "50Gi", 0);
    assert_size(
        &sized("gce", "machineType: custom-6-20480\ndiskSize: 50"),
        "6",
        "20Gi",
        "50Gi",
        0,
    );
    assert_size(
        &sized("gce", "machineType: n2-custom-8-16384-ext\ndiskSize: 50"),
        "8",
        "16Gi",
        "50Gi",
        0,
    );
    assert_size(
        &sized("gce", "machineType: e2-custom-medium-4608\ndiskSize: 50"),
        "2",
        "4608Mi",
        "50Gi",
        0,
    );
    // diskSize unset or 0: machine-controller's default of 25 GB.
    assert_size(&sized("gce", "machineType: e2-medium"), "2", "4Gi", "25Gi", 0);
    assert_size(
        &sized("gce", "machineType: n1-standard-1\ndiskSize: 0"),
        "1",
        "3840Mi",
        "25Gi",
        0,
    );
    assert_size(
        &sized("gce", "machineType: a2-highgpu-1g\ndiskSize: 100"),
        "12",
        "85Gi",
        "100Gi",
        1,
    );
    assert_size(
        &sized(
            "gce",
            "machineType: zones/europe-west3-a/machineTypes/n2-standard-8\ndiskSize: 50",
        ),
        "8",
        "32Gi",
        "50Gi",
        0,
    );
    let e = refused("gce", "machineType: custom-6\ndiskSize: 50");
    assert_eq!((e.reason(), e.flavour()), ("InvalidField", Some("custom-6")));
    assert_eq!(
        refused("gce", "machineType: n9-standard-8").reason(),
        "UnknownFlavour"
    );
}

// ---------------------------------------------------------------- OpenStack

#[test]
fn openstack() {
    let spec = "identityEndpoint: https://keystone\nflavor: m1.large\nimage: ubuntu-24.04\nnetwork: net\nrootDiskSizeGB: 40";
    let e = refused("openstack", spec);
    assert_eq!((e.reason(), e.flavour()), ("UnknownFlavour", Some("m1.large")));
    assert!(e.to_string().contains("providers.openstack"), "{e}");
    let c = admin(
        "providers:\n  openstack:\n    m1.large: {cpu: 4, memory: 8Gi, storage: 80Gi, gpu: 0}\n    g1.gpu: {cpu: 8, memory: 30Gi, gpu: 1}\n",
    );
    // Boot from volume: the volume, not the flavour's disk.
    assert_size(&sized_with(&c, "openstack", spec), "4", "8Gi", "40Gi", 0);
    // No rootDiskSizeGB: the flavour's disk.
    assert_size(
        &sized_with(&c, "openstack", "flavor: m1.large"),
        "4",
        "8Gi",
        "80Gi",
        0,
    );
    assert_size(
        &sized_with(&c, "openstack", "flavor: g1.gpu\nrootDiskSizeGB: 100"),
        "8",
        "30Gi",
        "100Gi",
        1,
    );
    // Flavour disk unknown and no default: refused, saying what to set.
    let e = refused_with(&c, "openstack", "flavor: g1.gpu");
    assert_eq!(e.reason(), "UnknownRootDisk");
    assert!(
        e.to_string().contains("rootDiskSizeGB") && e.to_string().contains("rootDiskDefaults.openstack"),
        "{e}"
    );
}

// ---------------------------------------------------------------- flavour-named clouds whose flavour disk is the root disk

#[test]
fn hetzner() {
    assert_size(
        &sized(
            "hetzner",
            "serverType: cx32\ndatacenter: fsn1-dc14\nimage: ubuntu-24.04\nnetworks: []",
        ),
        "4",
        "8Gi",
        "80Gi",
        0,
    );
    assert_size(
        &sized("hetzner", "serverType: cax11\nlocation: nbg1"),
        "2",
        "4Gi",
        "40Gi",
        0,
    );
    assert_eq!(refused("hetzner", "serverType: cx999").reason(), "UnknownFlavour");
}

#[test]
fn digitalocean() {
    assert_size(
        &sized(
            "digitalocean",
            "region: fra1\nsize: s-2vcpu-4gb\nbackups: false\nipv6: false\nprivate_networking: true",
        ),
        "2",
        "4Gi",
        "80Gi",
        0,
    );
    assert_size(
        &sized("digitalocean", "size: gpu-h100x8-640gb"),
        "160",
        "1920Gi",
        "2046Gi",
        8,
    );
}

#[test]
fn linode() {
    assert_size(
        &sized(
            "linode",
            "region: eu-central\ntype: g6-dedicated-2\nbackups: false",
        ),
        "2",
        "4Gi",
        "80Gi",
        0,
    );
    assert_size(
        &sized("linode", "type: g1-gpu-rtx6000-2"),
        "16",
        "64Gi",
        "1280Gi",
        2,
    );
}

#[test]
fn vultr() {
    assert_size(
        &sized("vultr", "region: fra\nplan: vc2-1c-2gb\nosId: 1743"),
        "1",
        "2Gi",
        "55Gi",
        0,
    );
    assert_size(
        &sized("vultr", "plan: vbm-4c-32gb\nphysicalMachine: true"),
        "8",
        "32Gi",
        "480Gi",
        0,
    );
}

#[test]
fn scaleway() {
    assert_size(
        &sized("scaleway", "zone: fr-par-1\ncommercialType: DEV1-S\nipv6: false"),
        "2",
        "2Gi",
        "20Gi",
        0,
    );
    // Block-storage-only types: the root volume size is not in the spec.
    let e = refused("scaleway", "commercialType: PRO2-XS");
    assert_eq!((e.reason(), e.flavour()), ("UnknownRootDisk", Some("PRO2-XS")));
    assert!(e.to_string().contains("rootDiskDefaults.scaleway"), "{e}");
    let c = admin("rootDiskDefaults:\n  scaleway: 10G\n");
    assert_size(
        &sized_with(&c, "scaleway", "commercialType: PRO2-XS"),
        "4",
        "16Gi",
        "10G",
        0,
    );
    assert_eq!(
        sized_with(&c, "scaleway", "commercialType: H100-1-80G").get(Resource::Gpu),
        Some(q("1"))
    );
}

#[test]
fn equinix_metal() {
    let c = admin("providers:\n  equinixmetal:\n    c3.small.x86: {storage: 480Gi}\n");
    let spec = "instanceType: c3.small.x86\nmetro: fr\nbillingCycle: hourly";
    assert_size(&sized_with(&c, "equinixmetal", spec), "8", "32Gi", "480Gi", 0);
    // The old name of the provider.
    assert_size(&sized_with(&c, "packet", spec), "8", "32Gi", "480Gi", 0);
    // Local disk unknown in the shipped data: refused until the admin adds it.
    assert_eq!(refused("equinixmetal", spec).reason(), "UnknownRootDisk");
}

#[test]
fn alibaba() {
    let s = sized(
        "alibaba",
        "regionID: eu-central-1\ninstanceType: ecs.g6.large\ndiskType: cloud_efficiency\ndiskSize: \"40\"\nvSwitchID: vsw-1",
    );
    assert_size(&s, "2", "8Gi", "40Gi", 0);
    assert_size(
        &sized("alibaba", "instanceType: ecs.r7.2xlarge\ndiskSize: 100"),
        "8",
        "64Gi",
        "100Gi",
        0,
    );
    let e = refused("alibaba", "instanceType: ecs.g6.large");
    assert_eq!(e.reason(), "MissingField");
    let e = refused("alibaba", "instanceType: ecs.hfg9.large\ndiskSize: 40");
    assert_eq!(e.reason(), "UnknownFlavour");
}

// ---------------------------------------------------------------- size in the spec

#[test]
fn kubevirt() {
    let spec = "clusterName: c1
virtualMachine:
  dnsPolicy: ClusterFirst
  template:
    cpus: \"2\"
    memory: 8Gi
    primaryDisk:
      osImage: http://images/ubuntu.img
      size: 20Gi
      storageClassName: standard
    secondaryDisks:
    - size: 50Gi
      storageClassName: standard
    - size: 10G
      storageClassName: fast";
    // 20Gi + 50Gi + 10G (decimal, as written) = 83165945Ki exactly.
    assert_size(&sized("kubevirt", spec), "2", "8Gi", "83165945Ki", 0);
    // Fractional cpus and vcpus.cores.
    let spec =
        "virtualMachine:\n  template:\n    cpus: 1500m\n    memory: 3Gi\n    primaryDisk: {size: 10Gi}";
    assert_size(&sized("kubevirt", spec), "1.5", "3Gi", "10Gi", 0);
    let spec = "virtualMachine:\n  template:\n    vcpus: {cores: 4}\n    memory: 4096Mi\n    primaryDisk: {size: 10Gi}";
    assert_size(&sized("kubevirt", spec), "4", "4Gi", "10Gi", 0);
    // Instancetype from the admin catalog.
    let spec = "virtualMachine:\n  instancetype: {name: u1.medium, kind: VirtualMachineClusterInstancetype}\n  template:\n    primaryDisk: {size: 25Gi}";
    let e = refused("kubevirt", spec);
    assert_eq!((e.reason(), e.flavour()), ("UnknownFlavour", Some("u1.medium")));
    let c = admin("providers:\n  kubevirt:\n    u1.medium: {cpu: 1, memory: 4Gi}\n");
    assert_size(&sized_with(&c, "kubevirt", spec), "1", "4Gi", "25Gi", 0);
    // Missing sizes are refused, not zero.
    let e = refused(
        "kubevirt",
        "virtualMachine:\n  template:\n    memory: 4Gi\n    primaryDisk: {size: 10Gi}",
    );
    assert_eq!(e.reason(), "MissingField");
    let e = refused(
        "kubevirt",
        "virtualMachine:\n  template:\n    cpus: 2\n    memory: 4Gi",
    );
    assert!(e.to_string().contains("primaryDisk.size"), "{e}");
    let e = refused(
        "kubevirt",
        "virtualMachine:\n  template:\n    cpus: 2\n    memory: lots\n    primaryDisk: {size: 10Gi}",
    );
    assert_eq!(e.reason(), "InvalidField");
    let e = refused("kubevirt", "virtualMachine:\n  template: 7");
    assert_eq!(e.reason(), "InvalidField");
    let e = refused(
        "kubevirt",
        "virtualMachine:\n  template:\n    cpus: 2\n    memory: 1Gi\n    primaryDisk: {size: 1Gi}\n    secondaryDisks: [{storageClassName: x}]",
    );
    assert!(e.to_string().contains("secondaryDisks[0].size"), "{e}");
}

#[test]
fn vsphere() {
    let spec = "templateVMName: ubuntu-tpl\ndatacenter: dc\ncluster: c\ndatastore: ds\ncpus: 2\nmemoryMB: 3072\ndiskSizeGB: 20\nallowInsecure: false";
    assert_size(&sized("vsphere", spec), "2", "3Gi", "20Gi", 0);
    let e = refused("vsphere", "cpus: 2\nmemoryMB: 3072");
    assert_eq!(e.reason(), "UnknownRootDisk");
    assert!(e.to_string().contains("diskSizeGB"), "{e}");
    assert_size(
        &sized_with(
            &admin("rootDiskDefaults: {vsphere: 40Gi}"),
            "vsphere",
            "cpus: 2\nmemoryMB: 3072",
        ),
        "2",
        "3Gi",
        "40Gi",
        0,
    );
    assert_eq!(
        refused("vsphere", "memoryMB: 3072\ndiskSizeGB: 20").reason(),
        "MissingField"
    );
}

#[test]
fn nutanix() {
    let spec = "clusterName: c\nsubnetName: s\nimageName: ubuntu\ncpus: 2\ncpuCores: 2\nmemoryMB: 6144\ndiskSize: 40";
    assert_size(&sized("nutanix", spec), "4", "6Gi", "40Gi", 0);
    assert_size(
        &sized("nutanix", "cpus: 3\nmemoryMB: 2048\ndiskSize: 20"),
        "3",
        "2Gi",
        "20Gi",
        0,
    );
    assert_eq!(
        refused("nutanix", "cpus: 3\nmemoryMB: 2048").reason(),
        "UnknownRootDisk"
    );
}

#[test]
fn vmware_cloud_director() {
    let spec = "organization: org\nvdc: vdc\nvapp: app\ncatalog: cat\ntemplate: ubuntu\ncpus: 4\ncpuCores: 2\nmemoryMB: 8192\ndiskSizeGB: 30";
    assert_size(&sized("vmware-cloud-director", spec), "4", "8Gi", "30Gi", 0);
    assert_eq!(
        refused("vmware-cloud-director", "cpus: 4\nmemoryMB: 8192").reason(),
        "UnknownRootDisk"
    );
}

#[test]
fn anexia() {
    let spec = "locationID: loc\ntemplateID: tpl\ncpus: 2\nmemory: 4096\ndisks:\n- size: 60\n  performanceType: ENT6\n- size: 100";
    // Both disks count (KKP ignores them).
    assert_size(&sized("anexia", spec), "2", "4Gi", "160Gi", 0);
    // The deprecated single diskSize.
    assert_size(
        &sized("anexia", "cpus: 1\nmemory: 2048\ndiskSize: 20"),
        "1",
        "2Gi",
        "20Gi",
        0,
    );
    assert_eq!(
        refused("anexia", "cpus: 1\nmemory: 2048").reason(),
        "MissingField"
    );
    assert_eq!(
        refused("anexia", "cpus: 1\nmemory: 2048\ndisks: [{performanceType: x}]").reason(),
        "MissingField"
    );
    assert_eq!(
        refused("anexia", "cpus: 1\nmemory: 2048\ndisks: {size: 3}").reason(),
        "InvalidField"
    );
}

#[test]
fn opennebula() {
    let spec = "endpoint: https://one\ncpu: 0.5\nvcpu: 2\nmemory: 2048\nimage: ubuntu\ndatastore: ds\ndiskSize: 51200\nnetwork: net";
    assert_size(&sized("opennebula", spec), "2", "2Gi", "50Gi", 0);
    assert_eq!(
        refused("opennebula", "cpu: 1\nmemory: 1024\ndiskSize: 10240").reason(),
        "MissingField"
    );
}

// ---------------------------------------------------------------- no size in the spec

#[test]
fn baremetal() {
    let spec = "driver: tinkerbell\ndriverSpec:\n  clusterName: c\n  osImageUrl: http://img\n  hardwareRef: {name: hw-01, namespace: tink}";
    let e = refused("baremetal", spec);
    assert_eq!((e.reason(), e.flavour()), ("UnknownFlavour", Some("tink/hw-01")));
    let c = admin(
        "providers:\n  baremetal:\n    tink/hw-01: {cpu: 64, memory: 256Gi, storage: 1920Gi, gpu: 2}\n",
    );
    assert_size(&sized_with(&c, "baremetal", spec), "64", "256Gi", "1920Gi", 2);
    let e = refused("baremetal", "driver: tinkerbell");
    assert_eq!(e.reason(), "NotSizable");
}

#[test]
fn edge_external_fake() {
    for provider in ["edge", "external", "fake"] {
        let e = refused(provider, "{}");
        assert_eq!(e.reason(), "NotSizable", "{provider}");
        assert!(e.to_string().contains(&format!("providers.{provider}")), "{e}");
    }
    let c = admin("providers:\n  edge:\n    \"*\": {cpu: 4, memory: 16Gi, storage: 100Gi}\n");
    assert_size(&sized_with(&c, "edge", "{}"), "4", "16Gi", "100Gi", 0);
    assert_eq!(refused_with(&c, "external", "{}").reason(), "NotSizable");
}

// ---------------------------------------------------------------- whole-spec errors, references

#[test]
fn unknown_and_missing_providers() {
    let e = refused("ovirt", "{}");
    assert_eq!((e.reason(), e.provider()), ("UnknownProvider", "ovirt"));
    assert!(e.to_string().contains("vmware-cloud-director"), "{e}");
    let c = shipped();
    let e = size_provider_spec(&json!({"cloudProviderSpec": {}}), &c, None).unwrap_err();
    assert_eq!(e.reason(), "NoCloudProvider");
    assert_eq!(
        size_provider_spec(&json!([1]), &c, None).unwrap_err().reason(),
        "NoProviderSpec"
    );
    let e = size_provider_spec(
        &json!({"cloudProvider": "aws", "cloudProviderSpec": "x"}),
        &c,
        None,
    )
    .unwrap_err();
    assert_eq!(e.reason(), "InvalidField");
    let no_spec: Machine = serde_json::from_value(json!({
        "apiVersion": "cluster.k8s.io/v1alpha1", "kind": "Machine",
        "metadata": {"name": "m"}, "spec": {}
    }))
    .unwrap();
    assert_eq!(
        size_machine(&no_spec, &c, None).unwrap_err().reason(),
        "NoProviderSpec"
    );
}

struct Cache(HashMap<(bool, String, String, String), String>);

impl ValueResolver for Cache {
    fn resolve(&self, reference: &ValueRef) -> Result<String, ResolveError> {
        let (secret, r) = match reference {
            ValueRef::Secret(r) => (true, r),
            ValueRef::ConfigMap(r) => (false, r),
        };
        self.0
            .get(&(secret, r.namespace.clone(), r.name.clone(), r.key.clone()))
            .cloned()
            .ok_or_else(|| ResolveError::no_key(reference))
    }
}

#[test]
fn sizes_by_reference() {
    let spec =
        "instanceType:\n  secretKeyRef: {namespace: kube-system, name: sizes, key: type}\ndiskSize: 30";
    let m = machine("aws", spec);
    let c = shipped();
    let e = size_machine(&m, &c, None).unwrap_err();
    assert_eq!(e.reason(), "NoResolver");
    assert!(
        e.to_string()
            .contains("instanceType is given by secretKeyRef/configMapKeyRef"),
        "{e}"
    );
    let cache = Cache(HashMap::from([
        (
            (true, "kube-system".into(), "sizes".into(), "type".into()),
            "t3.medium\n".into(),
        ),
        (
            (false, "kube-system".into(), "cfg".into(), "plan".into()),
            "cx22".into(),
        ),
    ]));
    assert_size(
        &size_machine(&m, &c, Some(&cache)).unwrap(),
        "2",
        "4Gi",
        "30Gi",
        0,
    );
    let m = machine(
        "hetzner",
        "serverType:\n  configMapKeyRef: {namespace: kube-system, name: cfg, key: plan}",
    );
    assert_size(
        &size_machine(&m, &c, Some(&cache)).unwrap(),
        "2",
        "4Gi",
        "40Gi",
        0,
    );
    let m = machine(
        "hetzner",
        "serverType:\n  configMapKeyRef: {namespace: kube-system, name: cfg, key: other}",
    );
    let e = size_machine(&m, &c, Some(&cache)).unwrap_err();
    assert_eq!(e.reason(), "ResolveFailed");
    assert!(
        e.to_string()
            .contains(r#"(ConfigMap kube-system/cfg has no key "other")"#),
        "{e}"
    );
    // As in machine-controller, a complete secretKeyRef wins over an inline value...
    let m = machine(
        "hetzner",
        "serverType:\n  value: cx32\n  secretKeyRef: {namespace: a, name: b, key: c}",
    );
    assert_eq!(size_machine(&m, &c, None).unwrap_err().reason(), "NoResolver");
    // ...and an incomplete one is ignored: the inline value is used, the resolver not asked.
    let m = machine(
        "hetzner",
        "serverType:\n  value: cx32\n  secretKeyRef: {name: b, key: c}",
    );
    assert_size(&size_machine(&m, &c, None).unwrap(), "4", "8Gi", "80Gi", 0);
    let _ = GlobalKeyRef::default();
}

#[test]
fn reasons_are_a_bounded_camel_case_set() {
    let errors = [
        refused("aws", "instanceType: m9.huge\ndiskSize: 1"),
        refused("vsphere", "cpus: 1\nmemoryMB: 1"),
        refused("edge", "{}"),
        refused("nope", "{}"),
        refused("aws", "instanceType: [1]"),
    ];
    for e in errors {
        assert!(SizingError::REASONS.contains(&e.reason()), "{}", e.reason());
        assert!(e.reason().chars().next().is_some_and(|c| c.is_ascii_uppercase()));
    }
}

#[test]
fn every_machine_controller_provider_is_handled_and_documented() {
    let readme = include_str!("../README.md");
    for name in provider_sizes::Provider::NAMES {
        let e = size_provider_spec(
            &json!({"cloudProvider": name, "cloudProviderSpec": {}}),
            &shipped(),
            None,
        )
        .expect_err("an empty spec sizes nothing");
        assert_ne!(e.reason(), "UnknownProvider", "{name}");
        assert!(!e.to_string().is_empty());
        assert!(
            readme.contains(&format!("`{name}`")),
            "README does not list {name}"
        );
    }
}

#[test]
fn catalog_and_errors_are_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync + Clone + 'static>() {}
    assert_send_sync::<SizeCatalog>();
    assert_send_sync::<SizingError>();
    assert_send_sync::<AdminCatalog>();
    let c = shipped();
    let handle = std::thread::spawn(move || sized_with(&c, "hetzner", "serverType: cx22"));
    assert_size(&handle.join().unwrap(), "2", "4Gi", "40Gi", 0);
}

#[test]
fn messages_say_how_to_fix() {
    assert_eq!(
        refused("vsphere", "cpus: 2\nmemoryMB: 2048").to_string(),
        "vsphere Machine: the root disk size is unknown (diskSizeGB is unset, so the template VM's disk size \
         is used); set cloudProviderSpec.diskSizeGB in the Machine, or set rootDiskDefaults.vsphere in the \
         admin size catalog (ConfigMap kubermatic/kkp-quota-size-catalog, key catalog.yaml)"
    );
    assert_eq!(
        refused("edge", "{}").to_string(),
        "edge Machines carry no size of their own; add an entry \"*\" under providers.edge in the admin size \
         catalog (ConfigMap kubermatic/kkp-quota-size-catalog, key catalog.yaml) to size every such Machine"
    );
    assert_eq!(
        refused("azure", "vmSize: true").to_string(),
        "azure Machine: cloudProviderSpec.vmSize must be a string, a number or \
         {value|secretKeyRef|configMapKeyRef}, found the boolean true; correct the Machine's provider spec"
    );
}

// ---------------------------------------------------------------- issue 18: legacy providerConfig

#[test]
fn legacy_provider_config_is_named_in_the_refusal() {
    let manifest = "apiVersion: cluster.k8s.io/v1alpha1
kind: Machine
metadata: {name: old, namespace: kube-system}
spec:
  providerConfig:
    value:
      cloudProvider: aws
      cloudProviderSpec: {instanceType: t3.medium, diskSize: 50}
";
    let m: Machine = serde_saphyr::from_str(manifest).unwrap();
    let e = size_machine(&m, &shipped(), None).unwrap_err();
    assert_eq!(e.reason(), "NoProviderSpec");
    let text = e.to_string();
    assert!(text.contains("spec.providerConfig"), "{text}");
    assert!(
        text.contains("move its value to spec.providerSpec.value"),
        "{text}"
    );
}
