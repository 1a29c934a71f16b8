//! The seed-controller with allotments (headroom a webhook process holds, see
//! `kkp_quota_crds::ledger::Allotment`) in the quota copy, on real apiservers, the ledger written
//! as a webhook would (status patches conditioned on resourceVersion):
//!
//! - a Machine that appears with no reservation while an allotment stays is held back: not in
//!   `localUsage`, not flagged; its reservation then arrives and the next write counts it and drops
//!   the reservation (every version of the quota copy recorded: it is never counted while
//!   reserved, nor before it was reserved);
//! - an expired allotment is removed and a live one kept; an expired one is kept while the
//!   project's user cluster is unreachable, and removed once it is back;
//! - a Machine never recorded is counted when its grace ends (the writer wakes by itself) and
//!   flagged as having got no reservation within the grace.

#![allow(clippy::unwrap_used, clippy::too_many_lines)]

mod common;

use std::time::Duration;

use common::*;
use jiff::{SignedDuration, Timestamp};
use kkp_quota_crds::ledger::{Allotment, Reservation};
use kkp_quota_crds::{Quantity, QuotaLedger, Resource, ResourceDetails};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use seed_controller::{Config, REASON_UNADMITTED};
use serde_json::json;

fn allotment(holder: &str, cpu: &str, expires_in: SignedDuration) -> Allotment {
    Allotment {
        holder: holder.into(),
        granted: serde_json::from_value(json!({"cpu": cpu})).unwrap(),
        expires_at: Timestamp::now() + expires_in,
        ttl_seconds: None,
    }
}

/// Appends to the ledger as a webhook does: one merge patch conditioned on resourceVersion.
async fn add_to_ledger(seed: &Client, allotments: &[Allotment], reservations: &[Reservation]) {
    let api: Api<QuotaLedger> = Api::all(seed.clone());
    loop {
        let rq = api.get("project-demo").await.unwrap();
        let status = rq.status.clone().unwrap_or_default();
        let mut patch = json!({"metadata": {"resourceVersion": rq.metadata.resource_version}, "status": {}});
        if !allotments.is_empty() {
            let mut all = status.allotments.clone();
            all.extend(allotments.iter().cloned());
            patch["status"]["allotments"] = serde_json::to_value(all).unwrap();
        }
        if !reservations.is_empty() {
            let mut all = status.reservations.clone();
            all.extend(reservations.iter().cloned());
            patch["status"]["reservations"] =
                serde_json::to_value(kkp_quota_crds::ledger::group(&all)).unwrap();
        }
        match api
            .patch_status("project-demo", &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("writing the ledger: {e}"),
        }
    }
}

async fn holders(seed: &Client) -> Vec<String> {
    quota_status(seed)
        .await
        .allotments
        .into_iter()
        .map(|a| a.holder)
        .collect()
}

async fn wait_holders(seed: &Client, expected: &[&str]) {
    e2e::wait_for(WAIT, &format!("allotments held by {expected:?}"), || async {
        let now = holders(seed).await;
        if now == expected {
            Ok(())
        } else {
            Err(format!("held by {now:?}"))
        }
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machines_admitted_from_allotments_are_held_back_and_expired_allotments_removed() {
    init_logs();
    let (seed_cp, alpha_cp) = seed_with_alpha("1000").await;
    let (seed, alpha) = (seed_cp.client(), alpha_cp.client());
    let live = allotment("webhook-live", "8", SignedDuration::from_hours(1));
    add_to_ledger(&seed, std::slice::from_ref(&live), &[]).await;

    let m0_spec = aws("t3.medium");
    create_machine(&alpha, "m0", &m0_spec).await;
    let s0 = size_of(&m0_spec);

    // A grace far longer than the test: whatever is counted here was counted by its reservation.
    let mut config = Config::for_tests("seed");
    config.admission_record_grace = Duration::from_mins(10);
    // The ghost reservation below expires this long after the controller first sees it.
    config.reservation_ttl = Duration::from_secs(10);
    // Recount every second (it is also the liveness probe that finds alpha back after its
    // apiserver restarts): a held-back Machine must stay held through it.
    config.resync_period = Duration::from_secs(1);
    config.user_cluster_timeout = Duration::from_secs(3);
    let running = start_controller(&seed_cp, config).await;
    running.wait_ready().await;
    wait_local_usage(&seed, "demo", &s0).await;

    // Record every version of the quota copy from now on.
    let recorder = QuotaVersions::start(&seed).await;

    // --- Appeared without a reservation while an allotment stays: held back. ---
    // The only Machine with a GPU: "m1 is in localUsage" is "localUsage has 1 gpu".
    let m1_spec = aws("g4dn.xlarge");
    let m1 = create_machine(&alpha, "m1", &m1_spec).await;
    let s1 = size_of(&m1_spec);
    assert_eq!(s1.amount(Resource::Gpu), Quantity::from_units(1));
    // The controller has seen m1 (the Cluster's own usage counts every Machine) ...
    wait_cluster_usage(&seed, "alpha", &sum(&[&s0, &s1])).await;
    // ... so the write that follows m0's deletion would carry m1 if it were not held back.
    delete_machine(&alpha, "m0").await;
    wait_local_usage(&seed, "demo", &ResourceDetails::zero()).await;
    wait_cluster_usage(&seed, "alpha", &s1).await;
    assert!(machine_events(&alpha, "m1", REASON_UNADMITTED).await.is_empty());
    assert!(running.unadmitted("alpha").unwrap_or(0.0) < 1.0);

    // --- The webhook records it: counted and the reservation dropped, in one write. ---
    let m1_uid = uid(&m1);
    add_to_ledger(
        &seed,
        &[],
        &[reservation("alpha", &m1_uid, &s1, SignedDuration::from_secs(1))],
    )
    .await;
    wait_local_usage(&seed, "demo", &s1).await;
    e2e::wait_for(WAIT, "m1's reservation dropped", || async {
        quota_status(&seed).await.reservations.is_empty()
    })
    .await
    .unwrap();
    recorder.wait_settled(&seed, &s1).await;
    let versions = recorder.all();
    let mut reserved_before = false;
    for rq in &versions {
        let s = rq.status.clone().unwrap_or_default();
        let reserved = s.reservations.iter().any(|r| r.uid == m1_uid);
        let counted = s.local_usage.unwrap_or_default().amount(Resource::Gpu) == Quantity::from_units(1);
        assert!(
            !(reserved && counted),
            "m1 counted and reserved at resourceVersion {:?}",
            rq.metadata.resource_version
        );
        assert!(
            !counted || reserved_before,
            "m1 counted before it was reserved, at resourceVersion {:?}",
            rq.metadata.resource_version
        );
        reserved_before |= reserved;
        assert_eq!(
            s.allotments,
            vec![live.clone()],
            "the live allotment is never rewritten"
        );
    }
    wait_metric_at_least(&running.metrics, "kkp_quota_reservations_counted_total", &[], 1.0).await;
    assert!(machine_events(&alpha, "m1", REASON_UNADMITTED).await.is_empty());

    // --- An expired allotment is removed, the live one stays as it is. ---
    add_to_ledger(
        &seed,
        &[allotment("webhook-gone", "4", SignedDuration::from_secs(-1))],
        &[],
    )
    .await;
    wait_holders(&seed, &["webhook-live"]).await;
    assert_eq!(quota_status(&seed).await.allotments, vec![live.clone()]);
    wait_metric_at_least(&running.metrics, "kkp_quota_allotments_expired_total", &[], 1.0).await;
    assert_eq!(
        metric(&running.metrics, "kkp_quota_allotments_expired_total", &[]),
        Some(1.0)
    );

    // --- Not while the project's user cluster is unreachable (a Machine admitted from the
    // allotment may exist there uncounted). ---
    alpha_cp.stop_apiserver().await;
    wait_condition(&seed, "alpha", "False", "UserClusterUnreachable").await;
    // In the same patch an old reservation of a cluster not on this seed: its drop shows that a
    // write was computed with the expired allotment in view.
    add_to_ledger(
        &seed,
        &[allotment("webhook-stuck", "2", SignedDuration::from_secs(-1))],
        &[reservation(
            "elsewhere",
            "ghost-uid",
            &s1,
            SignedDuration::from_mins(10),
        )],
    )
    .await;
    e2e::wait_for(WAIT, "the ghost reservation expired", || async {
        quota_status(&seed).await.reservations.is_empty()
    })
    .await
    .unwrap();
    assert_eq!(holders(&seed).await, vec!["webhook-live", "webhook-stuck"]);
    alpha_cp.start_apiserver().await.unwrap();
    wait_condition(&seed, "alpha", "True", "AllMachinesCounted").await;
    wait_holders(&seed, &["webhook-live"]).await;
    wait_metric_at_least(&running.metrics, "kkp_quota_allotments_expired_total", &[], 2.0).await;
    assert_eq!(
        metric(&running.metrics, "kkp_quota_allotments_expired_total", &[]),
        Some(2.0)
    );
    wait_local_usage(&seed, "demo", &s1).await;
    running.stop().await;

    // --- A short grace: a Machine never recorded is counted when it ends, and flagged. ---
    let mut config = Config::for_tests("seed");
    config.admission_record_grace = Duration::from_millis(500);
    let running = start_controller(&seed_cp, config).await;
    running.wait_ready().await;
    let alpha = alpha_cp.client();
    let m2_spec = aws("t3.medium");
    create_machine(&alpha, "m2", &m2_spec).await;
    let s2 = size_of(&m2_spec);
    // Nothing else changes: only the writer's own wake-up at the grace's end counts it.
    wait_local_usage(&seed, "demo", &sum(&[&s1, &s2])).await;
    let event = wait_machine_event(&alpha, "m2", REASON_UNADMITTED).await;
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains("no resource quota admission reservation within 500ms"),
        "{note}"
    );
    assert!(note.contains("stopped before recording it"), "{note}");
    running.wait_unadmitted("alpha", 1.0).await;
    assert_eq!(running.unadmitted("alpha"), Some(1.0));
    assert!(machine_events(&alpha, "m1", REASON_UNADMITTED).await.is_empty());
    assert_eq!(holders(&seed).await, vec!["webhook-live"]);
    running.stop().await;
}
