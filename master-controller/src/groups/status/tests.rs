//! Tests of the group status computation ([`super`]).
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kkp_quota_crds::fixtures::cpu;
use kkp_quota_crds::kkp::ProjectSpec;
use kkp_quota_crds::project_quota::SeedFigures;
use kkp_quota_crds::quota_ledger::LedgerSubject;
use kkp_quota_crds::{GroupMode, ProjectQuotaSpec, ProjectQuotaStatus};

use super::*;

fn project(name: &str, team: &str) -> Project {
    let mut project = Project::new(name, ProjectSpec::default());
    project.metadata.labels = Some(BTreeMap::from([("team".to_owned(), team.to_owned())]));
    project
}

fn quota(project: &str, seeds: &[(&str, i64, bool)]) -> ProjectQuota {
    let mut quota = ProjectQuota::new(
        &format!("project-{project}"),
        ProjectQuotaSpec {
            subject: LedgerSubject::project(project),
            quota: ResourceDetails::default(),
            rollout_allowance: None,
            reserved_counts: false,
        },
    );
    let total: i64 = seeds.iter().map(|(_, n, _)| n).sum();
    quota.status = Some(ProjectQuotaStatus {
        global_usage: Some(cpu(total)),
        seeds: seeds
            .iter()
            .map(|(name, n, stale)| SeedFigures {
                name: (*name).to_owned(),
                usage: Some(cpu(*n)),
                stale: *stale,
                ..SeedFigures::default()
            })
            .collect(),
        ..ProjectQuotaStatus::default()
    });
    quota
}

/// A shared group's status: nothing allocated, no webhook.
fn shown<'a>(
    spec: &QuotaGroupSpec,
    projects: impl IntoIterator<Item = &'a Project>,
    quotas: impl IntoIterator<Item = &'a ProjectQuota>,
) -> (QuotaGroupStatus, Vec<Desired>) {
    desired(spec, projects, quotas, &ResourceDetails::default(), false).unwrap()
}

fn group(team: &str, limit: i64) -> QuotaGroupSpec {
    QuotaGroupSpec {
        selector: LabelSelector {
            match_labels: Some(BTreeMap::from([("team".to_owned(), team.to_owned())])),
            ..LabelSelector::default()
        },
        quota: cpu(limit),
        mode: GroupMode::Shared,
        owners: Vec::new(),
    }
}

fn find<'a>(conditions: &'a [Desired], type_: &str) -> &'a Desired {
    conditions.iter().find(|c| c.type_ == type_).unwrap()
}

#[test]
fn the_selected_projects_usage_is_summed_by_project_and_by_seed() {
    let projects = [project("a", "red"), project("b", "red"), project("c", "blue")];
    let quotas = [
        quota("a", &[("seed-1", 2, false), ("seed-2", 1, false)]),
        quota("b", &[("seed-1", 4, false)]),
        quota("c", &[("seed-1", 8, false)]),
    ];
    let (status, conditions) = shown(&group("red", 10), &projects, &quotas);
    assert_eq!(status.projects, ["a", "b"]);
    assert_eq!(status.project_count, 2);
    assert_eq!(
        status.usage.unwrap().amount(kkp_quota_crds::Resource::Cpu),
        kkp_quota_crds::Quantity::from_units(7)
    );
    assert_eq!(
        status.by_project,
        [
            NamedUsage {
                name: "a".into(),
                usage: cpu(3)
            },
            NamedUsage {
                name: "b".into(),
                usage: cpu(4)
            }
        ]
    );
    assert_eq!(
        status.by_seed,
        [
            NamedUsage {
                name: "seed-1".into(),
                usage: cpu(6)
            },
            NamedUsage {
                name: "seed-2".into(),
                usage: cpu(1)
            }
        ]
    );
    assert!(!find(&conditions, QUOTA_EXCEEDED).status);
    assert!(find(&conditions, ENFORCED).status, "a shared group keeps budgets");
    assert_eq!(find(&conditions, ENFORCED).reason, "BudgetsKept");
    assert_eq!(
        status.reserved, None,
        "no member reports capacity reserved for autoscalers"
    );
    let (_, over) = shown(&group("red", 6), &projects, &quotas);
    let exceeded = find(&over, QUOTA_EXCEEDED);
    assert!(exceeded.status);
    assert!(
        exceeded.message.contains("7 cpu used of 6 cpu"),
        "{}",
        exceeded.message
    );
}

/// What the members' autoscalers may still add is summed apart from their usage.
#[test]
fn the_members_reserved_capacity_is_shown_beside_their_usage() {
    let projects = [project("a", "red"), project("b", "red"), project("c", "blue")];
    let mut quotas = [
        quota("a", &[("seed-1", 2, false)]),
        quota("b", &[("seed-1", 4, false)]),
        quota("c", &[("seed-1", 8, false)]),
    ];
    for (quota, reserved) in quotas.iter_mut().zip([Some(6), None, Some(100)]) {
        if let Some(status) = quota.status.as_mut() {
            status.reserved = reserved.map(cpu);
        }
    }
    let (status, conditions) = shown(&group("red", 10), &projects, &quotas);
    let amount = |d: Option<ResourceDetails>| d.map(|d| d.amount(kkp_quota_crds::Resource::Cpu));
    assert_eq!(
        amount(status.reserved),
        Some(kkp_quota_crds::Quantity::from_units(6))
    );
    assert_eq!(
        amount(status.usage),
        Some(kkp_quota_crds::Quantity::from_units(6))
    );
    assert!(!find(&conditions, QUOTA_EXCEEDED).status, "reserved is not usage");
}

#[test]
fn stale_seeds_uncounted_projects_and_a_bad_selector_are_said() {
    let projects = [project("a", "red"), project("b", "red")];
    let quotas = [quota("a", &[("seed-1", 2, true)])];
    let (status, conditions) = shown(&group("red", 10), &projects, &quotas);
    assert_eq!(status.projects, ["a", "b"]);
    assert_eq!(
        status.usage.unwrap().amount(kkp_quota_crds::Resource::Cpu),
        kkp_quota_crds::Quantity::from_units(2)
    );
    assert!(find(&conditions, SEEDS_STALE).message.contains("seed-1"));
    let uncounted = find(&conditions, PROJECTS_UNCOUNTED);
    assert!(
        uncounted.status && uncounted.message.contains("projects b have no quota"),
        "{uncounted:?}"
    );
    assert!(!find(&conditions, SELECTOR_INVALID).status);

    let mut bad = group("red", 10);
    bad.selector.match_expressions = Some(vec![LabelSelectorRequirement {
        key: "team".into(),
        operator: "Near".into(),
        values: None,
    }]);
    let (status, conditions) = shown(&bad, &projects, &quotas);
    assert!(status.projects.is_empty());
    assert!(find(&conditions, SELECTOR_INVALID).status);
    // Every type is there either way, so nothing of one state is left over in the other.
    let (_, valid) = shown(&group("red", 10), &projects, &quotas);
    for type_ in [
        ENFORCED,
        QUOTA_EXCEEDED,
        SEEDS_STALE,
        PROJECTS_UNCOUNTED,
        SELECTOR_INVALID,
    ] {
        find(&conditions, type_);
        find(&valid, type_);
    }
    assert!(!find(&conditions, SEEDS_STALE).status);
}

#[test]
fn members_holding_grants_back_are_named() {
    let held = ["other".to_owned()];
    let said = grants_held(Some(&held));
    assert!(said.status, "{said:?}");
    assert!(
        said.message.contains("until projects other report"),
        "{}",
        said.message
    );
    assert!(!grants_held(Some(&[])).status);
    assert_eq!(grants_held(None).reason, "NoBudgets");
}

#[test]
fn a_projects_usage_comes_from_its_quota_in_force() {
    let projects = [project("a", "red")];
    // Two quotas of one project: the first by name is not in force; the other is.
    let mut not_in_force = quota("a", &[("seed-1", 9, false)]);
    not_in_force.metadata.name = Some("a-first".into());
    if let Some(status) = not_in_force.status.as_mut() {
        status.conditions = crate::status::merge_conditions(
            &[],
            &[crate::status::not_in_force("a", "project-a")],
            None,
            jiff::Timestamp::UNIX_EPOCH,
        );
    }
    let in_force = quota("a", &[("seed-1", 2, false)]);
    let (status, _) = shown(&group("red", 10), &projects, &[not_in_force, in_force.clone()]);
    assert_eq!(status.by_project[0].usage, cpu(2));
    // Its quota in force without usage yet: uncounted, and said so.
    let mut fresh = in_force;
    fresh.status = None;
    let (status, conditions) = shown(&group("red", 10), &projects, &[fresh]);
    assert!(status.by_project.is_empty());
    let uncounted = find(&conditions, PROJECTS_UNCOUNTED);
    assert_eq!(uncounted.reason, "UsageUnknown");
    assert!(
        uncounted.message.contains("projects a have no usage yet"),
        "{uncounted:?}"
    );
}

#[test]
fn only_usage_figures_may_wait_for_the_paced_write() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    let base = QuotaGroupStatus {
        projects: vec!["a".into()],
        project_count: 1,
        usage: Some(cpu(1)),
        by_project: vec![NamedUsage {
            name: "a".into(),
            usage: cpu(1),
        }],
        ..QuotaGroupStatus::default()
    };
    let mut more = base.clone();
    more.usage = Some(cpu(2));
    more.by_project[0].usage = cpu(2);
    more.by_seed = vec![NamedUsage {
        name: "seed-a".into(),
        usage: cpu(2),
    }];
    more.reserved = Some(cpu(1));
    assert!(figures_only(&base, &more));
    // A member's usage going down is written at once (the seeds refuse by it).
    assert!(!figures_only(&more, &base));
    let mut gone = more.clone();
    gone.by_project.clear();
    gone.usage = None;
    assert!(!figures_only(&more, &gone));
    let mut joined = more.clone();
    joined.projects.push("b".into());
    joined.project_count = 2;
    assert!(!figures_only(&base, &joined));
    let mut record = more.clone();
    record.budgets = Some(kkp_quota_crds::quota_group::BudgetRecord::default());
    assert!(!figures_only(&base, &record));
    let mut allocated = more.clone();
    allocated.allocated = Some(cpu(3));
    assert!(!figures_only(&base, &allocated));
    let mut over = more;
    over.conditions = vec![Condition {
        type_: QUOTA_EXCEEDED.into(),
        status: "True".into(),
        reason: "Over".into(),
        message: String::new(),
        last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
        observed_generation: None,
    }];
    assert!(!figures_only(&base, &over));
}
