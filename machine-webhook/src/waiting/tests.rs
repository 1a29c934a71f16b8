use super::*;
use kkp_quota_crds::Resource;

use kkp_quota_crds::fixtures::cpu;

fn owner(name: &str) -> Owner {
    Owner {
        cluster: "alpha".into(),
        namespace: "kube-system".into(),
        api_version: "cluster.k8s.io/v1alpha1".into(),
        kind: "MachineSet".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
    }
}

use kkp_quota_crds::fixtures::at;

/// What `decide_batch` answers with `free` cpu of room: each size fits beside the ones before it
/// that fitted.
fn room(free: i64) -> impl FnOnce(&[ResourceDetails]) -> Vec<RoomNow> {
    move |sizes| {
        let mut left = free;
        sizes
            .iter()
            .map(|size| {
                let need = i64::try_from(size.amount(Resource::Cpu).ceil_units()).unwrap();
                if need <= left {
                    left -= need;
                    RoomNow::Fits
                } else {
                    RoomNow::NoRoom
                }
            })
            .collect()
    }
}

fn names(owners: &[Owner]) -> Vec<&str> {
    owners.iter().map(|o| o.name.as_str()).collect()
}

#[test]
fn nothing_is_woken_while_nothing_fits() {
    let mut waiting = Waiting::new(WakeConfig::default());
    waiting.refused(owner("a"), "demo", cpu(2), Refusal::NoRoom, at(0));
    assert!(waiting.to_wake("demo", at(1), room(1)).is_empty());
    assert!(waiting.to_wake("demo", at(2), room(0)).is_empty());
    assert_eq!(waiting.projects(), BTreeSet::from(["demo".to_owned()]));
    assert_eq!(names(&waiting.to_wake("demo", at(3), room(2))), ["a"]);
}

#[test]
fn oldest_refusal_first_and_only_as_many_as_fit() {
    let mut waiting = Waiting::new(WakeConfig::default());
    waiting.refused(owner("small-old"), "demo", cpu(2), Refusal::NoRoom, at(0));
    waiting.refused(owner("big"), "demo", cpu(8), Refusal::NoRoom, at(1));
    waiting.refused(owner("small-new"), "demo", cpu(2), Refusal::NoRoom, at(2));
    waiting.refused(owner("third"), "demo", cpu(2), Refusal::NoRoom, at(3));
    // 4 cpu of room: the two oldest 2-cpu owners fit, the 8-cpu one does not, and the last
    // small one no longer fits beside the first two.
    assert_eq!(
        names(&waiting.to_wake("demo", at(5), room(4))),
        ["small-old", "small-new"]
    );
    // The rest still wait.
    assert_eq!(names(&waiting.to_wake("demo", at(6), room(10))), ["big", "third"]);
}

#[test]
fn an_owner_is_woken_once_per_refusal_and_not_twice_within_the_gap() {
    let config = WakeConfig {
        min_gap: Duration::from_secs(10),
        ..WakeConfig::default()
    };
    let mut waiting = Waiting::new(config);
    waiting.refused(owner("a"), "demo", cpu(2), Refusal::NoRoom, at(0));
    assert_eq!(names(&waiting.to_wake("demo", at(1), room(4))), ["a"]);
    // Not refused again: room alone wakes nothing more.
    assert!(waiting.to_wake("demo", at(2), room(4)).is_empty());
    assert!(waiting.projects().is_empty());
    // Refused again right after the wake (the room was gone): not before the gap is over.
    waiting.refused(owner("a"), "demo", cpu(2), Refusal::NoRoom, at(3));
    assert!(waiting.to_wake("demo", at(5), room(4)).is_empty());
    assert_eq!(names(&waiting.to_wake("demo", at(11), room(4))), ["a"]);
}

#[test]
fn other_projects_are_left_alone() {
    let mut waiting = Waiting::new(WakeConfig::default());
    waiting.refused(owner("a"), "demo", cpu(2), Refusal::NoRoom, at(0));
    waiting.refused(owner("b"), "other", cpu(2), Refusal::NoRoom, at(0));
    assert_eq!(names(&waiting.to_wake("other", at(1), room(4))), ["b"]);
    assert_eq!(waiting.projects(), BTreeSet::from(["demo".to_owned()]));
}

#[test]
fn owners_refused_long_ago_are_forgotten() {
    let config = WakeConfig {
        remember: Duration::from_hours(1),
        ..WakeConfig::default()
    };
    let mut waiting = Waiting::new(config);
    waiting.refused(owner("old"), "demo", cpu(2), Refusal::NoRoom, at(0));
    waiting.refused(owner("recent"), "demo", cpu(2), Refusal::NoRoom, at(100));
    assert_eq!(names(&waiting.to_wake("demo", at(3650), room(10))), ["recent"]);
    assert_eq!(waiting.len(), 1);
}

#[test]
fn memory_and_each_pass_are_bounded() {
    let config = WakeConfig {
        max_owners: 3,
        max_per_pass: 2,
        ..WakeConfig::default()
    };
    let mut waiting = Waiting::new(config);
    for (i, name) in ["a", "b", "c", "d"].iter().enumerate() {
        waiting.refused(
            owner(name),
            "demo",
            cpu(1),
            Refusal::NoRoom,
            at(i64::try_from(i).unwrap()),
        );
    }
    // "a", the longest refused, was forgotten to keep three.
    assert_eq!(waiting.len(), 3);
    assert_eq!(names(&waiting.to_wake("demo", at(10), room(10))), ["b", "c"]);
    assert_eq!(names(&waiting.to_wake("demo", at(11), room(10))), ["d"]);
}

#[test]
fn the_fit_is_asked_only_when_someone_waits() {
    let mut waiting = Waiting::new(WakeConfig::default());
    let woken = waiting.to_wake("demo", at(0), |_| panic!("asked with nobody waiting"));
    assert!(woken.is_empty());
}

#[test]
fn room_in_the_quota_wakes_those_refused_for_it_but_not_those_waiting_for_share() {
    let mut waiting = Waiting::new(WakeConfig::default());
    waiting.refused(owner("no-room"), "demo", cpu(2), Refusal::NoRoom, at(0));
    waiting.refused(owner("for-share"), "demo", cpu(2), Refusal::ShareElsewhere, at(1));
    waiting.refused(owner("no-ledger"), "demo", cpu(2), Refusal::LedgerMissing, at(2));
    let share_elsewhere = |sizes: &[ResourceDetails]| vec![RoomNow::ShareElsewhere; sizes.len()];
    // The quota has room again, this seed's share not yet: a retry moves the share, except for
    // the one that was refused for exactly that (its share has still not come).
    assert_eq!(
        names(&waiting.to_wake("demo", at(5), share_elsewhere)),
        ["no-room", "no-ledger"]
    );
    // The share arrives: now it fits.
    assert_eq!(names(&waiting.to_wake("demo", at(6), room(10))), ["for-share"]);
}
