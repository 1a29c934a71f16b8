//! Real etcd + kube-apiserver processes: isolation, teardown, restart.

use std::collections::BTreeMap;
use std::time::Duration;

use e2e::{ControlPlane, procfs, wait_for};
use k8s_openapi::api::core::v1::ConfigMap;
use kkp_quota_crds::{KkpQuota, ResourceQuota, ResourceQuotaSpec, Subject};
use kube::Api;
use kube::api::{ListParams, ObjectMeta, PostParams};

fn config_map(name: &str, value: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("value".to_owned(), value.to_owned())])),
        ..ConfigMap::default()
    }
}

fn quota(name: &str, project: &str) -> ResourceQuota {
    ResourceQuota::new(
        name,
        ResourceQuotaSpec {
            subject: Subject::project(project),
            quota: KkpQuota::default(),
        },
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn three_control_planes_run_at_once_and_share_nothing() {
    let (a, b, c) = tokio::try_join!(
        ControlPlane::start("iso-a"),
        ControlPlane::start("iso-b"),
        ControlPlane::start("iso-c")
    )
    .unwrap();
    let urls = [a.url(), b.url(), c.url()];
    assert!(
        urls[0] != urls[1] && urls[1] != urls[2] && urls[0] != urls[2],
        "{urls:?}"
    );

    let pp = PostParams::default();
    Api::<ConfigMap>::namespaced(a.client(), "default")
        .create(&pp, &config_map("marker", "a"))
        .await
        .unwrap();
    Api::<ResourceQuota>::all(b.client())
        .create(&pp, &quota("project-b", "b"))
        .await
        .unwrap();

    let got = Api::<ConfigMap>::namespaced(a.client(), "default")
        .get("marker")
        .await
        .unwrap();
    assert_eq!(got.data.unwrap()["value"], "a");
    for other in [&b, &c] {
        let absent = Api::<ConfigMap>::namespaced(other.client(), "default")
            .get_opt("marker")
            .await
            .unwrap();
        assert!(absent.is_none(), "{} sees a's ConfigMap", other.name());
    }
    assert!(
        Api::<ResourceQuota>::all(b.client())
            .get_opt("project-b")
            .await
            .unwrap()
            .is_some()
    );
    for other in [&a, &c] {
        let absent = Api::<ResourceQuota>::all(other.client())
            .list(&ListParams::default())
            .await
            .unwrap();
        assert!(absent.items.is_empty(), "{} sees b's ResourceQuota", other.name());
    }
}

fn assert_gone(pids: &[u32], dir: &std::path::Path) {
    for pid in pids {
        assert!(!procfs::is_running(*pid), "process {pid} survived teardown");
    }
    assert!(!dir.exists(), "{} survived teardown", dir.display());
}

#[tokio::test(flavor = "multi_thread")]
async fn drop_kills_both_processes_and_removes_the_temp_dir() {
    let cp = ControlPlane::start("teardown").await.unwrap();
    let pids = cp.pids();
    let dir = cp.dir().to_owned();
    assert_eq!(pids.len(), 2, "etcd and kube-apiserver");
    for pid in &pids {
        assert!(procfs::is_running(*pid), "process {pid} should be running");
    }
    assert!(dir.join("etcd-data").is_dir());
    drop(cp);
    assert_gone(&pids, &dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_panicking_test_still_cleans_up() {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let cp = ControlPlane::start("panics").await.unwrap();
        tx.send((cp.pids(), cp.dir().to_owned())).unwrap();
        panic!("a test failing while its control plane runs");
    });
    let (pids, dir) = rx.await.unwrap();
    assert!(task.await.unwrap_err().is_panic());
    assert_gone(&pids, &dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn apiserver_restart_keeps_data_url_and_credentials() {
    let cp = ControlPlane::start("restart").await.unwrap();
    let url = cp.url();
    let client = cp.client(); // made before the restart, used after it
    let kubeconfig = cp.kubeconfig_yaml();
    let pp = PostParams::default();
    Api::<ConfigMap>::namespaced(client.clone(), "default")
        .create(&pp, &config_map("kept", "yes"))
        .await
        .unwrap();
    Api::<ResourceQuota>::all(client.clone())
        .create(&pp, &quota("project-kept", "kept"))
        .await
        .unwrap();
    let old_apiserver = *cp.pids().last().unwrap();

    cp.stop_apiserver().await;
    assert!(!cp.apiserver_running());
    assert!(!procfs::is_running(old_apiserver));
    assert_eq!(cp.pids().len(), 1, "etcd keeps running");
    let err = Api::<ConfigMap>::namespaced(client.clone(), "default")
        .get("kept")
        .await;
    assert!(err.is_err(), "the API must be unreachable while stopped");
    cp.stop_apiserver().await; // stopping twice is harmless

    cp.start_apiserver().await.unwrap();
    assert!(cp.start_apiserver().await.is_err(), "already running");
    assert_eq!(cp.url(), url);
    assert_ne!(*cp.pids().last().unwrap(), old_apiserver);
    let got = Api::<ConfigMap>::namespaced(client.clone(), "default")
        .get("kept")
        .await
        .unwrap();
    assert_eq!(got.data.unwrap()["value"], "yes");
    let fresh = e2e::client_from_kubeconfig(&kubeconfig).await.unwrap();
    let rq = Api::<ResourceQuota>::all(fresh)
        .get("project-kept")
        .await
        .unwrap();
    assert_eq!(rq.project(), "kept");
}

#[tokio::test]
async fn wait_for_returns_the_value_or_fails_at_the_deadline() {
    let mut n = 0;
    let got = wait_for(Duration::from_secs(5), "n to reach 3", || {
        n += 1;
        let n = n;
        async move { (n >= 3).then_some(n) }
    })
    .await
    .unwrap();
    assert_eq!(got, 3);

    let err = wait_for(
        Duration::from_millis(100),
        "something that never happens",
        || async { Err::<(), _>("still broken") },
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("something that never happens") && err.contains("still broken"),
        "{err}"
    );
    wait_for(Duration::from_secs(1), "true", || async { true })
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn other_users_get_only_what_rbac_grants_them() {
    use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject as RbacSubject};

    let cp = ControlPlane::start("rbac").await.unwrap();
    let yaml = cp.kubeconfig_for_user("quota-reader", &["readers"]).unwrap();
    let reader = e2e::client_from_kubeconfig(&yaml).await.unwrap();
    let quotas = Api::<ResourceQuota>::all(reader);
    match quotas.list(&ListParams::default()).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("expected 403 Forbidden before any binding, got {other:?}"),
    }

    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some("readers-admin".to_owned()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "ClusterRole".to_owned(),
            name: "cluster-admin".to_owned(),
        },
        subjects: Some(vec![RbacSubject {
            kind: "Group".to_owned(),
            name: "readers".to_owned(),
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            namespace: None,
        }]),
    };
    Api::<ClusterRoleBinding>::all(cp.client())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    wait_for(Duration::from_secs(10), "the binding to take effect", || async {
        quotas.list(&ListParams::default()).await.map(|_| ())
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn components_are_logged_and_killed_on_drop() {
    use e2e::components::{ComponentSpec, spawn};

    let fleet_bin = ComponentSpec::workspace_bin("fleet", Vec::new()).unwrap();
    assert!(
        fleet_bin.program.is_file(),
        "{} should exist",
        fleet_bin.program.display()
    );

    let dir = tempfile::tempdir().unwrap();
    let spec = ComponentSpec {
        name: "stand-in".to_owned(),
        program: "/bin/sh".into(),
        args: vec!["-c".to_owned(), "echo component up; exec sleep 600".to_owned()],
    };
    let running = spawn(&spec, dir.path()).unwrap();
    let pid = running.pid();
    let log = dir.path().join("stand-in.log");
    wait_for(Duration::from_secs(10), "the component's log line", || async {
        std::fs::read_to_string(&log).is_ok_and(|text| text.contains("component up"))
    })
    .await
    .unwrap();
    assert!(procfs::is_running(pid));
    drop(running);
    assert!(!procfs::is_running(pid), "component {pid} survived drop");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_apiserver_hangs_requests_until_resumed() {
    let cp = ControlPlane::start("pause").await.unwrap();
    let api = Api::<ConfigMap>::namespaced(cp.client(), "default");
    api.create(&PostParams::default(), &config_map("before", "1"))
        .await
        .unwrap();

    cp.pause_apiserver().unwrap();
    // The process is stopped: the request cannot be answered, however long we wait.
    let hung = tokio::time::timeout(Duration::from_secs(1), api.get("before")).await;
    assert!(hung.is_err(), "a paused apiserver answered: {hung:?}");

    cp.resume_apiserver().unwrap();
    wait_for(
        Duration::from_secs(30),
        "the resumed apiserver to answer",
        || async { api.get("before").await.map(|cm| cm.data) },
    )
    .await
    .unwrap();
    // Dropping a paused control plane must still clean up.
    cp.pause_apiserver().unwrap();
    let pids = cp.pids();
    drop(cp);
    for pid in pids {
        assert!(!procfs::is_running(pid), "process {pid} survived");
    }
}
