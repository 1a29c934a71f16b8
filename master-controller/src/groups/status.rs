//! What a `QuotaGroup`'s status says, pure: the projects its selector picks among the master's
//! `Project`s, and their usage from their `ProjectQuota`s (each already folded over every seed).
//!
//! Conditions:
//! - `Enforced`: a `shared` group is (its budgets, docs/groups.md); an `allocation` group while
//!   this process serves the allocation webhook.
//! - `QuotaExceeded`: `True` while the members together use more than the group's limit.
//! - `SeedsStale`: `True` while a member's usage on some seed is its last known one.
//! - `ProjectsUncounted`: `True` while a selected project has no quota in force (seeds count only
//!   projects with a quota, so its Machines are missing from the group's usage), or its quota has
//!   no usage yet.
//! - `SelectorInvalid`: `True` while the selector cannot be read (an unknown operator); nothing
//!   is selected then, and the other conditions say so.
//!
//! Every condition is always written, so none is left over from an earlier state.
//!
//! A project's usage comes from its quota in force: of its `ProjectQuota`s not being deleted and
//! not `NotInForce`, the first by name, as the seeds choose (`crate::not_in_force`).

use std::collections::BTreeMap;

use kkp_quota_crds::kkp::Project;
use kkp_quota_crds::{
    GroupMode, NamedUsage, ProjectQuota, QuantityError, QuotaGroupSpec, QuotaGroupStatus, ResourceDetails,
};
use kube::ResourceExt;
use kube::core::{Selector, SelectorExt as _};

use crate::status::Desired;

pub const ENFORCED: &str = "Enforced";
pub const QUOTA_EXCEEDED: &str = "QuotaExceeded";
pub const SEEDS_STALE: &str = "SeedsStale";
pub const PROJECTS_UNCOUNTED: &str = "ProjectsUncounted";
pub const SELECTOR_INVALID: &str = "SelectorInvalid";
pub const ALLOCATION_EXCEEDED: &str = "AllocationExceeded";
pub const GRANTS_HELD: &str = "GrantsHeld";

/// Whether `wanted` differs from `current` in its usage figures only (`usage`, `byProject`,
/// `bySeed`, `reserved`), no project's usage lower: what may wait for the next paced write
/// ([`super::USAGE_PACE`]). A changed condition, project list, allocation or record is written
/// at once, and so is a member's usage going down: the seeds' ledgers carry the other members'
/// usage from `byProject` (`othersUsage`), and the webhook refuses outright, without waiting for
/// share, a request the group has no room for by it. A figure that trails upwards only sends
/// such a request to wait for share, which the budgets bound anyway.
pub fn figures_only(current: &QuotaGroupStatus, wanted: &QuotaGroupStatus) -> bool {
    let without_figures = |s: &QuotaGroupStatus| QuotaGroupStatus {
        usage: None,
        by_project: Vec::new(),
        by_seed: Vec::new(),
        reserved: None,
        conditions: Vec::new(),
        ..s.clone()
    };
    without_figures(current) == without_figures(wanted)
        && crate::status::same_conditions(&current.conditions, &wanted.conditions)
        && !any_project_lower(&current.by_project, &wanted.by_project)
}

/// Whether a project's usage in `wanted` is below `current`'s in some resource, or gone.
fn any_project_lower(current: &[NamedUsage], wanted: &[NamedUsage]) -> bool {
    current.iter().any(|was| {
        wanted
            .iter()
            .find(|now| now.name == was.name)
            .is_none_or(|now| was.usage.iter().any(|(r, q)| now.usage.amount(r) < q))
    })
}

/// The status a group should have (conditions without their times), from what the caches hold.
pub fn desired<'a>(
    spec: &QuotaGroupSpec,
    projects: impl IntoIterator<Item = &'a Project>,
    quotas: impl IntoIterator<Item = &'a ProjectQuota>,
    allocated: &ResourceDetails,
    checked: bool,
) -> Result<(QuotaGroupStatus, Vec<Desired>), QuantityError> {
    let selector = match Selector::try_from(spec.selector.clone()) {
        Ok(selector) => selector,
        Err(e) => {
            return Ok((
                QuotaGroupStatus::default(),
                invalid_selector(&e.to_string(), spec.mode, checked),
            ));
        }
    };
    let mut members: Vec<String> = projects
        .into_iter()
        .filter(|p| selector.matches(p.labels()))
        .map(ResourceExt::name_any)
        .collect();
    members.sort();
    let mut in_force: BTreeMap<&str, &ProjectQuota> = BTreeMap::new();
    let mut quotas: Vec<&ProjectQuota> = quotas.into_iter().filter(|q| is_in_force(q)).collect();
    quotas.sort_by_key(|q| q.name_any());
    for quota in quotas {
        in_force.entry(quota.project()).or_insert(quota);
    }
    let mut by_project = Vec::new();
    let mut reserved = Vec::new();
    let mut by_seed: BTreeMap<String, ResourceDetails> = BTreeMap::new();
    let mut stale = std::collections::BTreeSet::new();
    let (mut no_quota, mut not_counted) = (Vec::new(), Vec::new());
    for member in &members {
        let Some(quota) = in_force.get(member.as_str()) else {
            no_quota.push(member.clone());
            continue;
        };
        let Some(status) = quota.status.as_ref().filter(|s| s.global_usage.is_some()) else {
            not_counted.push(member.clone());
            continue;
        };
        by_project.push(NamedUsage {
            name: member.clone(),
            usage: status.global_usage.clone().unwrap_or_default(),
        });
        reserved.extend(status.reserved.as_ref());
        for seed in &status.seeds {
            if seed.stale {
                stale.insert(seed.name.clone());
            }
            let sum = by_seed.entry(seed.name.clone()).or_default();
            *sum = sum.checked_add(seed.usage.as_ref().unwrap_or(&ResourceDetails::default()))?;
        }
    }
    let usage = ResourceDetails::checked_sum(by_project.iter().map(|p| &p.usage))?;
    let conditions = vec![
        enforced(spec.mode, checked),
        exceeded(&spec.quota, &usage, spec.mode),
        allocation_exceeded(spec, allocated),
        seeds_stale(&stale),
        projects_uncounted(&no_quota, &not_counted),
        condition(
            SELECTOR_INVALID,
            false,
            "SelectorValid",
            "the selector is read".to_owned(),
        ),
    ];
    let status = QuotaGroupStatus {
        project_count: u32::try_from(members.len()).unwrap_or(u32::MAX),
        projects: members,
        usage: Some(usage),
        allocated: Some(allocated.clone()),
        reserved: if reserved.is_empty() {
            None
        } else {
            Some(ResourceDetails::checked_sum(reserved)?)
        },
        by_project,
        by_seed: by_seed
            .into_iter()
            .map(|(name, usage)| NamedUsage { name, usage })
            .collect(),
        conditions: Vec::new(),
        budgets: None,
    };
    Ok((status, conditions))
}

/// The projects `spec` selects whose quota in force runs share rounds, each with that quota's
/// `ProjectQuota`: the members a `shared` group keeps budgets for. `in_force` is the master's
/// rule, by project ([`crate::not_in_force::in_force_by_project`], built once per pass); a quota
/// whose limits cannot be read runs no share round, so it is no member (it would never take a
/// word, and the group's epoch would wait for it). A project without a quota is not bounded
/// either: its seeds count nothing for it. A selector that cannot be read selects nothing.
pub fn members<'a>(
    spec: &QuotaGroupSpec,
    projects: impl IntoIterator<Item = &'a Project>,
    project_quotas: &BTreeMap<String, &'a ProjectQuota>,
    in_force: &BTreeMap<&str, &kkp_quota_crds::ResourceQuota>,
) -> Vec<(String, &'a ProjectQuota)> {
    let Ok(selector) = Selector::try_from(spec.selector.clone()) else {
        return Vec::new();
    };
    let mut members: Vec<(String, &ProjectQuota)> = projects
        .into_iter()
        .filter(|p| selector.matches(p.labels()))
        .filter_map(|p| {
            let name = p.name_any();
            let quota = in_force.get(name.as_str())?;
            if !quota.spec.quota.unreadable.is_empty() {
                return None;
            }
            let project_quota = *project_quotas.get(&quota.name_any())?;
            Some((name, project_quota))
        })
        .collect();
    members.sort_by(|a, b| a.0.cmp(&b.0));
    members
}

/// Whether the seeds take this quota for its project: not being deleted, not `NotInForce`.
fn is_in_force(quota: &ProjectQuota) -> bool {
    quota.metadata.deletion_timestamp.is_none()
        && !quota.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == crate::status::NOT_IN_FORCE && c.status == "True")
        })
}

/// Every condition, for a selector that cannot be read: nothing is selected.
fn invalid_selector(why: &str, mode: GroupMode, checked: bool) -> Vec<Desired> {
    let nothing = |type_| {
        condition(
            type_,
            false,
            "SelectorInvalid",
            "no project is selected: the selector cannot be read".to_owned(),
        )
    };
    vec![
        enforced(mode, checked),
        nothing(QUOTA_EXCEEDED),
        nothing(ALLOCATION_EXCEEDED),
        nothing(SEEDS_STALE),
        nothing(PROJECTS_UNCOUNTED),
        condition(
            SELECTOR_INVALID,
            true,
            "InvalidSelector",
            format!("the selector cannot be read: {why}; no project is selected"),
        ),
    ]
}

/// `GrantsHeld`: a `shared` group grants no budget to any member while some member has not
/// reported to it, or holds no word of its record's epoch (`held`, from the budget round; `None`
/// for an `allocation` group, which has no budgets). Brief when a project joins; lasting, it
/// names the member whose share rounds do not run or fail.
pub fn grants_held(held: Option<&[String]>) -> Desired {
    match held {
        None => condition(
            GRANTS_HELD,
            false,
            "NoBudgets",
            "an allocation group moves no budget".to_owned(),
        ),
        Some([]) => condition(
            GRANTS_HELD,
            false,
            "AllMembersReporting",
            "every member has reported to the group's current record".to_owned(),
        ),
        Some(names) => condition(
            GRANTS_HELD,
            true,
            "MembersNotReporting",
            format!(
                "no budget is granted to any member until projects {} report to this group (a project that just joined does within a round; \
                 if this lasts, see their ProjectQuota's conditions and master-controller's log for why their share rounds do not run)",
                names.join(", ")
            ),
        ),
    }
}

fn condition(type_: &'static str, status: bool, reason: &str, message: String) -> Desired {
    Desired {
        type_,
        status,
        reason: reason.to_owned(),
        message,
    }
}

/// `Enforced`: an `allocation` group is, when this process serves the webhook (`checked`).
fn enforced(mode: GroupMode, checked: bool) -> Desired {
    match mode {
        GroupMode::Shared => condition(
            ENFORCED,
            true,
            "BudgetsKept",
            "each selected project with a quota plans its seeds' shares within its budget of the group's limit: a Machine is admitted only within both".to_owned(),
        ),
        GroupMode::Allocation if !checked => condition(
            ENFORCED,
            false,
            "WebhookNotServed",
            "master-controller does not serve the allocation webhook (no --tls-cert-file): quota edits are not checked against the group's limit".to_owned(),
        ),
        GroupMode::Allocation => condition(
            ENFORCED,
            true,
            "QuotaEditsChecked",
            "the master's webhook refuses a quota edit that would allocate the projects more than the group's limit".to_owned(),
        ),
    }
}

/// `AllocationExceeded`: an `allocation` group's projects are allocated more than its limit
/// (a project labelled into it, or quotas from before the group), so raises are refused.
fn allocation_exceeded(spec: &QuotaGroupSpec, allocated: &ResourceDetails) -> Desired {
    if spec.mode != GroupMode::Allocation {
        return condition(
            ALLOCATION_EXCEEDED,
            false,
            "SharedMode",
            "the group limits usage, not allocation".to_owned(),
        );
    }
    let over: Vec<String> = spec
        .quota
        .iter()
        .filter(|&(r, cap)| crate::allocation::books::above(allocated.get(r), Some(cap)))
        .map(|(r, cap)| match allocated.get(r) {
            Some(amount) => format!("{} allocated of {}", r.describe(amount), r.describe(cap)),
            None => format!(
                "unlimited {r} allocated (a project without a limit on it) of {}",
                r.describe(cap)
            ),
        })
        .collect();
    if over.is_empty() {
        return condition(
            ALLOCATION_EXCEEDED,
            false,
            "WithinAllocation",
            "the projects' quotas add up to no more than the group's limit".to_owned(),
        );
    }
    condition(
        ALLOCATION_EXCEEDED,
        true,
        "AllocatedAboveLimit",
        format!(
            "the projects' quotas add up to more than the group's limit: {}; only reductions are accepted until they fit",
            over.join(", ")
        ),
    )
}

fn exceeded(limit: &ResourceDetails, usage: &ResourceDetails, mode: GroupMode) -> Desired {
    let over = limit.overrun_by(usage);
    if over.is_empty() {
        return condition(
            QUOTA_EXCEEDED,
            false,
            "WithinLimit",
            "the projects together use no more than the group's limit".to_owned(),
        );
    }
    let parts = crate::status::overrun_parts(&over, limit, usage);
    condition(
        QUOTA_EXCEEDED,
        true,
        "UsageAboveLimit",
        match mode {
            GroupMode::Shared => format!(
                "the projects together use more than the group's limit: {} (its limit was lowered below their usage, or a project using more was labelled into it): no growth of theirs is admitted until they are back within it",
                parts.join(", ")
            ),
            GroupMode::Allocation => format!(
                "the projects together use more than the group's limit: {} (their quotas were raised before the group existed, or a project was labelled into it)",
                parts.join(", ")
            ),
        },
    )
}

fn seeds_stale(stale: &std::collections::BTreeSet<String>) -> Desired {
    if stale.is_empty() {
        return condition(
            SEEDS_STALE,
            false,
            "AllSeedsSynced",
            "every seed's usage is current".to_owned(),
        );
    }
    let seeds: Vec<&str> = stale.iter().map(String::as_str).collect();
    condition(
        SEEDS_STALE,
        true,
        "SeedsUnreachable",
        format!(
            "seeds {} cannot be reached: their usage is as last seen (or not known yet)",
            seeds.join(", ")
        ),
    )
}

fn projects_uncounted(no_quota: &[String], not_counted: &[String]) -> Desired {
    let mut parts = Vec::new();
    if !no_quota.is_empty() {
        parts.push(format!(
            "projects {} have no quota, so no seed counts their Machines: give each a quota",
            no_quota.join(", ")
        ));
    }
    if !not_counted.is_empty() {
        parts.push(format!(
            "the quotas of projects {} have no usage yet (just created, or their seeds not counted yet)",
            not_counted.join(", ")
        ));
    }
    if parts.is_empty() {
        return condition(
            PROJECTS_UNCOUNTED,
            false,
            "AllCounted",
            "every selected project is counted".to_owned(),
        );
    }
    let reason = if no_quota.is_empty() {
        "UsageUnknown"
    } else {
        "ProjectsWithoutQuota"
    };
    condition(
        PROJECTS_UNCOUNTED,
        true,
        reason,
        format!(
            "the group's usage leaves out what is not counted: {}",
            parts.join("; ")
        ),
    )
}

#[cfg(test)]
mod tests;
