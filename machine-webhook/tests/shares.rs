//! Under per-seed shares (docs/shares.md) the webhook admits within the seed's share: a request
//! that fits the quota but not the share records a demand and waits for the share to grow (the
//! master's grant, played here by the test), and is denied as `share_in_transit` when none comes
//! within the wait.

mod common;

use std::time::Duration;

use anyhow::Result;
use common::bursts::{burst_fleet, wait_recorded};
use common::*;
use futures::future::join_all;
use kkp_quota_crds::QuotaLedger;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

/// Sets the ledger's `spec.shares` as master-controller would.
async fn grant(seed: &kube::Client, version: u64, granted_cpu: i64) -> Result<()> {
    let api: Api<QuotaLedger> = Api::all(seed.clone());
    api.patch(
        &format!("project-{PROJECT}"),
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"shares": {
            "version": version,
            "granted": {"cpu": granted_cpu.to_string()},
            "target": {"cpu": granted_cpu.to_string()},
            "others": {"seed-b": {"cpu": (16 - granted_cpu).to_string()}},
        }}})),
    )
    .await?;
    Ok(())
}

/// Creates `n` one-cpu Machines at once in `api`; returns the admitted count and the denials.
async fn create_burst(
    api: &Api<kkp_quota_crds::machine::Machine>,
    prefix: &str,
    n: usize,
) -> (usize, Vec<String>) {
    let creates = (0..n).map(|i| {
        let name = format!("{prefix}-{i}");
        async move { api.create(&PostParams::default(), &machine(&name, 1)).await }
    });
    let mut admitted = 0;
    let mut denials = Vec::new();
    for result in join_all(creates).await {
        match result {
            Ok(_) => admitted += 1,
            Err(e) => denials.push(e.to_string()),
        }
    }
    (admitted, denials)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_wait_for_share_and_get_exactly_what_is_granted() -> Result<()> {
    // 16 cpu quota, 6 counted on this seed, whose share is 8: 2 fit here.
    let (_running, seed, alpha, _beta, certs) = burst_fleet().await?;
    grant(&seed, 1, 8).await?;
    let webhook = start_webhook(seed.clone(), &certs, "127.0.0.1:0".parse()?).await?;
    register(&seed, alpha.clone(), "alpha", webhook.address, &certs).await?;
    let api = machines(alpha.clone());
    let ledgers: Api<QuotaLedger> = Api::all(seed.clone());

    // The master's part: once the demand shows, grant 4 more (share 12: 6 fit in all).
    let master = {
        let (ledgers, seed) = (ledgers.clone(), seed.clone());
        tokio::spawn(async move {
            let demand = e2e::wait_for(Duration::from_secs(20), "a demand for share", || async {
                let ledger = ledgers.get(&format!("project-{PROJECT}")).await.ok()?;
                ledger.status?.demands.first().cloned()
            })
            .await?;
            grant(&seed, 2, 12).await?;
            anyhow::Ok(demand)
        })
    };
    let (admitted, denials) = create_burst(&api, "wait", 10).await;
    let demand = master.await??;
    // The demand asked for what the waiting requests needed, absolute: more than the share.
    assert!(demand.amount.amount(kkp_quota_crds::Resource::Cpu) > kkp_quota_crds::Quantity::from_units(8));
    assert_eq!(admitted, 6, "denials: {denials:?}");
    for d in &denials {
        assert!(
            d.contains("cannot be admitted yet") && d.contains("seed \"seed-b\" (4 cpu)"),
            "{d}"
        );
    }
    let users = [("alpha", alpha.clone())];
    let tally = wait_recorded(&seed, &users).await?;
    assert_eq!(tally.existing, 6);
    let waited = &webhook.metrics.share_wait;
    assert!(waited.with_label_values(&["allowed"]).get_sample_count() >= 1);
    assert_eq!(
        webhook
            .metrics
            .admissions
            .with_label_values(&["denied", "share_in_transit"])
            .get(),
        4
    );

    // No grant this time: the request waits out its wait and is denied for share, not quota.
    let (admitted, denials) = create_burst(&api, "late", 1).await;
    assert_eq!(admitted, 0);
    assert!(denials[0].contains("cannot be admitted yet"), "{denials:?}");
    assert!(waited.with_label_values(&["denied"]).get_sample_count() >= 5);
    webhook.kill().await;
    Ok(())
}
