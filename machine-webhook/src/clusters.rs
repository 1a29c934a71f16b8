//! Admission of KKP `Cluster` creates on the seed (`POST /validate/clusters/{seed}/{token}`,
//! registered on the seed by seed-controller): a new `Cluster` asks its project's quota for
//! `clusters: 1` through the same ledger, reservations, allotments and per-seed shares as a
//! Machine (docs/capacity.md), so a burst of creates over several seeds admits exactly the
//! headroom. Its reservation holds the seed's name where a Machine's holds its user cluster's, and
//! the `Cluster`'s UID; seed-controller drops it once it counts the `Cluster`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kkp_quota_crds::ResourceDetails;
use kkp_quota_crds::kkp::PROJECT_ID_LABEL;

use crate::decision::{Ask, Reason, Request, Subject, Verdict};
use crate::reserve::MachineRef;
use crate::review::AdmissionRequest;

/// The reservation key of a `Cluster` on seed `seed` (the seed's name in place of a user
/// cluster's, no namespace).
pub fn reservation_ref(seed: &str, name: &str, uid: &str) -> MachineRef {
    MachineRef {
        cluster: seed.to_owned(),
        namespace: String::new(),
        name: name.to_owned(),
        uid: uid.to_owned(),
    }
}

/// A `Cluster` create, as the decision sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterCreate {
    pub name: String,
    pub uid: String,
    /// Its `project-id` label; `None`: no project, no quota (nothing counts it either).
    pub project: Option<String>,
    pub request: Request,
}

/// What a `Cluster` admission request asks. `Err` is the answer itself: anything but a create of
/// a `Cluster` grows no count (allowed unchanged: a `Cluster` stops counting when it is gone, and
/// its project label is KKP's to keep); an unreadable object is denied as a bad request.
pub fn cluster_create(request: &AdmissionRequest) -> Result<ClusterCreate, Box<Verdict>> {
    if request.resource.resource != "clusters"
        || request.sub_resource.is_some()
        || request.operation != "CREATE"
    {
        return Err(Box::new(Verdict::allow(Reason::Unchanged)));
    }
    let metadata = request
        .object
        .as_ref()
        .and_then(|o| o.get("metadata"))
        .cloned()
        .map(serde_json::from_value::<ObjectMeta>)
        .transpose()
        .map_err(|e| {
            Box::new(Verdict::deny_subject(
                Subject::Cluster,
                Reason::BadRequest,
                &request.name,
                &format!("is not a readable Cluster: {e}"),
            ))
        })?
        .unwrap_or_default();
    let name = metadata
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| request.name.clone());
    Ok(ClusterCreate {
        project: metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(PROJECT_ID_LABEL))
            .filter(|p| !p.is_empty())
            .cloned(),
        uid: metadata.uid.unwrap_or_default(),
        request: Request {
            machine: name.clone(),
            ask: Ask::Create(ResourceDetails::one_cluster()),
            dry_run: request.dry_run.unwrap_or(false),
            subject: Subject::Cluster,
            autoscaled: None,
        },
        name,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::review::GroupVersionResource;

    fn review(operation: &str, object: serde_json::Value) -> AdmissionRequest {
        AdmissionRequest {
            uid: "r1".into(),
            resource: GroupVersionResource {
                group: "kubermatic.k8c.io".into(),
                version: "v1".into(),
                resource: "clusters".into(),
            },
            name: "abc123".into(),
            operation: operation.into(),
            object: Some(object),
            ..AdmissionRequest::default()
        }
    }

    #[test]
    fn a_create_asks_one_cluster_of_its_project() {
        let create = cluster_create(&review(
            "CREATE",
            json!({"metadata": {"name": "abc123", "uid": "u-1", "labels": {"project-id": "demo"}}, "spec": {}}),
        ))
        .unwrap();
        assert_eq!(create.project.as_deref(), Some("demo"));
        assert_eq!(create.uid, "u-1");
        assert_eq!(create.request.ask, Ask::Create(ResourceDetails::one_cluster()));
        assert_eq!(create.request.subject, Subject::Cluster);
        let unlabelled = cluster_create(&review("CREATE", json!({"metadata": {"name": "x"}}))).unwrap();
        assert_eq!(unlabelled.project, None);
    }

    #[test]
    fn only_creates_are_decided_and_a_broken_object_is_refused_by_name() {
        for operation in ["UPDATE", "DELETE"] {
            let answer = cluster_create(&review(operation, json!({"metadata": {"name": "x"}}))).unwrap_err();
            assert!(answer.allowed, "{operation}");
        }
        let broken =
            cluster_create(&review("CREATE", json!({"metadata": {"labels": "not a map"}}))).unwrap_err();
        assert!(!broken.allowed);
        assert_eq!(broken.reason, Reason::BadRequest);
        assert!(
            broken
                .message
                .as_deref()
                .unwrap()
                .starts_with("cluster \"abc123\" is not a readable Cluster"),
            "{broken:?}"
        );
    }
}
