//! The decision under the policy `reservedCounts`: autoscaled deployments' room (docs/capacity.md).

use kkp_quota_crds::autoscaled::AutoscaledDeployment;

use super::*;
use crate::decision::autoscaled::{Autoscaled, Change, Member};

/// Limit 8 cpu; deployment `d` (max 4 of 2 cpu) has one member: its room of 6 counts, 8 used.
fn full() -> QuotaState {
    QuotaState {
        limit: cpu("8"),
        local_usage: cpu("8"),
        reserved_counts: true,
        autoscaled: vec![AutoscaledDeployment {
            cluster: "c".into(),
            uid: "d".into(),
            name: "kube-system/workers".into(),
            max: 4,
            size: cpu("2"),
            members: cpu("2"),
        }],
        ..QuotaState::default()
    }
}

fn member(name: &str) -> Request {
    Request {
        autoscaled: Some(Autoscaled::Member(Box::new(Member {
            cluster: "c".into(),
            deployment: "d".into(),
            max: 4,
            template: cpu("2"),
        }))),
        ..create(name, cpu("2"))
    }
}

fn change(old_max: u32, new_max: u32) -> Request {
    Request {
        subject: Subject::Deployment,
        autoscaled: Some(Autoscaled::Change(Box::new(Change {
            cluster: "c".into(),
            deployment: "d".into(),
            old: Some((old_max, cpu("2"))),
            old_version: Some("7".into()),
            new: (new_max, cpu("2")),
        }))),
        ..create("workers", cpu("2"))
    }
}

#[test]
fn the_autoscalers_machines_come_from_the_room_at_a_full_quota() {
    let requests = [
        member("m1"),
        create("other", cpu("1")),
        member("m2"),
        member("m3"),
        member("m4"),
    ];
    let verdicts = decide_batch("p", Some(&full()), &requests);
    let allowed: Vec<bool> = verdicts.iter().map(|v| v.allowed).collect();
    assert_eq!(
        allowed,
        [true, false, true, true, false],
        "room for 3; the rest is full"
    );
    let reserve = verdicts[0].reserve.clone().unwrap();
    assert!(reserve.reserved.is_empty(), "adds nothing: its room is counted");
    assert_eq!(reserve.deployment.as_deref(), Some("d"));
    assert_eq!(verdicts[1].reason, Reason::QuotaExceeded);
    // Over the limit (the policy turned on with rooms that do not fit): nothing from them.
    let over = QuotaState {
        local_usage: cpu("9"),
        ..full()
    };
    assert_eq!(
        decide("p", Some(&over), &member("m1")).reason,
        Reason::QuotaExceeded
    );
    // Policy off: the same Machine is a Machine.
    let off = QuotaState {
        reserved_counts: false,
        ..full()
    };
    assert_eq!(
        decide("p", Some(&off), &member("m1")).reason,
        Reason::QuotaExceeded
    );
}

#[test]
fn a_raise_of_max_is_checked_and_reserved_a_lowering_is_not() {
    let raise = decide("p", Some(&full()), &change(4, 6));
    assert!(!raise.allowed);
    assert_eq!(raise.reason, Reason::QuotaExceeded);
    let message = raise.message.unwrap();
    assert!(
        message.starts_with("machinedeployment \"workers\" cannot grow to its max size: needs 4 more cpu"),
        "{message}"
    );
    assert!(message.contains("lower its max size"), "{message}");
    let lower = decide("p", Some(&full()), &change(4, 2));
    assert_eq!(
        (lower.allowed, lower.reason, lower.reserve),
        (true, Reason::Reduction, None)
    );
    let roomy = QuotaState {
        limit: cpu("12"),
        ..full()
    };
    let raise = decide("p", Some(&roomy), &change(4, 6));
    assert!(raise.allowed);
    let reserve = raise.reserve.unwrap();
    assert_eq!(
        (reserve.uid.as_deref(), reserve.deployment.as_deref()),
        (Some("d@7"), Some("d"))
    );
    assert_eq!(reserve.reserved, cpu("4"));
    assert_eq!(
        reserve.size,
        cpu("12"),
        "recorded at its nominal size: 6 of 2 cpu"
    );
    let off = QuotaState {
        reserved_counts: false,
        ..full()
    };
    assert_eq!(decide("p", Some(&off), &change(4, 6)).reason, Reason::Unchanged);
}
