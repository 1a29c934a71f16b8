//! Property: no JSON at all makes sizing panic; errors always have a known reason.

#![allow(clippy::unwrap_used)] // test code: a panic is a test failure

use proptest::prelude::*;
use provider_sizes::{AdminCatalog, Provider, SizeCatalog, SizingError, size_provider_spec};
use serde_json::{Map, Value, json};

fn arbitrary_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        "[a-zA-Z0-9.\\-/*]{0,12}".prop_map(Value::String),
        prop_oneof![
            Just("t3.medium"),
            Just("10Gi"),
            Just("-1"),
            Just("1e30"),
            Just("99999999999999999999"),
            Just("custom-4-4096"),
            Just("e2-custom-small-"),
            Just("500m"),
            Just("")
        ]
        .prop_map(|s| Value::String(s.into())),
    ];
    let keys = prop_oneof![
        Just("instanceType"),
        Just("diskSize"),
        Just("cpus"),
        Just("memoryMB"),
        Just("memory"),
        Just("virtualMachine"),
        Just("template"),
        Just("primaryDisk"),
        Just("secondaryDisks"),
        Just("size"),
        Just("disks"),
        Just("value"),
        Just("secretKeyRef"),
        Just("machineType"),
        Just("vmSize"),
        Just("osDiskSize"),
        Just("dataDiskSize"),
        Just("instancetype"),
        Just("name"),
        Just("vcpus"),
        Just("cores"),
        Just("cpuCores"),
        Just("diskSizeGB"),
        Just("driverSpec"),
        Just("hardwareRef"),
        Just("vcpu"),
        Just("flavor"),
        Just("rootDiskSizeGB"),
        Just("serverType"),
        Just("x"),
    ];
    leaf.prop_recursive(5, 64, 8, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((keys.clone(), inner), 0..6).prop_map(|kv| Value::Object(
                kv.into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect::<Map<_, _>>()
            )),
        ]
    })
}

fn provider_name() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(Provider::NAMES.to_vec()).prop_map(str::to_owned),
        "[a-z]{0,6}",
    ]
}

fn catalog() -> SizeCatalog {
    let admin = AdminCatalog::parse(
        "providers:\n  kubevirt:\n    name: {cpu: 1, memory: 1Gi}\n  edge:\n    \"*\": {cpu: 1, memory: 1Gi}\nrootDiskDefaults: {vsphere: 1Gi}\n",
    )
    .unwrap();
    SizeCatalog::shipped().with_admin(&admin)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn arbitrary_provider_spec_never_panics(provider in provider_name(), spec in arbitrary_json()) {
        let c = catalog();
        let value = json!({"cloudProvider": provider, "cloudProviderSpec": spec});
        match size_provider_spec(&value, &c, None) {
            Ok(size) => {
                prop_assert!(size.iter().all(|(_, q)| !q.is_negative()), "{size}");
            }
            Err(e) => {
                prop_assert!(SizingError::REASONS.contains(&e.reason()));
                prop_assert!(!e.to_string().is_empty());
            }
        }
    }

    #[test]
    fn arbitrary_top_level_never_panics(value in arbitrary_json()) {
        let _ = size_provider_spec(&value, &catalog(), None);
    }

    #[test]
    fn arbitrary_admin_text_never_panics(text in "[a-z:{}\\[\\], \n\"*0-9.-]{0,80}") {
        let _ = AdminCatalog::parse(&text);
    }
}
