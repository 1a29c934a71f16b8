//! A shared quota group over `demo` (issue #36, docs/groups.md "Shared mode"), on the shares
//! fleet: the group's 6 cpu below the project's own 10, so the group's budget decides. Bursts over
//! both seeds never let the seeds commit more than 6 together, the whole 6 is usable, and the
//! project has its own 10 again once the group is gone. Then the issue's burst: a group over two
//! projects, each with a cluster on both seeds.

use kkp_quota_crds::kkp::Project;
use kkp_quota_crds::{ProjectQuota, Quantity, QuotaGroup, QuotaLedger, Resource};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use tokio::sync::oneshot;

use super::{LIMIT, NAME, WAIT, burst, describe, fill, overrun_watcher_of, restore_limit, settle};
use e2e::fleet::FleetSpec;
use e2e::shares::{delete_all, exact_figures, group_overrun_watcher};
use e2e::system::FleetWithSystem;
use e2e::wait_for;

const GROUP: &str = "acme";
const GROUP_CPU: usize = 6;

pub async fn a_shared_group_caps_the_project_across_seeds(setup: &FleetWithSystem) {
    let fleet = &setup.fleet;
    restore_limit(fleet).await;
    settle(fleet).await;
    let master = fleet.master().client();
    let projects = Api::<Project>::all(master.clone());
    let label = |value: Option<&str>| serde_json::json!({"metadata": {"labels": {"customer": value}}});
    projects
        .patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(&label(Some(GROUP))),
        )
        .await
        .unwrap();
    let groups = Api::<QuotaGroup>::all(master.clone());
    let group: QuotaGroup = serde_json::from_value(serde_json::json!({
        "apiVersion": "kkp-quota.dev/v1alpha1",
        "kind": "QuotaGroup",
        "metadata": {"name": GROUP},
        "spec": {
            "selector": {"matchLabels": {"customer": GROUP}},
            "quota": {"cpu": GROUP_CPU.to_string()},
        },
    }))
    .unwrap();
    groups.create(&PostParams::default(), &group).await.unwrap();
    let quotas = Api::<ProjectQuota>::all(master.clone());
    wait_for(WAIT, "demo holding a word of the group", || async {
        let shares = quotas.get(NAME).await.ok()?.status?.shares?;
        shares
            .groups
            .iter()
            .any(|c| c.group == GROUP && c.version >= 1)
            .then_some(())
    })
    .await
    .unwrap();

    let (stop, stopped) = oneshot::channel();
    let limit = Quantity::from_units(i64::try_from(GROUP_CPU).unwrap());
    let watching = overrun_watcher_of(fleet, Resource::Cpu, limit, stopped);
    let spread: Vec<&str> = (0..30).map(|i| ["alpha", "gamma"][i % 2]).collect();
    let admitted = burst(fleet, &spread, "grp").await;
    eprintln!(
        "group of {GROUP_CPU} cpu over demo (10 cpu): a burst of 30 over both seeds admitted {admitted}"
    );
    assert!(
        admitted <= GROUP_CPU,
        "{admitted} admitted\n{}",
        describe(setup).await
    );
    // What the burst left (share still moving when its requests gave up) is usable.
    fill(setup, "gamma", admitted, GROUP_CPU, "grp-fill").await;
    let over = burst(fleet, &["alpha"; 3], "grp-over").await;
    assert_eq!(over, 0, "admitted past the group\n{}", describe(setup).await);
    // The refusal names the group, not the project's own quota (a refusal while the ledger does
    // not carry the group yet waits for share and says so; its demand brings the group).
    let alpha = e2e::machines::api(fleet, "alpha");
    let named = wait_for(WAIT, "a refusal naming the group", || async {
        let machine = e2e::machines::vsphere("grp-named", 1);
        match alpha.create(&PostParams::default(), &machine).await {
            Err(kube::Error::Api(e)) if e.message.contains(&format!("group {GROUP:?} uses 6 of 6 cpu")) => {
                Some(e.message)
            }
            Err(_) => None,
            Ok(_) => panic!("admitted past the group"),
        }
    })
    .await
    .unwrap();
    eprintln!("past the group: {named}");
    assert!(
        named.contains(r#"needs 1 cpu, project "demo" is within its own quota"#),
        "{named}"
    );
    let _ = stop.send(());
    let checked = watching.await.unwrap();
    assert!(checked > 3, "only {checked} versions checked");

    // The group gone: demo's own 10 again.
    settle(fleet).await;
    groups.delete(GROUP, &DeleteParams::default()).await.unwrap();
    projects
        .patch("demo", &PatchParams::default(), &Patch::Merge(&label(None)))
        .await
        .unwrap();
    wait_for(WAIT, "demo's copy of the group gone", || async {
        let shares = quotas.get(NAME).await.ok()?.status?.shares?;
        shares.groups.is_empty().then_some(())
    })
    .await
    .unwrap();
}

/// The group over `demo` and `other`.
const PAIR: &str = "acme-pair";
const PAIR_CPU: usize = 6;
/// Rounds of the two-project burst (each about half a minute on the 2-core CI machine).
const PAIR_ROUNDS: usize = 3;
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
    let groups = Api::<QuotaGroup>::all(master.clone());
    let group: QuotaGroup = serde_json::from_value(serde_json::json!({
        "apiVersion": "kkp-quota.dev/v1alpha1",
        "kind": "QuotaGroup",
        "metadata": {"name": PAIR},
        "spec": {
            "selector": {"matchLabels": {"customer": PAIR}},
            "quota": {"cpu": PAIR_CPU.to_string()},
        },
    }))
    .unwrap();
    groups.create(&PostParams::default(), &group).await.unwrap();
    let quotas = Api::<ProjectQuota>::all(master.clone());
    for quota in [NAME, OTHER] {
        wait_for(WAIT, &format!("{quota} holding a word of the group"), || async {
            let shares = quotas.get(quota).await.ok()?.status?.shares?;
            shares
                .groups
                .iter()
                .any(|c| c.group == PAIR && c.version >= 1)
                .then_some(())
        })
        .await
        .unwrap();
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
            let named = group_refusal(fleet, OTHER_CLUSTERS[1], "uses 6 of 6 cpu").await;
            assert!(
                named.contains(r#"project "other" is within its own quota"#),
                "{named}"
            );
        }
        let mut machines = 0;
        for cluster in ["alpha", "gamma", OTHER_CLUSTERS[0], OTHER_CLUSTERS[1]] {
            let list = e2e::machines::api(fleet, cluster)
                .list(&kube::api::ListParams::default())
                .await
                .unwrap();
            machines += list.items.len();
        }
        assert_eq!(machines, PAIR_CPU, "round {round}: Machines in the four clusters");
        eprintln!(
            "group of {PAIR_CPU} cpu over demo and other (10 each), round {round}: the burst of 60 admitted \
             {first} ({demo} demo, {other} other), {bursts} more bursts filled it"
        );
        delete_all(fleet, &["alpha", "gamma"]).await;
        delete_all(fleet, &OTHER_CLUSTERS).await;
        wait_idle_of(fleet, &[NAME, OTHER]).await;
    }

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
    delete_all(fleet, &["alpha", "gamma"]).await;
    delete_all(fleet, &OTHER_CLUSTERS).await;
    wait_idle_of(fleet, &[NAME, OTHER]).await;
    set_own_limits(fleet, LIMIT).await;

    let _ = stop.send(());
    let checked = watching.await.unwrap();
    assert!(checked > 10, "only {checked} versions checked");

    groups.delete(PAIR, &DeleteParams::default()).await.unwrap();
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

/// Creates one-cpu Machines of `project` in `cluster`, a burst at a time, until `total` of the
/// project's are admitted (`admitted` already); panics past `total` or after 20 bursts.
async fn fill_to(fleet: &e2e::Fleet, project: &str, cluster: &str, mut admitted: usize, total: usize) {
    for attempt in 0.. {
        if admitted >= total {
            return;
        }
        assert!(attempt < 20, "{project}: only {admitted} of {total} admitted");
        let users = vec![cluster; total - admitted + 1];
        admitted += e2e::shares::burst(fleet, project, &users, &format!("tight-fill{attempt}")).await;
        assert!(
            admitted <= total,
            "{project}: {admitted} admitted, more than {total}"
        );
    }
}

/// The refusal of a one-cpu Machine in `cluster` once it names group [`PAIR`] with `figures`
/// (a refusal while the ledger's figures of the group are older waits for share and says so;
/// its demand refreshes them).
async fn group_refusal(fleet: &e2e::Fleet, cluster: &str, figures: &str) -> String {
    let machines = e2e::machines::api(fleet, cluster);
    let wanted = format!("group {PAIR:?} {figures}");
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
