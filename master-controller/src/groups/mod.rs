//! `QuotaGroup`s (issue #36): each group's status is recomputed
//! from the master's caches of `Project`s and `ProjectQuota`s whenever one of them or a group
//! changes (and every resync period), and written only when it says something new. The
//! computation is [`status::desired`], pure. A `shared` group's budgets are kept in the same
//! pass, before its status ([`crate::budgets::group_round`]).

pub mod status;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt as _, StreamExt as _};
use kkp_quota_crds::kkp::Project;
use kkp_quota_crds::project_quota::{GroupBudget, effective_limits};
use kkp_quota_crds::quota_group::GroupMode;
use kkp_quota_crds::shares::budgets::Member;
use kkp_quota_crds::{ProjectQuota, QuotaGroup, QuotaGroupStatus, ResourceDetails, ResourceQuota};

use crate::allocation::books::Books;
use crate::group_book::GroupBook;
use crate::group_series::GroupFigures;
use kkp_quota_runtime::watch::{relisting_watcher, resource_version};
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client, ResourceExt as _};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::metrics::Metrics;
use crate::status::{merge_conditions, same_conditions};

/// A group's status whose usage figures only grew is written at most this often
/// ([`status::figures_only`]): with 100 members the object is about 44 KB, and one status write
/// of it cost the master's API server and etcd 72 ms of CPU (6 ms for an empty group) on the
/// 2-core machine. Conditions, the selected projects, a member's usage going down and the budget
/// record are written at once.
pub const USAGE_PACE: Duration = Duration::from_secs(2);

/// What this process last wrote of a group's status, and when.
struct Written {
    status: QuotaGroupStatus,
    at: Instant,
}

/// What [`write_status`] did.
enum Outcome {
    Unchanged,
    Written(Box<QuotaGroupStatus>),
    /// Only usage figures grew, and the last write was less than [`USAGE_PACE`] ago: a pass is
    /// due then.
    Deferred(Instant),
}

/// What the group loop reads.
pub struct Sources {
    pub projects: Store<Project>,
    pub project_quotas: Store<ProjectQuota>,
    /// KKP's quotas (what an `allocation` group adds up).
    pub kkp_quotas: Store<ResourceQuota>,
    /// Whether this process serves the allocation webhook.
    pub allocation_webhook: bool,
    /// Notified on every change of a `Project` or `ProjectQuota`.
    pub changed: Arc<Notify>,
    pub resync: Duration,
    /// Where the share rounds read the groups from (filled on every pass).
    pub book: GroupBook,
    /// Asks for a share round of the quota of this name (a member's, after its group's budgets
    /// changed).
    pub reconcile: mpsc::UnboundedSender<String>,
    /// The slack of a group's budgets, as of a project's shares (`--share-slack-percent`).
    pub share_slack_percent: u32,
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
    .boxed();
    let mut resync = tokio::time::interval(sources.resync);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let _ = sources.projects.wait_until_ready().await;
    let _ = sources.project_quotas.wait_until_ready().await;
    let _ = sources.kkp_quotas.wait_until_ready().await;
    // What this process last wrote of each group (by UID): the store lags its own writes, and
    // comparing with it would write them again (and stamp new transition times).
    let mut written: HashMap<String, Written> = HashMap::new();
    // When a paced status write is due (the earliest of them).
    let mut due: Option<Instant> = None;
    // Whether the store holds every group (the share rounds wait for it).
    let mut listed = false;
    // Whether a group came, went or changed its spec since the last pass: every quota's share
    // round then runs, so a project no longer bounded (or newly bounded) replans at once.
    let mut reshaped = false;
    loop {
        let pass = tokio::select! {
            event = events.next() => match event {
                None => return,
                Some(event) => {
                    listed |= matches!(event, Ok(watcher::Event::InitDone));
                    reshaped |= reshapes(event.as_ref(), &sources.book);
                    if crd_missing(event.as_ref()) {
                        // No QuotaGroup can exist: nothing bounds a project.
                        sources.book.update(&[]);
                    }
                    counts(event.as_ref(), &metrics)
                }
            },
            () = sources.changed.notified() => true,
            () = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => true,
            _ = resync.tick() => {
                // Once a period, compare with what the API server holds (someone else's write).
                written.clear();
                true
            }
        };
        // Take in whatever else is ready before one pass over every group.
        let mut pass = pass;
        while let Some(Some(event)) = events.next().now_or_never() {
            listed |= matches!(event, Ok(watcher::Event::InitDone));
            reshaped |= reshapes(event.as_ref(), &sources.book);
            pass |= counts(event.as_ref(), &metrics);
        }
        if !pass || !listed {
            continue;
        }
        let groups = groups.state();
        written.retain(|uid, _| groups.iter().any(|g| g.uid().as_deref() == Some(uid.as_str())));
        sources.book.update(&groups);
        let start = Instant::now();
        due = one_pass(
            &api,
            &groups,
            &sources,
            &metrics,
            &mut written,
            std::mem::take(&mut reshaped),
        )
        .await;
        metrics
            .reconcile_duration
            .with_label_values(&["group"])
            .observe(start.elapsed().as_secs_f64());
    }
}

/// One pass over every group: each `shared` group's budget round, then each group's status, then
/// every group's series. `reshaped`: a group came, went or changed its spec since the last pass,
/// so every quota's share round runs. Returns when a paced status write is due.
async fn one_pass(
    api: &Api<QuotaGroup>,
    groups: &[Arc<QuotaGroup>],
    sources: &Sources,
    metrics: &Metrics,
    written: &mut HashMap<String, Written>,
    reshaped: bool,
) -> Option<Instant> {
    if reshaped {
        for quota in &sources.project_quotas.state() {
            let _ = sources.reconcile.send(quota.name_any());
        }
    }
    // Every pass reads all projects and quotas: with no group nothing needs them (a master
    // starting over 10,000 quotas without a group spent a large part of its CPU here, a pass
    // per batch of events).
    if groups.is_empty() {
        metrics.groups.set(&[]);
        return None;
    }
    let projects = sources.projects.state();
    let quotas = sources.project_quotas.state();
    let kkp_quotas = sources.kkp_quotas.state();
    let books = Books::from_objects(
        kkp_quotas.iter().map(Arc::as_ref),
        quotas.iter().map(Arc::as_ref),
        projects.iter().map(Arc::as_ref),
        [],
    );
    // What every group's budget round reads, indexed once per pass.
    let by_name: BTreeMap<String, &ProjectQuota> =
        quotas.iter().map(|q| (q.name_any(), q.as_ref())).collect();
    let in_force = crate::not_in_force::in_force_by_project(kkp_quotas.iter().map(Arc::as_ref));
    let mut figures = Vec::with_capacity(groups.len());
    let mut due: Option<Instant> = None;
    for group in groups.iter().cloned() {
        // The budgets first: the status write below moves the group's resourceVersion, and
        // the budget write is a compare-and-swap.
        let held = if group.spec.mode == GroupMode::Shared {
            let newest = sources.book.newest(&group);
            Some(budget_round(api, &newest, &projects, (&by_name, &in_force), sources).await)
        } else {
            None
        };
        match write_status(
            api,
            &group,
            &projects,
            &quotas,
            (&books, sources.allocation_webhook),
            held.as_deref(),
            written,
        )
        .await
        {
            Ok(Outcome::Written(status)) => {
                if let Some(uid) = group.uid() {
                    written.insert(
                        uid,
                        Written {
                            status: *status,
                            at: Instant::now(),
                        },
                    );
                }
            }
            Ok(Outcome::Unchanged) => {}
            Ok(Outcome::Deferred(at)) => due = Some(due.map_or(at, |d| d.min(at))),
            Err(e) => {
                warn!(group = %group.name_any(), error = %e, "could not write the group's status; retrying on the next change");
                metrics.reconcile_errors.with_label_values(&["group"]).inc();
            }
        }
        let status = group
            .uid()
            .and_then(|uid| written.get(&uid).map(|w| w.status.clone()))
            .or_else(|| group.status.clone());
        figures.push(group_figures(&sources.book.newest(&group), status.as_ref()));
    }
    metrics.groups.set(&figures);
    due
}

/// A `shared` group's budget round ([`crate::budgets::group_round`]); on a write, the members'
/// share rounds run, to take the new word. Returns the members that hold its grants back
/// ([`crate::budgets::grants_held`]).
async fn budget_round(
    api: &Api<QuotaGroup>,
    group: &QuotaGroup,
    projects: &[Arc<Project>],
    (quotas, in_force): (&BTreeMap<String, &ProjectQuota>, &BTreeMap<&str, &ResourceQuota>),
    sources: &Sources,
) -> Vec<String> {
    let name = group.name_any();
    let members = status::members(&group.spec, projects.iter().map(Arc::as_ref), quotas, in_force);
    // What the other shared groups let each project spend, their selectors read once a pass.
    let others = sources.book.other_shared(&name);
    let bounded: BTreeMap<String, ResourceDetails> = if others.is_empty() {
        BTreeMap::new()
    } else {
        projects
            .iter()
            .map(|p| (p.name_any(), crate::budgets::other_groups_limits(&others, p)))
            .filter(|(_, bound)| !bound.is_empty())
            .collect()
    };
    let read: Vec<Member> = members
        .iter()
        .map(|(project, quota)| Member {
            name: project.clone(),
            copy: copy_in(quota, &name),
            own_limit: in_force
                .get(project.as_str())
                .map_or_else(ResourceDetails::default, |rq| {
                    effective_limits(&rq.spec.quota.limits, Some(&quota.spec.quota))
                }),
            other_groups: bounded.get(project).cloned().unwrap_or_default(),
        })
        .collect();
    // A deleted project is not remembered among those that left (`budgets::departed`).
    let exists = |name: &str| projects.iter().any(|p| p.name_any() == name);
    match crate::budgets::group_round(api, group, &read, &exists, sources.share_slack_percent).await {
        Ok(Some(written)) => {
            let held = crate::budgets::grants_held(&written, &read);
            sources.book.wrote(written);
            for (_, quota) in &members {
                let _ = sources.reconcile.send(quota.name_any());
            }
            held
        }
        Ok(None) => crate::budgets::grants_held(group, &read),
        Err(e) => {
            warn!(group = %name, error = %e, "could not write the group's budgets; retrying on the next change");
            crate::budgets::grants_held(group, &read)
        }
    }
}

/// A member's copy of its budget in `group` (with the `resourceVersion` of the object holding
/// it), as its share round last wrote it.
fn copy_in(quota: &ProjectQuota, group: &str) -> Option<(u64, GroupBudget)> {
    let version = resource_version(quota)?;
    let shares = quota.status.as_ref()?.shares.as_ref()?;
    let copy = shares.groups.iter().find(|c| c.group == group)?;
    Some((version, copy.clone()))
}

/// What `group`'s series show: its limit, the usage of `status` (the newest this process knows),
/// overall and by seed, and the budgets its record holds.
fn group_figures(group: &QuotaGroup, status: Option<&QuotaGroupStatus>) -> GroupFigures {
    let budgets = group
        .status
        .as_ref()
        .and_then(|s| s.budgets.as_ref())
        .map(|record| {
            record
                .projects
                .iter()
                .map(|p| (p.name.clone(), p.granted.saturating_sub(&p.released)))
                .collect()
        })
        .unwrap_or_default();
    GroupFigures {
        name: group.name_any(),
        limit: group.spec.quota.clone(),
        usage: status.and_then(|s| s.usage.clone()),
        by_seed: status
            .map(|s| {
                s.by_seed
                    .iter()
                    .map(|n| (n.name.clone(), n.usage.clone()))
                    .collect()
            })
            .unwrap_or_default(),
        budgets,
    }
}

/// Whether a watch event adds, removes or changes the spec of a group the share rounds read.
fn reshapes(event: Result<&watcher::Event<QuotaGroup>, &watcher::Error>, book: &GroupBook) -> bool {
    match event {
        Ok(watcher::Event::Delete(_)) => true,
        Ok(watcher::Event::Apply(group)) => !book.has_spec(group),
        _ => false,
    }
}

/// Whether the API server does not know `QuotaGroup`s at all (the CRD is not installed).
fn crd_missing(event: Result<&watcher::Event<QuotaGroup>, &watcher::Error>) -> bool {
    matches!(event, Err(watcher::Error::InitialListFailed(kube::Error::Api(e))) if e.code == 404)
}

/// Whether a watch event calls for a pass over the groups: a change, or the end of a listing
/// (the store holds every group only from then). An error is counted and logged.
fn counts(event: Result<&watcher::Event<QuotaGroup>, &watcher::Error>, metrics: &Metrics) -> bool {
    match event {
        Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone) => true,
        Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => false,
        Err(e) => {
            warn!(error = %e, "watch of the QuotaGroups failed (is the CRD installed, and may master-controller list them?); retrying");
            metrics.reconcile_errors.with_label_values(&["group"]).inc();
            false
        }
    }
}

/// Writes `group`'s status if what it should say differs from what it says (or from what this
/// process last wrote of it), usage figures alone paced by [`USAGE_PACE`].
async fn write_status(
    api: &Api<QuotaGroup>,
    group: &QuotaGroup,
    projects: &[Arc<Project>],
    quotas: &[Arc<ProjectQuota>],
    (books, checked): (&Books, bool),
    held: Option<&[String]>,
    written: &HashMap<String, Written>,
) -> Result<Outcome, crate::Error> {
    let (mut wanted, mut desired) = status::desired(
        &group.spec,
        projects.iter().map(Arc::as_ref),
        quotas.iter().map(Arc::as_ref),
        &books.group_allocation(&group.spec).0,
        checked,
    )
    .map_err(crate::Error::Quantity)?;
    desired.push(status::grants_held(held));
    let last = group.uid().and_then(|uid| written.get(&uid));
    let current = last
        .map(|w| w.status.clone())
        .or_else(|| group.status.clone())
        .unwrap_or_default();
    // The budgets are the budget round's own (compare-and-swap): never compared nor written here.
    wanted.budgets.clone_from(&current.budgets);
    wanted.conditions = merge_conditions(
        &current.conditions,
        &desired,
        group.metadata.generation,
        jiff::Timestamp::now(),
    );
    let without_conditions = |s: &QuotaGroupStatus| QuotaGroupStatus {
        conditions: Vec::new(),
        ..s.clone()
    };
    if without_conditions(&current) == without_conditions(&wanted)
        && same_conditions(&current.conditions, &wanted.conditions)
    {
        return Ok(Outcome::Unchanged);
    }
    if let Some(last) = last
        && status::figures_only(&current, &wanted)
        && last.at.elapsed() < USAGE_PACE
    {
        return Ok(Outcome::Deferred(last.at + USAGE_PACE));
    }
    // A merge patch leaves absent fields as they are: an emptied list is written as null.
    let mut body =
        serde_json::to_value(&wanted).map_err(|e| crate::Error::Kube(kube::Error::SerdeError(e)))?;
    if let Some(object) = body.as_object_mut() {
        object.remove("budgets");
    }
    for field in [
        "projects",
        "usage",
        "allocated",
        "reserved",
        "byProject",
        "bySeed",
        "conditions",
    ] {
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
    Ok(Outcome::Written(Box::new(wanted)))
}
