//! One project's snapshot for the write of its ledger ([`State::project_plan`], [`ProjectPlan`]:
//! its usage, counted and gone Machines, appeared Machines, whether it is unsettled, the Machines
//! counted at their last known size), and the record of its ledger's share activity.

use std::collections::HashSet;

use kkp_quota_crds::autoscaled::AutoscaledDeployment;
use kkp_quota_crds::rollout::Presence;
use kkp_quota_crds::{LastKnownSize, ResourceDetails};

use super::State;
use crate::ledger::{Appeared, Counted};
use crate::usage::project_usage;

/// What to write to one project's seed quota copy, from one snapshot.
#[derive(Debug, Clone)]
pub struct ProjectPlan {
    pub project: String,
    pub local_usage: ResourceDetails,
    /// `reservedUsage`: what the project's autoscaled `MachineDeployment`s here may still add;
    /// `None` while a cluster of it has not listed them yet (the ledger keeps its own).
    pub reserved_usage: Option<ResourceDetails>,
    /// `status.autoscaled`: the project's autoscaled deployments here with their members
    /// (`kkp_quota_crds::autoscaled`), of the clusters whose deployments have been listed.
    pub autoscaled: Vec<AutoscaledDeployment>,
    /// The project's clusters whose deployments have not been listed since this process
    /// started: the ledger's entries of them stand for them (`writer::decision`).
    pub autoscaled_unknown: HashSet<String>,
    pub counted: Counted,
    /// Machines that appeared while watched, to check for reservations.
    pub appeared: Vec<Appeared>,
    /// One of the project's own clusters is unsettled: its allotments must not expire.
    pub project_unsettled: bool,
    /// `status.lastKnownSizes`: the Machines counted at their last known size, sorted.
    pub last_known: Vec<LastKnownSize>,
    /// The project's clusters watched in full now (listed, settled): a Machine of one of them
    /// that is not counted is gone.
    pub watched: HashSet<String>,
    /// Every cluster on the seed: the Machines of any other are gone with their cluster.
    pub known: HashSet<String>,
}

impl ProjectPlan {
    /// Where a Machine a rollout surge replaces stands (`kkp_quota_crds::rollout`): one not
    /// counted in a cluster watched in full is gone (it existed when the surge was admitted).
    pub fn presence(&self, cluster: &str, uid: &str) -> Presence {
        let key = (cluster.to_owned(), uid.to_owned());
        if self.seen_gone(cluster, uid) {
            Presence::Gone
        } else if self.counted.machines.contains_key(&key) {
            Presence::There
        } else if self.watched.contains(cluster) {
            Presence::Gone
        } else {
            Presence::Unknown
        }
    }

    /// A Machine seen deleted lately, or of a cluster no longer on the seed. (A Machine merely
    /// not counted yet may not have appeared yet: not gone.)
    pub fn seen_gone(&self, cluster: &str, uid: &str) -> bool {
        !self.known.contains(cluster) || self.counted.gone.contains(&(cluster.to_owned(), uid.to_owned()))
    }
}

impl State {
    /// One consistent snapshot for a project's write.
    pub fn project_plan(&self, project: &str) -> Result<ProjectPlan, kkp_quota_crds::QuantityError> {
        let mut counted = Counted::default();
        let mut usages = Vec::new();
        let mut appeared = Vec::new();
        let mut project_unsettled = false;
        let mut watched = HashSet::new();
        let mut clusters = 0;
        let mut reserved = Some(Vec::new());
        let mut autoscaled = Vec::new();
        let mut autoscaled_unknown = HashSet::new();
        for (name, cluster) in &self.clusters {
            if cluster.unsettled() {
                counted.unsettled.insert(name.clone());
            }
            if cluster.project.as_deref() != Some(project) {
                continue;
            }
            clusters += 1;
            // The `Cluster` itself, under the seed's name: a reservation that admitted it goes
            // once the same write counts it, or at once if it is gone (docs/capacity.md).
            if let Some(uid) = &cluster.uid {
                counted.machines.insert(
                    (self.seed_name.clone(), uid.clone()),
                    ResourceDetails::one_cluster(),
                );
            }
            project_unsettled |= cluster.unsettled();
            usages.push(cluster.reported_usage());
            if cluster.deployments.pending() {
                reserved = None;
            } else if let Some(reserved) = &mut reserved {
                reserved.push(cluster.deployments.reserved());
            }
            if cluster.deployments.known() {
                autoscaled.extend(cluster.deployments.autoscaled(name, &cluster.members()?));
            } else {
                autoscaled_unknown.insert(name.clone());
            }
            if cluster.deployments.failing() {
                counted.unsettled.insert(name.clone());
            }
            for (uid, version) in cluster.deployments.versions() {
                counted
                    .deployments
                    .insert((name.clone(), uid.to_owned()), version.to_owned());
            }
            if cluster.synced && !cluster.unsettled() {
                watched.insert(name.clone());
            }
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
        let seed = &self.seed_name;
        counted.gone.extend(
            self.gone_clusters
                .of(project)
                .map(|uid| (seed.clone(), uid.to_owned())),
        );
        if self.clusters_listed && !self.clusters_watch_failed {
            watched.insert(seed.clone());
        } else {
            // (Nothing is written before the list is read; after a failed watch, nothing of a
            // `Cluster` that may exist unseen expires: its reservation, nor the allotment it may
            // have been admitted from.)
            counted.unsettled.insert(seed.clone());
            project_unsettled |= self.clusters_watch_failed;
        }
        let mut known: HashSet<String> = self.clusters.keys().cloned().collect();
        known.insert(seed.clone());
        Ok(ProjectPlan {
            project: project.to_owned(),
            local_usage: project_usage(usages.iter(), clusters)?,
            reserved_usage: reserved
                .map(|r| ResourceDetails::checked_sum(r.iter()))
                .transpose()?,
            autoscaled,
            autoscaled_unknown,
            counted,
            appeared,
            project_unsettled,
            last_known: self.last_known_of(project),
            watched,
            known,
        })
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
}

#[cfg(test)]
mod tests {
    use kkp_quota_crds::{Quantity, Resource};

    use crate::state::fixtures::{cpu, machine, state_with};

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
        let usage = state.project_plan("p").unwrap().local_usage;
        assert_eq!(
            usage.amount(Resource::Clusters),
            Quantity::from_units(1),
            "b is still there"
        );
        assert_eq!(cpu(&usage), Quantity::ZERO);
        state.remove_cluster("b");
        assert!(state.project_plan("p").unwrap().local_usage.is_empty());
    }

    #[test]
    fn every_cluster_of_the_project_counts_one_reachable_or_not() {
        let mut state = state_with(&[("a", "p"), ("b", "p"), ("c", "q")]);
        state.cluster_listed("a", vec![machine("1", "t3.medium")]);
        let clusters = |state: &crate::state::State, p: &str| {
            state
                .project_plan(p)
                .unwrap()
                .local_usage
                .amount(Resource::Clusters)
        };
        assert_eq!(
            clusters(&state, "p"),
            Quantity::from_units(2),
            "b is not listed yet and counts"
        );
        assert_eq!(clusters(&state, "q"), Quantity::from_units(1));
        assert_eq!(clusters(&state, "none"), Quantity::ZERO);
        state.upsert_cluster("c", Some("uid-c".to_owned()), Some("p".to_owned()), None);
        assert_eq!(clusters(&state, "p"), Quantity::from_units(3), "moved to p");
        assert_eq!(clusters(&state, "q"), Quantity::ZERO);
    }

    #[test]
    fn a_clusters_reservation_finds_it_counted_or_gone_under_the_seeds_name() {
        let mut state = state_with(&[("a", "p"), ("b", "q")]).on_seed("seed-1");
        let key = |uid: &str| ("seed-1".to_owned(), uid.to_owned());
        let plan = state.project_plan("p").unwrap();
        assert_eq!(
            plan.counted.machines.get(&key("uid-a")),
            Some(&kkp_quota_crds::ResourceDetails::one_cluster())
        );
        assert!(
            !plan.counted.machines.contains_key(&key("uid-b")),
            "another project's"
        );
        assert!(
            plan.counted.unsettled.contains("seed-1"),
            "the Cluster list is not read yet"
        );
        assert!(!plan.seen_gone("seed-1", "uid-x"), "the seed is known");
        state.clusters_listed = true;
        assert!(state.project_plan("p").unwrap().watched.contains("seed-1"));
        // The Cluster watch fails: unseen Clusters may exist, so nothing of theirs expires.
        assert!(!state.clusters_unwatched());
        let plan = state.project_plan("p").unwrap();
        assert!(plan.counted.unsettled.contains("seed-1") && plan.project_unsettled);
        assert!(state.dirty_projects.contains("p"));
        state.clusters_watch_failed = false;
        // Deleted, and re-created under the same name with a missed delete: both gone.
        state.remove_cluster("a");
        state.upsert_cluster("b", Some("uid-b2".to_owned()), Some("q".to_owned()), None);
        let plan = state.project_plan("p").unwrap();
        assert!(plan.seen_gone("seed-1", "uid-a"));
        assert!(!plan.counted.machines.contains_key(&key("uid-a")));
        let plan = state.project_plan("q").unwrap();
        assert!(plan.seen_gone("seed-1", "uid-b"));
        assert!(!plan.seen_gone("seed-1", "uid-b2"));
        assert!(plan.counted.machines.contains_key(&key("uid-b2")));
    }
}
