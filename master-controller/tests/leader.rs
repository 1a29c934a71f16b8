//! Leader election on a real master: a replica that does not hold the Lease writes nothing,
//! and a standby takes over when the holder goes away.

mod common;

use std::time::Duration;

use anyhow::{Result, ensure};
use common::*;
use e2e::{Fleet, FleetSpec, wait_for};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kkp_quota_crds::quota::SEED_CLEANUP_FINALIZER;
use kkp_quota_crds::{Quantity, QuotaLedger, Resource, ResourceQuota};
use kkp_quota_runtime::leader::{LeaderElector, LeaseConfig};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use master_controller::Options;
use serde_json::json;

const LEASE: &str = "kkp-quota-master-controller";

fn replica(identity: &str) -> Options {
    let mut options = options();
    let mut lease = LeaseConfig::new("kubermatic", LEASE, identity);
    lease.lease_duration = Duration::from_secs(2);
    lease.renew_every = Duration::from_millis(250);
    options.lease = Some(lease);
    options
}

async fn holder(leases: &Api<Lease>) -> Result<Option<String>> {
    holder_of(leases, LEASE).await
}

async fn copy_cpu(seed: &Api<QuotaLedger>) -> Result<Option<Quantity>> {
    Ok(seed
        .get_opt("project-demo")
        .await?
        .map(|c| c.spec.quota.amount(Resource::Cpu)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines)] // one story, top to bottom
async fn only_the_lease_holder_writes() -> Result<()> {
    let fleet = Fleet::start(FleetSpec::empty().with_seed("seed-a").with_project("demo")).await?;
    let master = fleet.master().client();
    let quotas: Api<ResourceQuota> = Api::all(master.clone());
    let seed: Api<QuotaLedger> = Api::all(fleet.seed("seed-a").client());
    let leases: Api<Lease> = Api::namespaced(master.clone(), "kubermatic");

    // Someone else holds the lease and keeps renewing it.
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(LEASE.into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("intruder".into()),
            lease_duration_seconds: Some(2),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..LeaseSpec::default()
        }),
    };
    leases.create(&PostParams::default(), &lease).await?;
    let a = Running::start(master.clone(), replica("a")).await?;
    create_quota(&quotas, "project-demo", "demo", cpu_mem(4, 8)).await?;

    // While the intruder renews (12 rounds over 3 s; holding a lease is a time window by nature),
    // replica "a" must not write anything: no seed copy, no finalizer, no write counted. A
    // replica that ignored the lease would have copied the quota within milliseconds.
    let mut renew = tokio::time::interval(Duration::from_millis(250));
    for _ in 0..12 {
        renew.tick().await;
        let now = serde_json::to_value(MicroTime(Timestamp::now()))?;
        leases
            .patch(
                LEASE,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"renewTime": now}})),
            )
            .await?;
        ensure!(
            seed.get_opt("project-demo").await?.is_none(),
            "a non-leader copied the quota to the seed"
        );
        let m = quotas.get("project-demo").await?;
        ensure!(
            !m.finalizers().iter().any(|f| f == SEED_CLEANUP_FINALIZER),
            "a non-leader added the finalizer"
        );
        ensure!(a.writes() == 0.0, "a non-leader counted writes");
        ensure!(a.metrics.leader.get() == 0, "a non-leader claims to lead");
    }

    // The intruder stops renewing: "a" takes over once the lease expires, and acts.
    wait_for(
        DEADLINE,
        "replica a copies the quota after taking the lease",
        || async {
            copy_cpu(&seed)
                .await
                .ok()
                .flatten()
                .filter(|c| *c == Quantity::from_units(4))
        },
    )
    .await?;
    ensure!(
        holder(&leases).await?.as_deref() == Some("a"),
        "a holds the lease"
    );
    ensure!(a.metrics.leader.get() == 1);

    // A second replica while "a" holds the lease: edits are carried out by "a" alone.
    let b = Running::start(master.clone(), replica("b")).await?;
    wait_for(DEADLINE, "replica b is up (standby is ready)", || async {
        b.readiness.is_ready()
    })
    .await?;
    for cpu in [5, 6, 7] {
        set_quota(&quotas, "project-demo", &cpu_mem(cpu, 8)).await?;
        wait_for(
            DEADLINE,
            &format!("copy follows the edit to {cpu} cpu"),
            || async {
                copy_cpu(&seed)
                    .await
                    .ok()
                    .flatten()
                    .filter(|c| *c == Quantity::from_units(cpu))
            },
        )
        .await?;
    }
    ensure!(
        holder(&leases).await?.as_deref() == Some("a"),
        "a still holds the lease"
    );
    ensure!(
        b.writes() == 0.0,
        "the standby replica wrote while a held the lease"
    );
    ensure!(b.metrics.leader.get() == 0, "the standby claims to lead");
    ensure!(a.writes() > 0.0, "the leader did the writes");

    // "a" goes away without releasing the lease: "b" takes over once it expires, and acts.
    drop(a);
    wait_for(DEADLINE, "replica b takes the lease", || async {
        holder(&leases).await.ok().flatten().filter(|h| h == "b")
    })
    .await?;
    set_quota(&quotas, "project-demo", &cpu_mem(9, 8)).await?;
    wait_for(DEADLINE, "replica b carries out the next edit", || async {
        copy_cpu(&seed)
            .await
            .ok()
            .flatten()
            .filter(|c| *c == Quantity::from_units(9))
    })
    .await?;
    // Counted once its write has returned; the copy can be seen a moment before.
    wait_for(DEADLINE, "the new leader's writes counted", || async {
        b.writes() > 0.0
    })
    .await?;
    ensure!(b.metrics.leader.get() == 1);
    drop(b);
    drop(fleet);
    Ok(())
}

/// A renewal that meets a conflicting write is retried on a fresh read, not taken as a lost
/// lease: two renewals of the same holder at once (as when one's answer was slow) both keep it,
/// and a live other holder still wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_renewal_does_not_lose_the_lease() -> Result<()> {
    let fleet = Fleet::start(FleetSpec::empty()).await?;
    let master = fleet.master().client();
    let config = LeaseConfig::new("default", "conflicts", "a");
    let elector = LeaderElector::new(master.clone(), config.clone());
    ensure!(elector.try_acquire_or_renew().await?, "a takes the free lease");
    for round in 0..20 {
        let (first, second) = tokio::join!(elector.try_acquire_or_renew(), elector.try_acquire_or_renew());
        ensure!(
            first? && second?,
            "round {round}: a renewal reported the lease lost"
        );
    }
    let leases: Api<Lease> = Api::namespaced(master.clone(), "default");
    ensure!(holder_of(&leases, "conflicts").await?.as_deref() == Some("a"));
    // Another candidate meets a live holder: not taken, however often it tries.
    let other = LeaderElector::new(master, LeaseConfig::new("default", "conflicts", "b"));
    let (b1, b2) = tokio::join!(other.try_acquire_or_renew(), other.try_acquire_or_renew());
    ensure!(!b1? && !b2?, "b took a live lease");
    ensure!(holder_of(&leases, "conflicts").await?.as_deref() == Some("a"));
    Ok(())
}

async fn holder_of(leases: &Api<Lease>, name: &str) -> Result<Option<String>> {
    Ok(leases.get(name).await?.spec.and_then(|s| s.holder_identity))
}

/// A holder that is stopped gives the lease up once its work has stopped: the standby takes it
/// at its next round, long before the lease (five minutes here) would have expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_leader_releases_the_lease() -> Result<()> {
    let fleet = Fleet::start(FleetSpec::empty()).await?;
    let master = fleet.master().client();
    let leases: Api<Lease> = Api::namespaced(master.clone(), "default");
    let holder_is = |identity: &'static str| {
        let leases = leases.clone();
        move || {
            let leases = leases.clone();
            async move {
                holder_of(&leases, "handover")
                    .await
                    .ok()
                    .flatten()
                    .filter(|h| h == identity)
            }
        }
    };
    let (stop_a, stopped) = tokio::sync::oneshot::channel::<()>();
    let (a, _) = candidate(&master, "a", async {
        let _ = stopped.await;
    });
    wait_for(DEADLINE, "a leads", holder_is("a")).await?;
    let (_b, b_ready) = candidate(&master, "b", std::future::pending());
    // A candidate is ready as a standby once a round has found the lease held by another.
    wait_for(DEADLINE, "b is a standby", || async { b_ready.is_ready() }).await?;
    ensure!(
        holder_of(&leases, "handover").await?.as_deref() == Some("a"),
        "b took a live lease"
    );
    stop_a.send(()).ok();
    ensure!(a.await?.is_ok_and(|out| out.is_none()), "a did not stop cleanly");
    wait_for(DEADLINE, "b takes the released lease", holder_is("b")).await?;
    Ok(())
}

/// A candidate for the lease `default/handover` (five minutes, renewed every 200 ms) whose work
/// never ends, until `shutdown`; its task (aborted when dropped) and its readiness.
fn candidate(
    master: &kube::Client,
    identity: &str,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> (
    tokio_util::task::AbortOnDropHandle<Result<Option<()>, kkp_quota_runtime::RuntimeError>>,
    kkp_quota_runtime::ops::Readiness,
) {
    let mut config = LeaseConfig::new("default", "handover", identity);
    config.lease_duration = Duration::from_mins(5);
    config.renew_every = Duration::from_millis(200);
    let elector = LeaderElector::new(master.clone(), config);
    let readiness = kkp_quota_runtime::ops::Readiness::default();
    let ready = readiness.clone();
    let task = tokio::spawn(async move {
        elector
            .run_until(&ready, std::future::pending::<()>(), shutdown)
            .await
    });
    (tokio_util::task::AbortOnDropHandle::new(task), readiness)
}
