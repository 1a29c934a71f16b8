//! One quota over two seeds (docs/shares.md), on the whole system: master-controller, and a
//! seed-controller and a machine-webhook per seed, as real processes. Project `demo` has user
//! clusters `alpha`, `beta` on seed-a and `gamma` on seed-b, and a quota of `LIMIT` cpu; every
//! Machine is one cpu. A watcher follows every version of both seeds' ledgers and of the master's
//! `ProjectQuota` all along, and fails the test if what the seeds committed together, or the
//! master's global usage, ever exceeds the limit.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

#[path = "shares/clusters.rs"]
mod clusters;
#[path = "shares/group.rs"]
mod group;
#[path = "shares/group_pair.rs"]
mod group_pair;
#[path = "shares/view.rs"]
mod view;

use std::fmt::Write as _;
use std::time::Duration;

use e2e::fleet::KUBERMATIC_NAMESPACE;
use e2e::shares::{delete_all, exact_figures};
use e2e::system::{FleetWithSystem, sample};
use e2e::{Fleet, FleetSpec, wait_for};
use kkp_quota_crds::kkp::Seed;
use kkp_quota_crds::project_quota::SeedFigures;
use kkp_quota_crds::shares::objects::demand;
use kkp_quota_crds::{ProjectQuota, Quantity, QuotaLedger, Resource};
use kube::api::DeleteParams;
use kube::{Api, Client};
use tokio::sync::oneshot;

const LIMIT: i64 = 10;
/// Machines (one cpu each) the quota admits.
const LIMIT_MACHINES: usize = 10;
const NAME: &str = "project-demo";
const WAIT: Duration = Duration::from_mins(1);
/// A demand left by denied requests keeps its seed's idle share the seed's own until it lapses
/// (30 s by default); shorter here, so that the scenarios that need it gone wait less.
const DEMAND_TTL_FLAG: &str = "--share-demand-ttl=6s";
/// A frozen seed API server is found by the master's probe (10 s by default).
const SEED_PROBE_FLAG: &str = "--seed-probe=2s";

/// The fleet (two seeds) and the system, with the quota written and every ledger under shares.
async fn setup() -> FleetWithSystem {
    setup_of(shares_fleet()).await
}

/// Two seeds, project `demo` with `alpha` and `beta` on seed-a and `gamma` on seed-b.
fn shares_fleet() -> FleetSpec {
    FleetSpec::empty()
        .with_seed("seed-a")
        .with_seed("seed-b")
        .with_project("demo")
        .with_user_cluster("alpha", "seed-a", "demo")
        .with_user_cluster("beta", "seed-a", "demo")
        .with_user_cluster("gamma", "seed-b", "demo")
}

/// [`setup`] of the fleet `spec`.
async fn setup_of(spec: FleetSpec) -> FleetWithSystem {
    let extra = [
        ("machine-webhook", DEMAND_TTL_FLAG),
        ("master-controller", SEED_PROBE_FLAG),
    ];
    let running = FleetWithSystem::start_with(spec, &extra).await.unwrap();
    let fleet = &running.fleet;
    let quota = e2e::demo::cpu_quota("demo", &LIMIT.to_string());
    e2e::demo::apply_quota(fleet, &quota, "shares-test")
        .await
        .unwrap();
    for seed in ["seed-a", "seed-b"] {
        let ledgers = Api::<QuotaLedger>::all(fleet.seed(seed).client());
        wait_for(WAIT, &format!("{seed}'s ledger under shares"), || async {
            ledgers.get(NAME).await.ok()?.spec.shares
        })
        .await
        .unwrap();
    }
    e2e::demo::wait_in_force(fleet, "demo", WAIT).await.unwrap();
    running
}

/// [`e2e::shares::burst`] for project `demo`.
async fn burst(fleet: &Fleet, users: &[&str], prefix: &str) -> usize {
    e2e::shares::burst(fleet, "demo", users, prefix).await
}

/// [`exact_figures`] in whole cpus, rounded up (what the scenarios count in Machines).
fn figures(ledger: &QuotaLedger) -> Option<(i64, i64)> {
    let cpu = |q: Quantity| i64::try_from(q.ceil_units()).unwrap();
    exact_figures(ledger, Resource::Cpu).map(|(committed, share)| (cpu(committed), cpu(share)))
}

/// [`figures`] of a seed's ledger as it is now.
async fn seed_figures(client: &Client) -> Option<(i64, i64)> {
    figures(&Api::<QuotaLedger>::all(client.clone()).get(NAME).await.ok()?)
}

/// The share state of the project, for assertion messages: the master's record and per-seed
/// figures, and each seed ledger's shares, release, demands, what is committed and what it
/// counts on the other seeds.
async fn describe(setup: &FleetWithSystem) -> String {
    let fleet = &setup.fleet;
    let mut out = String::new();
    if let Ok(pq) = Api::<ProjectQuota>::all(fleet.master().client()).get(NAME).await {
        let status = pq.status.unwrap_or_default();
        let _ = writeln!(
            out,
            "master record: {}\nmaster seeds: {}",
            serde_json::to_string(&status.shares).unwrap_or_default(),
            serde_json::to_string(&status.seeds).unwrap_or_default()
        );
    }
    for seed in ["seed-a", "seed-b"] {
        if let Ok(l) = Api::<QuotaLedger>::all(fleet.seed(seed).client()).get(NAME).await {
            let status = l.status.clone().unwrap_or_default();
            let _ = writeln!(
                out,
                "{seed}: shares {} released {} demands {} localUsage {} otherSeedsUsage {} reservations {} allotments {}",
                serde_json::to_string(&l.spec.shares).unwrap_or_default(),
                serde_json::to_string(&status.released).unwrap_or_default(),
                serde_json::to_string(&status.demands).unwrap_or_default(),
                serde_json::to_string(&status.local_usage).unwrap_or_default(),
                serde_json::to_string(&status.other_seeds_usage).unwrap_or_default(),
                status.reservations.len(),
                serde_json::to_string(&status.allotments).unwrap_or_default(),
            );
        }
    }
    // The components' own account, since their kept logs do not leave a CI machine.
    out.push_str(&setup.system.log_tails(40));
    out
}

/// Denials for share in transit, counted apart from quota denials, over every component.
async fn share_in_transit_denials(system: &e2e::system::System) -> f64 {
    let metrics = system.scrape_all().await.unwrap();
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("kkp_quota_admissions_total{")
                && l.contains("reason=\"share_in_transit\"")
                && l.contains("result=\"denied\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until the master's `ProjectQuota` shows seed-b's figures as `ok` says.
async fn wait_seed_b(fleet: &Fleet, what: &str, ok: impl Fn(&SeedFigures) -> bool) {
    let quotas = Api::<ProjectQuota>::all(fleet.master().client());
    wait_for(WAIT, what, || async {
        let status = quotas.get(NAME).await.ok()?.status?;
        status
            .seeds
            .iter()
            .any(|s| s.name == "seed-b" && ok(s))
            .then_some(())
    })
    .await
    .unwrap();
}

/// Waits until none of `seeds` has a live demand (what denied requests leave behind lapses).
async fn wait_no_demands(fleet: &Fleet, seeds: &[&str]) {
    for &seed in seeds {
        let ledgers = Api::<QuotaLedger>::all(fleet.seed(seed).client());
        wait_for(WAIT, &format!("{seed}'s demand lapsed"), || async {
            let status = ledgers.get(NAME).await.ok()?.status.unwrap_or_default();
            demand(&status, jiff::Timestamp::now()).is_none().then_some(())
        })
        .await
        .unwrap();
    }
}

/// Waits until `seed`'s ledger counts `cpu` for the other seeds (the master's fold reached it).
async fn wait_others_folded(fleet: &Fleet, seed: &str, cpu: i64) {
    wait_others_folded_of(fleet, seed, Resource::Cpu, Quantity::from_units(cpu)).await;
}

/// Waits until `seed`'s ledger counts `amount` of `resource` for the other seeds.
async fn wait_others_folded_of(fleet: &Fleet, seed: &str, resource: Resource, amount: Quantity) {
    let ledgers = Api::<QuotaLedger>::all(fleet.seed(seed).client());
    wait_for(
        WAIT,
        &format!(
            "{seed} counting {} {resource} on the other seeds",
            resource.amount(amount)
        ),
        || async {
            let status = ledgers.get(NAME).await.ok()?.status.unwrap_or_default();
            let others = status.other_seeds_usage.unwrap_or_default().amount(resource);
            (others == amount).then_some(())
        },
    )
    .await
    .unwrap();
}

/// Waits until the master counts the fleet's 3 clusters of `demo`: 2 on seed-a, 1 on seed-b.
async fn wait_fleet_clusters_counted(fleet: &Fleet) {
    e2e::demo::wait_clusters_counted(
        &fleet.master().client(),
        "demo",
        &["seed-a", "seed-b"],
        3,
        &[2, 1],
        WAIT,
    )
    .await
    .unwrap();
}

/// Waits until both seeds have nothing committed.
async fn wait_idle(fleet: &Fleet) {
    for seed in ["seed-a", "seed-b"] {
        let client = fleet.seed(seed).client();
        wait_for(WAIT, &format!("{seed} idle"), || async {
            match seed_figures(&client).await {
                Some((0, _)) => Ok(()),
                Some((committed, share)) => {
                    // What holds it, for the failure message.
                    let status = Api::<QuotaLedger>::all(client.clone())
                        .get(NAME)
                        .await
                        .ok()
                        .and_then(|l| l.status)
                        .unwrap_or_default();
                    Err(format!(
                        "{committed} cpu committed, share {share}; localUsage {}, reservations {}, allotments {}",
                        serde_json::to_string(&status.local_usage).unwrap_or_default(),
                        status
                            .reservations
                            .iter()
                            .map(|r| format!("{}/{} {} at {}", r.cluster, r.uid, r.reserved, r.created_at))
                            .collect::<Vec<_>>()
                            .join(", "),
                        serde_json::to_string(&status.allotments).unwrap_or_default(),
                    ))
                }
                None => Err("no ledger under shares".to_owned()),
            }
        })
        .await
        .unwrap();
    }
}

/// Every Machine of the project deleted, both seeds idle, no demand left, and seed-a's fold
/// of seed-b's usage back at zero: the state each fault scenario starts and heals from.
async fn settle(fleet: &Fleet) {
    delete_all(fleet, &["alpha", "gamma"]).await;
    wait_idle(fleet).await;
    wait_no_demands(fleet, &["seed-a", "seed-b"]).await;
    wait_others_folded(fleet, "seed-a", 0).await;
}

/// [`overrun_watcher_of`] for the quota's `LIMIT` cpu.
fn overrun_watcher(fleet: &Fleet, stop: oneshot::Receiver<()>) -> tokio::task::JoinHandle<usize> {
    overrun_watcher_of(fleet, Resource::Cpu, Quantity::from_units(LIMIT), stop)
}

/// [`e2e::shares::overrun_watcher`] for project `demo`'s ledgers.
fn overrun_watcher_of(
    fleet: &Fleet,
    resource: Resource,
    limit: Quantity,
    stop: oneshot::Receiver<()>,
) -> tokio::task::JoinHandle<usize> {
    e2e::shares::overrun_watcher(fleet, NAME, resource, limit, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bursts_across_seeds_never_overrun() {
    // Project `other` with a cluster on each seed, for the group over two projects.
    let mut setup = setup_of(group_pair::with_other(shares_fleet())).await;
    let fleet = &setup.fleet;
    let (stop, stopped) = oneshot::channel();
    let watching = overrun_watcher(fleet, stopped);

    // Burst across seeds: 60 creates over alpha, beta (seed-a) and gamma (seed-b), headroom 10:
    // exactly the headroom is admitted, every round (the watcher checks that no version of any
    // ledger or of the master's view is ever over).
    let spread: Vec<&str> = (0..60).map(|i| ["alpha", "beta", "gamma"][i % 3]).collect();
    for round in 0..20 {
        let admitted = burst(fleet, &spread, &format!("r{round}")).await;
        eprintln!("round {round}: {admitted} of {LIMIT} admitted");
        assert_eq!(
            admitted,
            LIMIT_MACHINES,
            "round {round}\n{}",
            describe(&setup).await
        );
        delete_all(fleet, &["alpha", "beta", "gamma"]).await;
        wait_idle(fleet).await;
        // The next round starts once each seed no longer counts the other's deleted Machines.
        wait_others_folded(fleet, "seed-a", 0).await;
        wait_others_folded(fleet, "seed-b", 0).await;
    }

    // Skewed demand: seed-b holds the whole headroom, idle (its Machines just deleted, long
    // before its quiet period); a burst on seed-a alone still gets all of it, because the master
    // asks seed-b for it back at once. (What the rounds' denials left behind lapses first.)
    wait_no_demands(fleet, &["seed-a", "seed-b"]).await;
    let on_b = burst(fleet, &["gamma"; 10], "hold").await;
    assert_eq!(
        on_b,
        LIMIT_MACHINES,
        "seed-b takes it all\n{}",
        describe(&setup).await
    );
    delete_all(fleet, &["gamma"]).await;
    wait_idle(fleet).await;
    let (_, held_b) = seed_figures(&fleet.seed("seed-b").client()).await.unwrap();
    assert_eq!(held_b, LIMIT, "seed-b holds the whole quota, idle");
    // seed-a judges requests beside the other seeds' usage as the master last folded it: until
    // seed-b's deletions are folded back, every request there is over the quota for good
    // (docs/shares.md, rule 4), and none asks for share.
    wait_others_folded(fleet, "seed-a", 0).await;
    let began = jiff::Timestamp::now();
    let skewed = burst(fleet, &["alpha"; 30], "skewed").await;
    eprintln!(
        "skewed: seed-a admitted {skewed} of {LIMIT} that seed-b held idle (burst {began} to {})",
        jiff::Timestamp::now()
    );
    assert_eq!(skewed, LIMIT_MACHINES, "{}", describe(&setup).await);
    delete_all(fleet, &["alpha"]).await;
    wait_idle(fleet).await;

    let _ = stop.send(());
    let checked = watching.await.unwrap();
    assert!(checked > 20, "only {checked} versions checked");

    clusters::cluster_creates_admit_exactly_the_room(&setup).await;
    group::a_shared_group_caps_the_project_across_seeds(&setup).await;
    group_pair::a_group_over_two_projects_admits_its_room_across_seeds(&mut setup).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeds_keep_within_their_shares_while_the_master_is_down() {
    let mut setup = setup().await;
    let (stop, stopped) = oneshot::channel();
    let watching = overrun_watcher(&setup.fleet, stopped);

    // Both seeds get share.
    let b0 = burst(&setup.fleet, &["gamma"; 4], "b0").await;
    let a0 = burst(&setup.fleet, &["alpha"; 6], "a0").await;
    eprintln!(
        "seed-b admitted {b0} of 4, then seed-a {a0} of 6\n{}",
        describe(&setup).await
    );
    assert_eq!((b0, a0), (4, 6), "both seeds get what they ask for");
    delete_all(&setup.fleet, &["alpha", "gamma"]).await;
    wait_idle(&setup.fleet).await;

    // Master killed mid-burst: the seeds keep admitting within their shares, no more.
    let master_name = master_controller(&mut setup).name.clone();
    let spread: Vec<&str> = (0..30).map(|i| ["alpha", "gamma"][i % 2]).collect();
    // Killed as soon as the burst is under way: a seed has asked for share or committed some.
    let under_way = {
        let seeds = [
            setup.fleet.seed("seed-a").client(),
            setup.fleet.seed("seed-b").client(),
        ];
        async move {
            wait_for(WAIT, "the burst under way", || async {
                for client in &seeds {
                    let ledger = Api::<QuotaLedger>::all(client.clone()).get(NAME).await.ok()?;
                    let status = ledger.status.clone().unwrap_or_default();
                    if !status.demands.is_empty() || !status.reservations.is_empty() {
                        return Some(());
                    }
                }
                None
            })
            .await
            .unwrap();
        }
    };
    let killing = async {
        under_way.await;
        setup.system.component_mut(&master_name).unwrap().kill();
    };
    let (admitted, ()) = tokio::join!(burst(&setup.fleet, &spread, "m"), killing);
    assert!(admitted <= usize::try_from(LIMIT).unwrap(), "{admitted} admitted");
    // With the master down, each seed still admits within its own share.
    delete_all(&setup.fleet, &["alpha", "gamma"]).await;
    wait_idle(&setup.fleet).await;
    let (_, share_b) = seed_figures(&setup.fleet.seed("seed-b").client()).await.unwrap();
    let admitted_b = burst(&setup.fleet, &["gamma"; 12], "down").await;
    eprintln!("master down: seed-b admitted {admitted_b} with a share of {share_b}");
    assert_eq!(
        admitted_b,
        usize::try_from(share_b).unwrap(),
        "seed-b, idle, admits exactly its share\n{}",
        describe(&setup).await
    );
    delete_all(&setup.fleet, &["gamma"]).await;
    wait_idle(&setup.fleet).await;
    // After the restart, rebalancing resumes: seed-a alone gets the whole quota. The new
    // process leads once the killed one's lease has expired (15 s), and is ready once its
    // caches are synced.
    restart_master(&mut setup, &master_name).await;
    // Seed-b's burst left a demand (so that a retry there would find share): while it lives,
    // seed-b's idle share is its own. Once it lapses, seed-a can have everything.
    wait_no_demands(&setup.fleet, &["seed-a", "seed-b"]).await;
    // Ready means caches synced, not folded: until the new leader's first round, seed-a still
    // counts seed-b's usage as the killed master last wrote it, and denies against that for good.
    wait_others_folded(&setup.fleet, "seed-a", 0).await;
    let on_a = ["alpha"; 20];
    let admitted_a = burst(&setup.fleet, &on_a, "after").await;
    eprintln!(
        "after the master's restart seed-a admitted {admitted_a} of {LIMIT}\n{}",
        describe(&setup).await
    );
    assert_eq!(admitted_a, LIMIT_MACHINES, "rebalancing resumed");
    delete_all(&setup.fleet, &["alpha"]).await;
    wait_idle(&setup.fleet).await;

    let _ = stop.send(());
    watching.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_seed_keeps_its_share_and_gets_it_back() {
    let setup = setup().await;
    let fleet = &setup.fleet;
    let (stop, stopped) = oneshot::channel();
    let watching = overrun_watcher(fleet, stopped);

    // Seed-b takes share (more than it uses: a seed that asks gets half of what stays free).
    let on_b = burst(fleet, &["gamma"; 4], "b").await;
    assert_eq!(on_b, 4);
    let (committed_b, share_b) = wait_for(WAIT, "seed-b's 4 Machines counted", || async {
        match seed_figures(&fleet.seed("seed-b").client()).await {
            Some((4, share)) => Some((4, share)),
            _ => None,
        }
    })
    .await
    .unwrap();
    eprintln!("seed-b holds {share_b} and uses {committed_b}");

    // Seed-b's API server freezes (SIGSTOP): it accepts connections and answers nothing, as
    // behind a partition that drops packets, so the master's watch neither ends nor fails. The
    // master's probe finds it: its share is stuck, and the master says so.
    fleet.seed("seed-b").pause_apiserver().unwrap();
    wait_seed_b(fleet, "frozen seed-b's share shown stuck", |s| s.stuck).await;

    // Seed-a never admits into seed-b's share: exactly the rest of the quota. What fits the
    // quota as last folded but not seed-a's share waits, and is denied as share in transit,
    // counted apart from quota denials.
    let transit_before = share_in_transit_denials(&setup.system).await;
    let on_a = burst(fleet, &["alpha"; 20], "a").await;
    let transit = share_in_transit_denials(&setup.system).await - transit_before;
    assert!(transit >= 1.0, "no share_in_transit denials counted");
    eprintln!("seed-b frozen: seed-a admitted {on_a} (quota {LIMIT}, seed-b's share {share_b})");
    assert_eq!(
        on_a,
        usize::try_from(LIMIT - share_b).unwrap(),
        "{}",
        describe(&setup).await
    );

    // Seed-b back: no longer stuck, and its share is usable again: it admits exactly what it
    // held idle, and the project then uses its whole quota. (Seed-a's denied requests left a
    // demand: while it lives, seed-b's idle share would rightly move to seed-a.)
    wait_no_demands(fleet, &["seed-a"]).await;
    fleet.seed("seed-b").resume_apiserver().unwrap();
    wait_seed_b(fleet, "seed-b's share no longer stuck", |s| {
        !s.stuck && s.share.is_some()
    })
    .await;
    let again = burst(fleet, &["gamma"; 10], "back").await;
    eprintln!("seed-b back: admitted {again} more");
    assert_eq!(
        again,
        usize::try_from(share_b - committed_b).unwrap(),
        "{}",
        describe(&setup).await
    );

    // The API server killed instead ("connection refused", found by the watch itself): stuck
    // while it is down, its own again once it is back.
    fleet.seed("seed-b").stop_apiserver().await;
    wait_seed_b(fleet, "stopped seed-b's share shown stuck", |s| s.stuck).await;
    // The users of gamma (on seed-b) are told that what their view shows is stale.
    let stale_after = view::stale_while_its_seed_is_down(fleet).await;
    eprintln!("gamma's quota view stale {stale_after:?} after seed-b's share was shown stuck");
    assert_eq!(burst(fleet, &["alpha"; 2], "a-full").await, 0);
    fleet.seed("seed-b").start_apiserver().await.unwrap();
    view::current_again(fleet).await;
    wait_seed_b(fleet, "restarted seed-b's share no longer stuck", |s| {
        !s.stuck && s.share.is_some()
    })
    .await;
    delete_all(fleet, &["alpha", "gamma"]).await;
    wait_idle(fleet).await;
    view::the_users_view_follows_the_project(fleet).await;

    let _ = stop.send(());
    watching.await.unwrap();
}

/// Usage above a share with no admission behind it (issue #32, finding 4): a limit added to a
/// resource already in use. Seed-a runs 6 Machines (1 GiB each) while memory is unlimited; then
/// the quota limits memory to 8 GiB. Seed-a holds no memory share (it never admitted any under
/// a limit), yet its 6 GiB fill the quota all the same: a burst on seed-b gets exactly the 2 GiB
/// left, never the whole 8 GiB as free share. Once seed-a's Machines are gone, seed-b gets the
/// rest. (A catalog edit that makes running Machines bigger, or a cluster moved between seeds,
/// leaves the same state: usage above a share.) The same quota limits `clusters` to the 3 the
/// project runs (issue #38): counted per seed, the count full, and still no Machine is refused
/// for it, since a Machine asks for no cluster.
async fn a_limit_added_to_a_resource_in_use_counts_that_use(setup: &FleetWithSystem) {
    let fleet = &setup.fleet;
    let gib = |n: i64| Quantity::from_gibibytes(n);
    assert_eq!(burst(fleet, &["alpha"; 6], "before").await, 6);
    wait_others_folded_of(fleet, "seed-b", Resource::Memory, gib(6)).await;

    // The limit added (and cpu raised far out of the way, so that memory decides); KKP's quota
    // has no field for clusters, so their limit is set in the `ProjectQuota`.
    let limits: kkp_quota_crds::ResourceDetails =
        serde_json::from_value(serde_json::json!({ "cpu": "100", "memory": "8Gi" })).unwrap();
    let quota = e2e::demo::project_quota("demo", &limits);
    e2e::demo::apply_quota(fleet, &quota, "shares-test")
        .await
        .unwrap();
    let quotas = Api::<ProjectQuota>::all(fleet.master().client());
    let clusters_limit = |limit: Option<&str>| serde_json::json!({"spec": {"quota": {"clusters": limit}}});
    quotas
        .patch(
            NAME,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&clusters_limit(Some("3"))),
        )
        .await
        .unwrap();
    for seed in ["seed-a", "seed-b"] {
        let ledgers = Api::<QuotaLedger>::all(fleet.seed(seed).client());
        wait_for(
            WAIT,
            &format!("{seed}'s ledger limiting memory and clusters"),
            || async {
                let quota = ledgers.get(NAME).await.ok()?.spec.quota;
                (quota.get(Resource::Memory).is_some() && quota.get(Resource::Clusters).is_some())
                    .then_some(())
            },
        )
        .await
        .unwrap();
    }
    wait_fleet_clusters_counted(fleet).await;
    wait_for(WAIT, "the clusters limit in force", || async {
        let limits = quotas.get(NAME).await.ok()?.status?.limits?;
        (limits.get(Resource::Clusters) == Some(Quantity::from_units(3))).then_some(())
    })
    .await
    .unwrap();
    let (stop, stopped) = oneshot::channel();
    let watching = overrun_watcher_of(fleet, Resource::Memory, gib(8), stopped);

    let on_b = burst(fleet, &["gamma"; 10], "after").await;
    eprintln!("memory limited to 8 GiB beside 6 GiB in use: seed-b admitted {on_b}");
    assert_eq!(on_b, 2, "{}", describe(setup).await);

    // Healed: seed-a's Machines go, and seed-b can have the rest of the quota.
    delete_all(fleet, &["alpha"]).await;
    wait_others_folded_of(fleet, "seed-b", Resource::Memory, gib(0)).await;
    wait_no_demands(fleet, &["seed-b"]).await;
    let more = burst(fleet, &["gamma"; 10], "healed").await;
    eprintln!("seed-a's Machines gone: seed-b admitted {more} more");
    assert_eq!(more, 6, "{}", describe(setup).await);

    let _ = stop.send(());
    let checked = watching.await.unwrap();
    assert!(checked > 5, "only {checked} versions checked");
    quotas
        .patch(
            NAME,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&clusters_limit(None)),
        )
        .await
        .unwrap();
}

/// The master's record lost mid-burst (issue #32, finding 1): the `ProjectQuota` deleted (the
/// master re-creates it, with no record), as a restore without status or a re-installed CRD
/// would leave it. The record is rebuilt from what the seeds' ledgers hold, at a version past
/// theirs, so the seeds take the master's word again: a lowered limit reaches the ledgers (it
/// never did: the API server refused every apply carrying an older share version), no seed is
/// granted share it already holds, and the quota is whole again afterwards.
async fn a_lost_share_record_is_rebuilt_from_the_seeds(setup: &FleetWithSystem) {
    let fleet = &setup.fleet;
    let (stop, stopped) = oneshot::channel();
    let watching = overrun_watcher(fleet, stopped);
    let quotas = Api::<ProjectQuota>::all(fleet.master().client());
    let old_uid = quotas.get(NAME).await.unwrap().metadata.uid;

    // Deleted as soon as a burst over both seeds is under way.
    let spread: Vec<&str> = (0..30).map(|i| ["alpha", "gamma"][i % 2]).collect();
    let deleting = async {
        wait_for(WAIT, "the burst under way", || async {
            let mut committed = 0;
            for seed in ["seed-a", "seed-b"] {
                committed += seed_figures(&fleet.seed(seed).client()).await.map_or(0, |f| f.0);
            }
            (committed > 0).then_some(())
        })
        .await
        .unwrap();
        quotas.delete(NAME, &DeleteParams::default()).await.unwrap();
    };
    let (admitted, ()) = tokio::join!(burst(fleet, &spread, "m"), deleting);
    eprintln!("record lost mid-burst: {admitted} of {LIMIT} admitted");
    assert!(admitted <= LIMIT_MACHINES, "{admitted} admitted");

    // The re-created ProjectQuota gets a record again, at a version past every ledger's.
    let newest_held = || async {
        let mut newest = 0;
        for seed in ["seed-a", "seed-b"] {
            let ledger = Api::<QuotaLedger>::all(fleet.seed(seed).client())
                .get(NAME)
                .await
                .ok()?;
            newest = newest.max(ledger.spec.shares.map_or(0, |s| s.version));
        }
        Some(newest)
    };
    let rebuilt = wait_for(WAIT, "the record rebuilt past the ledgers' versions", || async {
        let pq = quotas.get(NAME).await.ok()?;
        let record = pq.status?.shares?;
        (pq.metadata.uid != old_uid && record.version >= newest_held().await?).then_some(())
    })
    .await;
    if let Err(e) = rebuilt {
        panic!("{e}\n{}", describe(setup).await);
    }

    // A lowered limit reaches both ledgers.
    let lowered = e2e::demo::cpu_quota("demo", "6");
    e2e::demo::apply_quota(fleet, &lowered, "shares-test")
        .await
        .unwrap();
    for seed in ["seed-a", "seed-b"] {
        let ledgers = Api::<QuotaLedger>::all(fleet.seed(seed).client());
        let reached = wait_for(WAIT, &format!("{seed}'s ledger at the lowered limit"), || async {
            let ledger = ledgers.get(NAME).await.ok()?;
            (ledger.spec.quota.amount(Resource::Cpu) == Quantity::from_units(6)).then_some(())
        })
        .await;
        if let Err(e) = reached {
            panic!("{e}\n{}", describe(setup).await);
        }
    }

    // Healed: with everything deleted, one seed gets exactly the whole (lowered) quota.
    settle(fleet).await;
    let on_a = burst(fleet, &["alpha"; 12], "after").await;
    eprintln!("after the rebuild seed-a admitted {on_a} of 6");
    assert_eq!(on_a, 6, "{}", describe(setup).await);
    delete_all(fleet, &["alpha"]).await;
    wait_idle(fleet).await;
    wait_no_demands(fleet, &["seed-a", "seed-b"]).await;
    wait_others_folded(fleet, "seed-b", 0).await;

    let _ = stop.send(());
    watching.await.unwrap();
}

/// The admin size catalog edited so that running Machines count bigger (issue #32, finding 4):
/// usage above seed-a's share, without any admission. It fills the quota all the same: a burst
/// on seed-b gets exactly the room left beside it, and the rest once those Machines are gone.
async fn a_catalog_edit_that_grows_running_machines_is_counted(setup: &FleetWithSystem) {
    let fleet = &setup.fleet;
    restore_limit(fleet).await;
    settle(fleet).await;
    let (stop, stopped) = oneshot::channel();
    let watching = overrun_watcher(fleet, stopped);
    let machines = e2e::machines::api(fleet, "alpha");
    for name in ["t3-0", "t3-1"] {
        machines
            .create(
                &kube::api::PostParams::default(),
                &e2e::machines::aws(name, "t3.medium"),
            )
            .await
            .unwrap();
    }
    wait_others_folded(fleet, "seed-b", 4).await;

    // The admin says a t3.medium has 4 cpu here: the two count 8 from now on.
    let catalog = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "kkp-quota-size-catalog", "namespace": KUBERMATIC_NAMESPACE},
        "data": {"catalog.yaml": "providers:\n  aws:\n    t3.medium: {cpu: 4}\n"},
    });
    let config_maps = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(
        fleet.seed("seed-a").client(),
        KUBERMATIC_NAMESPACE,
    );
    config_maps
        .create(
            &kube::api::PostParams::default(),
            &serde_json::from_value(catalog).unwrap(),
        )
        .await
        .unwrap();
    wait_others_folded(fleet, "seed-b", 8).await;
    let on_b = burst(fleet, &["gamma"; 10], "grown").await;
    eprintln!("catalog edit: seed-a's two Machines count 8 cpu, seed-b admitted {on_b}");
    assert_eq!(on_b, 2, "{}", describe(setup).await);

    // Healed: seed-a's Machines go, and seed-b gets the rest.
    delete_all(fleet, &["alpha"]).await;
    wait_others_folded(fleet, "seed-b", 0).await;
    wait_no_demands(fleet, &["seed-b"]).await;
    fill(setup, "gamma", 2, LIMIT_MACHINES, "after-catalog").await;
    config_maps
        .delete("kkp-quota-size-catalog", &DeleteParams::default())
        .await
        .unwrap();
    delete_all(fleet, &["gamma"]).await;
    wait_idle(fleet).await;
    let _ = stop.send(());
    watching.await.unwrap();
}

/// The quota back at `LIMIT` cpu alone (a scenario before may have lowered it or limited
/// memory), in force on both seeds.
async fn restore_limit(fleet: &Fleet) {
    e2e::demo::apply_quota(
        fleet,
        &e2e::demo::cpu_quota("demo", &LIMIT.to_string()),
        "shares-test",
    )
    .await
    .unwrap();
    for seed in ["seed-a", "seed-b"] {
        let ledgers = Api::<QuotaLedger>::all(fleet.seed(seed).client());
        wait_for(WAIT, &format!("{seed}'s ledger at {LIMIT} cpu alone"), || async {
            let quota = ledgers.get(NAME).await.ok()?.spec.quota;
            (quota.amount(Resource::Cpu) == Quantity::from_units(LIMIT)
                && quota.get(Resource::Memory).is_none())
            .then_some(())
        })
        .await
        .unwrap();
    }
}

/// What a watch saw change: the Machines of a user cluster, or a seed's ledger.
enum Change {
    Machine {
        cluster: usize,
        name: String,
        exists: bool,
    },
    MachinesListed {
        cluster: usize,
    },
    Ledger {
        seed: usize,
        committed: Option<i64>,
    },
}

/// Follows every change of the Machines in `alpha` and `gamma` and of both seeds' ledgers until
/// `stop`: the most Machines that existed together at any moment, and the most the ledgers
/// committed together above `LIMIT` with the share state then (for the message). Driven by the
/// watches' events, so no change between two looks is missed.
async fn follow_machines_and_ledgers(
    setup: &FleetWithSystem,
    stop: oneshot::Receiver<()>,
) -> (usize, i64, String) {
    use futures::StreamExt as _;
    use kube::runtime::{WatchStreamExt as _, watcher};
    let fleet = &setup.fleet;
    let mut changes = Vec::new();
    for (cluster, user) in ["alpha", "gamma"].into_iter().enumerate() {
        let machines = e2e::machines::api(fleet, user);
        changes.push(
            watcher::watcher(machines, watcher::Config::default())
                .default_backoff()
                .filter_map(move |event| async move {
                    let name =
                        |m: &kkp_quota_crds::machine::Machine| m.metadata.name.clone().unwrap_or_default();
                    match event.ok()? {
                        watcher::Event::Init => Some(Change::MachinesListed { cluster }),
                        watcher::Event::Apply(m) | watcher::Event::InitApply(m) => Some(Change::Machine {
                            cluster,
                            name: name(&m),
                            exists: true,
                        }),
                        watcher::Event::Delete(m) => Some(Change::Machine {
                            cluster,
                            name: name(&m),
                            exists: false,
                        }),
                        watcher::Event::InitDone => None,
                    }
                })
                .boxed(),
        );
    }
    for (seed, name) in ["seed-a", "seed-b"].into_iter().enumerate() {
        let ledgers = Api::<QuotaLedger>::all(fleet.seed(name).client());
        let ours = watcher::Config::default().fields(&format!("metadata.name={NAME}"));
        changes.push(
            watcher::watcher(ledgers, ours)
                .default_backoff()
                .filter_map(move |event| async move {
                    match event.ok()? {
                        watcher::Event::Apply(l) | watcher::Event::InitApply(l) => Some(Change::Ledger {
                            seed,
                            committed: figures(&l).map(|f| f.0),
                        }),
                        watcher::Event::Delete(_) => Some(Change::Ledger {
                            seed,
                            committed: None,
                        }),
                        watcher::Event::Init | watcher::Event::InitDone => None,
                    }
                })
                .boxed(),
        );
    }
    let mut changes = futures::stream::select_all(changes);
    let mut existing: [std::collections::BTreeSet<String>; 2] = Default::default();
    let mut committed: [Option<i64>; 2] = [None, None];
    let mut most = (0, 0, String::new());
    tokio::pin!(stop);
    loop {
        let change = tokio::select! {
            change = changes.next() => change,
            _ = &mut stop => return most,
        };
        match change {
            Some(Change::MachinesListed { cluster }) => existing[cluster].clear(),
            Some(Change::Machine {
                cluster,
                name,
                exists,
            }) => {
                if exists {
                    existing[cluster].insert(name);
                } else {
                    existing[cluster].remove(&name);
                }
                most.0 = most
                    .0
                    .max(existing.iter().map(std::collections::BTreeSet::len).sum());
            }
            Some(Change::Ledger { seed, committed: c }) => {
                committed[seed] = c;
                let together = committed.iter().flatten().sum::<i64>();
                if together > LIMIT && together > most.1 {
                    most = (most.0, together, describe(setup).await);
                }
            }
            None => return most,
        }
    }
}

/// A seed's ledger deleted mid-burst (issue #32, finding 2), the worst way: by hand, and its
/// finalizer stripped too (what a re-installed CRD or a forced delete does). Until the master has
/// re-created it and seed-controller has counted what runs, the webhook on that seed refuses
/// growth (`ledger_missing`) instead of admitting against nothing; never over the limit, and the
/// whole quota is usable again afterwards.
///
/// The new ledger's first count carries the deleted one's reservations and allotments
/// (`seed-controller/src/succession.rs`): Machines admitted just before the deletion may reach
/// the API server only after that count. Before it did, 2 of 7 runs saw 12 and 14 Machines.
///
/// Across the re-creation the ledgers' committed figures are not the measure: the webhook that
/// admitted Machines from its allotment on the deleted ledger records them as reservations on the
/// new one (it cannot tell whether the new ledger's first count saw them), so for a moment they
/// count twice there. What exists is checked instead: the Machines in the user clusters, sampled
/// all along by watches (a moment where the ledgers add up above the limit is printed); the
/// committed watcher runs again for the heal.
async fn a_deleted_ledger_fails_closed_and_heals(setup: &FleetWithSystem) {
    let fleet = &setup.fleet;
    restore_limit(fleet).await;
    let ledgers = Api::<QuotaLedger>::all(fleet.seed("seed-a").client());
    let old_uid = ledgers.get(NAME).await.unwrap().metadata.uid;
    let spread: Vec<&str> = (0..30).map(|i| ["alpha", "gamma"][i % 2]).collect();
    let deleting = async {
        wait_for(WAIT, "the burst under way", || async {
            let committed = seed_figures(&fleet.seed("seed-a").client())
                .await
                .map_or(0, |f| f.0);
            (committed > 0).then_some(())
        })
        .await
        .unwrap();
        ledgers.delete(NAME, &DeleteParams::default()).await.unwrap();
        let unprotect = serde_json::json!({"metadata": {"finalizers": null}});
        ledgers
            .patch(
                NAME,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&unprotect),
            )
            .await
            .unwrap();
    };
    let (stop, stopped) = oneshot::channel();
    let following = follow_machines_and_ledgers(setup, stopped);
    let burst_and_stop = async {
        let result = tokio::join!(
            e2e::shares::burst_counting(fleet, "demo", &spread, "del"),
            deleting
        );
        let _ = stop.send(());
        result
    };
    let ((admitted, ()), (most_machines, most_committed, state)) = tokio::join!(burst_and_stop, following);
    eprintln!(
        "ledger deleted mid-burst: {} admitted, {} refused for the missing ledger; at most {most_machines} Machines existed",
        admitted.0, admitted.1
    );
    if most_committed > LIMIT {
        eprintln!("the ledgers committed {most_committed} together at one moment:\n{state}");
    }
    assert!(admitted.0 <= LIMIT_MACHINES, "{admitted:?}");
    assert!(
        most_machines <= LIMIT_MACHINES,
        "{most_machines} Machines existed"
    );
    // Re-created by the master and counted by seed-controller.
    let recreated = wait_for(WAIT, "seed-a's ledger re-created and counted", || async {
        let ledger = ledgers.get(NAME).await.ok()?;
        (ledger.metadata.uid != old_uid && ledger.status?.local_usage.is_some()).then_some(())
    })
    .await;
    if let Err(e) = recreated {
        panic!("{e}\n{}", describe(setup).await);
    }

    // Healed: with everything deleted, one seed gets exactly the whole quota.
    settle(fleet).await;
    let (stop, stopped) = oneshot::channel();
    let watching = overrun_watcher(fleet, stopped);
    fill(setup, "alpha", 0, LIMIT_MACHINES, "after-delete").await;
    delete_all(fleet, &["alpha"]).await;
    wait_idle(fleet).await;
    wait_no_demands(fleet, &["seed-a", "seed-b"]).await;
    wait_others_folded(fleet, "seed-b", 0).await;
    let _ = stop.send(());
    watching.await.unwrap();
}

/// Creates one-cpu Machines in `user`, a burst at a time, until `total` are admitted there
/// (each burst's denials leave a demand the master answers); panics if that takes longer than
/// [`WAIT`], or if more than `total` are ever admitted.
async fn fill(setup: &FleetWithSystem, user: &str, mut admitted: usize, total: usize, prefix: &str) {
    for round in 0.. {
        if admitted >= total {
            break;
        }
        let got = burst(
            &setup.fleet,
            &vec![user; total - admitted + 2],
            &format!("{prefix}-{round}"),
        )
        .await;
        admitted += got;
        assert!(
            admitted <= total,
            "{admitted} admitted, more than {total}\n{}",
            describe(setup).await
        );
        assert!(
            round < 20,
            "only {admitted} of {total} admitted\n{}",
            describe(setup).await
        );
    }
}

/// A seed's etcd restored from a snapshot (issue #32, finding 6), the harsh way: a copy of its
/// data taken while seed-a held share, restored after seed-a had released it and seed-b had
/// filled the quota with it, without `--bump-revision` (resourceVersions go back). The restored
/// ledger holds the old share again; the master's released floor in its spec, re-applied once the
/// master's watch lists the restored seed again (every watch of the system lists again when the
/// API server's data went back in time), takes it away; seed-a then admits nothing, and the
/// whole quota is usable again once seed-b's Machines go.
async fn a_restored_seed_does_not_regain_released_share(setup: &FleetWithSystem) {
    let fleet = &setup.fleet;
    restore_limit(fleet).await;
    settle(fleet).await;
    let (stop, stopped) = oneshot::channel();
    let watching = overrun_watcher(fleet, stopped);
    let seed_a = fleet.seed("seed-a");
    fill(setup, "alpha", 0, LIMIT_MACHINES, "before-snapshot").await;
    delete_all(fleet, &["alpha"]).await;
    let held = wait_for(WAIT, "seed-a idle, holding share", || async {
        match seed_figures(&seed_a.client()).await {
            Some((0, share)) if share > 0 => Some(share),
            _ => None,
        }
    })
    .await
    .unwrap();
    let snapshot = seed_a.snapshot_etcd().unwrap();

    // seed-a releases, seed-b fills the quota.
    fill(setup, "gamma", 0, LIMIT_MACHINES, "after-snapshot").await;
    let _ = stop.send(());
    watching.await.unwrap();
    seed_a.restore_etcd(&snapshot).await.unwrap();
    // At once: the restored ledger says seed-a holds the share it had at the snapshot, with an
    // older word of the master than seed-a's webhook saw before: refused until the master has
    // rewritten it (reason `ledger_missing`, the message says the seed was restored).
    let (at_once, refused) = e2e::shares::burst_counting(fleet, "demo", &["alpha"; 3], "restored").await;
    wait_for(WAIT, "the restored seed-a back to no share", || async {
        match seed_figures(&seed_a.client()).await {
            Some((_, 0)) => Ok(()),
            other => Err(format!("seed-a: {other:?}")),
        }
    })
    .await
    .unwrap();
    wait_others_folded(fleet, "seed-a", LIMIT).await;
    let later = burst(fleet, &["alpha"; 3], "restored-later").await;
    eprintln!(
        "etcd restore: seed-a held {held} cpu at the snapshot; restored, it admitted {at_once} at once ({refused} refused as restored) and {later} later"
    );
    assert_eq!((at_once, later), (0, 0), "{}", describe(setup).await);

    // Healed: seed-b's Machines go, and seed-a gets the whole quota.
    let (stop, stopped) = oneshot::channel();
    let watching = overrun_watcher(fleet, stopped);
    delete_all(fleet, &["gamma"]).await;
    wait_others_folded(fleet, "seed-a", 0).await;
    wait_no_demands(fleet, &["seed-a", "seed-b"]).await;
    fill(setup, "alpha", 0, LIMIT_MACHINES, "after-restore").await;
    delete_all(fleet, &["alpha"]).await;
    wait_idle(fleet).await;
    let _ = stop.send(());
    watching.await.unwrap();
}

/// A seed drained before it leaves (`--draining-seeds=seed-b`, the chart's
/// `masterController.drainingSeeds`), while it is still a `Seed`: with 3 Machines on seed-b, it
/// gets no more share (gamma is refused) and hands back what it does not use, so alpha reaches
/// the rest of the quota; once gamma's Machines are gone, every record forgets seed-b and alpha
/// reaches the whole quota: nothing stuck, nothing to declare gone. Taken off the list, seed-b
/// is an ordinary seed again and gamma gets Machines.
async fn a_drained_seed_hands_its_share_back(setup: &mut FleetWithSystem) {
    restore_limit(&setup.fleet).await;
    settle(&setup.fleet).await;
    let (stop, stopped) = oneshot::channel();
    let watching = overrun_watcher(&setup.fleet, stopped);
    assert_eq!(burst(&setup.fleet, &["gamma"; 3], "drain-b").await, 3);
    master_controller(setup)
        .restart_with("--draining-seeds=seed-b")
        .unwrap();
    let fleet = &setup.fleet;
    let quotas = Api::<ProjectQuota>::all(fleet.master().client());
    wait_seed_b(fleet, "draining seed-b holding only what it uses", |s| {
        s.share
            .as_ref()
            .is_some_and(|share| share.amount(Resource::Cpu) <= Quantity::from_units(3))
    })
    .await;
    let refused_on_b = burst(fleet, &["gamma"; 2], "drain-b-more").await;
    wait_others_folded(fleet, "seed-a", 3).await;
    fill(setup, "alpha", 0, LIMIT_MACHINES - 3, "drain-a").await;
    let over = burst(&setup.fleet, &["alpha"; 2], "drain-a-more").await;
    assert_eq!((refused_on_b, over), (0, 0), "{}", describe(setup).await);

    // Its clusters emptied: forgotten while still listed, and seed-a gets the whole quota.
    let fleet = &setup.fleet;
    delete_all(fleet, &["gamma"]).await;
    let started = std::time::Instant::now();
    wait_for(WAIT, "drained seed-b forgotten by the record", || async {
        let record = quotas.get(NAME).await.ok()?.status?.shares?;
        record.seeds.iter().all(|s| s.name != "seed-b").then_some(())
    })
    .await
    .unwrap();
    let forgotten_after = started.elapsed();
    wait_others_folded(fleet, "seed-a", 0).await;
    fill(setup, "alpha", LIMIT_MACHINES - 3, LIMIT_MACHINES, "drained").await;
    eprintln!("draining: seed-b forgotten {forgotten_after:?} after its Machines were deleted");
    let _ = stop.send(());
    watching.await.unwrap();

    // Off the list: an ordinary seed again.
    master_controller(setup)
        .restart_without("--draining-seeds")
        .unwrap();
    // The restarted master leads once the old lease lapses, then records seed-b again.
    wait_for(WAIT, "seed-b in the record again", || async {
        let record = quotas.get(NAME).await.ok()?.status?.shares?;
        record.seeds.iter().any(|s| s.name == "seed-b").then_some(())
    })
    .await
    .unwrap();
    settle(&setup.fleet).await;
    // seed-a first gives back the share it holds idle: gamma's first creates may be refused.
    let mut undrained = 0;
    for round in 0..20 {
        if undrained >= 2 {
            break;
        }
        undrained += burst(&setup.fleet, &["gamma"], &format!("undrained-{round}")).await;
    }
    assert_eq!(undrained, 2, "{}", describe(setup).await);
    settle(&setup.fleet).await;
}

/// The fleet's master-controller component.
/// Starts the killed master-controller `name` again and waits until it leads (once the killed
/// process's lease has expired) and is ready (its caches synced).
async fn restart_master(setup: &mut FleetWithSystem, name: &str) {
    let master = setup.system.component_mut(name).unwrap();
    master.restart().unwrap();
    let master = &*master;
    wait_for(WAIT, "the restarted master leading and ready", || async {
        let leads = master
            .scrape()
            .await
            .is_ok_and(|m| sample(&m, "kkp_quota_master_leader") == Some(1.0));
        leads && master.is_ready().await
    })
    .await
    .unwrap();
}

fn master_controller(setup: &mut FleetWithSystem) -> &mut e2e::system::Component {
    let name = setup
        .system
        .of_kind("master-controller")
        .next()
        .unwrap()
        .name
        .clone();
    setup.system.component_mut(&name).unwrap()
}

/// A seed gone for good (issue #32, finding 3). Removed from the fleet, seed-b keeps the share
/// it held, counted (its Machines may still exist) and shown as stuck: seed-a gets only the
/// rest. Declared gone (`--gone-seeds=seed-b`, the chart's `masterController.goneSeeds`), the
/// record forgets it and seed-a gets the whole quota. seed-b's API server and Machines stay up
/// in this fleet; the admin's declaration is what says they are gone. Last on its fleet.
async fn a_seed_declared_gone_returns_its_share(setup: &mut FleetWithSystem) {
    let fleet = &setup.fleet;
    restore_limit(fleet).await;
    settle(fleet).await;
    // The shares held under the 100 cpu of the scenario before come back within the limit.
    let quotas = Api::<ProjectQuota>::all(fleet.master().client());
    wait_for(WAIT, "the seeds' shares back within the limit", || async {
        let status = quotas.get(NAME).await.ok()?.status?;
        let held = status
            .seeds
            .iter()
            .filter_map(|s| s.share.as_ref())
            .try_fold(Quantity::ZERO, |sum, share| {
                sum.checked_add(share.amount(Resource::Cpu)).ok()
            })?;
        (held <= Quantity::from_units(LIMIT)).then_some(())
    })
    .await
    .unwrap();
    let (stop, stopped) = oneshot::channel();
    let watching = overrun_watcher(fleet, stopped);
    assert_eq!(burst(fleet, &["gamma"; 3], "on-b").await, 3);
    assert_eq!(burst(fleet, &["alpha"; 4], "on-a").await, 4);

    // Removed from the fleet: its Seed deleted on the master.
    Api::<Seed>::namespaced(fleet.master().client(), KUBERMATIC_NAMESPACE)
        .delete("seed-b", &DeleteParams::default())
        .await
        .unwrap();
    let held_b = wait_for(WAIT, "seed-b stuck in the master's figures", || async {
        let status = quotas.get(NAME).await.ok()?.status?;
        let b = status.seeds.iter().find(|s| s.name == "seed-b" && s.stuck)?;
        let share = b.share.as_ref()?.amount(Resource::Cpu);
        Some(i64::try_from(share.ceil_units()).unwrap().max(3))
    })
    .await
    .unwrap();
    wait_others_folded(fleet, "seed-a", 0).await;
    let room = usize::try_from(LIMIT - held_b).unwrap();
    fill(setup, "alpha", 4, room, "stuck").await;
    let more = burst(&setup.fleet, &["alpha"; 4], "stuck-more").await;
    eprintln!("seed-b removed holding {held_b}: seed-a reached {room}, then admitted {more}");
    assert_eq!(
        more,
        0,
        "seed-b's share is still counted\n{}",
        describe(setup).await
    );
    let _ = stop.send(());
    watching.await.unwrap();

    // Declared gone: master-controller restarted with the flag (as a Helm upgrade would).
    let master = master_controller(setup);
    master.restart_with("--gone-seeds=seed-b").unwrap();
    let master = &*master;
    wait_for(WAIT, "seed-b forgotten from the record", || async {
        let record = quotas.get(NAME).await.ok()?.status?.shares?;
        record.seeds.iter().all(|s| s.name != "seed-b").then_some(())
    })
    .await
    .unwrap();
    let forgotten = sample(
        &master.scrape().await.unwrap(),
        "kkp_quota_gone_seeds_forgotten_total",
    );
    assert!(forgotten >= Some(1.0), "{forgotten:?}");
    fill(setup, "alpha", room, LIMIT_MACHINES, "gone").await;
    let (committed, _) = seed_figures(&setup.fleet.seed("seed-a").client()).await.unwrap();
    assert_eq!(
        committed,
        LIMIT,
        "seed-a holds the whole quota\n{}",
        describe(setup).await
    );
}

/// Faults operators cause (issue #32), one after another on one fleet (each ends settled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_operators_cause_never_overrun_and_heal() {
    let mut setup = setup().await;
    a_lost_share_record_is_rebuilt_from_the_seeds(&setup).await;
    a_deleted_ledger_fails_closed_and_heals(&setup).await;
    a_limit_added_to_a_resource_in_use_counts_that_use(&setup).await;
    a_catalog_edit_that_grows_running_machines_is_counted(&setup).await;
    a_restored_seed_does_not_regain_released_share(&setup).await;
    a_drained_seed_hands_its_share_back(&mut setup).await;
    a_seed_declared_gone_returns_its_share(&mut setup).await;
}
