//! Shares of a quota group (issue #36, `docs/groups.md`): the same escrow one level up.
//!
//! A group's record grants each member project a budget exactly as a project's record grants
//! each seed a share: the group's record is the master ([`super::MasterView`], one
//! [`super::SeedRecord`] per project), and each project's record is the member's copy
//! ([`super::SeedShare`] of that group, written in the project record's own compare-and-swap,
//! together with the grants it makes to its seeds). Nothing new is decided on a seed: a project
//! simply plans its seeds' shares within a smaller limit, [`member_limit`], so every seed keeps
//! admitting on one ledger with one compare-and-swap, and a group costs the admission path
//! nothing.
//!
//! Why the group's limit holds: the group's record keeps `Σ_P budget_P ≤ group limit` (the
//! project rule, with projects for seeds), and each project keeps `Σ_i share_i ≤ member limit ≤
//! budget_P` (the project rule, its limit bounded by the budget). A budget shrinks only by the
//! project's own release ([`SeedShare::release_due`] over what its seeds hold,
//! [`member_committed`]), written in the same compare-and-swap as the grants that hold it, so a
//! budget is never released while a seed could still spend it.

use super::{MasterView, MasterWord, Plan, SeedShare};
use crate::quantity::{Quantity, QuantityError};
use crate::resources::{Resource, ResourceDetails};

/// The limit a project plans its seeds' shares within: per resource the smallest of its own
/// limit and the capacity each group selecting it grants it ([`SeedShare::capacity`] of its
/// share of that group, within the group's limit). A resource any of them limits is limited; a
/// resource none limits stays unlimited.
pub fn member_limit<'a>(
    own: &ResourceDetails,
    groups: impl IntoIterator<Item = (&'a SeedShare, &'a ResourceDetails)>,
) -> ResourceDetails {
    let mut limit = own.clone();
    for (share, group_limit) in groups {
        for (resource, capacity) in share.capacity(group_limit).iter() {
            let tighter = limit.get(resource).map_or(capacity, |l| l.min(capacity));
            limit.set(resource, Some(tighter));
        }
    }
    limit
}

/// Whether a group's record planned from `view` at `version` keeps its new members' holdings
/// ([`crate::quota_group::BudgetRecord::holdings_kept`]): its plan grants nothing yet
/// ([`holding_back`] names someone) and the most its members could ever hold fits its limit in
/// every resource: what a member reported it holds ([`super::SeedRecord::held_seen`]: its
/// budget, or what it reported committed where more), and for a member not heard from yet its
/// own limit ([`super::SeedRecord::ceiling`]; none on a resource, and nothing is kept).
///
/// Why keeping is safe: a member that keeps its seeds' shares takes nothing new, and a project
/// never holds shares beyond its own limit, nor admits past it; so while the bound fits, what
/// the members hold and may still spend fits the limit, whoever has not reported yet. Keeping
/// on what is *known* only (unreported members counted as holding nothing) was tried and let a
/// group made over projects holding far more share than its limit admit 200 Machines where it
/// had room for 50, from the shares they kept until their reports came in.
pub fn holdings_kept(view: &MasterView, version: u64) -> Result<bool, QuantityError> {
    if holding_back(view, version).is_empty() {
        return Ok(false);
    }
    for (resource, limit) in view.limit.iter() {
        let mut most = Quantity::ZERO;
        for member in view.seeds.values() {
            let Some(bound) = counted_at(member, resource) else {
                return Ok(false);
            };
            most = most.checked_add(bound)?;
        }
        if most > limit {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The most [`holdings_kept`] counts `member` as holding of `resource`: what it reported it
/// holds (keeping never lets that grow: it plans within what its seeds hold), or, while it has
/// not reported, the most of: its own limit (`None`: it has none, and nothing is kept), the
/// budget the record sees it hold, and what the record counted it at before
/// ([`counted_before`]). Its own limit alone is not enough: one lowered since it took a word
/// that kept at the old one, and raised again, lets it keep what the old word allowed; and a
/// project never holds more than its own limit only once a lowering has reached its seeds.
fn counted_at(member: &super::SeedRecord, resource: Resource) -> Option<Quantity> {
    if member.report.is_some() {
        return Some(member.held_seen().amount(resource));
    }
    let ceiling = member.ceiling.get(resource)?;
    Some(
        ceiling
            .max(member.share_seen().amount(resource))
            .max(counted_before(member, resource)),
    )
}

/// The most the record counted `member` at in the words it sent that kept holdings
/// ([`remember_counts`]). A member without a copy of its budget (not heard from) may still act
/// on any of those words (a cache lags), also one from before it was granted budget or left the
/// group and came back, so this is never forgotten.
fn counted_before(member: &super::SeedRecord, resource: Resource) -> Quantity {
    member.counted.amount(resource)
}

/// After a group's plan is applied to `view`: when its record keeps holdings (`kept`,
/// [`holdings_kept`]), each member granted nothing keeps what its seeds hold by this word, up to
/// its target, so the record remembers the most of those targets ([`super::SeedRecord::counted`],
/// persisted). Returns whether any count rose (the record must then be written).
pub fn remember_counts(view: &mut MasterView, kept: bool) -> bool {
    if !kept {
        return false;
    }
    let mut rose = false;
    for member in view.seeds.values_mut() {
        if !member.granted.is_empty() {
            continue;
        }
        // Only a count above the one remembered: a target of zero is no count (the record
        // leaves an all-zero `counted` out, and "raising" to it wrote the record on every pass).
        for (resource, target) in member.target.iter() {
            if target > member.counted.amount(resource) {
                member.counted.set(resource, Some(target));
                rose = true;
            }
        }
    }
    rose
}

/// What a group's record remembers of `member` as it leaves the group (no longer selected, or
/// its quota gone): what words that kept holdings counted it at ([`remember_counts`]), if
/// anything; its budget goes back. The project may still act on such a word once it is
/// selected again (a cache lags; back in the group it holds no copy of its budget, so it takes
/// any word it reads, also one from before it was first granted budget), so its new entry
/// starts from this count, and [`counted_at`] never counts it lower.
pub fn remembered_on_leaving(member: &super::SeedRecord) -> Option<super::SeedRecord> {
    let counted = member.counted.iter().any(|(_, q)| q > Quantity::ZERO);
    counted.then(|| super::SeedRecord {
        counted: member.counted.clone(),
        ..super::SeedRecord::new()
    })
}

/// Whether a project keeps its seeds' holdings in a group instead of planning within its budget
/// there: the group's record, as the word the project read last, keeps holdings (`kept`,
/// [`holdings_kept`]) and the project has never been granted budget by the group (`share`, its
/// copy: none yet, or one granted nothing). A project granted budget once plans within it.
/// What it keeps is bounded by its word's target: what the group counted it at ([`group_plan`]).
pub fn keeps_holdings(share: Option<&SeedShare>, kept: bool) -> bool {
    kept && share.is_none_or(|s| s.granted.is_empty())
}

/// The budget a project plans its seeds' shares within, in one group ([`member_limit`]): its
/// copy, or while it [`keeps_holdings`], what its seeds hold (`held`, [`member_held`]): they
/// are then granted nothing new and asked for nothing back; up to the copy's target, what the
/// group counted it at when it decided to keep: its own limit may have been raised since (and
/// its seeds granted more, before it took the word), which the group did not count.
pub fn planning_budget(share: Option<&SeedShare>, kept: bool, held: &ResourceDetails) -> SeedShare {
    if keeps_holdings(share, kept) {
        SeedShare {
            granted: held.clone(),
            target: share.map(|s| s.target.clone()).unwrap_or_default(),
            ..SeedShare::default()
        }
    } else {
        share.cloned().unwrap_or_default()
    }
}

/// What a project that [`keeps_holdings`] asks its group for: what its seeds hold
/// ([`member_held`]), or more where a seed asks for more ([`member_demand`] with no budget), so
/// that the group's first plan grants it what it holds wherever the group has room. `None` when
/// its seeds hold nothing and ask for nothing.
pub fn first_demand(
    project: &MasterView,
    group_limit: &ResourceDetails,
) -> Result<Option<ResourceDetails>, QuantityError> {
    let held = member_held(project, group_limit)?;
    let asked = member_demand(project, group_limit, &ResourceDetails::default())?;
    let want = super::largest(std::iter::once(&held).chain(asked.as_ref())).unwrap_or_default();
    let any = want.iter().any(|(_, q)| q > Quantity::ZERO);
    Ok(any.then_some(want))
}

/// What a project's seeds hold of its budget: per resource the sum over its seeds of the larger
/// of the share the project sees a seed hold and what the seed reported committed
/// ([`super::SeedRecord::held_seen`]), for every resource `group_limit` limits. Stale reports
/// only over-count (a release not read yet is counted as held). The floor of every release to
/// the group ([`member_release_due`]).
pub fn member_held(
    project: &MasterView,
    group_limit: &ResourceDetails,
) -> Result<ResourceDetails, QuantityError> {
    let held: Vec<ResourceDetails> = project.seeds.values().map(super::SeedRecord::held_seen).collect();
    Ok(super::bounded_by(
        group_limit,
        &ResourceDetails::checked_sum(&held)?,
    ))
}

/// What a project reports committed to its group: what its seeds reported committed, added up
/// (usage, reservations, allotments), not the shares they hold. The group asks idle budget back
/// only above this, so a project whose seeds hold idle share can be asked for it: its lower
/// target reaches its seeds as a lower limit, they release, and then so does the project.
pub fn member_committed(
    project: &MasterView,
    group_limit: &ResourceDetails,
) -> Result<ResourceDetails, QuantityError> {
    let committed: Vec<ResourceDetails> = project
        .seeds
        .values()
        .filter_map(|r| r.report.as_ref().map(|rep| rep.committed.clone()))
        .collect();
    Ok(super::bounded_by(
        group_limit,
        &ResourceDetails::checked_sum(&committed)?,
    ))
}

/// What a project reports committed to its group, given the budget `share` its copy holds:
/// [`member_committed`], except where its seeds hold more than that budget ([`member_held`]):
/// a project that just joined a group (or one whose group was just made over it) has seeds
/// holding shares from before, which they may still spend until their lower targets reach
/// them, so the group counts them held until they are within the budget.
pub fn member_report(
    project: &MasterView,
    group_limit: &ResourceDetails,
    share: &SeedShare,
) -> Result<ResourceDetails, QuantityError> {
    let mut committed = member_committed(project, group_limit)?;
    let held = member_held(project, group_limit)?;
    let budget = share.share();
    for (resource, held) in held.iter() {
        if held > budget.amount(resource) {
            let reported = committed.amount(resource).max(held);
            committed.set(resource, Some(reported));
        }
    }
    Ok(committed)
}

/// What a project reports committed to its group this round, given `fresh` ([`member_report`])
/// and what it reported last (`last`, in the copy its record holds): `last` again while `fresh`
/// is at most `slack` above it in every resource and within the budget's `target`; otherwise
/// `fresh`. A report the group would act on no differently then costs no write of the project's
/// record: with a write for every usage change of every member, a group of 100 busy projects
/// tripled the writes to the master (docs/groups.md, "Benchmark"). The group so reads a project
/// committing at most `slack` less than it does, never more: it may ask back room in use, which
/// the project never releases (its release is floored at what its seeds hold), and never
/// overlooks room going idle (a fall is reported at once), nor use above the budget.
pub fn committed_report(
    last: Option<&ResourceDetails>,
    fresh: &ResourceDetails,
    target: &ResourceDetails,
    slack: &ResourceDetails,
) -> ResourceDetails {
    let Some(last) = last else {
        return fresh.clone();
    };
    let same_resources = last.iter().map(|(r, _)| r).eq(fresh.iter().map(|(r, _)| r));
    let quiet = same_resources
        && fresh.iter().all(|(resource, now)| {
            let before = last.amount(resource);
            let within_slack = before
                .checked_add(slack.amount(resource))
                .is_ok_and(|ceiling| now <= ceiling);
            let within_target = target.get(resource).is_none_or(|t| now <= t);
            before <= now && within_slack && within_target
        });
    if quiet { last.clone() } else { fresh.clone() }
}

/// The absolute budget a project asks its group for, while one of its seeds wants more than the
/// project may grant: per resource `Σ_i max(committed_i, demand_i)` over its seeds (what they
/// use and what they ask for; idle share elsewhere in the project is the project's to move).
/// `None` when no seed asks, or when that sum fits `capacity`, the budget the project holds of
/// this group. Absolute, like a seed's demand, so a demand read twice or out of order asks for
/// the same thing.
pub fn member_demand(
    project: &MasterView,
    group_limit: &ResourceDetails,
    capacity: &ResourceDetails,
) -> Result<Option<ResourceDetails>, QuantityError> {
    let mut want = ResourceDetails::default();
    let mut unmet = false;
    for (resource, _) in group_limit.iter() {
        let mut sum = Quantity::ZERO;
        for record in project.seeds.values() {
            let committed = record
                .report
                .as_ref()
                .map_or(Quantity::ZERO, |rep| rep.committed.amount(resource));
            let asked = demand_of(record, resource).unwrap_or(committed).max(committed);
            sum = sum.checked_add(asked)?;
        }
        unmet |= sum > capacity.amount(resource);
        want.set(resource, Some(sum));
    }
    let any_demand = project
        .seeds
        .values()
        .any(|r| r.report.as_ref().is_some_and(|rep| rep.demand.is_some()));
    Ok((unmet && any_demand).then_some(want))
}

fn demand_of(record: &super::SeedRecord, resource: Resource) -> Option<Quantity> {
    record.report.as_ref()?.demand.as_ref()?.get(resource)
}

/// A project's copy of its budget in a group, from the first word it takes: a new member's, or
/// one whose record was lost (its `ProjectQuota` re-created). It claims no more than its seeds
/// hold, `held` ([`member_held`] of a record that is not awaiting its epoch, so that every
/// seed's holding is read): `released` becomes at least `granted - held`. The group may have
/// given away budget this project released before the loss, in a write the word read may
/// predate (a cache lags), and the lost record's `released` was the only note of it; what the
/// seeds hold was within the budget that remained, so claiming only that is never too much.
pub fn first_budget(word: &MasterWord, held: &ResourceDetails) -> SeedShare {
    let mut share = SeedShare::default();
    share.receive(word);
    let unheld = word.granted.saturating_sub(held);
    share.released = super::largest([&share.released, &unheld]).unwrap_or_default();
    share
}

/// The group's plan at `version` ([`MasterView::plan_at`]), granting nothing while some member
/// has not reported yet. A project that just joined (or whose copy was lost) may already use,
/// and its seeds hold, more than the group knows: headroom granted before its report could be
/// headroom it is using, and the group would end over its limit through a grant of its own.
/// Targets are still planned, so idle budget is still asked back meanwhile. A member never
/// granted budget is given as its target what the record counted it at while keeping
/// holdings (`counted_at`, [`holdings_kept`]); one not heard from, never lower than before
/// (`counted_before`), also in a round that does not keep: what it keeps is bounded by the word
/// it acts on ([`planning_budget`]), not only by its own limit as it is when it takes the word,
/// and the record remembers the most any of its words allowed. (A member that holds no budget
/// and does not keep plans within nothing: its target is only this bound.)
pub fn group_plan(view: &MasterView, version: u64, slack: &ResourceDetails) -> Result<Plan, QuantityError> {
    let mut plan = view.plan_at(version, slack)?;
    if view.seeds.values().any(|member| member.report.is_none()) {
        plan.grants.clear();
    }
    let kept = holdings_kept(view, version)?;
    for (name, member) in &view.seeds {
        // Granted budget now or before: it plans within that, by the plan's target. One that
        // has reported is counted at what it holds, which keeping never lets grow: while the
        // record does not keep, its target is the plan's (what its demand was planned at).
        let reported = member.report.is_some();
        if !member.granted.is_empty() || plan.grants.contains_key(name) || (reported && !kept) {
            continue;
        }
        let mut target = ResourceDetails::default();
        for (resource, _) in view.limit.iter() {
            let now = if kept { counted_at(member, resource) } else { None };
            let count = if reported {
                now.unwrap_or_default()
            } else {
                let before = counted_before(member, resource);
                now.map_or(before, |now| now.max(before))
            };
            target.set(resource, Some(count));
        }
        plan.targets.insert(name.clone(), target);
    }
    Ok(plan)
}

/// The members a group's plan at `version` ([`group_plan`]) grants nothing for: those that have
/// not reported, and those whose report holds no word of the record's epoch yet. A member that
/// stays here (its share rounds keep failing, or it cannot take the group's word) holds back
/// every grant of its group: the group's status names it (`GrantsHeld`).
pub fn holding_back(view: &MasterView, version: u64) -> Vec<String> {
    let mut names: Vec<String> = view
        .seeds
        .iter()
        .filter(|(_, member)| member.report.is_none())
        .map(|(name, _)| name.clone())
        .chain(view.awaited(version).into_iter().map(str::to_owned))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The budget a project gives back to a group now: [`SeedShare::release_due`] of its share of
/// the group, over what its seeds hold ([`member_held`]). Must be written in the same
/// compare-and-swap of the project's record as the seeds' grants `project` was planned with.
pub fn member_release_due(
    share: &SeedShare,
    group_limit: &ResourceDetails,
    project: &MasterView,
    slack: &ResourceDetails,
    quiet: bool,
) -> Result<ResourceDetails, QuantityError> {
    let held = member_held(project, group_limit)?;
    Ok(share.release_due(group_limit, &held, slack, quiet))
}

#[cfg(test)]
mod tests;
