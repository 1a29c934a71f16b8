//! The watch of the seed's quota copies ([`watch_quotas`]): which copy needs a write now, and
//! when the others next will although nothing changes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use jiff::{SignedDuration, Timestamp};
use kkp_quota_crds::{QuotaLedger, Resource};
use kkp_quota_runtime::watch::relisting_watcher;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tracing::warn;

use super::decision::{decide, ledger_due};
use super::judge_lifetimes;
use super::report::set_share_gauges;
use crate::Shared;
use crate::shares;

/// A project's ledger is gone: what was kept of it, and its gauges, go too.
fn forget_ledger(shared: &Shared, project: &str) {
    {
        let mut state = shared.state();
        state.share_activity.remove(project);
        state.lifetimes.forget(project);
        state.forget_last_sizes(project);
    }
    for &resource in Resource::ALL {
        let _ = shared
            .metrics
            .share_held
            .remove_label_values(&[project, resource.name()]);
        let _ = shared
            .metrics
            .rollout_surge
            .remove_label_values(&[project, resource.name()]);
    }
    let _ = shared
        .metrics
        .rollout_surge_overdue_at
        .remove_label_values(&[project]);
}

/// Watches the seed's quota copies: a new copy, a copy whose `localUsage` is not ours, copies
/// with reservations, with an expired demand or with share to release get a write; so does a copy
/// when its oldest reservation's TTL ends, its earliest allotment or live demand expires, or its
/// quiet period ends while it holds share above `committed + slack` (and again every little while
/// as long as a write stays due without changing the copy, e.g. a reservation past its TTL while
/// its cluster is unsettled).
pub async fn watch_quotas(shared: Arc<Shared>) {
    let api: Api<QuotaLedger> = Api::all(shared.seed.clone());
    let mut stream = relisting_watcher(api, watcher::Config::default(), None)
        .default_backoff()
        .boxed();
    // Project -> when its ledger is next due for a write.
    let mut due: HashMap<String, Timestamp> = HashMap::new();
    let ttl = SignedDuration::try_from(shared.config.reservation_ttl).unwrap_or(SignedDuration::MAX);
    let again =
        (shared.config.reservation_ttl / 4).clamp(Duration::from_millis(200), Duration::from_secs(10));
    let again_signed = SignedDuration::try_from(again).unwrap_or(SignedDuration::from_secs(10));
    let settings = shared.config.shares();
    loop {
        let now = Timestamp::now();
        let wait = due.values().min().map_or(Duration::from_hours(1), |t| {
            Duration::try_from(t.duration_since(now)).unwrap_or(Duration::ZERO)
        });
        tokio::select! {
            event = stream.next() => {
                if let Some(event) = &event {
                    crate::succession::observe(&shared, event);
                    crate::view::observe(&shared, event);
                }
                match event {
                Some(Ok(Event::InitApply(quota) | Event::Apply(quota))) => {
                    let project = quota.project().to_owned();
                    let read = quota.status.clone().unwrap_or_default();
                    set_share_gauges(&shared, &project, &quota.spec, Some(&read));
                    let now = Timestamp::now();
                    // Lifetimes by our clock; the patch is built from a fresh read anyway.
                    let status = judge_lifetimes(&shared, &project, &read, now);
                    let (stale, share_next) = {
                        let mut state = shared.state();
                        let activity = state.ledger_seen(&project, &status, now);
                        // Sizes a restart forgot are taken in before any write of this process.
                        let adopted = state.ledger_last_sizes(&project, &status.last_known_sizes);
                        let ours = state.projects().contains(&project);
                        let plan = state.project_plan(&project).ok();
                        let decision = plan
                            .as_ref()
                            .and_then(|plan| decide(plan, &quota.spec, &status, &shared.config).ok());
                        let differs = decision
                            .as_ref()
                            .is_none_or(|d| d.usage_differs(&status) || d.last_known.is_some())
                            || adopted;
                        let unsettled = plan.as_ref().is_some_and(|p| p.project_unsettled);
                        let upkeep = shares::upkeep(&quota.spec, &status, &activity, unsettled, settings, now)
                            .unwrap_or_else(|e| {
                                warn!(project = %project, error = %e, "share arithmetic failed; releasing nothing");
                                shares::Upkeep::default()
                            });
                        // With the seed's Cluster webhook, a project's first Cluster here is
                        // checked against this ledger, which must then be counted (at zero)
                        // although the project has no cluster on this seed yet.
                        let counts_here = ours || status.local_usage.is_some() || shared.config.cluster_webhook;
                        let write_due = counts_here && differs
                            || !status.reservations.is_empty()
                            || upkeep.due_now;
                        (write_due, upkeep.next)
                    };
                    // `status` is judged (reservations and allotments by this process's clock
                    // from when it first saw them), as the writer judges it.
                    match ledger_due(&status, ttl).into_iter().chain(share_next).min() {
                        Some(t) => { due.insert(project.clone(), t); }
                        None => { due.remove(&project); }
                    }
                    if stale {
                        shared.state().dirty_projects.insert(project);
                        shared.wake_writer();
                    }
                }
                Some(Ok(Event::Delete(quota))) => {
                    due.remove(quota.project());
                    forget_ledger(&shared, quota.project());
                }
                Some(Ok(Event::Init | Event::InitDone)) => {}
                Some(Err(e)) => warn!(error = %e, "QuotaLedger watch on the seed failed; retrying"),
                None => return,
            }},
            () = tokio::time::sleep(wait) => {
                let now = Timestamp::now();
                let mut fired = Vec::new();
                for (project, at) in &mut due {
                    if *at <= now {
                        fired.push(project.clone());
                        // Due again a little later, unless a write changes the copy meanwhile.
                        *at = now.saturating_add(again_signed).unwrap_or(Timestamp::MAX);
                    }
                }
                if !fired.is_empty() {
                    shared.state().dirty_projects.extend(fired);
                    shared.wake_writer();
                }
            }
        }
    }
}
