//! Property tests: formatting round-trips, arithmetic agrees with ordering, parsing never panics.

use kkp_quota_crds::{Notation, Quantity, Resource, ResourceDetails};
use proptest::prelude::*;

fn quantity() -> impl Strategy<Value = Quantity> {
    prop_oneof![
        (-(1_i128 << 90)..(1_i128 << 90)).prop_map(Quantity::from_nanos),
        (0_i64..1 << 40).prop_map(Quantity::from_units),
        (0_i64..1 << 30).prop_map(Quantity::from_mebibytes),
        (0_i64..1 << 40).prop_map(Quantity::from_millis),
    ]
}

fn details() -> impl Strategy<Value = ResourceDetails> {
    proptest::collection::vec(
        proptest::option::of((0_i64..1 << 40).prop_map(Quantity::from_millis)),
        Resource::ALL.len(),
    )
    .prop_map(|amounts| {
        let mut d = ResourceDetails::default();
        for (resource, amount) in Resource::ALL.iter().zip(amounts) {
            d.set(*resource, amount);
        }
        d
    })
}

proptest! {
    #[test]
    fn format_then_parse_is_identity(q in quantity()) {
        for notation in [Notation::Decimal, Notation::Binary] {
            let text = q.format(notation);
            prop_assert_eq!(text.parse::<Quantity>().unwrap(), q, "{}", text);
        }
    }

    #[test]
    fn json_round_trips(d in details()) {
        let json = serde_json::to_string(&d).unwrap();
        prop_assert_eq!(serde_json::from_str::<ResourceDetails>(&json).unwrap(), d);
    }

    #[test]
    fn add_and_sub_agree_with_ordering(a in quantity(), b in quantity()) {
        let sum = a.checked_add(b).unwrap();
        prop_assert_eq!(sum.checked_sub(b).unwrap(), a);
        prop_assert_eq!(sum > a, b > Quantity::ZERO);
        prop_assert_eq!(sum == a, b.is_zero());
        prop_assert_eq!(a.checked_sub(b).unwrap() < Quantity::ZERO, a < b);
        prop_assert!(a.saturating_sub_to_zero(b) >= Quantity::ZERO);
    }

    #[test]
    fn parse_never_panics(text in ".{0,40}") {
        let _ = text.parse::<Quantity>();
    }

    #[test]
    fn parse_never_panics_on_quantity_like_text(text in "[+-]?[0-9]{0,45}(\\.[0-9]{0,45})?([eE][+-]?[0-9]{0,6}|[KMGTPE]i|[numkMGTPE])?") {
        let _ = text.parse::<Quantity>();
    }

    #[test]
    fn sum_minus_part_is_the_rest(a in details(), b in details()) {
        let sum = a.checked_add(&b).unwrap();
        let rest = sum.saturating_sub(&b);
        for &r in Resource::ALL {
            prop_assert_eq!(rest.amount(r), a.amount(r));
        }
        prop_assert!(sum.covers(&a) && sum.covers(&b));
    }

    #[test]
    fn fits_iff_no_resource_exceeded(limit in details(), used in details(), request in details()) {
        let exceeded = limit.exceeded_by(&used, &request).unwrap();
        for &r in Resource::ALL {
            let over = limit.get(r).is_some_and(|l| request.amount(r) > Quantity::ZERO
                && used.amount(r).checked_add(request.amount(r)).unwrap() > l);
            prop_assert_eq!(over, exceeded.iter().any(|e| e.resource == r));
        }
    }
}

/// Quantities below the CRDs' bound of `10^28` units, not negative.
fn in_crd_range() -> impl Strategy<Value = Quantity> {
    let bound = 10_i128.pow(37);
    prop_oneof![
        (0_i128..bound).prop_map(Quantity::from_nanos),
        (0_i128..1 << 60).prop_map(|n| Quantity::from_nanos(n * 1_000_000_000)),
        (0_i64..1 << 40).prop_map(Quantity::from_mebibytes),
        (0_i64..1 << 40).prop_map(Quantity::from_millis),
    ]
}

fn exact_pattern() -> regex_lite::Regex {
    regex_lite::Regex::new(&kkp_quota_crds::quantity::exact_quantity_pattern())
        .expect("the CRD pattern compiles")
}

proptest! {
    /// Whatever the CRDs' pattern lets through, this type holds exactly and in range, so no
    /// object the API server accepts can fail a listing.
    #[test]
    fn what_the_crd_pattern_accepts_parses_exactly(
        text in proptest::string::string_regex(
            kkp_quota_crds::quantity::exact_quantity_pattern()
                .trim_start_matches('^')
                .trim_end_matches('$'),
        )
        .expect("the CRD pattern generates strings")
    ) {
        let parsed = text.parse::<Quantity>();
        prop_assert!(parsed.is_ok(), "{text}: {parsed:?}");
        prop_assert!(parsed.is_ok_and(|q| q.as_nanos() < 10_i128.pow(38)), "{}", text);
    }

    /// Everything the controllers write for values in range passes the CRDs' pattern.
    #[test]
    fn what_the_controllers_write_passes_the_crd_pattern(q in in_crd_range()) {
        let pattern = exact_pattern();
        for notation in [Notation::Decimal, Notation::Binary] {
            let text = q.format(notation);
            prop_assert!(pattern.is_match(&text), "{}", text);
        }
    }
}
