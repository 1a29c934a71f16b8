//! Fan-out: what the master object and its seed copies should look like, and whether they do.
//! Pure builders and comparisons; the writes are in [`crate::controller`].
//!
//! - **Master object metadata** (server-side apply, field manager [`FIELD_MANAGER`]): the subject
//!   labels, a controller owner reference to its `Project` (when the project exists; deleting
//!   the project then deletes the quota), and the finalizer [`SEED_CLEANUP_FINALIZER`] (removed
//!   once every seed's copy is gone).
//! - **Seed copy** (server-side apply, field manager [`FIELD_MANAGER`]): same name, labels and
//!   spec as the master object. No owner reference: the `Project` lives on the master, and an
//!   owner reference to an object the seed does not have would make the seed's garbage
//!   collector delete the copy. Copies go with their master object through the finalizer.
//! - **Status**: the master object gets `globalUsage` + conditions, each seed copy
//!   `globalUsage` + `otherSeedsUsage`, as merge patches on `/status`, only when changed.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference};
use kkp_quota_crds::kkp::Project;
use kkp_quota_crds::quota::{SEED_CLEANUP_FINALIZER, SUBJECT_KIND_LABEL, SUBJECT_NAME_LABEL};
use kkp_quota_crds::{ResourceDetails, ResourceQuota};
use kube::{Resource as _, ResourceExt};
use serde_json::{Value, json};

/// The field manager of every server-side apply this controller makes.
pub const FIELD_MANAGER: &str = "kkp-quota-master";

const API_VERSION: &str = "kubermatic.k8c.io/v1";

/// A controller owner reference to `project`, or `None` when the project has no UID (not
/// stored yet).
pub fn project_owner_reference(project: &Project) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: Project::api_version(&()).into_owned(),
        kind: Project::kind(&()).into_owned(),
        name: project.name_any(),
        uid: project.metadata.uid.clone()?,
        controller: Some(true),
        block_owner_deletion: None,
    })
}

/// The owner reference the master object should have: to its project, as controller unless
/// another owner already is the controller.
fn desired_owner(master: &ResourceQuota, project: Option<&Project>) -> Option<OwnerReference> {
    let mut owner = project_owner_reference(project?)?;
    let other_controller = master
        .owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && o.uid != owner.uid);
    if other_controller {
        owner.controller = Some(false);
    }
    Some(owner)
}

fn subject_labels(master: &ResourceQuota) -> BTreeMap<String, String> {
    BTreeMap::from([
        (SUBJECT_NAME_LABEL.to_owned(), master.spec.subject.name.clone()),
        (SUBJECT_KIND_LABEL.to_owned(), master.spec.subject.kind.clone()),
    ])
}

pub fn has_finalizer(master: &ResourceQuota) -> bool {
    master.finalizers().iter().any(|f| f == SEED_CLEANUP_FINALIZER)
}

/// True when the master object already has the subject labels, the owner reference (when the
/// project is known) and, unless it is being deleted, the finalizer.
pub fn master_metadata_in_sync(master: &ResourceQuota, project: Option<&Project>) -> bool {
    let labels = master.labels();
    let labels_ok = subject_labels(master)
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v));
    let owner_ok = match desired_owner(master, project) {
        None => true,
        Some(owner) => master.owner_references().iter().any(|o| o.uid == owner.uid),
    };
    let finalizer_ok = master.metadata.deletion_timestamp.is_some() || has_finalizer(master);
    labels_ok && owner_ok && finalizer_ok
}

/// The server-side apply body for the master object's metadata. `finalizer: false` releases the
/// finalizer (the last step of a deletion).
pub fn master_metadata_apply(master: &ResourceQuota, project: Option<&Project>, finalizer: bool) -> Value {
    let mut metadata = json!({
        "name": master.name_any(),
        "labels": subject_labels(master),
    });
    if let Some(owner) = desired_owner(master, project) {
        metadata["ownerReferences"] = json!([owner]);
    }
    if finalizer {
        metadata["finalizers"] = json!([SEED_CLEANUP_FINALIZER]);
    }
    json!({
        "apiVersion": API_VERSION,
        "kind": "ResourceQuota",
        "metadata": metadata,
    })
}

/// The labels a seed copy carries: the master's, plus the subject labels.
fn copy_labels(master: &ResourceQuota) -> BTreeMap<String, String> {
    let mut labels = master.labels().clone();
    labels.extend(subject_labels(master));
    labels
}

/// The server-side apply body of a seed copy.
pub fn copy_apply_body(master: &ResourceQuota) -> Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": "ResourceQuota",
        "metadata": {
            "name": master.name_any(),
            "labels": copy_labels(master),
        },
        "spec": master.spec,
    })
}

/// True when the seed copy has the master's spec and labels (and is not being deleted).
pub fn copy_in_sync(master: &ResourceQuota, copy: &ResourceQuota) -> bool {
    copy.metadata.deletion_timestamp.is_none()
        && copy.spec == master.spec
        && copy.labels() == &copy_labels(master)
}

/// The merge patch of a seed copy's `/status`, or `None` when nothing changed.
/// `global`/`others` of `None` mean "not known": that field is left alone.
pub fn seed_status_patch(
    copy: &ResourceQuota,
    global: Option<&ResourceDetails>,
    others: Option<&ResourceDetails>,
) -> Option<Value> {
    let status = copy.status.clone().unwrap_or_default();
    let mut patch = serde_json::Map::new();
    if let Some(g) = global
        && status.global_usage.as_ref() != Some(g)
    {
        patch.insert("globalUsage".into(), json!(g));
    }
    if let Some(o) = others
        && status.other_seeds_usage.as_ref() != Some(o)
    {
        patch.insert("otherSeedsUsage".into(), json!(o));
    }
    (!patch.is_empty()).then(|| json!({ "status": patch }))
}

/// The merge patch of the master object's `/status`, or `None` when nothing changed.
pub fn master_status_patch(
    master: &ResourceQuota,
    global: Option<&ResourceDetails>,
    conditions: &[Condition],
) -> Option<Value> {
    let status = master.status.clone().unwrap_or_default();
    let mut patch = serde_json::Map::new();
    if let Some(g) = global
        && status.global_usage.as_ref() != Some(g)
    {
        patch.insert("globalUsage".into(), json!(g));
    }
    if !crate::status::same_conditions(&status.conditions, conditions) {
        patch.insert("conditions".into(), json!(conditions));
    }
    (!patch.is_empty()).then(|| json!({ "status": patch }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kkp_quota_crds::quota::DEFAULT_QUOTA_LABEL;
    use kkp_quota_crds::{Quantity, ResourceQuotaSpec, ResourceQuotaStatus, Subject};

    fn master() -> ResourceQuota {
        let mut m = ResourceQuota::new(
            "project-demo",
            ResourceQuotaSpec {
                subject: Subject::project("demo"),
                quota: ResourceDetails {
                    cpu: Some(Quantity::from_units(4)),
                    ..ResourceDetails::default()
                },
            },
        );
        m.metadata.labels = Some(BTreeMap::from([(
            DEFAULT_QUOTA_LABEL.to_owned(),
            "true".to_owned(),
        )]));
        m
    }

    fn project() -> Project {
        let mut p = Project::new("demo", kkp_quota_crds::kkp::ProjectSpec::default());
        p.metadata.uid = Some("uid-1".into());
        p
    }

    #[test]
    fn copy_carries_spec_and_all_labels() {
        let m = master();
        let body = copy_apply_body(&m);
        assert_eq!(body["spec"]["quota"]["cpu"], "4");
        assert_eq!(body["metadata"]["labels"][DEFAULT_QUOTA_LABEL], "true");
        assert_eq!(body["metadata"]["labels"][SUBJECT_NAME_LABEL], "demo");
        assert!(body["metadata"].get("ownerReferences").is_none());
        let copy: ResourceQuota = serde_json::from_value(body).unwrap();
        assert!(copy_in_sync(&m, &copy));
        let mut edited = m.clone();
        edited.spec.quota.cpu = Some(Quantity::from_units(5));
        assert!(!copy_in_sync(&edited, &copy));
        let mut relabelled = m.clone();
        relabelled.metadata.labels = None;
        assert!(
            !copy_in_sync(&relabelled, &copy),
            "a label removed on the master is removed on the copy"
        );
    }

    #[test]
    fn master_metadata_needs_labels_owner_and_finalizer() {
        let m = master();
        let p = project();
        assert!(!master_metadata_in_sync(&m, Some(&p)));
        let applied: ResourceQuota = {
            let mut v = serde_json::to_value(&m).unwrap();
            let body = master_metadata_apply(&m, Some(&p), true);
            v["metadata"]["labels"][SUBJECT_NAME_LABEL] =
                body["metadata"]["labels"][SUBJECT_NAME_LABEL].clone();
            v["metadata"]["labels"][SUBJECT_KIND_LABEL] =
                body["metadata"]["labels"][SUBJECT_KIND_LABEL].clone();
            v["metadata"]["ownerReferences"] = body["metadata"]["ownerReferences"].clone();
            v["metadata"]["finalizers"] = body["metadata"]["finalizers"].clone();
            serde_json::from_value(v).unwrap()
        };
        assert!(master_metadata_in_sync(&applied, Some(&p)));
        assert_eq!(applied.owner_references()[0].controller, Some(true));
        assert!(
            master_metadata_in_sync(&applied, None),
            "no project known: no owner needed"
        );
        let release = master_metadata_apply(&m, Some(&p), false);
        assert!(release["metadata"].get("finalizers").is_none());
    }

    #[test]
    fn status_patches_only_when_changed() {
        let mut copy = master();
        let g = ResourceDetails::zero();
        assert!(seed_status_patch(&copy, Some(&g), Some(&g)).is_some());
        copy.status = Some(ResourceQuotaStatus {
            global_usage: Some(g.clone()),
            other_seeds_usage: Some(g.clone()),
            ..ResourceQuotaStatus::default()
        });
        assert_eq!(seed_status_patch(&copy, Some(&g), Some(&g)), None);
        assert_eq!(seed_status_patch(&copy, None, None), None);
        let m = master();
        assert!(master_status_patch(&m, None, &[]).is_none());
        assert!(master_status_patch(&m, Some(&g), &[]).is_some());
    }
}
