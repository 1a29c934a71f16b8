//! The reason this project exists: many Machines at once, over two user clusters of one
//! project, must never take the project over its quota.

mod common;

use anyhow::Result;
use common::bursts::*;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_concurrent_creates_admit_exactly_the_headroom_in_twenty_rounds() -> Result<()> {
    let (_running, seed, alpha, beta, certs) = burst_fleet().await?;
    let webhook = start_webhook(seed.clone(), &certs, "127.0.0.1:0".parse()?).await?;
    register(&seed, alpha.clone(), "alpha", webhook.address, &certs).await?;
    register(&seed, beta.clone(), "beta", webhook.address, &certs).await?;
    let (alpha_api, beta_api) = (machines(alpha.clone()), machines(beta.clone()));
    let users = [("alpha", alpha.clone()), ("beta", beta.clone())];

    for round in 0..20 {
        let writes_before = webhook.metrics.writes.get();
        let (admitted, other) = burst(&alpha_api, &beta_api, round).await?;
        assert!(other.is_empty(), "round {round}: unexpected failures: {other:?}");
        assert_eq!(
            admitted,
            usize::try_from(HEADROOM)?,
            "round {round}: admitted {admitted} of {BURST}"
        );
        let tally = wait_recorded(&seed, &users).await?;
        assert_eq!(
            (tally.existing, tally.reserved),
            (admitted, admitted),
            "round {round}"
        );
        // Batching and allotments: far fewer writes than admissions.
        let writes = webhook.metrics.writes.get() - writes_before;
        assert!(
            writes <= u64::try_from(admitted)?,
            "round {round}: {writes} writes"
        );
        eprintln!(
            "round {round}: {admitted} admitted of {BURST} with {writes} ledger writes ({} from the allotment so far)",
            webhook.metrics.allotment_admissions.get()
        );
        // Reset: the Machines go, the ledger empties, the count is back where it was.
        delete_all_machines(alpha.clone()).await?;
        delete_all_machines(beta.clone()).await?;
        reset_usage(seed.clone(), PROJECT, &COUNTED.to_string()).await?;
    }
    eprintln!(
        "conflicts: {}, writes: {}",
        webhook.metrics.conflicts.get(),
        webhook.metrics.writes.get()
    );
    webhook.kill().await;
    Ok(())
}
