//! `Cluster` creates against a `clusters` limit (issue #38, step 2), on the shares fleet: the
//! seeds' API servers send every `Cluster` create to their machine-webhook, which reserves one
//! cluster through the same ledgers and per-seed shares as a Machine.

use futures::future::join_all;
use kkp_quota_crds::kkp::Cluster;
use kkp_quota_crds::{ProjectQuota, Quantity, QuotaLedger, Resource};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::sync::oneshot;

use super::{NAME, WAIT, describe, overrun_watcher_of, wait_fleet_clusters_counted, wait_others_folded_of};
use e2e::system::FleetWithSystem;
use e2e::wait_for;

/// The project runs 3 clusters (alpha, beta on seed-a; gamma on seed-b); the limit leaves room
/// for 4 more.
const CLUSTERS_LIMIT: i64 = 7;
const ROOM: usize = 4;

/// Creates `names` on the seeds given, all at once; returns the names admitted and how many
/// were refused for want of room. Every refusal must be the quota's: for room, in words about
/// clusters, or while share moves.
async fn create_all(seeds: &[(&str, Client)], names: &[String]) -> (Vec<String>, usize) {
    let creates = names.iter().enumerate().map(|(i, name)| {
        let (seed, client) = &seeds[i % seeds.len()];
        let api = Api::<Cluster>::all(client.clone());
        async move {
            (
                *seed,
                name.clone(),
                api.create(&PostParams::default(), &e2e::fleet::project_cluster(name, "demo"))
                    .await,
            )
        }
    });
    let (mut admitted, mut no_room) = (Vec::new(), 0);
    for (seed, name, result) in join_all(creates).await {
        match result {
            Ok(_) => admitted.push(name),
            Err(kube::Error::Api(e)) if e.code == 403 && e.message.ends_with(&no_room_message(&name)) => {
                no_room += 1;
            }
            Err(kube::Error::Api(e)) => {
                assert!(
                    e.code == 403
                        && e.message
                            .contains(&format!("cluster {name:?} cannot be admitted yet")),
                    "{name} on {seed}: {e:?}"
                );
            }
            Err(e) => panic!("{name} on {seed}: {e}"),
        }
    }
    (admitted, no_room)
}

/// The refusal of `name` for want of room, as the API server returns it (after its own prefix,
/// `admission webhook "clusters.quota.kkp.k8c.io" denied the request: `).
fn no_room_message(name: &str) -> String {
    format!(
        r#"cluster "{name}" cannot be created: project "demo" has {CLUSTERS_LIMIT} of {CLUSTERS_LIMIT} clusters; delete a cluster or ask an admin to raise the limit"#
    )
}

/// Deletes the `Cluster`s `names` and waits until both seeds count the project's 3 again, each
/// with the other's count folded in.
async fn delete_and_settle(setup: &FleetWithSystem, seeds: &[(&str, Client)], names: &[String]) {
    for name in names {
        delete_everywhere(seeds, name).await;
    }
    for (seed, client) in seeds {
        let api = Api::<Cluster>::all(client.clone());
        wait_for(
            WAIT,
            &format!("the burst's Clusters gone from {seed}"),
            || async {
                let left = api.list(&ListParams::default()).await.ok()?;
                left.items
                    .iter()
                    .all(|c| !names.iter().any(|n| c.metadata.name.as_deref() == Some(n)))
                    .then_some(())
            },
        )
        .await
        .unwrap();
    }
    let fleet = &setup.fleet;
    wait_fleet_clusters_counted(fleet).await;
    wait_others_folded_of(fleet, "seed-a", Resource::Clusters, Quantity::from_units(1)).await;
    wait_others_folded_of(fleet, "seed-b", Resource::Clusters, Quantity::from_units(2)).await;
}

/// A `clusters` limit with room for 4: 12 concurrent creates spread over both seeds admit
/// exactly 4, 10 rounds over (a round's deleted clusters give their room to the next), and the
/// watcher never sees the seeds commit more than the limit; a refusal says how many clusters the
/// project has of how many; one deleted cluster lets one more in.
pub async fn cluster_creates_admit_exactly_the_room(setup: &FleetWithSystem) {
    let fleet = &setup.fleet;
    let quotas = Api::<ProjectQuota>::all(fleet.master().client());
    let limit = |limit: Option<i64>| serde_json::json!({"spec": {"quota": {"clusters": limit.map(|l| l.to_string())}}});
    quotas
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(&limit(Some(CLUSTERS_LIMIT))),
        )
        .await
        .unwrap();
    for seed in ["seed-a", "seed-b"] {
        let ledgers = Api::<QuotaLedger>::all(fleet.seed(seed).client());
        wait_for(WAIT, &format!("{seed}'s ledger limiting clusters"), || async {
            let quota = ledgers.get(NAME).await.ok()?.spec.quota;
            (quota.get(Resource::Clusters) == Some(Quantity::from_units(CLUSTERS_LIMIT))).then_some(())
        })
        .await
        .unwrap();
    }
    let seeds = [
        ("seed-a", fleet.seed("seed-a").client()),
        ("seed-b", fleet.seed("seed-b").client()),
    ];
    delete_and_settle(setup, &seeds, &[]).await;
    let (stop, stopped) = oneshot::channel();
    let watching = overrun_watcher_of(
        fleet,
        Resource::Clusters,
        Quantity::from_units(CLUSTERS_LIMIT),
        stopped,
    );

    let mut admitted = Vec::new();
    for round in 0..10 {
        let names: Vec<String> = (0..12).map(|i| format!("burst-{round}-{i}")).collect();
        let no_room;
        (admitted, no_room) = create_all(&seeds, &names).await;
        eprintln!(
            "cluster round {round}: {} of 12 admitted ({no_room} refused for room, the rest while share moved): {admitted:?}",
            admitted.len()
        );
        assert_eq!(admitted.len(), ROOM, "round {round}\n{}", describe(setup).await);
        if round < 9 {
            delete_and_settle(setup, &seeds, &admitted).await;
        }
    }

    // Full: one more is refused; one deleted, one more fits.
    let refused = create_all(&seeds[1..], &["one-more".to_owned()]).await;
    assert_eq!(
        refused,
        (vec![], 1),
        "one more, on a full count, is refused for room"
    );
    let freed = admitted.pop().unwrap();
    delete_everywhere(&seeds, &freed).await;
    let retried = wait_for(WAIT, "room for one once a cluster is gone", || async {
        let (again, _) = create_all(&seeds[1..], &["one-more".to_owned()]).await;
        (!again.is_empty()).then_some(again)
    })
    .await
    .unwrap();
    admitted.extend(retried);

    let _ = stop.send(());
    let checked = watching.await.unwrap();
    assert!(checked > 10, "only {checked} versions checked");
    delete_and_settle(setup, &seeds, &admitted).await;
    quotas
        .patch(NAME, &PatchParams::default(), &Patch::Merge(&limit(None)))
        .await
        .unwrap();
}

/// Deletes the `Cluster` `name` wherever it is.
async fn delete_everywhere(seeds: &[(&str, Client)], name: &str) {
    for (seed, client) in seeds {
        match Api::<Cluster>::all(client.clone())
            .delete(name, &DeleteParams::default())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => panic!("deleting {name} on {seed}: {e}"),
        }
    }
}
