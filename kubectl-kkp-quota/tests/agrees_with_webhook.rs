//! `kubectl kkp-quota fits` sizes a Machine exactly as the webhook does: for every case of
//! provider-sizes' conformance corpus (every provider, sizes and refusals), the plugin's size is
//! the one the webhook asks of the quota for a create, or both refuse with the same message.

use std::path::PathBuf;

use kkp_quota_crds::machine::Machine;
use kubectl_kkp_quota::fits;
use machine_webhook::decision::Ask;
use machine_webhook::review::ask_for;
use provider_sizes::{AdminCatalog, SizeCatalog};
use serde_json::{Value, json};

fn corpus() -> Vec<(String, Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../provider-sizes/tests/conformance");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("the conformance corpus")
        .map(|e| e.expect("a corpus entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path).expect("a corpus file");
            let file: Value = serde_json::from_str(&text).expect("corpus JSON");
            let provider = file["cloudProvider"].as_str().expect("cloudProvider").to_owned();
            (provider, file)
        })
        .collect()
}

#[test]
fn fits_sizes_every_corpus_machine_as_the_webhook_does() {
    let mut compared = 0;
    let mut refused = 0;
    for (provider, file) in corpus() {
        for case in file["cases"].as_array().expect("cases") {
            let name = case["name"].as_str().unwrap_or("?");
            let catalog = match case.get("admin").and_then(Value::as_str) {
                Some(text) => {
                    SizeCatalog::shipped().with_admin(&AdminCatalog::parse(text).expect("admin catalog"))
                }
                None => SizeCatalog::shipped(),
            };
            let machine: Machine = serde_json::from_value(json!({
                "apiVersion": "cluster.k8s.io/v1alpha1",
                "kind": "Machine",
                "metadata": {"name": "m", "namespace": "kube-system", "uid": "u"},
                "spec": {"providerSpec": {"value": {
                    "cloudProvider": provider,
                    "operatingSystem": case.get("os").and_then(Value::as_str).unwrap_or("ubuntu"),
                    "cloudProviderSpec": case["spec"],
                }}}
            }))
            .expect("a Machine");
            let plugin = fits::size(&machine, &catalog);
            let webhook = ask_for("CREATE", Some(&machine), None, &catalog);
            match (&plugin, &webhook) {
                (Ok(a), Ask::Create(b)) if a == b => {}
                (Err(a), Ask::Unsizeable(b)) if a.to_string() == *b => refused += 1,
                _ => panic!("{provider}/{name}: the plugin says {plugin:?}, the webhook {webhook:?}"),
            }
            compared += 1;
        }
    }
    // The corpus is large, and holds sizes and refusals both: a test that compared nothing, or
    // only one kind of answer, would prove nothing.
    assert!(compared > 50, "only {compared} cases compared");
    assert!(
        refused > 10 && refused < compared,
        "{refused} of {compared} refused"
    );
    println!("{compared} corpus Machines compared, {refused} of them refused by both");
}
