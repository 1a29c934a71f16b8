//! A Machine whose catalog entry is removed while it runs stays counted at its last known size
//! (not zero, which would admit its room again) until it is deleted, and says so: the Cluster's
//! condition, an Event, a metric, and `status.lastKnownSizes` of the ledger, which carries the
//! size across a restart of the controller.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kkp_quota_crds::{Quantity, Resource};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use seed_controller::{Config, REASON_COUNTED_AT_LAST_SIZE};
use serde_json::json;

async fn set_catalog(seed: &Client, text: &str) {
    let api: Api<ConfigMap> = Api::namespaced(seed.clone(), "kubermatic");
    let cm: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "kkp-quota-size-catalog", "namespace": "kubermatic"},
        "data": {"catalog.yaml": text},
    }))
    .unwrap();
    api.patch(
        "kkp-quota-size-catalog",
        &PatchParams::apply("test").force(),
        &Patch::Apply(&cm),
    )
    .await
    .unwrap();
}

const LAST_SIZE_METRIC: &str = "kkp_quota_machines_counted_at_last_size";
const LABELS: [(&str, &str); 3] = [
    ("project", "demo"),
    ("cluster", "alpha"),
    ("flavour", "t9.custom"),
];

/// `status.lastKnownSizes` of project demo's ledger: the uids.
async fn last_known_uids(seed: &Client) -> Vec<String> {
    quota_status(seed)
        .await
        .last_known_sizes
        .into_iter()
        .map(|e| e.uid)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_whose_catalog_entry_goes_is_counted_at_its_last_size_until_deleted() {
    init_logs();
    let (seed_cp, alpha_cp) = seed_with_alpha("1000").await;
    let (seed, alpha) = (seed_cp.client(), alpha_cp.client());
    // A flavour only the admin catalog knows.
    set_catalog(
        &seed,
        "providers:\n  aws:\n    t9.custom: {cpu: 16, memory: 64Gi}\n",
    )
    .await;
    let plain_spec = aws("t3.medium");
    create_machine(&alpha, "plain", &plain_spec).await;
    let big = create_machine(&alpha, "big", &aws("t9.custom")).await;
    let plain = size_of(&plain_spec);
    let mut big_size = plain.clone();
    big_size.set(Resource::Cpu, Some(Quantity::from_units(16)));
    big_size.set(Resource::Memory, Some(Quantity::from_gibibytes(64)));

    let config = Config::for_tests("seed");
    let running = start_controller(&seed_cp, config.clone()).await;
    running.wait_ready().await;
    wait_local_usage(&seed, "demo", &sum(&[&plain, &big_size])).await;
    wait_condition(&seed, "alpha", "True", "AllMachinesCounted").await;

    // The admin removes the entry (or renames the flavour): big is still running.
    set_catalog(&seed, "providers:\n  aws:\n    t9.other: {cpu: 1, memory: 1Gi}\n").await;
    let c = wait_condition(&seed, "alpha", "False", "MachinesCountedAtLastKnownSize").await;
    assert!(c.message.starts_with("1 Machine(s)"), "{}", c.message);
    assert!(c.message.contains("kube-system/big"), "{}", c.message);
    assert!(c.message.contains("t9.custom"), "the why: {}", c.message);
    // A Machine created after the change is counted with big still in: the change was taken in
    // before it, and did not drop big.
    let later_spec = aws("t3.large");
    create_machine(&alpha, "later", &later_spec).await;
    let later = size_of(&later_spec);
    wait_local_usage(&seed, "demo", &sum(&[&plain, &big_size, &later])).await;
    wait_cluster_usage(&seed, "alpha", &sum(&[&plain, &big_size, &later])).await;
    e2e::wait_for(WAIT, "the last size metric", || async {
        metric(&running.metrics, LAST_SIZE_METRIC, &LABELS) == Some(1.0)
    })
    .await
    .unwrap();
    assert_eq!(
        metric(
            &running.metrics,
            "kkp_quota_unsizeable_machines",
            &[("flavour", "t9.custom")]
        ),
        None,
        "counted, so not among the uncounted"
    );
    let event = wait_machine_event(&alpha, "big", REASON_COUNTED_AT_LAST_SIZE).await;
    assert!(
        event
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("last known size"),
        "{event:?}"
    );
    // The size is kept in the ledger, in the same write as localUsage.
    let big_uid = uid(&big);
    let status = quota_status(&seed).await;
    assert_eq!(status.last_known_sizes.len(), 1, "{:?}", status.last_known_sizes);
    assert_eq!(status.last_known_sizes[0].uid, big_uid);
    assert_eq!(status.last_known_sizes[0].cluster, "alpha");
    assert_eq!(status.last_known_sizes[0].size, big_size);

    // --- Restarted while the entry is still missing: still counted at its last size. ---
    running.stop().await;
    let after_spec = hetzner("cx22");
    create_machine(&alpha, "after", &after_spec).await;
    let after = size_of(&after_spec);
    let running = start_controller(&seed_cp, config).await;
    running.wait_ready().await;
    // `after` counted by the new process, with big in.
    wait_local_usage(&seed, "demo", &sum(&[&plain, &big_size, &later, &after])).await;
    wait_condition(&seed, "alpha", "False", "MachinesCountedAtLastKnownSize").await;
    e2e::wait_for(WAIT, "the last size metric after the restart", || async {
        metric(&running.metrics, LAST_SIZE_METRIC, &LABELS) == Some(1.0)
    })
    .await
    .unwrap();
    assert_eq!(last_known_uids(&seed).await, vec![big_uid.clone()]);

    // --- Deleted: no longer counted, forgotten everywhere. ---
    delete_machine(&alpha, "big").await;
    wait_local_usage(&seed, "demo", &sum(&[&plain, &later, &after])).await;
    wait_condition(&seed, "alpha", "True", "AllMachinesCounted").await;
    e2e::wait_for(WAIT, "lastKnownSizes emptied", || async {
        last_known_uids(&seed).await.is_empty()
    })
    .await
    .unwrap();
    e2e::wait_for(WAIT, "the last size metric gone", || async {
        metric(&running.metrics, LAST_SIZE_METRIC, &LABELS).is_none()
    })
    .await
    .unwrap();
    running.stop().await;
}
