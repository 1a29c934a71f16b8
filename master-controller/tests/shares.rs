//! Per-seed shares against a real fleet (master + seed-a + seed-b, real kube-apiservers), the
//! master-controller in-process; the test plays the seeds' part (demands, releases) by writing
//! the ledgers' status as machine-webhook and seed-controller would.
//!
//! In order: every ledger gets `spec.shares` from the first record; a demand on seed-a is
//! granted (record first, then the ledger); a demand on seed-b that free headroom cannot cover
//! lowers seed-a's target, and seed-a's release lets seed-b reach the whole limit; an
//! unreachable seed's share is reported stuck; the API server refuses shares that go back.

#![allow(clippy::too_many_lines)] // scenarios read top to bottom

mod common;

use anyhow::{Context as _, Result, ensure};
use common::*;
use e2e::{Fleet, FleetSpec, wait_for};
use kkp_quota_crds::project_quota::{SeedFigures, ShareRecord};
use kkp_quota_crds::quota_ledger::LedgerShares;
use kkp_quota_crds::{ProjectQuota, Quantity, QuotaLedger, Resource, ResourceDetails, ResourceQuota};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

const SEEDS: [&str; 2] = ["seed-a", "seed-b"];
const QUOTA: &str = "project-demo";

// Fields drop in order: the controller stops before the fleet does.
struct World {
    controller: Running,
    pq: Api<ProjectQuota>,
    fleet: Fleet,
}

use kkp_quota_crds::fixtures::cpu;

fn cpu_of(d: &ResourceDetails) -> Quantity {
    d.amount(Resource::Cpu)
}

impl World {
    fn seed(&self, name: &str) -> Client {
        self.fleet.seed(name).client()
    }

    fn ledgers(&self, seed: &str) -> Api<QuotaLedger> {
        Api::all(self.seed(seed))
    }

    /// The seed's ledger `spec.shares`.
    async fn ledger_shares(&self, seed: &str) -> Result<LedgerShares> {
        let ledger = self
            .ledgers(seed)
            .get_opt(QUOTA)
            .await?
            .context(format!("no ledger on {seed}"))?;
        ledger.spec.shares.context(format!("{seed}: no spec.shares"))
    }

    /// The master's record (`ProjectQuota.status.shares`).
    async fn record(&self) -> Result<ShareRecord> {
        let pq = self.pq.get(QUOTA).await?;
        pq.status
            .and_then(|s| s.shares)
            .context("no status.shares on the ProjectQuota")
    }

    async fn figures(&self, seed: &str) -> Result<SeedFigures> {
        let pq = self.pq.get(QUOTA).await?;
        pq.status
            .unwrap_or_default()
            .seeds
            .into_iter()
            .find(|s| s.name == seed)
            .context(format!("no status.seeds[{seed}]"))
    }

    /// What machine-webhook does when a request does not fit the seed's share.
    async fn demand(&self, seed: &str, amount: Option<i64>) -> Result<()> {
        write_demand(&self.seed(seed), QUOTA, amount).await
    }

    /// What seed-controller does when its target is below its share.
    async fn release(&self, seed: &str, released: &ResourceDetails) -> Result<()> {
        write_release(&self.seed(seed), QUOTA, released).await
    }
}

fn granted(record: &ShareRecord, seed: &str) -> ResourceDetails {
    record
        .seeds
        .iter()
        .find(|s| s.name == seed)
        .map(|s| s.granted.clone())
        .unwrap_or_default()
}

fn total_granted(record: &ShareRecord) -> Quantity {
    record.seeds.iter().fold(Quantity::ZERO, |sum, s| {
        sum.checked_add(cpu_of(&s.granted)).unwrap_or(sum)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_on_a_real_fleet() -> Result<()> {
    let fleet = Fleet::start(
        FleetSpec::empty()
            .with_seed("seed-a")
            .with_seed("seed-b")
            .with_project("demo"),
    )
    .await?;
    let controller = Running::start(fleet.master().client(), options()).await?;
    let world = World {
        controller,
        pq: Api::all(fleet.master().client()),
        fleet,
    };
    let master: Api<ResourceQuota> = Api::all(world.fleet.master().client());
    create_quota(&master, QUOTA, "demo", cpu(10)).await?;

    first_record_reaches_every_ledger(&world)
        .await
        .context("first record")?;
    demand_is_granted(&world).await.context("grant")?;
    share_moves_between_seeds(&world)
        .await
        .context("share moved from seed-a to seed-b")?;
    unreachable_share_is_stuck(&world).await.context("stuck share")?;
    shares_never_go_back(&world)
        .await
        .context("older shares refused")?;
    ensure!(!world.controller.is_finished(), "the controller stopped");
    Ok(())
}

/// (a) Every ledger carries the persisted record: version at least 1, nothing granted yet.
async fn first_record_reaches_every_ledger(w: &World) -> Result<()> {
    wait_for(DEADLINE, "spec.shares on every ledger", || async {
        let record = w.record().await?;
        ensure!(record.version >= 1, "record version {}", record.version);
        for seed in SEEDS {
            let shares = w.ledger_shares(seed).await?;
            ensure!(shares.version >= 1, "{seed}: version {}", shares.version);
            ensure!(
                shares.version <= record.version,
                "{seed}: version {} ahead of the record's {}",
                shares.version,
                record.version
            );
            ensure!(
                cpu_of(&shares.granted) == Quantity::ZERO,
                "{seed}: granted {}",
                shares.granted
            );
        }
        Ok(())
    })
    .await
}

/// (b) A demand of 4 cpu on seed-a: the record grants it, then seed-a's ledger gets it.
async fn demand_is_granted(w: &World) -> Result<()> {
    w.demand("seed-a", Some(4)).await?;
    wait_for(DEADLINE, "seed-a granted at least 4 cpu", || async {
        let record = w.record().await?;
        let a = cpu_of(&granted(&record, "seed-a"));
        ensure!(a >= Quantity::from_units(4), "record grants seed-a {a:?}");
        let total = total_granted(&record);
        ensure!(
            total <= Quantity::from_units(10),
            "record grants {total:?} in all, over the limit"
        );
        let shares = w.ledger_shares("seed-a").await?;
        ensure!(
            cpu_of(&shares.granted) >= Quantity::from_units(4),
            "seed-a's ledger says granted {}",
            shares.granted
        );
        ensure!(
            cpu_of(&shares.granted) <= a,
            "the ledger holds more than the record"
        );
        Ok(())
    })
    .await?;
    // The master's view in the status, and the metrics.
    wait_for(DEADLINE, "seed-a's share and demand in the status", || async {
        let f = w.figures("seed-a").await?;
        let share = f.share.context("no share")?;
        ensure!(cpu_of(&share) >= Quantity::from_units(4), "share {share}");
        let demand = f.demand.context("no demand")?;
        ensure!(cpu_of(&demand) == Quantity::from_units(4), "demand {demand}");
        ensure!(!f.stuck, "seed-a is reachable");
        let text = w.controller.scrape().await?;
        ensure!(
            sample(&text, "kkp_quota_share_grants_total{seed=\"seed-a\"}").is_some_and(|v| v >= 1.0),
            "grant counter"
        );
        ensure!(
            sample(
                &text,
                "kkp_quota_share{project=\"demo\",resource=\"cpu\",seed=\"seed-a\"}"
            )
            .is_some_and(|v| v >= 4.0),
            "share gauge"
        );
        ensure!(
            sample(&text, "kkp_quota_share_grant_latency_seconds_count").is_some_and(|v| v >= 1.0),
            "a grant latency sample"
        );
        Ok(())
    })
    .await
}

/// (c) seed-a holds its grant and commits nothing; seed-b asks for the whole limit. The master
/// grants what is free and lowers seed-a's target; once seed-a releases, seed-b gets the rest.
async fn share_moves_between_seeds(w: &World) -> Result<()> {
    // seed-a's requests were admitted: its demand is withdrawn.
    w.demand("seed-a", None).await?;
    let granted_a = wait_for(DEADLINE, "seed-a's demand gone from the status", || async {
        let f = w.figures("seed-a").await?;
        ensure!(f.demand.is_none(), "demand {:?}", f.demand);
        Ok(cpu_of(&granted(&w.record().await?, "seed-a")))
    })
    .await?;
    w.demand("seed-b", Some(10)).await?;
    wait_for(DEADLINE, "seed-a's target lowered on its ledger", || async {
        let shares = w.ledger_shares("seed-a").await?;
        let target = shares.target.get(Resource::Cpu).context("no cpu target")?;
        ensure!(target < granted_a, "target {target:?}, holds {granted_a:?}");
        Ok(())
    })
    .await?;
    // seed-a's seed-controller releases what it holds above its target (it commits nothing).
    let released = ResourceDetails {
        cpu: Some(granted_a),
        ..ResourceDetails::default()
    };
    w.release("seed-a", &released).await?;
    wait_for(DEADLINE, "seed-b's share reaches the whole limit", || async {
        let record = w.record().await?;
        let b = cpu_of(&granted(&record, "seed-b"));
        ensure!(b == Quantity::from_units(10), "record grants seed-b {b:?}");
        let shares = w.ledger_shares("seed-b").await?;
        ensure!(
            cpu_of(&shares.granted) == Quantity::from_units(10),
            "seed-b's ledger says granted {}",
            shares.granted
        );
        // What seeds hold never exceeds the limit: seed-a gave back all it had.
        let a = cpu_of(&granted(&record, "seed-a")).checked_sub(granted_a)?;
        ensure!(
            a.checked_add(b)? <= Quantity::from_units(10),
            "seeds hold {a:?} + {b:?}"
        );
        let text = w.controller.scrape().await?;
        ensure!(
            sample(&text, "kkp_quota_share_releases_total{seed=\"seed-a\"}").is_some_and(|v| v >= 1.0),
            "release counter"
        );
        Ok(())
    })
    .await
}

/// A seed that cannot be reached keeps its share, reported stuck, until it is back.
async fn unreachable_share_is_stuck(w: &World) -> Result<()> {
    w.fleet.seed("seed-b").stop_apiserver().await;
    wait_for(DEADLINE, "seed-b's share stuck", || async {
        let f = w.figures("seed-b").await?;
        ensure!(f.stuck, "not stuck: {f:?}");
        let text = w.controller.scrape().await?;
        ensure!(
            sample(
                &text,
                "kkp_quota_share_stuck{project=\"demo\",resource=\"cpu\",seed=\"seed-b\"}"
            ) == Some(10.0),
            "stuck gauge"
        );
        Ok(())
    })
    .await?;
    w.fleet.seed("seed-b").start_apiserver().await?;
    wait_for(DEADLINE, "seed-b's share no longer stuck", || async {
        let f = w.figures("seed-b").await?;
        ensure!(!f.stuck, "still stuck");
        Ok(())
    })
    .await
}

/// (d) The API server refuses `spec.shares` from an older record.
async fn shares_never_go_back(w: &World) -> Result<()> {
    let current = w.ledger_shares("seed-a").await?;
    ensure!(current.version >= 1);
    let older = json!({"spec": {"shares": {"version": current.version - 1}}});
    let result = w
        .ledgers("seed-a")
        .patch(QUOTA, &PatchParams::default(), &Patch::Merge(&older))
        .await;
    match result {
        Err(kube::Error::Api(e)) => {
            ensure!(e.code == 422, "refused with {} ({})", e.code, e.message);
            ensure!(e.message.contains("never go back"), "message: {}", e.message);
        }
        Err(e) => return Err(e).context("unexpected error"),
        Ok(_) => anyhow::bail!("an older spec.shares was accepted"),
    }
    let after = w.ledger_shares("seed-a").await?;
    ensure!(after.version == current.version, "the ledger's shares changed");
    Ok(())
}
