//! `clusters` counted (issue #38): every `Cluster` of the demo project on every seed
//! counts one in the `ProjectQuota`'s global usage and in its seed's figures, from the moment a
//! seed stores it (its user cluster reachable or not) until it is gone.

use std::time::Duration;

use e2e::wait_for;
use kkp_quota_crds::kkp::Cluster;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};

const WAIT: Duration = Duration::from_mins(1);

/// The demo fleet's three clusters (alpha and beta on seed-a, gamma on seed-b) count; a fourth
/// `Cluster` on seed-b, with no user cluster behind it (KKP has not provisioned it yet), counts
/// at once; deleted, it no longer does. (The demo quota does not limit clusters; the seeds'
/// webhooks admit the `Cluster`, recording a reservation that its count replaces.)
pub async fn clusters_are_counted(master: kube::Client, seed_b: kube::Client) {
    let seeds = ["seed-a", "seed-b"];
    let wait_counted = |global: i64, per_seed: [i64; 2]| {
        let master = master.clone();
        async move {
            e2e::demo::wait_clusters_counted(&master, "demo", &seeds, global, &per_seed, WAIT)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
    };
    wait_counted(3, [2, 1]).await;

    let clusters = Api::<Cluster>::all(seed_b);
    let extra = e2e::fleet::project_cluster("delta-unprovisioned", "demo");
    clusters
        .create(&PostParams::default(), &extra)
        .await
        .expect("create the extra Cluster");
    wait_counted(4, [2, 2]).await;

    clusters
        .delete("delta-unprovisioned", &DeleteParams::default())
        .await
        .expect("delete the extra Cluster");
    wait_for(WAIT, "the extra Cluster gone", || async {
        let left = clusters.list(&ListParams::default()).await.ok()?;
        left.items
            .iter()
            .all(|c| c.metadata.name.as_deref() != Some("delta-unprovisioned"))
            .then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    wait_counted(3, [2, 1]).await;
}

/// Project `other` has no cluster on seed-a (its one cluster, `delta`, is on seed-b). Given a
/// quota of two clusters, its ledger on seed-a is counted all the same (at zero), so its first
/// `Cluster` there is admitted, and a second one is refused, saying how many it has of how many
/// (counted over every seed).
pub async fn a_projects_first_cluster_on_a_seed_is_admitted(master: kube::Client, seed_a: kube::Client) {
    use kkp_quota_crds::{ProjectQuota, Quantity, QuotaLedger, Resource, ResourceQuota};
    use kube::api::{Patch, PatchParams};

    let quota = e2e::demo::cpu_quota("other", "4");
    Api::<ResourceQuota>::all(master.clone())
        .patch(
            "project-other",
            &PatchParams::apply("clusters-test").force(),
            &Patch::Apply(&quota),
        )
        .await
        .expect("the quota of project other");
    let project_quotas = Api::<ProjectQuota>::all(master);
    wait_for(WAIT, "project other's ProjectQuota", || async {
        project_quotas.get("project-other").await.ok()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    project_quotas
        .patch(
            "project-other",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"quota": {"clusters": "2"}}})),
        )
        .await
        .expect("a limit of two clusters");
    let ledgers = Api::<QuotaLedger>::all(seed_a.clone());
    wait_for(
        WAIT,
        "project other's ledger on seed-a, counted, limiting clusters",
        || async {
            let ledger = ledgers.get("project-other").await.ok()?;
            (ledger.status?.local_usage.is_some()
                && ledger.spec.quota.get(Resource::Clusters) == Some(Quantity::from_units(2)))
            .then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));

    let clusters = Api::<Cluster>::all(seed_a);
    let of_other = |name: &str| e2e::fleet::project_cluster(name, "other");
    clusters
        .create(&PostParams::default(), &of_other("other-first"))
        .await
        .expect("the first cluster of project other");
    let refused = clusters
        .create(&PostParams::default(), &of_other("other-second"))
        .await
        .expect_err("a third cluster over a limit of two");
    assert!(
        refused.to_string().contains(
            r#"cluster "other-second" cannot be created: project "other" has 2 of 2 clusters; delete a cluster or ask an admin to raise the limit"#
        ),
        "{refused}"
    );
    clusters
        .delete("other-first", &DeleteParams::default())
        .await
        .expect("delete the first cluster of project other");
}
