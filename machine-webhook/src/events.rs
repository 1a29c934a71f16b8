//! Events about denials, where a user looks: on the Machine's `MachineDeployment` (or `MachineSet`)
//! in the user cluster, else on the `Cluster` on the seed.
//!
//! Sent from a background task, so an admission answer never waits for them. Deduplicated: the
//! same message on the same object within the window bumps the existing Event's `count` instead
//! of creating another (a `MachineSet` retries a denied create again and again, each time with a
//! new generated name; the Event message leaves the name out for that reason).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kkp_quota_crds::kkp::Cluster;
use kkp_quota_runtime::chain::Chain;
use kube::api::{DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource as _};
use serde_json::json;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::cache::SeedCache;
use crate::decision::rollout_blocked;
use crate::metrics::Metrics;
use crate::owners::{self, owner, reconciling_owner};
use crate::user_clients::UserClients;

/// The component name on Events.
pub const COMPONENT: &str = "kkp-quota-machine-webhook";

/// One denial to tell a user about.
#[derive(Debug, Clone)]
pub struct DenialEvent {
    pub cluster: String,
    pub machine_namespace: String,
    pub owners: Vec<OwnerReference>,
    /// `QuotaExceeded`, `Unsizeable`, ...
    pub reason: String,
    pub message: String,
}

/// Hands denials to the background sender.
#[derive(Clone, Debug)]
pub struct Events {
    tx: mpsc::Sender<DenialEvent>,
    metrics: Metrics,
}

impl Events {
    /// Never waits: when the queue is full the event is dropped (and counted).
    pub fn emit(&self, event: DenialEvent) {
        if self.tx.try_send(event).is_err() {
            self.metrics.events.with_label_values(&["dropped"]).inc();
        }
    }
}

/// Where an Event goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Target {
    /// An object in the user cluster.
    User { cluster: String, reference: ObjectRef },
    /// The `Cluster` on the seed.
    Seed { reference: ObjectRef },
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ObjectRef {
    api_version: String,
    kind: String,
    namespace: Option<String>,
    name: String,
    uid: String,
}

impl ObjectRef {
    fn to_reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some(self.api_version.clone()),
            kind: Some(self.kind.clone()),
            namespace: self.namespace.clone(),
            name: Some(self.name.clone()),
            uid: Some(self.uid.clone()),
            ..ObjectReference::default()
        }
    }

    fn from_owner(owner: &OwnerReference, namespace: &str) -> ObjectRef {
        ObjectRef {
            api_version: owner.api_version.clone(),
            kind: owner.kind.clone(),
            namespace: Some(namespace.to_owned()),
            name: owner.name.clone(),
            uid: owner.uid.clone(),
        }
    }
}

struct Sent {
    name: String,
    count: i32,
    first: Instant,
}

struct Sender {
    seed: Client,
    cache: Arc<SeedCache>,
    metrics: Metrics,
    window: Duration,
    clients: UserClients,
    sent: HashMap<(Target, String, String), Sent>,
}

/// Starts the background sender; the returned future runs it until dropped.
pub fn start(
    seed: Client,
    cache: Arc<SeedCache>,
    metrics: Metrics,
    window: Duration,
) -> (Events, impl Future<Output = ()>) {
    let (tx, rx) = mpsc::channel(1024);
    let events = Events {
        tx,
        metrics: metrics.clone(),
    };
    let clients = UserClients::new(seed.clone());
    let sender = Sender {
        seed,
        cache,
        metrics,
        window,
        clients,
        sent: HashMap::new(),
    };
    (events, sender.run(rx))
}

/// Whether a `MachineDeployment` is replacing its Machines: some of them are not of its current
/// template yet (`status.updatedReplicas` below `status.replicas`), or its controller has not
/// seen its latest spec.
fn rolling_out(deployment: &DynamicObject) -> bool {
    let status = &deployment.data["status"];
    let count = |field: &str| status[field].as_i64().unwrap_or(0);
    let observed = status["observedGeneration"].as_i64();
    let generation = deployment.metadata.generation;
    count("updatedReplicas") < count("replicas")
        || matches!((observed, generation), (Some(o), Some(g)) if o < g)
}

/// Why a denial Event could not be recorded.
#[derive(Debug, thiserror::Error)]
enum SendError {
    #[error("the Machine's cluster {0} is not in the seed's cache")]
    UnknownCluster(String),
    #[error("counting a repeat on the Event")]
    Update(#[source] kube::Error),
    #[error("creating the Event")]
    Create(#[source] kube::Error),
}

impl Sender {
    async fn run(mut self, mut rx: mpsc::Receiver<DenialEvent>) {
        while let Some(event) = rx.recv().await {
            match self.send(&event).await {
                Ok(result) => self.metrics.events.with_label_values(&[result]).inc(),
                Err(e) => {
                    self.metrics.events.with_label_values(&["failed"]).inc();
                    self.clients.forget(&event.cluster);
                    warn!(error = %Chain(&e), cluster = %event.cluster, "could not record a denial event");
                }
            }
            let window = self.window;
            self.sent.retain(|_, s| s.first.elapsed() < window);
        }
    }

    /// The `MachineDeployment` owning the Machine's `MachineSet`, else the `MachineSet`, else the
    /// `MachineDeployment` owning the Machine directly, else `None`; and whether that
    /// `MachineDeployment` is rolling out.
    async fn owner_in_user_cluster(&self, client: &Client, event: &DenialEvent) -> Option<(ObjectRef, bool)> {
        let ns = &event.machine_namespace;
        let deployment = if let Some(set) = owner(&event.owners, "MachineSet") {
            let Ok(Some(object)) = owners::read(client, ns, set, "MachineSet").await else {
                return Some((ObjectRef::from_owner(set, ns), false));
            };
            let Some(deployment) = owners::deployment_of(&object) else {
                return Some((ObjectRef::from_owner(set, ns), false));
            };
            deployment.clone()
        } else {
            owner(&event.owners, "MachineDeployment")?.clone()
        };
        let rolling_out = matches!(
            owners::read(client, ns, &deployment, "MachineDeployment").await,
            Ok(Some(d)) if rolling_out(&d)
        );
        Some((ObjectRef::from_owner(&deployment, ns), rolling_out))
    }

    /// Where the Event goes, the client for it, and whether the owner is rolling out.
    async fn target(&mut self, cluster: &Cluster, event: &DenialEvent) -> (Target, Client, bool) {
        if reconciling_owner(&event.owners).is_some() {
            match self.clients.get(cluster).await {
                Ok(client) => {
                    if let Some((reference, rolling)) = self.owner_in_user_cluster(&client, event).await {
                        let target = Target::User {
                            cluster: event.cluster.clone(),
                            reference,
                        };
                        return (target, client, rolling);
                    }
                }
                Err(e) => {
                    debug!(error = %Chain(&e), "user cluster unreachable; the event goes to the Cluster on the seed");
                }
            }
        }
        let target = Target::Seed {
            reference: ObjectRef {
                api_version: Cluster::api_version(&()).into_owned(),
                kind: Cluster::kind(&()).into_owned(),
                namespace: None,
                name: cluster.metadata.name.clone().unwrap_or_default(),
                uid: cluster.metadata.uid.clone().unwrap_or_default(),
            },
        };
        (target, self.seed.clone(), false)
    }

    async fn send(&mut self, event: &DenialEvent) -> Result<&'static str, SendError> {
        let cluster = self
            .cache
            .cluster(&event.cluster)
            .ok_or_else(|| SendError::UnknownCluster(event.cluster.clone()))?;
        let (target, client, rolling_out) = self.target(&cluster, event).await;
        let rollout = rolling_out && event.reason == "QuotaExceeded";
        let reference = match &target {
            Target::User { reference, .. } | Target::Seed { reference } => reference.clone(),
        };
        // Events about cluster-scoped objects live in `default`.
        let namespace = reference.namespace.clone().unwrap_or_else(|| "default".into());
        let api: Api<Event> = Api::namespaced(client, &namespace);
        let now = Time(Timestamp::now());
        // A rollout at full quota: the Event says what blocks it and both ways out.
        let message = if rollout {
            rollout_blocked(event.message.strip_prefix("a ").unwrap_or(&event.message))
        } else {
            event.message.clone()
        };
        let key = (target, event.reason.clone(), message.clone());
        if let Some(sent) = self.sent.get_mut(&key) {
            sent.count += 1;
            let patch = json!({"count": sent.count, "lastTimestamp": now});
            match api
                .patch(&sent.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok("updated"),
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    self.sent.remove(&key);
                }
                Err(e) => return Err(SendError::Update(e)),
            }
        }
        let name = format!("{}.{:x}", reference.name, Timestamp::now().as_nanosecond());
        let object = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            involved_object: reference.to_reference(),
            reason: Some(event.reason.clone()),
            message: Some(message),
            type_: Some("Warning".into()),
            count: Some(1),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            source: Some(EventSource {
                component: Some(COMPONENT.into()),
                host: None,
            }),
            reporting_component: Some(COMPONENT.into()),
            reporting_instance: Some(std::env::var("POD_NAME").unwrap_or_else(|_| COMPONENT.to_owned())),
            ..Event::default()
        };
        api.create(&PostParams::default(), &object)
            .await
            .map_err(SendError::Create)?;
        self.sent.insert(
            key,
            Sent {
                name,
                count: 1,
                first: Instant::now(),
            },
        );
        Ok("created")
    }
}
