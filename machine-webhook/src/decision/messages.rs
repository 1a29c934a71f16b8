//! The sentences of denials and warnings, in the quota's units.

use kkp_quota_crds::{Exceeded, LedgerGroup, Quantity, Resource, ResourceDetails};

use super::{QuotaState, Subject};

/// "a", "a and b", "a, b and c".
fn join_human(parts: &[String]) -> String {
    match parts {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// The sentence naming every resource that does not fit, in the quota's units:
/// `needs 4 cpu and 2Gi memory, project "x8k2" uses 14 of 16 cpu and 31Gi of 32Gi memory`.
/// For a `Cluster` (which asks for one cluster): `project "x8k2" has 5 of 5 clusters`.
pub fn exceeded_detail(project: &str, exceeded: &[Exceeded], update: bool, subject: Subject) -> String {
    if subject == Subject::Cluster {
        let has: Vec<String> = exceeded
            .iter()
            .map(|e| uses(e.resource, e.used, e.limit))
            .collect();
        return format!("project {project:?} has {}", join_human(&has));
    }
    let uses: Vec<String> = exceeded
        .iter()
        .map(|e| uses(e.resource, e.used, e.limit))
        .collect();
    format!(
        "needs {}, project {project:?} uses {}",
        needs(exceeded, update),
        join_human(&uses)
    )
}

/// The shared groups bounding the project that have no room for `growth` beside what the project
/// uses (with the groups' figures as the ledger last carried them), in the ledger's order, each
/// with every resource it has no room for.
pub(super) fn full_groups<'a>(
    state: &'a QuotaState,
    growth: &ResourceDetails,
) -> Vec<(&'a str, Vec<Exceeded>)> {
    groups_without_room(state, growth, |group| Some(&group.others_usage))
}

/// The shared groups bounding the project whose budget its other projects hold leaves no room
/// for `growth` beside what the project uses (as the ledger last carried the group's record):
/// a request that waited for share and got none was refused by such a group. Each with every
/// resource it has no room for.
pub(super) fn budget_short_groups<'a>(
    state: &'a QuotaState,
    growth: &ResourceDetails,
) -> Vec<(&'a str, Vec<Exceeded>)> {
    groups_without_room(state, growth, |group| {
        (!group.others_held.is_empty()).then_some(&group.others_held)
    })
}

/// The groups where what `others` says the group's other projects take (`None`: not known),
/// with the project's use, leaves no room for `growth`.
fn groups_without_room<'a>(
    state: &'a QuotaState,
    growth: &ResourceDetails,
    others: impl Fn(&LedgerGroup) -> Option<&ResourceDetails>,
) -> Vec<(&'a str, Vec<Exceeded>)> {
    let Ok(own) = state.used() else {
        return Vec::new();
    };
    state
        .groups
        .iter()
        .filter_map(|group| {
            let taken = others(group)?.checked_add(&own).ok()?;
            let exceeded = group.quota.exceeded_by(&taken, growth).ok()?;
            (!exceeded.is_empty()).then_some((group.name.as_str(), exceeded))
        })
        .collect()
}

/// When `growth` fits the project's own quota but not a group bounding it (`full`: the groups
/// without room, [`full_groups`]): `needs 4 cpu, project "demo" is within its own quota, but
/// group "acme" uses 30 of 32 cpu`, naming every such group and resource.
pub(super) fn group_detail(
    project: &str,
    full: &[(&str, Vec<Exceeded>)],
    update: bool,
    subject: Subject,
) -> Option<String> {
    // What the request needs of every resource some group has no room for, each named once.
    let mut short: Vec<Exceeded> = Vec::new();
    for e in full.iter().flat_map(|(_, exceeded)| exceeded) {
        if !short.iter().any(|s| s.resource == e.resource) {
            short.push(e.clone());
        }
    }
    if short.is_empty() {
        return None;
    }
    let verb = if subject == Subject::Cluster {
        "has"
    } else {
        "uses"
    };
    let groups: Vec<String> = full
        .iter()
        .map(|(group, exceeded)| {
            let uses: Vec<String> = exceeded
                .iter()
                .map(|e| uses(e.resource, e.used, e.limit))
                .collect();
            format!("group {group:?} {verb} {}", join_human(&uses))
        })
        .collect();
    let within = format!(
        "project {project:?} is within its own quota, but {}",
        join_human(&groups)
    );
    Some(if subject == Subject::Cluster {
        within
    } else {
        format!("needs {}, {within}", needs(&short, update))
    })
}

/// What a request asks for: `4 cpu and 2Gi memory`, or `2 more cpu` for a growth.
fn needs(exceeded: &[Exceeded], update: bool) -> String {
    let needs: Vec<String> = exceeded
        .iter()
        .map(|e| {
            if update {
                format!("{} more {}", e.resource.amount(e.requested), e.resource.name())
            } else {
                e.resource.describe(e.requested)
            }
        })
        .collect();
    join_human(&needs)
}

/// Both ways out for a `MachineDeployment` whose rollout needs room for a surge Machine (with the
/// default `maxSurge: 1`, every rollout of a project at full quota stalls on it).
pub const ROLLOUT_WAYS_OUT: &str = "set its MachineDeployment's rollout strategy to maxSurge: 0 and maxUnavailable: 1 \
     (Machines are then replaced one at a time, without an extra one), or raise the project's quota";

/// Appended to a denial for room of a Machine a `MachineSet` creates: the user cannot tell from
/// the denial alone that a rollout is what asks for the extra Machine.
pub fn rollout_hint() -> String {
    format!(
        "; if this Machine is the surge of a MachineDeployment rollout (such as a Kubernetes upgrade), {ROLLOUT_WAYS_OUT}"
    )
}

/// The Event on a `MachineDeployment` that is rolling out, for a denial for room (`detail`: the
/// denial without the Machine's name).
pub fn rollout_blocked(detail: &str) -> String {
    format!("the rollout is blocked: its surge {detail}; {ROLLOUT_WAYS_OUT}")
}

/// "`used` of `limit`", e.g. "6 of 8 cpu".
fn uses(resource: Resource, used: Quantity, limit: Quantity) -> String {
    format!("{} of {}", resource.amount(used), resource.describe(limit))
}

/// Warnings for a project whose usage is already above its quota (the quota was lowered).
pub fn over_quota_warnings(project: &str, state: &QuotaState) -> Vec<String> {
    // Headroom held in allotments is not usage: it never makes a project "over".
    let Ok(in_use) = state.used() else {
        return Vec::new();
    };
    // Only what Machines ask for: a project over its cluster count is not news to a Machine.
    let over: Vec<Resource> = state
        .limit
        .overrun_by(&in_use)
        .into_iter()
        .filter(|r| r.asked_by_machines())
        .collect();
    if over.is_empty() {
        return Vec::new();
    }
    let uses: Vec<String> = over
        .iter()
        .map(|&r| uses(r, in_use.amount(r), state.limit.amount(r)))
        .collect();
    vec![format!(
        "project {project:?} is over its resource quota: it uses {}; new Machines that need {} are denied until usage is back under the quota",
        join_human(&uses),
        join_human(&over.iter().map(|r| r.name().to_owned()).collect::<Vec<_>>())
    )]
}

/// Why a request that fits the quota waits for share: what the project uses, who holds the rest,
/// and that a retry succeeds once it has moved.
pub(super) fn share_detail(project: &str, state: &QuotaState) -> String {
    let in_use = state.in_use().unwrap_or_default();
    let uses: Vec<String> = state
        .limit
        .iter()
        .map(|(r, limit)| uses(r, in_use.amount(r), limit))
        .collect();
    let holders: Vec<String> = state
        .seed
        .iter()
        .flat_map(|s| &s.others)
        .map(|(seed, share)| {
            let held: Vec<String> = state
                .limit
                .iter()
                .filter(|(r, _)| !share.amount(*r).is_zero())
                .map(|(r, _)| r.describe(share.amount(r)))
                .collect();
            format!("seed {seed:?} ({})", join_human(&held))
        })
        .collect();
    let rest = if holders.is_empty() {
        "the rest of the quota has not been granted to this seed yet".to_owned()
    } else {
        format!("the rest of the quota is held by {}", join_human(&holders))
    };
    // A project under a shared group may wait for budget the group has given its other
    // projects, which may all be in use: the room is asked for, but a retry is not sure to pass.
    let groups = bounding_groups(state);
    if !groups.is_empty() {
        return format!(
            "cannot be admitted yet: project {project:?} uses {}, and {rest}; it is asked for, but the project is also bounded by {}, whose room its other projects may be using, so trying again in a few seconds may succeed",
            join_human(&uses),
            join_human(&groups)
        );
    }
    format!(
        "cannot be admitted yet: project {project:?} uses {}, and {rest}; it is being moved to this seed, so trying again in a few seconds will succeed",
        join_human(&uses)
    )
}

/// Each shared group bounding the project, with what it uses (the project's use and its other
/// projects' as the ledger last carried them): `group "acme" (47 of 50 cpu)`.
fn bounding_groups(state: &QuotaState) -> Vec<String> {
    let own = state.used().unwrap_or_default();
    state
        .groups
        .iter()
        .map(|group| {
            let used = group.others_usage.checked_add(&own).unwrap_or_default();
            let figures: Vec<String> = group
                .quota
                .iter()
                .map(|(r, limit)| uses(r, used.amount(r), limit))
                .collect();
            let held: Vec<String> = group
                .quota
                .iter()
                .filter_map(|(r, _)| {
                    group
                        .others_held
                        .get(r)
                        .filter(|h| !h.is_zero())
                        .map(|h| r.describe(h))
                })
                .collect();
            let held = if held.is_empty() {
                String::new()
            } else {
                format!("; its other projects hold {} of it", join_human(&held))
            };
            format!(
                "group {:?} ({} as last counted{held})",
                group.name,
                join_human(&figures)
            )
        })
        .collect()
}

/// When part of "in use" is headroom other webhook processes hold (allotments), says so: it comes
/// back when they record what they admitted or give it back.
pub(super) fn held_note(exceeded: &[Exceeded], allotted: &ResourceDetails) -> String {
    let held: Vec<String> = exceeded
        .iter()
        .filter(|e| allotted.amount(e.resource) > kkp_quota_crds::Quantity::ZERO)
        .map(|e| e.resource.describe(allotted.amount(e.resource)))
        .collect();
    if held.is_empty() {
        String::new()
    } else {
        format!(
            " (of which {} is headroom held by other webhook processes, freed as they record their admissions or give it back)",
            join_human(&held)
        )
    }
}

/// Above this fraction of a limit (`NEAR_LIMIT.0 / NEAR_LIMIT.1`, 80 %), an admission warns.
const NEAR_LIMIT: (i128, i128) = (4, 5);

/// The warning for an admission that leaves the project above 80 % of a limit, naming every such
/// resource: `project "demo" now uses 14 of 16 cpu (above 80 % of its quota)`. Resources already
/// over the limit are left to [`over_quota_warnings`].
pub fn near_limit_warnings(project: &str, state: &QuotaState, growth: &ResourceDetails) -> Vec<String> {
    let Ok(after) = state.used().and_then(|used| {
        used.checked_add(growth)
            .map_err(|e| super::StateError(e.to_string()))
    }) else {
        return Vec::new();
    };
    let near: Vec<String> = state
        .limit
        .iter()
        .filter(|&(r, limit)| {
            let used = after.amount(r).as_nanos();
            let limit = limit.as_nanos();
            used <= limit && used.saturating_mul(NEAR_LIMIT.1) > limit.saturating_mul(NEAR_LIMIT.0)
        })
        .map(|(r, limit)| uses(r, after.amount(r), limit))
        .collect();
    if near.is_empty() {
        return Vec::new();
    }
    vec![format!(
        "project {project:?} now uses {} (above {} % of its quota)",
        join_human(&near),
        NEAR_LIMIT.0 * 100 / NEAR_LIMIT.1
    )]
}

/// How many Machines of `size` fit beside what the project uses now: the fewest over every
/// limited resource the size asks for (`None`: no limit applies to it).
pub fn machines_that_fit(state: &QuotaState, size: &ResourceDetails) -> Option<u64> {
    let used = state.used().ok()?;
    kkp_quota_crds::fit::machines_that_fit(&state.limit, &used, size).map(|fit| fit.count)
}

/// The answer a dry-run create carries: nothing was reserved, and how many Machines of its size
/// the quota has room for now.
pub fn dry_run_answer(project: &str, state: &QuotaState, size: &ResourceDetails) -> String {
    // What one Machine is made of; the count of Machines (1) goes without saying.
    let described: Vec<String> = size
        .iter()
        .filter(|&(r, q)| r != Resource::Machines && q > Quantity::ZERO)
        .map(|(r, q)| r.describe(q))
        .collect();
    let size_text = join_human(&described);
    let room = match machines_that_fit(state, size) {
        None => "its quota does not limit what this Machine needs".to_owned(),
        Some(1) => format!("1 Machine of this size ({size_text}) fits in its quota now"),
        Some(n) => format!("{n} Machines of this size ({size_text}) fit in its quota now"),
    };
    format!("dry run, nothing was reserved: in project {project:?}, {room}")
}

/// Added to a dry run that fits the quota while the room is held by another seed or webhook
/// process: a real create waits for it (and asks for it); a dry run moves nothing.
pub const DRY_RUN_ROOM_ELSEWHERE: &str = "dry run: part of the room is held by another seed or webhook process now; a real create waits a few seconds for it to move here";
