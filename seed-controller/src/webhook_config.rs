//! The `ValidatingWebhookConfiguration` `kkp-quota-machines` in every user cluster: points the
//! user cluster's apiserver at the machine-webhook for Machine CREATE and UPDATE. Applied with
//! server-side apply (field manager `kkp-quota-seed-controller`), watched, and applied again when
//! it is deleted or edited.

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde_json::{Value, json};
use tracing::{info, warn};

pub const NAME: &str = "kkp-quota-machines";
pub const FIELD_MANAGER: &str = "kkp-quota-seed-controller";

/// The webhook's CEL match condition: every CREATE, and an UPDATE only when the spec changed
/// (a Machine's size comes from its spec alone).
pub const SPEC_CHANGES_ONLY: &str = "request.operation != 'UPDATE' || !has(object.spec) || !has(oldObject.spec) || object.spec != oldObject.spec";

/// The configuration for one user cluster.
pub fn desired(cluster: &str, base_url: &str, ca_bundle: Option<&[u8]>) -> Value {
    let mut client_config = json!({
        "url": format!("{}/validate/machines/{cluster}", base_url.trim_end_matches('/')),
    });
    if let Some(ca) = ca_bundle {
        client_config["caBundle"] = serde_json::to_value(ByteString(ca.to_vec())).unwrap_or(Value::Null);
    }
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {
            "name": NAME,
            "labels": {"app.kubernetes.io/managed-by": "kkp-quota-seed-controller"},
        },
        "webhooks": [{
            "name": "machines.quota.kkp.k8c.io",
            "clientConfig": client_config,
            "rules": [{
                "apiGroups": ["cluster.k8s.io"],
                "apiVersions": ["v1alpha1"],
                "resources": ["machines"],
                "operations": ["CREATE", "UPDATE"],
            }],
            // An UPDATE that leaves the spec alone (finalizers, annotations, labels, status:
            // machine-controller makes many in a Machine's life) cannot change its size, so the
            // API server does not call the webhook for it at all.
            "matchConditions": [{
                "name": "spec-changes-only",
                "expression": SPEC_CHANGES_ONLY,
            }],
            "failurePolicy": "Fail",
            "matchPolicy": "Equivalent",
            "sideEffects": "NoneOnDryRun",
            "timeoutSeconds": 5,
            "admissionReviewVersions": ["v1"],
        }],
    })
}

/// Whether `actual` has everything `wanted` has (objects: every key; lists: same length,
/// element by element), ignoring what the apiserver defaulted or added.
pub fn contains(actual: &Value, wanted: &Value) -> bool {
    match (actual, wanted) {
        (Value::Object(a), Value::Object(w)) => w
            .iter()
            .all(|(k, wv)| a.get(k).is_some_and(|av| contains(av, wv))),
        (Value::Array(a), Value::Array(w)) => {
            a.len() == w.len() && a.iter().zip(w).all(|(av, wv)| contains(av, wv))
        }
        _ => actual == wanted,
    }
}

/// Keeps the configuration in one user cluster until the task is aborted.
pub async fn keep(client: Client, desired: Value) {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("metadata.name={NAME}"));
    let mut stream = watcher::watcher(api.clone(), config).default_backoff().boxed();
    let mut seen = false;
    while let Some(event) = stream.next().await {
        let needs_apply = match event {
            Ok(Event::Init) => {
                seen = false;
                false
            }
            Ok(Event::InitApply(object) | Event::Apply(object)) => {
                seen = true;
                !serde_json::to_value(&object).is_ok_and(|actual| contains(&actual, &desired))
            }
            Ok(Event::InitDone) => !seen,
            Ok(Event::Delete(_)) => {
                seen = false;
                true
            }
            Err(e) => {
                warn!(error = %e, "watch of the webhook configuration failed; retrying");
                false
            }
        };
        if needs_apply {
            let params = PatchParams::apply(FIELD_MANAGER).force();
            match api.patch(NAME, &params, &Patch::Apply(&desired)).await {
                Ok(_) => info!(name = NAME, "webhook configuration applied"),
                Err(e) => {
                    warn!(error = %e, "could not apply the webhook configuration; retrying on the next event");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn desired_points_at_the_cluster_path() {
        let d = desired("alpha", "https://127.0.0.1:9443/", Some(b"PEM"));
        assert_eq!(
            d["webhooks"][0]["clientConfig"]["url"],
            "https://127.0.0.1:9443/validate/machines/alpha"
        );
        assert_eq!(d["webhooks"][0]["clientConfig"]["caBundle"], "UEVN");
        assert_eq!(d["webhooks"][0]["failurePolicy"], "Fail");
    }

    #[test]
    fn contains_ignores_defaults_but_not_edits() {
        let wanted = desired("alpha", "https://x", None);
        let mut actual = wanted.clone();
        actual["webhooks"][0]["namespaceSelector"] = json!({});
        actual["webhooks"][0]["rules"][0]["scope"] = json!("*");
        actual["metadata"]["resourceVersion"] = json!("12");
        assert!(contains(&actual, &wanted));
        actual["webhooks"][0]["failurePolicy"] = json!("Ignore");
        assert!(!contains(&actual, &wanted));
        let mut fewer = wanted.clone();
        fewer["webhooks"][0]["rules"][0]["operations"] = json!(["CREATE"]);
        assert!(!contains(&fewer, &wanted));
    }
}
