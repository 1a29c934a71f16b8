//! A user cluster's `MachineSet`s, as far as the policy `reservedCounts` needs them: which
//! `MachineDeployment` controls each, so that a Machine (controlled by a `MachineSet`) is counted
//! as a member of its deployment's room (`kkp_quota_crds::autoscaled`). A Machine whose
//! `MachineSet` is not known yet is counted alone; its deployment's room is then larger, never
//! smaller, than it will be.

use std::collections::HashMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kkp_quota_crds::machine::MachineSet;
use kube::ResourceExt;

use super::State;

/// The UID of the controller owner of `kind` in machine-controller's group among `owners` (the
/// webhook admits from a deployment's room only by the same chain).
pub(crate) fn controller_of<'a>(owners: &'a [OwnerReference], kind: &str) -> Option<&'a str> {
    kkp_quota_crds::machine::controller_ref(owners, kind).map(|o| o.uid.as_str())
}

/// A cluster's `MachineSet`s: UID -> the UID of the `MachineDeployment` controlling it.
#[derive(Debug, Default)]
pub struct MachineSets {
    deployment_of: HashMap<String, Option<String>>,
}

impl MachineSets {
    /// The deployment a Machine controlled by `MachineSet` `set` belongs to, when known.
    pub fn deployment_of(&self, set: &str) -> Option<&str> {
        self.deployment_of.get(set)?.as_deref()
    }

    fn apply(&mut self, set: &MachineSet) -> bool {
        let Some(uid) = set.uid() else { return false };
        let deployment = controller_of(set.owner_references(), "MachineDeployment").map(str::to_owned);
        self.deployment_of.insert(uid, deployment.clone()) != Some(deployment)
    }
}

impl State {
    /// A `MachineSet` was added or changed; returns whether its deployment is news.
    pub fn machine_set_applied(&mut self, cluster_name: &str, set: &MachineSet) -> bool {
        let changed = self
            .clusters
            .get_mut(cluster_name)
            .is_some_and(|c| c.machine_sets.apply(set));
        if changed {
            self.mark(cluster_name);
        }
        changed
    }

    /// A `MachineSet` is gone (its Machines go with it, or are orphaned and count alone).
    pub fn machine_set_deleted(&mut self, cluster_name: &str, uid: &str) -> bool {
        let known = self
            .clusters
            .get_mut(cluster_name)
            .is_some_and(|c| c.machine_sets.deployment_of.remove(uid).is_some());
        if known {
            self.mark(cluster_name);
        }
        known
    }

    /// A complete listing of a cluster's `MachineSet`s.
    pub fn machine_sets_listed(&mut self, cluster_name: &str, sets: &[MachineSet]) -> bool {
        let Some(cluster) = self.clusters.get_mut(cluster_name) else {
            return false;
        };
        let mut listed = MachineSets::default();
        for set in sets {
            listed.apply(set);
        }
        let changed = listed.deployment_of != cluster.machine_sets.deployment_of;
        cluster.machine_sets = listed;
        if changed {
            self.mark(cluster_name);
        }
        changed
    }
}
