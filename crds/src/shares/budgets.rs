//! A quota group's budgets on the objects (docs/groups.md, "Shared mode"): the group's record
//! (`QuotaGroup.status.budgets`) and each member project's copy and report
//! (`ProjectQuota.status.shares.groups`), read into and written from the protocol's types
//! ([`super::group`]). Pure: the callers read and write the objects.

use std::collections::BTreeMap;

use super::group::remembered_on_leaving;
use super::{MasterView, MasterWord, SeedRecord, SeedShare, objects};
use crate::project_quota::GroupBudget;
use crate::quota_group::BudgetRecord;
use crate::resources::ResourceDetails;

/// One selected project, as the group reads it: its record's copy of its budget in this group
/// (absent until it takes its first word) and the `resourceVersion` of the object holding it,
/// which only grows, so the newest report wins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub copy: Option<(u64, GroupBudget)>,
    /// Its own limit (its quota in force): the most budget it could ever use.
    pub own_limit: ResourceDetails,
    /// The limits of the other `shared` groups that select it, the smallest per resource: it
    /// could not spend more of this group's budget either ([`SeedRecord::usable`]).
    pub other_groups: ResourceDetails,
}

/// The group's view: its record, for the projects it selects now, plus each one's report. A
/// project that left the group is not in it: its budget goes back at once (a project no longer
/// selected is no longer bounded by the group, so what it holds is no longer the group's). A
/// project selected again starts from what the record remembered of it ([`departed`]).
pub fn group_view(limit: &ResourceDetails, record: Option<&BudgetRecord>, members: &[Member]) -> MasterView {
    let mut recorded = record
        .map(|r| objects::from_entries(&r.projects))
        .unwrap_or_default();
    let mut departed = record
        .map(|r| objects::from_entries(&r.departed))
        .unwrap_or_default();
    let seeds = members
        .iter()
        .map(|member| {
            // A new member: `SeedRecord::new` (reachable), not the default (unreachable).
            #[allow(clippy::unwrap_or_default)]
            let mut entry = recorded
                .remove(&member.name)
                .or_else(|| departed.remove(&member.name))
                .unwrap_or_else(SeedRecord::new);
            entry.ceiling = member.own_limit.clone();
            entry.usable = member.other_groups.clone();
            // A project's copy reads as the report a seed's copy gives.
            entry.report = member.copy.as_ref().map(|(version, copy)| {
                share_of(copy).report(*version, &copy.committed, copy.demand.as_ref())
            });
            (member.name.clone(), entry)
        })
        .collect();
    MasterView {
        limit: limit.clone(),
        seeds,
    }
}

/// What the record written after `old` remembers of the projects that are not among
/// `members` (`BudgetRecord::departed`): what `old` remembered, and each entry of a project
/// that leaves now that [`remembered_on_leaving`] keeps; a project selected again takes its
/// entry back ([`group_view`]). Only of projects that still exist (`exists`): a deleted
/// project's clusters go with it, so no Machine of it acts on a word again, and without this
/// every member ever deleted would stay in the record.
pub fn departed(
    old: Option<&BudgetRecord>,
    members: &[Member],
    exists: impl Fn(&str) -> bool,
) -> BTreeMap<String, SeedRecord> {
    let Some(old) = old else {
        return BTreeMap::new();
    };
    let mut departed = objects::from_entries(&old.departed);
    for (name, entry) in objects::from_entries(&old.projects) {
        if let Some(remembered) = remembered_on_leaving(&entry) {
            departed.insert(name, remembered);
        }
    }
    departed.retain(|name, _| !members.iter().any(|m| m.name == *name) && exists(name));
    departed
}

/// The record to persist at `version`; `holdings_kept`: [`super::group::holdings_kept`] of the
/// plan it carries; `departed`: [`departed`].
pub fn record(
    version: u64,
    view: &MasterView,
    holdings_kept: bool,
    departed: &BTreeMap<String, SeedRecord>,
) -> BudgetRecord {
    BudgetRecord {
        version,
        holdings_kept,
        projects: objects::entries(&view.seeds),
        departed: objects::entries(departed),
    }
}

/// What the group's record says to `project`: `None` while it has no entry for it.
pub fn word_for(record: &BudgetRecord, project: &str) -> Option<MasterWord> {
    let entries = objects::from_entries(&record.projects);
    Some(entries.get(project)?.word(record.version))
}

/// A project's copy as the share it holds of the group.
pub fn share_of(copy: &GroupBudget) -> SeedShare {
    SeedShare {
        granted: copy.granted.clone(),
        released: copy.released.clone(),
        target: copy.target.clone(),
        version: copy.version,
    }
}

/// The copy to persist: the share held, and the report that goes with it.
pub fn copy(
    group: &str,
    share: &SeedShare,
    committed: ResourceDetails,
    demand: Option<ResourceDetails>,
) -> GroupBudget {
    GroupBudget {
        group: group.to_owned(),
        version: share.version,
        granted: share.granted.clone(),
        target: share.target.clone(),
        released: share.released.clone(),
        committed,
        demand,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::cpu;
    use crate::project_quota::GrantRecord;

    fn budget(name: &str, granted: i64, released: i64) -> GrantRecord {
        GrantRecord {
            name: name.into(),
            granted: cpu(granted),
            target: cpu(granted),
            released: cpu(released),
            counted: ResourceDetails::default(),
        }
    }

    #[test]
    fn the_view_holds_members_only_with_their_reports() {
        let record = BudgetRecord {
            version: 5,
            holdings_kept: false,
            projects: vec![budget("demo", 6, 1), budget("left", 4, 0)],
            departed: Vec::new(),
        };
        let copy = GroupBudget {
            group: "acme".into(),
            version: 5,
            granted: cpu(6),
            target: cpu(6),
            released: cpu(2),
            committed: cpu(3),
            demand: None,
        };
        let members = [
            Member {
                name: "demo".into(),
                copy: Some((900, copy.clone())),
                own_limit: cpu(10),
                other_groups: cpu(4),
            },
            Member {
                name: "new".into(),
                copy: None,
                own_limit: ResourceDetails::default(),
                other_groups: ResourceDetails::default(),
            },
        ];
        let view = group_view(&cpu(16), Some(&record), &members);
        assert_eq!(view.seeds.keys().collect::<Vec<_>>(), ["demo", "new"]);
        let demo = &view.seeds["demo"];
        // Its own limit is the most it may be granted; a member without one has no ceiling.
        assert_eq!(demo.ceiling, cpu(10));
        // Another group caps what it could spend, not its ceiling (what a group that keeps
        // holdings counts it at before it reports).
        assert_eq!(demo.usable, cpu(4));
        assert!(view.seeds["new"].ceiling.is_empty());
        // Held: granted 6 less the newer release (2) the project reports.
        assert_eq!(demo.share_seen(), cpu(4));
        assert_eq!(demo.report.as_ref().unwrap().version, 900);
        assert_eq!(view.seeds["new"].granted, ResourceDetails::default());
        // The project that left is gone, its budget free again.
        assert_eq!(view.free().unwrap(), cpu(12));
        // Round trip of the record, and the word a project reads.
        let written = record_of(&view);
        assert_eq!(written.projects[0], budget("demo", 6, 1));
        let word = word_for(&written, "demo").unwrap();
        assert_eq!((word.version, word.granted), (9, cpu(6)));
        assert!(word_for(&written, "left").is_none());
        let share = share_of(&copy);
        assert_eq!(share.share(), cpu(4));
        assert_eq!(super::copy("acme", &share, cpu(3), None), copy);
    }

    fn record_of(view: &MasterView) -> BudgetRecord {
        record(9, view, false, &BTreeMap::new())
    }

    fn member(name: &str) -> Member {
        Member {
            name: name.into(),
            copy: None,
            own_limit: cpu(4),
            other_groups: ResourceDetails::default(),
        }
    }

    #[test]
    fn a_project_that_leaves_comes_back_counted_as_before() {
        // Words that kept holdings counted "kept" at 10 (never granted since), "granted" at 6
        // (granted 4 since); nothing ever counted "zero".
        let entry = |name: &str, granted: i64, counted: i64| GrantRecord {
            name: name.into(),
            granted: if granted > 0 {
                cpu(granted)
            } else {
                ResourceDetails::default()
            },
            counted: if counted > 0 {
                cpu(counted)
            } else {
                ResourceDetails::default()
            },
            ..GrantRecord::default()
        };
        let old = BudgetRecord {
            version: 5,
            holdings_kept: true,
            projects: vec![entry("kept", 0, 10), entry("granted", 4, 6), entry("zero", 0, 0)],
            departed: vec![entry("earlier", 0, 7)],
        };
        // All three leave: their counts are remembered (budgets go back), with the one
        // remembered before; nothing of the one never counted.
        let gone = departed(Some(&old), &[], |_| true);
        assert_eq!(gone.keys().collect::<Vec<_>>(), ["earlier", "granted", "kept"]);
        // A project deleted meanwhile is not remembered, whether it left now or before.
        let deleted = |name: &str| name != "earlier" && name != "kept";
        let remembered = departed(Some(&old), &[], deleted);
        assert_eq!(remembered.keys().collect::<Vec<_>>(), ["granted"]);
        let written = record(6, &MasterView::default(), false, &gone);
        assert_eq!(
            written.departed,
            vec![
                entry("earlier", 0, 7),
                entry("granted", 0, 6),
                entry("kept", 0, 10)
            ]
        );
        // Selected again: each entry starts from its count (granted nothing), which it is
        // counted at while it has not reported; the record forgets what it brought back.
        let members = [
            member("kept"),
            member("granted"),
            member("earlier"),
            member("zero"),
        ];
        let view = group_view(&cpu(16), Some(&written), &members);
        assert_eq!(view.seeds["kept"].counted, cpu(10));
        assert_eq!(view.seeds["granted"].counted, cpu(6));
        assert!(view.seeds["granted"].granted.is_empty());
        assert_eq!(view.seeds["earlier"].counted, cpu(7));
        assert!(view.seeds["zero"].counted.is_empty());
        assert!(departed(Some(&written), &members, |_| true).is_empty());
    }
}
