//! The `ValidatingWebhookConfiguration`s that send a user cluster's Machines, and a seed's
//! `Cluster` creates, to the quota webhook: their URLs (signed, [`crate::webhook_auth`]) and
//! shapes. seed-controller writes the first into every user cluster and the second onto its
//! seed; the webhook's tests and benchmark register the same ones.

use k8s_openapi::ByteString;
use serde_json::{Value, json};

use crate::webhook_auth::{CLUSTERS_PATH_PREFIX, PATH_PREFIX, SEED_CLUSTERS_UID, SigningKeys};

/// The configuration's name in every user cluster.
pub const NAME: &str = "kkp-quota-machines";

/// The webhook's CEL match condition: every CREATE, and an UPDATE only when `spec.providerSpec`
/// changed (a Machine's size comes from its provider spec alone, and the webhook answers any other
/// update as unchanged).
///
/// Other spec fields change under machine-controller without any change of size: its own
/// mutating webhook defaults `spec.name` on the update that adds its finalizer, before the
/// instance is created, and its status writes (a full update: its CRD has no status subresource)
/// re-serialise a spec another client created, with its defaults filled in. Were those sent here,
/// a quota webhook that is down (`failurePolicy: Fail`) would stop Machines it had already
/// admitted from ever getting an instance.
///
/// The generation test comes first because it is cheap: the API server moves a custom
/// resource's `metadata.generation` before validating admission whenever anything outside
/// `metadata` (and `status`, where that is a subresource) changed, so an unchanged generation
/// means an unchanged spec, and the metadata-only updates machine-controller makes all through a
/// Machine's life stop at an integer comparison instead of walking both provider specs. (The
/// saving is below what `update_storm` resolves: every condition measured there costs the API
/// server the same within its noise.) Where the generation did move, the provider specs decide
/// (compared as JSON values: a re-serialisation that only reorders keys is no change).
pub const PROVIDER_SPEC_CHANGES_ONLY: &str = "request.operation != 'UPDATE' \
    || ((!has(object.metadata.generation) || !has(oldObject.metadata.generation) \
         || object.metadata.generation != oldObject.metadata.generation) \
        && (!has(object.spec) || !has(oldObject.spec) \
            || has(object.spec.providerSpec) != has(oldObject.spec.providerSpec) \
            || (has(object.spec.providerSpec) && object.spec.providerSpec != oldObject.spec.providerSpec)))";

/// The match condition's name in the configuration.
pub const MATCH_CONDITION_NAME: &str = "provider-spec-changes-only";

/// Which Machine operations the user clusters' API servers send to the webhook
/// (`--webhook-operations`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Operations {
    /// CREATE, and every UPDATE that changes the provider spec
    /// ([`PROVIDER_SPEC_CHANGES_ONLY`]): a Machine grown
    /// by editing its providerSpec is checked like a new one.
    #[default]
    CreateAndUpdate,
    /// CREATE only. The API server then spends nothing on any UPDATE, where evaluating the match
    /// condition costs it 5 to 10 % of an update's CPU (`update_storm`). A Machine whose spec is
    /// changed in place is counted at its new size but never checked; the overrun alert
    /// (`KkpQuotaProjectOverQuota`) is then the only guard. For platforms whose Machine specs cannot change: KKP's machine-controller
    /// refuses spec changes in its own webhook, unless the one-shot bypass annotation
    /// `kubermatic.io/bypass-no-spec-mutation-requirement` is set.
    Create,
}

impl Operations {
    /// The rule's `operations`.
    pub fn names(self) -> &'static [&'static str] {
        match self {
            Operations::CreateAndUpdate => &["CREATE", "UPDATE"],
            Operations::Create => &["CREATE"],
        }
    }
}

/// The URL for one user cluster: `<base>/validate/machines/<cluster>/<token>`, the token signed
/// with the first URL-signing key over the cluster's name and UID (see
/// [`crate::webhook_auth`]); without keys (`--insecure-no-auth`), `<base>/validate/machines/<cluster>`.
pub fn url(cluster: &str, uid: &str, base_url: &str, keys: Option<&SigningKeys>) -> String {
    match keys {
        Some(keys) => crate::webhook_auth::webhook_url(base_url, cluster, &keys.sign(cluster, uid)),
        None => format!("{}{PATH_PREFIX}/{cluster}", base_url.trim_end_matches('/')),
    }
}

/// The configuration for one user cluster, whose webhook URL is `url`. The match condition is
/// there with either `operations` (on a CREATE it is true at its first test), so that switching
/// changes only the rule.
pub fn desired(url: &str, ca_bundle: Option<&[u8]>, operations: Operations) -> Value {
    let client_config = with_ca(json!({ "url": url }), ca_bundle);
    let deployments_config = with_ca(json!({ "url": deployments_url(url) }), ca_bundle);
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
                "operations": operations.names(),
            }],
            // An UPDATE that leaves the provider spec alone (finalizers, annotations, labels,
            // status, `spec.name`: machine-controller makes many in a Machine's life) cannot
            // change its size, so the API server does not call the webhook for it at all.
            "matchConditions": [{
                "name": MATCH_CONDITION_NAME,
                "expression": PROVIDER_SPEC_CHANGES_ONLY,
            }],
            "failurePolicy": "Fail",
            "matchPolicy": "Equivalent",
            "sideEffects": "NoneOnDryRun",
            "timeoutSeconds": 5,
            "admissionReviewVersions": ["v1"],
        }, {
            // The policy `reservedCounts`: an autoscaled deployment's create, and a change of
            // its max size or template, may grow the room that counts. The webhook answers at
            // once for a project without the policy.
            "name": "machinedeployments.quota.kkp.k8c.io",
            "clientConfig": deployments_config,
            "rules": [{
                "apiGroups": ["cluster.k8s.io"],
                "apiVersions": ["v1alpha1"],
                "resources": ["machinedeployments"],
                "operations": ["CREATE", "UPDATE"],
            }],
            "matchConditions": [{
                "name": ROOM_MATCH_CONDITION_NAME,
                "expression": AUTOSCALER_ROOM_CHANGES_ONLY,
            }],
            "failurePolicy": "Fail",
            "matchPolicy": "Equivalent",
            "sideEffects": "NoneOnDryRun",
            "timeoutSeconds": 5,
            "admissionReviewVersions": ["v1"],
        }],
    })
}

/// The deployments' URL beside a user cluster's Machine URL `url`: the same token, under
/// `/validate/machinedeployments/`.
pub fn deployments_url(url: &str) -> String {
    url.replacen(
        &format!("{PATH_PREFIX}/"),
        &format!("{DEPLOYMENTS_PATH_PREFIX}/"),
        1,
    )
}

/// The path under which the webhook takes a user cluster's `MachineDeployment`s.
pub const DEPLOYMENTS_PATH_PREFIX: &str = "/validate/machinedeployments";

/// The deployments' match condition's name.
pub const ROOM_MATCH_CONDITION_NAME: &str = "autoscaler-room-changes-only";

/// The `MachineDeployment`s sent to the webhook: those with the cluster autoscaler's max size,
/// on their create, or when either size annotation (min too: bounds with a min above the max, or
/// without a min, are not bounds, so adding or mending the min can give a deployment its room)
/// or the template changes. Never a change of `replicas` alone: the autoscaler makes those all
/// day, and they grow no room.
pub const AUTOSCALER_ROOM_CHANGES_ONLY: &str = "has(object.metadata.annotations) \
    && 'cluster.k8s.io/cluster-api-autoscaler-node-group-max-size' in object.metadata.annotations \
    && (request.operation == 'CREATE' \
        || !has(oldObject.metadata.annotations) \
        || !('cluster.k8s.io/cluster-api-autoscaler-node-group-max-size' in oldObject.metadata.annotations) \
        || !('cluster.k8s.io/cluster-api-autoscaler-node-group-min-size' in oldObject.metadata.annotations) \
        || !('cluster.k8s.io/cluster-api-autoscaler-node-group-min-size' in object.metadata.annotations) \
        || oldObject.metadata.annotations['cluster.k8s.io/cluster-api-autoscaler-node-group-max-size'] \
           != object.metadata.annotations['cluster.k8s.io/cluster-api-autoscaler-node-group-max-size'] \
        || oldObject.metadata.annotations['cluster.k8s.io/cluster-api-autoscaler-node-group-min-size'] \
           != object.metadata.annotations['cluster.k8s.io/cluster-api-autoscaler-node-group-min-size'] \
        || !has(object.spec.template) || !has(oldObject.spec.template) \
        || object.spec.template != oldObject.spec.template)";

/// The configuration's name on each seed: KKP `Cluster` creates to the webhook.
pub const CLUSTERS_NAME: &str = "kkp-quota-clusters";

/// The URL for seed `seed`'s `Cluster` creates: `<base>/validate/clusters/<seed>/<token>`, the
/// token signed over the seed's name and [`SEED_CLUSTERS_UID`]; without keys, no token.
pub fn clusters_url(seed: &str, base_url: &str, keys: Option<&SigningKeys>) -> String {
    let base = format!("{}{CLUSTERS_PATH_PREFIX}/{seed}", base_url.trim_end_matches('/'));
    match keys {
        Some(keys) => format!("{base}/{}", keys.sign(seed, SEED_CLUSTERS_UID)),
        None => base,
    }
}

/// The configuration on a seed that sends every `Cluster` create to `url` (docs/capacity.md).
/// Only creates: a `Cluster` counts one from its creation until it is gone, so nothing else
/// grows a count. `failurePolicy: Fail`, as for Machines: a webhook that cannot be reached
/// refuses new clusters rather than let them past the quota.
///
/// A URL that names a Service (`https://<name>.<namespace>.svc[:port]/...`, the chart's
/// default) is written as a service reference: the seed's own API server often runs outside the
/// cluster's DNS (on the host network, or managed), where user clusters' API servers are pods.
pub fn desired_for_clusters(url: &str, ca_bundle: Option<&[u8]>) -> Value {
    let client_config = with_ca(
        service_reference(url).unwrap_or_else(|| json!({ "url": url })),
        ca_bundle,
    );
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        // No labels: under the chart the object is the chart's (created empty), with its labels.
        "metadata": { "name": CLUSTERS_NAME },
        "webhooks": [{
            "name": "clusters.quota.kkp.k8c.io",
            "clientConfig": client_config,
            "rules": [{
                "apiGroups": ["kubermatic.k8c.io"],
                "apiVersions": ["v1"],
                "resources": ["clusters"],
                "operations": ["CREATE"],
            }],
            // A `Cluster` without a project has no quota: it is not held up by a webhook that
            // is down.
            "objectSelector": {
                "matchExpressions": [{"key": "project-id", "operator": "Exists"}],
            },
            "failurePolicy": "Fail",
            "matchPolicy": "Equivalent",
            "sideEffects": "NoneOnDryRun",
            "timeoutSeconds": 5,
            "admissionReviewVersions": ["v1"],
        }],
    })
}

/// A `clientConfig` with the CA bundle the API server should trust the webhook by, if any.
fn with_ca(mut client_config: Value, ca_bundle: Option<&[u8]>) -> Value {
    if let Some(ca) = ca_bundle {
        client_config["caBundle"] = serde_json::to_value(ByteString(ca.to_vec())).unwrap_or(Value::Null);
    }
    client_config
}

/// `{"service": {namespace, name, port, path}}` for an `https://<name>.<namespace>.svc[:port]`
/// URL (also `.svc.cluster.local`); `None` for any other.
fn service_reference(url: &str) -> Option<Value> {
    let rest = url.strip_prefix("https://")?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) => (host, port.parse::<u16>().ok()?),
        None => (authority, 443),
    };
    let host = host.strip_suffix(".cluster.local").unwrap_or(host);
    let (name, namespace) = host.strip_suffix(".svc")?.split_once('.')?;
    if name.is_empty() || namespace.is_empty() || namespace.contains('.') {
        return None;
    }
    Some(json!({
        "service": {"namespace": namespace, "name": name, "port": port, "path": path},
    }))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deployments_go_to_their_own_path_with_the_same_token() {
        let d = desired(
            "https://h:9443/validate/machines/alpha/tok",
            None,
            Operations::default(),
        );
        assert_eq!(
            d["webhooks"][1]["clientConfig"]["url"],
            "https://h:9443/validate/machinedeployments/alpha/tok"
        );
        assert_eq!(d["webhooks"][1]["rules"][0]["resources"][0], "machinedeployments");
        assert_eq!(
            deployments_url("https://h/validate/machines/validate/machines/x"),
            "https://h/validate/machinedeployments/validate/machines/x"
        );
    }

    #[test]
    fn desired_points_at_the_cluster_path_with_its_token() {
        let keys = SigningKeys::parse(&crate::webhook_auth::generate_key()).expect("keys");
        let token = keys.sign("alpha", "uid-1");
        let d = desired(
            &url("alpha", "uid-1", "https://127.0.0.1:9443/", Some(&keys)),
            Some(b"PEM"),
            Operations::default(),
        );
        assert_eq!(
            d["webhooks"][0]["clientConfig"]["url"],
            format!("https://127.0.0.1:9443/validate/machines/alpha/{token}")
        );
        assert_eq!(keys.verify("alpha", "uid-1", &token), Some(0));
        assert_eq!(
            url("alpha", "uid-1", "https://h/", None),
            "https://h/validate/machines/alpha"
        );
        assert_eq!(d["webhooks"][0]["clientConfig"]["caBundle"], "UEVN");
        assert_eq!(d["webhooks"][0]["failurePolicy"], "Fail");
        assert_eq!(
            d["webhooks"][0]["rules"][0]["operations"],
            json!(["CREATE", "UPDATE"])
        );
    }

    #[test]
    fn the_seed_configuration_sends_cluster_creates_to_the_seed_path() {
        let keys = SigningKeys::parse(&crate::webhook_auth::generate_key()).expect("keys");
        let url = clusters_url("seed-a", "https://h:9443/", Some(&keys));
        let token = url.rsplit('/').next().unwrap();
        assert_eq!(url, format!("https://h:9443/validate/clusters/seed-a/{token}"));
        assert_eq!(keys.verify("seed-a", SEED_CLUSTERS_UID, token), Some(0));
        assert_eq!(keys.verify("seed-b", SEED_CLUSTERS_UID, token), None);
        assert_eq!(
            clusters_url("seed-a", "https://h", None),
            "https://h/validate/clusters/seed-a"
        );
        let d = desired_for_clusters(&url, None);
        assert_eq!(d["metadata"]["name"], CLUSTERS_NAME);
        assert_eq!(d["webhooks"][0]["rules"][0]["resources"], json!(["clusters"]));
        assert_eq!(d["webhooks"][0]["rules"][0]["operations"], json!(["CREATE"]));
        assert_eq!(d["webhooks"][0]["failurePolicy"], "Fail");
        assert_eq!(
            d["webhooks"][0]["objectSelector"]["matchExpressions"][0]["key"],
            "project-id"
        );
    }

    #[test]
    fn a_service_url_reaches_the_seed_as_a_service_reference() {
        let d = desired_for_clusters(
            "https://kkp-quota-machine-webhook.kkp-quota.svc:443/validate/clusters/s/t",
            Some(b"PEM"),
        );
        assert_eq!(
            d["webhooks"][0]["clientConfig"],
            json!({"service": {"namespace": "kkp-quota", "name": "kkp-quota-machine-webhook", "port": 443,
                   "path": "/validate/clusters/s/t"}, "caBundle": "UEVN"})
        );
        let local = desired_for_clusters("https://w.ns.svc.cluster.local/validate/clusters/s", None);
        assert_eq!(local["webhooks"][0]["clientConfig"]["service"]["port"], 443);
        for url in [
            "https://127.0.0.1:9443/validate/clusters/s",
            "https://webhook.example.com/validate/clusters/s",
        ] {
            assert_eq!(
                desired_for_clusters(url, None)["webhooks"][0]["clientConfig"],
                json!({"url": url})
            );
        }
    }

    #[test]
    fn create_only_changes_the_rule_alone() {
        let both = desired(
            "https://x/validate/machines/alpha/t",
            None,
            Operations::CreateAndUpdate,
        );
        let create = desired("https://x/validate/machines/alpha/t", None, Operations::Create);
        assert_eq!(create["webhooks"][0]["rules"][0]["operations"], json!(["CREATE"]));
        let mut same = create.clone();
        same["webhooks"][0]["rules"][0]["operations"] = json!(["CREATE", "UPDATE"]);
        assert_eq!(same, both);
        // A configuration written with the other choice is not what is wanted: applied again.
        assert!(!contains(&both, &create));
        assert!(!contains(&create, &both));
    }

    #[test]
    fn contains_ignores_defaults_but_not_edits() {
        let wanted = desired("https://x/validate/machines/alpha/t", None, Operations::default());
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
