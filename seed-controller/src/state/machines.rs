//! A user cluster's Machines: their sizing against the size catalog (with the last known size of
//! those that can no longer be sized, see `last_size`), the count they make, the watch's changes
//! and complete listings (with the drift a listing reveals), the Machines remembered as gone (so a
//! reservation recorded after its Machine was deleted goes at once), and the Events published on
//! Machines.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kkp_quota_crds::machine::Machine;
use kkp_quota_crds::{LastKnownSize, ResourceDetails};
use kube::ResourceExt;
use provider_sizes::{SizeCatalog, SizingError, size_machine};
use tracing::{error, warn};

use super::admission::Appearance;
use super::last_size::{Counting, last_size};
use super::{ClusterState, State};
use crate::usage::Drift;

/// Event reasons on Machines in user clusters.
pub const REASON_UNSIZEABLE: &str = "QuotaUnsizeableMachine";
pub const REASON_UNADMITTED: &str = "QuotaUnadmittedMachine";
pub const REASON_COUNTED_AT_LAST_SIZE: &str = "QuotaMachineCountedAtLastSize";

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
pub(super) struct MachineInfo {
    pub(super) namespace: String,
    pub(super) name: String,
    pub(super) spec: Machine,
    pub(super) sizing: Result<ResourceDetails, SizingError>,
    /// While it cannot be sized: the size it last had, if it ever had one (it counts so).
    pub(super) last_size: Option<ResourceDetails>,
    /// The UID of the `MachineSet` controlling it (for the room of its deployment).
    pub(super) set: Option<String>,
}

impl MachineInfo {
    pub(super) fn counting(&self) -> Counting<'_> {
        Counting::of(&self.sizing, self.last_size.as_ref())
    }

    /// Its `status.lastKnownSizes` entry, while it is counted at its last known size.
    pub(super) fn last_known(&self, cluster: &str, uid: &str) -> Option<LastKnownSize> {
        match self.counting() {
            Counting::LastKnown(size, _) => Some(LastKnownSize {
                cluster: cluster.to_owned(),
                uid: uid.to_owned(),
                machine: format!("{}/{}", self.namespace, self.name),
                size: size.clone(),
            }),
            Counting::Sized(_) | Counting::Uncounted(_) => None,
        }
    }
}

/// How long a gone Machine's uid is remembered: longer than any sensible reservation TTL
/// (a reservation older than its TTL goes anyway).
pub(super) const GONE_KEPT: Duration = Duration::from_mins(10);

impl ClusterState {
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

impl State {
    fn size(catalog: &SizeCatalog, machine: &Machine) -> Result<ResourceDetails, SizingError> {
        size_machine(machine, catalog, None)
    }

    /// `before`: how the same Machine counted until now; `persisted`: the size its ledger keeps
    /// for it (see `last_size`).
    fn info(
        catalog: &SizeCatalog,
        machine: Machine,
        before: Option<Counting<'_>>,
        persisted: Option<&ResourceDetails>,
    ) -> MachineInfo {
        let name = machine.name_any();
        let set =
            super::machine_sets::controller_of(machine.owner_references(), "MachineSet").map(str::to_owned);
        // Keep only what sizing needs (not metadata such as managedFields).
        let spec = Machine::new(&name, machine.spec);
        let sizing = Self::size(catalog, &spec);
        MachineInfo {
            namespace: machine.metadata.namespace.unwrap_or_default(),
            last_size: last_size(&sizing, before, persisted),
            sizing,
            name,
            spec,
            set,
        }
    }

    /// Applies one Machine's sizing to the cluster's usage and queues its Events.
    pub(super) fn account(cluster_name: &str, cluster: &mut ClusterState, uid: &str) -> bool {
        let Some(info) = cluster.machines.get(uid) else {
            return false;
        };
        let counting = info.counting();
        let changed = match cluster.usage.set(uid, counting.size()) {
            Ok(changed) => changed,
            Err(e) => {
                error!(cluster = cluster_name, error = %e, "usage overflow; machine not counted");
                false
            }
        };
        let (e, reason) = match counting {
            Counting::Sized(_) => return changed,
            Counting::Uncounted(e) => (e, REASON_UNSIZEABLE),
            Counting::LastKnown(_, e) => (e, REASON_COUNTED_AT_LAST_SIZE),
        };
        let key = (uid.to_owned(), reason);
        if !cluster.reported.contains(&key) {
            let last_size = counting.size().map(ToString::to_string);
            warn!(cluster = cluster_name, machine = %info.name, provider = e.provider(), reason = e.reason(), ?last_size, "machine cannot be sized: {e}");
            if let Some(sender) = &cluster.events {
                let message = match last_size {
                    None => format!("This Machine is not counted in the project's resource quota usage: {e}"),
                    Some(size) => format!(
                        "This Machine can no longer be sized; it is counted in the project's resource quota \
                         usage at its last known size ({size}) until it is deleted: {e}"
                    ),
                };
                let sent = sender.send(MachineEvent {
                    namespace: info.namespace.clone(),
                    name: info.name.clone(),
                    uid: uid.to_owned(),
                    reason,
                    message,
                });
                if sent.is_ok() {
                    cluster.reported.insert(key);
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
        let persisted = self
            .remembered
            .get(cluster.project.as_deref(), cluster_name, &uid);
        let set = super::machine_sets::controller_of(machine.owner_references(), "MachineSet");
        if cluster
            .machines
            .get(&uid)
            .is_some_and(|old| old.spec.spec == machine.spec && old.set.as_deref() == set)
        {
            return;
        }
        let before = cluster.machines.get(&uid);
        let new = before.is_none();
        let info = Self::info(&catalog, machine, before.map(MachineInfo::counting), persisted);
        if new && watching && cluster.synced {
            cluster.appeared.insert(uid.clone(), Appearance::now());
        }
        cluster.machines.insert(uid.clone(), info);
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
                let persisted = self
                    .remembered
                    .get(cluster.project.as_deref(), cluster_name, &uid);
                // Reuse the sizing of unchanged Machines.
                let info = match cluster.machines.remove(&uid) {
                    Some(old) if old.spec.spec == machine.spec => old,
                    // Known before and changed meanwhile: counted all along, so never a bypass
                    // candidate (and never held back, which would drop it from the count).
                    Some(old) => Self::info(&catalog, machine, Some(old.counting()), persisted),
                    None => {
                        if !first {
                            cluster
                                .appeared
                                .entry(uid.clone())
                                .or_insert_with(Appearance::now);
                        }
                        Self::info(&catalog, machine, None, persisted)
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
            .filter_map(|(uid, m)| m.counting().size().map(|s| (uid.clone(), s.clone())))
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

    /// A new size catalog: every Machine, and every autoscaled deployment's template, is sized
    /// again.
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
                let persisted = self.remembered.get(cluster.project.as_deref(), &name, &uid);
                if let Some(info) = cluster.machines.get_mut(&uid) {
                    let sizing = Self::size(&catalog, &info.spec);
                    if sizing != info.sizing {
                        // An entry removed from the catalog: counted at the size it had.
                        info.last_size = last_size(&sizing, Some(info.counting()), persisted);
                        info.sizing = sizing;
                        changed = true;
                        Self::account(&name, cluster, &uid);
                    }
                }
            }
            changed |= cluster.deployments.resize(&name, &catalog);
            if changed {
                self.mark(&name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use kkp_quota_crds::Quantity;

    use super::*;
    use crate::state::fixtures::{cpu, machine, state_with};

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
}
