//! Several KKP quotas for one project (issue #32, finding 9). Each seed enforces one ledger per
//! project: the one whose name sorts first (machine-webhook's cache and seed-controller's listing
//! both take the first by name). The master follows the same rule, so that what it fans out is
//! what the seeds enforce: every other quota of the project is *not in force*. Nothing of it
//! reaches the seeds (its ledgers there are deleted, so each seed holds one ledger per project),
//! its `ProjectQuota` gets `NotInForce`, a Warning Event on KKP's object says which quota is in
//! force instead, and `kkp_quota_master_quotas_not_in_force` counts them. Once the quota in force
//! is deleted, the next one by name takes over (fanned out like a new quota: the seeds refuse
//! growth until they have counted it).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use futures::future;
use kkp_quota_crds::quota::PROJECT_KIND;
use kkp_quota_crds::{ProjectQuota, QuotaLedger, ResourceQuota};
use kkp_quota_runtime::work_queue::Next;
use kube::api::DeleteParams;
use kube::{Api, ResourceExt};
use tracing::warn;

use crate::Error;
use crate::ctx::Ctx;
use crate::metrics::Metrics;
use crate::seeds::SeedView;
use crate::status;
use crate::{ledger_guard, unreadable};

/// The quota in force for `quota`'s project when it is another one: among the project's quotas
/// not being deleted, the one whose name sorts first. `None`: `quota` is in force (or is not a
/// project's quota).
pub fn in_force_instead<'a>(
    quota: &ResourceQuota,
    all: impl IntoIterator<Item = &'a ResourceQuota>,
) -> Option<String> {
    if quota.spec.subject.kind != PROJECT_KIND {
        return None;
    }
    let own = name_of(quota);
    all.into_iter()
        .filter(|q| candidate_of(q) == Some(quota.spec.subject.name.as_str()))
        .map(name_of)
        .min()
        .filter(|first| *first < own)
        .map(str::to_owned)
}

/// Every project's quota in force (the rule of [`in_force_instead`]), by project, from one pass
/// over `all`.
pub fn in_force_by_project<'a>(
    all: impl IntoIterator<Item = &'a ResourceQuota>,
) -> BTreeMap<&'a str, &'a ResourceQuota> {
    let mut in_force: BTreeMap<&str, &ResourceQuota> = BTreeMap::new();
    for quota in all {
        if let Some(project) = candidate_of(quota) {
            in_force
                .entry(project)
                .and_modify(|first| {
                    if name_of(quota) < name_of(first) {
                        *first = quota;
                    }
                })
                .or_insert(quota);
        }
    }
    in_force
}

/// The object's name, borrowed (`name_any` allocates: this runs once per quota per pass).
fn name_of(quota: &ResourceQuota) -> &str {
    quota.metadata.name.as_deref().unwrap_or_default()
}

/// The project `quota` may be in force for: a project's quota not being deleted.
fn candidate_of(quota: &ResourceQuota) -> Option<&str> {
    (quota.spec.subject.kind == PROJECT_KIND && quota.metadata.deletion_timestamp.is_none())
        .then_some(quota.spec.subject.name.as_str())
}

/// The quotas known not to be in force, for the gauge.
#[derive(Default)]
pub(crate) struct NotInForce {
    names: Mutex<BTreeSet<String>>,
}

impl NotInForce {
    /// Records whether `name` is in force (a quota deleted counts as in force: not counted).
    pub(crate) fn track(&self, name: &str, not_in_force: bool, metrics: &Metrics) {
        let mut names = self
            .names
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if not_in_force {
            names.insert(name.to_owned());
        } else {
            names.remove(name);
        }
        metrics
            .quotas_not_in_force
            .set(i64::try_from(names.len()).unwrap_or(i64::MAX));
    }
}

/// Reports a quota that is not in force and skips the rest of its reconcile (called once its
/// `ProjectQuota` exists, before the share round): its ledgers on the seeds are deleted, and the
/// condition and the Event are written once per quota in force instead (and generation).
pub(crate) async fn report(
    master_rq: &ResourceQuota,
    pq: &ProjectQuota,
    in_force: &str,
    views: &[SeedView],
    ctx: &Ctx,
) -> Result<Next, Error> {
    let name = master_rq.name_any();
    ctx.not_in_force.track(&name, true, &ctx.metrics);
    let pending = delete_ledgers(&name, views, ctx).await;
    let desired = status::not_in_force(master_rq.project(), in_force);
    if unreadable::say(master_rq, pq, &desired, ctx).await? {
        warn!(in_force = %in_force, "quota not fanned out: another quota of the project is in force");
    }
    if pending.is_empty() {
        Ok(Next::AwaitChange)
    } else {
        warn!(seeds = %pending.join(", "), "ledgers of a quota not in force not deleted yet");
        Ok(Next::After(Duration::from_secs(5)))
    }
}

/// Deletes the quota's ledger on every seed; the seeds where it could not be deleted yet.
async fn delete_ledgers(name: &str, views: &[SeedView], ctx: &Ctx) -> Vec<String> {
    let deletes = views.iter().map(|view| async move {
        // A seed without a copy of it has nothing to delete.
        view.copy.as_ref()?;
        let client = view.client.clone()?;
        let api = Api::<QuotaLedger>::all(client);
        match ledger_guard::delete_ledger(&api, name, &DeleteParams::default()).await {
            Ok(true) => {
                ctx.metrics.wrote(&view.name, "delete");
                None
            }
            Ok(false) => Some(view.name.clone()),
            Err(e) => {
                warn!(seed = %view.name, error = %e, "deleting the ledger of a quota not in force failed");
                ctx.metrics.sync_error(&view.name, "delete");
                Some(view.name.clone())
            }
        }
    });
    future::join_all(deletes).await.into_iter().flatten().collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use kkp_quota_crds::quota::{ResourceQuotaSpec, Subject};

    /// A project's quota, for tests here and in `crate::by_subject`.
    pub(crate) fn quota(name: &str, project: &str) -> ResourceQuota {
        ResourceQuota::new(
            name,
            ResourceQuotaSpec {
                subject: Subject::project(project),
                quota: kkp_quota_crds::KkpQuota::default(),
            },
        )
    }

    #[test]
    fn the_first_name_of_the_project_is_in_force() {
        let a = quota("project-a", "a");
        let extra = quota("a-extra", "a");
        let later = quota("zzz", "a");
        let other = quota("0-other", "b");
        let all = [a.clone(), extra.clone(), later.clone(), other.clone()];
        assert_eq!(in_force_instead(&a, &all), Some("a-extra".into()));
        assert_eq!(in_force_instead(&later, &all), Some("a-extra".into()));
        assert_eq!(in_force_instead(&extra, &all), None);
        assert_eq!(in_force_instead(&other, &all), None);
        let by_project = in_force_by_project(&all);
        let names: Vec<(&str, String)> = by_project.iter().map(|(p, q)| (*p, q.name_any())).collect();
        assert_eq!(names, [("a", "a-extra".to_owned()), ("b", "0-other".to_owned())]);
        // One being deleted no longer counts: the next takes over.
        let mut leaving = extra;
        leaving.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::UNIX_EPOCH,
        ));
        let all = [a.clone(), leaving, later];
        assert_eq!(in_force_instead(&a, &all), None);
        assert_eq!(in_force_by_project(&all)["a"].name_any(), "project-a");
    }
}
