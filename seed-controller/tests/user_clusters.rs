//! The seed-controller and the user clusters themselves: the `ValidatingWebhookConfiguration` it
//! keeps in each (created, restored after deletion and after an edit), a cluster registered
//! while it runs, and a kubeconfig rotated to another apiserver, all without restart; and the
//! rule `--webhook-operations` chooses, rewritten after a restart with the other choice.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use k8s_openapi::api::admissionregistration::v1::{ValidatingWebhook, ValidatingWebhookConfiguration};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use seed_controller::Config;
use seed_controller::webhook_config::{Operations, PROVIDER_SPEC_CHANGES_ONLY};
use serde_json::json;

async fn webhook_configuration(user: &Client) -> Option<ValidatingWebhookConfiguration> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(user.clone());
    api.get_opt("kkp-quota-machines").await.ok().flatten()
}

/// The URL seed-controller must write for `cluster`: its token signed with the first key in
/// `keys` over the Cluster's name and UID on `seed`.
async fn expected_url(seed: &Client, cluster: &str, keys: &std::path::Path) -> String {
    let uid = cluster_uid(seed, cluster).await;
    let keys = kkp_quota_runtime::webhook_auth::SigningKeys::load(keys).unwrap();
    let token = keys.sign(cluster, &uid);
    assert_eq!(keys.verify(cluster, &uid, &token), Some(0));
    format!("https://127.0.0.1:9443/validate/machines/{cluster}/{token}")
}

async fn wait_webhook_configuration(
    user: &Client,
    url: &str,
    not_uid: Option<&str>,
) -> ValidatingWebhookConfiguration {
    e2e::wait_for(WAIT, &format!("webhook configuration with URL {url}"), || async {
        let vwc = webhook_configuration(user).await?;
        let hook = vwc.webhooks.as_ref()?.first()?.clone();
        let ok = hook.client_config.url.as_deref() == Some(url)
            && hook.failure_policy.as_deref() == Some("Fail")
            && not_uid.is_none_or(|u| vwc.uid().as_deref() != Some(u));
        ok.then_some(vwc)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_configuration_is_kept_and_clusters_are_followed_without_restart() {
    init_logs();
    let (seed_cp, one_cp, two_cp) = tokio::try_join!(
        e2e::ControlPlane::start("seed"),
        e2e::ControlPlane::start("one"),
        e2e::ControlPlane::start("two"),
    )
    .unwrap();
    let (seed, one, two) = (seed_cp.client(), one_cp.client(), two_cp.client());
    ensure_namespace(&seed, "kubermatic").await;
    create_quota_copy(&seed, "demo", "1000").await;
    // Machines exist before the webhook does (the webhook server is not running in this test,
    // and the configuration fails closed).
    let a_spec = aws("t3.medium");
    let b_spec = hetzner("cx32");
    create_machine(&one, "a", &a_spec).await;
    create_machine(&two, "b", &b_spec).await;

    let certs = e2e::certs::WebhookCerts::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let paths = certs.write_to(dir.path()).unwrap();
    let keys = dir.path().join("url-signing-keys");
    let (old_key, new_key) = (
        kkp_quota_runtime::webhook_auth::generate_key(),
        kkp_quota_runtime::webhook_auth::generate_key(),
    );
    e2e::system::write_url_signing_keys(&keys, &[&old_key]).unwrap();
    let mut config = Config::for_tests("seed");
    config.webhook_url = Some("https://127.0.0.1:9443".into());
    config.webhook_ca_file = Some(paths.ca.clone());
    config.url_signing_keys = Some(keys.clone());
    let running = start_controller(&seed_cp, config).await;

    // Registered while the controller runs: followed.
    register_cluster(&seed, "delta", "demo", &one_cp.kubeconfig_yaml()).await;
    wait_cluster_usage(&seed, "delta", &size_of(&a_spec)).await;
    wait_local_usage(&seed, "demo", &size_of(&a_spec)).await;

    // The webhook configuration, as the contract says.
    let url = expected_url(&seed, "delta", &keys).await;
    let vwc = wait_webhook_configuration(&one, &url, None).await;
    let hook = vwc.webhooks.clone().unwrap().remove(0);
    assert_eq!(
        hook.client_config.ca_bundle.as_ref().map(|b| b.0.clone()),
        Some(certs.ca_pem.as_bytes().to_vec())
    );
    assert_eq!(hook.timeout_seconds, Some(5));
    assert_eq!(hook.side_effects, "NoneOnDryRun");
    assert_eq!(hook.admission_review_versions, vec!["v1".to_owned()]);
    assert_eq!(hook.match_policy.as_deref(), Some("Equivalent"));
    let rule = hook.rules.clone().unwrap().remove(0);
    assert_eq!(rule.api_groups, Some(vec!["cluster.k8s.io".to_owned()]));
    assert_eq!(rule.api_versions, Some(vec!["v1alpha1".to_owned()]));
    assert_eq!(rule.resources, Some(vec!["machines".to_owned()]));
    assert_eq!(
        rule.operations,
        Some(vec!["CREATE".to_owned(), "UPDATE".to_owned()])
    );

    // Deleted: restored.
    let api: Api<ValidatingWebhookConfiguration> = Api::all(one.clone());
    api.delete("kkp-quota-machines", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    let restored = wait_webhook_configuration(&one, &url, vwc.uid().as_deref()).await;
    // Edited: restored.
    let mut edited = restored.clone();
    edited.metadata.managed_fields = None;
    api.patch(
        "kkp-quota-machines",
        &PatchParams::default(),
        &Patch::Json::<()>(
            serde_json::from_value(
                json!([{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}]),
            )
            .unwrap(),
        ),
    )
    .await
    .unwrap();
    e2e::wait_for(WAIT, "edited webhook configuration restored", || async {
        let vwc = webhook_configuration(&one).await?;
        let rv_changed = vwc.resource_version() != restored.resource_version();
        let fail = vwc.webhooks?.first()?.failure_policy.as_deref() == Some("Fail");
        (rv_changed && fail).then_some(())
    })
    .await
    .unwrap();

    // Kubeconfig rotated (here: to another apiserver): followed without restart.
    write_kubeconfig_secret(&seed, "cluster-delta", &two_cp.kubeconfig_yaml()).await;
    wait_cluster_usage(&seed, "delta", &size_of(&b_spec)).await;
    wait_local_usage(&seed, "demo", &size_of(&b_spec)).await;
    wait_webhook_configuration(&two, &url, None).await;

    // Key rotation: the new key added second (both verify at the webhook), then moved first:
    // the URL is rewritten with a token under the new key.
    e2e::system::write_url_signing_keys(&keys, &[&new_key, &old_key]).unwrap();
    let rotated = expected_url(&seed, "delta", &keys).await;
    assert_ne!(rotated, url);
    wait_webhook_configuration(&two, &rotated, None).await;
    running.stop().await;
}

/// The rule's operations in `user`'s configuration, once they are `wanted`; the hook.
async fn wait_operations(user: &Client, wanted: &[&str]) -> ValidatingWebhook {
    e2e::wait_for(WAIT, &format!("webhook configuration for {wanted:?}"), || async {
        let hook = webhook_configuration(user).await?.webhooks?.remove(0);
        let operations = hook.rules.as_ref()?.first()?.operations.clone()?;
        (operations == wanted).then_some(hook)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_operations_choose_the_rule_and_a_restart_rewrites_it() {
    init_logs();
    let (seed_cp, one_cp) =
        tokio::try_join!(e2e::ControlPlane::start("seed"), e2e::ControlPlane::start("one")).unwrap();
    let (seed, one) = (seed_cp.client(), one_cp.client());
    ensure_namespace(&seed, "kubermatic").await;
    create_quota_copy(&seed, "demo", "1000").await;
    register_cluster(&seed, "delta", "demo", &one_cp.kubeconfig_yaml()).await;
    let config = |operations| {
        let mut config = Config::for_tests("seed");
        config.webhook_url = Some("https://127.0.0.1:9443".into());
        config.insecure_no_auth = true;
        config.webhook_operations = operations;
        config
    };

    // CREATE only: the rule alone differs; the match condition stays.
    let running = start_controller(&seed_cp, config(Operations::Create)).await;
    let hook = wait_operations(&one, &["CREATE"]).await;
    assert_eq!(
        hook.client_config.url.as_deref(),
        Some("https://127.0.0.1:9443/validate/machines/delta")
    );
    assert_eq!(hook.failure_policy.as_deref(), Some("Fail"));
    let conditions = hook.match_conditions.unwrap_or_default();
    assert_eq!(conditions.len(), 1);
    assert_eq!(conditions[0].expression, PROVIDER_SPEC_CHANGES_ONLY);
    running.stop().await;

    // Restarted with the default: the configuration in place is rewritten.
    let running = start_controller(&seed_cp, config(Operations::CreateAndUpdate)).await;
    wait_operations(&one, &["CREATE", "UPDATE"]).await;
    running.stop().await;
}
