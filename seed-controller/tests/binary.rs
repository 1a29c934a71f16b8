//! The `seed-controller` binary as deployed: flags, leader election on a Lease in the seed's
//! `kubermatic` namespace, `/healthz`, `/readyz` (after the initial sync) and `/metrics`.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_elects_a_leader_serves_ops_and_counts() {
    init_logs();
    let (seed_cp, user_cp) =
        tokio::try_join!(e2e::ControlPlane::start("seed"), e2e::ControlPlane::start("user")).unwrap();
    let seed = seed_cp.client();
    ensure_namespace(&seed, "kubermatic").await;
    register_cluster(&seed, "alpha", "demo", &user_cp.kubeconfig_yaml()).await;
    create_quota_copy(&seed, "demo", "100").await;
    let spec = aws("t3.medium");
    create_machine(&user_cp.client(), "m0", &spec).await;

    let port = e2e::system::free_port().unwrap();
    let mut child = replica(&seed_cp, port)
        .env("SEED_CONTROLLER_RESYNC_PERIOD", "30s")
        .spawn()
        .unwrap();

    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    answers_ok(&http, &format!("{base}/healthz")).await;
    answers_ok(&http, &format!("{base}/readyz")).await;
    let leases: Api<Lease> = Api::namespaced(seed.clone(), "kubermatic");
    let lease = leases.get("kkp-quota-seed-controller").await.unwrap();
    assert!(lease.spec.unwrap().holder_identity.is_some_and(|h| !h.is_empty()));
    wait_local_usage(&seed, "demo", &size_of(&spec)).await;
    let metrics = text_of(&http, &format!("{base}/metrics")).await;
    assert!(
        metrics.contains(r#"kkp_quota_local_usage{project="demo",resource="cpu"} 2"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"kkp_quota_cluster_usage{cluster="alpha",project="demo",resource="cpu"} 2"#));
    assert!(
        metrics.contains(r#"kkp_quota_cluster_usage{cluster="alpha",project="demo",resource="clusters"} 1"#)
    );

    // A second replica waits for the lease and is ready meanwhile (a rolling update or a node
    // drain under the chart's PodDisruptionBudget waits for readiness); it never counts.
    let standby_port = e2e::system::free_port().unwrap();
    let mut standby = replica(&seed_cp, standby_port).spawn().unwrap();
    answers_ok(&http, &format!("http://127.0.0.1:{standby_port}/readyz")).await;
    let standby_metrics = text_of(&http, &format!("http://127.0.0.1:{standby_port}/metrics")).await;
    assert!(
        !standby_metrics.contains("kkp_quota_local_usage{"),
        "the standby counts: {standby_metrics}"
    );
    standby.kill().await.unwrap();
    child.kill().await.unwrap();
}

/// A seed-controller replica against `seed`, serving its ops endpoints on `port`.
fn replica(seed: &e2e::ControlPlane, port: u16) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_seed-controller"));
    command
        .args([
            &format!("--kubeconfig={}", seed.kubeconfig_path().display()),
            "--seed-name=seed",
            &format!("--metrics-address=127.0.0.1:{port}"),
            "--lease-duration=6s",
        ])
        .kill_on_drop(true);
    command
}

/// The body of a GET of `url`.
async fn text_of(http: &reqwest::Client, url: &str) -> String {
    http.get(url).send().await.unwrap().text().await.unwrap()
}

/// Waits until `url` answers with a success status.
async fn answers_ok(http: &reqwest::Client, url: &str) {
    e2e::wait_for(WAIT, url, || async {
        http.get(url).send().await.is_ok_and(|r| r.status().is_success())
    })
    .await
    .unwrap();
}
