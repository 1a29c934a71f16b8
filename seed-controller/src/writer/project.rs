//! The write of one project's quota copy on the seed: read, decide, and one compare-and-swap
//! patch (re-read and decided again on a conflict), carrying the share release when one is due;
//! then KKP's own `ResourceQuota` copy, and the Machines judged or held back.

use std::time::{Duration, Instant};

use jiff::Timestamp;
use kkp_quota_crds::quota::{PROJECT_KIND, SUBJECT_KIND_LABEL, SUBJECT_NAME_LABEL};
use kkp_quota_crds::quota_ledger::{LEDGER_FORMAT, QuotaLedgerSpec};
use kkp_quota_crds::{QuotaLedger, QuotaLedgerStatus, ResourceDetails, ResourceQuota};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use tracing::{debug, info, warn};

use super::MAX_ATTEMPTS;
use super::decision::{Decision, carry_over, decide, ledger_patch, status_after};
use super::report::{Dropped, set_surge_gauges, set_usage_gauges, timed, written};
use crate::shares::{self, Release};
use crate::succession::{Succession, inherit_for_count};
use crate::{Error, Shared};

pub(super) async fn write_project(shared: &Shared, project: &str) -> Result<(), Error> {
    let started = Instant::now();
    let result = write_project_inner(shared, project).await;
    timed(shared, "project", started, &result);
    result
}

async fn write_project_inner(shared: &Shared, project: &str) -> Result<(), Error> {
    let api: Api<QuotaLedger> = Api::all(shared.seed.clone());
    let selector = format!("{SUBJECT_NAME_LABEL}={project},{SUBJECT_KIND_LABEL}={PROJECT_KIND}");
    for _ in 0..MAX_ATTEMPTS {
        let quotas = api.list(&ListParams::default().labels(&selector)).await?;
        let inherited = match quotas.items.first().map(|q| start(shared, project, q)) {
            Some(Start::Later) => return Ok(()),
            Some(Start::Inherited(status)) => Some(*status),
            _ => None,
        };
        // The snapshot is taken after the read: every reservation we see was made before it. The
        // sizes the copy keeps are taken in first (a restart may have forgotten them).
        let (plan, adopted) = {
            let mut state = shared.state();
            let adopted = quotas.items.first().is_some_and(|q| {
                let kept = inherited
                    .as_ref()
                    .or(q.status.as_ref())
                    .map_or(&[][..], |s| &s.last_known_sizes);
                state.ledger_last_sizes(project, kept)
            });
            (state.project_plan(project)?, adopted)
        };
        if adopted {
            // Their clusters' status is due too.
            shared.wake_writer();
        }
        let Some(quota) = quotas.items.into_iter().next() else {
            // No quota for this project on this seed: nothing to write, nothing was admitted
            // against one.
            set_usage_gauges(&shared.metrics.local_usage, &[project], &plan.local_usage);
            let checked: Vec<_> = plan.appeared.iter().map(crate::ledger::Appeared::key).collect();
            let mut state = shared.state();
            state.grace_wakeups.remove(project);
            state.appeared_checked(&checked, &[], false, shared.config.admission_record_grace);
            return Ok(());
        };
        let status = inherited
            .clone()
            .unwrap_or_else(|| quota.status.clone().unwrap_or_default());
        // Decided on the lifetimes as our clock judges them; patched from the status as read.
        let judged_status = super::judge_lifetimes(shared, project, &status, Timestamp::now());
        let decision = decide(&plan, &quota.spec, &judged_status, &shared.config)?;
        set_usage_gauges(&shared.metrics.local_usage, &[project], &decision.local_usage);
        set_surge_gauges(
            shared,
            project,
            &quota.spec,
            &crate::ledger::remaining(&status.rollout_surges, decision.surges_ended.iter().copied()),
        );
        let usage_same = !decision.usage_differs(&status);
        let release = share_release(
            shared,
            project,
            &quota.spec,
            &judged_status,
            &decision,
            plan.project_unsettled,
        );
        if usage_same
            && inherited.is_none()
            && decision.drops.is_empty()
            && decision.expired.is_empty()
            && decision.demands_expired.is_empty()
            && decision.last_known.is_none()
            && decision.surges_ended.is_empty()
            && release.is_none()
        {
            judged(shared, project, &decision);
            mirror_to_kkp(shared, &quota.name_any(), project, &decision.local_usage).await?;
            return Ok(());
        }
        let mut patch = ledger_patch(&quota, &status, &decision, release.as_ref());
        if inherited.is_some() {
            carry_over(&mut patch, &status, &decision);
        }
        match api
            .patch_status(&quota.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                let Dropped {
                    counted,
                    gone,
                    expired,
                } = written(shared, project, &quota.spec, &status, &decision, release.as_ref());
                debug!(local_usage = %decision.local_usage, counted, gone, expired, allotments_expired = decision.expired.len(), held = decision.held.len(), "localUsage written");
                carried(inherited.as_ref());
                judged(shared, project, &decision);
                mirror_to_kkp(shared, &quota.name_any(), project, &decision.local_usage).await?;
                return Ok(());
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                debug!("quota copy changed meanwhile; recomputing");
            }
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
    Err(kept_changing(project))
}

fn kept_changing(project: &str) -> Error {
    Error::LedgerKeptChanging {
        project: project.to_owned(),
        attempts: MAX_ATTEMPTS,
    }
}

/// The share release the write of `decision` carries, if shares are in force on the ledger and
/// one is due: computed from the status that write produces (its `localUsage`, the reservations,
/// allotments and demands it keeps, the `released` read). Share arithmetic that fails releases
/// nothing (logged): it never holds up the write of `localUsage` and the reservations.
fn share_release(
    shared: &Shared,
    project: &str,
    spec: &QuotaLedgerSpec,
    status: &QuotaLedgerStatus,
    decision: &Decision,
    project_unsettled: bool,
) -> Option<Release> {
    spec.shares.as_ref()?;
    let settings = shared.config.shares();
    let now = Timestamp::now();
    let after = status_after(status, decision);
    // The status read, then the one the write produces: a write that makes `localUsage` grow is a
    // sign of admissions itself.
    let activity = {
        let mut state = shared.state();
        state.ledger_seen(project, status, now);
        state.ledger_seen(project, &after, now)
    };
    let quiet = activity.quiet(&after, project_unsettled, settings.quiet_period, now);
    let slack = kkp_quota_crds::shares::slack(&spec.quota, settings.slack_percent);
    let release = shares::release(spec, &after, &slack, quiet).unwrap_or_else(|e| {
        warn!(project = %project, error = %e, "share arithmetic failed; releasing nothing");
        None
    });
    // The quota watch sets no timer while a cluster of the project is unsettled, and a project
    // that settles without its ledger changing gives it no event to set one on: the writer wakes
    // itself when the quiet period ends. (A write that changes the ledger, such as a release,
    // gives the watch its event.)
    let wakeup = if release.is_none() {
        shares::upkeep(spec, &after, &activity, project_unsettled, settings, now)
            .ok()
            .and_then(|u| u.next)
            .and_then(|at| Duration::try_from(at.duration_since(now)).ok())
            .and_then(|wait| Instant::now().checked_add(wait))
    } else {
        None
    };
    let mut state = shared.state();
    match wakeup {
        Some(at) => state.share_wakeups.insert(project.to_owned(), at),
        None => state.share_wakeups.remove(project),
    };
    release
}

/// KKP's own `ResourceQuota` copy on this seed (same name as the ledger) gets the seed's usage in
/// KKP's shape, so KKP's views show it. Only cpu, memory and storage; written when it changed
/// since the last write of this process. A copy not there (yet) is skipped: master-controller
/// creates it before the ledger, and the next change writes it.
async fn mirror_to_kkp(
    shared: &Shared,
    name: &str,
    project: &str,
    usage: &ResourceDetails,
) -> Result<(), Error> {
    let usage = usage.kkp_subset();
    if shared.state().kkp_usage_written.get(project) == Some(&usage) {
        return Ok(());
    }
    let api: Api<ResourceQuota> = Api::all(shared.seed.clone());
    let patch = json!({ "status": { "localUsage": usage } });
    let params = PatchParams {
        field_manager: Some(crate::webhook_config::FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    match api.patch_status(name, &params, &Patch::Merge(&patch)).await {
        Ok(_) => {
            shared.state().kkp_usage_written.insert(project.to_owned(), usage);
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// After a write (or none needed): the judged Machines are flagged if unadmitted and forgotten,
/// the held-back ones stay, and the writer is to wake when the earliest grace ends.
fn judged(shared: &Shared, project: &str, decision: &Decision) {
    for (cluster, _) in &decision.bypassed {
        shared.metrics.unadmitted.with_label_values(&[cluster]).inc();
    }
    if !decision.held.is_empty() {
        debug!(
            held = decision.held.len(),
            "Machines without reservation held back while allotments may cover them"
        );
    }
    let mut state = shared.state();
    state.held_back(&decision.held);
    state.appeared_checked(
        &decision.checked,
        &decision.bypassed,
        decision.had_allotments,
        shared.config.admission_record_grace,
    );
    match decision.grace_end {
        Some(at) => {
            state.grace_wakeups.insert(project.to_owned(), at);
        }
        None => {
            state.grace_wakeups.remove(project);
        }
    }
}

/// What a write of a project's ledger starts from.
enum Start {
    /// Not now: an uncounted ledger the watch has not shown yet (its watch event, after its
    /// predecessor's deletion, asks for the write), or one in a newer format.
    Later,
    AsRead,
    /// An uncounted successor: its status with the deleted ledger's entries taken in
    /// ([`crate::succession`]).
    Inherited(Box<QuotaLedgerStatus>),
}

fn start(shared: &Shared, project: &str, quota: &QuotaLedger) -> Start {
    let read = quota.status.clone().unwrap_or_default();
    // A newer release wrote it: never written back down to our format (docs/architecture.md,
    // "Ledger format").
    let format = read.format_version.unwrap_or(1);
    if format > LEDGER_FORMAT {
        warn!(
            format,
            understood = LEDGER_FORMAT,
            "the quota ledger has a newer format than this seed-controller writes; not writing it: upgrade seed-controller"
        );
        return Start::Later;
    }
    if read.local_usage.is_some() {
        return Start::AsRead;
    }
    let mut state = shared.state();
    let state = &mut *state;
    let keep = shared.config.reservation_ttl;
    state.successions.prune(Instant::now(), keep);
    let shown = state.ledgers.of(project).and_then(|l| l.metadata.uid.as_deref());
    match state.successions.for_uncounted(
        project,
        &quota.uid().unwrap_or_default(),
        shown,
        Instant::now(),
        keep,
    ) {
        Succession::Unseen => {
            debug!("a new ledger not seen by the watch yet: counted when it is");
            // Looked at again soon, should its watch event not come.
            let again = Instant::now() + Duration::from_secs(1);
            state.share_wakeups.entry(project.to_owned()).or_insert(again);
            Start::Later
        }
        Succession::First => Start::AsRead,
        Succession::After(predecessor) => Start::Inherited(Box::new(inherit_for_count(
            &read,
            predecessor,
            Timestamp::now(),
            shared.config.admission_record_grace,
        ))),
    }
}

fn carried(inherited: Option<&QuotaLedgerStatus>) {
    let Some(status) = inherited else { return };
    info!(
        reservations = status.reservations.len(),
        allotments = status.allotments.len(),
        "the ledger was re-created: its first count carries the reservations and allotments of the deleted one"
    );
}
