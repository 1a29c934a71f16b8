//! The seed-controller's side of per-seed shares (docs/shares.md) on a real apiserver; the
//! master's part (`spec.shares`) and the webhooks' (`status.demands`) written by the test as they
//! would write them:
//!
//! - a lowered target (granted 10, target 4, nothing committed) is released, once: `released`
//!   becomes 6 and stays so through further writes (a Machine counted, demands removed); every
//!   version of the ledger keeps `granted - released >= committed` and `released` only grows;
//! - an expired demand is removed and a live one kept, as is;
//! - a ledger without `spec.shares` never gets `status.released` (its writes still happen);
//! - with the target back at the share and a short quiet period, the share above
//!   `committed + slack` is released once the period has passed, the writer woken by the quiet
//!   period's end alone;
//! - a ledger last seen while a cluster of its project was unsettled, the cluster then settling
//!   without the ledger changing, still gets its quiet release when the period ends.

#![allow(clippy::unwrap_used, clippy::too_many_lines)]

mod common;

use std::time::Duration;

use common::*;
use jiff::{SignedDuration, Timestamp};
use kkp_quota_crds::quota_ledger::ShareDemand;
use kkp_quota_crds::shares::objects::committed;
use kkp_quota_crds::{Quantity, QuotaLedger, QuotaLedgerStatus, Resource, ResourceDetails};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use seed_controller::Config;
use seed_controller::usage::as_f64;
use serde_json::{Value, json};

fn cpu(amount: &str) -> ResourceDetails {
    serde_json::from_value(json!({ "cpu": amount })).unwrap()
}

/// What the master writes: `spec.shares` from its record (a merge patch on the main resource).
async fn set_shares(seed: &Client, ledger: &str, version: u64, granted: &str, target: &str) {
    Api::<QuotaLedger>::all(seed.clone())
        .patch(
            ledger,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"shares": {
                "version": version,
                "granted": {"cpu": granted},
                "target": {"cpu": target},
            }}})),
        )
        .await
        .unwrap();
}

/// Writes status fields as a webhook does: one merge patch conditioned on resourceVersion.
async fn write_status(seed: &Client, ledger: &str, fields: impl Fn(&QuotaLedgerStatus) -> Value) {
    let api: Api<QuotaLedger> = Api::all(seed.clone());
    loop {
        let rq = api.get(ledger).await.unwrap();
        let status = rq.status.clone().unwrap_or_default();
        let patch = json!({
            "metadata": {"resourceVersion": rq.metadata.resource_version},
            "status": fields(&status),
        });
        match api
            .patch_status(ledger, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("writing {ledger}: {e}"),
        }
    }
}

fn demand(holder: &str, amount: &str, expires_in: SignedDuration) -> ShareDemand {
    ShareDemand {
        holder: holder.into(),
        amount: cpu(amount),
        expires_at: Timestamp::now() + expires_in,
        ttl_seconds: None,
    }
}

async fn status_of(seed: &Client, ledger: &str) -> QuotaLedgerStatus {
    Api::<QuotaLedger>::all(seed.clone())
        .get(ledger)
        .await
        .unwrap()
        .status
        .unwrap_or_default()
}

async fn released_cpu(seed: &Client) -> Option<Quantity> {
    status_of(seed, "project-demo")
        .await
        .released
        .and_then(|r| r.get(Resource::Cpu))
}

async fn wait_released(seed: &Client, expected: Quantity) {
    e2e::wait_for(WAIT, &format!("released cpu = {expected}"), || async {
        match released_cpu(seed).await {
            Some(r) if r == expected => Ok(()),
            other => Err(format!("is {other:?}")),
        }
    })
    .await
    .unwrap();
}

/// Every recorded version: `released` only grows, and the share covers what is committed.
fn check_versions(recorder: &QuotaVersions) {
    let mut last = Quantity::ZERO;
    for rq in recorder.all() {
        let status = rq.status.clone().unwrap_or_default();
        let released = status.released.clone().unwrap_or_default().amount(Resource::Cpu);
        assert!(
            released >= last,
            "released went from {last} to {released} at resourceVersion {:?}",
            rq.metadata.resource_version
        );
        last = released;
        let granted = rq
            .spec
            .shares
            .as_ref()
            .map(|s| s.granted.amount(Resource::Cpu))
            .unwrap_or_default();
        let committed = committed(&status).unwrap().amount(Resource::Cpu);
        assert!(
            granted.saturating_sub_to_zero(released) >= committed,
            "share {granted} - {released} below committed {committed} at resourceVersion {:?}",
            rq.metadata.resource_version
        );
    }
}

fn metric_of(running: &Running, name: &str, project: &str) -> Option<f64> {
    metric(
        &running.metrics,
        name,
        &[("project", project), ("resource", "cpu")],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_is_released_in_the_ledger_write_down_to_the_target_then_when_quiet() {
    init_logs();
    let (seed_cp, alpha_cp) = seed_with_alpha("10").await;
    let (seed, alpha) = (seed_cp.client(), alpha_cp.client());
    // The master granted 10 and wants 4 back... on project demo; project plain has no shares.
    set_shares(&seed, "project-demo", 1, "10", "4").await;
    create_quota_copy(&seed, "plain", "10").await;
    let ghost = reservation("elsewhere", "ghost-uid", &cpu("1"), SignedDuration::from_mins(10));
    let plain_demands = vec![
        demand("webhook-gone", "3", SignedDuration::from_secs(-1)),
        demand("webhook-live", "3", SignedDuration::from_hours(1)),
    ];
    write_status(&seed, "project-plain", |_| {
        json!({
            "reservations": kkp_quota_crds::ledger::group(std::slice::from_ref(&ghost)),
            "demands": plain_demands,
        })
    })
    .await;
    let recorder = QuotaVersions::start(&seed).await;

    // --- A lowered target: released down to it, in a write of its own. ---
    let mut config = Config::for_tests("seed");
    // Not quiet during this part: only the target releases.
    config.share_quiet_period = Duration::from_hours(1);
    // The ghost reservation expires this long after the controller first sees it (its own
    // clock, not the 10 minutes old `createdAt`).
    config.reservation_ttl = Duration::from_secs(10);
    let running = start_controller(&seed_cp, config).await;
    running.wait_ready().await;
    wait_released(&seed, Quantity::from_units(6)).await;
    e2e::wait_for(WAIT, "metrics of the release", || async {
        metric_of(&running, "kkp_quota_share_released_total", "demo") == Some(6.0)
            && metric_of(&running, "kkp_quota_share_held", "demo") == Some(4.0)
    })
    .await
    .unwrap();

    // --- Further writes release nothing more: a Machine counted ... ---
    let m0_spec = aws("t3.medium");
    create_machine(&alpha, "m0", &m0_spec).await;
    let s0 = size_of(&m0_spec);
    wait_local_usage(&seed, "demo", &s0).await;
    // ... an expired demand removed, the live one kept as it is.
    let live = demand("webhook-live", "9", SignedDuration::from_hours(1));
    let demands = vec![
        demand("webhook-gone", "9", SignedDuration::from_secs(-1)),
        live.clone(),
    ];
    write_status(&seed, "project-demo", |_| json!({ "demands": demands })).await;
    e2e::wait_for(WAIT, "the expired demand removed", || async {
        let now = status_of(&seed, "project-demo").await.demands;
        if now == vec![live.clone()] {
            Ok(())
        } else {
            Err(format!("demands {now:?}"))
        }
    })
    .await
    .unwrap();
    assert_eq!(released_cpu(&seed).await, Some(Quantity::from_units(6)));
    assert_eq!(
        metric_of(&running, "kkp_quota_share_released_total", "demo"),
        Some(6.0)
    );

    // --- A ledger without shares: its writes (ghost reservation expired, demand expired) never
    // carry `released`. ---
    e2e::wait_for(
        WAIT,
        "plain's ghost reservation and expired demand removed",
        || async {
            let s = status_of(&seed, "project-plain").await;
            s.reservations.is_empty() && s.demands.len() == 1
        },
    )
    .await
    .unwrap();
    let plain = status_of(&seed, "project-plain").await;
    assert_eq!(plain.released, None);
    assert_eq!(plain.demands[0].holder, "webhook-live");
    assert_eq!(metric_of(&running, "kkp_quota_share_held", "plain"), None);
    assert_eq!(
        metric_of(&running, "kkp_quota_share_released_total", "plain"),
        None
    );
    wait_metric_at_least(&running.metrics, "kkp_quota_demands_expired_total", &[], 2.0).await;
    running.stop().await;

    // --- Quiet: the target back at the share, the demand withdrawn; after the quiet period the
    // share above committed + slack (10% of the quota: 1 cpu) goes, with no event to prompt it:
    // the restarted controller takes the ledger as active when it first sees it, and only the
    // quiet period's end wakes it. ---
    set_shares(&seed, "project-demo", 2, "10", "10").await;
    write_status(&seed, "project-demo", |_| json!({ "demands": null })).await;
    let mut config = Config::for_tests("seed");
    config.share_quiet_period = Duration::from_secs(2);
    let running = start_controller(&seed_cp, config).await;
    running.wait_ready().await;
    // Held 4, committed m0's cpu, slack 1.
    let keep = s0
        .amount(Resource::Cpu)
        .checked_add(Quantity::from_units(1))
        .unwrap();
    let expected = Quantity::from_units(10).checked_sub(keep).unwrap();
    assert!(
        expected > Quantity::from_units(6),
        "m0 leaves something to release"
    );
    wait_released(&seed, expected).await;
    let released_now = expected.checked_sub(Quantity::from_units(6)).unwrap();
    e2e::wait_for(WAIT, "metrics of the quiet release", || async {
        metric_of(&running, "kkp_quota_share_released_total", "demo") == Some(as_f64(released_now))
            && metric_of(&running, "kkp_quota_share_held", "demo") == Some(as_f64(keep))
    })
    .await
    .unwrap();
    wait_local_usage(&seed, "demo", &s0).await;
    check_versions(&recorder);
    assert_eq!(status_of(&seed, "project-plain").await.released, None);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_release_comes_when_the_project_settled_without_its_ledger_changing() {
    init_logs();
    let (seed_cp, alpha_cp) = seed_with_alpha("10").await;
    let seed = seed_cp.client();
    set_shares(&seed, "project-demo", 1, "10", "10").await;
    alpha_cp.pause_apiserver().unwrap();
    let mut config = Config::for_tests("seed");
    let quiet_period = Duration::from_secs(20);
    config.share_quiet_period = quiet_period;
    config.user_cluster_timeout = Duration::from_secs(2);
    let started = std::time::Instant::now();
    let running = start_controller(&seed_cp, config).await;
    running.wait_ready().await;
    wait_condition(&seed, "alpha", "False", "UserClusterUnreachable").await;
    // A ledger change seen while alpha is unsettled: an expired demand, which the controller
    // removes (another change). The quota watch sets no timer on these.
    write_status(
        &seed,
        "project-demo",
        |_| json!({ "demands": [demand("webhook-gone", "1", SignedDuration::from_secs(-1))] }),
    )
    .await;
    e2e::wait_for(WAIT, "the expired demand removed", || async {
        status_of(&seed, "project-demo").await.demands.is_empty()
    })
    .await
    .unwrap();
    assert_eq!(
        released_cpu(&seed).await,
        None,
        "not quiet while alpha is unsettled"
    );
    // alpha settles (listed, nothing in it): localUsage stays 0, the ledger does not change.
    alpha_cp.resume_apiserver().unwrap();
    wait_condition(&seed, "alpha", "True", "AllMachinesCounted").await;
    if started.elapsed() >= quiet_period {
        eprintln!("alpha settled only after the quiet period: this run does not test the wakeup");
    }
    // Nothing committed, slack 1 (10% of the quota): 9 of 10 released.
    wait_released(&seed, Quantity::from_units(9)).await;
    e2e::wait_for(WAIT, "metrics of the quiet release", || async {
        metric_of(&running, "kkp_quota_share_released_total", "demo") == Some(9.0)
            && metric_of(&running, "kkp_quota_share_held", "demo") == Some(1.0)
    })
    .await
    .unwrap();
    running.stop().await;
}
