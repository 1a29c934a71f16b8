//! `clusters` counted (issue #38, first step): every `Cluster` of the demo project on every seed
//! counts one in the `ProjectQuota`'s global usage and in its seed's figures, from the moment a
//! seed stores it (its user cluster reachable or not) until it is gone.

use std::collections::BTreeMap;
use std::time::Duration;

use e2e::wait_for;
use kkp_quota_crds::kkp::{Cluster, ClusterSpec, PROJECT_ID_LABEL};
use kkp_quota_crds::{ProjectQuota, Quantity, Resource};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};

const WAIT: Duration = Duration::from_mins(1);

/// `clusters` in the global usage and in each seed's figures, in `seeds` order, once they read
/// `global` and `per_seed`.
async fn wait_counted(quotas: &Api<ProjectQuota>, seeds: &[&str], global: i64, per_seed: &[i64]) {
    let what = format!("clusters {global} in all, {per_seed:?} on {seeds:?}");
    wait_for(WAIT, &what, || async {
        let status = quotas.get("project-demo").await.ok()?.status?;
        let counted =
            |usage: Option<&kkp_quota_crds::ResourceDetails>| usage.and_then(|u| u.get(Resource::Clusters));
        if counted(status.global_usage.as_ref()) != Some(Quantity::from_units(global)) {
            return None;
        }
        for (seed, want) in seeds.iter().zip(per_seed) {
            let figures = status.seeds.iter().find(|s| s.name == *seed)?;
            if counted(figures.usage.as_ref()) != Some(Quantity::from_units(*want)) {
                return None;
            }
        }
        Some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

/// The demo fleet's three clusters (alpha and beta on seed-a, gamma on seed-b) count; a fourth
/// `Cluster` on seed-b, with no user cluster behind it (KKP has not provisioned it yet), counts
/// at once; deleted, it no longer does. Nothing limits clusters yet: the count is shown only.
pub async fn clusters_are_counted(master: kube::Client, seed_b: kube::Client) {
    let quotas = Api::<ProjectQuota>::all(master);
    let seeds = ["seed-a", "seed-b"];
    wait_counted(&quotas, &seeds, 3, &[2, 1]).await;

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
    wait_counted(&quotas, &seeds, 4, &[2, 2]).await;

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
    wait_counted(&quotas, &seeds, 3, &[2, 1]).await;
}
