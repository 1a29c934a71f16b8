//! A shared group over two projects (issue #36's burst, docs/groups.md "Shared mode"), on the
//! shares fleet with project `other` added (a cluster on each seed): rounds of 60 creates over
//! the four clusters, overlapping groups, the group lowered below usage, the projects' own quotas
//! tighter than the group, and a project labelled into a group it is over.

use kkp_quota_crds::kkp::Project;
use kkp_quota_crds::{Quantity, QuotaGroup, QuotaLedger, Resource};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use tokio::sync::oneshot;

use super::group::{create_group, wait_holding};
use super::{LIMIT, NAME, WAIT, overrun_watcher_of, settle};
use e2e::fleet::FleetSpec;
use e2e::shares::{delete_all, exact_figures, group_overrun_watcher};
use e2e::system::FleetWithSystem;
use e2e::wait_for;

/// The group over `demo` and `other`.
const PAIR: &str = "acme-pair";
const PAIR_CPU: usize = 6;
/// Rounds of the two-project burst (each about half a minute on the 2-core CI machine).
const PAIR_ROUNDS: usize = 3;
/// The second group over `demo` alone, inside [`PAIR`] (overlapping groups).
const SOLO: &str = "acme-solo";
const SOLO_CPU: usize = 4;
/// What [`PAIR`] is lowered to, below what its projects use.
const LOWERED_CPU: usize = 3;
/// `other`'s quota and clusters, one on each seed.
const OTHER: &str = "project-other";
const OTHER_CLUSTERS: [&str; 2] = ["delta", "epsilon"];

/// `spec` with project `other` and its clusters (`delta` on seed-a, `epsilon` on seed-b).
pub fn with_other(spec: FleetSpec) -> FleetSpec {
    spec.with_project("other")
        .with_user_cluster(OTHER_CLUSTERS[0], "seed-a", "other")
        .with_user_cluster(OTHER_CLUSTERS[1], "seed-b", "other")
}

/// Issue #36's burst: a group of 6 cpu over `demo` (alpha on seed-a, gamma on seed-b) and `other`
/// (delta, epsilon), each project with its own 10. Each round, 60 creates at once over the four
/// clusters: never more than 6 committed together at any version of any ledger of either
/// project, what the burst left (budget or share still moving when its requests gave up) filled
/// to exactly 6, nothing past it, and the refusal names the group.
pub async fn a_group_over_two_projects_admits_its_room_across_seeds(setup: &FleetWithSystem) {
    let fleet = &setup.fleet;
    settle(fleet).await;
    let other_quota = e2e::demo::cpu_quota("other", &LIMIT.to_string());
    e2e::demo::apply_quota(fleet, &other_quota, "shares-test")
        .await
        .unwrap();
    e2e::demo::wait_in_force(fleet, "other", WAIT).await.unwrap();
    let master = fleet.master().client();
    let projects = Api::<Project>::all(master.clone());
    let label = |value: Option<&str>| serde_json::json!({"metadata": {"labels": {"customer": value}}});
    for project in ["demo", "other"] {
        projects
            .patch(
                project,
                &PatchParams::default(),
                &Patch::Merge(&label(Some(PAIR))),
            )
            .await
            .unwrap();
    }
    create_group(fleet, PAIR, "customer", PAIR, PAIR_CPU).await;
    for quota in [NAME, OTHER] {
        wait_holding(fleet, quota, PAIR).await;
    }

    let (stop, stopped) = oneshot::channel();
    let limit = Quantity::from_units(i64::try_from(PAIR_CPU).unwrap());
    let watching = group_overrun_watcher(fleet, &[NAME, OTHER], Resource::Cpu, limit, stopped);
    let demo_spread: Vec<&str> = (0..30).map(|i| ["alpha", "gamma"][i % 2]).collect();
    let other_spread: Vec<&str> = (0..30).map(|i| OTHER_CLUSTERS[i % 2]).collect();
    for round in 0..PAIR_ROUNDS {
        let prefix = format!("pair{round}");
        let (demo, other) = tokio::join!(
            e2e::shares::burst(fleet, "demo", &demo_spread, &prefix),
            e2e::shares::burst(fleet, "other", &other_spread, &prefix),
        );
        let first = demo + other;
        assert!(first <= PAIR_CPU, "round {round}: {demo} + {other} admitted");
        let mut admitted = first;
        let mut bursts = 0;
        while admitted < PAIR_CPU {
            bursts += 1;
            assert!(
                bursts <= 20,
                "round {round}: only {admitted} of {PAIR_CPU} admitted"
            );
            let room = vec!["gamma"; PAIR_CPU - admitted + 1];
            let other_room = vec![OTHER_CLUSTERS[0]; PAIR_CPU - admitted + 1];
            let prefix = format!("pair{round}-fill{bursts}");
            let (demo, other) = tokio::join!(
                e2e::shares::burst(fleet, "demo", &room, &prefix),
                e2e::shares::burst(fleet, "other", &other_room, &prefix),
            );
            admitted += demo + other;
            assert!(admitted <= PAIR_CPU, "round {round}: {admitted} admitted");
        }
        let prefix = format!("pair{round}-past");
        let past = tokio::join!(
            e2e::shares::burst(fleet, "demo", &["alpha"; 2], &prefix),
            e2e::shares::burst(fleet, "other", &[OTHER_CLUSTERS[1]; 2], &prefix),
        );
        assert_eq!(past, (0, 0), "round {round}: admitted past the group");
        if round == 0 {
            // `other`'s refusal counts what demo uses: the group's figures its ledgers carry.
            let named = group_refusal(fleet, OTHER_CLUSTERS[1], PAIR, "uses 6 of 6 cpu").await;
            assert!(
                named.contains(r#"project "other" is within its own quota"#),
                "{named}"
            );
        }
        assert_eq!(
            machines_in_pair(fleet).await,
            PAIR_CPU,
            "round {round}: Machines in the four clusters"
        );
        eprintln!(
            "group of {PAIR_CPU} cpu over demo and other (10 each), round {round}: the burst of 60 admitted \
             {first} ({demo} demo, {other} other), {bursts} more bursts filled it"
        );
        empty_pair(fleet).await;
    }

    overlapping_groups_the_tighter_wins(fleet, (&demo_spread, &other_spread)).await;
    a_group_lowered_below_usage_admits_nothing_more(fleet).await;

    // The projects' own quotas tighter than the group: 2 each, 4 together, below its 6. Each
    // project's own quota refuses, and says so.
    set_own_limits(fleet, 2).await;
    let (demo, other) = tokio::join!(
        e2e::shares::burst(fleet, "demo", &demo_spread, "tight"),
        e2e::shares::burst(fleet, "other", &other_spread, "tight"),
    );
    eprintln!("demo and other at 2 cpu each under the group's 6: the burst of 60 admitted {demo} + {other}");
    tokio::join!(
        fill_to(fleet, "demo", "gamma", demo, 2),
        fill_to(fleet, "other", OTHER_CLUSTERS[0], other, 2),
    );
    let denied = e2e::machines::api(fleet, "alpha")
        .create(&PostParams::default(), &e2e::machines::vsphere("tight-past", 1))
        .await
        .expect_err("admitted past demo's own 2 cpu");
    let denied = denied.to_string();
    assert!(
        denied.contains(r#"project "demo" uses 2 of 2 cpu"#) && !denied.contains("group"),
        "{denied}"
    );
    empty_pair(fleet).await;
    set_own_limits(fleet, LIMIT).await;

    let _ = stop.send(());
    let checked = watching.await.unwrap();
    assert!(checked > 10, "only {checked} versions checked");

    Api::<QuotaGroup>::all(master.clone())
        .delete(PAIR, &DeleteParams::default())
        .await
        .unwrap();
    for project in ["demo", "other"] {
        projects
            .patch(project, &PatchParams::default(), &Patch::Merge(&label(None)))
            .await
            .unwrap();
    }
}

/// Waits until no seed commits anything for the quotas `names`.
async fn wait_idle_of(fleet: &e2e::Fleet, names: &[&str]) {
    for seed in e2e::shares::SEEDS {
        let ledgers = Api::<QuotaLedger>::all(fleet.seed(seed).client());
        for name in names {
            wait_for(WAIT, &format!("{name} idle on {seed}"), || async {
                let (committed, _) = exact_figures(&ledgers.get(name).await.ok()?, Resource::Cpu)?;
                (committed == Quantity::ZERO).then_some(())
            })
            .await
            .unwrap();
        }
    }
}

/// Sets `demo`'s and `other`'s own quotas to `cpu` and waits until both seeds' ledgers carry it.
async fn set_own_limits(fleet: &e2e::Fleet, cpu: i64) {
    for project in ["demo", "other"] {
        let quota = e2e::demo::cpu_quota(project, &cpu.to_string());
        e2e::demo::apply_quota(fleet, &quota, "shares-test")
            .await
            .unwrap();
    }
    for seed in e2e::shares::SEEDS {
        let ledgers = Api::<QuotaLedger>::all(fleet.seed(seed).client());
        for name in [NAME, OTHER] {
            wait_for(WAIT, &format!("{name} at {cpu} cpu on {seed}"), || async {
                let quota = ledgers.get(name).await.ok()?.spec.quota;
                (quota.amount(Resource::Cpu) == Quantity::from_units(cpu)).then_some(())
            })
            .await
            .unwrap();
        }
    }
}

/// Tells the fills' Machine names apart.
static FILLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Creates one-cpu Machines of `project` in `cluster`, a burst at a time, until `total` of the
/// project's are admitted (`admitted` already); panics past `total` or after 20 bursts.
async fn fill_to(fleet: &e2e::Fleet, project: &str, cluster: &str, mut admitted: usize, total: usize) {
    let prefix = format!(
        "fill-{}",
        FILLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    for attempt in 0.. {
        if admitted >= total {
            return;
        }
        assert!(attempt < 20, "{project}: only {admitted} of {total} admitted");
        let users = vec![cluster; total - admitted + 1];
        admitted += e2e::shares::burst(fleet, project, &users, &format!("{prefix}-{attempt}")).await;
        assert!(
            admitted <= total,
            "{project}: {admitted} admitted, more than {total}"
        );
    }
}

/// The refusal of a one-cpu Machine in `cluster` once it names `group` with `figures`
/// (a refusal while the ledger's figures of the group are older waits for share and says so;
/// its demand refreshes them).
async fn group_refusal(fleet: &e2e::Fleet, cluster: &str, group: &str, figures: &str) -> String {
    let machines = e2e::machines::api(fleet, cluster);
    let wanted = format!("group {group:?} {figures}");
    wait_for(
        WAIT,
        &format!("a refusal naming the group with {figures}"),
        || async {
            let machine = e2e::machines::vsphere("pair-named", 1);
            match machines.create(&PostParams::default(), &machine).await {
                Err(kube::Error::Api(e)) if e.message.contains(&wanted) => Some(e.message),
                Err(_) => None,
                Ok(_) => panic!("admitted past the group"),
            }
        },
    )
    .await
    .unwrap()
}

/// Overlapping groups, the most restrictive wins: a second group, `solo`, of 4 cpu over `demo`
/// alone, inside the group of 6 over both. A burst over the four clusters admits at most 4 to
/// demo and 6 together; the rest is filled (demo first) to exactly 6, none past.
async fn overlapping_groups_the_tighter_wins(fleet: &e2e::Fleet, spreads: (&[&str], &[&str])) {
    let master = fleet.master().client();
    let projects = Api::<Project>::all(master.clone());
    let solo_label = |value: Option<&str>| serde_json::json!({"metadata": {"labels": {"solo": value}}});
    projects
        .patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(&solo_label(Some("yes"))),
        )
        .await
        .unwrap();
    create_group(fleet, SOLO, "solo", "yes", SOLO_CPU).await;
    wait_holding(fleet, NAME, SOLO).await;
    let (stop, stopped) = oneshot::channel();
    let limit = Quantity::from_units(i64::try_from(SOLO_CPU).unwrap());
    let watching = overrun_watcher_of(fleet, Resource::Cpu, limit, stopped);
    let (demo, other) = tokio::join!(
        e2e::shares::burst(fleet, "demo", spreads.0, "solo"),
        e2e::shares::burst(fleet, "other", spreads.1, "solo"),
    );
    eprintln!(
        "groups of {SOLO_CPU} over demo and {PAIR_CPU} over demo and other: the burst of 60 admitted {demo} demo + {other} other"
    );
    assert!(demo <= SOLO_CPU && demo + other <= PAIR_CPU, "{demo} + {other}");
    let demo_room = SOLO_CPU.min(PAIR_CPU - other);
    fill_to(fleet, "demo", "gamma", demo, demo_room).await;
    fill_to(fleet, "other", OTHER_CLUSTERS[0], other, PAIR_CPU - demo_room).await;
    let past = tokio::join!(
        e2e::shares::burst(fleet, "demo", &["alpha"; 2], "solo-past"),
        e2e::shares::burst(fleet, "other", &[OTHER_CLUSTERS[1]; 2], "solo-past"),
    );
    assert_eq!(past, (0, 0), "admitted past a group");
    assert_eq!(machines_in_pair(fleet).await, PAIR_CPU);
    let _ = stop.send(());
    watching.await.unwrap();
    Api::<QuotaGroup>::all(master.clone())
        .delete(SOLO, &DeleteParams::default())
        .await
        .unwrap();
    projects
        .patch("demo", &PatchParams::default(), &Patch::Merge(&solo_label(None)))
        .await
        .unwrap();
    empty_pair(fleet).await;
}

/// The group lowered below what its projects use (6 of them, lowered to 3): they keep their
/// Machines, the group says `QuotaExceeded`, nothing more is admitted and the refusal names the
/// group; once they are gone, exactly the new 3 is usable. The group is set back to 6.
async fn a_group_lowered_below_usage_admits_nothing_more(fleet: &e2e::Fleet) {
    fill_exactly(fleet, "demo", "gamma", PAIR_CPU / 2).await;
    fill_exactly(fleet, "other", OTHER_CLUSTERS[0], PAIR_CPU / 2).await;
    set_pair_limit(fleet, LOWERED_CPU).await;
    wait_pair_over(fleet).await;
    let named = group_refusal(
        fleet,
        "alpha",
        PAIR,
        &format!("uses {PAIR_CPU} of {LOWERED_CPU} cpu"),
    )
    .await;
    eprintln!("the group lowered to {LOWERED_CPU} below {PAIR_CPU} used: {named}");
    let past = tokio::join!(
        e2e::shares::burst(fleet, "demo", &["alpha"; 2], "low-past"),
        e2e::shares::burst(fleet, "other", &[OTHER_CLUSTERS[1]; 2], "low-past"),
    );
    assert_eq!(past, (0, 0), "admitted past the lowered group");
    empty_pair(fleet).await;
    fill_to(fleet, "demo", "gamma", 0, LOWERED_CPU).await;
    let past = tokio::join!(
        e2e::shares::burst(fleet, "demo", &["alpha"; 2], "low-past2"),
        e2e::shares::burst(fleet, "other", &[OTHER_CLUSTERS[1]; 2], "low-past2"),
    );
    assert_eq!(past, (0, 0), "admitted past the lowered group, once emptied");
    empty_pair(fleet).await;
    set_pair_limit(fleet, PAIR_CPU).await;
}

/// Every Machine of both projects deleted, and no seed committing anything for either.
async fn empty_pair(fleet: &e2e::Fleet) {
    delete_all(fleet, &["alpha", "gamma"]).await;
    delete_all(fleet, &OTHER_CLUSTERS).await;
    wait_idle_of(fleet, &[NAME, OTHER]).await;
}

/// How many Machines the four clusters of the two projects hold.
async fn machines_in_pair(fleet: &e2e::Fleet) -> usize {
    let mut machines = 0;
    for cluster in ["alpha", "gamma", OTHER_CLUSTERS[0], OTHER_CLUSTERS[1]] {
        let list = e2e::machines::api(fleet, cluster)
            .list(&kube::api::ListParams::default())
            .await
            .unwrap();
        machines += list.items.len();
    }
    machines
}

/// Sets the group [`PAIR`]'s limit to `cpu`.
async fn set_pair_limit(fleet: &e2e::Fleet, cpu: usize) {
    let patch = serde_json::json!({"spec": {"quota": {"cpu": cpu.to_string()}}});
    Api::<QuotaGroup>::all(fleet.master().client())
        .patch(PAIR, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// Creates one-cpu Machines of `project` in `cluster`, never more at once than still wanted,
/// until it has `total` (a set-up step: room the group leaves is not asked about here).
async fn fill_exactly(fleet: &e2e::Fleet, project: &str, cluster: &str, total: usize) {
    let mut admitted = 0;
    for attempt in 0.. {
        if admitted == total {
            return;
        }
        assert!(attempt < 20, "{project}: only {admitted} of {total} admitted");
        let users = vec![cluster; total - admitted];
        admitted += e2e::shares::burst(
            fleet,
            project,
            &users,
            &format!(
                "set-{}-{attempt}",
                FILLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            ),
        )
        .await;
    }
}

/// Waits until group [`PAIR`] says `QuotaExceeded`.
async fn wait_pair_over(fleet: &e2e::Fleet) {
    let groups = Api::<QuotaGroup>::all(fleet.master().client());
    wait_for(WAIT, "the group QuotaExceeded", || async {
        let status = groups.get(PAIR).await.ok()?.status?;
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "QuotaExceeded" && c.status == "True")
            .then_some(())
    })
    .await
    .unwrap();
}
