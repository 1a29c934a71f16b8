#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kkp_quota_crds::fixtures::cpu;
use kkp_quota_crds::{GroupMode, GroupOwner, QuotaGroupSpec, Resource, ResourceDetails};
use proptest::prelude::*;

use super::books::{Books, KkpEntry};
use super::decide::{Edit, Requester, Verdict, decide};

fn group(team: &str, cap: i64, mode: GroupMode) -> QuotaGroupSpec {
    QuotaGroupSpec {
        selector: LabelSelector {
            match_labels: Some(BTreeMap::from([("team".to_owned(), team.to_owned())])),
            ..LabelSelector::default()
        },
        quota: cpu(cap),
        mode,
        owners: Vec::new(),
    }
}

/// Projects `a`, `b` (team red) and `c` (team blue), each with a KKP quota of its name;
/// group `red` allocates 10 cpu.
fn books(a: i64, b: i64, c: i64) -> Books {
    let mut books = Books::default();
    for (project, team, limit) in [("a", "red", a), ("b", "red", b), ("c", "blue", c)] {
        books.projects.insert(
            project.to_owned(),
            BTreeMap::from([("team".to_owned(), team.to_owned())]),
        );
        books.kkp.insert(project.to_owned(), entry(project, limit));
    }
    books
        .groups
        .insert("red".to_owned(), group("red", 10, GroupMode::Allocation));
    books
}

fn entry(project: &str, limit: i64) -> KkpEntry {
    KkpEntry {
        project: project.to_owned(),
        limits: cpu(limit),
        leaving: false,
    }
}

/// Project `name`'s KKP quota `name` set to `limit` (`None`: deleted), from what `books` hold.
fn kkp(books: &Books, name: &str, limit: Option<i64>) -> Edit {
    Edit::Kkp {
        name: name.to_owned(),
        old: books.kkp.get(name).cloned(),
        new: limit.map(|l| entry(name, l)),
    }
}

fn admin() -> Requester {
    Requester {
        username: "admin".to_owned(),
        groups: vec!["system:masters".to_owned()],
    }
}

fn denied(verdict: Verdict) -> String {
    match verdict {
        Verdict::Denied(why) => why,
        Verdict::Allowed => panic!("allowed"),
    }
}

#[test]
fn a_raise_within_the_allocation_passes_and_one_beyond_it_is_refused() {
    let books = books(4, 4, 50);
    assert_eq!(
        decide(&books, &kkp(&books, "a", Some(6)), &admin()),
        Verdict::Allowed
    );
    let why = denied(decide(&books, &kkp(&books, "a", Some(7)), &admin()));
    assert_eq!(
        why,
        "quota group red allocates at most 10 cpu to its projects; with this edit they would be allocated 11 cpu (a 7, b 4)"
    );
    // Project c is in no allocation group: anything goes.
    assert_eq!(
        decide(&books, &kkp(&books, "c", Some(500)), &admin()),
        Verdict::Allowed
    );
}

#[test]
fn reductions_pass_even_in_a_group_over_its_allocation() {
    let books = books(8, 8, 0);
    assert_eq!(
        decide(&books, &kkp(&books, "a", Some(7)), &admin()),
        Verdict::Allowed
    );
    assert!(matches!(
        decide(&books, &kkp(&books, "a", Some(9)), &admin()),
        Verdict::Denied(_)
    ));
}

#[test]
fn a_project_quota_loosened_counts_as_a_raise() {
    let mut books = books(8, 2, 0);
    books.ours.insert("a".to_owned(), cpu(3));
    let ours = |limit: Option<i64>| Edit::Ours {
        name: "a".to_owned(),
        project: "a".to_owned(),
        old: Some(cpu(3)),
        new: limit.map(cpu),
    };
    // a is allocated 3 (its ProjectQuota is stricter than KKP's 8): room for 5 more.
    assert_eq!(decide(&books, &ours(Some(8)), &admin()), Verdict::Allowed);
    // Without the ProjectQuota, a gets KKP's 8: 10 in all, still fits.
    assert_eq!(decide(&books, &ours(None), &admin()), Verdict::Allowed);
    books.kkp.insert("a".to_owned(), entry("a", 9));
    let why = denied(decide(&books, &ours(None), &admin()));
    assert!(why.contains("would be allocated 11 cpu (a 9, b 2)"), "{why}");
    assert_eq!(decide(&books, &ours(Some(1)), &admin()), Verdict::Allowed);
}

#[test]
fn a_project_without_a_limit_makes_the_group_unbounded() {
    let mut books = books(2, 2, 0);
    books.kkp.remove("b");
    let why = denied(decide(&books, &kkp(&books, "a", Some(3)), &admin()));
    assert!(
        why.contains("would be allocated unlimited cpu (a 3, b unlimited)"),
        "{why}"
    );
    // Giving b a quota is a reduction.
    assert_eq!(
        decide(&books, &kkp(&books, "b", Some(100)), &admin()),
        Verdict::Allowed
    );
    // Deleting a's only quota leaves it unlimited: refused.
    let books = super::tests::books(2, 2, 0);
    let why = denied(decide(&books, &kkp(&books, "a", None), &admin()));
    assert!(why.contains("unlimited cpu (a unlimited, b 2)"), "{why}");
}

#[test]
fn a_second_quota_of_a_project_allocates_its_greater_limit() {
    let mut books = books(4, 4, 0);
    books.kkp.insert("a-extra".to_owned(), entry("a", 5));
    // a is allocated 5 now: 9 in all; a-extra raised to 6 fits, to 7 does not.
    let edit = |limit| Edit::Kkp {
        name: "a-extra".to_owned(),
        old: Some(entry("a", 5)),
        new: Some(entry("a", limit)),
    };
    assert_eq!(decide(&books, &edit(6), &admin()), Verdict::Allowed);
    assert!(matches!(decide(&books, &edit(7), &admin()), Verdict::Denied(_)));
    // Lowering a's first quota changes nothing: a-extra's 5 still applies.
    assert_eq!(
        decide(&books, &kkp(&books, "a", Some(1)), &admin()),
        Verdict::Allowed
    );
}

#[test]
fn shared_groups_check_nothing_and_the_most_restrictive_group_refuses() {
    let mut books = books(4, 4, 0);
    books
        .groups
        .insert("red".to_owned(), group("red", 10, GroupMode::Shared));
    assert_eq!(
        decide(&books, &kkp(&books, "a", Some(100)), &admin()),
        Verdict::Allowed
    );
    // A second group over a and c (label tier=gold) allocating 6.
    for p in ["a", "c"] {
        books
            .projects
            .get_mut(p)
            .unwrap()
            .insert("tier".to_owned(), "gold".to_owned());
    }
    let mut gold = group("red", 6, GroupMode::Allocation);
    gold.selector.match_labels = Some(BTreeMap::from([("tier".to_owned(), "gold".to_owned())]));
    books.groups.insert("gold".to_owned(), gold);
    books
        .groups
        .insert("red".to_owned(), group("red", 10, GroupMode::Allocation));
    // a at 6 fits red (10) but not gold (6 + c's 0 = 6 fits); at 7 gold refuses and red does not.
    assert_eq!(
        decide(&books, &kkp(&books, "a", Some(6)), &admin()),
        Verdict::Allowed
    );
    let why = denied(decide(&books, &kkp(&books, "a", Some(7)), &admin()));
    assert!(
        why.starts_with("quota group gold allocates at most 6 cpu"),
        "{why}"
    );
    // Both refuse at 11, each said.
    let why = denied(decide(&books, &kkp(&books, "a", Some(11)), &admin()));
    assert!(
        why.contains("quota group gold") && why.contains("quota group red"),
        "{why}"
    );
}

#[test]
fn owners_edit_only_their_groups_projects_and_no_group() {
    let mut books = books(4, 4, 4);
    let mut red = group("red", 10, GroupMode::Allocation);
    red.owners = vec![
        GroupOwner {
            kind: "User".to_owned(),
            name: "alice".to_owned(),
        },
        GroupOwner {
            kind: "Group".to_owned(),
            name: "red-admins".to_owned(),
        },
    ];
    books.groups.insert("red".to_owned(), red.clone());
    let alice = Requester {
        username: "alice".to_owned(),
        groups: Vec::new(),
    };
    let bob = Requester {
        username: "bob".to_owned(),
        groups: vec!["red-admins".to_owned()],
    };
    for who in [&alice, &bob] {
        assert_eq!(decide(&books, &kkp(&books, "a", Some(6)), who), Verdict::Allowed);
        assert!(matches!(
            decide(&books, &kkp(&books, "a", Some(7)), who),
            Verdict::Denied(_)
        ));
        let why = denied(decide(&books, &kkp(&books, "c", Some(1)), who));
        assert!(why.contains("project c is in none of them"), "{why}");
        let edit = Edit::Group {
            name: "red".to_owned(),
            old: Some(red.clone()),
            new: Some(group("red", 100, GroupMode::Allocation)),
        };
        // Groups are RBAC's to guard (the owner role cannot write them): an admin who is also
        // an owner is not locked out of the group that names them.
        assert_eq!(decide(&books, &edit, who), Verdict::Allowed);
    }
    // Someone else is not held to the group's projects.
    assert_eq!(
        decide(&books, &kkp(&books, "c", Some(1)), &admin()),
        Verdict::Allowed
    );
}

#[test]
fn a_group_may_not_allocate_less_than_its_projects_have_unless_the_edit_makes_it_no_worse() {
    let mut books = books(6, 6, 6);
    let create = |cap| Edit::Group {
        name: "new".to_owned(),
        old: None,
        new: Some(group("red", cap, GroupMode::Allocation)),
    };
    assert_eq!(decide(&books, &create(12), &admin()), Verdict::Allowed);
    let why = denied(decide(&books, &create(11), &admin()));
    assert_eq!(
        why,
        "quota group new would allocate at most 11 cpu, but its projects are allocated 12 cpu already (a 6, b 6): lower their quotas first"
    );
    // red (cap 10) is over already: raising its cap passes, lowering it or widening it does not.
    // What is stored is what the request's oldObject says.
    let edit = |old: &Books, spec| Edit::Group {
        name: "red".to_owned(),
        old: old.groups.get("red").cloned(),
        new: Some(spec),
    };
    assert_eq!(
        decide(
            &books,
            &edit(&books, group("red", 11, GroupMode::Allocation)),
            &admin()
        ),
        Verdict::Allowed
    );
    assert!(matches!(
        decide(
            &books,
            &edit(&books, group("red", 9, GroupMode::Allocation)),
            &admin()
        ),
        Verdict::Denied(_)
    ));
    let mut wider = group("red", 10, GroupMode::Allocation);
    wider.selector.match_labels = None;
    wider.selector.match_expressions = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
            key: "team".to_owned(),
            operator: "Exists".to_owned(),
            values: None,
        },
    ]);
    assert!(matches!(
        decide(&books, &edit(&books, wider), &admin()),
        Verdict::Denied(_)
    ));
    // Switching a shared group over its projects' allocation to allocation mode is refused.
    books
        .groups
        .insert("red".to_owned(), group("red", 10, GroupMode::Shared));
    assert!(matches!(
        decide(
            &books,
            &edit(&books, group("red", 10, GroupMode::Allocation)),
            &admin()
        ),
        Verdict::Denied(_)
    ));
    assert_eq!(
        decide(
            &books,
            &edit(&books, group("red", 10, GroupMode::Shared)),
            &admin()
        ),
        Verdict::Allowed
    );
    // Deleting a group always passes.
    let delete = Edit::Group {
        name: "red".to_owned(),
        old: books.groups.get("red").cloned(),
        new: None,
    };
    assert_eq!(decide(&books, &delete, &admin()), Verdict::Allowed);
}

/// One step of the property test: a project's KKP quota set to a limit (or deleted).
#[derive(Clone, Debug)]
struct Step {
    project: usize,
    limit: Option<i64>,
}

fn step() -> impl Strategy<Value = Step> {
    (0..3usize, proptest::option::weighted(0.9, 0..12i64))
        .prop_map(|(project, limit)| Step { project, limit })
}

proptest! {
    /// Whatever edits are tried, applying only the allowed ones never takes group red from within
    /// its allocation to above it, and a refused edit would have.
    #[test]
    fn allowed_edits_never_take_a_group_over_its_allocation(steps in proptest::collection::vec(step(), 1..40)) {
        let mut books = books(3, 3, 3);
        let red = books.groups["red"].clone();
        for step in steps {
            let name = ["a", "b", "c"][step.project];
            let edit = kkp(&books, name, step.limit);
            let verdict = decide(&books, &edit, &admin());
            let mut after = books.clone();
            match step.limit {
                Some(limit) => after.kkp.insert(name.to_owned(), entry(name, limit)),
                None => after.kkp.remove(name),
            };
            let fits = |b: &Books| {
                let (total, _) = b.group_allocation(&red);
                !super::books::above(total.get(Resource::Cpu), red.quota.get(Resource::Cpu))
            };
            let raises = super::books::above(
                after.allocated(name).get(Resource::Cpu),
                books.allocated(name).get(Resource::Cpu),
            );
            prop_assert_eq!(verdict == Verdict::Allowed, fits(&after) || !raises || name == "c");
            if verdict == Verdict::Allowed {
                books = after;
            }
            prop_assert!(fits(&books));
        }
    }
}

#[test]
fn sums_and_bounds() {
    let unbounded = ResourceDetails::default();
    let total = super::books::sum([&cpu(2), &cpu(3)]);
    assert_eq!(total.get(Resource::Cpu), cpu(5).get(Resource::Cpu));
    assert_eq!(super::books::sum([&cpu(2), &unbounded]).get(Resource::Cpu), None);
    assert_eq!(
        super::books::sum(std::iter::empty::<&ResourceDetails>()).get(Resource::Cpu),
        Some(kkp_quota_crds::Quantity::ZERO)
    );
}

/// A quota being deleted (kept by master-controller's finalizer meanwhile) limits nothing: the
/// project's other quota cannot then be deleted as if it still held the line, and the cleanup's
/// delete of its `ProjectQuota` loosens nothing.
#[test]
fn a_quota_being_deleted_limits_nothing() {
    let mut books = books(5, 5, 0);
    books.kkp.insert("a-extra".to_owned(), entry("a", 5));
    books.kkp.get_mut("a").unwrap().leaving = true;
    // a is held by a-extra alone: deleting it leaves a unlimited.
    let why = denied(decide(&books, &kkp(&books, "a-extra", None), &admin()));
    assert!(why.contains("unlimited cpu"), "{why}");
    books.ours.insert("a".to_owned(), cpu(1));
    let cleanup = Edit::Ours {
        name: "a".to_owned(),
        project: "a".to_owned(),
        old: Some(cpu(1)),
        new: None,
    };
    assert_eq!(decide(&books, &cleanup, &admin()), Verdict::Allowed);
    // A group whose cached spec is in allocation mode, but stored shared: switching it back is
    // judged from the stored spec (a create or a mode change is never "no worse").
    books.kkp.insert("b".to_owned(), entry("b", 9));
    let back = Edit::Group {
        name: "red".to_owned(),
        old: Some(group("red", 10, GroupMode::Shared)),
        new: Some(group("red", 10, GroupMode::Allocation)),
    };
    assert!(matches!(decide(&books, &back, &admin()), Verdict::Denied(_)));
}
