//! `clusters` counted (issue #38): every `Cluster` of the demo project on every seed
//! counts one in the `ProjectQuota`'s global usage and in its seed's figures, from the moment a
//! seed stores it (its user cluster reachable or not) until it is gone.

use std::collections::BTreeMap;
use std::time::Duration;

use e2e::wait_for;
use kkp_quota_crds::kkp::{Cluster, ClusterSpec, PROJECT_ID_LABEL};
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
    let mut extra = Cluster::new(
        "delta-unprovisioned",
        ClusterSpec {
            human_readable_name: "delta".to_owned(),
        },
    );
    extra.metadata.labels = Some(BTreeMap::from([(PROJECT_ID_LABEL.to_owned(), "demo".to_owned())]));
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
