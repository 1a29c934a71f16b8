//! The admin catalog: format, overrides, and errors that name the entry and line.

#![allow(clippy::unwrap_used)] // test code: a panic is a test failure

use kkp_quota_crds::Quantity;
use provider_sizes::{AdminCatalog, Provider, SizeCatalog};

fn q(text: &str) -> Quantity {
    text.parse().unwrap()
}

#[test]
fn overrides_win_field_by_field() {
    let admin = AdminCatalog::parse(
        "providers:
  aws:
    t3.medium: {memory: 5Gi}      # only memory changes
    m9.huge: {cpu: 96, memory: 384Gi, gpu: 0}
  azure:
    STANDARD_D4S_V5: {cpu: 5}
rootDiskDefaults:
  vsphere: 40Gi
",
    )
    .unwrap();
    assert_eq!(admin.len(), 3);
    let shipped = SizeCatalog::shipped();
    let c = shipped.with_admin(&admin);
    let t3 = c.flavour(Provider::Aws, "t3.medium").unwrap();
    assert_eq!((t3.cpu, t3.memory), (q("2"), q("5Gi")));
    let huge = c.flavour(Provider::Aws, "m9.huge").unwrap();
    assert_eq!((huge.cpu, huge.memory, huge.gpu), (q("96"), q("384Gi"), q("0")));
    assert_eq!(c.flavour(Provider::Azure, "Standard_D4s_v5").unwrap().cpu, q("5"));
    assert_eq!(c.root_disk_default(Provider::Vsphere), Some(q("40Gi")));
    // The shipped catalog itself is untouched.
    assert_eq!(
        shipped.flavour(Provider::Aws, "t3.medium").unwrap().memory,
        q("4Gi")
    );
    assert!(shipped.flavour(Provider::Aws, "m9.huge").is_none());
}

#[test]
fn json_and_empty_text_parse() {
    let admin = AdminCatalog::parse(
        r#"{"providers": {"openstack": {"m1.small": {"cpu": "1", "memory": "2Gi", "storage": "20Gi"}}}}"#,
    )
    .unwrap();
    let c = SizeCatalog::shipped().with_admin(&admin);
    let small = c.flavour(Provider::Openstack, "m1.small").unwrap();
    assert_eq!(small.disk, Some(q("20Gi")));
    assert!(AdminCatalog::parse("").unwrap().is_empty());
    assert!(AdminCatalog::parse("# nothing yet\n").unwrap().is_empty());
    assert!(AdminCatalog::parse("providers:\n").unwrap().is_empty());
}

#[track_caller]
fn parse_error(text: &str) -> provider_sizes::CatalogError {
    AdminCatalog::parse(text).expect_err("should not parse")
}

#[test]
fn errors_name_the_entry_and_line() {
    let text = "providers:\n  openstack:\n    m1.large: {cpu: 4, memory: 8Gi}\n    m1.xlarge: {cpu: 8, memory: lots}\n";
    let e = parse_error(text);
    assert_eq!(e.entry, "providers.openstack.m1.xlarge");
    assert_eq!(e.line, Some(4));
    assert!(
        e.to_string()
            .starts_with("admin size catalog, entry providers.openstack.m1.xlarge (line 4): memory:"),
        "{e}"
    );

    let e = parse_error("providers:\n  openstack:\n    m1.large: {cpu: 4}\n");
    assert_eq!(
        (e.entry.as_str(), e.line),
        ("providers.openstack.m1.large", Some(3))
    );
    assert!(e.message.contains("cpu and memory are required"), "{e}");

    let e = parse_error("providers:\n  aws:\n    t3.medium: {cpus: 4}\n");
    assert!(e.message.contains("unknown field \"cpus\""), "{e}");
    assert_eq!(e.line, Some(3));

    let e = parse_error("providers:\n  amazon:\n    t3.medium: {cpu: 4, memory: 1Gi}\n");
    assert_eq!((e.entry.as_str(), e.line), ("providers.amazon", Some(2)));

    let e = parse_error("providers:\n  aws:\n    t3.medium: {cpu: -4}\n");
    assert!(e.message.contains("negative"), "{e}");

    let e = parse_error("rootDiskDefaults:\n  vsphere: big\n");
    assert_eq!((e.entry.as_str(), e.line), ("rootDiskDefaults.vsphere", Some(2)));

    let e = parse_error("provider:\n  aws: {}\n");
    assert!(e.message.contains("unknown section"), "{e}");

    // YAML syntax errors carry the YAML parser's line.
    let e = parse_error("providers:\n  aws:\n    t3.medium: {cpu: 4\n");
    assert!(e.line.is_some(), "{e}");

    let e = parse_error(
        "providers:\n  azure:\n    Standard_X1: {cpu: 1, memory: 1Gi}\n    standard_x1: {cpu: 2, memory: 1Gi}\n",
    );
    assert!(e.message.contains("duplicate"), "{e}");
    assert_eq!(e.line, Some(4));

    let e = parse_error("providers:\n  aws:\n    t3.medium: 4\n");
    assert!(e.message.contains("expected a mapping"), "{e}");
}
