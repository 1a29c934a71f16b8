use super::*;
use jiff::Timestamp;
use proptest::prelude::*;

use crate::fixtures::cpu;

fn cpu_mem(c: i64, gib: i64) -> ResourceDetails {
    let mut d = cpu(c);
    d.set(
        Resource::Memory,
        Some(Quantity::from_units(gib).checked_mul(1 << 30).unwrap()),
    );
    d
}

fn reservation(uid: u64, size: &ResourceDetails) -> Reservation {
    Reservation {
        cluster: "c".into(),
        uid: uid.to_string(),
        size: size.clone(),
        reserved: size.clone(),
        created_at: Timestamp::UNIX_EPOCH,
        deployment: None,
    }
}

#[test]
fn grant_is_half_the_free_headroom_of_limited_resources() {
    assert_eq!(grant_for(&cpu(16), &cpu(6)), cpu(5));
    assert_eq!(grant_for(&cpu(16), &cpu(20)), cpu(0));
    // 1 cpu free: 500m, exactly.
    assert_eq!(
        grant_for(&cpu(16), &cpu(15)).amount(Resource::Cpu),
        "500m".parse::<Quantity>().unwrap()
    );
    // Memory is not limited: no grant for it, whatever is used.
    assert_eq!(grant_for(&cpu(16), &cpu_mem(6, 100)), cpu(5));
}

#[test]
fn fits_only_limited_resources_within_the_cap() {
    let limit = cpu(16);
    assert!(fits_within(&limit, &cpu(5), &cpu(3), &cpu(2)));
    assert!(!fits_within(&limit, &cpu(5), &cpu(4), &cpu(2)));
    // Unlimited memory never stops it.
    assert!(fits_within(&limit, &cpu(5), &cpu(0), &cpu_mem(1, 512)));
    // A limit the grant lacks: nothing of that resource fits.
    assert!(!fits_within(&cpu_mem(16, 64), &cpu(5), &cpu(0), &cpu_mem(1, 1)));
    assert!(fits_within(&cpu_mem(16, 64), &cpu(5), &cpu(0), &cpu(1)));
}

#[test]
fn cap_while_writing_is_covered_either_way() {
    // Growing the grant: the old one bounds admissions until the write lands.
    assert_eq!(cap_while_writing(&cpu(4), &cpu(6), &cpu(3)), cpu(4));
    // Shrinking it: what the write records plus the new grant.
    assert_eq!(cap_while_writing(&cpu(4), &cpu(0), &cpu(3)), cpu(3));
    assert_eq!(cap_while_writing(&cpu(4), &cpu(1), &cpu(1)), cpu(2));
}

fn planned(own: &ResourceDetails, grant: Option<ResourceDetails>, requests: bool) -> Planned<'_> {
    Planned {
        copy_uid: Some("l"),
        own_granted: own,
        grant,
        writes_allotment: true,
        writes: true,
        requests,
    }
}

/// A holder that took `grant` in ledger "l" at `t0`.
fn holding(grant: i64, t0: Instant, config: &AllotmentConfig) -> AllotmentHolder {
    let mut h = AllotmentHolder::default();
    let w = h.begin_write(t0, planned(&cpu(0), Some(cpu(grant)), true));
    h.landed(t0, Some("l"), &w, config.ttl);
    h
}

fn sight(own: &ResourceDetails) -> LedgerSight<'_> {
    LedgerSight {
        quota_uid: Some("l"),
        counted: true,
        wanted_back: false,
        own_granted: Some(own),
    }
}

fn admit(h: &mut AllotmentHolder, now: Instant, own: &ResourceDetails, uid: u64, n: i64) -> FastAdmission {
    h.admit(now, Some(&sight(own)), &cpu(100), &cpu(n), |_| {
        Some(Some(reservation(uid, &cpu(n))))
    })
}

#[test]
fn admits_within_the_allotment_only_while_it_is_usable_and_unchanged() {
    let config = AllotmentConfig::default();
    let t0 = Instant::now();
    let mut h = holding(4, t0, &config);
    assert_eq!(
        admit(&mut h, t0, &cpu(4), 1, 3),
        FastAdmission::Admitted { record: true }
    );
    assert_eq!(
        admit(&mut h, t0, &cpu(4), 2, 1),
        FastAdmission::Admitted { record: false }
    );
    assert_eq!(
        admit(&mut h, t0, &cpu(4), 3, 1),
        FastAdmission::Wait,
        "the allotment is spent"
    );
    let mut h = holding(4, t0, &config);
    // Past half the TTL without renewal.
    assert_eq!(
        admit(&mut h, t0 + config.ttl / 2, &cpu(4), 1, 1),
        FastAdmission::Wait
    );
    // The ledger shows another grant (seed-controller removed ours, or a write of ours landed
    // unseen): wait for a write.
    assert_eq!(admit(&mut h, t0, &cpu(2), 1, 1), FastAdmission::Wait);
    // A re-created ledger (another UID) holds nothing of ours.
    let other = cpu(4);
    let moved = LedgerSight {
        quota_uid: Some("m"),
        ..sight(&other)
    };
    assert_eq!(
        h.admit(t0, Some(&moved), &cpu(100), &cpu(1), |_| Some(None)),
        FastAdmission::Wait
    );
    // Wanted elsewhere: nothing more, and upkeep is due at once.
    let wanted = LedgerSight {
        wanted_back: true,
        ..sight(&other)
    };
    assert_eq!(
        h.admit(t0, Some(&wanted), &cpu(100), &cpu(1), |_| Some(None)),
        FastAdmission::WantedBack
    );
    assert_eq!(h.upkeep_due(t0, &config, false), Some(t0));
}

#[test]
fn a_conflict_restores_the_bound_and_a_lost_answer_keeps_it() {
    let config = AllotmentConfig::default();
    let t0 = Instant::now();
    let mut h = holding(4, t0, &config);
    assert!(matches!(
        admit(&mut h, t0, &cpu(4), 1, 3),
        FastAdmission::Admitted { .. }
    ));
    // A write recording 3 and shrinking the grant to 0: meanwhile at most the 3 it records.
    let w = h.begin_write(t0, planned(&cpu(4), None, false));
    assert_eq!(admit(&mut h, t0, &cpu(4), 2, 1), FastAdmission::Wait);
    h.write_failed(&w, true);
    // Admitted; the allotment is past its low-water mark with no write in flight: a refill.
    assert_eq!(
        admit(&mut h, t0, &cpu(4), 2, 1),
        FastAdmission::Admitted { record: true }
    );
    // Again, and this time the outcome is unknown: the bound stays for the next write.
    let w = h.begin_write(t0, planned(&cpu(4), None, false));
    h.write_failed(&w, false);
    h.gave_up(t0, true);
    assert_eq!(admit(&mut h, t0, &cpu(4), 3, 1), FastAdmission::Wait);
    assert!(h.holds_anything());
    // The next write lands: both admissions leave the holder.
    let w = h.begin_write(t0, planned(&cpu(4), None, false));
    assert_eq!(w.recorded, 2);
    assert_eq!(h.landed(t0, Some("l"), &w, config.ttl), Holding::GivenBack);
    assert_eq!(h.admitted_total(), &cpu(0));
    assert!(!h.holds_anything());
}

#[test]
fn a_forgotten_ledger_keeps_the_admissions_to_record() {
    let config = AllotmentConfig::default();
    let t0 = Instant::now();
    let mut h = holding(4, t0, &config);
    assert!(matches!(
        admit(&mut h, t0, &cpu(4), 1, 2),
        FastAdmission::Admitted { .. }
    ));
    h.forget(t0);
    assert!(!h.holding());
    assert_eq!(h.admitted_total(), &cpu(2));
    // Due after the record delay, and after the backoff.
    assert!(h.upkeep_due(t0, &config, false).is_some_and(|t| t > t0));
    let (list, total) = h.unrecorded(|r| r.uid == "1").unwrap();
    assert!(list.is_empty());
    assert_eq!(total, ResourceDetails::zero());
}

#[derive(Debug, Clone)]
enum Op {
    Admit(i64),
    Begin {
        grant: Option<i64>,
    },
    /// The write in flight: lands and answers, lands with its answer lost, conflicts, or fails
    /// without landing (timeout).
    End(u8),
    Tick(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1i64..4).prop_map(Op::Admit),
        2 => proptest::option::weighted(0.8, 0i64..8).prop_map(|grant| Op::Begin { grant }),
        2 => (0u8..4).prop_map(Op::End),
        1 => (0u64..40).prop_map(Op::Tick),
    ]
}

/// A write in flight: the ledger version it is conditioned on, when it began, what it records and
/// the allotment it sets.
type Flight = (
    u64,
    Instant,
    WriteStart,
    Vec<Reservation>,
    Option<ResourceDetails>,
);

proptest! {
    /// Whatever is admitted within the cap during a write is covered by the ledger both when
    /// the write fails and when it lands.
    #[test]
    fn admissions_within_the_cap_are_always_covered(
        old in 0i64..50, new in 0i64..50, recording in 0i64..50,
        sizes in proptest::collection::vec(1i64..5, 0..40),
    ) {
        prop_assume!(recording <= old);
        let limit = cpu(1000);
        let cap = cap_while_writing(&cpu(old), &cpu(new), &cpu(recording));
        let mut admitted = cpu(recording);
        for size in sizes {
            if fits_within(&limit, &cap, &admitted, &cpu(size)) {
                admitted = admitted.checked_add(&cpu(size)).unwrap();
            }
        }
        let total = admitted.amount(Resource::Cpu);
        // Write failed: everything is inside the old grant.
        prop_assert!(total <= Quantity::from_units(old));
        // Write landed: `recording` became reservations, the rest is inside the new grant.
        prop_assert!(total.checked_sub(Quantity::from_units(recording)).unwrap() <= Quantity::from_units(new));
    }

    /// Two holders each granting from what the other left never grant more than the limit.
    #[test]
    fn grants_in_sequence_never_exceed_the_limit(limit in 0i64..1000, used in 0i64..1200) {
        let first = grant_for(&cpu(limit), &cpu(used));
        let second = grant_for(&cpu(limit), &cpu(used).checked_add(&first).unwrap());
        let total = cpu(used).checked_add(&first).unwrap().checked_add(&second).unwrap();
        prop_assert!(total.amount(Resource::Cpu) <= Quantity::from_units(limit.max(used)));
    }

    /// The holder against one ledger, with writes that land, land unseen, conflict or time out:
    /// every Machine admitted without a write is covered in the ledger at every moment, by its
    /// reservation or by our allotment there.
    #[test]
    fn every_admission_is_covered_by_the_ledger(ops in proptest::collection::vec(op(), 1..80)) {
        let config = AllotmentConfig::default();
        let t0 = Instant::now();
        let mut now = t0;
        let mut h = AllotmentHolder::default();
        // The ledger: reservations recorded by uid, and our entry.
        let mut reserved = std::collections::BTreeMap::<String, i128>::new();
        let mut entry: Option<ResourceDetails> = None;
        let mut version = 0u64;
        let mut next_uid = 0u64;
        // The write in flight: the version it is conditioned on, what it records and sets.
        let mut flight: Option<Flight> = None;
        let mut admitted_ever: Vec<Reservation> = Vec::new();
        for op in ops {
            match op {
                Op::Admit(n) => {
                    let own = entry.clone();
                    let s = LedgerSight { quota_uid: Some("l"), counted: true, wanted_back: false, own_granted: own.as_ref() };
                    next_uid += 1;
                    let r = reservation(next_uid, &cpu(n));
                    if let FastAdmission::Admitted { .. } =
                        h.admit(now, Some(&s), &cpu(100), &cpu(n), |_| Some(Some(r.clone())))
                    {
                        admitted_ever.push(r);
                    }
                }
                Op::Begin { grant } => {
                    if flight.is_some() {
                        continue;
                    }
                    let (list, _) = h.unrecorded(|r| reserved.contains_key(&r.uid)).unwrap();
                    let grant = grant.map(cpu);
                    let own = entry.clone().unwrap_or_default();
                    let w = h.begin_write(now, planned(&own, grant.clone(), true));
                    flight = Some((version, now, w, list, grant));
                }
                Op::End(how) => {
                    let Some((base, started, w, list, grant)) = flight.take() else { continue };
                    let lands = how <= 1 && base == version;
                    if lands {
                        for r in &list {
                            reserved.insert(r.uid.clone(), r.reserved.amount(Resource::Cpu).as_nanos());
                        }
                        entry = grant.clone();
                        version += 1;
                    }
                    match (how, lands) {
                        (0, true) => {
                            h.landed(started, Some("l"), &w, config.ttl);
                        }
                        (0 | 2, false) => h.write_failed(&w, true),
                        _ => {
                            h.write_failed(&w, false);
                            h.gave_up(now, true);
                        }
                    }
                }
                Op::Tick(s) => now += Duration::from_secs(s),
            }
            // Coverage: what was admitted and is not reserved fits in our entry.
            let uncovered: i128 = admitted_ever
                .iter()
                .filter(|r| !reserved.contains_key(&r.uid))
                .map(|r| r.reserved.amount(Resource::Cpu).as_nanos())
                .sum();
            let held = entry.as_ref().map_or(0, |e| e.amount(Resource::Cpu).as_nanos());
            prop_assert!(uncovered <= held, "admitted {uncovered} uncovered beyond our entry {held}");
        }
    }
}

#[test]
fn what_we_record_on_a_new_ledger_moves_out_of_our_carried_entry() {
    let config = AllotmentConfig::default();
    let t0 = Instant::now();
    let h = holding(4, t0, &config);
    // Ledger "l" deleted, its successor "m" carries our entry (4): recording 3 admitted from it
    // leaves 1 there, recording all of it removes it.
    assert_eq!(
        h.carried_after(Some("m"), Some(&cpu(4)), &cpu(3)),
        Some(CarriedChange::Shrinks(cpu(1)))
    );
    assert_eq!(
        h.carried_after(Some("m"), Some(&cpu(4)), &cpu(4)),
        Some(CarriedChange::Goes)
    );
    assert_eq!(
        h.carried_after(Some("m"), Some(&cpu(4)), &cpu(5)),
        Some(CarriedChange::Goes)
    );
    // Nothing recorded, or no carried entry: nothing changes.
    assert_eq!(h.carried_after(Some("m"), Some(&cpu(4)), &cpu(0)), None);
    assert_eq!(h.carried_after(Some("m"), None, &cpu(3)), None);
    // Once we have written "m", what we record was admitted from our allotment there.
    let mut h = h;
    let w = h.begin_write(
        t0,
        Planned {
            copy_uid: Some("m"),
            ..planned(&cpu(0), Some(cpu(2)), true)
        },
    );
    h.landed(t0, Some("m"), &w, config.ttl);
    assert_eq!(h.carried_after(Some("m"), Some(&cpu(4)), &cpu(1)), None);
    // A holder that forgot its ledger (it went missing) has written none.
    h.forget(t0);
    assert_eq!(
        h.carried_after(Some("m"), Some(&cpu(4)), &cpu(1)),
        Some(CarriedChange::Shrinks(cpu(3)))
    );
}

#[test]
fn half_the_allotment_spent_refills_at_once_while_the_rest_serves() {
    let config = AllotmentConfig::default();
    let t0 = Instant::now();
    let mut h = holding(8, t0, &config);
    assert_eq!(
        admit(&mut h, t0, &cpu(8), 1, 1),
        FastAdmission::Admitted { record: true }
    );
    assert_eq!(h.upkeep_due(t0, &config, false), Some(t0 + config.record_after));
    assert_eq!(
        admit(&mut h, t0, &cpu(8), 2, 2),
        FastAdmission::Admitted { record: false }
    );
    // 4 of 8: the low-water mark. The worker is woken and writes now, not after `record_after`.
    assert_eq!(
        admit(&mut h, t0, &cpu(8), 3, 1),
        FastAdmission::Admitted { record: true }
    );
    assert_eq!(h.upkeep_due(t0, &config, false), Some(t0));
    // The refill's write is in flight: the old allotment still serves, up to its end, and no
    // second refill is asked for meanwhile.
    let w = h.begin_write(t0, planned(&cpu(8), Some(cpu(10)), false));
    assert_eq!(
        admit(&mut h, t0, &cpu(8), 4, 3),
        FastAdmission::Admitted { record: false }
    );
    assert_eq!(admit(&mut h, t0, &cpu(8), 5, 2), FastAdmission::Wait);
    h.landed(t0, Some("l"), &w, config.ttl);
    // The write recorded the first 4; the 3 admitted during it are recorded by the next.
    assert_eq!(h.admitted_total(), &cpu(3));
    assert_eq!(h.granted(), &cpu(10));
    assert!(!past_low_water(&cpu(10), &cpu(4)));
    assert!(past_low_water(&cpu(10), &cpu(5)));
    // A resource the allotment does not grant never counts.
    assert!(!past_low_water(&cpu(10), &cpu_mem(1, 64)));
}
