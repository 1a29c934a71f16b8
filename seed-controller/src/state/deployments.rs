//! A user cluster's `MachineDeployment`s, for the capacity reserved for the cluster autoscaler
//! (`kkp_quota_crds::reserved`): each one with autoscaling bounds reserves `(max - replicas)` of
//! its template's Machines, sized against the size catalog like any Machine. Shown beside the
//! usage (the ledger's `reservedUsage`), never counted in it (docs/capacity.md).

use std::collections::HashMap;
use std::sync::Arc;

use kkp_quota_crds::ResourceDetails;
use kkp_quota_crds::autoscaled::AutoscaledDeployment;
use kkp_quota_crds::machine::{Machine, MachineDeployment};
use kkp_quota_crds::reserved::{AutoscalingBounds, BoundsError};
use kube::ResourceExt;
use provider_sizes::{SizeCatalog, SizingError, size_machine};
use tracing::warn;

use super::State;
use crate::usage::same_usage;

/// One `MachineDeployment` as far as its reservation goes.
#[derive(Debug, Clone)]
pub(super) struct DeploymentInfo {
    /// `namespace/name`, for log lines.
    name: String,
    replicas: u32,
    bounds: Result<Option<AutoscalingBounds>, BoundsError>,
    template: Machine,
    /// Sized only while it has bounds (nothing else reads it).
    sizing: Option<Result<ResourceDetails, SizingError>>,
    /// Its `resourceVersion`: a change reservation made on an earlier one is counted
    /// (`kkp_quota_crds::autoscaled::change_is_counted`).
    version: Option<String>,
}

impl DeploymentInfo {
    fn of(catalog: &SizeCatalog, deployment: &MachineDeployment) -> DeploymentInfo {
        let bounds = AutoscalingBounds::of(deployment.annotations());
        let template = deployment.template_machine();
        let sizing = matches!(bounds, Ok(Some(_))).then(|| size_machine(&template, catalog, None));
        DeploymentInfo {
            name: format!(
                "{}/{}",
                deployment.namespace().unwrap_or_default(),
                deployment.name_any()
            ),
            replicas: deployment.replicas(),
            bounds,
            template,
            sizing,
            version: deployment.resource_version(),
        }
    }

    /// Its entry in the ledger's `status.autoscaled`, with its `members` counted; none when it
    /// reserves nothing (no usable bounds, or its Machines cannot be sized).
    fn entry(&self, cluster: &str, uid: &str, members: ResourceDetails) -> Option<AutoscaledDeployment> {
        match (&self.bounds, &self.sizing) {
            (Ok(Some(bounds)), Some(Ok(size))) => Some(AutoscaledDeployment {
                cluster: cluster.to_owned(),
                uid: uid.to_owned(),
                name: self.name.clone(),
                max: bounds.max,
                size: size.clone(),
                members,
            }),
            _ => None,
        }
    }

    /// What it reserves; zero when it has no bounds, or none the autoscaler would use, or its
    /// Machines cannot be sized (said once in the log, by [`Self::why_nothing`]).
    fn reserved(&self) -> ResourceDetails {
        match (&self.bounds, &self.sizing) {
            (Ok(Some(bounds)), Some(Ok(size))) => bounds
                .reservation(self.replicas, size)
                .unwrap_or_else(|_| ResourceDetails::zero()),
            _ => ResourceDetails::zero(),
        }
    }

    /// Why a deployment the autoscaler may mean to grow reserves nothing.
    fn why_nothing(&self) -> Option<String> {
        match (&self.bounds, &self.sizing) {
            (Err(e), _) => Some(format!("its autoscaling annotations are not usable: {e}")),
            (Ok(Some(_)), Some(Err(e))) => Some(format!("its Machines cannot be sized: {e}")),
            _ => None,
        }
    }

    fn same_as(&self, other: &DeploymentInfo) -> bool {
        self.replicas == other.replicas
            && self.bounds == other.bounds
            && self.template.spec == other.template.spec
            && self.sizing == other.sizing
    }
}

/// A cluster's `MachineDeployment`s, by UID.
#[derive(Debug, Default)]
pub struct Deployments {
    by_uid: HashMap<String, DeploymentInfo>,
    /// Listed completely at least once.
    listed: bool,
    /// Nothing to wait for: the cluster has no `MachineDeployment`s to list (the resource is not
    /// there, or may not be read), or did not answer in time: what is known of them counts.
    unlistable: bool,
    /// The watch failed since the last listing or event.
    failing: bool,
}

impl Deployments {
    /// Whether the cluster's reservation is not known yet (never listed since this process
    /// started, whether the cluster is reachable or not): its project's ledger keeps the one it
    /// has meanwhile, as a cluster's usage stays its last written one until its Machines are
    /// listed.
    pub fn pending(&self) -> bool {
        !self.listed && !self.unlistable
    }

    /// Whether they have been listed since this process started (else, under the policy
    /// `reservedCounts`, the ledger's entries for the cluster stand for them).
    pub fn known(&self) -> bool {
        self.listed
    }

    /// Whether the watch failed since the last listing or event: what is known of them may be
    /// old, so nothing of the cluster that a deployment's change reserved may expire.
    pub fn failing(&self) -> bool {
        self.failing
    }

    /// The sum of every deployment's reservation.
    pub fn reserved(&self) -> ResourceDetails {
        let reservations: Vec<ResourceDetails> = self.by_uid.values().map(DeploymentInfo::reserved).collect();
        ResourceDetails::checked_sum(reservations.iter()).unwrap_or_else(|_| ResourceDetails::zero())
    }

    /// Every autoscaled deployment's entry, its members summed from `members` (by deployment
    /// UID), sorted by UID.
    pub fn autoscaled(
        &self,
        cluster: &str,
        members: &HashMap<String, ResourceDetails>,
    ) -> Vec<AutoscaledDeployment> {
        let mut entries: Vec<AutoscaledDeployment> = self
            .by_uid
            .iter()
            .filter_map(|(uid, info)| {
                let mine = members.get(uid).cloned().unwrap_or_else(ResourceDetails::zero);
                info.entry(cluster, uid, mine)
            })
            .collect();
        entries.sort_by(|a, b| a.uid.cmp(&b.uid));
        entries
    }

    /// Every deployment's UID and `resourceVersion`.
    pub fn versions(&self) -> impl Iterator<Item = (&str, &str)> {
        self.by_uid
            .iter()
            .filter_map(|(uid, info)| Some((uid.as_str(), info.version.as_deref()?)))
    }

    /// Takes in one deployment; returns whether the reservation changed.
    fn apply(&mut self, cluster: &str, uid: String, info: DeploymentInfo) -> bool {
        if let Some(old) = self.by_uid.get_mut(&uid)
            && old.same_as(&info)
        {
            // A write that changes nothing reserved still makes a change made on an earlier
            // version counted.
            let news = old.version != info.version;
            old.version = info.version;
            return news;
        }
        let old = self.by_uid.get(&uid);
        warn_if_newly_nothing(cluster, old, &info);
        let before = old.map(DeploymentInfo::reserved);
        let after = info.reserved();
        self.by_uid.insert(uid, info);
        !before.is_some_and(|before| same_usage(&before, &after))
    }

    /// Sizes every autoscaled deployment's Machines again against `catalog` (a catalog edit);
    /// returns whether a reservation changed.
    pub(super) fn resize(&mut self, cluster: &str, catalog: &SizeCatalog) -> bool {
        let mut changed = false;
        for info in self.by_uid.values_mut() {
            let Some(old) = &info.sizing else { continue };
            let sizing = size_machine(&info.template, catalog, None);
            if &sizing == old {
                continue;
            }
            let before = info.reserved();
            let previous = info.clone();
            info.sizing = Some(sizing);
            warn_if_newly_nothing(cluster, Some(&previous), info);
            changed |= !same_usage(&before, &info.reserved());
        }
        changed
    }
}

/// Says in the log why a deployment reserves nothing, once per reason.
fn warn_if_newly_nothing(cluster: &str, old: Option<&DeploymentInfo>, new: &DeploymentInfo) {
    if let Some(why) = new.why_nothing()
        && old.and_then(DeploymentInfo::why_nothing).as_ref() != Some(&why)
    {
        warn!(cluster, deployment = %new.name, "MachineDeployment reserves nothing for the cluster autoscaler: {why}");
    }
}

impl State {
    /// The cluster's `MachineDeployment` watch failed (`true`), or works again.
    pub fn deployments_failing(&mut self, cluster_name: &str, failing: bool) {
        if let Some(cluster) = self.clusters.get_mut(cluster_name) {
            cluster.deployments.failing = failing;
        }
    }

    /// A `MachineDeployment` was added or changed in a user cluster. Returns whether the
    /// project's reservation changed (a write is due).
    pub fn deployment_applied(&mut self, cluster_name: &str, deployment: &MachineDeployment) -> bool {
        let Some(uid) = deployment.uid() else { return false };
        let info = DeploymentInfo::of(&self.catalog, deployment);
        let Some(cluster) = self.clusters.get_mut(cluster_name) else {
            return false;
        };
        cluster.deployments.failing = false;
        let changed = cluster.deployments.apply(cluster_name, uid, info);
        if changed {
            self.mark(cluster_name);
        }
        changed
    }

    /// A `MachineDeployment` is gone: it reserves nothing any more. Returns whether it was known.
    pub fn deployment_deleted(&mut self, cluster_name: &str, uid: &str) -> bool {
        let Some(cluster) = self.clusters.get_mut(cluster_name) else {
            return false;
        };
        let known = cluster.deployments.by_uid.remove(uid).is_some();
        if known {
            self.mark(cluster_name);
        }
        known
    }

    /// A complete listing of a cluster's `MachineDeployment`s. Returns whether the project's
    /// reservation changed.
    pub fn deployments_listed(&mut self, cluster_name: &str, deployments: &[MachineDeployment]) -> bool {
        let catalog = Arc::clone(&self.catalog);
        let Some(cluster) = self.clusters.get_mut(cluster_name) else {
            return false;
        };
        let before = (!cluster.deployments.pending()).then(|| cluster.deployments.reserved());
        let mut listed = Deployments {
            by_uid: HashMap::with_capacity(deployments.len()),
            listed: true,
            unlistable: false,
            failing: false,
        };
        for deployment in deployments {
            if let Some(uid) = deployment.uid() {
                let info = DeploymentInfo::of(&catalog, deployment);
                warn_if_newly_nothing(cluster_name, cluster.deployments.by_uid.get(&uid), &info);
                listed.by_uid.insert(uid, info);
            }
        }
        cluster.deployments = listed;
        let changed = !before.is_some_and(|before| same_usage(&before, &cluster.deployments.reserved()));
        if changed {
            self.mark(cluster_name);
        }
        changed
    }

    /// The cluster's `MachineDeployment`s are not to be waited for (the resource is not there,
    /// may not be read, or the cluster did not answer within `--user-cluster-timeout`): what is
    /// known of them counts (nothing, if never listed), so that the project's reservation is
    /// written. Returns whether that is news (nothing for a cluster listed already).
    pub fn deployments_unlistable(&mut self, cluster_name: &str) -> bool {
        let Some(cluster) = self
            .clusters
            .get_mut(cluster_name)
            .filter(|c| c.deployments.pending())
        else {
            return false;
        };
        let news = !std::mem::replace(&mut cluster.deployments.unlistable, true);
        if news {
            self.mark(cluster_name);
        }
        news
    }
}

#[cfg(test)]
mod tests {
    use kkp_quota_crds::reserved::{MAX_SIZE_ANNOTATION, MIN_SIZE_ANNOTATION};
    use kkp_quota_crds::{Quantity, Resource};
    use provider_sizes::{AdminCatalog, SizeCatalog};
    use serde_json::json;

    use super::*;
    use crate::state::fixtures::state_with;

    fn deployment(
        uid: &str,
        replicas: i32,
        bounds: Option<(&str, &str)>,
        instance_type: &str,
    ) -> MachineDeployment {
        let annotations = bounds.map_or_else(
            || json!({}),
            |(min, max)| json!({ MIN_SIZE_ANNOTATION: min, MAX_SIZE_ANNOTATION: max }),
        );
        serde_json::from_value(json!({
            "apiVersion": "cluster.k8s.io/v1alpha1", "kind": "MachineDeployment",
            "metadata": {"name": format!("md-{uid}"), "namespace": "kube-system", "uid": uid, "annotations": annotations},
            "spec": {"replicas": replicas, "template": {"spec": {"providerSpec": {"value": {
                "cloudProvider": "aws",
                "cloudProviderSpec": {"instanceType": instance_type, "diskSize": 10}
            }}}}},
        }))
        .unwrap()
    }

    fn reserved_cpu(state: &State, project: &str) -> Option<Quantity> {
        state
            .project_plan(project)
            .unwrap()
            .reserved_usage
            .map(|r| r.amount(Resource::Cpu))
    }

    #[test]
    fn autoscaled_deployments_reserve_their_room_to_grow_per_project() {
        let mut state = state_with(&[("c1", "p"), ("c2", "p"), ("c3", "q")]);
        assert_eq!(
            reserved_cpu(&state, "p"),
            None,
            "not listed yet: the ledger keeps its own"
        );
        // t3.medium: 2 vCPUs.
        state.deployments_listed("c1", &[deployment("a", 2, Some(("1", "6")), "t3.medium")]);
        assert_eq!(reserved_cpu(&state, "p"), None, "c2 not listed yet");
        state.set_reachability("c2", crate::state::Reachability::Unreachable("down".into()));
        assert_eq!(
            reserved_cpu(&state, "p"),
            None,
            "never listed: unreachable or not, its reservation is not known (the ledger keeps its own)"
        );
        assert!(state.deployments_unlistable("c2"), "no MachineDeployments there");
        assert!(!state.deployments_unlistable("c2"), "said once");
        assert_eq!(reserved_cpu(&state, "p"), Some(Quantity::from_units(8)));
        state.deployments_listed("c3", &[deployment("b", 0, Some(("0", "1")), "t3.medium")]);
        assert_eq!(reserved_cpu(&state, "q"), Some(Quantity::from_units(2)));
        assert_eq!(
            reserved_cpu(&state, "p"),
            Some(Quantity::from_units(8)),
            "q's is q's"
        );

        state.dirty_projects.clear();
        state.deployment_applied("c1", &deployment("a", 5, Some(("1", "6")), "t3.medium"));
        assert_eq!(
            reserved_cpu(&state, "p"),
            Some(Quantity::from_units(2)),
            "grown by 3"
        );
        assert!(state.dirty_projects.contains("p"));
        state.deployment_applied("c2", &deployment("c", 1, None, "t3.medium"));
        assert_eq!(
            reserved_cpu(&state, "p"),
            Some(Quantity::from_units(2)),
            "not autoscaled"
        );
        state.deployment_applied("c2", &deployment("d", 1, Some(("1", "x")), "t3.medium"));
        assert_eq!(
            reserved_cpu(&state, "p"),
            Some(Quantity::from_units(2)),
            "bounds unusable"
        );
        state.deployment_applied("c2", &deployment("e", 1, Some(("1", "3")), "no-such-type"));
        assert_eq!(
            reserved_cpu(&state, "p"),
            Some(Quantity::from_units(2)),
            "unsizeable"
        );
        state.deployment_deleted("c1", "a");
        assert_eq!(reserved_cpu(&state, "p"), Some(Quantity::ZERO));
        let plan = state.project_plan("p").unwrap();
        assert_eq!(
            plan.local_usage.amount(Resource::Cpu),
            Quantity::ZERO,
            "reserved is not usage"
        );
    }

    fn owned(value: serde_json::Value, kind: &str, owner: &str) -> serde_json::Value {
        let mut value = value;
        value["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "cluster.k8s.io/v1alpha1", "kind": kind, "name": owner, "uid": owner, "controller": true
        }]);
        value
    }

    fn member(uid: &str, set: &str) -> kkp_quota_crds::machine::Machine {
        let machine = serde_json::to_value(crate::state::fixtures::machine(uid, "t3.medium")).unwrap();
        serde_json::from_value(owned(machine, "MachineSet", set)).unwrap()
    }

    fn set(uid: &str, deployment: &str) -> kkp_quota_crds::machine::MachineSet {
        let set = json!({
            "apiVersion": "cluster.k8s.io/v1alpha1", "kind": "MachineSet",
            "metadata": {"name": uid, "namespace": "kube-system", "uid": uid}, "spec": {}
        });
        serde_json::from_value(owned(set, "MachineDeployment", deployment)).unwrap()
    }

    #[test]
    fn a_deployments_members_are_the_machines_of_its_machine_sets() {
        let mut state = state_with(&[("c1", "p")]);
        let mut md = deployment("a", 2, Some(("1", "4")), "t3.medium");
        md.metadata.resource_version = Some("7".into());
        state.deployments_listed("c1", &[md]);
        state.cluster_listed(
            "c1",
            vec![member("m1", "s1"), member("m2", "s1"), member("m3", "s2")],
        );
        let entries = |state: &State| state.project_plan("p").unwrap().autoscaled;
        let cpu = |d: &ResourceDetails| d.amount(Resource::Cpu);
        assert_eq!(entries(&state).len(), 1);
        assert_eq!(
            cpu(&entries(&state)[0].members),
            Quantity::ZERO,
            "no MachineSet known yet"
        );
        assert!(state.machine_sets_listed("c1", &[set("s1", "a"), set("s2", "other")]));
        let entry = entries(&state).remove(0);
        assert_eq!((entry.uid.as_str(), entry.max), ("a", 4));
        assert_eq!(
            cpu(&entry.members),
            Quantity::from_units(4),
            "m1 and m2, 2 vCPUs each"
        );
        assert_eq!(
            cpu(&entry.reserved().unwrap()),
            Quantity::from_units(4),
            "room for 2 more"
        );
        let plan = state.project_plan("p").unwrap();
        assert_eq!(
            plan.counted.deployments.get(&("c1".into(), "a".into())),
            Some(&"7".to_owned())
        );
        state.machine_set_deleted("c1", "s1");
        assert_eq!(cpu(&entries(&state)[0].members), Quantity::ZERO);
    }

    #[test]
    fn a_catalog_edit_resizes_the_reservations() {
        let mut state = state_with(&[("c1", "p")]);
        state.deployments_listed("c1", &[deployment("a", 1, Some(("1", "3")), "custom-big")]);
        assert_eq!(reserved_cpu(&state, "p"), Some(Quantity::ZERO), "unsizeable yet");
        let admin =
            AdminCatalog::parse("providers:\n  aws:\n    custom-big: {cpu: 16, memory: 64Gi}\n").unwrap();
        state.set_catalog(SizeCatalog::shipped().with_admin(&admin));
        assert_eq!(reserved_cpu(&state, "p"), Some(Quantity::from_units(32)));
    }
}
