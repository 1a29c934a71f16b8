//! The conformance corpus: per provider, provider specs with the size machine-controller builds
//! for them (or the refusal and the words it must contain), in `tests/conformance/<provider>.json`.
//!
//! A case is `{name, spec, os?, admin?, size: [cpu, memory, storage, gpu]}` or
//! `{..., refused: {reason, says: [..]}}`. `spec` is the `cloudProviderSpec`, `os` the
//! `operatingSystem` (default ubuntu), `admin` an admin catalog text. References resolve through
//! one fixed secret: `kube-system/sizes`, key `type` = `m5.xlarge`.

#![allow(clippy::unwrap_used)] // test code: a panic is a test failure

use std::path::PathBuf;

use kkp_quota_crds::{Quantity, Resource};
use provider_sizes::{
    AdminCatalog, Provider, ResolveError, SizeCatalog, ValueRef, ValueResolver, size_provider_spec,
};
use serde_json::{Value, json};

struct OneSecret;

impl ValueResolver for OneSecret {
    fn resolve(&self, reference: &ValueRef) -> Result<String, ResolveError> {
        match reference {
            ValueRef::Secret(r) if r.namespace == "kube-system" && r.name == "sizes" && r.key == "type" => {
                Ok("m5.xlarge".into())
            }
            other => Err(ResolveError::not_found(other)),
        }
    }
}

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/conformance")
}

fn q(text: &str) -> Quantity {
    text.parse().unwrap()
}

/// Runs one case; `Err` describes the mismatch.
fn run(cloud_provider: &str, case: &Value) -> Result<(), String> {
    let catalog = match case.get("admin").and_then(Value::as_str) {
        Some(text) => {
            SizeCatalog::shipped().with_admin(&AdminCatalog::parse(text).map_err(|e| e.to_string())?)
        }
        None => SizeCatalog::shipped(),
    };
    let provider_spec = json!({
        "cloudProvider": cloud_provider,
        "operatingSystem": case.get("os").and_then(Value::as_str).unwrap_or("ubuntu"),
        "cloudProviderSpec": case["spec"],
    });
    let got = size_provider_spec(&provider_spec, &catalog, Some(&OneSecret));
    if let Some(size) = case.get("size") {
        let got = got.map_err(|e| format!("refused: {e}"))?;
        let want = [Resource::Cpu, Resource::Memory, Resource::Storage]
            .into_iter()
            .zip(size.as_array().unwrap())
            .map(|(r, v)| (r, q(v.as_str().unwrap())))
            .chain([(Resource::Gpu, Quantity::from_units(size[3].as_i64().unwrap()))]);
        for (resource, want) in want {
            if got.get(resource) != Some(want) {
                return Err(format!("{resource:?}: want {want}, got {got}"));
            }
        }
        return Ok(());
    }
    let refused = &case["refused"];
    let e = match got {
        Ok(size) => return Err(format!("sized as {size}, want a refusal")),
        Err(e) => e,
    };
    let reason = refused["reason"].as_str().unwrap();
    if e.reason() != reason {
        return Err(format!("reason {}, want {reason}: {e}", e.reason()));
    }
    let message = e.to_string();
    for word in refused["says"].as_array().unwrap() {
        let word = word.as_str().unwrap();
        if !message.contains(word) {
            return Err(format!("message does not say {word:?}: {message}"));
        }
    }
    Ok(())
}

#[test]
fn corpus() {
    let mut failures = Vec::new();
    let mut count = 0;
    let mut files: Vec<_> = std::fs::read_dir(corpus_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}: every sized provider needs a conformance corpus (docs/architecture.md, \"A new cloud provider\")",
                path.display()
            )
        });
        let file: Value = serde_json::from_str(&text).unwrap();
        let provider = file["cloudProvider"].as_str().unwrap();
        for case in file["cases"].as_array().unwrap() {
            count += 1;
            if let Err(why) = run(provider, case) {
                failures.push(format!("{provider}: {}: {why}", case["name"]));
            }
        }
    }
    assert!(count >= 80, "only {count} cases");
    assert!(
        failures.is_empty(),
        "{} of {count} cases fail:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_sized_provider_has_a_corpus() {
    for provider in Provider::ALL {
        if matches!(provider, Provider::Edge | Provider::External | Provider::Fake) {
            continue;
        }
        let path = corpus_dir().join(format!("{}.json", provider.name()));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}: every sized provider needs a conformance corpus (docs/architecture.md, \"A new cloud provider\")",
                path.display()
            )
        });
        let file: Value = serde_json::from_str(&text).unwrap();
        assert!(file["cases"].as_array().unwrap().len() >= 2, "{}", path.display());
    }
}
