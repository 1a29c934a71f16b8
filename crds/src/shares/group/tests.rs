//! Unit tests of the group protocol's pure functions (`super`).

use super::*;
use crate::shares::tests::{cpu, seed_share as budget};
use crate::shares::{SeedRecord, SeedReport};

fn seed(granted: i64, committed: i64, demand: Option<i64>) -> SeedRecord {
    SeedRecord {
        granted: cpu(granted),
        report: Some(SeedReport {
            version: 1,
            committed: cpu(committed),
            demand: demand.map(cpu),
            ..SeedReport::default()
        }),
        ..SeedRecord::new()
    }
}

fn project(limit: i64, seeds: Vec<SeedRecord>) -> MasterView {
    let names = ["seed-a", "seed-b", "seed-c"];
    MasterView {
        limit: cpu(limit),
        seeds: names.iter().map(|n| (*n).to_owned()).zip(seeds).collect(),
    }
}

#[test]
fn a_report_is_repeated_while_its_use_grows_within_the_slack_and_the_target() {
    let (slack, target) = (cpu(2), cpu(10));
    let last = cpu(5);
    // Grown by up to the slack, within the target: the last report again (no write).
    assert_eq!(committed_report(Some(&last), &cpu(7), &target, &slack), cpu(5));
    assert_eq!(committed_report(Some(&last), &cpu(5), &target, &slack), cpu(5));
    // More than the slack, a fall, or above the target: the fresh figure.
    assert_eq!(committed_report(Some(&last), &cpu(8), &target, &slack), cpu(8));
    assert_eq!(committed_report(Some(&last), &cpu(4), &target, &slack), cpu(4));
    assert_eq!(committed_report(Some(&last), &cpu(7), &cpu(6), &slack), cpu(7));
    // Nothing reported before: the fresh figure.
    assert_eq!(committed_report(None, &cpu(7), &target, &slack), cpu(7));
    // A resource appearing or going: the fresh figure.
    assert_eq!(
        committed_report(Some(&ResourceDetails::default()), &cpu(1), &target, &slack),
        cpu(1)
    );
}

#[test]
fn the_member_limit_is_the_smallest_of_the_own_limit_and_every_budget() {
    let group = cpu(32);
    let (a, b) = (budget(10, 2, None), budget(6, 0, Some(5)));
    assert_eq!(member_limit(&cpu(16), [(&a, &group)]), cpu(8));
    assert_eq!(member_limit(&cpu(16), [(&a, &group), (&b, &group)]), cpu(5));
    // The own limit tighter than every budget.
    assert_eq!(member_limit(&cpu(4), [(&a, &group)]), cpu(4));
    // A project without a cpu limit is limited by its group's budget.
    assert_eq!(member_limit(&ResourceDetails::default(), [(&a, &group)]), cpu(8));
    // No group: the own limit, unlimited resources stay unlimited.
    assert_eq!(member_limit(&cpu(4), []), cpu(4));
    assert!(member_limit(&ResourceDetails::default(), []).is_empty());
}

#[test]
fn a_group_grants_nothing_until_every_member_has_reported() {
    // Group of 6: demo uses 4 and wants 6; other just joined, using 4 the group has not
    // heard of.
    let demo = SeedRecord {
        granted: cpu(4),
        ..seed(4, 4, Some(6))
    };
    let joined = SeedRecord::new();
    let mut group = MasterView {
        limit: cpu(6),
        seeds: [("demo".to_owned(), demo), ("other".to_owned(), joined)].into(),
    };
    let plan = group_plan(&group, 1, &cpu(0)).unwrap();
    assert!(plan.grants.is_empty(), "{plan:?}");
    // Without the rule, the 2 the group thinks free would go to demo: 10 used of 6.
    assert_eq!(
        group.plan_at(1, &cpu(0)).unwrap().grants.get("demo"),
        Some(&cpu(2))
    );
    // Once other reports its 4, nothing is free, and nothing is granted for that reason.
    group.seeds.get_mut("other").unwrap().report = seed(0, 4, None).report;
    assert!(group_plan(&group, 1, &cpu(0)).unwrap().grants.is_empty());
    // Once other uses 1 only, demo gets the 1 left.
    group.seeds.get_mut("other").unwrap().report = seed(0, 1, None).report;
    assert_eq!(
        group_plan(&group, 1, &cpu(0)).unwrap().grants.get("demo"),
        Some(&cpu(1))
    );
}

#[test]
fn the_members_that_hold_grants_back_are_named() {
    let epoch = crate::shares::master::epoch_start(1 << 32);
    let holding = |word: u64| {
        let mut member = seed(2, 2, None);
        member.report.as_mut().unwrap().holds = Some(MasterWord {
            version: word,
            ..MasterWord::default()
        });
        member
    };
    let mut group = MasterView {
        limit: cpu(6),
        seeds: [
            ("demo".to_owned(), holding(epoch)),
            ("other".to_owned(), SeedRecord::new()),
            ("third".to_owned(), holding(5)),
        ]
        .into(),
    };
    // other has not reported; third holds a word of the epoch before.
    assert_eq!(holding_back(&group, epoch + 1), ["other", "third"]);
    group.seeds.get_mut("other").unwrap().report = holding(epoch).report;
    group.seeds.get_mut("third").unwrap().report = holding(epoch).report;
    assert!(holding_back(&group, epoch + 1).is_empty());
}

#[test]
fn a_project_holds_what_its_seeds_hold_or_use_and_commits_what_they_commit() {
    // Seed a holds 6 and uses 2, seed b holds 1 and uses 3 (usage above its share).
    let p = project(16, vec![seed(6, 2, None), seed(1, 3, None)]);
    assert_eq!(member_held(&p, &cpu(32)).unwrap(), cpu(9));
    assert_eq!(member_committed(&p, &cpu(32)).unwrap(), cpu(5));
}

#[test]
fn a_project_asks_its_group_only_for_what_its_seeds_want_beyond_its_budget() {
    // Seed a uses 4 (holding 6), seed b wants 5: the project wants 9 of its group.
    let p = project(16, vec![seed(6, 4, None), seed(2, 2, Some(5))]);
    assert_eq!(member_demand(&p, &cpu(32), &cpu(6)).unwrap(), Some(cpu(9)));
    // Its budget covers it: nothing to ask (the project moves its own idle share).
    assert_eq!(member_demand(&p, &cpu(32), &cpu(9)).unwrap(), None);
    // No seed asks: nothing, even over budget (usage above a share asks for nothing).
    let p = project(16, vec![seed(4, 7, None)]);
    assert_eq!(member_demand(&p, &cpu(32), &cpu(4)).unwrap(), None);
}

#[test]
fn a_project_reports_what_its_seeds_hold_beyond_its_budget() {
    // Seeds hold 6 and 1, use 2 and 1.
    let p = project(16, vec![seed(6, 2, None), seed(1, 1, None)]);
    // Within a budget of 8: what they use, so the group may ask the idle share back.
    assert_eq!(member_report(&p, &cpu(32), &budget(8, 0, None)).unwrap(), cpu(3));
    // Joined with no budget yet: what they hold, which they may still spend.
    assert_eq!(
        member_report(&p, &cpu(32), &SeedShare::default()).unwrap(),
        cpu(7)
    );
}

#[test]
fn a_record_keeps_holdings_while_it_grants_nothing_and_the_most_its_members_could_hold_fits() {
    // Made over two busy projects with own limits of 6 and 8: neither has reported yet, and
    // together they could hold 14 of 10: nothing kept.
    let member = |ceiling: i64| SeedRecord {
        ceiling: cpu(ceiling),
        ..SeedRecord::new()
    };
    let mut group = MasterView {
        limit: cpu(10),
        seeds: [("demo".to_owned(), member(6)), ("other".to_owned(), member(8))].into(),
    };
    assert!(!holdings_kept(&group, 1).unwrap());
    // demo reports holding 2: 2 + other's 8 fit, so holdings are kept.
    group.seeds.get_mut("demo").unwrap().report = seed(0, 2, Some(2)).report;
    assert!(holdings_kept(&group, 1).unwrap());
    // Each is told what it was counted at: demo what it reported, other its own limit.
    let plan = group_plan(&group, 1, &cpu(0)).unwrap();
    assert!(plan.grants.is_empty());
    assert_eq!(plan.targets["demo"], cpu(2));
    assert_eq!(plan.targets["other"], cpu(8));
    // A member the group granted budget once plans within it: its target is the plan's.
    let mut granted = group.clone();
    granted.seeds.get_mut("demo").unwrap().granted = cpu(1);
    let plan = group_plan(&granted, 1, &cpu(0)).unwrap();
    assert_eq!(plan.targets["other"], cpu(8));
    assert_eq!(
        plan.targets["demo"],
        granted.plan_at(1, &cpu(0)).unwrap().targets["demo"]
    );
    // A member without a limit of its own could hold anything: nothing kept.
    group.seeds.get_mut("other").unwrap().ceiling = ResourceDetails::default();
    assert!(!holdings_kept(&group, 1).unwrap());
    group.seeds.get_mut("other").unwrap().ceiling = cpu(8);
    // demo reports holding 4 after all: 12 of 10, nothing kept.
    group.seeds.get_mut("demo").unwrap().report = seed(0, 4, Some(4)).report;
    assert!(!holdings_kept(&group, 1).unwrap());
    // other reports holding 7: 11 of 10 known, nothing kept either.
    group.seeds.get_mut("other").unwrap().report = seed(0, 7, Some(7)).report;
    assert!(!holdings_kept(&group, 1).unwrap());
    // Both reported and holding less: the group plans grants, so nothing is kept either.
    group.seeds.get_mut("other").unwrap().report = seed(0, 5, Some(5)).report;
    assert!(holding_back(&group, 1).is_empty());
    assert!(!holdings_kept(&group, 1).unwrap());
    // And the first plan grants each what it holds.
    let plan = group_plan(&group, 1, &cpu(0)).unwrap();
    assert!(plan.grants["demo"].amount(Resource::Cpu) >= Quantity::from_units(4));
    assert!(plan.grants["other"].amount(Resource::Cpu) >= Quantity::from_units(5));
}

#[test]
fn a_member_not_heard_from_is_counted_at_the_most_it_may_hold() {
    let member = |ceiling: i64| SeedRecord {
        ceiling: cpu(ceiling),
        ..SeedRecord::new()
    };
    let group = |a: SeedRecord| MasterView {
        limit: cpu(10),
        seeds: [("a".to_owned(), a), ("b".to_owned(), member(4))].into(),
    };
    // At its own limit: 5 + 4 fit.
    assert!(holdings_kept(&group(member(5)), 1).unwrap());
    // At the budget the record sees it hold where more (its own limit lowered since): 9 + 4.
    let mut budgeted = member(5);
    budgeted.granted = cpu(9);
    assert!(!holdings_kept(&group(budgeted), 1).unwrap());
    // At what an earlier word that kept counted it at, where more: 10 + 4.
    let mut counted = member(5);
    counted.counted = cpu(10);
    let view = group(counted);
    assert!(!holdings_kept(&view, 1).unwrap());
    // A round that does not keep never lowers that count: the member may act on that word.
    let plan = group_plan(&view, 1, &cpu(0)).unwrap();
    assert_eq!(plan.targets["a"], cpu(10));
    assert_eq!(plan.targets["b"], cpu(0));
}

#[test]
fn a_project_never_granted_budget_keeps_what_its_seeds_hold_while_the_record_says_so() {
    // Seeds hold 6 and 1, use 2 and 1; one asks for 3.
    let p = project(16, vec![seed(6, 2, None), seed(1, 1, Some(3))]);
    let held = member_held(&p, &cpu(32)).unwrap();
    assert_eq!(held, cpu(7));
    // No copy yet, or one granted nothing: it plans within what its seeds hold...
    assert_eq!(planning_budget(None, true, &held).capacity(&cpu(32)), cpu(7));
    let empty = budget(0, 0, None);
    assert_eq!(
        planning_budget(Some(&empty), true, &held).capacity(&cpu(32)),
        cpu(7)
    );
    // ... up to what the group counted it at (its word's target): its own limit was 5
    // then, and raised since.
    let counted = budget(0, 0, Some(5));
    assert_eq!(
        planning_budget(Some(&counted), true, &held).capacity(&cpu(32)),
        cpu(5)
    );
    // ... and asks for that (seed b's 3 fits in seed a's idle 4), or more where its seeds
    // ask for more than they hold (2 used on a, 9 asked on b).
    assert_eq!(first_demand(&p, &cpu(32)).unwrap(), Some(cpu(7)));
    let asking = project(16, vec![seed(6, 2, None), seed(1, 1, Some(9))]);
    assert_eq!(first_demand(&asking, &cpu(32)).unwrap(), Some(cpu(11)));
    // Not kept: within its budget, as before.
    assert_eq!(
        planning_budget(Some(&empty), false, &held).capacity(&cpu(32)),
        cpu(0)
    );
    assert_eq!(planning_budget(None, false, &held).capacity(&cpu(32)), cpu(0));
    // Granted budget once: within it, whatever the record says.
    let granted = budget(5, 0, None);
    assert_eq!(
        planning_budget(Some(&granted), true, &held).capacity(&cpu(32)),
        cpu(5)
    );
    // Holding and asking nothing: no demand.
    let idle = project(16, vec![seed(0, 0, None), seed(0, 0, None)]);
    assert_eq!(first_demand(&idle, &cpu(32)).unwrap(), None);
}

#[test]
fn a_first_budget_claims_no_more_than_the_seeds_hold() {
    let word = MasterWord {
        version: 7,
        granted: cpu(10),
        target: cpu(10),
        released: cpu(2),
    };
    // The word says 8 is this project's; its seeds hold 5: it claims 5.
    let share = first_budget(&word, &cpu(5));
    assert_eq!((share.share(), share.version), (cpu(5), 7));
    // Seeds holding more than the word leaves (never, but): the word's floor stands.
    assert_eq!(first_budget(&word, &cpu(9)).share(), cpu(8));
    // A new member: nothing granted, nothing claimed.
    let none = MasterWord {
        version: 1,
        ..MasterWord::default()
    };
    assert!(first_budget(&none, &cpu(3)).share().is_empty());
}

#[test]
fn a_project_releases_budget_its_seeds_do_not_hold() {
    let p = project(16, vec![seed(4, 3, None), seed(2, 2, None)]);
    // Budget 10, asked down to 5, seeds hold 6: 4 goes back, never what they hold.
    assert_eq!(
        member_release_due(&budget(10, 0, Some(5)), &cpu(32), &p, &cpu(1), false).unwrap(),
        cpu(4)
    );
    // Quiet: down to what they hold plus the slack.
    assert_eq!(
        member_release_due(&budget(10, 0, None), &cpu(32), &p, &cpu(1), true).unwrap(),
        cpu(3)
    );
    assert_eq!(
        member_release_due(&budget(10, 0, None), &cpu(32), &p, &cpu(1), false).unwrap(),
        cpu(0)
    );
}
