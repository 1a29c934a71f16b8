//! The default fleet: KKP's objects where KKP would have them, and the demo binary.

#[path = "fleet/clusters.rs"]
mod clusters;
#[path = "fleet/groups.rs"]
mod groups;
#[path = "fleet/kubectl.rs"]
mod kubectl;
#[path = "fleet/reserved.rs"]
mod reserved;
#[path = "fleet/reserved_counts.rs"]
mod reserved_counts;
#[path = "fleet/rollout.rs"]
mod rollout;

use std::collections::BTreeSet;
use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e::fleet::{KUBERMATIC_NAMESPACE, cluster_namespace};
use e2e::{Fleet, FleetSpec, procfs, wait_for, wait_for_object};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kkp_quota_crds::kkp::{
    ADMIN_KUBECONFIG_SECRET, Cluster, KUBECONFIG_KEY, PROJECT_ID_LABEL, Project, Seed,
};
use kkp_quota_crds::machine::{
    Machine, MachineDeployment, MachineDeploymentSpec, MachineSet, MachineSetSpec,
};
use kkp_quota_crds::{QuotaLedger, ResourceQuota};
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams, PropagationPolicy};
use kube::{Api, Resource as _};

async fn client_from_secret(client: kube::Client, namespace: &str, name: &str) -> kube::Client {
    let secret = Api::<Secret>::namespaced(client, namespace)
        .get(name)
        .await
        .expect("kubeconfig Secret");
    let data = secret.data.expect("Secret data");
    let yaml = std::str::from_utf8(&data[KUBECONFIG_KEY].0).expect("UTF-8 kubeconfig");
    e2e::client_from_kubeconfig(yaml)
        .await
        .expect("client from the Secret's kubeconfig")
}

async fn names<K>(api: Api<K>) -> BTreeSet<String>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let list = api.list(&ListParams::default()).await.expect("list");
    list.items
        .into_iter()
        .filter_map(|o| o.meta().name.clone())
        .collect()
}

/// Master: projects, seeds, and seed kubeconfig Secrets that reach the right seed.
async fn check_master(fleet: &Fleet) {
    let master = fleet.master().client();
    let projects = names(Api::<Project>::all(master.clone())).await;
    assert_eq!(projects, BTreeSet::from(["demo".to_owned(), "other".to_owned()]));
    let seeds = Api::<Seed>::namespaced(master.clone(), KUBERMATIC_NAMESPACE);
    let seeds = seeds.list(&ListParams::default()).await.expect("list Seeds");
    assert_eq!(seeds.items.len(), 2);
    for seed in seeds.items {
        let name = seed.metadata.name.clone().expect("Seed name");
        let reference = &seed.spec.kubeconfig;
        let namespace = reference.namespace.as_deref().unwrap_or(KUBERMATIC_NAMESPACE);
        let secret = reference.name.as_deref().expect("Secret name");
        let seed_client = client_from_secret(master.clone(), namespace, secret).await;
        let clusters = names(Api::<Cluster>::all(seed_client)).await;
        let expected: BTreeSet<_> = fleet
            .spec()
            .user_clusters_on(&name)
            .map(|u| u.name.clone())
            .collect();
        assert_eq!(
            clusters, expected,
            "Clusters seen through Seed {name}'s kubeconfig Secret"
        );
    }
}

/// Seeds: Clusters with project label and namespace, admin kubeconfigs that reach the user cluster.
async fn check_seeds(fleet: &Fleet) {
    for user in &fleet.spec().user_clusters {
        let seed_client = fleet.seed(&user.seed).client();
        let cluster = Api::<Cluster>::all(seed_client.clone())
            .get(&user.name)
            .await
            .expect("Cluster");
        assert_eq!(
            cluster.metadata.labels.as_ref().expect("labels")[PROJECT_ID_LABEL],
            user.project
        );
        assert_eq!(cluster.project_id(), Some(user.project.as_str()));
        assert_eq!(
            cluster.status.as_ref().expect("status").namespace_name,
            cluster_namespace(&user.name)
        );
        let namespace = cluster.control_plane_namespace();
        let user_client = client_from_secret(seed_client, &namespace, ADMIN_KUBECONFIG_SECRET).await;
        let machines = Api::<Machine>::namespaced(user_client.clone(), "kube-system");
        assert!(names(machines).await.is_empty());
        // A marker written through the Secret's kubeconfig lands in that user cluster only.
        let marker_name = format!("marker-{}", user.name);
        let marker = ConfigMap {
            metadata: ObjectMeta {
                name: Some(marker_name.clone()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        let configmaps = Api::<ConfigMap>::namespaced(user_client, "default");
        configmaps
            .create(&PostParams::default(), &marker)
            .await
            .expect("marker");
        for other in &fleet.spec().user_clusters {
            let api = Api::<ConfigMap>::namespaced(fleet.user_cluster(&other.name).client(), "default");
            let found = api.get_opt(&marker_name).await.expect("get marker");
            assert_eq!(
                found.is_some(),
                other.name == user.name,
                "{marker_name} in {}",
                other.name
            );
        }
    }
}

/// The files for kubectl and scripts.
async fn check_files(fleet: &Fleet) {
    let dir = tempfile::tempdir().expect("temp dir");
    let members = fleet.write_dir(dir.path()).expect("write_dir");
    let text = std::fs::read_to_string(dir.path().join("fleet.json")).expect("fleet.json");
    let json: serde_json::Value = serde_json::from_str(&text).expect("fleet.json is JSON");
    let entries = json.as_array().expect("an array");
    assert_eq!(entries.len(), 6);
    let alpha = entries.iter().find(|e| e["name"] == "alpha").expect("alpha");
    assert_eq!(alpha["role"], "user");
    assert_eq!(alpha["seed"], "seed-a");
    assert_eq!(alpha["project"], "demo");
    assert_eq!(alpha["url"], fleet.user_cluster("alpha").url());
    let roles: Vec<_> = entries
        .iter()
        .map(|e| e["role"].as_str().expect("role"))
        .collect();
    assert_eq!(roles, ["master", "seed", "seed", "user", "user", "user"]);
    for member in members {
        let yaml = std::fs::read_to_string(&member.kubeconfig).expect("kubeconfig file");
        let client = e2e::client_from_kubeconfig(&yaml).await.expect("client");
        let version = client.apiserver_version().await.expect("version");
        assert_eq!(version.git_version, "v1.36.3", "{}", member.name);
        let url = &entries
            .iter()
            .find(|e| e["name"] == member.name.as_str())
            .expect("entry")["url"];
        assert_eq!(url, &fleet.get(&member.name).expect("cluster").url());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_default_fleet_has_what_kkp_would_have() {
    let started = Instant::now();
    let fleet = Fleet::start(FleetSpec::default()).await.unwrap();
    let startup = started.elapsed();
    #[allow(clippy::cast_precision_loss)]
    let rss_mib = fleet.rss_bytes() as f64 / 1024.0 / 1024.0;
    eprintln!(
        "default fleet: started in {startup:?}, {} processes, RSS {rss_mib:.0} MiB",
        fleet.pids().len()
    );
    assert_eq!(
        fleet.pids().len(),
        18,
        "etcd, kube-apiserver and kube-controller-manager per cluster"
    );
    check_master(&fleet).await;
    check_seeds(&fleet).await;
    check_files(&fleet).await;
}

#[test]
fn fleet_specs_are_validated() {
    FleetSpec::default().validate().unwrap();
    let dup = FleetSpec::default().with_user_cluster("alpha", "seed-b", "demo");
    assert!(dup.validate().is_err());
    let master = FleetSpec::default().with_seed("master");
    assert!(master.validate().is_err());
    let unknown_seed = FleetSpec::default().with_user_cluster("delta", "seed-z", "demo");
    assert!(unknown_seed.validate().is_err());
    let unknown_project = FleetSpec::default().with_user_cluster("delta", "seed-b", "nope");
    assert!(unknown_project.validate().is_err());
    FleetSpec::default()
        .with_user_cluster("delta", "seed-b", "other")
        .validate()
        .unwrap();
}

/// A Machine from `deploy/examples`.
#[allow(clippy::unwrap_used, reason = "a test helper: a panic is the failure report")]
fn example(file: &str) -> Machine {
    let path = format!("{}/../deploy/examples/{file}", env!("CARGO_MANIFEST_DIR"));
    serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The demo project end to end: its quota on every seed, the webhook configuration in a user
/// cluster, a fitting Machine counted up to the master, one too big refused with the reason, and
/// a `MachineDeployment`'s Machines garbage-collected with it.
#[allow(clippy::unwrap_used, reason = "a test helper: a panic is the failure report")]
async fn check_demo_project(fleet_dir: &std::path::Path) {
    let client_for = |name: &str| {
        let yaml = std::fs::read_to_string(fleet_dir.join(format!("{name}.kubeconfig"))).unwrap();
        async move { e2e::client_from_kubeconfig(&yaml).await.unwrap() }
    };
    let seed_a = client_for("seed-a").await;
    let clusters = Api::<Cluster>::all(seed_a.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(clusters.items.len(), 2);

    // The demo quota reaches every seed (KKP's copy and the ledger), and the webhook
    // configuration every user cluster.
    for seed in ["seed-a", "seed-b"] {
        let quotas = Api::<ResourceQuota>::all(client_for(seed).await);
        wait_for_object(&quotas, "project-demo", Duration::from_mins(1))
            .await
            .unwrap();
        let ledgers = Api::<QuotaLedger>::all(client_for(seed).await);
        wait_for_object(&ledgers, "project-demo", Duration::from_mins(1))
            .await
            .unwrap();
    }
    let alpha = client_for("alpha").await;
    let webhooks = Api::<ValidatingWebhookConfiguration>::all(alpha.clone());
    wait_for_object(&webhooks, "kkp-quota-machines", Duration::from_mins(1))
        .await
        .unwrap();

    // The shared group over demo and other selects both (its status lists them).
    let groups = Api::<kkp_quota_crds::QuotaGroup>::all(client_for("master").await);
    wait_for(
        Duration::from_mins(1),
        "the shared group over both projects",
        || {
            let groups = groups.clone();
            async move {
                let status = groups.get(e2e::demo::DEMO_SHARED_GROUP).await.ok()?.status?;
                (status.projects == ["demo", "other"]).then_some(())
            }
        },
    )
    .await
    .unwrap();

    // deploy/examples: the small Machine is admitted and counted up to the master ...
    let machines = Api::<Machine>::namespaced(alpha, "kube-system");
    machines
        .create(&PostParams::default(), &example("machine-small.yaml"))
        .await
        .unwrap();
    let master = Api::<ResourceQuota>::all(client_for("master").await);
    wait_for(
        Duration::from_mins(1),
        "t3.medium in the master's globalUsage",
        || {
            let master = master.clone();
            async move {
                let quota = master.get("project-demo").await.ok()?;
                let usage = quota.status?.global_usage?;
                (usage.cpu == Some("2".parse().unwrap()) && usage.memory == Some("4Gi".parse().unwrap()))
                    .then_some(())
            }
        },
    )
    .await
    .unwrap();
    // ... and the one bigger than the whole quota is refused, saying why.
    let refused = machines
        .create(&PostParams::default(), &example("machine-too-big.yaml"))
        .await
        .unwrap_err();
    let message = refused.to_string();
    assert!(message.contains("worker-too-big"), "{message}");
    assert!(message.contains("needs 32 cpu"), "{message}");
    assert!(message.contains("of 16 cpu"), "{message}");

    groups::the_demo_group_caps_its_allocation(client_for("master").await).await;
    kubectl::what_kubectl_shows_near_the_limit(fleet_dir, seed_a.clone(), master.clone()).await;
    kubectl::the_plugin_answers(fleet_dir).await;
    a_deleted_machine_deployment_frees_its_room(client_for("alpha").await, master.clone()).await;
    rollout::a_rollout_at_full_quota(
        client_for("alpha").await,
        client_for("master").await,
        [client_for("seed-a").await, client_for("seed-b").await],
        master,
    )
    .await;
    clusters::clusters_are_counted(client_for("master").await, client_for("seed-b").await).await;
    clusters::a_projects_first_cluster_on_a_seed_is_admitted(
        client_for("master").await,
        client_for("seed-a").await,
    )
    .await;
    reserved::autoscaler_room_is_shown_reserved(
        fleet_dir,
        client_for("alpha").await,
        client_for("master").await,
    )
    .await;
    reserved_counts::the_autoscalers_room_is_held_under_reserved_counts(
        client_for("alpha").await,
        client_for("master").await,
        client_for("seed-a").await,
    )
    .await;
}

/// Real cascades (kube-controller-manager runs in every cluster of the demo fleet): a deleted
/// `MachineDeployment` takes its `MachineSet` and Machines, and their room comes back.
#[allow(clippy::unwrap_used, reason = "a test helper: a panic is the failure report")]
async fn a_deleted_machine_deployment_frees_its_room(alpha: kube::Client, master: Api<ResourceQuota>) {
    let machines = Api::<Machine>::namespaced(alpha.clone(), "kube-system");
    let deployments = Api::<MachineDeployment>::namespaced(alpha.clone(), "kube-system");
    let sets = Api::<MachineSet>::namespaced(alpha.clone(), "kube-system");
    let deployment = deployments
        .create(
            &PostParams::default(),
            &MachineDeployment::new("workers", MachineDeploymentSpec::default()),
        )
        .await
        .unwrap();
    let mut set = MachineSet::new("workers-5d8f", MachineSetSpec {});
    set.metadata.owner_references = deployment.controller_owner_ref(&()).map(|o| vec![o]);
    let set = sets.create(&PostParams::default(), &set).await.unwrap();
    for name in ["workers-5d8f-a", "workers-5d8f-b"] {
        let mut machine = example("machine-small.yaml");
        machine.metadata.name = Some(name.to_owned());
        machine.metadata.owner_references = set.controller_owner_ref(&()).map(|o| vec![o]);
        machines.create(&PostParams::default(), &machine).await.unwrap();
    }
    let global_cpu = |cpus: i64| {
        let master = master.clone();
        async move {
            let usage = master.get("project-demo").await.ok()?.status?.global_usage?;
            (usage.cpu == Some(cpus.to_string().parse().unwrap())).then_some(())
        }
    };
    wait_for(
        Duration::from_mins(1),
        "3 Machines (6 cpu) in globalUsage",
        || global_cpu(6),
    )
    .await
    .unwrap();
    // Another MachineSet's 12-cpu Machine does not fit beside them (6 + 12 > 16): refused, and
    // its owner remembered by the webhook.
    let waiting = sets
        .create(
            &PostParams::default(),
            &MachineSet::new("big-7f6c", MachineSetSpec {}),
        )
        .await
        .unwrap();
    let mut big = example("machine-small.yaml");
    big.metadata.name = Some("big-7f6c-a".to_owned());
    big.metadata.owner_references = waiting.controller_owner_ref(&()).map(|o| vec![o]);
    big.spec.provider_spec.value.as_mut().unwrap()["cloudProviderSpec"]["instanceType"] =
        serde_json::json!("m5zn.3xlarge");
    let refused = machines.create(&PostParams::default(), &big).await.unwrap_err();
    assert!(refused.to_string().contains("needs 12 cpu"), "{refused}");

    let background = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    deployments.delete("workers", &background).await.unwrap();
    wait_for(
        Duration::from_mins(1),
        "the MachineDeployment's Machines garbage-collected",
        || async {
            let left = machines.list(&ListParams::default()).await.ok()?;
            let names: Vec<String> = left
                .items
                .iter()
                .filter_map(|m| m.metadata.name.clone())
                .collect();
            (names == ["worker-small"]).then_some(())
        },
    )
    .await
    .unwrap();
    assert!(
        sets.get_opt("workers-5d8f").await.unwrap().is_none(),
        "the MachineSet is still there"
    );
    wait_for(
        Duration::from_mins(1),
        "their room back in globalUsage (2 cpu)",
        || global_cpu(2),
    )
    .await
    .unwrap();
    // The room reached the refused MachineSet at once: seed-controller counted the garbage
    // collector's deletes, and the webhook woke the waiting owner (machine-controller would now
    // create its Machine, which fits).
    wait_for(Duration::from_mins(1), "the waiting MachineSet woken", || async {
        let set = sets.get("big-7f6c").await.ok()?;
        set.metadata
            .annotations?
            .contains_key("kkp-quota.dev/room-available-at")
            .then_some(())
    })
    .await
    .unwrap();
    machines.create(&PostParams::default(), &big).await.unwrap();
}

/// The fleet binary, stopped the way it expects (SIGTERM, then up to 30 s for its teardown) when a
/// test ends before it does, so a failed test does not leave a whole fleet running.
struct StopOnDrop(Option<std::process::Child>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        let Some(mut child) = self.0.take() else {
            return;
        };
        let pid = child.id();
        let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
        // Wait for its exit (a thread blocked in wait), at most 30 s; then SIGKILL, which the
        // same thread then reaps.
        let (done, exited) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let _ = child.wait();
            let _ = done.send(());
        });
        if exited.recv_timeout(Duration::from_secs(30)).is_err() {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        }
        let _ = waiter.join();
    }
}

/// What `make demo` runs: one `fleet ready: <dir>` line, the whole quota system working on the
/// demo project (a fitting Machine admitted and counted up to the master, one too big refused
/// with its reason), and a clean exit on SIGTERM.
#[tokio::test(flavor = "multi_thread")]
async fn the_demo_binary_runs_the_system_and_tears_down_on_sigterm() {
    tokio::task::spawn_blocking(e2e::system::build_components)
        .await
        .unwrap()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let fleet_dir = dir.path().join("fleet");
    // Its warnings and errors (a component that exits, with the end of its log) go to the test's
    // output.
    let mut guard = StopOnDrop(Some(
        Command::new(env!("CARGO_BIN_EXE_fleet"))
            .arg("--dir")
            .arg(&fleet_dir)
            .env("RUST_LOG", "warn,kube_client=off")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    ));
    let stdout = guard.0.as_mut().unwrap().stdout.take().unwrap();
    let mut first = String::new();
    let mut reader = BufReader::new(stdout);
    let line = tokio::task::spawn_blocking(move || {
        reader.read_line(&mut first).unwrap();
        (first, reader)
    });
    let (first, mut reader) = tokio::time::timeout(Duration::from_mins(4), line)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first, format!("fleet ready: {}\n", fleet_dir.display()));

    let members: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(fleet_dir.join("fleet.json")).unwrap()).unwrap();
    // The default fleet and `other`'s user cluster `delta` (the demo's shared group).
    assert_eq!(members.len(), 7);
    check_demo_project(&fleet_dir).await;

    let pid = guard.0.as_ref().unwrap().id();
    let processes = procfs::children(pid);
    assert_eq!(
        processes.len(),
        26,
        "etcd, kube-apiserver and kube-controller-manager per cluster, master-controller, a seed-controller and a webhook per seed"
    );
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut child = guard.0.take().unwrap();
    let exit = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(exit.success(), "{exit}");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut reader, &mut rest).unwrap();
    assert_eq!(rest, "", "exactly one line on stdout");
    wait_for(Duration::from_secs(5), "no process left", || async {
        processes.iter().all(|p| !procfs::is_running(*p))
    })
    .await
    .unwrap();
    assert!(
        !fleet_dir.join("fleet.json").exists(),
        "files removed on teardown"
    );
}
