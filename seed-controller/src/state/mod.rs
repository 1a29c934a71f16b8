//! The controller's in-memory picture of the seed: user clusters, their Machines (sized), and
//! which clusters and projects have changed since they were last written.
//!
//! Watch tasks update it under a short lock; the writer takes consistent snapshots
//! ([`State::project_plan`], [`State::cluster_plan`]) and does the I/O outside the lock.
//!
//! This file holds [`State`] itself and the changes to its set of clusters. The rest, one idea a
//! file:
//! - `cluster`: one user cluster ([`ClusterState`], [`Reachability`]) and the write of its
//!   `Cluster` status ([`ClusterPlan`], the `ResourceQuotaUsage` condition);
//! - `machines`: a cluster's Machines: sizing, the count, listings, the size catalog, the Machines
//!   remembered as gone, and the Events published on Machines ([`MachineEvent`]);
//! - `deployments`: a cluster's `MachineDeployment`s, for the capacity reserved for the cluster
//!   autoscaler (shown beside the usage, or counted in it under the policy `reservedCounts`);
//! - `machine_sets`: a cluster's `MachineSet`s: which deployment a Machine is of;
//! - `last_size`: Machines that can no longer be sized, counted at their last known size (kept
//!   in the ledgers for a restart);
//! - `admission`: bypass detection: Machines that appeared while watched, held back, judged;
//! - `project`: the snapshot of one project for its ledger write ([`ProjectPlan`]) and its share
//!   activity record.

mod admission;
mod cluster;
mod deployments;
mod last_size;
mod machine_sets;
mod machines;
mod project;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use kkp_quota_crds::ResourceDetails;
use kkp_quota_crds::kkp::ClusterStatus;
use provider_sizes::SizeCatalog;
use tokio::sync::mpsc::UnboundedSender;

pub use cluster::{CONDITION_TYPE, CONDITION_WRITER, ClusterPlan, ClusterState, Reachability};
pub use last_size::sort as sort_last_known;
pub use machines::{MachineEvent, REASON_COUNTED_AT_LAST_SIZE, REASON_UNADMITTED, REASON_UNSIZEABLE};
pub use project::ProjectPlan;

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
    /// When this process first saw each demand and allotment of each project's ledger: their
    /// lifetimes are judged by our clock, not the webhook's (issue #32, finding 8).
    pub lifetimes: kkp_quota_crds::ledger::lifetimes::Lifetimes,
    /// The ledgers' `status.lastKnownSizes` as last read.
    remembered: last_size::Remembered,
    /// The latest ledger of each project, for the users' views (`crate::view`).
    pub ledgers: crate::view::Ledgers,
    /// Each project's ledger as the writer's watch last saw it, and its deleted predecessor.
    pub successions: crate::succession::Successions,
    /// This seed's name: the `cluster` of the reservations that admitted its `Cluster`s.
    pub seed_name: String,
    /// `Cluster`s seen deleted lately, by project: a reservation recorded for one goes at once.
    pub gone_clusters: GoneClusters,
    /// The watch of the seed's `Cluster`s failed and has not listed them again since: a
    /// `Cluster` may exist uncounted, so no reservation of one expires meanwhile.
    pub clusters_watch_failed: bool,
}

/// `Cluster`s seen deleted (or replaced by one of the same name), remembered for
/// [`machines::GONE_KEPT`] as gone Machines are.
#[derive(Debug, Default)]
pub struct GoneClusters(std::collections::VecDeque<(Instant, String, String)>);

impl GoneClusters {
    fn gone(&mut self, project: &str, uid: &str, now: Instant) {
        while self
            .0
            .front()
            .is_some_and(|(at, _, _)| now.saturating_duration_since(*at) >= machines::GONE_KEPT)
        {
            self.0.pop_front();
        }
        self.0.push_back((now, project.to_owned(), uid.to_owned()));
    }

    /// The UIDs of `project`'s `Cluster`s seen gone.
    pub fn of<'a>(&'a self, project: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(_, p, _)| p == project)
            .map(|(_, _, uid)| uid.as_str())
    }
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
            lifetimes: kkp_quota_crds::ledger::lifetimes::Lifetimes::new(),
            remembered: last_size::Remembered::default(),
            ledgers: crate::view::Ledgers::default(),
            successions: crate::succession::Successions::default(),
            seed_name: String::new(),
            gone_clusters: GoneClusters::default(),
            clusters_watch_failed: false,
        }
    }

    /// The state of seed `name`.
    #[must_use]
    pub fn on_seed(mut self, name: &str) -> State {
        name.clone_into(&mut self.seed_name);
        self
    }

    fn mark(&mut self, cluster: &str) {
        self.dirty_clusters.insert(cluster.to_owned());
        if let Some(project) = self.clusters.get(cluster).and_then(|c| c.project.clone()) {
            self.dirty_projects.insert(project);
        }
    }

    /// The `Cluster` watch failed: every project is marked for a write that keeps its `Cluster`
    /// reservations. Returns whether it had failed already.
    pub fn clusters_unwatched(&mut self) -> bool {
        let already = std::mem::replace(&mut self.clusters_watch_failed, true);
        if !already {
            self.mark_all();
        }
        already
    }

    /// A `Cluster` was seen on the seed.
    pub fn upsert_cluster(
        &mut self,
        name: &str,
        uid: Option<String>,
        project: Option<String>,
        status: Option<ClusterStatus>,
    ) {
        let now = Instant::now();
        let entry = self.clusters.entry(name.to_owned()).or_default();
        // One of the same name with another UID: the old one was deleted (its delete missed).
        if let (Some(old), Some(project)) = (
            entry.uid.as_ref().filter(|old| uid.as_ref() != Some(*old)),
            &entry.project,
        ) {
            self.gone_clusters.gone(project, old, now);
        }
        let uid_changed = entry.uid != uid;
        entry.uid = uid;
        if entry.baseline.is_none() && entry.observed.is_none() {
            entry.baseline = status.as_ref().and_then(|s| s.resource_usage.clone());
        }
        let changed = entry.project != project;
        let old_project = std::mem::replace(&mut entry.project, project);
        entry.observed = status;
        if changed && let Some(old) = old_project {
            self.dirty_projects.insert(old);
        }
        // Another project, or another `Cluster` of the same name (its count and the old one's
        // gone reservation are this write's).
        if changed || uid_changed {
            self.mark(name);
        }
    }

    /// A `Cluster` is gone from the seed: its usage no longer counts for its project.
    pub fn remove_cluster(&mut self, name: &str) {
        if let Some(cluster) = self.clusters.remove(name)
            && let Some(project) = cluster.project
        {
            if let Some(uid) = &cluster.uid {
                self.gone_clusters.gone(&project, uid, Instant::now());
            }
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

    /// The projects with a cluster on this seed.
    pub fn projects(&self) -> BTreeSet<String> {
        self.clusters.values().filter_map(|c| c.project.clone()).collect()
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

/// What the tests of the state's parts share.
#[cfg(test)]
mod fixtures {
    use kkp_quota_crds::machine::Machine;
    use kkp_quota_crds::{Quantity, Resource, ResourceDetails};
    use provider_sizes::SizeCatalog;
    use serde_json::json;

    use super::State;
    use crate::ledger::Appeared;

    /// `(cluster, uid)` of the project's appeared Machines.
    pub(super) fn appeared_keys(state: &State, project: &str) -> Vec<(String, String)> {
        state
            .project_plan(project)
            .unwrap()
            .appeared
            .iter()
            .map(Appeared::key)
            .collect()
    }

    pub(super) fn machine(uid: &str, instance_type: &str) -> Machine {
        serde_json::from_value(json!({
            "apiVersion": "cluster.k8s.io/v1alpha1", "kind": "Machine",
            "metadata": {"name": format!("m-{uid}"), "namespace": "kube-system", "uid": uid},
            "spec": {"providerSpec": {"value": {"cloudProvider": "aws", "cloudProviderSpec": {"instanceType": instance_type, "diskSize": 10}}}},
        }))
        .unwrap()
    }

    pub(super) fn cpu(usage: &ResourceDetails) -> Quantity {
        usage.amount(Resource::Cpu)
    }

    pub(super) fn state_with(clusters: &[(&str, &str)]) -> State {
        let mut state = State::new(SizeCatalog::shipped());
        for (name, project) in clusters {
            state.upsert_cluster(
                name,
                Some(format!("uid-{name}")),
                Some((*project).to_owned()),
                None,
            );
        }
        state
    }
}
