//! Fuzz targets, as proptest properties (cargo-fuzz needs a nightly toolchain; this workspace
//! pins a stable one): arbitrary bytes and arbitrary JSON through
//!
//! - `AdmissionReview` body -> decision: `parse_review`, `decision_request` (Machine parsing and
//!   sizing), `decide` and `decide_batch`, the whole admission path without a server;
//! - the providerSpec parsers: a Machine from arbitrary JSON, sized by `provider_sizes::size_machine`;
//! - `Quantity` parsing (`FromStr` and JSON).
//!
//! Properties: nothing panics; every denial has a message; a message names no project but the
//! caller's own; a size is never negative; a quantity that parses prints back to itself.
//! `make test` runs the default number of cases per target (256, a few seconds);
//! `PROPTEST_CASES=100000 cargo test --release -p machine-webhook --test fuzz` runs longer.
//! Regression tests for what they found are at the end of this file.

#![allow(clippy::unwrap_used)] // test code: a panic is a finding

use std::str::FromStr as _;

use kkp_quota_crds::machine::Machine;
use kkp_quota_crds::{Quantity, Resource, ResourceDetails};
use machine_webhook::decision::{QuotaState, Reason, decide, decide_batch};
use machine_webhook::review::{BadReview, decision_request, parse_review};
use proptest::prelude::*;
use provider_sizes::{SizeCatalog, size_machine};
use serde_json::{Map, Value, json};

const PROJECT: &str = "demo";

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        Just(json!(1e30)),
        Just(json!(-1)),
        Just(json!(-1e30)),
        "[a-zA-Z0-9.\\-/*]{0,12}".prop_map(Value::String),
        prop::sample::select(vec![
            "t3.medium",
            "m5.24xlarge",
            "10Gi",
            "-1",
            "-10Gi",
            "1e30",
            "1e308",
            "99999999999999999999",
            "500m",
            "",
            "aws",
            "vsphere",
            "hetzner",
            "cx32",
            "kubevirt",
            "anexia",
            "openstack",
            "CREATE",
            "UPDATE",
            "DELETE",
            "machines",
            "cluster.k8s.io/v1alpha1",
            "Machine",
        ])
        .prop_map(|s| Value::String(s.to_owned())),
    ]
}

fn keys() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "cloudProvider",
        "cloudProviderSpec",
        "instanceType",
        "diskSize",
        "cpus",
        "memoryMB",
        "diskSizeGB",
        "memory",
        "virtualMachine",
        "template",
        "primaryDisk",
        "secondaryDisks",
        "size",
        "disks",
        "value",
        "secretKeyRef",
        "serverType",
        "vmSize",
        "machineType",
        "flavor",
        "providerSpec",
        "spec",
        "metadata",
        "name",
        "uid",
        "ownerReferences",
        "deletionTimestamp",
        "x-unknown-field",
    ])
}

/// Arbitrary JSON whose object keys are mostly ones the parsers look at.
fn json_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(6, 96, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((keys(), inner), 0..6).prop_map(|kv| Value::Object(
                kv.into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect::<Map<_, _>>()
            )),
        ]
    })
}

/// A Machine-shaped object whose providerSpec is arbitrary (and, sometimes, a Machine of a known
/// provider with arbitrary field values).
fn machine_json() -> impl Strategy<Value = Value> {
    let provider = prop::sample::select(vec![
        "aws",
        "vsphere",
        "hetzner",
        "kubevirt",
        "anexia",
        "nutanix",
        "openstack",
        "azure",
        "gce",
        "digitalocean",
        "vmware-cloud-director",
        "opennebula",
        "nope",
    ]);
    let spec = prop_oneof![
        json_value(),
        (provider, prop::collection::vec((keys(), leaf()), 0..8)).prop_map(|(p, fields)| {
            json!({
                "cloudProvider": p,
                "cloudProviderSpec": Value::Object(
                    fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
                ),
            })
        }),
    ];
    (spec, json_value(), "[a-z0-9-]{0,10}").prop_map(|(value, extra, name)| {
        json!({
            "apiVersion": "cluster.k8s.io/v1alpha1",
            "kind": "Machine",
            "metadata": {"name": name, "namespace": "kube-system", "uid": "u"},
            "spec": {"providerSpec": {"value": value}},
            "unknown": extra,
        })
    })
}

fn operation() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec!["CREATE", "UPDATE", "DELETE", "CONNECT"]).prop_map(str::to_owned),
        "[A-Z]{0,7}",
    ]
}

fn review_json() -> impl Strategy<Value = Value> {
    (
        operation(),
        prop_oneof![machine_json(), json_value()],
        prop_oneof![machine_json(), Just(Value::Null), json_value()],
        any::<bool>(),
        prop_oneof![Just("machines"), Just("machinesets"), Just("")],
        prop_oneof![Just(Value::Null), Just(json!("status"))],
    )
        .prop_map(|(op, object, old, dry, resource, sub)| {
            json!({
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {
                    "uid": "fuzz",
                    "resource": {"group": "cluster.k8s.io", "version": "v1alpha1", "resource": resource},
                    "subResource": sub,
                    "name": "m",
                    "namespace": "kube-system",
                    "operation": op,
                    "object": object,
                    "oldObject": old,
                    "dryRun": dry,
                    "userInfo": {"username": "fuzz", "extra": {"x": ["y"]}},
                }
            })
        })
}

fn cpu(n: u32) -> ResourceDetails {
    let mut d = ResourceDetails::default();
    d.set(Resource::Cpu, Some(Quantity::from_units(i64::from(n))));
    d
}

fn quota_state() -> impl Strategy<Value = Option<QuotaState>> {
    prop_oneof![
        Just(None),
        (0u32..64, 0u32..64, 0u32..64, 0u32..16).prop_map(|(limit, local, reserved, allotted)| {
            Some(QuotaState {
                limit: cpu(limit),
                local_usage: cpu(local),
                reserved: cpu(reserved),
                allotted: cpu(allotted),
                seed: None,
                ..QuotaState::default()
            })
        }),
    ]
}

/// The admission path without a server; checks what must hold for every answer.
fn admit(body: &[u8], state: Option<&QuotaState>) -> Result<(), TestCaseError> {
    let request = match parse_review(body) {
        Ok(request) => request,
        Err(BadReview::Json(_) | BadReview::WrongType { .. } | BadReview::NoRequest) => return Ok(()),
    };
    let catalog = SizeCatalog::shipped();
    let verdict = match decision_request(&request, &catalog) {
        Ok((_, decision)) => {
            let batch = decide_batch(PROJECT, state, std::slice::from_ref(&decision));
            prop_assert_eq!(batch.len(), 1);
            decide(PROJECT, state, &decision)
        }
        Err(answer) => *answer,
    };
    if !verdict.allowed {
        let message = verdict.message.as_deref().unwrap_or_default();
        prop_assert!(!message.is_empty(), "a denial without a message: {:?}", verdict);
        if verdict.reason == Reason::QuotaExceeded {
            prop_assert!(message.contains(r#"project "demo""#), "{}", message);
        }
    }
    for text in verdict.message.iter().chain(&verdict.warnings) {
        // The only project a message may name is the caller's.
        for (i, _) in text.match_indices("project \"") {
            prop_assert!(text[i..].starts_with(r#"project "demo""#), "{}", text);
        }
    }
    Ok(())
}

proptest! {
    /// Arbitrary bytes as a request body.
    #[test]
    fn review_from_arbitrary_bytes(body in prop::collection::vec(any::<u8>(), 0..2048), state in quota_state()) {
        admit(&body, state.as_ref())?;
    }

    /// Well-formed reviews with arbitrary Machines, whole or cut off / corrupted at a random byte.
    #[test]
    fn review_from_arbitrary_json(
        review in review_json(),
        cut in any::<prop::sample::Index>(),
        flip in any::<Option<(prop::sample::Index, u8)>>(),
        truncate in any::<bool>(),
        state in quota_state(),
    ) {
        let mut body = serde_json::to_vec(&review).unwrap();
        if let Some((at, byte)) = flip {
            let at = at.index(body.len());
            body[at] = byte;
        }
        if truncate {
            body.truncate(cut.index(body.len() + 1));
        }
        admit(&body, state.as_ref())?;
    }

    /// A Machine from arbitrary JSON, sized: never a panic, never a negative amount.
    #[test]
    fn provider_spec_parsers(machine in machine_json()) {
        let Ok(machine) = serde_json::from_value::<Machine>(machine) else { return Ok(()); };
        if let Ok(size) = size_machine(&machine, &SizeCatalog::shipped(), None) {
            for &resource in Resource::ALL {
                prop_assert!(size.amount(resource) >= Quantity::ZERO, "{:?}: {:?}", resource, size);
            }
        }
    }

    /// Any text: parses or is refused; what parses prints back to the same quantity.
    #[test]
    fn quantity_from_any_text(text in prop_oneof![
        any::<String>(),
        "[+-]?[0-9]{0,40}(\\.[0-9]{0,40})?([eE][+-]?[0-9]{0,5}|[KMGTPE]i|[numkMGTPE])?",
    ]) {
        if let Ok(q) = Quantity::from_str(&text) {
            let back = Quantity::from_str(&q.to_string());
            prop_assert_eq!(back.as_ref().ok(), Some(&q), "{} -> {}", text, q);
        }
    }

    /// Quantities as JSON values (numbers of any size, strings): parsed or refused.
    #[test]
    fn quantity_from_json(value in leaf()) {
        let details = serde_json::from_value::<ResourceDetails>(json!({"cpu": value, "memory": value}));
        if let Ok(d) = details {
            let _ = d.amount(Resource::Cpu).to_string();
        }
    }
}

// Regression tests for the cases the issue lists and for what the targets found.

fn review_bytes(object: &Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "r", "operation": "CREATE", "name": "m",
            "resource": {"group": "cluster.k8s.io", "version": "v1alpha1", "resource": "machines"},
            "object": object}
    }))
    .unwrap()
}

fn deny_message(object: &Value) -> String {
    let request = parse_review(&review_bytes(object)).unwrap();
    let state = QuotaState {
        limit: cpu(16),
        ..QuotaState::default()
    };
    let verdict = match decision_request(&request, &SizeCatalog::shipped()) {
        Ok((_, decision)) => decide(PROJECT, Some(&state), &decision),
        Err(answer) => *answer,
    };
    assert!(!verdict.allowed, "{verdict:?}");
    verdict.message.unwrap()
}

fn vsphere(spec: &Value) -> Value {
    json!({"metadata": {"name": "m"}, "spec": {"providerSpec": {"value": {
        "cloudProvider": "vsphere", "cloudProviderSpec": spec}}}})
}

#[test]
fn nesting_deeper_than_serde_allows_is_a_bad_request_not_a_stack_overflow() {
    for depth in [129, 10_000, 1_000_000] {
        let body = format!(
            r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u","operation":"CREATE","object":{}{}}}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        );
        let error = parse_review(body.as_bytes()).unwrap_err();
        assert!(error.to_string().contains("recursion limit"), "{depth}: {error}");
    }
}

#[test]
fn wrong_kind_or_version_is_refused() {
    for (api_version, kind) in [
        ("admission.k8s.io/v1beta1", "AdmissionReview"),
        ("admission.k8s.io/v1", "ConversionReview"),
        ("", ""),
    ] {
        let body =
            json!({"apiVersion": api_version, "kind": kind, "request": {"uid": "u", "operation": "CREATE"}});
        let error = parse_review(&serde_json::to_vec(&body).unwrap()).unwrap_err();
        assert!(matches!(error, BadReview::WrongType { .. }), "{error}");
    }
    let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"});
    assert!(matches!(
        parse_review(&serde_json::to_vec(&body).unwrap()),
        Err(BadReview::NoRequest)
    ));
}

#[test]
fn absurd_quantities_are_denied_with_a_clear_message() {
    let huge_cpu = deny_message(&vsphere(
        &json!({"cpus": 1e30, "memoryMB": 2048, "diskSizeGB": 10}),
    ));
    assert!(
        huge_cpu.contains("cannot be sized") || huge_cpu.contains("needs"),
        "{huge_cpu}"
    );
    assert!(huge_cpu.contains("cpus"), "{huge_cpu}");
    let negative_disk = deny_message(&vsphere(&json!({"cpus": 2, "memoryMB": 2048, "diskSizeGB": -10})));
    assert!(negative_disk.contains("diskSizeGB"), "{negative_disk}");
    assert!(negative_disk.contains("non-negative"), "{negative_disk}");
    let string_cpu = deny_message(&vsphere(
        &json!({"cpus": "1e30", "memoryMB": 2048, "diskSizeGB": 10}),
    ));
    assert!(string_cpu.contains("cpus"), "{string_cpu}");
}

#[test]
fn unknown_fields_are_ignored() {
    let mut machine = vsphere(&json!({"cpus": 2, "memoryMB": 2048, "diskSizeGB": 10, "newField": {"a": 1}}));
    machine["status"] = json!({"whatever": [1, 2, 3]});
    machine["spec"]["futureField"] = json!(true);
    let mut review: Value = serde_json::from_slice(&review_bytes(&machine)).unwrap();
    review["request"]["somethingNew"] = json!({"x": 1});
    review["extra"] = json!("y");
    let request = parse_review(&serde_json::to_vec(&review).unwrap()).unwrap();
    let (_, decision) = decision_request(&request, &SizeCatalog::shipped()).unwrap();
    let state = QuotaState {
        limit: cpu(16),
        ..QuotaState::default()
    };
    let verdict = decide(PROJECT, Some(&state), &decision);
    assert!(verdict.allowed, "{verdict:?}");
}

#[test]
fn a_machine_that_is_not_an_object_is_a_bad_request() {
    let message = deny_message(&json!("just a string"));
    assert!(message.contains("is not a readable Machine"), "{message}");
}
