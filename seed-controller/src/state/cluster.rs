//! One user cluster as the controller sees it ([`ClusterState`]: its project, reachability,
//! counted Machines and what was last written), and the write of its `Cluster` status: the usage
//! and the `ResourceQuotaUsage` condition ([`State::cluster_plan`], [`ClusterPlan`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::fmt::Write as _;
use std::time::Instant;

use kkp_quota_crds::ResourceDetails;
use kkp_quota_crds::kkp::{ClusterCondition, ClusterStatus};
use tokio::sync::mpsc::UnboundedSender;

use super::State;
use super::admission::Appearance;
use super::last_size::Counting;
use super::machines::{MachineEvent, MachineInfo};
use crate::usage::{ClusterUsage, same_usage};

/// The key of our condition in `Cluster.status.conditions` (KKP keeps conditions as a map).
pub const CONDITION_TYPE: &str = "ResourceQuotaUsage";
/// `kubermaticVersion` of our condition: KKP's schema requires the field (a patch without it is
/// refused whole), and KKP fills it with the version of whatever set the condition.
pub const CONDITION_WRITER: &str = concat!("kkp-quota-seed-controller-v", env!("CARGO_PKG_VERSION"));

/// Whether a user cluster's Machines can currently be watched.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Reachability {
    #[default]
    Unknown,
    Reachable,
    Unreachable(String),
}

/// One user cluster as the controller sees it.
#[derive(Debug, Default)]
pub struct ClusterState {
    pub project: Option<String>,
    /// The `Cluster` object's UID: the key of the reservation that admitted it
    /// (docs/capacity.md).
    pub uid: Option<String>,
    /// `status.resourceUsage` as first seen: the usage to report until the Machines are listed
    /// (after a restart, or while the cluster has never been reachable).
    pub(super) baseline: Option<ResourceDetails>,
    /// The status last seen on the seed, and the last one we wrote.
    pub(super) observed: Option<ClusterStatus>,
    pub(super) written: Option<(Option<ResourceDetails>, ClusterCondition)>,
    pub(super) usage: ClusterUsage,
    pub(super) machines: HashMap<String, MachineInfo>,
    /// Its `MachineDeployment`s, for the capacity reserved for the cluster autoscaler.
    pub deployments: super::deployments::Deployments,
    /// Its `MachineSet`s, for which deployment a Machine is of.
    pub machine_sets: super::machine_sets::MachineSets,
    pub synced: bool,
    pub reachability: Reachability,
    /// Machines that appeared while the watch was running: checked for a reservation.
    pub(super) appeared: BTreeMap<String, Appearance>,
    /// Machines seen gone (deleted, or missing from a complete listing): when, and their uid,
    /// oldest first. A reservation recorded after its Machine was deleted goes at once instead of
    /// at its TTL. Kept for [`GONE_KEPT`](super::machines::GONE_KEPT) (pruned from the front as
    /// new ones come, and at every listing).
    pub(super) gone: VecDeque<(Instant, String)>,
    /// Events already sent (uid, reason): every Event is sent once per Machine.
    pub(super) reported: HashSet<(String, &'static str)>,
    pub(super) events: Option<UnboundedSender<MachineEvent>>,
    /// The unsizeable label sets last exported for this cluster.
    pub(super) exported_unsizeable: BTreeSet<(String, String, String)>,
    /// Likewise for the Machines counted at their last known size (with the project).
    pub(super) exported_last_size: BTreeSet<LastSizeLabels>,
}

/// `(project, provider, flavour, reason)`.
pub type LastSizeLabels = (String, String, String, String);

impl ClusterState {
    /// Its counted Machines summed by the deployment they are of (by UID; see
    /// [`super::machine_sets`]).
    pub fn members(&self) -> Result<HashMap<String, ResourceDetails>, kkp_quota_crds::QuantityError> {
        let mut members: HashMap<String, ResourceDetails> = HashMap::new();
        for info in self.machines.values() {
            let deployment = info
                .set
                .as_deref()
                .and_then(|set| self.machine_sets.deployment_of(set));
            if let (Some(deployment), Some(size)) = (deployment, info.counting().size()) {
                let sum = members
                    .entry(deployment.to_owned())
                    .or_insert_with(ResourceDetails::zero);
                *sum = sum.checked_add(size)?;
            }
        }
        Ok(members)
    }

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
    /// `(provider, flavour, reason)` -> number of Machines not counted.
    pub unsizeable: BTreeMap<(String, String, String), usize>,
    /// `(provider, flavour, reason)` -> number of Machines counted at their last known size.
    pub at_last_size: BTreeMap<(String, String, String), usize>,
}

impl State {
    /// The write a `Cluster` needs, if it is still on the seed.
    pub fn cluster_plan(&self, name: &str) -> Option<ClusterPlan> {
        let cluster = self.clusters.get(name)?;
        let mut unsizeable = BTreeMap::<(String, String, String), usize>::new();
        let mut at_last_size = BTreeMap::<(String, String, String), usize>::new();
        let mut problems = Vec::new();
        let mut kept = Vec::new();
        for info in cluster.machines.values() {
            let (e, counts, list, line) = match info.counting() {
                Counting::Sized(_) => continue,
                Counting::Uncounted(e) => (
                    e,
                    &mut unsizeable,
                    &mut problems,
                    format!("{}/{}: {e}", info.namespace, info.name),
                ),
                Counting::LastKnown(size, e) => (
                    e,
                    &mut at_last_size,
                    &mut kept,
                    format!("{}/{} at {size}: {e}", info.namespace, info.name),
                ),
            };
            *counts
                .entry((
                    e.provider().to_owned(),
                    e.flavour().unwrap_or_default().to_owned(),
                    e.reason().to_owned(),
                ))
                .or_default() += 1;
            list.push(line);
        }
        problems.sort();
        kept.sort();
        let condition = condition(cluster, &problems, &kept);
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
            at_last_size,
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

    /// Likewise for the label sets of Machines counted at their last known size.
    pub fn exported_last_size(&mut self, name: &str, now: BTreeSet<LastSizeLabels>) -> Vec<LastSizeLabels> {
        let Some(c) = self.clusters.get_mut(name) else {
            return Vec::new();
        };
        let stale = c.exported_last_size.difference(&now).cloned().collect();
        c.exported_last_size = now;
        stale
    }
}

/// Up to five of `lines`, and how many more.
fn some_of(lines: &[String]) -> String {
    let mut text = lines
        .iter()
        .take(5)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join("; ");
    let more = lines.len().saturating_sub(5);
    if more > 0 {
        let _ = write!(text, " (and {more} more)");
    }
    text
}

/// The `ResourceQuotaUsage` condition (without timestamps) for a cluster: `problems` are the
/// Machines not counted, `kept` those counted at their last known size.
fn condition(cluster: &ClusterState, problems: &[String], kept: &[String]) -> ClusterCondition {
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
            let mut message = format!(
                "{} Machine(s) cannot be sized and are not counted in the project's usage: {}",
                problems.len(),
                some_of(problems)
            );
            if !kept.is_empty() {
                let _ = write!(message, ". {}", counted_at_last_size(kept));
            }
            ("False", "UnsizeableMachines", message)
        }
        _ if !kept.is_empty() => (
            "False",
            "MachinesCountedAtLastKnownSize",
            counted_at_last_size(kept),
        ),
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

fn counted_at_last_size(kept: &[String]) -> String {
    format!(
        "{} Machine(s) can no longer be sized and are counted in the project's usage at their last \
         known size until they are deleted: {}",
        kept.len(),
        some_of(kept)
    )
}

#[cfg(test)]
mod tests {
    use kkp_quota_crds::{Quantity, Resource};
    use provider_sizes::SizeCatalog;

    use super::*;
    use crate::state::fixtures::{cpu, machine, state_with};

    #[test]
    fn unsynced_clusters_report_their_last_written_usage_and_are_unsettled() {
        let mut state = State::new(SizeCatalog::shipped());
        let mut usage = ResourceDetails::zero();
        usage.set(Resource::Cpu, Some(Quantity::from_units(7)));
        let status = ClusterStatus {
            resource_usage: Some(usage),
            ..ClusterStatus::default()
        };
        state.upsert_cluster("a", None, Some("p".into()), Some(status));
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
