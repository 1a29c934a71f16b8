//! The seed-controller on real apiservers: one seed, user clusters alpha and beta (project demo)
//! and gamma (project other). Usage exact at every step of creating, resizing and deleting
//! Machines; projects kept apart; unsizeable Machines reported; the admin catalog reloaded; a
//! user cluster going away and coming back; bypass detection; and a restart of the controller
//! in the middle, with the ledger's count-and-drop observed write by write.

#![allow(clippy::unwrap_used, clippy::too_many_lines)]

mod common;

use common::*;
use jiff::SignedDuration;
use k8s_openapi::api::core::v1::ConfigMap;
use kkp_quota_crds::ledger::Reservation;
use kkp_quota_crds::{QuotaLedger, Resource, ResourceDetails};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use seed_controller::usage::same_usage;
use seed_controller::{Config, REASON_UNADMITTED, REASON_UNSIZEABLE};
use serde_json::json;

/// The controller's reservation TTL in this test.
const RESERVATION_TTL: std::time::Duration = std::time::Duration::from_secs(20);

/// Appends reservations as the webhook does: a merge patch conditioned on resourceVersion.
async fn add_reservations(seed: &Client, project: &str, add: Vec<Reservation>) {
    let api: Api<QuotaLedger> = Api::all(seed.clone());
    let name = format!("project-{project}");
    loop {
        let rq = api.get(&name).await.unwrap();
        let mut reservations = rq.status.clone().unwrap_or_default().reservations;
        reservations.extend(add.iter().cloned());
        let patch = json!({
            "metadata": {"resourceVersion": rq.metadata.resource_version},
            "status": {"reservations": kkp_quota_crds::ledger::group(&reservations)},
        });
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("adding reservations: {e}"),
        }
    }
}

async fn reservation_uids(seed: &Client, project: &str) -> Vec<String> {
    let api: Api<QuotaLedger> = Api::all(seed.clone());
    api.get(&format!("project-{project}"))
        .await
        .unwrap()
        .status
        .unwrap_or_default()
        .reservations
        .into_iter()
        .map(|r| r.uid)
        .collect()
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_follows_machines_across_clusters_projects_outages_and_restarts() {
    init_logs();
    let (seed_cp, alpha_cp, beta_cp, gamma_cp) = tokio::try_join!(
        e2e::ControlPlane::start("seed"),
        e2e::ControlPlane::start("alpha"),
        e2e::ControlPlane::start("beta"),
        e2e::ControlPlane::start("gamma"),
    )
    .unwrap();
    let seed = seed_cp.client();
    let (alpha, beta, gamma) = (alpha_cp.client(), beta_cp.client(), gamma_cp.client());
    ensure_namespace(&seed, "kubermatic").await;
    register_cluster(&seed, "alpha", "demo", &alpha_cp.kubeconfig_yaml()).await;
    register_cluster(&seed, "beta", "demo", &beta_cp.kubeconfig_yaml()).await;
    register_cluster(&seed, "gamma", "other", &gamma_cp.kubeconfig_yaml()).await;
    create_quota_copy(&seed, "demo", "1000").await;
    create_quota_copy(&seed, "other", "1000").await;

    // A Machine that exists before the controller starts.
    let m0_spec = aws("t3.medium");
    create_machine(&alpha, "m0", &m0_spec).await;

    let mut config = Config::for_tests("seed");
    // Recount every second: the safety net runs throughout, and must not mistake events in
    // flight for drift.
    config.resync_period = std::time::Duration::from_secs(1);
    config.user_cluster_timeout = std::time::Duration::from_secs(3);
    // Long enough to tell "dropped at once" from "expired", short enough to see expiry.
    config.reservation_ttl = RESERVATION_TTL;
    let running = start_controller(&seed_cp, config.clone()).await;
    running.wait_ready().await;
    let s0 = size_of(&m0_spec);
    assert_eq!(s0.amount(Resource::Cpu), kkp_quota_crds::Quantity::from_units(2));
    wait_cluster_usage(&seed, "alpha", &s0).await;
    wait_cluster_usage(&seed, "beta", &ResourceDetails::zero()).await;
    wait_local_usage(&seed, "demo", &s0).await;
    wait_condition(&seed, "alpha", "True", "AllMachinesCounted").await;

    // --- Created in two clusters of one project, and in another project. ---
    let (m1_spec, m2_spec, m3_spec) = (aws("t3.large"), hetzner("cx22"), vsphere(4, 8192, 50));
    create_machine(&alpha, "m1", &m1_spec).await;
    let m2 = create_machine(&beta, "m2", &m2_spec).await;
    create_machine(&gamma, "m3", &m3_spec).await;
    let (s1, s2, s3) = (size_of(&m1_spec), size_of(&m2_spec), size_of(&m3_spec));
    wait_cluster_usage(&seed, "alpha", &sum(&[&s0, &s1])).await;
    wait_cluster_usage(&seed, "beta", &s2).await;
    wait_cluster_usage(&seed, "gamma", &s3).await;
    wait_local_usage(&seed, "demo", &sum(&[&s0, &s1, &s2])).await;
    wait_local_usage(&seed, "other", &s3).await;
    assert_eq!(
        metric(
            &running.metrics,
            "kkp_quota_local_usage",
            &[("project", "other"), ("resource", "cpu")]
        ),
        Some(4.0)
    );

    // --- Resized (machine-controller forbids spec changes: delete and recreate). ---
    delete_machine(&alpha, "m1").await;
    let m1_spec = aws("t3.xlarge");
    let m1 = create_machine(&alpha, "m1", &m1_spec).await;
    let s1 = size_of(&m1_spec);
    wait_cluster_usage(&seed, "alpha", &sum(&[&s0, &s1])).await;
    wait_local_usage(&seed, "demo", &sum(&[&s0, &s1, &s2])).await;
    // It appeared while watched, with no reservation: flagged, and still counted.
    wait_machine_event(&alpha, "m1", REASON_UNADMITTED).await;
    running.wait_unadmitted("alpha", 1.0).await;
    let _ = m1;

    // --- Deleted. ---
    delete_machine(&beta, "m2").await;
    wait_cluster_usage(&seed, "beta", &ResourceDetails::zero()).await;
    wait_local_usage(&seed, "demo", &sum(&[&s0, &s1])).await;
    wait_local_usage(&seed, "other", &s3).await;
    // A reservation recorded only after its Machine was deleted goes at once, not at its TTL.
    let m2_uid = uid(&m2);
    add_reservations(
        &seed,
        "demo",
        vec![reservation("beta", &m2_uid, &s2, SignedDuration::ZERO)],
    )
    .await;
    e2e::wait_for(RESERVATION_TTL / 2, "m2's late reservation dropped", || async {
        !reservation_uids(&seed, "demo").await.contains(&m2_uid)
    })
    .await
    .unwrap();
    wait_metric_at_least(&running.metrics, "kkp_quota_reservations_gone_total", &[], 1.0).await;

    // --- A Machine being deleted counts until it is gone. ---
    let held_spec = aws("m5.large");
    let machines: Api<kkp_quota_crds::machine::Machine> = Api::namespaced(alpha.clone(), "kube-system");
    let mut held = common::machine("held", &held_spec);
    held.metadata.finalizers = Some(vec!["test.kkp-quota/hold".into()]);
    machines
        .create(&kube::api::PostParams::default(), &held)
        .await
        .unwrap();
    let s_held = size_of(&held_spec);
    wait_cluster_usage(&seed, "alpha", &sum(&[&s0, &s1, &s_held])).await;
    machines
        .delete("held", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    e2e::wait_for(WAIT, "held has a deletionTimestamp", || async {
        machines.get("held").await.ok()?.metadata.deletion_timestamp
    })
    .await
    .unwrap();
    // A write after the deletion started still counts it.
    let extra_spec = hetzner("cx22");
    create_machine(&alpha, "extra", &extra_spec).await;
    let s_extra = size_of(&extra_spec);
    wait_cluster_usage(&seed, "alpha", &sum(&[&s0, &s1, &s_held, &s_extra])).await;
    wait_local_usage(&seed, "demo", &sum(&[&s0, &s1, &s_held, &s_extra])).await;
    machines
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    delete_machine(&alpha, "extra").await;
    wait_cluster_usage(&seed, "alpha", &sum(&[&s0, &s1])).await;

    // --- Unsizeable: reported, not silently zero; the rest still counted. ---
    let bad_spec = aws("t9.imaginary");
    create_machine(&alpha, "bad", &bad_spec).await;
    wait_machine_event(&alpha, "bad", REASON_UNSIZEABLE).await;
    let c = wait_condition(&seed, "alpha", "False", "UnsizeableMachines").await;
    assert!(c.message.contains("kube-system/bad"), "{}", c.message);
    let labels = [
        ("cluster", "alpha"),
        ("provider", "aws"),
        ("flavour", "t9.imaginary"),
    ];
    e2e::wait_for(WAIT, "unsizeable metric", || async {
        metric(&running.metrics, "kkp_quota_unsizeable_machines", &labels) == Some(1.0)
    })
    .await
    .unwrap();
    wait_cluster_usage(&seed, "alpha", &sum(&[&s0, &s1])).await;
    assert_eq!(
        machine_events(&alpha, "bad", REASON_UNSIZEABLE).await.len(),
        1,
        "one Event, not one per event"
    );

    // The admin catalog teaches the flavour: counted now.
    set_catalog(
        &seed,
        "providers:\n  aws:\n    t9.imaginary: {cpu: 16, memory: 64Gi}\n",
    )
    .await;
    let mut s_bad = s1.clone();
    s_bad.set(Resource::Cpu, Some(kkp_quota_crds::Quantity::from_units(16)));
    s_bad.set(
        Resource::Memory,
        Some(kkp_quota_crds::Quantity::from_gibibytes(64)),
    );
    wait_cluster_usage(&seed, "alpha", &sum(&[&s0, &s1, &s_bad])).await;
    wait_condition(&seed, "alpha", "True", "AllMachinesCounted").await;
    e2e::wait_for(WAIT, "unsizeable metric gone", || async {
        metric(&running.metrics, "kkp_quota_unsizeable_machines", &labels).is_none()
    })
    .await
    .unwrap();
    // A broken catalog keeps the previous one.
    set_catalog(&seed, "providers: [this is not a mapping").await;
    e2e::wait_for(WAIT, "catalog error reported", || async {
        metric(&running.metrics, "kkp_quota_size_catalog_errors_total", &[]).unwrap_or(0.0) >= 1.0
    })
    .await
    .unwrap();
    assert_eq!(
        cluster_usage(&seed, "alpha").await.unwrap(),
        sum(&[&s0, &s1, &s_bad]).kkp_subset()
    );
    assert_eq!(condition(&seed, "alpha").await.unwrap().status, "True");
    delete_machine(&alpha, "bad").await;
    wait_cluster_usage(&seed, "alpha", &sum(&[&s0, &s1])).await;
    let alpha_usage = sum(&[&s0, &s1]);

    // --- A user cluster goes away: last usage kept, condition set, others not stalled. ---
    let m4_spec = hetzner("cx32");
    create_machine(&beta, "m4", &m4_spec).await;
    let s4 = size_of(&m4_spec);
    wait_local_usage(&seed, "demo", &sum(&[&alpha_usage, &s4])).await;
    beta_cp.stop_apiserver().await;
    let c = wait_condition(&seed, "beta", "False", "UserClusterUnreachable").await;
    assert!(c.last_transition_time.is_some());
    e2e::wait_for(WAIT, "unreachable metric", || async {
        metric(
            &running.metrics,
            "kkp_quota_user_cluster_unreachable",
            &[("cluster", "beta")],
        ) == Some(1.0)
    })
    .await
    .unwrap();
    assert_eq!(cluster_usage(&seed, "beta").await.unwrap(), s4.kkp_subset());
    // Alpha keeps being counted.
    let m5_spec = aws("m5.large");
    create_machine(&alpha, "m5", &m5_spec).await;
    let s5 = size_of(&m5_spec);
    wait_local_usage(&seed, "demo", &sum(&[&alpha_usage, &s5, &s4])).await;
    // Reservations dated 10 minutes ago (a webhook whose clock is behind, issue #32 finding 8):
    // each lives the TTL from when seed-controller first sees it, by its own clock; then
    // alpha's expires, unreachable beta's is kept.
    let added = std::time::Instant::now();
    add_reservations(
        &seed,
        "demo",
        vec![
            reservation("alpha", "ghost-alpha", &s5, SignedDuration::from_mins(10)),
            reservation("beta", "ghost-beta", &s5, SignedDuration::from_mins(10)),
        ],
    )
    .await;
    // Seen, and the skew exported (10 minutes and the delay).
    e2e::wait_for(WAIT, "the reservations' clock skew seen", || async {
        metric(
            &running.metrics,
            "kkp_quota_observed_clock_skew_seconds",
            &[("entry", "reservation")],
        )
        .is_some_and(|s| s >= 600.0)
    })
    .await
    .unwrap();
    if added.elapsed() < RESERVATION_TTL {
        assert!(
            reservation_uids(&seed, "demo")
                .await
                .contains(&"ghost-alpha".to_owned()),
            "a reservation dated by a clock behind expired before its TTL"
        );
    }
    e2e::wait_for(WAIT, "alpha's old reservation expired", || async {
        !reservation_uids(&seed, "demo")
            .await
            .contains(&"ghost-alpha".to_owned())
    })
    .await
    .unwrap();
    assert!(
        added.elapsed() >= RESERVATION_TTL,
        "expired after {:?}",
        added.elapsed()
    );
    assert!(
        reservation_uids(&seed, "demo")
            .await
            .contains(&"ghost-beta".to_owned())
    );
    let mut expected = sum(&[&alpha_usage, &s5, &s4]);
    expected.set(Resource::Clusters, Some(kkp_quota_crds::Quantity::from_units(2)));
    assert!(
        same_usage(&local_usage(&seed, "demo").await.unwrap(), &expected),
        "alpha's and beta's Machines, and the two clusters (beta unreachable still counts)"
    );

    // Back: caught up (a Machine created right away is counted), the reservation expires.
    beta_cp.start_apiserver().await.unwrap();
    wait_condition(&seed, "beta", "True", "AllMachinesCounted").await;

    // --- A user cluster that hangs (no answer, no error): detected by the recount's timeout,
    // last usage kept, the others keep being counted. ---
    beta_cp.pause_apiserver().unwrap();
    wait_condition(&seed, "beta", "False", "UserClusterUnreachable").await;
    let m9_spec = hetzner("cx22");
    create_machine(&alpha, "m9", &m9_spec).await;
    wait_local_usage(&seed, "demo", &sum(&[&alpha_usage, &s5, &s4, &size_of(&m9_spec)])).await;
    delete_machine(&alpha, "m9").await;
    wait_local_usage(&seed, "demo", &sum(&[&alpha_usage, &s5, &s4])).await;
    beta_cp.resume_apiserver().unwrap();
    let beta = beta_cp.client();
    let m6_spec = vsphere(2, 4096, 20);
    create_machine(&beta, "m6", &m6_spec).await;
    let s6 = size_of(&m6_spec);
    wait_cluster_usage(&seed, "beta", &sum(&[&s4, &s6])).await;
    wait_condition(&seed, "beta", "True", "AllMachinesCounted").await;
    wait_local_usage(&seed, "demo", &sum(&[&alpha_usage, &s5, &s4, &s6])).await;
    e2e::wait_for(WAIT, "beta's old reservation expired", || async {
        reservation_uids(&seed, "demo").await.is_empty()
    })
    .await
    .unwrap();
    wait_metric_at_least(&running.metrics, "kkp_quota_reservations_expired_total", &[], 2.0).await;
    assert!(
        metric(
            &running.metrics,
            "kkp_quota_watch_restarts_total",
            &[("cluster", "beta")]
        )
        .unwrap_or(0.0)
            >= 1.0
    );

    let drift = metric(&running.metrics, "kkp_quota_usage_drift_corrections_total", &[]);
    assert!(drift.unwrap_or(0.0) < 1.0, "no drift expected, got {drift:?}");

    // --- Restart mid-run: changes while down, and an admitted Machine with its reservation. ---
    running.stop().await;
    create_machine(&alpha, "m7", &aws("c5.2xlarge")).await;
    let s7 = size_of(&aws("c5.2xlarge"));
    delete_machine(&alpha, "m5").await;
    // The only Machine with a GPU: "m8 is in localUsage" is "localUsage has 1 gpu".
    let m8_spec = aws("g4dn.xlarge");
    let m8 = create_machine(&beta, "m8", &m8_spec).await;
    let s8 = size_of(&m8_spec);
    add_reservations(
        &seed,
        "demo",
        vec![reservation("beta", &uid(&m8), &s8, SignedDuration::from_secs(1))],
    )
    .await;
    let expected = sum(&[&alpha_usage, &s7, &s4, &s6, &s8]);

    // Record every version of the quota copy from now on.
    let recorder = QuotaVersions::start(&seed).await;

    let running = start_controller(&seed_cp, config.clone()).await;
    wait_local_usage(&seed, "demo", &expected).await;
    wait_cluster_usage(&seed, "alpha", &sum(&[&alpha_usage, &s7])).await;
    wait_cluster_usage(&seed, "beta", &sum(&[&s4, &s6, &s8])).await;
    wait_local_usage(&seed, "other", &s3).await;
    e2e::wait_for(WAIT, "m8's reservation dropped", || async {
        reservation_uids(&seed, "demo").await.is_empty()
    })
    .await
    .unwrap();
    recorder.wait_settled(&seed, &expected).await;
    // In every version, m8 is counted exactly once: by its reservation or in localUsage (the
    // count and the drop are one write).
    let versions = recorder.all();
    assert!(versions.len() >= 2, "saw {} versions", versions.len());
    let m8_uid = uid(&m8);
    assert_eq!(s8.amount(Resource::Gpu), kkp_quota_crds::Quantity::from_units(1));
    for rq in &versions {
        let status = rq.status.clone().unwrap_or_default();
        let reserved = status.reservations.iter().any(|r| r.uid == m8_uid);
        let local = status.local_usage.unwrap_or_default();
        let counted = local.amount(Resource::Gpu) == kkp_quota_crds::Quantity::from_units(1);
        assert!(
            reserved != counted,
            "m8 counted {} times at resourceVersion {:?}: localUsage {local}, reserved {reserved}",
            u8::from(reserved) + u8::from(counted),
            rq.metadata.resource_version
        );
    }
    wait_metric_at_least(&running.metrics, "kkp_quota_reservations_counted_total", &[], 1.0).await;
    // The Machine created while the controller was down was not "appeared while watched".
    assert!(machine_events(&alpha, "m7", REASON_UNADMITTED).await.is_empty());

    // Cluster deleted from the seed: its usage leaves the project.
    let clusters: Api<kkp_quota_crds::kkp::Cluster> = Api::all(seed.clone());
    clusters
        .delete("beta", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    wait_local_usage(&seed, "demo", &sum(&[&alpha_usage, &s7])).await;
    running.stop().await;
}
