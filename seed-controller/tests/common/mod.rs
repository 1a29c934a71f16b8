//! Shared set-up for the seed-controller's tests on real apiservers: a seed, user clusters
//! registered on it the way KKP does, quota copies, Machines, and the controller in-process.

#![allow(dead_code, clippy::unwrap_used, clippy::missing_panics_doc)]

use std::collections::BTreeMap;
use std::time::Duration;

use e2e::ControlPlane;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::events::v1::Event as KubeEvent;
use kkp_quota_crds::kkp::{ADMIN_KUBECONFIG_SECRET, Cluster, KUBECONFIG_KEY, PROJECT_ID_LABEL};
use kkp_quota_crds::machine::Machine;
use kkp_quota_crds::quota::{PROJECT_KIND, SUBJECT_KIND_LABEL, SUBJECT_NAME_LABEL};
use kkp_quota_crds::{LedgerSubject, Quantity, QuotaLedger, QuotaLedgerSpec, Resource, ResourceDetails};
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use provider_sizes::{SizeCatalog, size_machine};
use seed_controller::usage::same_usage;
use seed_controller::{Config, Controller, Metrics};
use serde_json::{Value, json};
use tokio_util::task::AbortOnDropHandle;

pub const WAIT: Duration = Duration::from_secs(90);

pub fn init_logs() {
    kkp_quota_runtime::telemetry::init_tracing(false);
}

pub async fn ensure_namespace(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("namespace {name}: {e}"),
    }
}

/// Registers a user cluster on the seed as KKP does: `Cluster` labelled with its project,
/// `status.namespaceName`, and the admin kubeconfig Secret in that namespace.
pub async fn register_cluster(seed: &Client, name: &str, project: &str, kubeconfig: &str) {
    let namespace = format!("cluster-{name}");
    ensure_namespace(seed, &namespace).await;
    write_kubeconfig_secret(seed, &namespace, kubeconfig).await;
    let clusters: Api<Cluster> = Api::all(seed.clone());
    let cluster = e2e::fleet::project_cluster(name, project);
    clusters.create(&PostParams::default(), &cluster).await.unwrap();
    clusters
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"namespaceName": namespace}})),
        )
        .await
        .unwrap();
}

pub async fn write_kubeconfig_secret(seed: &Client, namespace: &str, kubeconfig: &str) {
    let secrets: Api<Secret> = Api::namespaced(seed.clone(), namespace);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(ADMIN_KUBECONFIG_SECRET.into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            KUBECONFIG_KEY.to_owned(),
            ByteString(kubeconfig.as_bytes().to_vec()),
        )])),
        ..Secret::default()
    };
    secrets
        .patch(
            ADMIN_KUBECONFIG_SECRET,
            &PatchParams::apply("test").force(),
            &Patch::Apply(&secret),
        )
        .await
        .unwrap();
}

/// The seed's copy of a project's quota (normally the master-controller's job).
pub async fn create_quota_copy(seed: &Client, project: &str, cpu_limit: &str) {
    let api: Api<QuotaLedger> = Api::all(seed.clone());
    let quota: ResourceDetails = serde_json::from_value(json!({"cpu": cpu_limit})).unwrap();
    let mut rq = QuotaLedger::new(
        &format!("project-{project}"),
        QuotaLedgerSpec {
            rollout_allowance: None,
            subject: LedgerSubject::project(project),
            quota,
            shares: None,
            reserved_counts: false,
        },
    );
    rq.metadata.labels = Some(BTreeMap::from([
        (SUBJECT_NAME_LABEL.to_owned(), project.to_owned()),
        (SUBJECT_KIND_LABEL.to_owned(), PROJECT_KIND.to_owned()),
    ]));
    api.create(&PostParams::default(), &rq).await.unwrap();
}

pub fn aws(instance_type: &str) -> Value {
    json!({"cloudProvider": "aws", "cloudProviderSpec": {"instanceType": instance_type, "diskSize": 50, "region": "eu-central-1"}, "operatingSystem": "ubuntu"})
}

pub fn hetzner(server_type: &str) -> Value {
    json!({"cloudProvider": "hetzner", "cloudProviderSpec": {"serverType": server_type, "datacenter": "fsn1-dc14"}, "operatingSystem": "ubuntu"})
}

pub fn vsphere(cpus: i64, memory_mb: i64, disk_gb: i64) -> Value {
    json!({"cloudProvider": "vsphere", "cloudProviderSpec": {"cpus": cpus, "memoryMB": memory_mb, "diskSizeGB": disk_gb, "templateVMName": "ubuntu-22.04"}, "operatingSystem": "ubuntu"})
}

pub fn machine(name: &str, provider_spec: &Value) -> Machine {
    serde_json::from_value(json!({
        "apiVersion": "cluster.k8s.io/v1alpha1",
        "kind": "Machine",
        "metadata": {"name": name, "namespace": "kube-system"},
        "spec": {"providerSpec": {"value": provider_spec}, "versions": {"kubelet": "1.31.0"}},
    }))
    .unwrap()
}

/// Creates a Machine in a user cluster's `kube-system` and returns it (with its UID).
pub async fn create_machine(user: &Client, name: &str, provider_spec: &Value) -> Machine {
    create_machine_in(user, "kube-system", name, provider_spec).await
}

pub async fn create_machine_in(user: &Client, namespace: &str, name: &str, provider_spec: &Value) -> Machine {
    let api: Api<Machine> = Api::namespaced(user.clone(), namespace);
    let mut m = machine(name, provider_spec);
    m.metadata.namespace = Some(namespace.into());
    api.create(&PostParams::default(), &m).await.unwrap()
}

/// Deletes a Machine and waits until it is gone.
pub async fn delete_machine(user: &Client, name: &str) {
    let api: Api<Machine> = Api::namespaced(user.clone(), "kube-system");
    api.delete(name, &DeleteParams::default()).await.unwrap();
    e2e::wait_for(WAIT, &format!("machine {name} gone"), || {
        let api = api.clone();
        async move { matches!(api.get_opt(name).await, Ok(None)) }
    })
    .await
    .unwrap();
}

/// What the shipped catalog says a provider spec costs (provider-sizes is the oracle).
pub fn size_of(provider_spec: &Value) -> ResourceDetails {
    size_machine(&machine("x", provider_spec), &SizeCatalog::shipped(), None).unwrap()
}

pub fn sum(sizes: &[&ResourceDetails]) -> ResourceDetails {
    ResourceDetails::checked_sum(sizes.iter().copied()).unwrap()
}

pub async fn cluster_usage(seed: &Client, name: &str) -> Option<ResourceDetails> {
    let api: Api<Cluster> = Api::all(seed.clone());
    api.get(name).await.ok()?.status?.resource_usage
}

pub async fn local_usage(seed: &Client, project: &str) -> Option<ResourceDetails> {
    let api: Api<QuotaLedger> = Api::all(seed.clone());
    api.get(&format!("project-{project}"))
        .await
        .ok()?
        .status?
        .local_usage
}

/// Waits until the Cluster's `status.resourceUsage` equals `expected` exactly, in KKP's shape:
/// cpu, memory and storage (KKP's Cluster keeps nothing else; the rest is in the metrics).
pub async fn wait_cluster_usage(seed: &Client, name: &str, expected: &ResourceDetails) {
    let expected = &expected.kkp_subset();
    e2e::wait_for(
        WAIT,
        &format!("Cluster {name} resourceUsage = {expected}"),
        || async {
            match cluster_usage(seed, name).await {
                Some(u) if u == *expected => Ok(()),
                other => Err(format!("is {}", other.map(|u| u.to_string()).unwrap_or_default())),
            }
        },
    )
    .await
    .unwrap();
}

/// How many `Cluster`s of `project` the seed holds now.
pub async fn clusters_of(seed: &Client, project: &str) -> Option<i64> {
    let api: Api<Cluster> = Api::all(seed.clone());
    let listed = api
        .list(&ListParams::default().labels(&format!("{PROJECT_ID_LABEL}={project}")))
        .await
        .ok()?;
    i64::try_from(listed.items.len()).ok()
}

/// `machines` (the sizes of the project's Machines) with `clusters` one for each of the
/// project's `Cluster`s on the seed now: the project's `localUsage` (`-1` clusters if the list
/// fails, which no count matches).
pub async fn with_clusters(seed: &Client, project: &str, machines: &ResourceDetails) -> ResourceDetails {
    let mut usage = machines.clone();
    let clusters = clusters_of(seed, project).await.unwrap_or(-1);
    usage.set(Resource::Clusters, Some(Quantity::from_units(clusters)));
    usage
}

/// Waits until the seed copy's `status.localUsage` is exactly [`with_clusters`] of `machines`.
pub async fn wait_local_usage(seed: &Client, project: &str, machines: &ResourceDetails) {
    e2e::wait_for(
        WAIT,
        &format!("project {project} localUsage = {machines} and its clusters"),
        || async {
            let expected = with_clusters(seed, project, machines).await;
            match local_usage(seed, project).await {
                Some(u) if same_usage(&u, &expected) => Ok(()),
                other => Err(format!(
                    "is {}, not {expected}",
                    other.map(|u| u.to_string()).unwrap_or_default()
                )),
            }
        },
    )
    .await
    .unwrap();
}

pub async fn condition(seed: &Client, cluster: &str) -> Option<kkp_quota_crds::kkp::ClusterCondition> {
    let api: Api<Cluster> = Api::all(seed.clone());
    api.get(cluster)
        .await
        .ok()?
        .status?
        .conditions
        .get(seed_controller::CONDITION_TYPE)
        .cloned()
}

pub async fn wait_condition(
    seed: &Client,
    cluster: &str,
    status: &str,
    reason: &str,
) -> kkp_quota_crds::kkp::ClusterCondition {
    e2e::wait_for(
        WAIT,
        &format!("Cluster {cluster} condition {status}/{reason}"),
        || async {
            match condition(seed, cluster).await {
                Some(c) if c.status == status && c.reason == reason => Ok(c),
                other => Err(format!("is {other:?}")),
            }
        },
    )
    .await
    .unwrap()
}

/// Events on a Machine with a reason.
pub async fn machine_events(user: &Client, machine: &str, reason: &str) -> Vec<KubeEvent> {
    let api: Api<KubeEvent> = Api::namespaced(user.clone(), "kube-system");
    api.list(&kube::api::ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(machine)
                && e.reason.as_deref() == Some(reason)
        })
        .collect()
}

pub async fn wait_machine_event(user: &Client, machine: &str, reason: &str) -> KubeEvent {
    e2e::wait_for(WAIT, &format!("Event {reason} on Machine {machine}"), || async {
        machine_events(user, machine, reason).await.into_iter().next()
    })
    .await
    .unwrap()
}

/// A metric's value with these labels (all of them), if exported.
pub fn metric(metrics: &Metrics, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    for family in metrics.registry.gather() {
        if family.name() != name {
            continue;
        }
        for m in family.get_metric() {
            let matches = labels
                .iter()
                .all(|(k, v)| m.get_label().iter().any(|l| l.name() == *k && l.value() == *v));
            if matches {
                let value = if family.get_field_type() == prometheus::proto::MetricType::GAUGE {
                    m.get_gauge().get_value()
                } else {
                    m.get_counter().get_value()
                };
                return Some(value);
            }
        }
    }
    None
}

/// Waits until a metric with these labels reaches `at_least`. The controller counts what a
/// write did once the write has returned, so a test that already sees the write may read the
/// metric a moment too early.
pub async fn wait_metric_at_least(metrics: &Metrics, name: &str, labels: &[(&str, &str)], at_least: f64) {
    e2e::wait_for(WAIT, &format!("{name} at least {at_least}"), || async {
        metric(metrics, name, labels).unwrap_or(0.0) >= at_least
    })
    .await
    .unwrap();
}

/// A running controller; dropping it (or [`Running::stop`]) stops every task it started.
pub struct Running {
    pub metrics: Metrics,
    pub readiness: kkp_quota_runtime::ops::Readiness,
    task: Option<AbortOnDropHandle<Result<(), seed_controller::Error>>>,
}

impl Running {
    /// Waits until the controller reports ready (caches synced, lease held).
    pub async fn wait_ready(&self) {
        e2e::wait_for(WAIT, "controller ready", || async { self.readiness.is_ready() })
            .await
            .unwrap();
    }

    /// `kkp_quota_unadmitted_machines_total` of `cluster` (`None` before the first).
    pub fn unadmitted(&self, cluster: &str) -> Option<f64> {
        metric(
            &self.metrics,
            "kkp_quota_unadmitted_machines_total",
            &[("cluster", cluster)],
        )
    }

    /// Waits until `kkp_quota_unadmitted_machines_total` of `cluster` reaches `at_least`: a test
    /// that already sees the Event flagging a Machine may read the counter a moment early.
    pub async fn wait_unadmitted(&self, cluster: &str, at_least: f64) {
        wait_metric_at_least(
            &self.metrics,
            "kkp_quota_unadmitted_machines_total",
            &[("cluster", cluster)],
            at_least,
        )
        .await;
    }

    pub async fn stop(mut self) {
        if let Some(mut task) = self.task.take() {
            task.abort();
            let _ = (&mut task).await;
        }
    }
}

pub async fn start_controller(seed: &ControlPlane, config: Config) -> Running {
    let controller = Controller::new(config, seed.client()).await.unwrap();
    let metrics = controller.metrics().clone();
    let readiness = controller.readiness();
    let task = AbortOnDropHandle::new(tokio::spawn(controller.run()));
    Running {
        metrics,
        readiness,
        task: Some(task),
    }
}

pub fn uid(m: &Machine) -> String {
    m.uid().unwrap()
}

/// Records every version of project `demo`'s quota copy on the seed from the moment it starts,
/// so a test can check a property of each version a reader could have seen.
pub struct QuotaVersions {
    versions: std::sync::Arc<std::sync::Mutex<Vec<QuotaLedger>>>,
    _watch: AbortOnDropHandle<()>,
}

impl QuotaVersions {
    /// Starts recording and waits until the current version is recorded.
    pub async fn start(seed: &Client) -> QuotaVersions {
        use futures::StreamExt as _;
        use kube::runtime::watcher::{self, Event};
        let versions: std::sync::Arc<std::sync::Mutex<Vec<QuotaLedger>>> = std::sync::Arc::default();
        let sink = std::sync::Arc::clone(&versions);
        let api: Api<QuotaLedger> = Api::all(seed.clone());
        let watch = AbortOnDropHandle::new(tokio::spawn(async move {
            let mut stream = watcher::watcher(
                api,
                watcher::Config::default().fields("metadata.name=project-demo"),
            )
            .boxed();
            while let Some(Ok(event)) = stream.next().await {
                if let Event::Apply(rq) | Event::InitApply(rq) = event {
                    sink.lock().unwrap().push(rq);
                }
            }
        }));
        let recorder = QuotaVersions {
            versions,
            _watch: watch,
        };
        e2e::wait_for(
            Duration::from_secs(30),
            "recorder saw the current version",
            || async { recorder.last().is_some() },
        )
        .await
        .unwrap();
        recorder
    }

    pub fn last(&self) -> Option<QuotaLedger> {
        self.versions.lock().unwrap().last().cloned()
    }

    pub fn all(&self) -> Vec<QuotaLedger> {
        self.versions.lock().unwrap().clone()
    }

    /// Waits until the newest version seen has no reservation left and `localUsage` equal to
    /// `machines` and the project's clusters on `seed` (the ledger has settled), so that
    /// [`Self::all`] holds the whole story.
    pub async fn wait_settled(&self, seed: &Client, machines: &ResourceDetails) {
        let usage = &with_clusters(seed, "demo", machines).await;
        e2e::wait_for(WAIT, "recorder saw the final version", || async {
            self.last().is_some_and(|rq| {
                let s = rq.status.clone().unwrap_or_default();
                s.reservations.is_empty() && s.local_usage.is_some_and(|u| same_usage(&u, usage))
            })
        })
        .await
        .unwrap();
    }
}

/// Project `demo`'s quota copy's status on the seed.
pub async fn quota_status(seed: &Client) -> kkp_quota_crds::QuotaLedgerStatus {
    Api::<QuotaLedger>::all(seed.clone())
        .get("project-demo")
        .await
        .unwrap()
        .status
        .unwrap_or_default()
}

/// A seed and one user cluster `alpha` of project `demo` registered on it, with the project's
/// quota copy limiting cpu to `quota_cpu`: `(seed, alpha)` control planes.
pub async fn seed_with_alpha(quota_cpu: &str) -> (ControlPlane, ControlPlane) {
    let (seed_cp, alpha_cp) =
        tokio::try_join!(ControlPlane::start("seed"), ControlPlane::start("alpha")).unwrap();
    let seed = seed_cp.client();
    ensure_namespace(&seed, "kubermatic").await;
    register_cluster(&seed, "alpha", "demo", &alpha_cp.kubeconfig_yaml()).await;
    create_quota_copy(&seed, "demo", quota_cpu).await;
    (seed_cp, alpha_cp)
}

/// A reservation as machine-webhook writes it (reserved = size: a create), made `age` ago.
pub fn reservation(
    cluster: &str,
    uid: &str,
    size: &ResourceDetails,
    age: jiff::SignedDuration,
) -> kkp_quota_crds::ledger::Reservation {
    kkp_quota_crds::ledger::Reservation {
        cluster: cluster.into(),
        uid: uid.into(),
        size: size.clone(),
        reserved: size.clone(),
        created_at: jiff::Timestamp::now() - age,
        deployment: None,
    }
}

/// The UID of the `Cluster` named `cluster` on the seed (what its webhook token is signed over).
pub async fn cluster_uid(seed: &Client, cluster: &str) -> String {
    Api::<kkp_quota_crds::kkp::Cluster>::all(seed.clone())
        .get(cluster)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap()
}
