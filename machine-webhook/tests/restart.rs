//! The webhook killed and restarted in the middle of a burst: reservations live in the API
//! server, so the restarted webhook continues from them and the project is never overrun.

mod common;

use std::time::Duration;

use anyhow::Result;
use common::bursts::*;
use common::*;
use e2e::wait_for;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_killed_mid_burst_never_overruns() -> Result<()> {
    let fleet = fleet().await?;
    let seed = fleet.seed(SEED).client();
    let alpha = fleet.user_cluster("alpha").client();
    let beta = fleet.user_cluster("beta").client();
    let certs = certs()?;
    write_quota(seed.clone(), PROJECT, &LIMIT.to_string(), &COUNTED.to_string()).await?;
    let mut current = start_webhook(seed.clone(), &certs, "127.0.0.1:0".parse()?).await?;
    let address = current.address;
    register(alpha.clone(), "alpha", address, &certs).await?;
    register(beta.clone(), "beta", address, &certs).await?;
    let (alpha_api, beta_api) = (machines(alpha.clone()), machines(beta.clone()));
    let users = [("alpha", alpha.clone()), ("beta", beta.clone())];

    for round in 0..3 {
        // The burst runs while the webhook is killed as soon as the first reservation lands.
        let (a, b) = (alpha_api.clone(), beta_api.clone());
        let running = tokio::spawn(async move { burst(&a, &b, round).await });
        let seed_for_wait = seed.clone();
        wait_for(Duration::from_mins(1), "a first reservation", || {
            let seed = seed_for_wait.clone();
            async move { reservations(seed, PROJECT).await.is_ok_and(|r| !r.is_empty()) }
        })
        .await?;
        // Kill it (the task and every connection and worker it owns) and start a new one on the
        // same address: the user clusters' configurations keep pointing there.
        current.kill().await;
        current = start_webhook(seed.clone(), &certs, address).await?;
        let (first_admitted, failures) = running.await??;
        // Requests in flight when it died fail (failurePolicy Fail), none is admitted unreserved.
        let (existing, _) = check_no_overrun(&seed, &users).await?;
        assert_eq!(existing, first_admitted, "round {round}: failures {failures:?}");
        // A second burst after the restart fills what is left, and not one Machine more.
        let (second_admitted, failures) = burst(&alpha_api, &beta_api, round + 100).await?;
        assert!(failures.is_empty(), "round {round}: {failures:?}");
        let (existing, reserved) = check_no_overrun(&seed, &users).await?;
        assert_eq!(existing, first_admitted + second_admitted);
        // Writes that landed while their request died leave reservations without a Machine
        // (seed-controller expires them); they only ever make room smaller.
        assert!(reserved >= existing);
        let headroom = usize::try_from(HEADROOM)?;
        assert_eq!(
            reserved, headroom,
            "round {round}: the ledger is full after the second burst"
        );
        eprintln!(
            "round {round}: {first_admitted} admitted around the kill ({} denied or failed), {second_admitted} after; {} stray reservations",
            BURST - first_admitted,
            reserved - existing
        );
        delete_all_machines(alpha.clone()).await?;
        delete_all_machines(beta.clone()).await?;
        reset_usage(seed.clone(), PROJECT, &COUNTED.to_string()).await?;
    }
    current.kill().await;
    Ok(())
}
