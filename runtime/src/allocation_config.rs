//! The master's `ValidatingWebhookConfiguration` for master-controller's allocation webhook
//! (docs/groups.md, "Allocation mode"): which requests the API server sends it. The chart renders
//! the same (deploy/charts/kkp-quota/templates/allocation-webhook.yaml,
//! master-controller/tests/allocation.rs compares them); the demo fleet and tests register this
//! one.

use serde_json::{Value, json};

/// The webhook's path.
pub const PATH: &str = "/validate/allocation";

/// The configuration's name.
pub const NAME: &str = "kkp-quota-allocation";

/// Only requests that can change an allocation: every CREATE and DELETE, and an UPDATE that
/// changes `spec` (master-controller's own metadata and status writes never reach the webhook,
/// so a webhook that is down does not stop them).
pub const SPEC_CHANGES_ONLY: &str = "request.operation != 'UPDATE' || object.spec != oldObject.spec";

/// The configuration, the webhook reached at `client_config` (`{"url": ..., "caBundle": ...}`
/// or `{"service": ..., "caBundle": ...}`).
pub fn configuration(client_config: &Value) -> Value {
    let rule = |group: &str, version: &str, resources: &[&str]| {
        json!({
            "apiGroups": [group],
            "apiVersions": [version],
            "resources": resources,
            "operations": ["CREATE", "UPDATE", "DELETE"],
            "scope": "Cluster",
        })
    };
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": NAME},
        "webhooks": [{
            "name": "allocation.kkp-quota.dev",
            "clientConfig": client_config,
            "rules": [
                rule("kubermatic.k8c.io", "v1", &["resourcequotas"]),
                rule("kkp-quota.dev", "v1alpha1", &["projectquotas", "quotagroups"]),
            ],
            "matchConditions": [{"name": "spec-changes-only", "expression": SPEC_CHANGES_ONLY}],
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 10,
        }],
    })
}
