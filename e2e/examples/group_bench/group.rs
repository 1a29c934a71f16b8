//! The benchmark's group: written over the projects and waited for until it grants, deleted,
//! waited for until every project's seed has room for a phase, checked for being in force on
//! every member's seed once its limit is lowered, and, when the check fails, what each project
//! that admitted held.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use e2e::{Fleet, wait_for};
use kkp_quota_crds::{ProjectQuota, QuotaGroup, QuotaLedger, Resource, ResourceDetails};
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

use super::simulated::{Simulated, project_name};
use super::{GROUP, LABEL, MANAGER, SEED, WAIT};

fn cpu(details: &ResourceDetails) -> Option<kkp_quota_crds::Quantity> {
    details.get(Resource::Cpu)
}

/// How [`group_on`] went, timed from the group's write.
pub(super) struct Settling {
    /// Whether the group was created (it did not exist).
    pub(super) created: bool,
    /// When every project held a copy of its word, and when it granted.
    pub(super) holding: Duration,
    pub(super) granting: Duration,
}

/// Writes the group with `limit` cpu and waits until every project holds a copy of its word
/// and no member holds its grants back (`GrantsHeld` false). Notes in `taken`, if given, when
/// each project was first seen holding one (from the write).
pub(super) async fn group_on(
    fleet: &Fleet,
    projects: usize,
    limit: i64,
    taken: Option<&Mutex<BTreeMap<String, Duration>>>,
) -> Result<Settling> {
    let group: QuotaGroup = serde_json::from_value(json!({
        "apiVersion": "kkp-quota.dev/v1alpha1",
        "kind": "QuotaGroup",
        "metadata": {"name": GROUP},
        "spec": {"selector": {"matchLabels": {LABEL: "yes"}}, "quota": {"cpu": limit.to_string()}},
    }))?;
    let groups = Api::<QuotaGroup>::all(fleet.master().client());
    let created = groups.get_opt(GROUP).await?.is_none();
    let written = Instant::now();
    groups
        .patch(GROUP, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&group))
        .await
        .context("writing the group")?;
    let quotas = Api::<ProjectQuota>::all(fleet.master().client());
    wait_for(WAIT, "every project holding the group's word", || async {
        let list = quotas.list(&ListParams::default()).await.ok()?;
        let holding: Vec<&ProjectQuota> = list
            .items
            .iter()
            .filter(|q| {
                q.status
                    .as_ref()
                    .and_then(|s| s.shares.as_ref())
                    // A copy of version 0 only reports: it has taken no word of the group, so its
                    // seeds' shares may not be decided yet (kept, or lowered to what they commit).
                    .is_some_and(|s| s.groups.iter().any(|g| g.group == GROUP && g.version > 0))
            })
            .collect();
        if let Some(taken) = taken {
            let seen = written.elapsed();
            let mut taken = taken.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            for quota in &holding {
                taken.entry(quota.name_any()).or_insert(seen);
            }
        }
        (holding.len() == projects).then_some(())
    })
    .await?;
    let holding = written.elapsed();
    wait_for(WAIT, "the group granting (GrantsHeld false)", || async {
        let status = groups.get(GROUP).await.ok()?.status?;
        let held = status.conditions.iter().find(|c| c.type_ == "GrantsHeld")?;
        (held.status == "False").then_some(())
    })
    .await?;
    Ok(Settling {
        created,
        holding,
        granting: written.elapsed(),
    })
}

/// Waits until every project's seed holds share for `room` more cpu than it commits: a phase
/// that needs no more measures admission, not budgets and shares on their way (a group just
/// created over busy projects, or usage that grew).
pub(super) async fn wait_room(fleet: &Fleet, projects: usize, room: i64) -> Result<()> {
    let ledgers = Api::<QuotaLedger>::all(fleet.seed(SEED).client());
    let room = kkp_quota_crds::Quantity::from_nanos(i128::from(room) * 1_000_000_000);
    wait_for(WAIT, "every project's seed holding room for a phase", || async {
        let list = ledgers.list(&ListParams::default()).await.ok()?;
        let roomy = list
            .items
            .iter()
            .filter_map(|l| e2e::shares::exact_figures(l, Resource::Cpu))
            .filter(|(committed, share)| share.saturating_sub_to_zero(*committed) >= room)
            .count();
        (roomy >= projects).then_some(())
    })
    .await
}

/// Deletes the group and waits until no project holds a copy of it.
pub(super) async fn group_off(fleet: &Fleet) -> Result<()> {
    let groups = Api::<QuotaGroup>::all(fleet.master().client());
    match groups.delete(GROUP, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(e).context("deleting the group"),
    }
    let quotas = Api::<ProjectQuota>::all(fleet.master().client());
    wait_for(WAIT, "no project holding a group's word", || async {
        let list = quotas.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .all(|q| {
                q.status
                    .as_ref()
                    .and_then(|s| s.shares.as_ref())
                    .is_none_or(|s| s.groups.is_empty())
            })
            .then_some(())
    })
    .await
}

/// Whether a lowered limit is in force on every member: each member's copy holds the group's
/// current word, each member's seed holds its project's current record (the targets planned
/// within that word), and the record counts no more held than `limit` (each member at the
/// larger of its budget and what it reported committed, as the group's plan counts it).
pub(super) async fn in_force(fleet: &Fleet, limit: i64) -> Result<bool> {
    let group = Api::<QuotaGroup>::all(fleet.master().client()).get(GROUP).await?;
    let Some(record) = group.status.and_then(|s| s.budgets) else {
        return Ok(false);
    };
    let quotas = Api::<ProjectQuota>::all(fleet.master().client())
        .list(&ListParams::default())
        .await?;
    let ledgers = Api::<QuotaLedger>::all(fleet.seed(SEED).client())
        .list(&ListParams::default())
        .await?;
    let mut held = kkp_quota_crds::Quantity::default();
    for entry in &record.projects {
        let quota_name = format!("project-{}", entry.name);
        let Some(shares) = quotas
            .items
            .iter()
            .find(|q| q.metadata.name.as_deref() == Some(quota_name.as_str()))
            .and_then(|q| q.status.as_ref())
            .and_then(|s| s.shares.as_ref())
        else {
            return Ok(false);
        };
        let Some(copy) = shares.groups.iter().find(|c| c.group == GROUP) else {
            return Ok(false);
        };
        let seed_holds = ledgers
            .items
            .iter()
            .find(|l| {
                l.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.ends_with(&entry.name))
            })
            .and_then(|l| l.spec.shares.as_ref())
            .map(|s| s.version);
        if copy.version != record.version || seed_holds != Some(shares.version) {
            return Ok(false);
        }
        let budget = cpu(&entry.granted)
            .unwrap_or_default()
            .saturating_sub_to_zero(cpu(&entry.released).unwrap_or_default());
        held = held.checked_add(budget.max(cpu(&copy.committed).unwrap_or_default()))?;
    }
    Ok(held <= kkp_quota_crds::Quantity::from_units(limit))
}

/// For every project that admitted a Machine in the enforced check: how many, its entry in the
/// group's record, its `ProjectQuota`'s share record, and its seed's ledger (the word it holds,
/// its figures).
pub(super) async fn overrun_state(fleet: &Fleet, sim: &Simulated, projects: usize) -> Result<String> {
    use std::fmt::Write as _;
    let group = Api::<QuotaGroup>::all(fleet.master().client()).get(GROUP).await?;
    let record = group.status.and_then(|s| s.budgets).unwrap_or_default();
    let quotas = Api::<ProjectQuota>::all(fleet.master().client());
    let ledgers = Api::<QuotaLedger>::all(fleet.seed(SEED).client());
    let mut out = String::new();
    for i in 0..projects {
        let admitted = sim
            .machines(i)
            .list_metadata(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|m| {
                m.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("tight-"))
            })
            .count();
        if admitted == 0 {
            continue;
        }
        let name = project_name(i);
        let entry = record.projects.iter().find(|p| p.name == name);
        let quota = quotas.get_opt(&format!("project-{name}")).await?;
        let shares = quota.and_then(|q| q.status).and_then(|s| s.shares);
        let ledgers = ledgers.list(&ListParams::default()).await?;
        let ledger = ledgers
            .items
            .iter()
            .find(|l| l.metadata.name.as_deref().is_some_and(|n| n.ends_with(&name)));
        let _ = writeln!(
            out,
            "{name}: admitted {admitted}; group entry {}; project shares {}; ledger {:?} spec.shares {} status.released {}",
            serde_json::to_string(&entry)?,
            serde_json::to_string(&shares)?,
            ledger.and_then(|l| e2e::shares::exact_figures(l, Resource::Cpu)),
            serde_json::to_string(&ledger.map(|l| &l.spec.shares))?,
            serde_json::to_string(&ledger.and_then(|l| l.status.as_ref()).map(|s| &s.released))?,
        );
    }
    Ok(out)
}
