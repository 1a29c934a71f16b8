//! The `ValidatingWebhookConfiguration` `kkp-quota-machines` in every user cluster: points the
//! user cluster's apiserver at the machine-webhook for Machine CREATE and UPDATE (or CREATE
//! only, [`Operations::Create`]). Applied with
//! server-side apply (field manager `kkp-quota-seed-controller`), watched, and applied again when
//! it is deleted or edited.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kkp_quota_crds::kkp::Cluster;
use kkp_quota_runtime::watch::relisting_watcher;
use kkp_quota_runtime::webhook_auth::{PATH_PREFIX, ReloadingKeys, SigningKeys};
use kube::api::{Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::Shared;

pub const NAME: &str = "kkp-quota-machines";
pub const FIELD_MANAGER: &str = "kkp-quota-seed-controller";

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

/// How often the URL-signing key file is checked for a change.
pub const KEY_POLL: Duration = Duration::from_secs(1);

/// The URL for one user cluster: `<base>/validate/machines/<cluster>/<token>`, the token signed
/// with the first URL-signing key over the cluster's name and UID (see
/// `kkp_quota_runtime::webhook_auth`); without keys (`--insecure-no-auth`), `<base>/validate/machines/<cluster>`.
pub fn url(cluster: &str, uid: &str, base_url: &str, keys: Option<&SigningKeys>) -> String {
    match keys {
        Some(keys) => {
            kkp_quota_runtime::webhook_auth::webhook_url(base_url, cluster, &keys.sign(cluster, uid))
        }
        None => format!("{}{PATH_PREFIX}/{cluster}", base_url.trim_end_matches('/')),
    }
}

/// The configuration for one user cluster, whose webhook URL is `url`. The match condition is
/// there with either `operations` (on a CREATE it is true at its first test), so that switching
/// changes only the rule.
pub fn desired(url: &str, ca_bundle: Option<&[u8]>, operations: Operations) -> Value {
    let mut client_config = json!({ "url": url });
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

/// Every [`KEY_POLL`], `read`s a file into `sender` when what it holds now differs from what
/// was sent by `same`; what a read cannot give (`None`) never replaces what was sent. Each
/// change is logged as `what` and makes every user cluster's configuration be written again.
async fn follow_file<T, F, Fut>(
    sender: &watch::Sender<Option<T>>,
    what: &str,
    mut read: F,
    same: impl Fn(&T, &T) -> bool,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let mut ticker = tokio::time::interval(KEY_POLL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let Some(current) = read().await else { continue };
        sender.send_if_modified(|held| {
            let changed = held.as_ref().is_none_or(|h| !same(h, &current));
            if changed {
                info!("{what} changed: rewriting every user cluster's webhook configuration");
                *held = Some(current);
            }
            changed
        });
    }
}

/// The keys the webhook URLs are signed with, as a channel that changes when the first
/// (signing) key does, until the task is aborted.
pub async fn follow_keys(keys: Arc<ReloadingKeys>, shared: Arc<Shared>) {
    let read = || std::future::ready(Some(keys.current()));
    follow_file(&shared.url_keys, "URL-signing key", read, |a, b| {
        a.signing_fingerprint() == b.signing_fingerprint()
    })
    .await;
}

type CaReceiver = watch::Receiver<Option<Arc<Vec<u8>>>>;

/// The CA bundle in `path`; `None` while it is empty (a Secret not yet filled).
pub async fn read_ca(path: &std::path::Path) -> std::io::Result<Option<Arc<Vec<u8>>>> {
    match tokio::fs::read(path).await {
        Ok(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => Ok(None),
        Ok(bytes) => Ok(Some(Arc::new(bytes))),
        // A mounted Secret without the key yet: the same as empty.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The CA bundle of `path` as a channel that changes when the file does (a rotated CA reaching
/// the mounted file), until the task is aborted. A file briefly empty (a Secret being
/// rewritten) never takes the CA away.
pub async fn follow_ca(path: std::path::PathBuf, shared: Arc<Shared>) {
    let read = || async {
        read_ca(&path).await.unwrap_or_else(|e| {
            warn!(file = %path.display(), error = %e, "cannot read the webhook CA bundle");
            None
        })
    };
    follow_file(&shared.webhook_ca, "webhook CA bundle", read, |a, b| a == b).await;
}

/// The user cluster's `Cluster` UID on the seed (retried until it is read).
async fn cluster_uid(seed: &Client, cluster: &str) -> String {
    let api: Api<Cluster> = Api::all(seed.clone());
    let mut delay = Duration::from_millis(200);
    loop {
        match api.get(cluster).await {
            Ok(object) => return object.metadata.uid.unwrap_or_default(),
            Err(e) => {
                warn!(error = %e, cluster, "cannot read the Cluster for its webhook URL; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// Keeps the configuration in one user cluster until the task is aborted: applied when it is
/// missing or differs, and again whenever the signing key changes (new token in the URL) or the
/// `Cluster`'s UID does (re-read every `--resync-period`).
pub async fn keep(client: Client, shared: Arc<Shared>, cluster: String) {
    let Some(base) = shared.config.webhook_url.clone() else {
        return;
    };
    let mut keys = shared.url_keys.subscribe();
    let mut ca = shared.webhook_ca.subscribe();
    // With a CA file that is still empty (a certificate not issued yet), a configuration
    // without a CA would make the API server distrust the webhook: wait for the CA.
    if shared.config.webhook_ca_file.is_some() && ca.wait_for(Option::is_some).await.is_err() {
        return;
    }
    let mut uid = cluster_uid(&shared.seed, &cluster).await;
    // What the configuration should be now, from the latest keys and CA.
    let build = |uid: &str, keys: &watch::Receiver<Option<Arc<SigningKeys>>>, ca: &CaReceiver| {
        let ca = ca.borrow();
        desired(
            &url(&cluster, uid, &base, keys.borrow().as_deref()),
            ca.as_deref().map(Vec::as_slice),
            shared.config.webhook_operations,
        )
    };
    let mut wanted = build(&uid, &keys, &ca);
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("metadata.name={NAME}"));
    let mut stream = relisting_watcher(api.clone(), config, None)
        .default_backoff()
        .boxed();
    let mut seen = false;
    let mut actual: Option<Value> = None;
    let mut recheck = tokio::time::interval(shared.config.resync_period);
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    recheck.tick().await;
    let mut keys_open = true;
    let mut ca_open = true;
    loop {
        let needs_apply = tokio::select! {
            event = stream.next() => match event {
                None => return,
                Some(Ok(Event::Init)) => {
                    seen = false;
                    false
                }
                Some(Ok(Event::InitApply(object) | Event::Apply(object))) => {
                    seen = true;
                    actual = serde_json::to_value(&object).ok();
                    !actual.as_ref().is_some_and(|a| contains(a, &wanted))
                }
                Some(Ok(Event::InitDone)) => !seen,
                Some(Ok(Event::Delete(_))) => {
                    seen = false;
                    actual = None;
                    true
                }
                Some(Err(e)) => {
                    warn!(error = %e, "watch of the webhook configuration failed; retrying");
                    false
                }
            },
            changed = keys.changed(), if keys_open => {
                if changed.is_err() {
                    keys_open = false;
                    false
                } else {
                    wanted = build(&uid, &keys, &ca);
                    seen && !actual.as_ref().is_some_and(|a| contains(a, &wanted))
                }
            }
            changed = ca.changed(), if ca_open => {
                if changed.is_err() {
                    ca_open = false;
                    false
                } else {
                    wanted = build(&uid, &keys, &ca);
                    seen && !actual.as_ref().is_some_and(|a| contains(a, &wanted))
                }
            }
            _ = recheck.tick() => {
                let now = cluster_uid(&shared.seed, &cluster).await;
                if now == uid {
                    false
                } else {
                    info!(cluster, "the Cluster was recreated (new UID): new webhook URL");
                    uid = now;
                    wanted = build(&uid, &keys, &ca);
                    true
                }
            }
        };
        if needs_apply {
            let params = PatchParams::apply(FIELD_MANAGER).force();
            match api.patch(NAME, &params, &Patch::Apply(&wanted)).await {
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
    fn desired_points_at_the_cluster_path_with_its_token() {
        let keys = SigningKeys::parse(&kkp_quota_runtime::webhook_auth::generate_key()).expect("keys");
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
