//! The users' view of their project's quota: a `QuotaView` in every user cluster
//! (`kkp_quota_crds::quota_view`), kept by [`keep`] from what this process already knows (the
//! ledgers the writer watches, the clusters' usage it counts), within a second of a change.
//!
//! - `build`: what the view says, pure;
//! - `ledgers`: the latest ledger of each project and whether the seed can be read;
//! - `install`: the CRD and the read-only `ClusterRole` for every authenticated user.
//!
//! The view is rewritten when what it says changes, and at least every [`HEARTBEAT`] while it is
//! current, so its `confirmedAt` also tells a reader whether anybody still keeps it. Every view
//! turns `Stale` when the seed cannot be read: its ledger watch fails, or [`probe_seed`]'s read
//! fails or hangs.

mod build;
mod install;
mod ledgers;

use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use kkp_quota_crds::{ClusterUse, QuotaView, QuotaViewStatus, ViewState};
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde_json::json;
use tracing::{info, warn};

pub use build::build;
pub use ledgers::Ledgers;

use crate::Shared;
use crate::webhook_config::FIELD_MANAGER;

/// How often the seed is read while its ledger watch fails ([`probe_seed`]).
const PROBE: Duration = Duration::from_secs(5);
/// How often a current view is confirmed although nothing changed.
pub const HEARTBEAT: Duration = Duration::from_mins(1);
/// Changes arriving together (a burst of Machines) make one write.
const SETTLE: Duration = Duration::from_millis(200);
/// The wait before a failed write is tried again.
const RETRY: Duration = Duration::from_secs(5);

/// Takes one event of the writer's ledger watch in, and wakes the views when it may change one.
pub fn observe(shared: &Shared, event: &Result<Event<kkp_quota_crds::QuotaLedger>, watcher::Error>) {
    let changed = shared.state().ledgers.observe(event, Timestamp::now());
    if changed {
        shared.views_changed();
    }
}

/// Reads the seed every [`PROBE`] (one listing of at most one ledger's metadata): a frozen seed
/// API server fails no watch, and a watch that reconnected with no change to report yields no
/// event, so neither would turn the views stale or current again.
pub async fn probe_seed(shared: Arc<Shared>) {
    let api: Api<kkp_quota_crds::QuotaLedger> = Api::all(shared.seed.clone());
    let mut tick = tokio::time::interval(PROBE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let listed = tokio::time::timeout(
            PROBE,
            api.list_metadata(&kube::api::ListParams::default().limit(1)),
        )
        .await;
        let changed = match listed {
            Ok(Ok(_)) => {
                let changed = shared.state().ledgers.readable_again();
                if changed {
                    info!("the seed can be read again: quota views current");
                }
                changed
            }
            Ok(Err(e)) => {
                let changed = shared.state().ledgers.unreadable(Timestamp::now());
                if changed {
                    warn!(error = %e, "the seed cannot be read: quota views stale");
                }
                changed
            }
            Err(_) => {
                let changed = shared.state().ledgers.unreadable(Timestamp::now());
                if changed {
                    warn!("the seed does not answer: quota views stale");
                }
                changed
            }
        };
        if changed {
            shared.views_changed();
        }
    }
}

/// The name of the view of `project`.
pub fn name(project: &str) -> String {
    format!("project-{project}")
}

/// What `cluster`'s view should say now: its project, and the status without `confirmedAt`
/// (`None`: the cluster has no project).
fn desired(shared: &Shared, cluster: &str) -> Option<(String, QuotaViewStatus)> {
    let state = shared.state();
    let project = state.clusters.get(cluster)?.project.clone()?;
    let clusters: Vec<ClusterUse> = state
        .clusters
        .iter()
        .filter(|(_, c)| c.project.as_deref() == Some(project.as_str()))
        .map(|(name, c)| ClusterUse {
            cluster: name.clone(),
            usage: c.reported_usage(),
        })
        .collect();
    let ledger = state.ledgers.of(&project).cloned();
    let since = state.ledgers.unreadable_since();
    drop(state);
    let status = build(ledger.as_deref(), clusters, &shared.config.seed_name, since);
    Some((project, status))
}

/// Keeps the view in one user cluster until the task is aborted.
pub async fn keep(client: Client, shared: Arc<Shared>, cluster: String) {
    install::install(&client, &cluster).await;
    let api: Api<QuotaView> = Api::all(client);
    let mut changes = shared.views.subscribe();
    // What was last written (project and status without `confirmedAt`), and when it was last
    // confirmed.
    let mut written: Option<(String, QuotaViewStatus)> = None;
    let mut confirmed_at: Option<Timestamp> = None;
    let mut last_write = Instant::now();
    let mut wait = HEARTBEAT;
    // Views of other projects may be left in the cluster (it moved to another project, or this
    // process restarted after it did): removed once the current one is written.
    let mut others_left = true;
    loop {
        if let Some((project, status)) = desired(&shared, &cluster) {
            let confirms = matches!(status.state, ViewState::Current | ViewState::NoQuota);
            let differs = written.as_ref() != Some(&(project.clone(), status.clone()));
            if differs || (confirms && last_write.elapsed() >= HEARTBEAT) {
                let now = Timestamp::now();
                let stamped = QuotaViewStatus {
                    confirmed_at: if confirms { Some(now) } else { confirmed_at },
                    ..status.clone()
                };
                let new_project = written.as_ref().is_none_or(|(p, _)| *p != project);
                match write(&api, &project, &stamped, new_project).await {
                    Ok(()) => {
                        if new_project {
                            info!(cluster, project, "quota view written");
                        }
                        confirmed_at = stamped.confirmed_at;
                        others_left |= new_project;
                        written = Some((project.clone(), status));
                        last_write = Instant::now();
                        wait = HEARTBEAT;
                    }
                    Err(e) => {
                        warn!(cluster, error = %e, "could not write the quota view; retrying");
                        wait = RETRY;
                    }
                }
            }
            if others_left && written.as_ref().is_some_and(|(p, _)| *p == project) {
                match remove_others(&api, &project).await {
                    Ok(removed) => {
                        others_left = false;
                        if !removed.is_empty() {
                            info!(
                                cluster,
                                project,
                                ?removed,
                                "quota views of other projects removed"
                            );
                        }
                    }
                    Err(e) => {
                        warn!(cluster, error = %e, "could not remove the quota views of other projects; retrying");
                        wait = RETRY;
                    }
                }
            }
        }
        tokio::select! {
            woken = changes.changed() => {
                if woken.is_err() {
                    return;
                }
                tokio::time::sleep(SETTLE).await;
            }
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// Writes the view: the object with its project when it may not exist yet (or the project
/// changed), then the status.
async fn write(
    api: &Api<QuotaView>,
    project: &str,
    status: &QuotaViewStatus,
    with_spec: bool,
) -> Result<(), kube::Error> {
    let name = name(project);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let header =
        json!({"apiVersion": "kkp-quota.dev/v1alpha1", "kind": "QuotaView", "metadata": {"name": name}});
    let apply_spec = || async {
        let mut object = header.clone();
        object["spec"] = json!({ "project": project });
        api.patch(&name, &params, &Patch::Apply(&object)).await.map(drop)
    };
    if with_spec {
        apply_spec().await?;
    }
    let mut object = header.clone();
    object["status"] = serde_json::to_value(status).unwrap_or_default();
    match api.patch_status(&name, &params, &Patch::Apply(&object)).await {
        // Deleted by somebody since: created again.
        Err(kube::Error::Api(e)) if e.code == 404 && !with_spec => {
            apply_spec().await?;
            api.patch_status(&name, &params, &Patch::Apply(&object))
                .await
                .map(drop)
        }
        other => other.map(drop),
    }
}

/// Deletes every view in the cluster but `project`'s: a cluster belongs to one project, and a
/// view of another would tell its users a quota that no longer applies to them.
async fn remove_others(api: &Api<QuotaView>, project: &str) -> Result<Vec<String>, kube::Error> {
    let keep = name(project);
    let mut removed = Vec::new();
    for view in api.list_metadata(&kube::api::ListParams::default()).await? {
        let Some(other) = view.metadata.name.filter(|n| *n != keep) else {
            continue;
        };
        match api.delete(&other, &kube::api::DeleteParams::default()).await {
            Ok(_) => removed.push(other),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(removed)
}
