//! The decision's unit and property tests.

use super::*;
use kkp_quota_crds::{LedgerSubject, Quantity, QuotaLedger, QuotaLedgerSpec, QuotaLedgerStatus, Resource};
use proptest::prelude::*;

fn details(pairs: &[(Resource, &str)]) -> ResourceDetails {
    let mut d = ResourceDetails::default();
    for (r, text) in pairs {
        d.set(*r, Some(text.parse().unwrap()));
    }
    d
}

fn cpu(n: &str) -> ResourceDetails {
    details(&[(Resource::Cpu, n)])
}

fn state(limit: ResourceDetails, used: ResourceDetails) -> QuotaState {
    QuotaState {
        limit,
        local_usage: used,
        ..QuotaState::default()
    }
}

fn create(machine: &str, size: ResourceDetails) -> Request {
    Request {
        machine: machine.into(),
        ask: Ask::Create(size),
        dry_run: false,
        subject: Subject::Machine,
        autoscaled: None,
    }
}

#[test]
fn fits_and_reserves_the_size() {
    let s = state(cpu("16"), cpu("12"));
    let v = decide("x8k2", Some(&s), &create("worker-7f", cpu("4")));
    assert!(v.allowed);
    assert_eq!(v.reason, Reason::Fits);
    assert_eq!(
        v.reserve,
        Some(Reserve {
            size: cpu("4"),
            reserved: cpu("4"),
            ..Reserve::default()
        })
    );
    assert_eq!(
        v.warnings,
        [r#"project "x8k2" now uses 16 of 16 cpu (above 80 % of its quota)"#]
    );
}

#[test]
fn an_admission_warns_only_above_eighty_percent_of_a_limit() {
    let limit = details(&[(Resource::Cpu, "16"), (Resource::Memory, "64Gi")]);
    let used = details(&[(Resource::Cpu, "8"), (Resource::Memory, "40Gi")]);
    let size = |cpu: &str, memory: &str| details(&[(Resource::Cpu, cpu), (Resource::Memory, memory)]);
    // 12.8 of 16 is exactly 80 %: no warning; 13 of 16 is above.
    let at = decide(
        "demo",
        Some(&state(limit.clone(), used.clone())),
        &create("m", size("4800m", "8Gi")),
    );
    assert!(at.allowed && at.warnings.is_empty(), "{at:?}");
    let above = decide(
        "demo",
        Some(&state(limit.clone(), used.clone())),
        &create("m", size("5", "8Gi")),
    );
    assert_eq!(
        above.warnings,
        [r#"project "demo" now uses 13 of 16 cpu (above 80 % of its quota)"#]
    );
    let both = decide(
        "demo",
        Some(&state(limit.clone(), used.clone())),
        &create("m", size("6", "16Gi")),
    );
    assert_eq!(
        both.warnings,
        [r#"project "demo" now uses 14 of 16 cpu and 56Gi of 64Gi memory (above 80 % of its quota)"#]
    );
    // Denials and dry runs of nothing near the limit carry none.
    let denied = decide(
        "demo",
        Some(&state(limit.clone(), used.clone())),
        &create("m", size("9", "1Gi")),
    );
    assert!(!denied.allowed && denied.warnings.is_empty(), "{denied:?}");
}

#[test]
fn a_resource_already_over_the_limit_is_warned_about_once() {
    // Quota lowered to 10 cpu under 12 used: the over-quota warning, not a near-limit one for cpu;
    // memory (not over) still gets its own.
    let limit = details(&[(Resource::Cpu, "10"), (Resource::Memory, "10Gi")]);
    let used = details(&[(Resource::Cpu, "12"), (Resource::Memory, "8Gi")]);
    let v = decide(
        "demo",
        Some(&state(limit, used)),
        &create("m", details(&[(Resource::Memory, "1Gi")])),
    );
    assert!(v.allowed);
    assert_eq!(v.warnings.len(), 2, "{:?}", v.warnings);
    assert!(v.warnings[0].contains("is over its resource quota"));
    assert_eq!(
        v.warnings[1],
        r#"project "demo" now uses 9Gi of 10Gi memory (above 80 % of its quota)"#
    );
}

#[test]
fn a_dry_run_says_how_many_machines_of_its_size_fit() {
    let limit = details(&[(Resource::Cpu, "16"), (Resource::Memory, "32Gi")]);
    let used = details(&[(Resource::Cpu, "6"), (Resource::Memory, "8Gi")]);
    let size = details(&[(Resource::Cpu, "2"), (Resource::Memory, "8Gi")]);
    let dry = |size: ResourceDetails| Request {
        dry_run: true,
        subject: Subject::Machine,
        ..create("m", size)
    };
    // cpu leaves room for 5, memory for 3.
    let v = decide(
        "demo",
        Some(&state(limit.clone(), used.clone())),
        &dry(size.clone()),
    );
    assert!(v.allowed);
    assert_eq!(
        v.warnings.last().map(String::as_str),
        Some(
            r#"dry run, nothing was reserved: in project "demo", 3 Machines of this size (2 cpu and 8Gi memory) fit in its quota now"#
        )
    );
    // Too big: denied as a real create would be, and the answer says none fits.
    let big = details(&[(Resource::Cpu, "12")]);
    let v = decide(
        "demo",
        Some(&state(limit.clone(), used.clone())),
        &dry(big.clone()),
    );
    assert!(!v.allowed);
    assert_eq!(
        machines_that_fit(&state(limit.clone(), used.clone()), &big),
        Some(0)
    );
    assert!(
        v.warnings
            .last()
            .unwrap()
            .contains("0 Machines of this size (12 cpu)"),
        "{v:?}"
    );
    // Nothing limited that it needs, and no quota at all.
    let gpu = details(&[(Resource::Gpu, "1")]);
    assert_eq!(machines_that_fit(&state(limit, used), &gpu), None);
    assert!(decide("demo", None, &dry(size)).warnings.is_empty());
    // A real create carries no dry-run answer.
    let v = decide(
        "demo",
        Some(&state(details(&[(Resource::Cpu, "100")]), cpu("1"))),
        &create("m", cpu("1")),
    );
    assert!(v.warnings.is_empty(), "{v:?}");
}

#[test]
fn denial_names_the_resource_in_quota_units() {
    let s = state(cpu("16"), cpu("14"));
    let v = decide("x8k2", Some(&s), &create("worker-7f", cpu("4")));
    assert!(!v.allowed);
    assert_eq!(v.reason, Reason::QuotaExceeded);
    assert_eq!(
        v.message.as_deref(),
        Some(r#"machine "worker-7f" needs 4 cpu, project "x8k2" uses 14 of 16 cpu"#)
    );
    assert_eq!(
        v.event_message.as_deref(),
        Some(r#"a Machine needs 4 cpu, project "x8k2" uses 14 of 16 cpu"#)
    );
    assert_eq!(v.reserve, None);
}

#[test]
fn denial_names_every_resource_that_does_not_fit() {
    let limit = details(&[
        (Resource::Cpu, "16"),
        (Resource::Memory, "32Gi"),
        (Resource::Storage, "1Ti"),
    ]);
    let used = details(&[
        (Resource::Cpu, "14"),
        (Resource::Memory, "31Gi"),
        (Resource::Storage, "10Gi"),
    ]);
    let size = details(&[
        (Resource::Cpu, "4"),
        (Resource::Memory, "2Gi"),
        (Resource::Storage, "20Gi"),
    ]);
    let v = decide("x8k2", Some(&state(limit, used)), &create("w", size));
    assert_eq!(
        v.message.as_deref(),
        Some(
            r#"machine "w" needs 4 cpu and 2Gi memory, project "x8k2" uses 14 of 16 cpu and 31Gi of 32Gi memory"#
        )
    );
}

#[test]
fn a_ledger_of_a_newer_format_is_not_read() {
    let spec = QuotaLedgerSpec {
        rollout_allowance: None,
        subject: LedgerSubject::project("p"),
        quota: cpu("10"),
        shares: None,
        reserved_counts: false,
    };
    let status = QuotaLedgerStatus {
        format_version: Some(kkp_quota_crds::quota_ledger::LEDGER_FORMAT + 1),
        ..QuotaLedgerStatus::default()
    };
    let e = QuotaState::from_parts(&spec, Some(&status)).unwrap_err();
    assert!(e.to_string().contains("upgrade this component"), "{e}");
    let current = QuotaLedgerStatus {
        format_version: Some(kkp_quota_crds::quota_ledger::LEDGER_FORMAT),
        ..QuotaLedgerStatus::default()
    };
    assert!(QuotaState::from_parts(&spec, Some(&current)).is_ok());
}

#[test]
fn usage_sums_other_seeds_local_reservations_and_allotments() {
    let s = QuotaState {
        limit: cpu("16"),
        other_seeds_usage: cpu("4"),
        local_usage: cpu("5"),
        reserved: cpu("4"),
        allotted: cpu("1"),
        seed: None,
        ..QuotaState::default()
    };
    // Over the quota even without the held headroom: a real denial.
    let v = decide("p", Some(&s), &create("m", cpu("4")));
    assert_eq!(v.reason, Reason::QuotaExceeded);
    assert_eq!(
        v.message.as_deref(),
        Some(
            r#"machine "m" needs 4 cpu, project "p" uses 14 of 16 cpu (of which 1 cpu is headroom held by other webhook processes, freed as they record their admissions or give it back)"#
        )
    );
    // It fits once the held headroom is back: it waits for it, and says so.
    let v = decide("p", Some(&s), &create("m", cpu("3")));
    assert_eq!(v.reason, Reason::ShareInTransit);
    assert_eq!(
        v.message.as_deref(),
        Some(
            r#"machine "m" cannot be admitted yet: needs 3 cpu, project "p" uses 14 of 16 cpu (of which 1 cpu is headroom held by other webhook processes, freed as they record their admissions or give it back); trying again in a few seconds will succeed"#
        )
    );
    assert!(decide("p", Some(&s), &create("m", cpu("2"))).allowed);
}

#[test]
fn a_holder_counts_what_it_admitted_instead_of_its_own_allotment() {
    use kkp_quota_crds::ledger::Allotment;
    let allotment = |holder: &str, granted: &str| Allotment {
        holder: holder.into(),
        granted: cpu(granted),
        expires_at: jiff::Timestamp::UNIX_EPOCH,
        ttl_seconds: None,
    };
    let spec = QuotaLedgerSpec {
        rollout_allowance: None,
        subject: LedgerSubject::project("p"),
        quota: cpu("16"),
        shares: None,
        reserved_counts: false,
    };
    let status = QuotaLedgerStatus {
        local_usage: Some(cpu("4")),
        other_seeds_usage: Some(cpu("0")),
        allotments: vec![allotment("me", "5"), allotment("other", "3")],
        ..QuotaLedgerStatus::default()
    };
    // Anyone else: both allotments are taken.
    let everyone = QuotaState::from_parts(&spec, Some(&status)).unwrap();
    assert_eq!(
        everyone.in_use().unwrap().amount(Resource::Cpu),
        Quantity::from_units(12)
    );
    // "me", having admitted 2 from its own 5: the other's 3 and its own 2.
    let mine = QuotaState::for_holder(&spec, Some(&status), "me", &cpu("2")).unwrap();
    assert_eq!(
        mine.in_use().unwrap().amount(Resource::Cpu),
        Quantity::from_units(9)
    );
    assert_eq!(
        mine.used().unwrap().amount(Resource::Cpu),
        Quantity::from_units(6)
    );
    let v = decide("p", Some(&mine), &create("m", cpu("11")));
    assert_eq!(
        v.message.as_deref(),
        Some(
            r#"machine "m" needs 11 cpu, project "p" uses 9 of 16 cpu (of which 3 cpu is headroom held by other webhook processes, freed as they record their admissions or give it back)"#
        )
    );
    assert_eq!(
        decide("p", Some(&mine), &create("m", cpu("8"))).reason,
        Reason::ShareInTransit
    );
    // Held headroom is not usage: no over-quota warning for it.
    let lowered = QuotaLedgerSpec {
        rollout_allowance: None,
        quota: cpu("8"),
        ..spec.clone()
    };
    let state = QuotaState::for_holder(&lowered, Some(&status), "me", &cpu("2")).unwrap();
    assert!(over_quota_warnings("p", &state).is_empty());

    // Our entry carried from a deleted ledger (issue #32) is not ours to count from memory: it
    // covers what was admitted before the deletion, whatever we recorded of that.
    let carried = QuotaLedgerStatus {
        allotments: vec![
            allotment(&kkp_quota_crds::ledger::carried_holder("me"), "5"),
            allotment("other", "3"),
        ],
        ..status.clone()
    };
    let mine = QuotaState::for_holder(&spec, Some(&carried), "me", &cpu("2")).unwrap();
    assert_eq!(
        mine.in_use().unwrap().amount(Resource::Cpu),
        Quantity::from_units(14),
        "4 used, 2 we admitted, 5 carried, 3 the other's"
    );
}

#[test]
fn from_copy_falls_back_to_global_minus_local() {
    let mut quota = QuotaLedger::new(
        "project-p",
        QuotaLedgerSpec {
            rollout_allowance: None,
            subject: LedgerSubject::project("p"),
            quota: cpu("16"),
            shares: None,
            reserved_counts: false,
        },
    );
    quota.status = Some(QuotaLedgerStatus {
        global_usage: Some(cpu("10")),
        local_usage: Some(cpu("4")),
        ..QuotaLedgerStatus::default()
    });
    let s = QuotaState::from_copy(&quota).unwrap();
    assert_eq!(s.other_seeds_usage, cpu("6"));
    assert_eq!(
        s.in_use().unwrap(),
        cpu("10").checked_add(&ResourceDetails::zero()).unwrap()
    );
    // A local count fresher than the master's global figure: floored at zero.
    quota.status = Some(QuotaLedgerStatus {
        global_usage: Some(cpu("2")),
        local_usage: Some(cpu("4")),
        ..QuotaLedgerStatus::default()
    });
    assert_eq!(
        QuotaState::from_copy(&quota)
            .unwrap()
            .other_seeds_usage
            .amount(Resource::Cpu),
        Quantity::ZERO
    );
    // otherSeedsUsage wins when present.
    quota.status = Some(QuotaLedgerStatus {
        global_usage: Some(cpu("100")),
        local_usage: Some(cpu("4")),
        other_seeds_usage: Some(cpu("1")),
        ..QuotaLedgerStatus::default()
    });
    assert_eq!(QuotaState::from_copy(&quota).unwrap().other_seeds_usage, cpu("1"));
}

#[test]
fn deletes_and_shrinks_pass_over_quota() {
    let s = state(cpu("16"), cpu("20"));
    let delete = Request {
        machine: "m".into(),
        ask: Ask::Delete,
        dry_run: false,
        subject: Subject::Machine,
        autoscaled: None,
    };
    assert!(decide("p", Some(&s), &delete).allowed);
    let shrink = Request {
        machine: "m".into(),
        ask: Ask::Update {
            old: Some(cpu("4")),
            new: cpu("2"),
        },
        dry_run: false,
        subject: Subject::Machine,
        autoscaled: None,
    };
    let v = decide("p", Some(&s), &shrink);
    assert!(v.allowed);
    assert_eq!(v.reason, Reason::Reduction);
    assert_eq!(v.reserve, None);
    // The over-quota warning rides along.
    assert_eq!(v.warnings.len(), 1);
}

#[test]
fn growth_of_an_update_is_what_counts() {
    let s = state(cpu("16"), cpu("14"));
    let grow = |old: &str, new: &str| Request {
        machine: "m".into(),
        ask: Ask::Update {
            old: Some(cpu(old)),
            new: cpu(new),
        },
        dry_run: false,
        subject: Subject::Machine,
        autoscaled: None,
    };
    let v = decide("p", Some(&s), &grow("2", "4"));
    assert!(v.allowed);
    assert_eq!(
        v.reserve,
        Some(Reserve {
            size: cpu("4"),
            reserved: cpu("2"),
            ..Reserve::default()
        })
    );
    let v = decide("p", Some(&s), &grow("2", "5"));
    assert_eq!(
        v.message.as_deref(),
        Some(r#"machine "m" needs 3 more cpu, project "p" uses 14 of 16 cpu"#)
    );
}

#[test]
fn no_quota_allows_everything() {
    let v = decide(
        "p",
        None,
        &Request {
            machine: "m".into(),
            ask: Ask::Unsizeable("no".into()),
            dry_run: false,
            subject: Subject::Machine,
            autoscaled: None,
        },
    );
    assert!(v.allowed);
    assert_eq!(v.reason, Reason::NoQuota);
    let v = decide("p", None, &create("m", cpu("64")));
    assert_eq!((v.allowed, v.reason, v.reserve), (true, Reason::NoQuota, None));
    let delete = Request {
        machine: "m".into(),
        ask: Ask::Delete,
        dry_run: false,
        subject: Subject::Machine,
        autoscaled: None,
    };
    assert_eq!(decide("p", None, &delete).reason, Reason::Reduction);
}

#[test]
fn unsizeable_is_denied_with_the_sizing_message() {
    let s = state(cpu("16"), cpu("0"));
    let v = decide(
        "p",
        Some(&s),
        &Request {
            machine: "m".into(),
            ask: Ask::Unsizeable("set cpus".into()),
            dry_run: false,
            subject: Subject::Machine,
            autoscaled: None,
        },
    );
    assert!(!v.allowed);
    assert_eq!(v.reason, Reason::Unsizeable);
    assert!(v.message.as_deref().unwrap().ends_with(": set cpus"));
}

#[test]
fn lowered_quota_denies_creates_with_a_warning() {
    let s = state(cpu("8"), cpu("12"));
    let v = decide("p", Some(&s), &create("m", cpu("1")));
    assert!(!v.allowed);
    assert_eq!(
        v.warnings,
        vec![r#"project "p" is over its resource quota: it uses 12 of 8 cpu; new Machines that need cpu are denied until usage is back under the quota"#.to_owned()]
    );
    // A request that asks nothing of the overrun resource still passes.
    let v = decide("p", Some(&s), &create("m", details(&[(Resource::Memory, "1Gi")])));
    assert!(v.allowed);
    assert_eq!(v.warnings.len(), 1);
    // More clusters than their limit: that refuses new clusters, no Machine, nor warns one.
    let limit = details(&[(Resource::Cpu, "8"), (Resource::Clusters, "2")]);
    let used = details(&[(Resource::Cpu, "4"), (Resource::Clusters, "3")]);
    let v = decide("p", Some(&state(limit, used)), &create("m", cpu("1")));
    assert!(v.allowed, "{v:?}");
    assert!(
        v.warnings.iter().all(|w| !w.contains("over its resource quota")),
        "{:?}",
        v.warnings
    );
}

#[test]
fn batch_admits_in_order_until_full() {
    let s = state(cpu("16"), cpu("12"));
    let requests: Vec<Request> = (0..6).map(|i| create(&format!("m{i}"), cpu("1"))).collect();
    let verdicts = decide_batch("p", Some(&s), &requests);
    let allowed: Vec<bool> = verdicts.iter().map(|v| v.allowed).collect();
    assert_eq!(allowed, vec![true, true, true, true, false, false]);
    assert_eq!(
        verdicts[4].message.as_deref(),
        Some(r#"machine "m4" needs 1 cpu, project "p" uses 16 of 16 cpu"#)
    );
}

#[test]
fn dry_runs_do_not_take_room() {
    let s = state(cpu("16"), cpu("15"));
    let mut dry = create("dry", cpu("1"));
    dry.dry_run = true;
    let verdicts = decide_batch("p", Some(&s), &[dry, create("real", cpu("1"))]);
    assert!(verdicts[0].allowed && verdicts[1].allowed);
}

proptest! {
    /// However a batch is made up, what it admits fits in the headroom, and every denial is
    /// justified: the request would not have fit on top of what was admitted before it.
    #[test]
    fn batch_never_overruns(limit in 0u32..64, used in 0u32..64, sizes in proptest::collection::vec(0u32..8, 0..40)) {
        let s = state(cpu(&limit.to_string()), cpu(&used.to_string()));
        let requests: Vec<Request> = sizes.iter().enumerate().map(|(i, n)| create(&format!("m{i}"), cpu(&n.to_string()))).collect();
        let verdicts = decide_batch("p", Some(&s), &requests);
        let mut admitted = 0u32;
        for (size, verdict) in sizes.iter().zip(&verdicts) {
            if verdict.allowed {
                admitted += size;
                prop_assert!(*size == 0 || used + admitted <= limit);
            } else {
                prop_assert!(used + admitted + size > limit);
            }
        }
    }
}

#[test]
fn a_cluster_over_the_count_is_refused_in_words_about_clusters() {
    let limit = details(&[(Resource::Clusters, "5"), (Resource::Cpu, "16")]);
    let used = details(&[(Resource::Clusters, "5"), (Resource::Cpu, "2")]);
    let cluster = Request {
        subject: Subject::Cluster,
        ..create("abc123", details(&[(Resource::Clusters, "1")]))
    };
    let v = decide("demo", Some(&state(limit.clone(), used)), &cluster);
    assert_eq!(v.reason, Reason::QuotaExceeded);
    assert_eq!(
        v.message.as_deref(),
        Some(
            r#"cluster "abc123" cannot be created: project "demo" has 5 of 5 clusters; delete a cluster or ask an admin to raise the limit"#
        )
    );
    assert_eq!(
        v.event_message.as_deref(),
        Some(
            r#"a Cluster cannot be created: project "demo" has 5 of 5 clusters; delete a cluster or ask an admin to raise the limit"#
        )
    );
    let room = details(&[(Resource::Clusters, "4")]);
    let v = decide("demo", Some(&state(limit, room)), &cluster);
    assert!(v.allowed);
    assert_eq!(
        v.reserve.map(|r| r.reserved),
        Some(details(&[(Resource::Clusters, "1")]))
    );
}

mod reserved_counts;
mod shares;
