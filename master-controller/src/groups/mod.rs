//! `QuotaGroup`s (issue #36, step 1: shown, not enforced): each group's status is recomputed
//! from the master's caches of `Project`s and `ProjectQuota`s whenever one of them or a group
//! changes (and every resync period), and written only when it says something new. The
//! computation is [`status::desired`], pure.

pub mod status;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use kkp_quota_crds::kkp::Project;
use kkp_quota_crds::{ProjectQuota, QuotaGroup};
use kkp_quota_runtime::watch::relisting_watcher;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client, ResourceExt as _};
use tokio::sync::Notify;
use tracing::{debug, info, warn};

use crate::metrics::Metrics;
use crate::status::{merge_conditions, same_conditions};

/// What the group loop reads.
pub struct Sources {
    pub projects: Store<Project>,
    pub project_quotas: Store<ProjectQuota>,
    /// Notified on every change of a `Project` or `ProjectQuota`.
    pub changed: Arc<Notify>,
    pub resync: Duration,
}

/// Keeps every group's status until the future is dropped.
pub async fn run(master: Client, sources: Sources, metrics: Metrics) {
    let api: Api<QuotaGroup> = Api::all(master);
    let (groups, writer) = reflector::store();
    let mut events = reflector::reflector(
        writer,
        relisting_watcher(api.clone(), watcher::Config::default(), None)
            .modify(crate::api::forget_managed_fields),
    )
    .default_backoff()
    .applied_objects()
    .boxed();
    let mut resync = tokio::time::interval(sources.resync);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let _ = sources.projects.wait_until_ready().await;
    let _ = sources.project_quotas.wait_until_ready().await;
    loop {
        tokio::select! {
            event = events.next() => match event {
                None => return,
                Some(Err(e)) => {
                    debug!(error = %e, "watch of quota groups");
                    continue;
                }
                Some(Ok(_)) => {}
            },
            () = sources.changed.notified() => {}
            _ = resync.tick() => {}
        }
        for group in groups.state() {
            if let Err(e) = write_status(&api, &group, &sources).await {
                warn!(group = %group.name_any(), error = %e, "could not write the group's status; retrying on the next change");
                metrics.reconcile_errors.with_label_values(&["group"]).inc();
            }
        }
    }
}

/// Writes `group`'s status if what it should say differs from what it says.
async fn write_status(
    api: &Api<QuotaGroup>,
    group: &QuotaGroup,
    sources: &Sources,
) -> Result<(), crate::Error> {
    let projects = sources.projects.state();
    let quotas = sources.project_quotas.state();
    let (mut wanted, desired) = status::desired(
        &group.spec,
        projects.iter().map(Arc::as_ref),
        quotas.iter().map(Arc::as_ref),
    )
    .map_err(crate::Error::Quantity)?;
    let current = group.status.clone().unwrap_or_default();
    wanted.conditions = merge_conditions(
        &current.conditions,
        &desired,
        group.metadata.generation,
        jiff::Timestamp::now(),
    );
    let same = kkp_quota_crds::QuotaGroupStatus {
        conditions: Vec::new(),
        ..current.clone()
    } == kkp_quota_crds::QuotaGroupStatus {
        conditions: Vec::new(),
        ..wanted.clone()
    } && same_conditions(&current.conditions, &wanted.conditions);
    if same {
        return Ok(());
    }
    // A merge patch leaves absent fields as they are: an emptied list is written as null.
    let mut body =
        serde_json::to_value(&wanted).map_err(|e| crate::Error::Kube(kube::Error::SerdeError(e)))?;
    for field in ["projects", "usage", "byProject", "bySeed", "conditions"] {
        if let Some(object) = body.as_object_mut() {
            object.entry(field).or_insert(serde_json::Value::Null);
        }
    }
    api.patch_status(
        &group.name_any(),
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "status": body })),
    )
    .await?;
    info!(group = %group.name_any(), projects = wanted.projects.len(), "quota group status written");
    Ok(())
}
