//! Admission under the policy `reservedCounts` (docs/capacity.md): a new Machine of an
//! autoscaled deployment admitted from its room, and a deployment's create or change of its room.

use super::*;

impl App {
    /// Under the policy `reservedCounts`: a new Machine of an autoscaled deployment carries the
    /// deployment as it is now, to be admitted from its room ([`crate::decision::autoscaled`]).
    pub(super) async fn with_room(
        &self,
        mut request: DecisionRequest,
        machine: &MachineRef,
        owners: &[OwnerReference],
    ) -> DecisionRequest {
        if !matches!(request.ask, Ask::Create(_)) || owner(owners, "MachineSet").is_none() {
            return request;
        }
        let policy = self
            .cache
            .cluster(&machine.cluster)
            .and_then(|c| c.project_id().map(str::to_owned))
            .and_then(|project| self.cache.quota_for(&project))
            .and_then(|q| QuotaCopy::from_dynamic(&q).ok())
            .is_some_and(|copy| copy.spec.reserved_counts);
        if !policy {
            return request;
        }
        let Some(deployment) = self
            .rollouts
            .deployment_of(&machine.cluster, &machine.namespace, owners)
            .await
        else {
            return request;
        };
        if let (Some(uid), Some((max, template))) = (
            deployment.metadata.uid.clone(),
            crate::deployments::room_of(&deployment, &self.cache.catalog()),
        ) {
            request.autoscaled = Some(Autoscaled::Member(Box::new(Member {
                cluster: machine.cluster.clone(),
                deployment: uid,
                max,
                template,
            })));
        }
        request
    }

    /// A user cluster's autoscaled `MachineDeployment` create or change
    /// ([`crate::deployments`]): under the project's policy `reservedCounts`, the growth of its
    /// room is checked and reserved like a Machine's; without it, nothing is asked.
    pub async fn admit_deployment(&self, cluster: &str, request: &AdmissionRequest) -> Verdict {
        let change = match deployment_change(request, cluster, &self.cache.catalog()) {
            Ok(change) => change,
            Err(answer) => return *answer,
        };
        if !self.cache.is_synced() {
            return change.request.deny(
                Reason::Error,
                "cannot be checked against its project's quota yet: the quota webhook is still starting; try again",
            );
        }
        let Some(project) = self
            .cache
            .cluster(cluster)
            .and_then(|c| c.project_id().map(str::to_owned))
        else {
            return Verdict::allow(Reason::NoQuota);
        };
        let policy = self
            .cache
            .quota_for(&project)
            .and_then(|q| QuotaCopy::from_dynamic(&q).ok())
            .map(|copy| copy.spec.reserved_counts);
        if policy == Some(false) {
            return Verdict::allow(Reason::Unchanged);
        }
        tracing::Span::current().record("project", project.as_str());
        let reference = MachineRef {
            cluster: cluster.to_owned(),
            namespace: change.namespace.clone(),
            name: change.name.clone(),
            uid: change.uid.clone(),
        };
        let verdict = self.reserve_growth(&project, reference, &change.request).await;
        debug!(deployment = %change.name, uid = %change.uid, allowed = verdict.allowed, reason = %verdict.reason, "deployment admission decided");
        verdict
    }
}
