//! Machines that were sized once and can no longer be (their catalog entry removed, their flavour
//! renamed, the admin catalog edited): counted at their last known size until they are gone, so
//! that their room is not admitted again. A Machine never sized is not counted, as before.
//!
//! The size is kept with the Machine in memory, and in its ledger's `status.lastKnownSizes`
//! (written with `localUsage`), which a restarted controller reads back ([`Remembered`]).

use std::collections::{BTreeMap, HashMap};

use kkp_quota_crds::{LastKnownSize, ResourceDetails};
use provider_sizes::SizingError;

use super::State;

/// How a Machine counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counting<'a> {
    Sized(&'a ResourceDetails),
    /// Cannot be sized now (why): counted at the size it last had.
    LastKnown(&'a ResourceDetails, &'a SizingError),
    /// Cannot be sized and never was: not counted.
    Uncounted(&'a SizingError),
}

impl<'a> Counting<'a> {
    pub fn of(
        sizing: &'a Result<ResourceDetails, SizingError>,
        last_size: Option<&'a ResourceDetails>,
    ) -> Counting<'a> {
        match (sizing, last_size) {
            (Ok(size), _) => Counting::Sized(size),
            (Err(e), Some(size)) => Counting::LastKnown(size, e),
            (Err(e), None) => Counting::Uncounted(e),
        }
    }

    /// The size it is counted at.
    pub fn size(self) -> Option<&'a ResourceDetails> {
        match self {
            Counting::Sized(size) | Counting::LastKnown(size, _) => Some(size),
            Counting::Uncounted(_) => None,
        }
    }
}

/// The size a Machine sized `new` falls back to: none while it can be sized; else the size it
/// was counted at `before` (its previous sizing, or its own fallback), else the one its ledger
/// kept (`persisted`: the controller restarted since).
pub fn last_size(
    new: &Result<ResourceDetails, SizingError>,
    before: Option<Counting<'_>>,
    persisted: Option<&ResourceDetails>,
) -> Option<ResourceDetails> {
    if new.is_ok() {
        return None;
    }
    before.and_then(Counting::size).or(persisted).cloned()
}

/// The last known sizes the ledgers keep, as last read: project -> cluster -> uid -> entry.
#[derive(Debug, Default)]
pub struct Remembered(BTreeMap<String, HashMap<String, HashMap<String, LastKnownSize>>>);

impl Remembered {
    pub fn get(&self, project: Option<&str>, cluster: &str, uid: &str) -> Option<&ResourceDetails> {
        Some(&self.0.get(project?)?.get(cluster)?.get(uid)?.size)
    }

    /// A project's ledger was read: its entries replace the ones read before.
    pub fn replace(&mut self, project: &str, entries: &[LastKnownSize]) {
        let mut clusters: HashMap<String, HashMap<String, LastKnownSize>> = HashMap::new();
        for e in entries {
            clusters
                .entry(e.cluster.clone())
                .or_default()
                .insert(e.uid.clone(), e.clone());
        }
        if clusters.is_empty() {
            self.0.remove(project);
        } else {
            self.0.insert(project.to_owned(), clusters);
        }
    }

    /// The entries of one cluster of a project, as read (for a cluster not listed yet: they are
    /// written back unchanged).
    pub fn of_cluster(&self, project: &str, cluster: &str) -> Vec<LastKnownSize> {
        self.0
            .get(project)
            .and_then(|c| c.get(cluster))
            .into_iter()
            .flat_map(HashMap::values)
            .cloned()
            .collect()
    }
}

impl State {
    /// A project's ledger was read (by the writer or the quota watch) with these
    /// `status.lastKnownSizes`: they are remembered, and a Machine of the project that cannot be
    /// sized and has no last size here (this process never saw it sized: it restarted) takes
    /// the one its ledger kept. Returns whether a count changed (its cluster is marked).
    pub fn ledger_last_sizes(&mut self, project: &str, entries: &[LastKnownSize]) -> bool {
        self.remembered.replace(project, entries);
        let mut changed = Vec::new();
        for (name, cluster) in &mut self.clusters {
            if cluster.project.as_deref() != Some(project) {
                continue;
            }
            let adopt: Vec<(String, ResourceDetails)> = cluster
                .machines
                .iter()
                .filter(|(_, m)| matches!(m.counting(), Counting::Uncounted(_)))
                .filter_map(|(uid, _)| {
                    let size = self.remembered.get(Some(project), name, uid)?;
                    Some((uid.clone(), size.clone()))
                })
                .collect();
            for (uid, size) in &adopt {
                if let Some(info) = cluster.machines.get_mut(uid) {
                    info.last_size = Some(size.clone());
                }
                State::account(name, cluster, uid);
            }
            if !adopt.is_empty() {
                changed.push(name.clone());
            }
        }
        for name in &changed {
            self.mark(name);
        }
        !changed.is_empty()
    }

    /// A project's ledger is gone: so are the sizes it kept.
    pub fn forget_last_sizes(&mut self, project: &str) {
        self.remembered.replace(project, &[]);
    }

    /// A project's `status.lastKnownSizes` now, by cluster and uid: its Machines counted at their
    /// last known size, and for a cluster not listed yet the entries its ledger kept.
    pub(super) fn last_known_of(&self, project: &str) -> Vec<LastKnownSize> {
        let mut entries = Vec::new();
        for (name, cluster) in &self.clusters {
            if cluster.project.as_deref() != Some(project) {
                continue;
            }
            if cluster.synced {
                entries.extend(
                    cluster
                        .machines
                        .iter()
                        .filter_map(|(uid, m)| m.last_known(name, uid)),
                );
            } else {
                entries.extend(self.remembered.of_cluster(project, name));
            }
        }
        sort(&mut entries);
        entries
    }
}

/// `status.lastKnownSizes` in their written order (by cluster and uid), so that two lists
/// compare equal when they hold the same.
pub fn sort(entries: &mut [LastKnownSize]) {
    entries.sort_by(|a, b| (&a.cluster, &a.uid).cmp(&(&b.cluster, &b.uid)));
}

#[cfg(test)]
mod tests {
    use kkp_quota_crds::{Quantity, Resource};
    use provider_sizes::{AdminCatalog, SizeCatalog};

    use super::*;
    use crate::state::REASON_COUNTED_AT_LAST_SIZE;
    use crate::state::fixtures::{cpu, machine, state_with};

    fn size(cpu: i64) -> ResourceDetails {
        let mut d = ResourceDetails::zero();
        d.set(Resource::Cpu, Some(Quantity::from_units(cpu)));
        d
    }

    fn unsizeable() -> Result<ResourceDetails, SizingError> {
        provider_sizes::size_machine(&machine("x", "t9.nothing"), &SizeCatalog::shipped(), None)
    }

    /// The shipped catalog, and t9.custom at `cpu` cores if given.
    fn catalog(cpu: Option<u32>) -> SizeCatalog {
        let text = cpu.map_or_else(
            || "providers: {}\n".to_owned(),
            |c| format!("providers:\n  aws:\n    t9.custom: {{cpu: {c}, memory: 1Gi}}\n"),
        );
        SizeCatalog::shipped().with_admin(&AdminCatalog::parse(&text).unwrap())
    }

    fn entry(cluster: &str, uid: &str, cpu: i64) -> LastKnownSize {
        LastKnownSize {
            cluster: cluster.into(),
            uid: uid.into(),
            machine: format!("kube-system/m-{uid}"),
            size: size(cpu),
        }
    }

    #[test]
    fn the_last_size_is_the_one_counted_before_else_the_ledgers() {
        let (two, three) = (size(2), size(3));
        let err = unsizeable();
        let e = err.as_ref().unwrap_err();
        assert_eq!(
            last_size(&Ok(two.clone()), Some(Counting::Sized(&three)), Some(&three)),
            None
        );
        assert_eq!(
            last_size(&err, Some(Counting::Sized(&two)), Some(&three)),
            Some(two.clone())
        );
        assert_eq!(
            last_size(&err, Some(Counting::LastKnown(&two, e)), Some(&three)),
            Some(two.clone())
        );
        assert_eq!(
            last_size(&err, Some(Counting::Uncounted(e)), Some(&three)),
            Some(three.clone())
        );
        assert_eq!(last_size(&err, None, Some(&three)), Some(three.clone()));
        // Never sized: not counted.
        assert_eq!(last_size(&err, Some(Counting::Uncounted(e)), None), None);
        assert_eq!(last_size(&err, None, None), None);
        assert_eq!(Counting::of(&err, Some(&two)), Counting::LastKnown(&two, e));
        assert_eq!(Counting::of(&err, Some(&two)).size(), Some(&two));
        assert_eq!(Counting::of(&err, None).size(), None);
        assert_eq!(Counting::of(&Ok(three.clone()), Some(&two)).size(), Some(&three));
    }

    #[test]
    fn a_machine_sized_once_counts_at_its_last_size_until_it_is_gone() {
        let mut state = state_with(&[("a", "p")]);
        let (sender, mut events) = tokio::sync::mpsc::unbounded_channel();
        state.set_events_sender("a", Some(sender));
        state.set_catalog(catalog(Some(16)));
        state.cluster_listed("a", vec![machine("1", "t9.custom"), machine("2", "t3.medium")]);
        let usage = |state: &State| cpu(&state.project_plan("p").unwrap().local_usage);
        assert_eq!(usage(&state), Quantity::from_units(18));
        // The entry goes: still counted, and said so.
        state.set_catalog(catalog(None));
        assert_eq!(usage(&state), Quantity::from_units(18));
        let plan = state.cluster_plan("a").unwrap();
        assert_eq!(plan.condition.reason, "MachinesCountedAtLastKnownSize");
        assert!(
            plan.condition.message.starts_with("1 Machine(s)"),
            "{}",
            plan.condition.message
        );
        assert!(
            plan.condition.message.contains("kube-system/m-1 at cpu=16"),
            "{}",
            plan.condition.message
        );
        assert!(plan.unsizeable.is_empty(), "counted, so not among the uncounted");
        let key = (
            "aws".to_owned(),
            "t9.custom".to_owned(),
            "UnknownFlavour".to_owned(),
        );
        assert_eq!(plan.at_last_size.get(&key), Some(&1));
        let event = events.try_recv().unwrap();
        assert_eq!(
            (event.uid.as_str(), event.reason),
            ("1", REASON_COUNTED_AT_LAST_SIZE)
        );
        assert!(
            event.message.contains("last known size (cpu=16"),
            "{}",
            event.message
        );
        let last_known = state.project_plan("p").unwrap().last_known;
        assert_eq!(last_known.len(), 1);
        assert_eq!(
            (last_known[0].uid.as_str(), last_known[0].machine.as_str()),
            ("1", "kube-system/m-1")
        );
        // A Machine never sized is not counted; listed again, nothing changes.
        state.machine_applied("a", machine("3", "t9.nothing"), true);
        state.cluster_listed(
            "a",
            vec![
                machine("1", "t9.custom"),
                machine("2", "t3.medium"),
                machine("3", "t9.nothing"),
            ],
        );
        assert_eq!(usage(&state), Quantity::from_units(18));
        let condition = state.cluster_plan("a").unwrap().condition;
        assert_eq!(condition.reason, "UnsizeableMachines");
        assert!(
            condition.message.contains("m-3")
                && condition.message.contains("1 Machine(s) can no longer be sized")
        );
        // Back in the catalog at another size: counted at it; gone again: at that one.
        state.set_catalog(catalog(Some(8)));
        assert_eq!(usage(&state), Quantity::from_units(10));
        assert!(state.project_plan("p").unwrap().last_known.is_empty());
        state.set_catalog(catalog(None));
        assert_eq!(usage(&state), Quantity::from_units(10));
        // Its spec changed to another unknown flavour: still the size it last had.
        state.machine_applied("a", machine("1", "t9.renamed"), true);
        assert_eq!(usage(&state), Quantity::from_units(10));
        // Deleted: no longer counted, nor kept.
        state.machine_deleted("a", "1");
        assert_eq!(usage(&state), Quantity::from_units(2));
        assert!(state.project_plan("p").unwrap().last_known.is_empty());
        assert!(state.cluster_plan("a").unwrap().at_last_size.is_empty());
    }

    #[test]
    fn after_a_restart_the_ledgers_sizes_are_taken_in_before_or_after_the_listing() {
        let usage = |state: &State| cpu(&state.project_plan("p").unwrap().local_usage);
        // Read before the listing (the quota watch is first).
        let mut state = state_with(&[("a", "p"), ("b", "p")]);
        assert!(!state.ledger_last_sizes("p", &[entry("a", "1", 16), entry("b", "9", 4)]));
        // Not listed yet: b's entry is written back as read.
        assert_eq!(
            state.project_plan("p").unwrap().last_known,
            vec![entry("a", "1", 16), entry("b", "9", 4)]
        );
        state.cluster_listed("a", vec![machine("1", "t9.custom"), machine("2", "t9.nothing")]);
        assert_eq!(usage(&state), Quantity::from_units(16));
        state.cluster_listed("b", vec![]);
        assert_eq!(
            state.project_plan("p").unwrap().last_known,
            vec![entry("a", "1", 16)]
        );
        // Read after the listing (the writer's read): taken in, the cluster marked.
        let mut state = state_with(&[("a", "p")]);
        state.cluster_listed("a", vec![machine("1", "t9.custom"), machine("2", "t9.nothing")]);
        assert_eq!(usage(&state), Quantity::ZERO);
        state.dirty_clusters.clear();
        assert!(state.ledger_last_sizes("p", &[entry("a", "1", 16), entry("a", "2-other", 1)]));
        assert!(state.dirty_clusters.contains("a"));
        assert_eq!(usage(&state), Quantity::from_units(16));
        assert!(
            !state.ledger_last_sizes("p", &[entry("a", "1", 16)]),
            "nothing new"
        );
        // In memory it stays, whatever a later read says; another project's ledger does not count.
        assert!(!state.ledger_last_sizes("p", &[]));
        assert!(!state.ledger_last_sizes("q", &[entry("a", "2", 1)]));
        assert_eq!(usage(&state), Quantity::from_units(16));
    }

    #[test]
    fn remembered_entries_are_replaced_per_project() {
        let mut remembered = Remembered::default();
        remembered.replace("p", &[entry("a", "1", 1), entry("b", "2", 2)]);
        remembered.replace("q", &[entry("c", "3", 3)]);
        assert_eq!(remembered.get(Some("p"), "b", "2"), Some(&size(2)));
        assert_eq!(remembered.get(Some("q"), "b", "2"), None);
        assert_eq!(remembered.get(None, "a", "1"), None);
        remembered.replace("p", &[entry("a", "1", 5)]);
        assert_eq!(remembered.get(Some("p"), "b", "2"), None);
        assert_eq!(remembered.of_cluster("p", "a"), vec![entry("a", "1", 5)]);
        remembered.replace("p", &[]);
        assert!(remembered.of_cluster("p", "a").is_empty());
        assert_eq!(remembered.get(Some("q"), "c", "3"), Some(&size(3)));
    }
}
