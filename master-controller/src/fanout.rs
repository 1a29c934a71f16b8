//! Fan-out: what the master object and its seed copies should look like, and whether they do.
//! Pure builders and comparisons; the writes are in `reconcile` and `seed_writes`.
//!
//! - **Master object metadata** (merge patch conditioned on `resourceVersion`): the subject
//!   labels, a controller owner reference to its `Project` (when the project exists; deleting
//!   the project then deletes the quota), and the finalizer [`SEED_CLEANUP_FINALIZER`] (removed
//!   once every seed's copy is gone).
//! - **`ProjectQuota`** beside the master object (server-side apply of metadata and
//!   `spec.subject` only; `spec.quota` is the admins'): owned by the master object.
//! - **Seed copies** (server-side apply, field manager [`FIELD_MANAGER`]), same name and labels
//!   as the master object: KKP's `ResourceQuota` with the master's spec, and this project's
//!   `QuotaLedger` with the subject, the limits in force and the seed's share from the master's
//!   persisted record (`spec.shares`, docs/shares.md). No owner reference: the master
//!   objects live on the master, and an owner reference to an object the seed does not have
//!   would make the seed's garbage collector delete the copy. Copies go with their master
//!   object through the finalizer.
//! - **Status**: the master object gets `globalUsage` (KKP's resources), its `ProjectQuota`
//!   limits, every resource's `globalUsage`, per-seed usage and conditions; each seed ledger
//!   `otherSeedsUsage`, each KKP copy `globalUsage` (as KKP reads it); merge patches on
//!   `/status`, only when changed, built in [`crate::status_patches`].

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kkp_quota_crds::kkp::Project;
use kkp_quota_crds::quota::{SEED_CLEANUP_FINALIZER, SUBJECT_KIND_LABEL, SUBJECT_NAME_LABEL};
use kkp_quota_crds::quota_ledger::{LEDGER_FINALIZER, LedgerShares};
use kkp_quota_crds::rollout::RolloutAllowance;
use kkp_quota_crds::{LedgerSubject, ProjectQuota, QuotaLedger, ResourceDetails, ResourceQuota};
use kube::{Resource as _, ResourceExt};
use serde_json::{Value, json};

use crate::fingerprint::Fingerprint;
use crate::seed_ledger::SeedLedger;

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

/// The merge patch of the master object's metadata: the subject labels, the owner reference and
/// the finalizer added, or (`finalizer: false`, the last step of a deletion) our finalizer
/// removed; everyone else's labels, owners and finalizers kept. Conditioned on the
/// `resourceVersion` read: KKP's CRD does not require a `spec`, so a server-side apply after the
/// object was deleted would re-create it empty, where a patch gets 404 (or 409 if it changed).
pub fn master_metadata_patch(master: &ResourceQuota, project: Option<&Project>, finalizer: bool) -> Value {
    let mut owners: Vec<OwnerReference> = master.owner_references().to_vec();
    if let Some(owner) = desired_owner(master, project)
        && !owners.iter().any(|o| o.uid == owner.uid)
    {
        owners.push(owner);
    }
    let mut finalizers: Vec<String> = master
        .finalizers()
        .iter()
        .filter(|f| *f != SEED_CLEANUP_FINALIZER)
        .cloned()
        .collect();
    if finalizer {
        finalizers.push(SEED_CLEANUP_FINALIZER.to_owned());
    }
    json!({
        "metadata": {
            "resourceVersion": master.resource_version(),
            "labels": subject_labels(master),
            "ownerReferences": owners,
            "finalizers": finalizers,
        },
    })
}

/// The labels a seed copy (KKP's and the ledger) carries: the master's, plus the subject labels.
fn copy_labels(master: &ResourceQuota) -> BTreeMap<String, String> {
    let mut labels = master.labels().clone();
    labels.extend(subject_labels(master));
    labels
}

/// The server-side apply body of KKP's `ResourceQuota` copy on a seed: KKP's spec exactly as the
/// master object has it (fields this project does not model, like accelerators, included).
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

/// The server-side apply body of a seed's `QuotaLedger`: subject, the limits in force, and the
/// seed's share from the master's persisted record (`None` while the record does not hold the
/// seed; once a ledger has shares, every apply must carry them: the API server refuses a spec
/// whose shares go back or vanish).
pub fn ledger_apply_body(
    master: &ResourceQuota,
    limits: &ResourceDetails,
    shares: Option<&LedgerShares>,
    policies: Policies<'_>,
) -> Value {
    let mut spec = json!({
        "subject": LedgerSubject::from(&master.spec.subject),
        "quota": limits,
    });
    if let Some(shares) = shares {
        spec["shares"] = json!(shares);
    }
    if let Some(rollout) = policies.rollout {
        spec["rolloutAllowance"] = json!(rollout);
    }
    if policies.reserved_counts {
        spec["reservedCounts"] = json!(true);
    }
    json!({
        "apiVersion": QuotaLedger::api_version(&()),
        "kind": QuotaLedger::kind(&()),
        "metadata": {
            "name": master.name_any(),
            "labels": copy_labels(master),
            // Only this controller deletes a ledger for good (crate::ledger_guard).
            "finalizers": [LEDGER_FINALIZER],
        },
        "spec": spec,
    })
}

/// True when the seed's ledger has the master's subject, labels, the limits in force, the
/// seed's share from the persisted record and our finalizer. The other seeds' shares it carries
/// for messages do not count: they are refreshed with the next real change. One being deleted
/// (by hand) is kept in sync while our finalizer holds it.
pub fn ledger_in_sync(
    master: &ResourceQuota,
    limits: &ResourceDetails,
    shares: Option<&LedgerShares>,
    policies: Policies<'_>,
    ledger: &SeedLedger,
) -> bool {
    ledger.protected
        && ledger.word
            == ledger_word(
                &LedgerSubject::from(&master.spec.subject),
                limits,
                shares,
                policies,
                &copy_labels(master),
            )
}

/// Whether the ledger's groups (`spec.shares.groups`) are to be refreshed although its word is
/// in sync: always when the groups bounding the project, or their limits, are not those it
/// carries (the webhook refuses the rollout allowance under a group, so membership must reach
/// the seeds: a rare write, on a relabel or a group's edit); their figures (`othersUsage` and
/// `othersHeld`, for
/// denials that name a group) only while the seed has a demand `waiting`. Like `others`, the
/// figures alone never make a write otherwise: a usage change in one project would rewrite every
/// other member's ledger on every seed.
pub fn groups_stale(shares: Option<&LedgerShares>, ledger: &SeedLedger, waiting: bool) -> bool {
    let bounds = |groups: &[kkp_quota_crds::LedgerGroup]| -> Vec<(String, ResourceDetails)> {
        groups.iter().map(|g| (g.name.clone(), g.quota.clone())).collect()
    };
    shares.is_some_and(|s| {
        bounds(&s.groups) != bounds(&ledger.groups) || (waiting && s.groups != ledger.groups)
    })
}

/// A fingerprint of what the master writes into a ledger: the subject, the limits, the
/// master's word in the share ([`LedgerShares::word`]: `others` only rides along) and the
/// labels. Two ledgers with the same fingerprint need no write.
pub fn ledger_word(
    subject: &LedgerSubject,
    limits: &ResourceDetails,
    shares: Option<&LedgerShares>,
    policies: Policies<'_>,
    labels: &BTreeMap<String, String>,
) -> Fingerprint {
    Fingerprint::of(&json!({
        "subject": subject,
        "quota": limits,
        "shares": shares.map(LedgerShares::word),
        "rolloutAllowance": policies.rollout,
        "reservedCounts": policies.reserved_counts,
        "labels": labels,
    }))
}

/// The project's policies a ledger carries from its `ProjectQuota`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Policies<'a> {
    /// `rolloutAllowance` (`kkp_quota_crds::rollout`).
    pub rollout: Option<&'a RolloutAllowance>,
    /// `reservedCounts` (`kkp_quota_crds::autoscaled`).
    pub reserved_counts: bool,
}

impl<'a> Policies<'a> {
    /// A `ProjectQuota`'s (none without one).
    pub fn of(spec: Option<&'a kkp_quota_crds::ProjectQuotaSpec>) -> Policies<'a> {
        spec.map_or_else(Policies::default, |spec| Policies {
            rollout: spec.rollout_allowance.as_ref(),
            reserved_counts: spec.reserved_counts,
        })
    }

    /// A rollout allowance and no other policy.
    pub fn rollout_only(rollout: Option<&'a RolloutAllowance>) -> Policies<'a> {
        Policies {
            rollout,
            reserved_counts: false,
        }
    }
}

/// The controller owner reference of a `ProjectQuota` to its KKP `ResourceQuota`, or `None`
/// when that has no UID (not stored yet).
fn quota_owner_reference(master: &ResourceQuota) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: API_VERSION.to_owned(),
        kind: "ResourceQuota".to_owned(),
        name: master.name_any(),
        uid: master.metadata.uid.clone()?,
        controller: Some(true),
        block_owner_deletion: None,
    })
}

/// True when the `ProjectQuota` beside `master` exists with the subject labels and is owned by
/// `master` (so it goes with it).
pub fn project_quota_in_sync(master: &ResourceQuota, pq: Option<&ProjectQuota>) -> bool {
    let Some(pq) = pq else {
        return false;
    };
    let labels = pq.labels();
    let labels_ok = subject_labels(master)
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v));
    let owner_ok = master
        .metadata
        .uid
        .as_ref()
        .is_none_or(|uid| pq.owner_references().iter().any(|o| &o.uid == uid));
    labels_ok && owner_ok && pq.spec.subject == LedgerSubject::from(&master.spec.subject)
}

/// The server-side apply body that creates or adopts the `ProjectQuota` beside `master`. Only
/// metadata and `spec.subject`: `spec.quota` belongs to admins.
pub fn project_quota_apply_body(master: &ResourceQuota) -> Value {
    let mut metadata = json!({
        "name": master.name_any(),
        "labels": subject_labels(master),
    });
    if let Some(owner) = quota_owner_reference(master) {
        metadata["ownerReferences"] = json!([owner]);
    }
    json!({
        "apiVersion": ProjectQuota::api_version(&()),
        "kind": ProjectQuota::kind(&()),
        "metadata": metadata,
        "spec": {"subject": LedgerSubject::from(&master.spec.subject)},
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use kkp_quota_crds::quota::DEFAULT_QUOTA_LABEL;
    use kkp_quota_crds::{KkpQuota, Quantity, Resource, ResourceQuotaSpec, Subject};

    pub(crate) fn master() -> ResourceQuota {
        let mut quota = KkpQuota::new(&ResourceDetails {
            cpu: Some(Quantity::from_units(4)),
            ..ResourceDetails::default()
        });
        quota
            .other
            .insert("accelerators".into(), json!([{"provider": "kubevirt"}]));
        let mut m = ResourceQuota::new(
            "project-demo",
            ResourceQuotaSpec {
                subject: Subject::project("demo"),
                quota,
            },
        );
        m.metadata.labels = Some(BTreeMap::from([(
            DEFAULT_QUOTA_LABEL.to_owned(),
            "true".to_owned(),
        )]));
        m.metadata.uid = Some("rq-uid".into());
        m
    }

    fn project() -> Project {
        let mut p = Project::new("demo", kkp_quota_crds::kkp::ProjectSpec::default());
        p.metadata.uid = Some("uid-1".into());
        p
    }

    pub(crate) fn limits(cpu: i64) -> ResourceDetails {
        let mut d = ResourceDetails::default();
        d.set(Resource::Cpu, Some(Quantity::from_units(cpu)));
        d.set(Resource::Machines, Some(Quantity::from_units(3)));
        d
    }

    #[test]
    fn kkp_copy_carries_spec_unknown_fields_and_all_labels() {
        let m = master();
        let body = copy_apply_body(&m);
        assert_eq!(body["spec"]["quota"]["cpu"], "4");
        assert_eq!(body["spec"]["quota"]["accelerators"][0]["provider"], "kubevirt");
        assert!(body["spec"]["quota"].get("machines").is_none());
        assert_eq!(body["metadata"]["labels"][DEFAULT_QUOTA_LABEL], "true");
        assert_eq!(body["metadata"]["labels"][SUBJECT_NAME_LABEL], "demo");
        assert!(body["metadata"].get("ownerReferences").is_none());
    }

    #[test]
    fn ledger_carries_the_limits_in_force() {
        let m = master();
        let body = ledger_apply_body(&m, &limits(4), None, Policies::rollout_only(None));
        assert_eq!(body["apiVersion"], "kkp-quota.dev/v1alpha1");
        assert_eq!(body["spec"]["quota"]["machines"], "3");
        assert!(body["spec"].get("shares").is_none(), "no record, no shares");
        let ledger: QuotaLedger = serde_json::from_value(body).unwrap();
        let ledger = SeedLedger::from(&ledger);
        assert!(ledger_in_sync(
            &m,
            &limits(4),
            None,
            Policies::rollout_only(None),
            &ledger
        ));
        assert!(
            !ledger_in_sync(&m, &limits(5), None, Policies::rollout_only(None), &ledger),
            "a changed limit is applied again"
        );
        let mut relabelled = m.clone();
        relabelled.metadata.labels = None;
        assert!(
            !ledger_in_sync(
                &relabelled,
                &limits(4),
                None,
                Policies::rollout_only(None),
                &ledger
            ),
            "a label removed on the master is removed on the copy"
        );
    }

    #[test]
    fn ledger_carries_the_reserved_counts_policy_and_its_changes() {
        let m = master();
        let on = Policies {
            rollout: None,
            reserved_counts: true,
        };
        let body = ledger_apply_body(&m, &limits(4), None, on);
        assert_eq!(body["spec"]["reservedCounts"], true);
        let ledger: QuotaLedger = serde_json::from_value(body).unwrap();
        assert!(ledger.spec.reserved_counts);
        let ledger = SeedLedger::from(&ledger);
        assert!(ledger_in_sync(&m, &limits(4), None, on, &ledger));
        assert!(
            !ledger_in_sync(&m, &limits(4), None, Policies::default(), &ledger),
            "turned off: applied again"
        );
        let off = ledger_apply_body(&m, &limits(4), None, Policies::default());
        assert!(off["spec"].get("reservedCounts").is_none(), "absent when off");
    }

    #[test]
    fn ledger_carries_the_rollout_allowance_and_its_changes() {
        let m = master();
        let allowance = RolloutAllowance {
            overdue_after_seconds: 600,
        };
        let body = ledger_apply_body(&m, &limits(4), None, Policies::rollout_only(Some(&allowance)));
        assert_eq!(body["spec"]["rolloutAllowance"]["overdueAfterSeconds"], 600);
        let ledger: QuotaLedger = serde_json::from_value(body).unwrap();
        let ledger = SeedLedger::from(&ledger);
        assert!(ledger_in_sync(
            &m,
            &limits(4),
            None,
            Policies::rollout_only(Some(&allowance)),
            &ledger
        ));
        assert!(
            !ledger_in_sync(&m, &limits(4), None, Policies::rollout_only(None), &ledger),
            "an allowance taken back is applied"
        );
        let longer = RolloutAllowance {
            overdue_after_seconds: 900,
        };
        assert!(!ledger_in_sync(
            &m,
            &limits(4),
            None,
            Policies::rollout_only(Some(&longer)),
            &ledger
        ));
    }

    #[test]
    fn group_figures_are_refreshed_only_while_a_demand_waits_membership_always() {
        let group = |others: i64| kkp_quota_crds::LedgerGroup {
            name: "acme".into(),
            quota: limits(6),
            others_usage: limits(others),
            others_held: ResourceDetails::default(),
        };
        let carried = LedgerShares {
            groups: vec![group(2)],
            ..LedgerShares::default()
        };
        let body = ledger_apply_body(
            &master(),
            &limits(4),
            Some(&carried),
            Policies::rollout_only(None),
        );
        let ledger = SeedLedger::from(&serde_json::from_value::<QuotaLedger>(body).unwrap());
        let moved = LedgerShares {
            groups: vec![group(3)],
            ..LedgerShares::default()
        };
        assert!(groups_stale(Some(&moved), &ledger, true));
        assert!(
            !groups_stale(Some(&moved), &ledger, false),
            "no demand: rides along"
        );
        assert!(!groups_stale(Some(&carried), &ledger, true), "the same groups");
        assert!(!groups_stale(None, &ledger, true));
        // Membership and limits are always refreshed: the project left acme, or acme's limit
        // changed.
        let left = LedgerShares::default();
        assert!(groups_stale(Some(&left), &ledger, false));
        let mut raised = carried.clone();
        raised.groups[0].quota = limits(8);
        assert!(groups_stale(Some(&raised), &ledger, false));
    }

    #[test]
    fn ledger_carries_the_persisted_share() {
        let m = master();
        let share = |version: u64, granted: i64| LedgerShares {
            version,
            granted: limits(granted),
            target: limits(granted),
            others: BTreeMap::from([("seed-b".to_owned(), limits(1))]),
            ..LedgerShares::default()
        };
        let body = ledger_apply_body(&m, &limits(4), Some(&share(2, 3)), Policies::rollout_only(None));
        assert_eq!(body["spec"]["shares"]["version"], 2);
        assert_eq!(body["spec"]["shares"]["granted"]["cpu"], "3");
        assert_eq!(body["spec"]["shares"]["others"]["seed-b"]["cpu"], "1");
        let ledger: QuotaLedger = serde_json::from_value(body).unwrap();
        let ledger = SeedLedger::from(&ledger);
        assert!(ledger_in_sync(
            &m,
            &limits(4),
            Some(&share(2, 3)),
            Policies::rollout_only(None),
            &ledger
        ));
        let mut others_moved = share(2, 3);
        others_moved.others.insert("seed-c".to_owned(), limits(2));
        assert!(
            ledger_in_sync(
                &m,
                &limits(4),
                Some(&others_moved),
                Policies::rollout_only(None),
                &ledger
            ),
            "the other seeds' shares alone are no reason to write"
        );
        assert!(
            !ledger_in_sync(
                &m,
                &limits(4),
                Some(&share(3, 3)),
                Policies::rollout_only(None),
                &ledger
            ),
            "a newer record is sent"
        );
        assert!(!ledger_in_sync(
            &m,
            &limits(4),
            Some(&share(3, 4)),
            Policies::rollout_only(None),
            &ledger
        ));
        assert!(!ledger_in_sync(
            &m,
            &limits(4),
            None,
            Policies::rollout_only(None),
            &ledger
        ));
    }

    #[test]
    fn project_quota_is_owned_by_the_kkp_quota_and_leaves_spec_quota_alone() {
        let m = master();
        let body = project_quota_apply_body(&m);
        assert!(body["spec"].get("quota").is_none(), "spec.quota is the admins'");
        assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], "rq-uid");
        let pq: ProjectQuota = serde_json::from_value(body).unwrap();
        assert!(project_quota_in_sync(&m, Some(&pq)));
        assert!(!project_quota_in_sync(&m, None));
    }

    #[test]
    fn master_metadata_needs_labels_owner_and_finalizer() {
        let m = master();
        let p = project();
        assert!(!master_metadata_in_sync(&m, Some(&p)));
        let applied: ResourceQuota = {
            let mut v = serde_json::to_value(&m).unwrap();
            let body = master_metadata_patch(&m, Some(&p), true);
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
        let release = master_metadata_patch(&applied, Some(&p), false);
        assert_eq!(release["metadata"]["finalizers"], json!([]));
        assert!(release["metadata"].get("resourceVersion").is_some());
    }
}
