//! Room that appears is handed to the `MachineSet`s that wait for it: the owners of Machines the
//! webhook refused for room are nudged (an annotation write) when room for their Machine appears,
//! whether by a raised limit, by a delete elsewhere in the project (seed-controller's lower count,
//! played here by the test) or by share arriving from another seed (master-controller's grant,
//! played here too); only as many as fit, and none while nothing fits. A Machine refused for want
//! of room in the quota is woken as soon as the quota has room, even where this seed's share does
//! not cover it yet; one refused for want of share only once the share has come.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use common::owners::{owner_ref, resource};
use common::*;
use e2e::wait_for;
use futures::StreamExt as _;
use kkp_quota_crds::QuotaLedger;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};
use machine_webhook::waiting::WakeConfig;
use machine_webhook::wake::ROOM_ANNOTATION;
use serde_json::json;

/// When each `MachineSet` was first seen with each value of the annotation, from a watch.
type Seen = Arc<Mutex<HashMap<(String, String), Instant>>>;

fn watch_nudges(alpha: Client) -> (Seen, tokio::task::JoinHandle<()>) {
    let seen: Seen = Arc::default();
    let api: Api<DynamicObject> = Api::namespaced_with(alpha, NS, &resource("machinesets"));
    let record = Arc::clone(&seen);
    let task = tokio::spawn(async move {
        let mut objects = watcher(api, watcher::Config::default()).applied_objects().boxed();
        while let Some(object) = objects.next().await {
            let Ok(object) = object else { continue };
            if let Some(value) = object
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ROOM_ANNOTATION))
            {
                let name = object.metadata.name.clone().unwrap_or_default();
                let mut seen = record.lock().unwrap();
                seen.entry((name, value.clone())).or_insert_with(Instant::now);
            }
        }
    });
    (seen, task)
}

/// The nudges of `set` seen so far.
fn nudges(seen: &Seen, set: &str) -> Vec<Instant> {
    let seen = seen.lock().unwrap();
    seen.iter()
        .filter(|((name, _), _)| name == set)
        .map(|(_, at)| *at)
        .collect()
}

/// Waits for nudge number `n` of `set`; how long after `since` it was seen.
async fn wait_nudge(seen: &Seen, set: &str, n: usize, since: Instant) -> Result<Duration> {
    let at = wait_for(
        Duration::from_secs(30),
        &format!("nudge {n} of {set}"),
        || async {
            let mut all = nudges(seen, set);
            all.sort();
            all.get(n - 1).copied()
        },
    )
    .await?;
    Ok(at.saturating_duration_since(since))
}

/// A Machine of `set` (generated name, as the `MachineSet` controller creates them).
fn machine_of(set: &DynamicObject, cpus: i64) -> kkp_quota_crds::machine::Machine {
    let mut m = machine("", cpus);
    m.metadata.name = None;
    m.metadata.generate_name = Some(format!("{}-", set.metadata.name.clone().unwrap_or_default()));
    m.metadata.owner_references = Some(vec![owner_ref(set, "MachineSet")]);
    m
}

async fn set_status(seed: &Client, local: &str, others: &str) -> Result<()> {
    let api: Api<QuotaLedger> = Api::all(seed.clone());
    api.patch_status(
        &format!("project-{PROJECT}"),
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {
            "localUsage": {"cpu": local},
            "otherSeedsUsage": {"cpu": others},
            "reservations": null,
            "allotments": null,
        }})),
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines)]
async fn refused_machine_sets_are_woken_when_room_appears() -> Result<()> {
    let fleet = fleet().await?;
    let seed = fleet.seed(SEED).client();
    let alpha = fleet.user_cluster("alpha").client();
    let certs = certs()?;
    // Full: 16 of 16 cpu.
    write_quota(seed.clone(), PROJECT, "16", "16").await?;
    let webhook = start_webhook_configured(seed.clone(), &certs, "127.0.0.1:0".parse()?, |config| {
        config.allotments = None;
        config.share_wait = Duration::from_millis(300);
        config.wake = Some(WakeConfig {
            min_gap: Duration::from_millis(200),
            ..WakeConfig::default()
        });
    })
    .await?;
    register(&seed, alpha.clone(), "alpha", webhook.address, &certs).await?;
    let (nudged, watch) = watch_nudges(alpha.clone());

    let sets: Api<DynamicObject> = Api::namespaced_with(alpha.clone(), NS, &resource("machinesets"));
    let mut small = DynamicObject::new("small", &resource("machinesets"));
    small.data = json!({"spec": {"replicas": 1}});
    let small = sets.create(&PostParams::default(), &small).await?;
    let mut big = DynamicObject::new("big", &resource("machinesets"));
    big.data = json!({"spec": {"replicas": 1}});
    let big = sets.create(&PostParams::default(), &big).await?;
    let api = machines(alpha.clone());
    denial(api.create(&PostParams::default(), &machine_of(&small, 2)).await);
    denial(api.create(&PostParams::default(), &machine_of(&big, 8)).await);
    let metrics = webhook.metrics.clone();
    assert_eq!(metrics.waiting_owners.get(), 2);

    // Room for 1 cpu appears: nothing waiting fits, nobody is woken. Once the webhook's cache
    // has the new count (a dry run of a 1-cpu Machine passes), the next pass finds no room.
    set_status(&seed, "15", "0").await?;
    wait_for(
        Duration::from_secs(30),
        "the webhook to see room for 1 cpu",
        || async {
            let dry = PostParams {
                dry_run: true,
                ..PostParams::default()
            };
            api.create(&dry, &machine("probe", 1)).await.is_ok()
        },
    )
    .await?;
    let checked = metrics.wake_checks.with_label_values(&["no_room"]).get();
    wait_for(Duration::from_secs(30), "a pass that finds no room", || async {
        metrics.wake_checks.with_label_values(&["no_room"]).get() >= checked + 2
    })
    .await?;
    let sent = || metrics.wakes.with_label_values(&["sent"]).get();
    assert_eq!(sent(), 0, "woken without room");
    // The webhook counts a wake once its patch is answered; the test sees the nudge by its
    // watch, which may come first: wait for the count, then check it is exactly that.
    let counted = |n: u64| async move {
        wait_for(Duration::from_secs(30), &format!("wake {n} counted"), || async {
            sent() >= n
        })
        .await
    };

    // The limit is raised by 2: room for 3, "small" (2 cpu) fits, "big" (8) does not.
    let raised = Instant::now();
    write_quota(seed.clone(), PROJECT, "18", "15").await?;
    let after_raise = wait_nudge(&nudged, "small", 1, raised).await?;
    counted(1).await?;
    assert_eq!(sent(), 1);
    assert!(nudges(&nudged, "big").is_empty(), "big woken without room for it");
    // Its controller tries again: admitted now (room 1 left); the next of its Machines is refused.
    api.create(&PostParams::default(), &machine_of(&small, 2)).await?;
    denial(api.create(&PostParams::default(), &machine_of(&small, 2)).await);
    // seed-controller counts the admitted Machine (17 of 18): still no room for another.
    set_status(&seed, "17", "0").await?;

    // A 2-cpu Machine is deleted in another cluster of the project: seed-controller's count drops.
    let deleted = Instant::now();
    set_status(&seed, "15", "0").await?;
    let after_delete = wait_nudge(&nudged, "small", 2, deleted).await?;
    counted(2).await?;
    assert_eq!(sent(), 2);
    assert!(nudges(&nudged, "big").is_empty(), "big woken without room for it");

    // Per-seed shares: the quota is raised to 40, this seed holds a share of 15 and uses it all;
    // another seed holds the rest. The quota has room for "big" now, this seed's share not yet:
    // it is woken (its retry asks the master for share and waits for it).
    let ledgers: Api<QuotaLedger> = Api::all(seed.clone());
    // The master's word: the limit and this seed's share (the rest on seed-b).
    let grant = |version: u64, granted: i64| {
        let word = json!({"spec": {"quota": {"cpu": "40"}, "shares": {
            "version": version,
            "granted": {"cpu": granted.to_string()},
            "target": {"cpu": granted.to_string()},
            "others": {"seed-b": {"cpu": (40 - granted).to_string()}},
        }}});
        let ledgers = ledgers.clone();
        async move {
            let name = format!("project-{PROJECT}");
            ledgers
                .patch(&name, &PatchParams::default(), &Patch::Merge(&word))
                .await
        }
    };
    grant(1, 15).await?;
    wait_nudge(&nudged, "big", 1, deleted).await?;
    counted(3).await?;
    assert_eq!(sent(), 3);
    // "small" fits the quota but not the share: refused, share in transit.
    let refused = denial(api.create(&PostParams::default(), &machine_of(&small, 2)).await);
    assert!(refused.contains("share") || refused.contains("seed"), "{refused}");
    // The master moves 2 cpu of share here from the other seed.
    let granted = Instant::now();
    grant(2, 17).await?;
    let after_share = wait_nudge(&nudged, "small", 3, granted).await?;
    counted(4).await?;
    assert_eq!(sent(), 4);
    // Its retry never came (nothing reconciles it here): not refused again, not woken again.
    assert_eq!(nudges(&nudged, "big").len(), 1);
    api.create(&PostParams::default(), &machine_of(&small, 2)).await?;

    // The annotation is the only change: the spec the user wrote is untouched.
    let small_now = sets.get("small").await?;
    assert_eq!(small_now.data["spec"], json!({"replicas": 1}));
    println!(
        "nudge seen after: raised limit {after_raise:?}, delete elsewhere {after_delete:?}, share arrived {after_share:?}"
    );
    watch.abort();
    webhook.kill().await;
    Ok(())
}
