//! User clusters: `Cluster` objects on the seed -> one task per user cluster, with a client
//! from the Secret `admin-kubeconfig` in the cluster's namespace (`status.namespaceName`).
//!
//! Clusters added or deleted and kubeconfig rotation are followed without restart: a changed
//! kubeconfig restarts only that cluster's task. Each task watches the cluster's Machines,
//! re-lists them every `--resync-period` (the safety-net recount), publishes Events on its
//! Machines and keeps the webhook configuration. A task that cannot reach its cluster marks it
//! unreachable (its last usage stays) and retries with backoff; it never blocks another task.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{ObjectReference, Secret};
use kkp_quota_crds::kkp::{ADMIN_KUBECONFIG_SECRET, Cluster, KUBECONFIG_KEY};
use kkp_quota_crds::machine::{Machine, MachineDeployment};
use kkp_quota_runtime::chain::Chain;
use kkp_quota_runtime::kubeconfig::client_from_yaml;
use kkp_quota_runtime::watch::relisting_watcher;
use kube::api::ListParams;
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tracing::{Instrument, error, info, info_span, warn};

use crate::state::{MachineEvent, Reachability};
use tokio_util::task::AbortOnDropHandle;

use crate::{Error, Shared, webhook_config};

/// How long the recount waits before confirming a difference with a second listing.
const RECOUNT_CONFIRM_AFTER: Duration = Duration::from_secs(3);

struct Task {
    namespace: String,
    kubeconfig: Option<String>,
    _handle: Option<AbortOnDropHandle<()>>,
}

enum Change {
    Cluster(Result<Event<Cluster>, watcher::Error>),
    Secret(Result<Event<Secret>, watcher::Error>),
}

/// Follows the seed's Clusters and kubeconfig Secrets; runs until the future is dropped.
pub async fn run(shared: Arc<Shared>) -> Result<(), Error> {
    let clusters = relisting_watcher(
        Api::<Cluster>::all(shared.seed.clone()),
        watcher::Config::default(),
        None,
    )
    .default_backoff()
    .map(Change::Cluster)
    .boxed();
    let secrets = relisting_watcher(
        Api::<Secret>::all(shared.seed.clone()),
        watcher::Config::default().fields(&format!("metadata.name={ADMIN_KUBECONFIG_SECRET}")),
        None,
    )
    .default_backoff()
    .map(Change::Secret)
    .boxed();
    let mut changes = stream::select(clusters, secrets);

    let mut tasks: HashMap<String, Task> = HashMap::new();
    let mut kubeconfigs: HashMap<String, String> = HashMap::new();
    let mut listing: Option<HashSet<String>> = None;
    let mut secrets_listing: Option<HashMap<String, String>> = None;
    let mut clusters_listed = false;
    let mut secrets_listed = false;

    while let Some(change) = changes.next().await {
        match change {
            Change::Cluster(Ok(Event::Init)) => listing = Some(HashSet::new()),
            Change::Cluster(Ok(Event::InitApply(cluster) | Event::Apply(cluster))) => {
                let name = cluster.name_any();
                warn_if_seed_named(&shared, &name);
                if let Some(listing) = &mut listing {
                    listing.insert(name.clone());
                }
                let namespace = cluster.control_plane_namespace();
                shared.state().upsert_cluster(
                    &name,
                    cluster.metadata.uid.clone(),
                    cluster.project_id().map(str::to_owned),
                    cluster.status.clone(),
                );
                let kubeconfig = kubeconfigs.get(&namespace).cloned();
                ensure_task(&shared, &mut tasks, &name, namespace, kubeconfig, secrets_listed);
                shared.wake_writer();
            }
            Change::Cluster(Ok(Event::InitDone)) => {
                if let Some(listed) = listing.take() {
                    let gone: Vec<String> = tasks.keys().filter(|n| !listed.contains(*n)).cloned().collect();
                    for name in gone {
                        forget(&shared, &mut tasks, &name);
                    }
                }
                clusters_listed = true;
                {
                    let mut state = shared.state();
                    state.clusters_watch_failed = false;
                    if secrets_listed {
                        state.clusters_listed = true;
                    }
                }
                shared.wake_writer();
            }
            Change::Cluster(Ok(Event::Delete(cluster))) => {
                forget(&shared, &mut tasks, &cluster.name_any());
                shared.wake_writer();
            }
            Change::Secret(Ok(Event::Init)) => secrets_listing = Some(HashMap::new()),
            Change::Secret(Ok(Event::InitApply(secret))) => {
                if let (Some(listing), Some(text)) = (&mut secrets_listing, kubeconfig_of(&secret)) {
                    listing.insert(secret.namespace().unwrap_or_default(), text);
                }
            }
            Change::Secret(Ok(Event::InitDone)) => {
                kubeconfigs = secrets_listing.take().unwrap_or_default();
                secrets_listed = true;
                restart_changed(&shared, &mut tasks, &kubeconfigs, secrets_listed);
                if clusters_listed {
                    shared.state().clusters_listed = true;
                }
                shared.wake_writer();
            }
            Change::Secret(Ok(Event::Apply(secret))) => {
                if let Some(text) = kubeconfig_of(&secret) {
                    kubeconfigs.insert(secret.namespace().unwrap_or_default(), text);
                    restart_changed(&shared, &mut tasks, &kubeconfigs, secrets_listed);
                }
            }
            Change::Secret(Ok(Event::Delete(secret))) => {
                // Keep the running watch: its credentials may well still work.
                kubeconfigs.remove(&secret.namespace().unwrap_or_default());
            }
            Change::Cluster(Err(e)) => cluster_watch_failed(&shared, &e),
            Change::Secret(Err(e)) => {
                warn!(error = %e, "kubeconfig Secret watch on the seed failed; retrying");
            }
        }
    }
    Ok(())
}

fn kubeconfig_of(secret: &Secret) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(KUBECONFIG_KEY)?;
    String::from_utf8(bytes.0.clone()).ok()
}

fn restart_changed(
    shared: &Arc<Shared>,
    tasks: &mut HashMap<String, Task>,
    kubeconfigs: &HashMap<String, String>,
    secrets_listed: bool,
) {
    let wanted: Vec<(String, String, Option<String>)> = tasks
        .iter()
        .filter(|(_, t)| {
            t.kubeconfig.as_ref() != kubeconfigs.get(&t.namespace) && kubeconfigs.contains_key(&t.namespace)
        })
        .map(|(n, t)| {
            (
                n.clone(),
                t.namespace.clone(),
                kubeconfigs.get(&t.namespace).cloned(),
            )
        })
        .collect();
    for (name, namespace, kubeconfig) in wanted {
        ensure_task(shared, tasks, &name, namespace, kubeconfig, secrets_listed);
    }
}

/// A user cluster named like the seed: its Machines' reservations and the seed's `Cluster`
/// reservations are told apart by UID alone, and it counts as watched with the seed.
fn warn_if_seed_named(shared: &Shared, name: &str) {
    if name == shared.config.seed_name {
        warn!(cluster = %name, "a Cluster has this seed's name; rename the seed or the cluster (docs/capacity.md)");
    }
}

/// The `Cluster` watch failed: `Cluster`s created meanwhile are not seen, so their reservations
/// must not expire uncounted until the watch has listed them again (its `InitDone`).
fn cluster_watch_failed(shared: &Shared, error: &kube::runtime::watcher::Error) {
    warn!(%error, "Cluster watch on the seed failed; retrying");
    if !shared.state().clusters_unwatched() {
        shared.wake_writer();
    }
}

fn forget(shared: &Arc<Shared>, tasks: &mut HashMap<String, Task>, name: &str) {
    tasks.remove(name);
    let (project, unsizeable, at_last_size) = {
        let mut state = shared.state();
        let project = state.clusters.get(name).and_then(|c| c.project.clone());
        // The Machine gauges of the cluster go with it.
        let unsizeable = state.exported_unsizeable(name, BTreeSet::new());
        let at_last_size = state.exported_last_size(name, BTreeSet::new());
        state.remove_cluster(name);
        (project, unsizeable, at_last_size)
    };
    for (provider, flavour, reason) in unsizeable {
        let _ = shared
            .metrics
            .unsizeable
            .remove_label_values(&[name, &provider, &flavour, &reason]);
    }
    for (project, provider, flavour, reason) in at_last_size {
        let _ = shared
            .metrics
            .counted_at_last_size
            .remove_label_values(&[name, &project, &provider, &flavour, &reason]);
    }
    for &resource in kkp_quota_crds::Resource::ALL {
        let _ = shared.metrics.cluster_usage.remove_label_values(&[
            name,
            project.as_deref().unwrap_or_default(),
            resource.name(),
        ]);
    }
    let _ = shared.metrics.unreachable.remove_label_values(&[name]);
    info!(cluster = name, "user cluster removed; its usage no longer counts");
}

/// Starts (or restarts, on a new kubeconfig) a user cluster's task.
fn ensure_task(
    shared: &Arc<Shared>,
    tasks: &mut HashMap<String, Task>,
    name: &str,
    namespace: String,
    kubeconfig: Option<String>,
    secrets_listed: bool,
) {
    if let Some(task) = tasks.get(name)
        && task.namespace == namespace
        && task.kubeconfig == kubeconfig
    {
        return;
    }
    let restart = tasks.get(name).is_some_and(|t| t.kubeconfig.is_some());
    let handle = if let Some(text) = &kubeconfig {
        if restart {
            info!(cluster = name, "user cluster kubeconfig changed; reconnecting");
        }
        let project = shared
            .state()
            .clusters
            .get(name)
            .and_then(|c| c.project.clone())
            .unwrap_or_default();
        let span = info_span!("user_cluster", cluster = %name, project = %project);
        Some(AbortOnDropHandle::new(tokio::spawn(
            run_cluster(Arc::clone(shared), name.to_owned(), text.clone()).instrument(span),
        )))
    } else {
        if secrets_listed {
            set_reachability(
                shared,
                name,
                Reachability::Unreachable(format!(
                    "no Secret {namespace}/{ADMIN_KUBECONFIG_SECRET} with key {KUBECONFIG_KEY}"
                )),
            );
            // Nothing will list its deployments: what is known of them (nothing) counts.
            shared.state().deployments_unlistable(name);
        }
        None
    };
    tasks.insert(
        name.to_owned(),
        Task {
            namespace,
            kubeconfig,
            _handle: handle,
        },
    );
}

/// Records reachability, its metric and log line.
pub fn set_reachability(shared: &Shared, cluster: &str, reachability: Reachability) {
    let unreachable = matches!(reachability, Reachability::Unreachable(_));
    let message = match &reachability {
        Reachability::Unreachable(why) => why.clone(),
        _ => String::new(),
    };
    if shared.state().set_reachability(cluster, reachability) {
        shared
            .metrics
            .unreachable
            .with_label_values(&[cluster])
            .set(if unreachable { 1.0 } else { 0.0 });
        if unreachable {
            warn!(cluster, reason = %message, "user cluster unreachable; keeping its last known usage");
        } else {
            info!(cluster, "user cluster reachable");
        }
        shared.wake_writer();
    }
}

/// One user cluster, until aborted.
async fn run_cluster(shared: Arc<Shared>, name: String, kubeconfig: String) {
    let client = match client_from_yaml(&kubeconfig).await {
        Ok(client) => client,
        Err(e) => {
            set_reachability(
                &shared,
                &name,
                Reachability::Unreachable(format!("invalid admin kubeconfig: {}", Chain(&e))),
            );
            return;
        }
    };
    let namespace = if shared.config.machine_namespace_from_kubeconfig {
        client.default_namespace().to_owned()
    } else {
        shared.config.machine_namespace.clone()
    };
    let (sender, receiver) = unbounded_channel();
    shared.state().set_events_sender(&name, Some(sender));
    let _events = AbortOnDropHandle::new(tokio::spawn(
        publish_events(client.clone(), receiver, shared.config.user_cluster_timeout).in_current_span(),
    ));
    let _webhook = shared.config.webhook_url.as_ref().map(|_| {
        AbortOnDropHandle::new(tokio::spawn(
            webhook_config::keep(
                client.clone(),
                Arc::clone(&shared),
                webhook_config::Target::UserCluster(name.clone()),
            )
            .in_current_span(),
        ))
    });
    let _view = shared.config.quota_view.then(|| {
        AbortOnDropHandle::new(tokio::spawn(
            crate::view::keep(client.clone(), Arc::clone(&shared), name.clone()).in_current_span(),
        ))
    });
    // Machines queued before the sender existed (initial listing) are re-sent by `account` on
    // the next listing; the first listing comes after this point anyway.
    let api: Api<Machine> = Api::namespaced(client.clone(), &namespace);
    let mut machines = relisting_watcher(api.clone(), watcher::Config::default(), None)
        .default_backoff()
        .boxed();
    let mut buffer: Vec<Machine> = Vec::new();
    let mut deployments = DeploymentWatch::new(Api::namespaced(client.clone(), &namespace));
    let mut sets = crate::machine_set_watch::MachineSetWatch::new(Api::namespaced(client, &namespace));
    let mut recount = tokio::time::interval(shared.config.resync_period);
    recount.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    recount.tick().await;
    // A cluster that does not answer at all (no error, no listing) is reported unreachable after
    // --user-cluster-timeout, so it neither holds up readiness nor looks healthy.
    let first_listing = tokio::time::sleep(shared.config.user_cluster_timeout);
    tokio::pin!(first_listing);
    let mut listed_once = false;
    let mut suspect: Option<BTreeSet<String>> = None;
    let mut confirm_at = tokio::time::Instant::now();
    loop {
        tokio::select! {
            () = &mut first_listing, if !listed_once => {
                listed_once = true;
                unreachable_unless_listed(&shared, &name);
            }
            event = machines.next() => match event {
                Some(Ok(Event::Init)) => buffer.clear(),
                Some(Ok(Event::InitApply(machine))) => buffer.push(machine),
                Some(Ok(Event::InitDone)) => {
                    listed_once = true;
                    listed(&shared, &name, std::mem::take(&mut buffer));
                }
                Some(Ok(Event::Apply(machine))) => {
                    set_reachability(&shared, &name, Reachability::Reachable);
                    shared.state().machine_applied(&name, machine, true);
                    shared.wake_writer();
                }
                Some(Ok(Event::Delete(machine))) => {
                    if let Some(uid) = machine.uid() {
                        shared.state().machine_deleted(&name, &uid);
                        shared.wake_writer();
                    }
                }
                Some(Err(e)) => watch_failed(&shared, &name, &e),
                None => return,
            },
            event = deployments.stream.next() => match event {
                Some(event) => deployments.take(&shared, &name, event),
                None => return,
            },
            event = sets.stream.next() => match event {
                Some(event) => sets.take(&shared, &name, event),
                None => return,
            },
            _ = recount.tick() => {
                suspect = recount_cluster(&shared, &name, &api, None).await;
                confirm_at = tokio::time::Instant::now() + RECOUNT_CONFIRM_AFTER;
            }
            () = tokio::time::sleep_until(confirm_at), if suspect.is_some() => {
                recount_cluster(&shared, &name, &api, suspect.take()).await;
            }
        }
    }
}

/// A cluster whose Machines were not listed within `--user-cluster-timeout` is unreachable; one
/// whose `MachineDeployment`s were not listed by then reserves what is known of them (nothing),
/// so that its project's reservation is written meanwhile.
fn unreachable_unless_listed(shared: &Shared, name: &str) {
    let (news, synced) = {
        let mut state = shared.state();
        let news = state.deployments_unlistable(name);
        (news, state.clusters.get(name).is_some_and(|c| c.synced))
    };
    if news {
        shared.wake_writer();
    }
    if !synced {
        set_reachability(
            shared,
            name,
            Reachability::Unreachable(format!(
                "the Machines could not be listed within {:?}",
                shared.config.user_cluster_timeout
            )),
        );
    }
}

/// A user cluster's `MachineDeployment`s, for the capacity reserved for its cluster autoscaler
/// (`crate::state`'s `deployments`). Its failures leave the Machines' count alone: a cluster
/// without machine-controller's `MachineDeployment`s reserves nothing, and says so once.
struct DeploymentWatch {
    stream: futures::stream::BoxStream<'static, watcher::Result<Event<MachineDeployment>>>,
    buffer: Vec<MachineDeployment>,
    /// The last failure logged (each new one is logged once).
    failure: Option<String>,
}

impl DeploymentWatch {
    fn new(api: Api<MachineDeployment>) -> DeploymentWatch {
        DeploymentWatch {
            stream: relisting_watcher(api, watcher::Config::default(), None)
                .default_backoff()
                .boxed(),
            buffer: Vec::new(),
            failure: None,
        }
    }

    fn take(&mut self, shared: &Shared, cluster: &str, event: watcher::Result<Event<MachineDeployment>>) {
        let changed = match event {
            Ok(Event::Init) => {
                self.buffer.clear();
                false
            }
            Ok(Event::InitApply(deployment)) => {
                self.buffer.push(deployment);
                false
            }
            Ok(Event::InitDone) => {
                self.failure = None;
                shared
                    .state()
                    .deployments_listed(cluster, &std::mem::take(&mut self.buffer))
            }
            Ok(Event::Apply(deployment)) => shared.state().deployment_applied(cluster, &deployment),
            Ok(Event::Delete(deployment)) => deployment
                .uid()
                .is_some_and(|uid| shared.state().deployment_deleted(cluster, &uid)),
            Err(e) => {
                let error = e.to_string();
                if self.failure.as_ref() != Some(&error) {
                    warn!(%error, "MachineDeployments cannot be watched; the reservations last known stay");
                    self.failure = Some(error);
                }
                shared.state().deployments_failing(cluster, true);
                // Only a cluster with nothing to list reserves nothing; any other failure
                // (a timeout, an expired watch) keeps what was known.
                no_deployments_there(&e) && shared.state().deployments_unlistable(cluster)
            }
        };
        if changed {
            shared.wake_writer();
        }
    }
}

/// The listing failed because the cluster has no `MachineDeployment` resource (404) or this
/// controller may not read it (403).
fn no_deployments_there(error: &watcher::Error) -> bool {
    matches!(error, watcher::Error::InitialListFailed(kube::Error::Api(status)) if status.code == 404 || status.code == 403)
}

/// The safety net, in two listings: the first finds differences from the watched state (returned
/// as suspects); the second, [`RECOUNT_CONFIRM_AFTER`] later, confirms those still there, and only
/// then is the state corrected and the drift reported (so events in flight are not called drift).
async fn recount_cluster(
    shared: &Shared,
    name: &str,
    api: &Api<Machine>,
    suspects: Option<BTreeSet<String>>,
) -> Option<BTreeSet<String>> {
    let listed = tokio::time::timeout(
        shared.config.user_cluster_timeout,
        api.list(&ListParams::default()),
    )
    .await;
    // The recount doubles as a liveness probe: a cluster that hangs (no error, no answer) is
    // invisible to a watch, but not to a listing with a timeout.
    let items = match listed {
        Ok(Ok(list)) => {
            set_reachability(shared, name, Reachability::Reachable);
            list.items
        }
        Ok(Err(e)) => {
            warn!(error = %e, "periodic recount could not list Machines");
            set_reachability(
                shared,
                name,
                Reachability::Unreachable(format!("listing Machines failed: {e}")),
            );
            return None;
        }
        Err(_) => {
            warn!("periodic recount timed out");
            set_reachability(
                shared,
                name,
                Reachability::Unreachable(format!(
                    "listing Machines did not answer within {:?}",
                    shared.config.user_cluster_timeout
                )),
            );
            return None;
        }
    };
    let diff = shared.state().diff_listing(name, &items);
    let Some(suspects) = suspects else {
        return (!diff.is_empty()).then_some(diff);
    };
    let confirmed: Vec<&String> = suspects.intersection(&diff).collect();
    if confirmed.is_empty() {
        return None;
    }
    warn!(machines = ?confirmed, "recount found Machines the watch missed");
    if let Some(drift) = shared.state().cluster_listed(name, items) {
        report_drift(shared, name, &drift, "periodic recount");
    }
    shared.wake_writer();
    None
}

/// A complete listing from the watch (first sync, or catching up after the watch restarted).
fn listed(shared: &Shared, name: &str, machines: Vec<Machine>) {
    set_reachability(shared, name, Reachability::Reachable);
    let count = machines.len();
    match shared.state().cluster_listed(name, machines) {
        None => info!(machines = count, "user cluster's Machines listed"),
        Some(drift) if !drift.is_empty() => info!(
            added = drift.added,
            removed = drift.removed,
            resized = drift.resized,
            "caught up after the watch restarted"
        ),
        Some(_) => {}
    }
    shared.wake_writer();
}

fn watch_failed(shared: &Shared, name: &str, e: &watcher::Error) {
    shared.metrics.watch_restarts.with_label_values(&[name]).inc();
    // 410 Gone only means "list again"; anything else means we cannot see the cluster's
    // Machines right now.
    if matches!(e, watcher::Error::WatchError(status) if status.code == 410) {
        info!(error = %e, "Machine watch expired; listing again");
    } else {
        set_reachability(shared, name, Reachability::Unreachable(e.to_string()));
    }
}

fn report_drift(shared: &Shared, cluster: &str, drift: &crate::usage::Drift, during: &str) {
    if drift.is_empty() {
        return;
    }
    shared.metrics.drift_corrections.inc();
    warn!(
        cluster,
        added = drift.added,
        removed = drift.removed,
        resized = drift.resized,
        total_mismatch = drift.total_mismatch,
        during,
        "usage drift corrected"
    );
}

/// Publishes Events on Machines in one user cluster (the only writes to a user cluster besides
/// the webhook configuration). A slow cluster only delays its own Events.
async fn publish_events(client: Client, mut receiver: UnboundedReceiver<MachineEvent>, timeout: Duration) {
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: "kkp-quota-seed-controller".into(),
            instance: std::env::var("POD_NAME").ok(),
        },
    );
    while let Some(event) = receiver.recv().await {
        let reference = ObjectReference {
            api_version: Some(Machine::api_version(&()).into_owned()),
            kind: Some(Machine::kind(&()).into_owned()),
            namespace: Some(event.namespace.clone()),
            name: Some(event.name.clone()),
            uid: Some(event.uid.clone()),
            ..ObjectReference::default()
        };
        let kube_event = KubeEvent {
            type_: EventType::Warning,
            reason: event.reason.into(),
            note: Some(event.message.chars().take(1000).collect()),
            action: "CountUsage".into(),
            secondary: None,
        };
        let published = recorder.publish(&kube_event, &reference);
        match tokio::time::timeout(timeout, published).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => error!(error = %e, machine = %event.name, "could not publish Event"),
            Err(_) => error!(machine = %event.name, "publishing Event timed out"),
        }
    }
}
