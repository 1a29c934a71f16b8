//! Allotments (escrow), pure: how much headroom a webhook process takes, and whether a Machine
//! may be admitted from it without a write.
//!
//! A process holds one allotment per project in the seed quota copy (`status.allotments`). It
//! admits from it by counting in memory, and records what it admitted as reservations a moment
//! later, in one write that also moves their size out of `granted`. Because `granted` is in the
//! API server before anything is admitted from it, a crash loses nothing: the dead holder's
//! allotment keeps covering what it admitted until seed-controller has counted those Machines and
//! the allotment expired.
//!
//! The write that records and re-grants is conditioned on `resourceVersion`, so allotments never
//! overlap each other or the reservations: every write keeps
//! `usage + reservations + allotments <= limit` for what it grants.

use kkp_quota_crds::shares;
use kkp_quota_crds::{Quantity, Resource, ResourceDetails};

/// What a holder takes: half of what is left under the limit once everything else is counted,
/// per limited resource (the other half stays for other holders and for the exact, written
/// decision). Unlimited resources need no allotment and are absent.
pub fn grant_for(limit: &ResourceDetails, in_use: &ResourceDetails) -> ResourceDetails {
    let mut grant = ResourceDetails::default();
    for (resource, limit) in limit.iter() {
        let free = limit.saturating_sub_to_zero(in_use.amount(resource));
        grant.set(resource, Some(Quantity::from_nanos(free.as_nanos() / 2)));
    }
    grant
}

/// Whether `growth` still fits in `cap` on top of `admitted`, for every resource the `limit`
/// limits (a resource the cap lacks counts as zero: a limit added after the grant stops fast
/// admissions of that resource until the next write). The seed's own admission test
/// ([`shares::fits_within`]), with the allotment as the capacity.
pub fn fits_within(
    limit: &ResourceDetails,
    cap: &ResourceDetails,
    admitted: &ResourceDetails,
    growth: &ResourceDetails,
) -> bool {
    shares::fits_within(&shares::bounded_by(limit, cap), admitted, growth).is_ok()
}

/// While a write that records `recording` and replaces the grant `old` by `new` is in flight,
/// the most the holder may have admitted from its allotment in all: covered both if the write
/// fails (`old`) and if it succeeds (`new` plus what it records).
pub fn cap_while_writing(
    old: &ResourceDetails,
    new: &ResourceDetails,
    recording: &ResourceDetails,
) -> ResourceDetails {
    let mut cap = ResourceDetails::default();
    for &resource in Resource::ALL {
        let after = new
            .amount(resource)
            .checked_add(recording.amount(resource))
            .unwrap_or(Quantity::ZERO);
        let amount = old.amount(resource).min(after);
        if old.get(resource).is_some() || new.get(resource).is_some() {
            cap.set(resource, Some(amount));
        }
    }
    cap
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cpu(n: i64) -> ResourceDetails {
        let mut d = ResourceDetails::default();
        d.set(Resource::Cpu, Some(Quantity::from_units(n)));
        d
    }

    fn cpu_mem(c: i64, gib: i64) -> ResourceDetails {
        let mut d = cpu(c);
        d.set(
            Resource::Memory,
            Some(Quantity::from_units(gib).checked_mul(1 << 30).unwrap()),
        );
        d
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
    }
}
