//! The whole counting chain on a real fleet: master-controller (quota fan-out and fold) and one
//! seed-controller per seed. A Machine created in a user cluster reaches the master's
//! `globalUsage`, across two seeds; deleting it takes it out again. KKP's own objects get the
//! figures in KKP's shape: the seed's `ResourceQuota` copy its `localUsage`, the master's its
//! `globalUsage` (cpu, memory and storage); every resource is in the `ProjectQuota`.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;

use common::*;
use kkp_quota_crds::quota::{PROJECT_KIND, SUBJECT_KIND_LABEL, SUBJECT_NAME_LABEL};
use kkp_quota_crds::{KkpQuota, ProjectQuota, ResourceDetails, ResourceQuota, ResourceQuotaSpec, Subject};
use kube::Api;
use kube::api::PostParams;
use seed_controller::Config;
use seed_controller::usage::same_usage;
use serde_json::json;

/// Waits until the master's `globalUsage` is `machines` (the Machines' sizes) and the fleet's two
/// clusters of the project (alpha on seed-a, gamma on seed-b).
async fn wait_global(master: &kube::Client, machines: &ResourceDetails) {
    let api: Api<ProjectQuota> = Api::all(master.clone());
    let mut expected = machines.clone();
    expected.set(
        kkp_quota_crds::Resource::Clusters,
        Some(kkp_quota_crds::Quantity::from_units(2)),
    );
    let expected = &expected;
    e2e::wait_for(WAIT, &format!("master globalUsage = {expected}"), || async {
        let global = api
            .get("project-demo")
            .await
            .ok()
            .and_then(|q| q.status)
            .and_then(|s| s.global_usage);
        match global {
            Some(g) if same_usage(&g, expected) => Ok(()),
            other => Err(format!("is {}", other.map(|g| g.to_string()).unwrap_or_default())),
        }
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machines_reach_the_master_global_usage() {
    init_logs();
    let spec = e2e::FleetSpec::empty()
        .with_seed("seed-a")
        .with_seed("seed-b")
        .with_project("demo")
        .with_user_cluster("alpha", "seed-a", "demo")
        .with_user_cluster("gamma", "seed-b", "demo");
    let fleet = e2e::Fleet::start(spec).await.unwrap();
    let master = fleet.master().client();

    // The master object; the master-controller makes the seed copies.
    let mut rq = ResourceQuota::new(
        "project-demo",
        ResourceQuotaSpec {
            subject: Subject::project("demo"),
            quota: KkpQuota::new(&serde_json::from_value(json!({"cpu": "100"})).unwrap()),
        },
    );
    rq.metadata.labels = Some(BTreeMap::from([
        (SUBJECT_NAME_LABEL.to_owned(), "demo".to_owned()),
        (SUBJECT_KIND_LABEL.to_owned(), PROJECT_KIND.to_owned()),
    ]));
    Api::<ResourceQuota>::all(master.clone())
        .create(&PostParams::default(), &rq)
        .await
        .unwrap();
    let metrics = master_controller::Metrics::new();
    let readiness = kkp_quota_runtime::ops::Readiness::default();
    let _master_controller = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(master_controller::run(
        master.clone(),
        master_controller::Options::new("kubermatic"),
        metrics,
        readiness,
    )));
    let _a = start_controller(fleet.seed("seed-a"), Config::for_tests("seed-a")).await;
    let _b = start_controller(fleet.seed("seed-b"), Config::for_tests("seed-b")).await;

    let (alpha, gamma) = (
        fleet.user_cluster("alpha").client(),
        fleet.user_cluster("gamma").client(),
    );
    let (a_spec, g_spec) = (aws("m5.large"), vsphere(8, 32768, 100));
    create_machine(&alpha, "a1", &a_spec).await;
    wait_global(&master, &size_of(&a_spec)).await;
    create_machine(&gamma, "g1", &g_spec).await;
    let both = sum(&[&size_of(&a_spec), &size_of(&g_spec)]);
    wait_global(&master, &both).await;
    wait_local_usage(&fleet.seed("seed-b").client(), "demo", &size_of(&g_spec)).await;
    wait_kkp_usage(
        &fleet.seed("seed-b").client(),
        |s| s.local_usage,
        &size_of(&g_spec),
    )
    .await;
    wait_kkp_usage(&master, |s| s.global_usage, &both).await;
    delete_machine(&alpha, "a1").await;
    wait_global(&master, &size_of(&g_spec)).await;
}

/// KKP's `ResourceQuota` named `project-demo` shows `expected` in KKP's shape (cpu, memory,
/// storage; nothing else, as KKP's schema would keep nothing else).
async fn wait_kkp_usage(
    client: &kube::Client,
    field: impl Fn(kkp_quota_crds::ResourceQuotaStatus) -> Option<ResourceDetails>,
    expected: &ResourceDetails,
) {
    let api: Api<ResourceQuota> = Api::all(client.clone());
    let want = expected.kkp_subset();
    e2e::wait_for(WAIT, &format!("KKP's quota shows {want}"), || async {
        let got = api
            .get("project-demo")
            .await
            .ok()
            .and_then(|q| q.status)
            .and_then(&field);
        match got {
            Some(g) if g == want => Ok(()),
            other => Err(format!("is {other:?}")),
        }
    })
    .await
    .unwrap();
}
