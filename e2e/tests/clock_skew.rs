//! Clock skew between components (issue #32, finding 8), on the whole system: two seeds, each
//! with a webhook whose clock runs 40 s behind every other component's (a hidden test flag).
//! Demands and allotments carry the lifetime their writer meant, and master-controller and
//! seed-controller judge it by their own clocks from when they first saw the entry; judged by
//! the webhook's `expiresAt` instead, every demand (6 s here) would be expired on arrival and
//! share would never move. A watcher follows every version of both ledgers and of the master's
//! `ProjectQuota` and fails the test if the seeds ever commit more than the limit together.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use e2e::system::FleetWithSystem;
use e2e::{Fleet, FleetSpec, wait_for};
use kkp_quota_crds::shares::objects::committed;
use kkp_quota_crds::{Quantity, QuotaLedger, Resource};
use kube::Api;
use tokio::sync::oneshot;

const LIMIT: i64 = 10;
const LIMIT_MACHINES: usize = 10;
const NAME: &str = "project-demo";
const WAIT: Duration = Duration::from_mins(1);
const SKEW_SECONDS: i64 = 40;
const SKEW_FLAG: &str = "--test-clock-offset=";
const DEMAND_TTL_FLAG: &str = "--share-demand-ttl=6s";

async fn setup() -> FleetWithSystem {
    let spec = FleetSpec::empty()
        .with_seed("seed-a")
        .with_seed("seed-b")
        .with_project("demo")
        .with_user_cluster("alpha", "seed-a", "demo")
        .with_user_cluster("gamma", "seed-b", "demo");
    let skew = format!("{SKEW_FLAG}-{SKEW_SECONDS}s");
    let extra = [
        ("machine-webhook", DEMAND_TTL_FLAG),
        ("machine-webhook", skew.as_str()),
    ];
    let running = FleetWithSystem::start_with(spec, &extra).await.unwrap();
    let quota = e2e::demo::cpu_quota("demo", &LIMIT.to_string());
    e2e::demo::apply_quota(&running.fleet, &quota, "clock-skew-test")
        .await
        .unwrap();
    for seed in ["seed-a", "seed-b"] {
        let ledgers = Api::<QuotaLedger>::all(running.fleet.seed(seed).client());
        wait_for(WAIT, &format!("{seed}'s ledger under shares"), || async {
            ledgers.get(NAME).await.ok()?.spec.shares
        })
        .await
        .unwrap();
    }
    e2e::demo::wait_in_force(&running.fleet, "demo", WAIT)
        .await
        .unwrap();
    running
}

/// `count` one-cpu Machines created at once in `user`; how many were admitted.
async fn burst(fleet: &Fleet, user: &str, count: usize, prefix: &str) -> usize {
    e2e::shares::burst(fleet, "demo", &vec![user; count], prefix).await
}

/// Deletes `user`'s Machines and waits until neither seed commits anything nor holds a demand,
/// and every seed counts nothing on the others (the next burst starts from a settled state).
async fn settle(fleet: &Fleet, user: &str) {
    e2e::shares::delete_all(fleet, &[user]).await;
    for seed in e2e::shares::SEEDS {
        let ledgers = Api::<QuotaLedger>::all(fleet.seed(seed).client());
        wait_for(WAIT, &format!("{seed} idle, without demands"), || async {
            let status = ledgers.get(NAME).await.ok()?.status.unwrap_or_default();
            let others = status.other_seeds_usage.clone().unwrap_or_default();
            (committed(&status).ok()?.amount(Resource::Cpu) == Quantity::ZERO
                && status.demands.is_empty()
                && others.amount(Resource::Cpu) == Quantity::ZERO)
                .then_some(())
        })
        .await
        .unwrap();
    }
}

/// The largest `kkp_quota_observed_clock_skew_seconds` sample for demands of the component of
/// `kind` named `name`.
async fn demand_skew(setup: &FleetWithSystem, kind: &str, name: &str) -> Option<f64> {
    let component = setup.system.of_kind(kind).find(|c| c.name == name)?;
    let metrics = component.scrape().await.ok()?;
    metrics
        .lines()
        .filter(|l| l.starts_with("kkp_quota_observed_clock_skew_seconds{") && l.contains("entry=\"demand\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .reduce(f64::max)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_moves_between_seeds_with_the_webhooks_clocks_behind() {
    let mut setup = setup().await;
    let (stop, stopped) = oneshot::channel();
    let watching = e2e::shares::overrun_watcher(
        &setup.fleet,
        NAME,
        Resource::Cpu,
        Quantity::from_units(LIMIT),
        stopped,
    );

    // Every admission here needs a demand to reach the master (no seed holds share yet, then
    // the other seed holds it all, idle): with lifetimes judged by the webhook's clock, each
    // demand would be 34 s past its `expiresAt` when written.
    let on_b = burst(&setup.fleet, "gamma", 20, "b").await;
    assert_eq!(
        on_b, LIMIT_MACHINES,
        "seed-b gets the whole quota while its webhook's clock is behind"
    );
    settle(&setup.fleet, "gamma").await;
    let on_a = burst(&setup.fleet, "alpha", 20, "a").await;
    assert_eq!(on_a, LIMIT_MACHINES, "seed-b's idle share moves to seed-a");
    settle(&setup.fleet, "alpha").await;

    // The skew is exported: the observer's clock minus the writer's, delay included, so at
    // least the offset.
    let skew = f64::from(i32::try_from(SKEW_SECONDS).unwrap());
    for (kind, name) in [
        ("master-controller", "master-controller"),
        ("seed-controller", "seed-controller-seed-a"),
    ] {
        let seen = demand_skew(&setup, kind, name).await;
        assert!(
            seen.is_some_and(|s| s >= skew),
            "{name} exports a skew of {seen:?}"
        );
    }

    // The fault heals (the webhooks' clocks are right again): the quota is usable as before.
    for seed in ["seed-a", "seed-b"] {
        let webhook = format!("machine-webhook-{seed}");
        let component = setup.system.component_mut(&webhook).unwrap();
        component.restart_without(SKEW_FLAG).unwrap();
        let component = &*component;
        wait_for(WAIT, &format!("{webhook} ready again"), || async {
            component.is_ready().await.then_some(())
        })
        .await
        .unwrap();
    }
    let healed = burst(&setup.fleet, "gamma", 20, "healed").await;
    assert_eq!(
        healed, LIMIT_MACHINES,
        "after the heal, seed-b gets the whole quota back"
    );
    settle(&setup.fleet, "gamma").await;

    let _ = stop.send(());
    let checked = watching.await.unwrap();
    assert!(checked > 10, "only {checked} versions checked");
}
