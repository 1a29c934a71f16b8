//! seed-controller and machine-webhook together on real apiservers: the webhook configuration the
//! controller keeps sends the user cluster's Machine admissions to the webhook, the webhook
//! reserves (some Machines from its allotment, recorded a moment later), the controller counts
//! and drops the reservations; the quota holds exactly, and nothing is flagged as unadmitted.

#![allow(clippy::unwrap_used, clippy::too_many_lines)]

mod common;

use std::time::Duration;

use common::*;
use kkp_quota_crds::machine::Machine;
use kkp_quota_crds::{Quantity, Resource};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use seed_controller::{Config, REASON_UNADMITTED};
use serde_json::json;

async fn reservations(seed: &kube::Client) -> usize {
    quota_status(seed).await.reservations.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_reservations_are_counted_and_dropped() {
    init_logs();
    let (seed_cp, alpha_cp) = seed_with_alpha("10").await;
    let (seed, alpha) = (seed_cp.client(), alpha_cp.client());

    let certs = e2e::certs::WebhookCerts::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let paths = certs.write_to(dir.path()).unwrap();
    // One key file for both: seed-controller signs the URLs with it, the webhook verifies them.
    let keys = dir.path().join("url-signing-keys");
    e2e::system::write_url_signing_keys(&keys, &[&kkp_quota_runtime::webhook_auth::generate_key()]).unwrap();
    let mut webhook_config = machine_webhook::Config::new(
        "127.0.0.1:0".parse().unwrap(),
        paths.cert.clone(),
        paths.key.clone(),
    );
    webhook_config.auth = Some(machine_webhook::AuthConfig::UrlSigningKeys(keys.clone()));
    let webhook = machine_webhook::Webhook::start(webhook_config, seed.clone())
        .await
        .unwrap();
    let address = webhook.address;
    let webhook_metrics = webhook.metrics.clone();
    let webhook_ready = webhook.readiness.clone();
    let webhook_task = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(webhook.run()));
    e2e::wait_for(WAIT, "webhook ready", || async { webhook_ready.is_ready() })
        .await
        .unwrap();

    let mut config = Config::for_tests("seed");
    config.webhook_url = Some(format!("https://{address}"));
    config.webhook_ca_file = Some(paths.ca.clone());
    config.url_signing_keys = Some(keys.clone());
    let running = start_controller(&seed_cp, config).await;

    // The configuration the controller wrote is in effect: an unsizeable Machine is refused.
    let machines: Api<Machine> = Api::namespaced(alpha.clone(), "kube-system");
    e2e::wait_for(WAIT, "webhook configuration in effect", || async {
        let probe = common::machine(
            "probe",
            &json!({"cloudProvider": "aws", "cloudProviderSpec": {"instanceType": "t9.none"}}),
        );
        let dry = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        matches!(machines.create(&dry, &probe).await, Err(kube::Error::Api(e)) if e.message.contains("sized"))
    })
    .await
    .unwrap();

    // Five t3.medium (2 cpu each) fill the 10 cpu; the sixth is refused.
    let spec = aws("t3.medium");
    let size = size_of(&spec);
    for i in 0..5 {
        machines
            .create(&PostParams::default(), &common::machine(&format!("m{i}"), &spec))
            .await
            .unwrap();
    }
    let refused = machines
        .create(&PostParams::default(), &common::machine("m5", &spec))
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(e)) if e.code == 403 || e.code == 400),
        "{refused:?}"
    );
    let five = sum(&[&size, &size, &size, &size, &size]);
    assert_eq!(five.amount(Resource::Cpu), Quantity::from_units(10));
    wait_local_usage(&seed, "demo", &five).await;
    e2e::wait_for(WAIT, "reservations dropped", || async {
        reservations(&seed).await == 0
    })
    .await
    .unwrap();

    // Room again after a delete: the webhook sees the controller's fresh localUsage.
    delete_machine(&alpha, "m0").await;
    wait_local_usage(&seed, "demo", &sum(&[&size, &size, &size, &size])).await;
    e2e::wait_for(Duration::from_secs(30), "m5 admitted", || async {
        machines
            .create(&PostParams::default(), &common::machine("m5", &spec))
            .await
    })
    .await
    .unwrap();
    wait_local_usage(&seed, "demo", &five).await;
    e2e::wait_for(WAIT, "reservations dropped", || async {
        reservations(&seed).await == 0
    })
    .await
    .unwrap();

    // Updates that leave the spec alone never reach the webhook (matchConditions); one that
    // changes the spec does. A status write moves the generation (this CRD, like
    // machine-controller's, has no status subresource) and still stays away.
    let calls = || webhook_metrics.answered(None);
    let before = calls();
    let generation = |m: Machine| m.metadata.generation.unwrap_or_default();
    let first_generation = generation(machines.get("m1").await.unwrap());
    for i in 0..5 {
        let label =
            json!({"metadata": {"labels": {"touched": i.to_string()}, "finalizers": ["example.com/x"]}});
        machines
            .patch("m1", &PatchParams::default(), &Patch::Merge(&label))
            .await
            .unwrap();
    }
    assert_eq!(calls(), before, "metadata-only updates reached the webhook");
    let status = json!({"status": {"nodeRef": {"name": "node-m1"}}});
    let after_status = machines
        .patch("m1", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    assert!(
        generation(after_status) > first_generation,
        "the status write did not move the generation, so it does not test the spec comparison"
    );
    assert_eq!(calls(), before, "a status-only update reached the webhook");
    // machine-controller's two spec-touching writes. Its mutating webhook defaults the spec's
    // own name (`spec.metadata.name`) on the update that adds its finalizer, before any instance
    // exists; and its status write is a full update that re-serialises a spec another client
    // created, with its defaults filled in (here `versions` and the embedded metadata). Both move
    // the generation, neither touches `spec.providerSpec`, so neither reaches the webhook.
    let name_default = json!({
        "metadata": {"finalizers": ["example.com/x", "machine-controller.kubermatic.io/delete-finalizer"]},
        "spec": {"metadata": {"name": "m1"}},
    });
    let raw: Api<DynamicObject> =
        Api::namespaced_with(alpha.clone(), "kube-system", &ApiResource::erase::<Machine>(&()));
    let named = raw
        .patch("m1", &PatchParams::default(), &Patch::Merge(&name_default))
        .await
        .unwrap();
    let mut reserialised = named.clone();
    reserialised.data["spec"]["metadata"]["creationTimestamp"] = json!(null);
    reserialised.data["spec"]["versions"] = json!({"kubelet": "1.31.1"});
    reserialised.data["status"]["lastUpdated"] = json!("2026-11-26T00:00:00Z");
    let after_reserialise = raw
        .replace("m1", &PostParams::default(), &reserialised)
        .await
        .unwrap();
    let generation_of = |m: &DynamicObject| m.metadata.generation.unwrap_or_default();
    assert_eq!(named.data["spec"]["metadata"]["name"], json!("m1"), "{named:?}");
    assert!(
        generation_of(&after_reserialise) > generation_of(&named),
        "the re-serialising write did not move the generation, so it does not test the provider spec comparison"
    );
    assert_eq!(
        calls(),
        before,
        "machine-controller's own spec writes reached the webhook"
    );
    let shrink =
        json!({"spec": {"providerSpec": {"value": {"cloudProviderSpec": {"instanceType": "t3.small"}}}}});
    machines
        .patch("m1", &PatchParams::default(), &Patch::Merge(&shrink))
        .await
        .unwrap();
    assert!(calls() > before, "a spec change did not reach the webhook");
    let release = json!({"metadata": {"finalizers": null}});
    machines
        .patch("m1", &PatchParams::default(), &Patch::Merge(&release))
        .await
        .unwrap();

    // Some went in from the webhook's allotment (no write of their own, recorded later), and were
    // held back rather than counted twice or flagged.
    assert!(
        webhook_metrics.allotment_admissions.get() >= 1,
        "no admission from the allotment"
    );
    // Every Machine went through admission: none flagged.
    for name in ["m1", "m2", "m3", "m4", "m5"] {
        assert!(
            machine_events(&alpha, name, REASON_UNADMITTED).await.is_empty(),
            "{name} flagged"
        );
    }
    let unadmitted = running.unadmitted("alpha");
    assert!(unadmitted.unwrap_or(0.0) < 1.0, "unadmitted: {unadmitted:?}");
    wait_metric_at_least(&running.metrics, "kkp_quota_reservations_counted_total", &[], 6.0).await;

    // With the webhook down (failurePolicy: Fail), an admitted Machine still gets
    // machine-controller's finalizer and spec name, while a provider spec change is refused:
    // the webhook is in the path, and only what sizing reads goes through it.
    drop(webhook_task);
    let name_default = json!({
        "metadata": {"finalizers": ["machine-controller.kubermatic.io/delete-finalizer"]},
        "spec": {"metadata": {"name": "m2"}},
    });
    let named = machines
        .patch("m2", &PatchParams::default(), &Patch::Merge(&name_default))
        .await
        .unwrap();
    assert_eq!(
        named.metadata.finalizers.as_deref(),
        Some(&["machine-controller.kubermatic.io/delete-finalizer".to_owned()][..])
    );
    let grow =
        json!({"spec": {"providerSpec": {"value": {"cloudProviderSpec": {"instanceType": "t3.large"}}}}});
    let refused = machines
        .patch("m2", &PatchParams::default(), &Patch::Merge(&grow))
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(e)) if e.message.contains("failed calling webhook")),
        "a provider spec change went through with the webhook down: {refused:?}"
    );
    running.stop().await;
}
