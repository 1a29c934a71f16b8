//! The chart's seed role as pods on a real node (e2e/src/node): seed-a of a small fleet gets a
//! kubelet, the seed images run from the chart, and master-controller runs on the host. One
//! node per machine, so the scenarios run one after another on one fleet (each leaves the pods
//! rolled out for the next), and the last check is that the machine is as it was before.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use e2e::components::{ComponentSpec, spawn};
use e2e::machines::{is_quota_denial, vsphere};
use e2e::node::chart::{self, NAMESPACE, WEBHOOK_CLUSTER_IP};
use e2e::node::{HostSnapshot, NODE_ADDRESS, NODE_NAME, NodeHost, PAUSE_IMAGE};
use e2e::{Fleet, FleetSpec, wait_for, wait_for_object};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kkp_quota_crds::{QuotaLedger, ResourceQuota};
use kube::Api;
use kube::api::{DeleteParams, EvictParams, Patch, PatchParams, PostParams};
use tokio::task::JoinHandle;

#[path = "node/rotation.rs"]
mod rotation;

/// The lease seed-controller's replicas compete for, and how long it lasts (chart default).
const LEASE: &str = "kkp-quota-seed-controller";
const LEASE_DURATION: Duration = Duration::from_secs(15);
const ROLL_OUT: Duration = Duration::from_mins(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_role_runs_as_pods_on_a_real_node() {
    let _ = tracing_subscriber::fmt().with_env_filter("info").try_init();
    let prepared = NodeHost::prepare().unwrap();
    // After any clean-up of an earlier killed run's node, which `prepare` does first.
    let machine_before = prepared.machine_before().clone();
    let spec = FleetSpec::empty()
        .with_seed("seed-a")
        .with_project("demo")
        .with_user_cluster("alpha", "seed-a", "demo")
        .with_controller_managers()
        .with_pod_address(NODE_ADDRESS);
    let fleet = Fleet::start(spec).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    fleet.write_dir(dir.path()).unwrap();
    e2e::system::build_components().unwrap();
    let master = spawn(
        &ComponentSpec::workspace_bin(
            "master-controller",
            vec![
                format!("--kubeconfig={}", dir.path().join("master.kubeconfig").display()),
                format!(
                    "--metrics-address=127.0.0.1:{}",
                    e2e::system::free_port().unwrap()
                ),
            ],
        )
        .unwrap(),
        &dir.path().join("logs"),
    )
    .unwrap();
    let seed = fleet.seed("seed-a");
    let node = prepared.start(seed).await.unwrap();
    chart::import_seed_images(&node).unwrap();
    // A short certificate life, so that the self-managed certificate rotates while the pods
    // serve (a new one staged after 80 s, served 20 s later).
    chart::install_seed(seed, "seed-a", &rotation::SHORT_CERTIFICATES.map(str::to_owned)).unwrap();
    let client = seed.client();
    for component in chart::SEED_COMPONENTS {
        chart::wait_rolled_out(&client, component, ROLL_OUT)
            .await
            .unwrap();
    }

    both_replicas_ready_one_leading(&client).await;
    the_webhook_answers_through_its_service(&fleet).await;
    // Room for every burst below: each scenario checks that no create fails, not the limit.
    e2e::demo::apply_quota(&fleet, &e2e::demo::cpu_quota("demo", "100000"), "node-test")
        .await
        .unwrap();
    the_standby_takes_over_when_the_leader_pod_is_deleted(&fleet, &client).await;
    a_drain_is_refused_the_second_replica(seed).await;
    an_upgrade_rolls_the_pods_without_a_failed_create(&fleet, seed).await;
    rotation::the_certificate_rotates_while_the_pods_serve(&fleet, &client, node.dir()).await;

    drop(master);
    let started = Instant::now();
    let left = node.teardown().unwrap();
    println!("node teardown took {:?}", started.elapsed());
    assert!(left.is_empty(), "the node left the machine changed: {left:#?}");

    // A test process killed before its teardown leaves its node running with pods: the next
    // node cleans up after it first, and its own teardown leaves the machine as it was.
    let abandoned = NodeHost::prepare().unwrap().start(seed).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(seed.client(), "default");
    pods.create(&PostParams::default(), &pause_pod("left-behind"))
        .await
        .unwrap();
    wait_for(Duration::from_mins(1), "a pod running on the node", || async {
        (pods.get("left-behind").await.ok()?.status?.phase? == "Running").then_some(())
    })
    .await
    .unwrap();
    abandoned.abandon();
    let next = NodeHost::prepare().unwrap();
    drop(next);
    let left = machine_before.differences(&HostSnapshot::take().unwrap());
    assert!(left.is_empty(), "a killed node's leftovers: {left:#?}");
}

/// A pod of the sandbox image alone (the only image the node has besides the chart's).
fn pause_pod(name: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "automountServiceAccountToken": false,
            "containers": [{"name": "pause", "image": PAUSE_IMAGE, "imagePullPolicy": "Never"}],
        },
    }))
    .unwrap()
}

async fn both_replicas_ready_one_leading(client: &kube::Client) {
    let controllers = chart::pods_of(client, "seed-controller").await.unwrap();
    assert_eq!(controllers.len(), 2);
    assert!(
        controllers.iter().all(chart::is_ready),
        "both Ready through their probes"
    );
    let holder = lease_holder(client).await.unwrap();
    let names = names(&controllers);
    assert!(names.contains(&holder), "{holder} leads, the pods are {names:?}");
    let webhooks = chart::pods_of(client, "machine-webhook").await.unwrap();
    assert_eq!(webhooks.len(), 2);
    assert!(webhooks.iter().all(chart::is_ready));
}

/// The user cluster's API server (a process on the host) calls the webhook at the Service's
/// `ClusterIP`: a fitting Machine is admitted, one too big refused with the quota's message, and
/// the admitted one is counted up to the master.
async fn the_webhook_answers_through_its_service(fleet: &Fleet) {
    e2e::demo::apply_quota(fleet, &e2e::demo::cpu_quota("demo", "8"), "node-test")
        .await
        .unwrap();
    let webhooks = Api::<ValidatingWebhookConfiguration>::all(fleet.user_cluster("alpha").client());
    wait_for_object(&webhooks, "kkp-quota-machines", Duration::from_mins(1))
        .await
        .unwrap();
    let ledgers = Api::<QuotaLedger>::all(fleet.seed("seed-a").client());
    wait_for_object(&ledgers, "project-demo", Duration::from_mins(1))
        .await
        .unwrap();
    // kube-proxy programs the Service's endpoints a moment after the pods are Ready.
    wait_for(
        Duration::from_mins(1),
        "the webhook Service accepting connections",
        || async {
            tokio::net::TcpStream::connect((WEBHOOK_CLUSTER_IP, 443))
                .await
                .ok()
                .map(drop)
        },
    )
    .await
    .unwrap();
    // The API server calls the webhook by the ClusterIP, so every pod behind it must serve a
    // certificate naming that IP. The first Machine was twice refused for a served certificate
    // without it (CI and one local run); wait until six connections in a row are served a right
    // one, and say how long that took.
    let started = Instant::now();
    wait_for(
        Duration::from_mins(2),
        "every webhook pod serving a certificate for the ClusterIP",
        || async {
            for _ in 0..6 {
                let pem = rotation::served_certificate()
                    .await
                    .ok_or_else(|| "no certificate served".to_owned())?;
                let names = rotation::x509(&pem, &["-ext", "subjectAltName"]);
                if !names.contains(&format!("IP Address:{WEBHOOK_CLUSTER_IP}")) {
                    return Err(format!("served: {names}"));
                }
            }
            Ok(())
        },
    )
    .await
    .unwrap();
    eprintln!(
        "the webhook Service served certificates for its ClusterIP {:?} after its connections were accepted",
        started.elapsed()
    );
    let machines = e2e::machines::api(fleet, "alpha");
    if let Err(e) = machines
        .create(&PostParams::default(), &vsphere("first", 2))
        .await
    {
        // Seen once: the API server found no IP SAN in the served certificate. Say what it was.
        let served = rotation::served_certificate().await;
        let text = served.map_or_else(|| "nothing".to_owned(), |pem| rotation::x509(&pem, &["-text"]));
        panic!("the first Machine: {e}\nthe webhook Service serves:\n{text}");
    }
    let denied = machines
        .create(&PostParams::default(), &vsphere("too-big", 7))
        .await
        .unwrap_err();
    assert!(is_quota_denial(&denied, "demo"), "{denied}");
    // Counted by the seed-controller pod and folded up to the master.
    let master = Api::<ResourceQuota>::all(fleet.master().client());
    wait_for(
        Duration::from_mins(1),
        "2 cpu in the master's globalUsage",
        || async {
            let usage = master.get("project-demo").await.ok()?.status?.global_usage?;
            (usage.cpu == Some("2".parse().unwrap())).then_some(())
        },
    )
    .await
    .unwrap();
}

/// The seed-controller pod holding the lease is deleted while Machines are created: the other
/// replica takes the lease, and no create fails meanwhile.
async fn the_standby_takes_over_when_the_leader_pod_is_deleted(fleet: &Fleet, client: &kube::Client) {
    let burst = Burst::start(fleet, "handover");
    let leader = lease_holder(client).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let deleted = Instant::now();
    pods.delete(&leader, &DeleteParams::default()).await.unwrap();
    wait_for(LEASE_DURATION * 4, "another replica leads", || async {
        lease_holder(client).await.filter(|h| *h != leader)
    })
    .await
    .unwrap();
    println!(
        "handover: a new leader {:?} after the leader pod was deleted",
        deleted.elapsed()
    );
    chart::wait_rolled_out(client, "seed-controller", ROLL_OUT)
        .await
        .unwrap();
    burst.stop_expecting_no_failure().await;
}

/// A drain of the node (cordoned, then every pod evicted, as `kubectl drain` does) evicts one
/// replica of each Deployment and is refused the second by its `PodDisruptionBudget`
/// (minAvailable 1): the evicted one's replacement cannot be scheduled, so the budget stays
/// spent. Uncordoned, the replacements run.
async fn a_drain_is_refused_the_second_replica(seed: &e2e::ControlPlane) {
    let client = &seed.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let cordon = |unschedulable: bool| {
        let nodes = nodes.clone();
        async move {
            let patch = serde_json::json!({"spec": {"unschedulable": unschedulable}});
            nodes
                .patch(NODE_NAME, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
        }
    };
    // kube's client retries a 429 (a refused eviction is one) for minutes by default.
    let mut config = seed.config();
    config.default_retry = false;
    let pods: Api<Pod> = Api::namespaced(kube::Client::try_from(config).unwrap(), NAMESPACE);
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), NAMESPACE);
    cordon(true).await;
    for component in chart::SEED_COMPONENTS {
        let name = format!("kkp-quota-{component}");
        wait_for(
            Duration::from_mins(1),
            &format!("{name} allows one disruption"),
            || async {
                let status = budgets.get(&name).await.ok()?.status?;
                (status.disruptions_allowed == Some(1)).then_some(())
            },
        )
        .await
        .unwrap();
        let replicas = names(&chart::pods_of(client, component).await.unwrap());
        assert_eq!(replicas.len(), 2);
        pods.evict(&replicas[0], &EvictParams::default()).await.unwrap();
        let refused = pods
            .evict(&replicas[1], &EvictParams::default())
            .await
            .unwrap_err();
        assert!(
            matches!(&refused, kube::Error::Api(s) if s.code == 429),
            "{component}: the second eviction: {refused}"
        );
        assert!(
            pods.get(&replicas[1])
                .await
                .unwrap()
                .metadata
                .deletion_timestamp
                .is_none()
        );
    }
    cordon(false).await;
    for component in chart::SEED_COMPONENTS {
        chart::wait_rolled_out(client, component, ROLL_OUT).await.unwrap();
    }
}

/// `helm upgrade` changing a flag of each Deployment rolls every pod to the new flags while
/// Machines are created, and no create fails.
async fn an_upgrade_rolls_the_pods_without_a_failed_create(fleet: &Fleet, seed: &e2e::ControlPlane) {
    let burst = Burst::start(fleet, "upgrade");
    let upgraded = Instant::now();
    chart::helm(
        seed,
        &["upgrade", "kkp-quota", e2e::chart::CHART, "--reuse-values"],
        &[
            "machineWebhook.maxBatch=128".to_owned(),
            "seedController.userClusterTimeout=14s".to_owned(),
        ],
    )
    .unwrap();
    let client = seed.client();
    for component in chart::SEED_COMPONENTS {
        chart::wait_rolled_out(&client, component, ROLL_OUT)
            .await
            .unwrap();
    }
    println!("upgrade: rolled out {:?} after helm upgrade", upgraded.elapsed());
    for (component, flag) in [
        ("machine-webhook", "--max-batch=128"),
        ("seed-controller", "--user-cluster-timeout=14s"),
    ] {
        for pod in chart::pods_of(&client, component).await.unwrap() {
            let args = pod.spec.unwrap().containers[0].args.clone().unwrap_or_default();
            assert!(args.iter().any(|a| a == flag), "{component}: {args:?}");
        }
    }
    burst.stop_expecting_no_failure().await;
}

/// Machines created one after another by two clients of the user cluster, until stopped.
pub struct Burst {
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<(usize, Vec<String>)>>,
    what: &'static str,
}

impl Burst {
    pub fn start(fleet: &Fleet, what: &'static str) -> Burst {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..2)
            .map(|client| {
                let machines = e2e::machines::api(fleet, "alpha");
                let stop = stop.clone();
                tokio::spawn(async move {
                    let (mut created, mut failures) = (0, Vec::new());
                    let mut i = 0;
                    // A steady pace (at most 10 creates a second per client), not a wait.
                    let mut pace = tokio::time::interval(Duration::from_millis(100));
                    while !stop.load(Ordering::Relaxed) {
                        pace.tick().await;
                        let name = format!("{what}-{client}-{i}");
                        i += 1;
                        match machines.create(&PostParams::default(), &vsphere(&name, 1)).await {
                            Ok(_) => created += 1,
                            Err(e) => failures.push(format!("{name}: {e}")),
                        }
                    }
                    (created, failures)
                })
            })
            .collect();
        Burst { stop, tasks, what }
    }

    pub async fn stop_expecting_no_failure(self) {
        self.stop.store(true, Ordering::Relaxed);
        let (mut created, mut failures) = (0, Vec::new());
        for task in self.tasks {
            let (c, f) = task.await.unwrap();
            created += c;
            failures.extend(f);
        }
        println!(
            "{}: {created} Machines created, {} failed",
            self.what,
            failures.len()
        );
        assert!(created > 0, "{}: nothing was created", self.what);
        assert!(
            failures.is_empty(),
            "{}: creates failed: {failures:#?}",
            self.what
        );
    }
}

async fn lease_holder(client: &kube::Client) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    leases
        .get(LEASE)
        .await
        .ok()?
        .spec?
        .holder_identity
        .filter(|h| !h.is_empty())
}

fn names(pods: &[Pod]) -> Vec<String> {
    pods.iter().filter_map(|p| p.metadata.name.clone()).collect()
}

/// The webhook's serving certificate as the Secret holds it.
pub async fn secret_certificate(client: &kube::Client) -> Option<String> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let secret = secrets.get("kkp-quota-webhook-tls").await.ok()?;
    let pem = secret.data?.get("tls.crt")?.0.clone();
    String::from_utf8(pem).ok().filter(|p| !p.is_empty())
}
