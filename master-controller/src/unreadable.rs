//! KKP quotas with a limit this system cannot read exactly (KKP's CRD accepts `1e40` and
//! `0.5n`). Such a quota is read leniently ([`kkp_quota_crds::KkpQuota::unreadable`]) so that
//! it cannot fail a listing, and then skipped alone: nothing of it reaches the seeds (they keep
//! what they last had from it), the `ProjectQuota` beside it gets `QuotaInvalid`, a Warning
//! Event on KKP's object says the same, and `kkp_quota_master_unreadable_quotas` counts them.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use jiff::Timestamp;
use kkp_quota_crds::{ProjectQuota, ResourceQuota};
use kkp_quota_runtime::work_queue::Next;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{error, warn};

use crate::Error;
use crate::ctx::Ctx;
use crate::metrics::Metrics;
use crate::status;

/// An Event that cannot be published within this long is given up (the condition stays).
const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

/// The unreadable quotas known to this replica, and where their Events go.
pub(crate) struct Unreadable {
    names: Mutex<BTreeSet<String>>,
    recorder: Recorder,
}

impl Unreadable {
    pub(crate) fn new(master: Client) -> Unreadable {
        let reporter = Reporter {
            controller: "kkp-quota-master-controller".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Unreadable {
            names: Mutex::new(BTreeSet::new()),
            recorder: Recorder::new(master, reporter),
        }
    }

    /// Counts `quota` while it has an unreadable limit and is not being deleted.
    pub(crate) fn track(&self, quota: &ResourceQuota, metrics: &Metrics) {
        let unreadable =
            !quota.spec.quota.unreadable.is_empty() && quota.metadata.deletion_timestamp.is_none();
        self.track_named(&quota.name_any(), unreadable, metrics);
    }

    /// Counts `name` (a quota, or the default quota in the settings) while it is `unreadable`.
    pub(crate) fn track_named(&self, name: &str, unreadable: bool, metrics: &Metrics) {
        let name = name.to_owned();
        let mut names = self
            .names
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if unreadable {
            names.insert(name);
        } else {
            names.remove(&name);
        }
        metrics
            .unreadable_quotas
            .set(i64::try_from(names.len()).unwrap_or(i64::MAX));
    }
}

/// True when `pq` already says what `desired` says, for this generation of the quota.
fn already_said(pq: &ProjectQuota, desired: &status::Desired, generation: Option<i64>) -> bool {
    pq.status.iter().flat_map(|s| &s.conditions).any(|c| {
        c.type_ == desired.type_
            && c.status == "True"
            && c.message == desired.message
            && c.observed_generation == generation
    })
}

/// Reports a quota with unreadable limits and skips the rest of its reconcile (called once its
/// `ProjectQuota` exists, before the share round: nothing of it reaches a seed). The condition
/// and the Event are written once per problem (and generation), not on every resync.
pub(crate) async fn report(master_rq: &ResourceQuota, pq: &ProjectQuota, ctx: &Ctx) -> Result<Next, Error> {
    let desired = status::quota_invalid(&master_rq.spec.quota.unreadable);
    if say(master_rq, pq, &desired, ctx).await? {
        warn!(problem = %desired.message, "quota not fanned out: a limit cannot be read");
    }
    Ok(Next::AwaitChange)
}

/// Why a quota is not fanned out, said once per problem (and generation), not on every resync:
/// the condition `desired` on its `ProjectQuota`, and a Warning Event on KKP's object. Whether
/// it was said now.
pub(crate) async fn say(
    master_rq: &ResourceQuota,
    pq: &ProjectQuota,
    desired: &status::Desired,
    ctx: &Ctx,
) -> Result<bool, Error> {
    let generation = master_rq.metadata.generation;
    if already_said(pq, desired, generation) {
        return Ok(false);
    }
    let existing = pq.status.clone().unwrap_or_default().conditions;
    let conditions = status::merge_conditions(
        &existing,
        std::slice::from_ref(desired),
        generation,
        Timestamp::now(),
    );
    let patch = json!({ "status": { "conditions": conditions } });
    let name = master_rq.name_any();
    let pq_api: Api<ProjectQuota> = Api::all(ctx.master.clone());
    let written = ctx
        .metrics
        .timed_write(
            "master",
            "status",
            pq_api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await?;
    ctx.wrote_project_quota(&name, written);
    warn_event(master_rq, desired, ctx).await;
    Ok(true)
}

/// A Warning Event on KKP's quota saying what `desired` says (given up after a while: the
/// condition stays).
async fn warn_event(master_rq: &ResourceQuota, desired: &status::Desired, ctx: &Ctx) {
    let event = Event {
        type_: EventType::Warning,
        reason: desired.reason.clone(),
        note: Some(desired.message.chars().take(1000).collect()),
        action: "FanOut".into(),
        secondary: None,
    };
    let reference = master_rq.object_ref(&());
    match tokio::time::timeout(EVENT_TIMEOUT, ctx.unreadable.recorder.publish(&event, &reference)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => error!(error = %e, reason = %desired.reason, "could not publish an Event"),
        Err(_) => error!(reason = %desired.reason, "publishing an Event timed out"),
    }
}
