//! The controller's in-memory picture of the seed: user clusters, their Machines (sized), and
//! which clusters and projects have changed since they were last written.
//!
//! Watch tasks update it under a short lock; the writer takes consistent snapshots
//! ([`State::project_plan`], [`State::cluster_plan`]) and does the I/O outside the lock.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kkp_quota_crds::ResourceDetails;
use kkp_quota_crds::kkp::{ClusterCondition, ClusterStatus};
use kkp_quota_crds::machine::Machine;
use kube::ResourceExt;
use provider_sizes::{SizeCatalog, SizingError, size_machine};
use tokio::sync::mpsc::UnboundedSender;
use tracing::{error, warn};

use crate::ledger::{Appeared, Counted};
use crate::usage::{ClusterUsage, Drift, project_usage, same_usage};

/// The key of our condition in `Cluster.status.conditions` (KKP keeps conditions as a map).
pub const CONDITION_TYPE: &str = "ResourceQuotaUsage";
/// `kubermaticVersion` of our condition: KKP's schema requires the field (a patch without it is
/// refused whole), and KKP fills it with the version of whatever set the condition.
pub const CONDITION_WRITER: &str = concat!("kkp-quota-seed-controller-v", env!("CARGO_PKG_VERSION"));

/// Event reasons on Machines in user clusters.
pub const REASON_UNSIZEABLE: &str = "QuotaUnsizeableMachine";
pub const REASON_UNADMITTED: &str = "QuotaUnadmittedMachine";

/// Whether a user cluster's Machines can currently be watched.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Reachability {
    #[default]
    Unknown,
    Reachable,
    Unreachable(String),
}

/// An Event to publish on a Machine in its user cluster.
#[derive(Debug, Clone)]
pub struct MachineEvent {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub reason: &'static str,
    pub message: String,
}

#[derive(Debug, Clone)]
struct MachineInfo {
    namespace: String,
    name: String,
    spec: Machine,
    sizing: Result<ResourceDetails, SizingError>,
}

/// How long a gone Machine's uid is remembered: longer than any sensible reservation TTL
/// (a reservation older than its TTL goes anyway).
const GONE_KEPT: Duration = Duration::from_mins(10);

/// When a Machine appeared while watched, and whether a write has held it back since.
#[derive(Debug, Clone, Copy)]
struct Appearance {
    at: Instant,
    held: bool,
}

impl Appearance {
    fn now() -> Appearance {
        Appearance {
            at: Instant::now(),
            held: false,
        }
    }
}

/// One user cluster as the controller sees it.
#[derive(Debug, Default)]
pub struct ClusterState {
    pub project: Option<String>,
    /// `status.resourceUsage` as first seen: the usage to report until the Machines are listed
    /// (after a restart, or while the cluster has never been reachable).
    baseline: Option<ResourceDetails>,
    /// The status last seen on the seed, and the last one we wrote.
    observed: Option<ClusterStatus>,
    written: Option<(Option<ResourceDetails>, ClusterCondition)>,
    usage: ClusterUsage,
    machines: HashMap<String, MachineInfo>,
    pub synced: bool,
    pub reachability: Reachability,
    /// Machines that appeared while the watch was running: checked for a reservation.
    appeared: BTreeMap<String, Appearance>,
    /// Machines seen gone (deleted, or missing from a complete listing): when, and their uid,
    /// oldest first. A reservation recorded after its Machine was deleted goes at once instead of
    /// at its TTL. Kept for [`GONE_KEPT`] (pruned from the front as new ones come, and at every
    /// listing).
    gone: VecDeque<(Instant, String)>,
    /// Events already sent (uid, reason): every Event is sent once per Machine.
    reported: HashSet<(String, &'static str)>,
    events: Option<UnboundedSender<MachineEvent>>,
    /// The unsizeable label sets last exported for this cluster.
    exported_unsizeable: BTreeSet<(String, String, String)>,
}

impl ClusterState {
    /// Whether its Machines may exist uncounted right now.
    pub fn unsettled(&self) -> bool {
        !self.synced || matches!(self.reachability, Reachability::Unreachable(_))
    }

    /// Whether start-up may consider this cluster done (listed, or known to be unreachable).
    pub fn settled_for_readiness(&self) -> bool {
        self.synced || matches!(self.reachability, Reachability::Unreachable(_))
    }

    /// The usage to report: the counted Machines once listed, else the last written usage.
    pub fn reported_usage(&self) -> ResourceDetails {
        if self.synced {
            self.usage.total().clone()
        } else {
            self.baseline.clone().unwrap_or_else(ResourceDetails::zero)
        }
    }

    /// A Machine is gone (seen deleted, or missing from a complete listing) at `now`: forgets it
    /// (its sizing, its appearance, the Events sent for it) and remembers its uid as gone for
    /// [`GONE_KEPT`]. The count is the caller's to update (a deletion takes the Machine out, a
    /// listing replaces the whole count and so sees the drift). Returns whether it was known.
    fn forget_machine(&mut self, uid: &str, now: Instant) -> bool {
        self.prune_gone(now);
        self.gone.push_back((now, uid.to_owned()));
        self.appeared.remove(uid);
        self.reported.retain(|(u, _)| u != uid);
        self.machines.remove(uid).is_some()
    }

    /// Forgets the gone uids older than [`GONE_KEPT`] (the oldest are in front).
    fn prune_gone(&mut self, now: Instant) {
        while self
            .gone
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= GONE_KEPT)
        {
            self.gone.pop_front();
        }
    }
}

/// What to write to one project's seed quota copy, from one snapshot.
#[derive(Debug, Clone)]
pub struct ProjectPlan {
    pub project: String,
    pub local_usage: ResourceDetails,
    pub counted: Counted,
    /// Machines that appeared while watched, to check for reservations.
    pub appeared: Vec<Appeared>,
    /// One of the project's own clusters is unsettled: its allotments must not expire.
    pub project_unsettled: bool,
}

/// What to write to one `Cluster`'s status.
#[derive(Debug, Clone)]
pub struct ClusterPlan {
    pub cluster: String,
    pub project: Option<String>,
    /// `None` until the Machines were listed once: the last written usage stays.
    pub usage: Option<ResourceDetails>,
    pub condition: ClusterCondition,
    pub observed: Option<ClusterStatus>,
    /// Already written (or observed) exactly like this.
    pub unchanged: bool,
    /// `(provider, flavour, reason)` -> number of Machines.
    pub unsizeable: BTreeMap<(String, String, String), usize>,
}

/// The whole picture.
pub struct State {
    catalog: Arc<SizeCatalog>,
    pub clusters: BTreeMap<String, ClusterState>,
    pub dirty_clusters: BTreeSet<String>,
    pub dirty_projects: BTreeSet<String>,
    /// Set once the Cluster list and the size catalog were read: writes before that could
    /// report a partial seed.
    pub clusters_listed: bool,
    pub catalog_loaded: bool,
    /// Project -> when the grace of its earliest held-back Machine ends (a write is due then).
    pub grace_wakeups: BTreeMap<String, Instant>,
    /// Project -> when the writer next looks at its ledger for shares although nothing changes
    /// (the quiet period ends): set by the writer, for a project that settled without its ledger
    /// changing (so the quota watch saw no event to set its own timer on).
    pub share_wakeups: BTreeMap<String, Instant>,
    /// Project -> the usage last written onto KKP's `ResourceQuota` copy (KKP's resources only).
    pub kkp_usage_written: BTreeMap<String, ResourceDetails>,
    /// Project -> when its ledger last showed signs of admissions (for quiet share releases).
    pub share_activity: BTreeMap<String, crate::shares::Activity>,
}

impl State {
    pub fn new(catalog: SizeCatalog) -> State {
        State {
            catalog: Arc::new(catalog),
            clusters: BTreeMap::new(),
            dirty_clusters: BTreeSet::new(),
            dirty_projects: BTreeSet::new(),
            clusters_listed: false,
            catalog_loaded: false,
            grace_wakeups: BTreeMap::new(),
            share_wakeups: BTreeMap::new(),
            kkp_usage_written: BTreeMap::new(),
            share_activity: BTreeMap::new(),
        }
    }

    fn mark(&mut self, cluster: &str) {
        self.dirty_clusters.insert(cluster.to_owned());
        if let Some(project) = self.clusters.get(cluster).and_then(|c| c.project.clone()) {
            self.dirty_projects.insert(project);
        }
    }

    /// A `Cluster` was seen on the seed.
    pub fn upsert_cluster(&mut self, name: &str, project: Option<String>, status: Option<ClusterStatus>) {
        let entry = self.clusters.entry(name.to_owned()).or_default();
        if entry.baseline.is_none() && entry.observed.is_none() {
            entry.baseline = status.as_ref().and_then(|s| s.resource_usage.clone());
        }
        let changed = entry.project != project;
        let old_project = std::mem::replace(&mut entry.project, project);
        entry.observed = status;
        if changed {
            if let Some(old) = old_project {
                self.dirty_projects.insert(old);
            }
            self.mark(name);
        }
    }

    /// A `Cluster` is gone from the seed: its usage no longer counts for its project.
    pub fn remove_cluster(&mut self, name: &str) {
        if let Some(project) = self.clusters.remove(name).and_then(|c| c.project) {
            self.dirty_projects.insert(project);
        }
        self.dirty_clusters.remove(name);
    }

    pub fn set_events_sender(&mut self, cluster: &str, sender: Option<UnboundedSender<MachineEvent>>) {
        if let Some(c) = self.clusters.get_mut(cluster) {
            c.events = sender;
        }
    }

    /// Returns whether reachability changed.
    pub fn set_reachability(&mut self, cluster: &str, reachability: Reachability) -> bool {
        let Some(c) = self.clusters.get_mut(cluster) else {
            return false;
        };
        if c.reachability == reachability {
            return false;
        }
        c.reachability = reachability;
        self.mark(cluster);
        true
    }

    fn size(catalog: &SizeCatalog, machine: &Machine) -> Result<ResourceDetails, SizingError> {
        size_machine(machine, catalog, None)
    }

    fn info(catalog: &SizeCatalog, machine: Machine) -> MachineInfo {
        let name = machine.name_any();
        // Keep only what sizing needs (not metadata such as managedFields).
        let spec = Machine::new(&name, machine.spec);
        MachineInfo {
            namespace: machine.metadata.namespace.unwrap_or_default(),
            sizing: Self::size(catalog, &spec),
            name,
            spec,
        }
    }

    /// Applies one Machine's sizing to the cluster's usage and queues its Events.
    fn account(cluster_name: &str, cluster: &mut ClusterState, uid: &str) -> bool {
        let Some(info) = cluster.machines.get(uid) else {
            return false;
        };
        let changed = match cluster.usage.set(uid, info.sizing.as_ref().ok()) {
            Ok(changed) => changed,
            Err(e) => {
                error!(cluster = cluster_name, error = %e, "usage overflow; machine not counted");
                false
            }
        };
        if let Err(e) = &info.sizing {
            let key = (uid.to_owned(), REASON_UNSIZEABLE);
            if !cluster.reported.contains(&key) {
                warn!(cluster = cluster_name, machine = %info.name, provider = e.provider(), reason = e.reason(), "machine cannot be sized: {e}");
                if let Some(sender) = &cluster.events {
                    let sent = sender.send(MachineEvent {
                        namespace: info.namespace.clone(),
                        name: info.name.clone(),
                        uid: uid.to_owned(),
                        reason: REASON_UNSIZEABLE,
                        message: format!(
                            "This Machine is not counted in the project's resource quota usage: {e}"
                        ),
                    });
                    if sent.is_ok() {
                        cluster.reported.insert(key);
                    }
                }
            }
        }
        changed
    }

    /// A Machine was added or changed. `watching`: seen by a running watch (not an initial
    /// listing), so it is a candidate for bypass detection if it is new.
    pub fn machine_applied(&mut self, cluster_name: &str, machine: Machine, watching: bool) {
        let Some(uid) = machine.uid() else { return };
        let catalog = Arc::clone(&self.catalog);
        let Some(cluster) = self.clusters.get_mut(cluster_name) else {
            return;
        };
        if cluster
            .machines
            .get(&uid)
            .is_some_and(|old| old.spec.spec == machine.spec)
        {
            return;
        }
        let new = !cluster.machines.contains_key(&uid);
        if new && watching && cluster.synced {
            cluster.appeared.insert(uid.clone(), Appearance::now());
        }
        cluster
            .machines
            .insert(uid.clone(), Self::info(&catalog, machine));
        let changed = Self::account(cluster_name, cluster, &uid);
        // The condition lists unsizeable Machines: a new one matters even if usage did not move.
        let unsizeable = cluster.machines.get(&uid).is_some_and(|m| m.sizing.is_err());
        if changed || unsizeable || new {
            self.mark(cluster_name);
        }
    }

    /// A Machine is gone (a Machine being deleted still counts until this).
    pub fn machine_deleted(&mut self, cluster_name: &str, uid: &str) {
        let Some(cluster) = self.clusters.get_mut(cluster_name) else {
            return;
        };
        if !cluster.forget_machine(uid, Instant::now()) {
            return;
        }
        if let Err(e) = cluster.usage.remove(uid) {
            error!(cluster = cluster_name, error = %e, "usage arithmetic failed");
        }
        self.mark(cluster_name);
    }

    /// Where a listing differs from what the watch built: `+uid` missing, `-uid` gone, `~uid`
    /// changed. Used by the recount to confirm a difference on a second listing before calling
    /// it drift (a difference seen once may be an event still in flight).
    pub fn diff_listing(&self, cluster_name: &str, machines: &[Machine]) -> BTreeSet<String> {
        let Some(cluster) = self.clusters.get(cluster_name) else {
            return BTreeSet::new();
        };
        let mut diff = BTreeSet::new();
        let mut listed = HashSet::with_capacity(machines.len());
        for machine in machines {
            let Some(uid) = machine.uid() else { continue };
            match cluster.machines.get(&uid) {
                None => {
                    diff.insert(format!("+{uid}"));
                }
                Some(old) if old.spec.spec != machine.spec => {
                    diff.insert(format!("~{uid}"));
                }
                Some(_) => {}
            }
            listed.insert(uid);
        }
        for uid in cluster.machines.keys() {
            if !listed.contains(uid) {
                diff.insert(format!("-{uid}"));
            }
        }
        diff
    }

    /// A complete listing of a cluster's Machines (initial sync, re-list after a watch failure,
    /// or the periodic recount). Returns the drift corrected, `None` on the first listing.
    pub fn cluster_listed(&mut self, cluster_name: &str, machines: Vec<Machine>) -> Option<Drift> {
        let catalog = Arc::clone(&self.catalog);
        let cluster = self.clusters.get_mut(cluster_name)?;
        let first = !cluster.synced;
        let mut infos = HashMap::with_capacity(machines.len());
        for machine in machines {
            if let Some(uid) = machine.uid() {
                // Reuse the sizing of unchanged Machines.
                let info = match cluster.machines.remove(&uid) {
                    Some(old) if old.spec.spec == machine.spec => old,
                    // Known before and changed meanwhile: counted all along, so never a bypass
                    // candidate (and never held back, which would drop it from the count).
                    Some(_) => Self::info(&catalog, machine),
                    None => {
                        if !first {
                            cluster
                                .appeared
                                .entry(uid.clone())
                                .or_insert_with(Appearance::now);
                        }
                        Self::info(&catalog, machine)
                    }
                };
                infos.insert(uid, info);
            }
        }
        // Machines left in the old map are gone (the new count below takes them out).
        let now = Instant::now();
        let left = std::mem::replace(&mut cluster.machines, infos);
        for uid in left.keys() {
            cluster.forget_machine(uid, now);
        }
        cluster.prune_gone(now);
        let listing: HashMap<String, ResourceDetails> = cluster
            .machines
            .iter()
            .filter_map(|(uid, m)| m.sizing.as_ref().ok().map(|s| (uid.clone(), s.clone())))
            .collect();
        let drift = match cluster.usage.replace(listing) {
            Ok(drift) => drift,
            Err(e) => {
                error!(cluster = cluster_name, error = %e, "usage arithmetic failed");
                Drift::default()
            }
        };
        let uids: Vec<String> = cluster.machines.keys().cloned().collect();
        for uid in &uids {
            Self::account(cluster_name, cluster, uid);
        }
        cluster.synced = true;
        self.mark(cluster_name);
        (!first).then_some(drift)
    }

    /// A new size catalog: every Machine is sized again.
    pub fn set_catalog(&mut self, catalog: SizeCatalog) {
        self.catalog = Arc::new(catalog);
        let catalog = Arc::clone(&self.catalog);
        let names: Vec<String> = self.clusters.keys().cloned().collect();
        for name in names {
            let Some(cluster) = self.clusters.get_mut(&name) else {
                continue;
            };
            let uids: Vec<String> = cluster.machines.keys().cloned().collect();
            let mut changed = false;
            for uid in uids {
                if let Some(info) = cluster.machines.get_mut(&uid) {
                    let sizing = Self::size(&catalog, &info.spec);
                    if sizing != info.sizing {
                        info.sizing = sizing;
                        changed = true;
                        Self::account(&name, cluster, &uid);
                    }
                }
            }
            if changed {
                self.mark(&name);
            }
        }
    }

    /// The projects with a cluster on this seed.
    pub fn projects(&self) -> BTreeSet<String> {
        self.clusters.values().filter_map(|c| c.project.clone()).collect()
    }

    /// One consistent snapshot for a project's write.
    pub fn project_plan(&self, project: &str) -> Result<ProjectPlan, kkp_quota_crds::QuantityError> {
        let mut counted = Counted::default();
        let mut usages = Vec::new();
        let mut appeared = Vec::new();
        let mut project_unsettled = false;
        for (name, cluster) in &self.clusters {
            if cluster.unsettled() {
                counted.unsettled.insert(name.clone());
            }
            if cluster.project.as_deref() != Some(project) {
                continue;
            }
            project_unsettled |= cluster.unsettled();
            usages.push(cluster.reported_usage());
            if cluster.synced {
                for (uid, size) in cluster.usage.iter() {
                    counted
                        .machines
                        .insert((name.clone(), uid.to_owned()), size.clone());
                }
            }
            counted
                .gone
                .extend(cluster.gone.iter().map(|(_, uid)| (name.clone(), uid.clone())));
            appeared.extend(cluster.appeared.iter().map(|(uid, a)| Appeared {
                cluster: name.clone(),
                uid: uid.clone(),
                at: a.at,
            }));
        }
        Ok(ProjectPlan {
            project: project.to_owned(),
            local_usage: project_usage(usages.iter())?,
            counted,
            appeared,
            project_unsettled,
        })
    }

    /// Machines a write held back (not counted, not judged yet): if they are judged unadmitted
    /// later, the Event says they got no reservation within the grace.
    pub fn held_back(&mut self, held: &[(String, String)]) {
        for (cluster_name, uid) in held {
            if let Some(a) = self
                .clusters
                .get_mut(cluster_name)
                .and_then(|c| c.appeared.get_mut(uid))
            {
                a.held = true;
            }
        }
    }

    /// Bypass candidates were checked: forget them, and queue Events for the unadmitted ones.
    /// `allotments`: the quota copy had allotments, so an unadmitted Machine was given `grace` to
    /// be recorded (as was any Machine held back earlier).
    pub fn appeared_checked(
        &mut self,
        checked: &[(String, String)],
        unadmitted: &[(String, String)],
        allotments: bool,
        grace: Duration,
    ) {
        for (cluster_name, uid) in checked {
            let Some(cluster) = self.clusters.get_mut(cluster_name) else {
                continue;
            };
            let appearance = cluster.appeared.remove(uid);
            if !unadmitted.contains(&(cluster_name.clone(), uid.clone())) {
                continue;
            }
            let after_grace = allotments || appearance.is_some_and(|a| a.held);
            let key = (uid.clone(), REASON_UNADMITTED);
            if cluster.reported.contains(&key) {
                continue;
            }
            let Some(info) = cluster.machines.get(uid) else {
                continue;
            };
            let message = if after_grace {
                warn!(cluster = %cluster_name, project = ?cluster.project, machine = %info.name, grace = ?grace,
                    "machine got no admission reservation within the grace: admitted by no webhook (bypassed or removed), \
                     or by a webhook process that stopped before recording it; it is counted");
                format!(
                    "This Machine got no resource quota admission reservation within {grace:?} of appearing: it was \
                     admitted by no webhook (webhook removed or bypassed), or by a webhook process that stopped \
                     before recording it. It is counted in the project's usage."
                )
            } else {
                warn!(cluster = %cluster_name, project = ?cluster.project, machine = %info.name, "machine exists without admission: the quota webhook was bypassed or removed; it is counted");
                "This Machine was created without passing the resource quota admission webhook \
                 (webhook removed or bypassed). It is counted in the project's usage."
                    .to_owned()
            };
            if let Some(sender) = &cluster.events {
                let _ = sender.send(MachineEvent {
                    namespace: info.namespace.clone(),
                    name: info.name.clone(),
                    uid: uid.clone(),
                    reason: REASON_UNADMITTED,
                    message,
                });
            }
            cluster.reported.insert(key);
        }
    }

    /// The write a `Cluster` needs, if it is still on the seed.
    pub fn cluster_plan(&self, name: &str) -> Option<ClusterPlan> {
        let cluster = self.clusters.get(name)?;
        let mut unsizeable = BTreeMap::<(String, String, String), usize>::new();
        let mut problems = Vec::new();
        for info in cluster.machines.values() {
            if let Err(e) = &info.sizing {
                *unsizeable
                    .entry((
                        e.provider().to_owned(),
                        e.flavour().unwrap_or_default().to_owned(),
                        e.reason().to_owned(),
                    ))
                    .or_default() += 1;
                problems.push(format!("{}/{}: {e}", info.namespace, info.name));
            }
        }
        problems.sort();
        let condition = condition(cluster, &problems);
        let usage = cluster.synced.then(|| cluster.usage.total().clone());
        let same = |u: &Option<ResourceDetails>, c: &ClusterCondition| {
            let usage_same = match (&usage, u) {
                (None, _) => true,
                // KKP's Cluster keeps only cpu, memory and storage.
                (Some(a), Some(b)) => same_usage(&a.kkp_subset(), &b.kkp_subset()),
                (Some(_), None) => false,
            };
            usage_same
                && c.status == condition.status
                && c.reason == condition.reason
                && c.message == condition.message
        };
        // Still connecting for the first time: nothing to say yet (avoids a burst of
        // "not synced" writes at every start).
        let connecting = !cluster.synced && cluster.reachability == Reachability::Unknown;
        let unchanged = connecting
            || cluster.written.as_ref().is_some_and(|(u, c)| same(u, c))
            || cluster.observed.as_ref().is_some_and(|s| {
                s.conditions
                    .get(CONDITION_TYPE)
                    .is_some_and(|c| same(&s.resource_usage, c))
            });
        Some(ClusterPlan {
            cluster: name.to_owned(),
            project: cluster.project.clone(),
            usage,
            condition,
            observed: cluster.observed.clone(),
            unchanged,
            unsizeable,
        })
    }

    pub fn cluster_written(
        &mut self,
        name: &str,
        usage: Option<ResourceDetails>,
        condition: ClusterCondition,
    ) {
        if let Some(c) = self.clusters.get_mut(name) {
            c.written = Some((usage, condition));
        }
    }

    /// The unsizeable label sets exported for a cluster, replaced by `now`; returns the stale ones.
    pub fn exported_unsizeable(
        &mut self,
        name: &str,
        now: BTreeSet<(String, String, String)>,
    ) -> Vec<(String, String, String)> {
        let Some(c) = self.clusters.get_mut(name) else {
            return Vec::new();
        };
        let stale = c.exported_unsizeable.difference(&now).cloned().collect();
        c.exported_unsizeable = now;
        stale
    }

    /// Takes in one status of a project's ledger at `now` (read, or produced by a write); returns
    /// the project's activity since.
    pub fn ledger_seen(
        &mut self,
        project: &str,
        status: &kkp_quota_crds::QuotaLedgerStatus,
        now: jiff::Timestamp,
    ) -> crate::shares::Activity {
        if let Some(activity) = self.share_activity.get_mut(project) {
            activity.observe(status, now);
            activity.clone()
        } else {
            let activity = crate::shares::Activity::first(status, now);
            self.share_activity.insert(project.to_owned(), activity.clone());
            activity
        }
    }

    /// Start-up is complete: clusters and catalog read, every cluster listed or unreachable.
    pub fn initially_synced(&self) -> bool {
        self.clusters_listed
            && self.catalog_loaded
            && self.clusters.values().all(ClusterState::settled_for_readiness)
    }

    /// Marks every cluster and project for a write (after a catalog change or at resync).
    pub fn mark_all(&mut self) {
        self.dirty_clusters.extend(self.clusters.keys().cloned());
        let projects = self.projects();
        self.dirty_projects.extend(projects);
    }
}

/// The `ResourceQuotaUsage` condition (without timestamps) for a cluster.
fn condition(cluster: &ClusterState, problems: &[String]) -> ClusterCondition {
    let (status, reason, message) = match (&cluster.reachability, cluster.synced) {
        (Reachability::Unreachable(why), _) => (
            "False",
            "UserClusterUnreachable",
            format!(
                "Cannot watch the user cluster's Machines ({why}); the usage shown is the last known and is \
                 kept until the cluster is reachable again."
            ),
        ),
        (_, false) => (
            "Unknown",
            "NotSynced",
            "The user cluster's Machines have not been listed yet.".to_owned(),
        ),
        _ if !problems.is_empty() => {
            let shown: Vec<&str> = problems.iter().take(5).map(String::as_str).collect();
            let more = problems.len().saturating_sub(shown.len());
            let mut message = format!(
                "{} Machine(s) cannot be sized and are not counted in the project's usage: {}",
                problems.len(),
                shown.join("; ")
            );
            if more > 0 {
                let _ = write!(message, " (and {more} more)");
            }
            ("False", "UnsizeableMachines", message)
        }
        _ => (
            "True",
            "AllMachinesCounted",
            "Every Machine of the user cluster is counted.".to_owned(),
        ),
    };
    ClusterCondition {
        status: status.to_owned(),
        kubermatic_version: CONDITION_WRITER.to_owned(),
        last_heartbeat_time: None,
        last_transition_time: None,
        reason: reason.to_owned(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(cluster, uid)` of the project's appeared Machines.
    fn appeared_keys(state: &State, project: &str) -> Vec<(String, String)> {
        state
            .project_plan(project)
            .unwrap()
            .appeared
            .iter()
            .map(Appeared::key)
            .collect()
    }
    use kkp_quota_crds::{Quantity, Resource};
    use serde_json::json;

    fn machine(uid: &str, instance_type: &str) -> Machine {
        serde_json::from_value(json!({
            "apiVersion": "cluster.k8s.io/v1alpha1", "kind": "Machine",
            "metadata": {"name": format!("m-{uid}"), "namespace": "kube-system", "uid": uid},
            "spec": {"providerSpec": {"value": {"cloudProvider": "aws", "cloudProviderSpec": {"instanceType": instance_type, "diskSize": 10}}}},
        }))
        .unwrap()
    }

    fn cpu(usage: &ResourceDetails) -> Quantity {
        usage.amount(Resource::Cpu)
    }

    fn state_with(clusters: &[(&str, &str)]) -> State {
        let mut state = State::new(SizeCatalog::shipped());
        for (name, project) in clusters {
            state.upsert_cluster(name, Some((*project).to_owned()), None);
        }
        state
    }

    #[test]
    fn projects_sum_their_clusters_only() {
        let mut state = state_with(&[("a", "p"), ("b", "p"), ("c", "q")]);
        state.cluster_listed("a", vec![machine("1", "t3.medium")]);
        state.cluster_listed("b", vec![machine("2", "t3.xlarge")]);
        state.cluster_listed("c", vec![machine("3", "t3.large")]);
        assert_eq!(
            cpu(&state.project_plan("p").unwrap().local_usage),
            Quantity::from_units(6)
        );
        assert_eq!(
            cpu(&state.project_plan("q").unwrap().local_usage),
            Quantity::from_units(2)
        );
        state.machine_deleted("b", "2");
        assert_eq!(
            cpu(&state.project_plan("p").unwrap().local_usage),
            Quantity::from_units(2)
        );
        state.remove_cluster("a");
        assert!(state.project_plan("p").unwrap().local_usage.is_empty());
    }

    #[test]
    fn unsynced_clusters_report_their_last_written_usage_and_are_unsettled() {
        let mut state = State::new(SizeCatalog::shipped());
        let mut usage = ResourceDetails::zero();
        usage.set(Resource::Cpu, Some(Quantity::from_units(7)));
        let status = ClusterStatus {
            resource_usage: Some(usage),
            ..ClusterStatus::default()
        };
        state.upsert_cluster("a", Some("p".into()), Some(status));
        let plan = state.project_plan("p").unwrap();
        assert_eq!(cpu(&plan.local_usage), Quantity::from_units(7));
        assert!(plan.counted.unsettled.contains("a"));
        // Listed: the real count replaces the baseline.
        state.cluster_listed("a", vec![machine("1", "t3.medium")]);
        let plan = state.project_plan("p").unwrap();
        assert_eq!(cpu(&plan.local_usage), Quantity::from_units(2));
        assert!(!plan.counted.unsettled.contains("a"));
        // Unreachable: the count is kept, the cluster is unsettled again.
        state.set_reachability("a", Reachability::Unreachable("down".into()));
        let plan = state.project_plan("p").unwrap();
        assert_eq!(cpu(&plan.local_usage), Quantity::from_units(2));
        assert!(plan.counted.unsettled.contains("a"));
        assert_eq!(
            state.cluster_plan("a").unwrap().condition.reason,
            "UserClusterUnreachable"
        );
    }

    #[test]
    fn only_machines_appearing_while_watched_are_bypass_candidates() {
        let mut state = state_with(&[("a", "p")]);
        state.machine_applied("a", machine("0", "t3.medium"), true);
        assert!(
            state.project_plan("p").unwrap().appeared.is_empty(),
            "before the first listing"
        );
        state.cluster_listed("a", vec![machine("1", "t3.medium")]);
        assert!(
            state.project_plan("p").unwrap().appeared.is_empty(),
            "first listing"
        );
        state.machine_applied("a", machine("2", "t3.medium"), true);
        state.machine_applied("a", machine("1", "t3.medium"), true);
        let appeared = appeared_keys(&state, "p");
        assert_eq!(appeared, vec![("a".to_owned(), "2".to_owned())]);
        state.appeared_checked(&appeared, &[], false, Duration::from_secs(5));
        assert!(state.project_plan("p").unwrap().appeared.is_empty());
        // A re-listing that finds a known Machine resized (its event missed) and a new one: only
        // the new one appeared. The resized one was counted all along; holding it back would
        // take it out of the count.
        state.cluster_listed(
            "a",
            vec![
                machine("1", "t3.medium"),
                machine("2", "m5.large"),
                machine("3", "t3.medium"),
            ],
        );
        let appeared = appeared_keys(&state, "p");
        assert_eq!(appeared, vec![("a".to_owned(), "3".to_owned())]);
    }

    #[test]
    fn held_back_machines_keep_their_time_and_are_told_they_had_a_grace() {
        let mut state = state_with(&[("a", "p"), ("b", "q")]);
        let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
        state.set_events_sender("a", Some(sender));
        assert!(
            state.project_plan("p").unwrap().project_unsettled,
            "a not listed yet"
        );
        state.cluster_listed("a", vec![]);
        let plan = state.project_plan("p").unwrap();
        assert!(!plan.project_unsettled, "b (unsettled) is another project's");
        assert!(plan.counted.unsettled.contains("b"));
        state.machine_applied("a", machine("1", "t3.medium"), true);
        let first = state.project_plan("p").unwrap().appeared[0].at;
        state.machine_applied("a", machine("2", "t3.medium"), true);
        // Seen again by a re-listing: still appeared at the first sight.
        state.cluster_listed("a", vec![machine("1", "t3.medium"), machine("2", "t3.medium")]);
        let appeared = state.project_plan("p").unwrap().appeared;
        assert_eq!(appeared.len(), 2);
        assert_eq!(appeared[0].at, first);
        let keys: Vec<(String, String)> = appeared.iter().map(Appeared::key).collect();
        state.held_back(&keys[..1]);
        state.appeared_checked(&keys, &keys, false, Duration::from_secs(5));
        let mut messages: Vec<(String, String)> = std::iter::from_fn(|| receiver.try_recv().ok())
            .map(|e| (e.uid, e.message))
            .collect();
        messages.sort();
        assert_eq!(messages.len(), 2);
        assert!(
            messages[0]
                .1
                .contains("no resource quota admission reservation within 5s"),
            "{}",
            messages[0].1
        );
        assert!(
            messages[0].1.contains("stopped before recording it"),
            "{}",
            messages[0].1
        );
        assert!(messages[1].1.contains("without passing"), "{}", messages[1].1);
        assert!(state.project_plan("p").unwrap().appeared.is_empty());
    }

    #[test]
    fn unsizeable_machines_are_reported_not_counted_and_a_catalog_fixes_them() {
        let mut state = state_with(&[("a", "p")]);
        let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
        state.set_events_sender("a", Some(sender));
        state.cluster_listed("a", vec![machine("1", "t3.medium"), machine("2", "t9.nothing")]);
        let plan = state.cluster_plan("a").unwrap();
        assert_eq!(plan.condition.reason, "UnsizeableMachines");
        assert!(plan.condition.message.contains("kube-system/m-2"));
        assert_eq!(plan.unsizeable.values().sum::<usize>(), 1);
        assert_eq!(cpu(plan.usage.as_ref().unwrap()), Quantity::from_units(2));
        let event = receiver.try_recv().unwrap();
        assert_eq!((event.uid.as_str(), event.reason), ("2", REASON_UNSIZEABLE));
        // Listed again: no second Event.
        state.cluster_listed("a", vec![machine("1", "t3.medium"), machine("2", "t9.nothing")]);
        assert!(receiver.try_recv().is_err());
        let admin = provider_sizes::AdminCatalog::parse(
            "providers:\n  aws:\n    t9.nothing: {cpu: 3, memory: 1Gi}\n",
        )
        .unwrap();
        state.set_catalog(SizeCatalog::shipped().with_admin(&admin));
        let plan = state.cluster_plan("a").unwrap();
        assert_eq!(plan.condition.reason, "AllMachinesCounted");
        assert_eq!(cpu(plan.usage.as_ref().unwrap()), Quantity::from_units(5));
    }

    #[test]
    fn diff_listing_names_what_the_watch_missed() {
        let mut state = state_with(&[("a", "p")]);
        state.cluster_listed("a", vec![machine("1", "t3.medium"), machine("2", "t3.medium")]);
        let diff = state.diff_listing("a", &[machine("1", "t3.large"), machine("3", "t3.medium")]);
        assert_eq!(
            diff.into_iter().collect::<Vec<_>>(),
            vec!["+3".to_owned(), "-2".to_owned(), "~1".to_owned()]
        );
        assert!(
            state
                .diff_listing("a", &[machine("1", "t3.medium"), machine("2", "t3.medium")])
                .is_empty()
        );
    }

    #[test]
    fn machines_deleted_or_missing_from_a_listing_are_remembered_as_gone_for_a_while() {
        let gone = |state: &State| -> BTreeSet<(String, String)> {
            state
                .project_plan("p")
                .unwrap()
                .counted
                .gone
                .into_iter()
                .collect()
        };
        let key = |uid: &str| ("a".to_owned(), uid.to_owned());
        let mut state = state_with(&[("a", "p")]);
        state.cluster_listed("a", vec![machine("1", "t3.medium"), machine("2", "t3.medium")]);
        assert!(gone(&state).is_empty());
        state.machine_deleted("a", "1");
        // Deleted before its create was ever seen (the reservation may still come).
        state.machine_deleted("a", "0");
        assert_eq!(gone(&state), BTreeSet::from([key("0"), key("1")]));
        // A listing without a known Machine: its delete was missed, it is gone as well.
        state.cluster_listed("a", vec![machine("3", "t3.medium")]);
        assert_eq!(gone(&state), BTreeSet::from([key("0"), key("1"), key("2")]));
        assert_eq!(
            cpu(&state.project_plan("p").unwrap().local_usage),
            Quantity::from_units(2)
        );
        // Kept for GONE_KEPT, the oldest pruned first.
        let cluster = state.clusters.get_mut("a").unwrap();
        let (last, _) = cluster.gone.back().unwrap().clone();
        cluster.forget_machine("4", last + Duration::from_secs(1));
        cluster.forget_machine("5", last + GONE_KEPT);
        assert_eq!(gone(&state), BTreeSet::from([key("4"), key("5")]));
    }

    #[test]
    fn cluster_writes_are_skipped_when_nothing_changed() {
        let mut state = state_with(&[("a", "p")]);
        assert!(
            state.cluster_plan("a").unwrap().unchanged,
            "still connecting: nothing to write"
        );
        state.cluster_listed("a", vec![machine("1", "t3.medium")]);
        let plan = state.cluster_plan("a").unwrap();
        assert!(!plan.unchanged);
        state.cluster_written("a", plan.usage.clone(), plan.condition.clone());
        assert!(state.cluster_plan("a").unwrap().unchanged);
        state.machine_applied("a", machine("2", "t3.medium"), true);
        assert!(!state.cluster_plan("a").unwrap().unchanged);
    }
}
