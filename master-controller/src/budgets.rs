//! Shared groups' budgets on the master (docs/groups.md, "Shared mode"): the share protocol one
//! level up, `kkp_quota_crds::shares::group`.
//!
//! - The group's side: [`group_round`], one round over a group's record
//!   (`QuotaGroup.status.budgets`), run by the group loop ([`crate::groups`]) after each status
//!   pass: adopt (a lost record), plan, and a compare-and-swap write when anything changed.
//! - The project's side: [`Holdings`], what a project's share round ([`crate::shares::round`])
//!   takes from the groups that select it before it plans (its member limit), and what it writes
//!   back to them in the same compare-and-swap as its seeds' grants (releases and reports).
//!
//! [`crate::group_book::GroupBook`] carries the newest groups from the group loop to the share
//! rounds.

use std::sync::Arc;

use kkp_quota_crds::kkp::Project;
use kkp_quota_crds::project_quota::GroupBudget;
use kkp_quota_crds::shares::budgets::{self, Member};
use kkp_quota_crds::shares::group::{
    committed_report, first_budget, first_demand, group_plan, holding_back, holdings_kept, keeps_holdings,
    member_demand, member_held, member_limit, member_release_due, member_report, planning_budget,
    remember_counts,
};
use kkp_quota_crds::shares::{self, MasterView, SeedShare};
use kkp_quota_crds::{LedgerGroup, QuantityError, QuotaGroup, ResourceDetails};
use kube::api::{Patch, PatchParams};
use kube::core::{Selector, SelectorExt as _};
use kube::{Api, ResourceExt as _};
use tracing::{info, warn};

/// One group, as a project's share round holds its budget there.
#[derive(Debug, Clone)]
pub struct Holding {
    pub group: String,
    pub limit: ResourceDetails,
    pub slack: ResourceDetails,
    /// The project's copy, after taking the group's newest word; `None` until it has taken a
    /// first one (a new member, or a record lost): it then holds nothing of the group.
    pub share: Option<SeedShare>,
    /// What the project last reported committed to the group (its record's copy).
    pub reported: Option<ResourceDetails>,
    /// The group's record, with a word for this project, keeps its new members' holdings
    /// (`BudgetRecord::holdings_kept`, [`keeps_holdings`]).
    pub kept: bool,
}

/// What a project's share round takes from the groups that select it.
#[derive(Debug, Clone, Default)]
pub struct Holdings(pub Vec<Holding>);

impl Holdings {
    /// Each group's copy in the project's record (`old`), with the group's newest word taken.
    /// A group the record holds no copy of takes its first word through [`first_budget`], and
    /// only once `view` (the project's record, adopted) is not `awaiting` its epoch, so that
    /// what its seeds hold is read.
    pub fn take(
        groups: &[Arc<QuotaGroup>],
        project: &str,
        old: &[GroupBudget],
        view: &MasterView,
        awaiting: bool,
        slack_percent: u32,
    ) -> Result<Holdings, QuantityError> {
        let mut holdings = Vec::with_capacity(groups.len());
        for group in groups {
            let name = group.name_any();
            let limit = group.spec.quota.clone();
            let record = group.status.as_ref().and_then(|s| s.budgets.as_ref());
            let word = record.and_then(|r| budgets::word_for(r, project));
            // Only a member the group never granted budget keeps (`keeps_holdings`); one whose
            // copy is not taken yet (below) has none to tell, so the word says.
            let kept = word.as_ref().is_some_and(|w| w.granted.is_empty())
                && record.is_some_and(|r| r.holdings_kept);
            // A copy of version 0 never took a word: it reported only.
            let copy = old.iter().find(|c| c.group == name && c.version > 0);
            let share = match (copy, word) {
                (Some(copy), word) => {
                    let mut share = budgets::share_of(copy);
                    if let Some(word) = word {
                        share.receive(&word);
                    }
                    Some(share)
                }
                // Claiming nothing is exact even before the seeds' holdings are read: taken at
                // once, so that a member waiting for its own seeds does not hold back the
                // group's epoch, and with it every member's grants.
                (None, Some(word)) if !awaiting || word.granted.is_empty() => {
                    Some(first_budget(&word, &member_held(view, &limit)?))
                }
                (None, _) => None,
            };
            let reported = old.iter().find(|c| c.group == name).map(|c| c.committed.clone());
            holdings.push(Holding {
                reported,
                kept,
                group: name,
                slack: shares::slack(&limit, slack_percent),
                limit,
                share,
            });
        }
        Ok(Holdings(holdings))
    }

    /// The limit the project plans its seeds' shares (`view`) within: per group its budget, or
    /// what its seeds hold while it keeps them ([`planning_budget`]).
    pub fn member_limit(
        &self,
        own: &ResourceDetails,
        view: &MasterView,
    ) -> Result<ResourceDetails, QuantityError> {
        let budgets = self
            .0
            .iter()
            .map(|h| {
                Ok(planning_budget(
                    h.share.as_ref(),
                    h.kept,
                    &member_held(view, &h.limit)?,
                ))
            })
            .collect::<Result<Vec<SeedShare>, QuantityError>>()?;
        Ok(member_limit(
            own,
            budgets.iter().zip(self.0.iter().map(|h| &h.limit)),
        ))
    }

    /// After the plan (`view` applied): each group's copy to persist, with what the project
    /// releases now and reports. `quiet`: no seed of the project asks for more.
    pub fn settle(&mut self, view: &MasterView, quiet: bool) -> Result<Vec<GroupBudget>, QuantityError> {
        let mut copies = Vec::with_capacity(self.0.len());
        for holding in &mut self.0 {
            // Kept holdings are asked for as the first budget.
            let keeping = keeps_holdings(holding.share.as_ref(), holding.kept);
            let first = |demand: Option<ResourceDetails>| {
                if keeping {
                    first_demand(view, &holding.limit)
                } else {
                    Ok(demand)
                }
            };
            let Some(share) = holding.share.as_mut() else {
                // Nothing held yet: report, so that the group counts what the seeds hold and
                // hears a demand.
                let none = SeedShare::default();
                let committed = member_report(view, &holding.limit, &none)?;
                let demand = first(member_demand(view, &holding.limit, &ResourceDetails::default())?)?;
                copies.push(budgets::copy(&holding.group, &none, committed, demand));
                continue;
            };
            let due = member_release_due(share, &holding.limit, view, &holding.slack, quiet)?;
            if !due.is_empty() {
                share.release(&due)?;
            }
            let committed = committed_report(
                holding.reported.as_ref(),
                &member_report(view, &holding.limit, share)?,
                &share.target,
                &holding.slack,
            );
            let demand = first(member_demand(
                view,
                &holding.limit,
                &share.capacity(&holding.limit),
            )?)?;
            copies.push(budgets::copy(&holding.group, share, committed, demand));
        }
        copies.sort_by(|a, b| a.group.cmp(&b.group));
        Ok(copies)
    }
}

/// The limits the seeds' ledgers carry: the project's own, and for a resource only a group
/// limits, the smallest such group's limit (never the budget: a request above the budget must
/// still reach the master as a demand, not be refused on the seed as over the quota). A seed
/// admits only within its share either way; the limit makes a resource limited there at all.
pub fn seed_limits(own: &ResourceDetails, groups: &[Arc<QuotaGroup>]) -> ResourceDetails {
    let mut limits = own.clone();
    for group in groups {
        for (resource, limit) in group.spec.quota.iter() {
            if own.get(resource).is_none() {
                let tighter = limits.get(resource).map_or(limit, |l| l.min(limit));
                limits.set(resource, Some(tighter));
            }
        }
    }
    limits
}

/// What the `shared` groups `others` (each a selector and its limits: every group but the one
/// planning, [`crate::group_book::GroupBook::other_shared`]) let `project` spend at most: per resource the smallest
/// limit among those that select it ([`Member::other_groups`]).
pub fn other_groups_limits(others: &[(Selector, ResourceDetails)], project: &Project) -> ResourceDetails {
    shares::smallest(
        others
            .iter()
            .filter(|(selector, _)| selector.matches(project.labels()))
            .map(|(_, limits)| limits),
    )
}

/// The groups as `project`'s ledgers carry them (`spec.shares.groups`, for denials that name the
/// group): each group's limits, what its other projects use, as its status last summed them, and
/// what they hold of it as budget, as its record last said. A group whose figures cannot be
/// summed is left out: the shares bound the project anyway.
pub fn ledger_groups(groups: &[Arc<QuotaGroup>], project: &str) -> Vec<LedgerGroup> {
    groups
        .iter()
        .filter_map(|group| {
            let status = group.status.as_ref();
            let by_project = status.map(|s| s.by_project.as_slice()).unwrap_or_default();
            let others = by_project.iter().filter(|u| u.name != project).map(|u| &u.usage);
            let budgets = status
                .and_then(|s| s.budgets.as_ref())
                .map(|b| shares::objects::from_entries(&b.projects))
                .unwrap_or_default();
            let held: Vec<ResourceDetails> = budgets
                .iter()
                .filter(|(name, _)| *name != project)
                .map(|(_, record)| record.share_seen())
                .collect();
            // Only what the group limits.
            let limited = |amounts: &ResourceDetails| shares::bounded_by(&group.spec.quota, amounts);
            Some(LedgerGroup {
                name: group.name_any(),
                quota: group.spec.quota.clone(),
                others_usage: limited(&ResourceDetails::checked_sum(others).ok()?),
                // Absent while the record holds no other project (a group without budgets yet).
                // A sum that does not fit a quantity says nothing, rather than dropping the
                // group (its limits also refuse the rollout allowance on the seed).
                others_held: if held.is_empty() {
                    ResourceDetails::default()
                } else {
                    ResourceDetails::checked_sum(held.iter())
                        .map(|h| limited(&h))
                        .unwrap_or_default()
                },
            })
        })
        .collect()
}

/// Whether no seed in `view` asks for more: a project then gives back idle budget.
pub fn quiet(view: &MasterView) -> bool {
    view.seeds
        .values()
        .all(|r| r.report.as_ref().is_none_or(|rep| rep.demand.is_none()))
}

/// One round over `group`'s record: its members (the projects it selects, each with its quota
/// in force) read, a lost record adopted, grants and targets planned, and the record written
/// with compare-and-swap when anything changed (`exists`: whether a project still exists; a
/// deleted one is not remembered among those that left). Returns the group written, if any. On a
/// conflict nothing is written: the write that moved the group is a watch event, and the next
/// pass plans again from it (the group loop writes the status only after this round).
pub async fn group_round(
    api: &Api<QuotaGroup>,
    group: &QuotaGroup,
    members: &[Member],
    exists: &(dyn Fn(&str) -> bool + Sync),
    slack_percent: u32,
) -> Result<Option<QuotaGroup>, crate::Error> {
    let name = group.name_any();
    let Some((patch, plan, before, version)) = plan_group(group, members, exists, slack_percent)? else {
        return Ok(None);
    };
    match api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(written) => {
            for (project, amount) in &plan.grants {
                let demand = before
                    .seeds
                    .get(project)
                    .and_then(|r| r.report.as_ref()?.demand.clone())
                    .unwrap_or_default();
                info!(group = %name, %project, amount = %amount, demand = %demand, version, "budget granted");
            }
            Ok(Some(written))
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The members `group`'s record grants nothing for while they stay as they are
/// ([`holding_back`]: not reported, or holding no word of its epoch), as its next round reads
/// them: what the group's `GrantsHeld` condition names.
pub fn grants_held(group: &QuotaGroup, members: &[Member]) -> Vec<String> {
    let record = group.status.as_ref().and_then(|s| s.budgets.as_ref());
    let mut view = budgets::group_view(&group.spec.quota, record, members);
    let (old_version, _) = view.adopt(record.map_or(0, |r| r.version));
    holding_back(&view, old_version + 1)
}

/// The plan of one group round, pure: the compare-and-swap patch, the plan, the view before it
/// and the version written; `None` when nothing changes.
fn plan_group(
    group: &QuotaGroup,
    members: &[Member],
    exists: &(dyn Fn(&str) -> bool + Sync),
    slack_percent: u32,
) -> Result<Option<(serde_json::Value, shares::Plan, MasterView, u64)>, crate::Error> {
    let record = group.status.as_ref().and_then(|s| s.budgets.as_ref());
    let mut view = budgets::group_view(&group.spec.quota, record, members);
    let before = view.clone();
    let (old_version, adopted) = view.adopt(record.map_or(0, |r| r.version));
    if adopted && record.is_some() {
        warn!(group = %group.name_any(), "the group's budget record is behind what its projects hold (QuotaGroup re-created or restored): rebuilding it from their copies");
    }
    let slack = shares::slack(&group.spec.quota, slack_percent);
    let plan = group_plan(&view, old_version + 1, &slack).map_err(crate::Error::Quantity)?;
    let kept = holdings_kept(&view, old_version + 1).map_err(crate::Error::Quantity)?;
    let planned = view.apply(&plan).map_err(crate::Error::Quantity)?;
    let counted = remember_counts(&mut view, kept);
    let members_changed = record.is_none_or(|r| {
        r.projects.len() != view.seeds.len() || r.projects.iter().any(|p| !view.seeds.contains_key(&p.name))
    });
    let kept_changed = record.is_none_or(|r| r.holdings_kept != kept);
    if !(adopted || planned || counted || members_changed || kept_changed) {
        return Ok(None);
    }
    let Some(resource_version) = group.metadata.resource_version.clone() else {
        return Ok(None);
    };
    let version = old_version + 1;
    let departed = budgets::departed(record, members, exists);
    let record = budgets::record(version, &view, kept, &departed);
    // A merge patch keeps a list it does not carry: an emptied one is sent as such.
    let mut body = serde_json::json!(record);
    body["projects"] = serde_json::json!(record.projects);
    body["departed"] = serde_json::json!(record.departed);
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": resource_version},
        "status": {"budgets": body},
    });
    Ok(Some((patch, plan, before, version)))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use kkp_quota_crds::fixtures::cpu;
    use kkp_quota_crds::project_quota::GrantRecord;
    use kkp_quota_crds::quota_group::GroupMode;
    use kkp_quota_crds::quota_group::{BudgetRecord, QuotaGroupSpec, QuotaGroupStatus};
    use kkp_quota_crds::shares::{SeedRecord, SeedReport};

    fn group(name: &str, limit: i64, granted_to_demo: Option<(u64, i64)>) -> Arc<QuotaGroup> {
        let mut g = QuotaGroup::new(
            name,
            QuotaGroupSpec {
                selector: serde_json::from_value(serde_json::json!({"matchLabels": {"team": "red"}}))
                    .unwrap(),
                quota: cpu(limit),
                mode: GroupMode::Shared,
                owners: Vec::new(),
            },
        );
        g.status = granted_to_demo.map(|(version, granted)| QuotaGroupStatus {
            budgets: Some(BudgetRecord {
                version,
                holdings_kept: false,
                departed: Vec::new(),
                projects: vec![GrantRecord {
                    name: "demo".into(),
                    granted: cpu(granted),
                    target: cpu(granted),
                    released: ResourceDetails::default(),
                    counted: ResourceDetails::default(),
                }],
            }),
            ..QuotaGroupStatus::default()
        });
        Arc::new(g)
    }

    fn project_view(seed_held: i64, demand: Option<i64>) -> MasterView {
        let mut seed = SeedRecord::new();
        seed.granted = cpu(seed_held);
        seed.report = Some(SeedReport {
            version: 1,
            committed: cpu(seed_held),
            demand: demand.map(cpu),
            ..SeedReport::default()
        });
        MasterView {
            limit: cpu(100),
            seeds: [("seed-a".to_owned(), seed)].into(),
        }
    }

    #[test]
    fn a_first_word_claims_what_the_seeds_hold_and_later_words_are_taken_as_they_come() {
        let groups = [group("acme", 10, Some((3, 8)))];
        let view = project_view(5, None);
        // No copy yet: the first word, but only what the seeds hold (5 of the 8 granted).
        let first = Holdings::take(&groups, "demo", &[], &view, false, 10).unwrap();
        assert_eq!(first.0[0].share.as_ref().unwrap().share(), cpu(5));
        assert_eq!(first.member_limit(&cpu(20), &view).unwrap(), cpu(5));
        // While the record awaits its epoch: nothing taken, the group's resources bounded to 0.
        let waiting = Holdings::take(&groups, "demo", &[], &view, true, 10).unwrap();
        assert!(waiting.0[0].share.is_none());
        assert_eq!(waiting.member_limit(&cpu(20), &view).unwrap(), cpu(0));
        // A copy held: the newer word is taken as it is (the copy's own release stays).
        let copy = GroupBudget {
            group: "acme".into(),
            version: 2,
            granted: cpu(6),
            target: cpu(6),
            released: cpu(1),
            ..GroupBudget::default()
        };
        let held = Holdings::take(&groups, "demo", &[copy], &view, false, 10).unwrap();
        assert_eq!(held.0[0].share.as_ref().unwrap().share(), cpu(7));
    }

    /// `group` with its record's first entry (demo's) edited by `edit`.
    fn with_demo_entry(group: &QuotaGroup, edit: impl FnOnce(&mut GrantRecord)) -> Arc<QuotaGroup> {
        let mut group = group.clone();
        let record = group.status.as_mut().unwrap().budgets.as_mut().unwrap();
        edit(&mut record.projects[0]);
        Arc::new(group)
    }

    #[test]
    fn a_new_member_keeps_what_its_seeds_hold_while_the_record_keeps_holdings() {
        // A group just made over demo, whose seed holds and uses 5 and asks for 6: the record
        // has an entry for demo, grants nothing yet, keeps holdings, and counted demo at its
        // own limit then, 20 (its target).
        let mut acme = (*group("acme", 10, Some((1, 0)))).clone();
        let record = acme.status.as_mut().unwrap().budgets.as_mut().unwrap();
        record.projects[0].granted = ResourceDetails::default();
        record.projects[0].target = cpu(20);
        record.holdings_kept = true;
        let groups = [Arc::new(acme.clone())];
        let view = project_view(5, Some(6));
        let mut holdings = Holdings::take(&groups, "demo", &[], &view, false, 10).unwrap();
        // It plans within what its seed holds (not the empty budget), and asks for that or more.
        assert_eq!(holdings.member_limit(&cpu(20), &view).unwrap(), cpu(5));
        // Never above what the group counted it at: had that been 3 (its own limit then, raised
        // since), it keeps 3.
        let counted_low = with_demo_entry(&acme, |entry| entry.target = cpu(3));
        let low = Holdings::take(&[counted_low], "demo", &[], &view, false, 10).unwrap();
        assert_eq!(low.member_limit(&cpu(20), &view).unwrap(), cpu(3));
        // A word that grants demo budget is not one to keep by, even from a record that keeps
        // (here demo's own record awaits its epoch, so the word is not taken yet): nothing.
        let granting = with_demo_entry(&acme, |entry| entry.granted = cpu(2));
        let waiting = Holdings::take(&[granting], "demo", &[], &view, true, 10).unwrap();
        assert!(waiting.0[0].share.is_none());
        assert_eq!(waiting.member_limit(&cpu(20), &view).unwrap(), cpu(0));
        let copies = holdings.settle(&view, false).unwrap();
        assert_eq!(copies[0].demand, Some(cpu(6)));
        assert_eq!(copies[0].committed, cpu(5));
        // The record no longer keeps holdings (no room, or grants planned): its budget, 0.
        acme.status
            .as_mut()
            .unwrap()
            .budgets
            .as_mut()
            .unwrap()
            .holdings_kept = false;
        let groups = [Arc::new(acme)];
        let holdings = Holdings::take(&groups, "demo", &[], &view, false, 10).unwrap();
        assert_eq!(holdings.member_limit(&cpu(20), &view).unwrap(), cpu(0));
        // A group with no word for demo yet (just made): its budget, nothing.
        let made = [group("acme", 10, None)];
        let holdings = Holdings::take(&made, "demo", &[], &view, false, 10).unwrap();
        assert_eq!(holdings.member_limit(&cpu(20), &view).unwrap(), cpu(0));
    }

    #[test]
    fn a_member_could_spend_no_more_than_its_other_groups_allow() {
        use crate::group_book::GroupBook;
        let book = GroupBook::default();
        book.update(&[
            group("acme", 10, None),
            group("solo", 4, None),
            group("team", 6, None),
        ]);
        let mut red = Project::new("demo", kkp_quota_crds::kkp::ProjectSpec::default());
        red.metadata.labels = Some(BTreeMap::from([("team".to_owned(), "red".to_owned())]));
        let blue = Project::new("other", kkp_quota_crds::kkp::ProjectSpec::default());
        assert_eq!(other_groups_limits(&book.other_shared("acme"), &red), cpu(4));
        assert_eq!(other_groups_limits(&book.other_shared("solo"), &red), cpu(6));
        assert!(other_groups_limits(&book.other_shared("acme"), &blue).is_empty());
        let alone = GroupBook::default();
        alone.update(&[group("acme", 10, None)]);
        assert!(other_groups_limits(&alone.other_shared("acme"), &red).is_empty());
    }

    #[test]
    fn a_group_round_records_whether_it_keeps_holdings() {
        let mut g = (*group("acme", 10, None)).clone();
        g.metadata.resource_version = Some("1".into());
        let busy = |name: &str, committed: i64, reported: bool, own: i64| Member {
            name: name.into(),
            copy: reported.then(|| {
                (
                    7,
                    GroupBudget {
                        group: "acme".into(),
                        committed: cpu(committed),
                        demand: Some(cpu(committed)),
                        ..GroupBudget::default()
                    },
                )
            }),
            own_limit: cpu(own),
            other_groups: ResourceDetails::default(),
        };
        // Sent either way: a merge patch without it would leave an earlier `true` in place.
        let kept = |members: &[Member]| {
            let (patch, ..) = plan_group(&g, members, &|_| true, 10).unwrap().unwrap();
            patch["status"]["budgets"]["holdingsKept"]
                .as_bool()
                .expect("holdingsKept is always sent")
        };
        // Own limits of 5 each: nobody reported, kept (5 + 5 fit 10); demo's 4 reported, kept;
        // 4 + 7 reported, over 10, not kept. Own limits of 100: nobody reported, not kept.
        assert!(kept(&[busy("demo", 0, false, 5), busy("other", 0, false, 5)]));
        assert!(kept(&[busy("demo", 4, true, 5), busy("other", 0, false, 5)]));
        assert!(!kept(&[busy("demo", 4, true, 5), busy("other", 7, true, 5)]));
        assert!(!kept(&[
            busy("demo", 0, false, 100),
            busy("other", 0, false, 100)
        ]));
    }

    #[test]
    fn a_group_round_over_its_own_record_writes_nothing() {
        let mut g = (*group("acme", 10, None)).clone();
        g.metadata.resource_version = Some("1".into());
        // Kept: demo reported holding nothing (counted at zero), other not heard from (at its
        // own 5). A zero count is no count: the record once "raised" it on every pass, since the
        // stored record leaves an all-zero figure out.
        let members = [
            Member {
                name: "demo".into(),
                copy: Some((
                    7,
                    GroupBudget {
                        group: "acme".into(),
                        ..GroupBudget::default()
                    },
                )),
                own_limit: cpu(5),
                other_groups: ResourceDetails::default(),
            },
            Member {
                name: "other".into(),
                copy: None,
                own_limit: cpu(5),
                other_groups: ResourceDetails::default(),
            },
        ];
        let (patch, ..) = plan_group(&g, &members, &|_| true, 10).unwrap().unwrap();
        let record: BudgetRecord = serde_json::from_value(patch["status"]["budgets"].clone()).unwrap();
        assert!(record.holdings_kept);
        let other = record.projects.iter().find(|p| p.name == "other").unwrap();
        assert_eq!(other.counted, cpu(5));
        g.status = Some(QuotaGroupStatus {
            budgets: Some(record),
            ..QuotaGroupStatus::default()
        });
        g.metadata.resource_version = Some("2".into());
        assert!(plan_group(&g, &members, &|_| true, 10).unwrap().is_none());
    }

    #[test]
    fn seeds_carry_the_group_limit_only_where_the_project_sets_none() {
        let groups = [group("acme", 10, None)];
        assert_eq!(seed_limits(&ResourceDetails::default(), &groups), cpu(10));
        assert_eq!(seed_limits(&cpu(4), &groups), cpu(4));
        assert_eq!(seed_limits(&cpu(40), &groups), cpu(40));
    }

    #[test]
    fn ledgers_carry_what_the_other_projects_use_and_hold() {
        let mut acme = (*group("acme", 10, None)).clone();
        let usage = |name: &str, n: i64| kkp_quota_crds::quota_group::NamedUsage {
            name: name.into(),
            usage: cpu(n),
        };
        let budget = |name: &str, granted: i64, released: i64| GrantRecord {
            name: name.into(),
            granted: cpu(granted),
            target: cpu(granted),
            released: cpu(released),
            counted: ResourceDetails::default(),
        };
        acme.status = Some(QuotaGroupStatus {
            by_project: vec![usage("demo", 3), usage("other", 4), usage("third", 2)],
            budgets: Some(BudgetRecord {
                version: 3,
                holdings_kept: false,
                departed: Vec::new(),
                projects: vec![budget("demo", 4, 0), budget("other", 7, 1), budget("third", 2, 0)],
            }),
            ..QuotaGroupStatus::default()
        });
        let carried = ledger_groups(&[Arc::new(acme)], "demo");
        assert_eq!(carried.len(), 1);
        assert_eq!(
            (
                carried[0].name.as_str(),
                &carried[0].quota,
                &carried[0].others_usage,
                &carried[0].others_held
            ),
            ("acme", &cpu(10), &cpu(6), &cpu(8))
        );
        // No status yet: nobody else uses or holds anything.
        let fresh = &ledger_groups(&[group("acme", 10, None)], "demo")[0];
        assert_eq!(
            (&fresh.others_usage, &fresh.others_held),
            (&cpu(0), &ResourceDetails::default())
        );
    }

    #[test]
    fn settling_releases_idle_budget_when_quiet_and_reports_demand() {
        let groups = [group("acme", 10, Some((3, 8)))];
        let view = project_view(5, None);
        let mut holdings = Holdings::take(&groups, "demo", &[], &project_view(8, None), false, 10).unwrap();
        // The seeds now hold 5 of the 8: quiet, the project keeps 5 + the slack (1).
        let copies = holdings.settle(&view, true).unwrap();
        assert_eq!(copies[0].released, cpu(2));
        assert_eq!(
            (copies[0].committed.clone(), copies[0].demand.clone()),
            (cpu(5), None)
        );
        // A seed asking for 9 reports a demand of 9 to the group.
        let mut holdings = Holdings::take(&groups, "demo", &copies, &view, false, 10).unwrap();
        let copies = holdings.settle(&project_view(5, Some(9)), false).unwrap();
        assert_eq!(copies[0].demand, Some(cpu(9)));
    }
}
