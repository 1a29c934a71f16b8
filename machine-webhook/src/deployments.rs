//! Admission of autoscaled `MachineDeployment`s under the policy `reservedCounts`
//! (`POST /validate/machinedeployments/{cluster}/{token}`, registered in every user cluster by
//! seed-controller for creates and for changes of the max size or the template only): a create,
//! or a raise of the room the cluster autoscaler may grow the deployment into, is checked as a
//! growth of the project's usage and reserved (`kkp_quota_crds::autoscaled`). Pure: reading the
//! request; the decision is [`crate::decision::autoscaled`].

use kkp_quota_crds::ResourceDetails;
use kkp_quota_crds::machine::MachineDeployment;
use kkp_quota_crds::reserved::AutoscalingBounds;
use kube::ResourceExt;
use provider_sizes::{SizeCatalog, size_machine};

use crate::decision::autoscaled::{Autoscaled, Change};
use crate::decision::{Ask, Reason, Request, Subject, Verdict};
use crate::review::AdmissionRequest;

/// A deployment's max size and one Machine's size, when the cluster autoscaler manages it and its
/// Machines can be sized (else it has no room: nothing is reserved for it).
pub fn room_of(deployment: &MachineDeployment, catalog: &SizeCatalog) -> Option<(u32, ResourceDetails)> {
    let bounds = AutoscalingBounds::of(deployment.annotations()).ok()??;
    let size = size_machine(&deployment.template_machine(), catalog, None).ok()?;
    Some((bounds.max, size))
}

/// A deployment's create or change, as the decision sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeploymentChange {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub request: Request,
}

/// What a `MachineDeployment` admission request asks, for user cluster `cluster`. `Err` is the
/// answer itself: anything but a create or update of an autoscaled deployment asks nothing
/// (allowed unchanged); an unreadable object is denied as a bad request.
pub fn deployment_change(
    request: &AdmissionRequest,
    cluster: &str,
    catalog: &SizeCatalog,
) -> Result<DeploymentChange, Box<Verdict>> {
    let unchanged = || Box::new(Verdict::allow(Reason::Unchanged));
    if request.resource.resource != "machinedeployments"
        || request.sub_resource.is_some()
        || !matches!(request.operation.as_str(), "CREATE" | "UPDATE")
    {
        return Err(unchanged());
    }
    let read = |value: Option<&serde_json::Value>| {
        value
            .filter(|v| !v.is_null())
            .map(|v| serde_json::from_value::<MachineDeployment>(v.clone()))
            .transpose()
    };
    let deployment = read(request.object.as_ref())
        .map_err(|e| {
            Box::new(Verdict::deny_subject(
                Subject::Deployment,
                Reason::BadRequest,
                &request.name,
                &format!("is not a readable MachineDeployment: {e}"),
            ))
        })?
        .ok_or_else(unchanged)?;
    let Some(new) = room_of(&deployment, catalog) else {
        return Err(unchanged());
    };
    // A failed read of the old object only loses what the deployment had: all of it is new then.
    let old = read(request.old_object.as_ref()).ok().flatten();
    let name = deployment.name_any();
    let uid = deployment.uid().unwrap_or_default();
    let change = Change {
        cluster: cluster.to_owned(),
        deployment: uid.clone(),
        old: old.as_ref().and_then(|o| room_of(o, catalog)),
        old_version: old.as_ref().and_then(ResourceExt::resource_version),
        new: new.clone(),
    };
    Ok(DeploymentChange {
        namespace: deployment.namespace().unwrap_or_default(),
        uid,
        request: Request {
            machine: name.clone(),
            // What the decision sees besides the change: the deployment's whole room, so that
            // paths that only ask "does it grow?" know it does.
            ask: Ask::Create(new.1),
            dry_run: request.dry_run.unwrap_or(false),
            subject: Subject::Deployment,
            autoscaled: Some(Autoscaled::Change(Box::new(change))),
        },
        name,
    })
}

#[cfg(test)]
mod tests {
    use kkp_quota_crds::reserved::{MAX_SIZE_ANNOTATION, MIN_SIZE_ANNOTATION};
    use serde_json::json;

    use super::*;
    use crate::review::GroupVersionResource;

    fn deployment(max: Option<&str>, instance_type: &str, version: &str) -> serde_json::Value {
        let annotations = max.map_or_else(
            || json!({}),
            |max| json!({MIN_SIZE_ANNOTATION: "1", MAX_SIZE_ANNOTATION: max}),
        );
        json!({
            "apiVersion": "cluster.k8s.io/v1alpha1", "kind": "MachineDeployment",
            "metadata": {"name": "workers", "namespace": "kube-system", "uid": "d-1", "resourceVersion": version, "annotations": annotations},
            "spec": {"replicas": 1, "template": {"spec": {"providerSpec": {"value": {
                "cloudProvider": "aws", "cloudProviderSpec": {"instanceType": instance_type, "diskSize": 10}
            }}}}},
        })
    }

    #[allow(clippy::needless_pass_by_value, reason = "test data built inline")]
    fn review(
        operation: &str,
        object: serde_json::Value,
        old: Option<serde_json::Value>,
    ) -> AdmissionRequest {
        serde_json::from_value(json!({
            "uid": "r", "operation": operation, "name": "workers", "namespace": "kube-system",
            "resource": GroupVersionResource { group: "cluster.k8s.io".into(), version: "v1alpha1".into(), resource: "machinedeployments".into() },
            "object": object, "oldObject": old,
        }))
        .unwrap()
    }

    #[test]
    fn only_autoscaled_deployments_ask_and_a_change_knows_what_it_was() {
        let catalog = SizeCatalog::shipped();
        let create = deployment_change(
            &review("CREATE", deployment(Some("6"), "t3.medium", "1"), None),
            "c",
            &catalog,
        )
        .unwrap();
        let Some(Autoscaled::Change(change)) = &create.request.autoscaled else {
            panic!("a change");
        };
        assert_eq!(
            (change.new.0, change.old.clone(), change.old_version.clone()),
            (6, None, None)
        );
        assert_eq!(create.request.subject, Subject::Deployment);
        let raise = review(
            "UPDATE",
            deployment(Some("8"), "t3.medium", "2"),
            Some(deployment(Some("6"), "t3.medium", "1")),
        );
        let raise = deployment_change(&raise, "c", &catalog).unwrap();
        let Some(Autoscaled::Change(change)) = &raise.request.autoscaled else {
            panic!("a change");
        };
        assert_eq!(change.old.as_ref().map(|o| o.0), Some(6));
        assert_eq!(change.old_version.as_deref(), Some("1"));
        // Not autoscaled, or not sizeable: nothing asked.
        for object in [
            deployment(None, "t3.medium", "1"),
            deployment(Some("6"), "no-such-type", "1"),
        ] {
            let answer = deployment_change(&review("CREATE", object, None), "c", &catalog).unwrap_err();
            assert!(answer.allowed);
        }
        let bad = review("CREATE", json!({"metadata": 5}), None);
        assert!(!deployment_change(&bad, "c", &catalog).unwrap_err().allowed);
    }
}
