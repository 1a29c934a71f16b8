//! The decision under per-seed shares (docs/shares.md) and the shared groups that bound them
//! (docs/groups.md).

use kkp_quota_crds::LedgerGroup;

use super::*;

fn with_share(mut s: QuotaState, capacity: &str, others: &[(&str, &str)]) -> QuotaState {
    s.seed = Some(SeedCapacity {
        capacity: cpu(capacity),
        others: others.iter().map(|(n, c)| ((*n).to_owned(), cpu(c))).collect(),
    });
    s
}

#[test]
fn under_shares_a_request_must_fit_the_seeds_capacity_too() {
    // 16 cpu quota, 2 used here, the seed may commit 4, seed-b holds 10.
    let s = with_share(state(cpu("16"), cpu("2")), "4", &[("seed-b", "10")]);
    assert!(decide("p", Some(&s), &create("m", cpu("2"))).allowed);
    let v = decide("p", Some(&s), &create("m", cpu("3")));
    assert_eq!(v.reason, Reason::ShareInTransit);
    assert!(!v.allowed);
    assert_eq!(v.wants_share, Some(cpu("5")));
    assert_eq!(
        v.message.as_deref(),
        Some(
            r#"machine "m" cannot be admitted yet: project "p" uses 2 of 16 cpu, and the rest of the quota is held by seed "seed-b" (10 cpu); it is being moved to this seed, so trying again in a few seconds will succeed"#
        )
    );
    // Over the quota itself: a real denial, whatever the share.
    let v = decide("p", Some(&s), &create("m", cpu("15")));
    assert_eq!(v.reason, Reason::QuotaExceeded);
    assert_eq!(v.wants_share, None);
}

#[test]
fn a_dry_run_waiting_for_share_is_answered_as_the_create_would_end() {
    // The seed may commit 4 of 16 (2 used here): a 3-cpu dry run fits the quota, not the share.
    let s = with_share(state(cpu("16"), cpu("2")), "4", &[("seed-b", "10")]);
    let dry = Request {
        dry_run: true,
        subject: Subject::Machine,
        ..create("m", cpu("3"))
    };
    let v = decide("p", Some(&s), &dry);
    assert!(v.allowed, "{v:?}");
    assert_eq!(
        (v.reason, &v.wants_share, &v.reserve),
        (Reason::Fits, &None, &None)
    );
    assert_eq!(v.warnings[0], messages::DRY_RUN_ROOM_ELSEWHERE);
    assert!(
        v.warnings[1].contains("4 Machines of this size (3 cpu) fit"),
        "{v:?}"
    );
    // Over the quota itself it is refused like the create.
    let too_big = Request {
        dry_run: true,
        subject: Subject::Machine,
        ..create("m", cpu("15"))
    };
    assert_eq!(decide("p", Some(&s), &too_big).reason, Reason::QuotaExceeded);
}

#[test]
fn a_batch_asks_for_every_waiting_request_together() {
    let s = with_share(state(cpu("16"), cpu("0")), "2", &[]);
    let requests: Vec<Request> = (0..4).map(|i| create(&format!("m{i}"), cpu("1"))).collect();
    let verdicts = decide_batch("p", Some(&s), &requests);
    let allowed = verdicts.iter().filter(|v| v.allowed).count();
    assert_eq!(allowed, 2);
    assert_eq!(verdicts[2].wants_share, Some(cpu("3")));
    assert_eq!(verdicts[3].wants_share, Some(cpu("4")));
    assert!(
        verdicts[3]
            .message
            .as_deref()
            .unwrap()
            .contains("not been granted to this seed yet")
    );
}

#[test]
fn a_share_never_admits_into_room_other_seeds_already_use() {
    // Limit 10; this seed holds a share of 8 and uses nothing, but another seed uses 6, beyond
    // its own share (a catalog edit made its Machines bigger). Only 4 fit here.
    let mut ledger = QuotaLedger::new(
        "project-p",
        QuotaLedgerSpec {
            rollout_allowance: None,
            subject: LedgerSubject::project("p"),
            quota: cpu("10"),
            shares: Some(kkp_quota_crds::quota_ledger::LedgerShares {
                version: 2,
                granted: cpu("8"),
                target: cpu("8"),
                ..kkp_quota_crds::quota_ledger::LedgerShares::default()
            }),
            reserved_counts: false,
        },
    );
    ledger.status = Some(QuotaLedgerStatus {
        local_usage: Some(cpu("0")),
        other_seeds_usage: Some(cpu("6")),
        ..QuotaLedgerStatus::default()
    });
    let s = QuotaState::from_copy(&ledger).unwrap();
    assert_eq!(s.seed.as_ref().unwrap().capacity, cpu("4"));
    assert!(decide("p", Some(&s), &create("m", cpu("4"))).allowed);
    let v = decide("p", Some(&s), &create("m", cpu("5")));
    assert!(!v.allowed);
    assert_eq!(v.reason, Reason::QuotaExceeded);
    // The allotments take their room from the same capacity.
    assert_eq!(s.allotment_room(&ResourceDetails::default()).unwrap(), cpu("2"));
}

fn group(name: &str, quota: &str, others_usage: &str) -> LedgerGroup {
    LedgerGroup {
        name: name.into(),
        quota: cpu(quota),
        others_usage: cpu(others_usage),
        others_held: ResourceDetails::default(),
    }
}

/// [`group`], its other projects holding `held` of it as budget.
fn group_held(name: &str, quota: &str, others_usage: &str, held: &str) -> LedgerGroup {
    LedgerGroup {
        others_held: cpu(held),
        ..group(name, quota, others_usage)
    }
}

/// Project limit 16, 2 used here; the seed may commit 4 and seed-b holds 10.
fn grouped(groups: Vec<LedgerGroup>) -> QuotaState {
    QuotaState {
        groups,
        ..with_share(state(cpu("16"), cpu("2")), "4", &[("seed-b", "10")])
    }
}

#[test]
fn a_full_group_refuses_once_the_share_wait_ends_and_names_the_group() {
    // The group's other projects use 7 of its 10: with this project's 2, 3 more do not fit.
    let s = grouped(vec![group("acme", "10", "7")]);
    let v = decide("p", Some(&s), &create("m", cpu("3")));
    assert_eq!((v.allowed, v.reason), (false, Reason::QuotaExceeded));
    assert_eq!(
        v.message.as_deref(),
        Some(
            r#"machine "m" needs 3 cpu, project "p" is within its own quota, but group "acme" uses 9 of 10 cpu"#
        )
    );
    assert_eq!(
        v.event_message.as_deref(),
        Some(
            r#"a Machine needs 3 cpu, project "p" is within its own quota, but group "acme" uses 9 of 10 cpu"#
        )
    );
    // The demand still goes to the master: figures gone stale are refreshed, room moved here;
    // and the request waits for it as for share in transit (the figures lag the budgets), this
    // verdict its answer only once the wait ends.
    assert_eq!(v.wants_share, Some(cpu("5")));
    assert!(v.waits_for_share());
    let over_own = decide("p", Some(&grouped(Vec::new())), &create("m", cpu("15")));
    assert!(
        !over_own.allowed && !over_own.waits_for_share(),
        "over its own quota: at once"
    );
    // A dry run is refused the same way, at once: it never waits (nor asks for share).
    let dry = Request {
        dry_run: true,
        ..create("m", cpu("3"))
    };
    assert_eq!(decide("p", Some(&s), &dry).reason, Reason::QuotaExceeded);
    // A growth says how much more.
    let grow = Request {
        ask: Ask::Update {
            old: Some(cpu("1")),
            new: cpu("4"),
        },
        ..create("m", cpu("0"))
    };
    assert!(
        decide("p", Some(&s), &grow)
            .message
            .unwrap()
            .contains("needs 3 more cpu, project \"p\" is within its own quota")
    );
}

#[test]
fn the_share_decides_and_the_group_figures_only_name_the_refusal() {
    // What fits the seed's share is admitted even where the group's figures (as last carried)
    // say it is full: the share already lies within the project's part of the group.
    let full = grouped(vec![group("acme", "10", "8")]);
    assert!(decide("p", Some(&full), &create("m", cpu("2"))).allowed);
    // A group with room: the request waits for share, as without one.
    let roomy = grouped(vec![group("acme", "20", "7")]);
    let v = decide("p", Some(&roomy), &create("m", cpu("3")));
    assert_eq!(v.reason, Reason::ShareInTransit);
    // Its words name the group, and promise nothing: the group's other projects may be using
    // the room (as the benchmark's 100-project group showed: "will succeed", then refused).
    let message = v.message.unwrap();
    assert!(
        message.contains(r#"bounded by group "acme" (9 of 20 cpu as last counted)"#)
            && message.ends_with("trying again in a few seconds may succeed"),
        "{message}"
    );
    // Without a group, the share is being moved to this seed, and a retry will pass.
    let alone = with_share(state(cpu("16"), cpu("2")), "4", &[("seed-b", "10")]);
    let message = decide("p", Some(&alone), &create("m", cpu("3"))).message.unwrap();
    assert!(
        message.ends_with("so trying again in a few seconds will succeed"),
        "{message}"
    );
    // Over the project's own quota, the project is named, whatever the groups.
    let v = decide("p", Some(&full), &create("m", cpu("15")));
    assert_eq!(v.reason, Reason::QuotaExceeded);
    assert!(v.message.unwrap().contains(r#"project "p" uses 2 of 16 cpu"#));
}

#[test]
fn a_request_denied_for_share_names_the_groups_whose_budget_others_hold() {
    let refused = |v: &Verdict| -> Vec<(String, Resource)> {
        v.group_denials().map(|(g, r)| (g.to_owned(), r)).collect()
    };
    // The group has room by what is used (7 of 20 beside this project's 2), but its other
    // projects hold 16 of it as budget: 3 more do not fit beside their 16 and this project's 2.
    let held = grouped(vec![
        group_held("acme", "20", "7", "16"),
        group_held("roomy", "100", "0", "10"),
    ]);
    let v = decide("p", Some(&held), &create("m", cpu("3")));
    assert_eq!(
        v.reason,
        Reason::ShareInTransit,
        "it still waits: the budget may move"
    );
    assert_eq!(refused(&v), vec![("acme".to_owned(), Resource::Cpu)]);
    let message = v.message.unwrap();
    assert!(
        message
            .contains(r#"group "acme" (9 of 20 cpu as last counted; its other projects hold 16 cpu of it)"#)
            && message.ends_with("trying again in a few seconds may succeed"),
        "{message}"
    );
    // Held budget that leaves room names no group.
    let room = grouped(vec![group_held("acme", "20", "7", "15")]);
    let v = decide("p", Some(&room), &create("m", cpu("3")));
    assert_eq!((v.reason, refused(&v)), (Reason::ShareInTransit, vec![]));
    // Within the seed's share, nothing is refused whatever the others hold.
    assert!(decide("p", Some(&held), &create("m", cpu("2"))).allowed);
}

#[test]
fn every_full_group_is_named() {
    let s = grouped(vec![
        group("acme", "10", "7"),
        group("roomy", "100", "0"),
        group("team", "6", "2"),
    ]);
    let v = decide("p", Some(&s), &create("m", cpu("3")));
    assert_eq!(
        v.message.as_deref(),
        Some(
            r#"machine "m" needs 3 cpu, project "p" is within its own quota, but group "acme" uses 9 of 10 cpu and group "team" uses 4 of 6 cpu"#
        )
    );
}

#[test]
fn the_ledger_carries_the_groups_to_the_decision() {
    let mut ledger = QuotaLedger::new(
        "project-p",
        QuotaLedgerSpec {
            rollout_allowance: None,
            subject: LedgerSubject::project("p"),
            quota: cpu("16"),
            shares: Some(kkp_quota_crds::quota_ledger::LedgerShares {
                version: 2,
                granted: cpu("4"),
                target: cpu("4"),
                groups: vec![group("acme", "10", "7")],
                ..kkp_quota_crds::quota_ledger::LedgerShares::default()
            }),
            reserved_counts: false,
        },
    );
    ledger.status = Some(QuotaLedgerStatus {
        local_usage: Some(cpu("2")),
        other_seeds_usage: Some(cpu("0")),
        ..QuotaLedgerStatus::default()
    });
    let s = QuotaState::from_copy(&ledger).unwrap();
    assert_eq!(s.groups, vec![group("acme", "10", "7")]);
    assert_eq!(
        decide("p", Some(&s), &create("m", cpu("3"))).reason,
        Reason::QuotaExceeded
    );
}

#[test]
fn the_verdict_says_which_groups_refused_and_for_what() {
    use crate::decision::autoscaled::{Autoscaled, Change};
    let refused = |v: &Verdict| -> Vec<(String, Resource)> {
        v.group_denials().map(|(g, r)| (g.to_owned(), r)).collect()
    };
    let s = grouped(vec![
        group("acme", "10", "7"),
        group("roomy", "100", "0"),
        group("team", "6", "2"),
    ]);
    // A Machine's create and its growth: both groups named, the roomy one not.
    let both = vec![
        ("acme".to_owned(), Resource::Cpu),
        ("team".to_owned(), Resource::Cpu),
    ];
    assert_eq!(refused(&decide("p", Some(&s), &create("m", cpu("3")))), both);
    let grow = Request {
        ask: Ask::Update {
            old: Some(cpu("1")),
            new: cpu("4"),
        },
        ..create("m", cpu("0"))
    };
    assert_eq!(refused(&decide("p", Some(&s), &grow)), both);
    // None named: admitted within the share, waiting for share beside a roomy group, or over
    // the project's own quota.
    assert_eq!(refused(&decide("p", Some(&s), &create("m", cpu("2")))), []);
    let roomy = grouped(vec![group("roomy", "100", "0")]);
    let waits = decide("p", Some(&roomy), &create("m", cpu("3")));
    assert_eq!((waits.reason, refused(&waits)), (Reason::ShareInTransit, vec![]));
    let own = decide("p", Some(&s), &create("m", cpu("15")));
    assert_eq!((own.reason, refused(&own)), (Reason::QuotaExceeded, vec![]));
    // A `Cluster`'s create: the group has no room for another cluster.
    let clusters = |n: &str| details(&[(Resource::Clusters, n)]);
    let cluster_state = QuotaState {
        seed: Some(SeedCapacity {
            capacity: clusters("1"),
            others: std::collections::BTreeMap::new(),
        }),
        groups: vec![LedgerGroup {
            name: "acme".into(),
            quota: clusters("3"),
            others_usage: clusters("2"),
            others_held: ResourceDetails::default(),
        }],
        ..state(clusters("5"), clusters("1"))
    };
    let cluster = Request {
        subject: Subject::Cluster,
        ..create("c1", ResourceDetails::one_cluster())
    };
    let v = decide("p", Some(&cluster_state), &cluster);
    assert_eq!(v.reason, Reason::QuotaExceeded, "{v:?}");
    assert_eq!(refused(&v), [("acme".to_owned(), Resource::Clusters)]);
    // An autoscaled MachineDeployment's create under `reservedCounts`: its room is the growth.
    let deployment = Request {
        subject: Subject::Deployment,
        autoscaled: Some(Autoscaled::Change(Box::new(Change {
            cluster: "c".into(),
            deployment: "d".into(),
            old: None,
            old_version: None,
            new: (3, cpu("1")),
        }))),
        ..create("workers", cpu("1"))
    };
    let autoscaled = QuotaState {
        reserved_counts: true,
        ..grouped(vec![group("acme", "10", "7")])
    };
    let v = decide("p", Some(&autoscaled), &deployment);
    assert_eq!(v.reason, Reason::QuotaExceeded, "{v:?}");
    assert_eq!(refused(&v), [("acme".to_owned(), Resource::Cpu)]);
}
