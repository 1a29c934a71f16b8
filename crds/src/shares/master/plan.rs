//! The plan of one resource: from what every seed holds, uses and asks for, the grants from free
//! headroom, and the targets that ask idle share back, move fragments to the seed met first and
//! squeeze what a lowered limit or usage above a share leaves too little room for. Pure; the
//! same plan serves a project's seeds and a group's projects (`SeedRecord::spendable`).

use super::SeedRecord;
use crate::quantity::{Quantity, QuantityError};
use crate::resources::Resource;

/// One resource: `(grant, target)` per seed, in the order of `records`.
#[allow(clippy::too_many_lines)] // one plan, read top to bottom: grants, targets, reclaims, squeeze
pub(super) fn plan_resource(
    records: &[&SeedRecord],
    resource: Resource,
    limit: Quantity,
    slack: Quantity,
) -> Result<Vec<(Quantity, Quantity)>, QuantityError> {
    let shares: Vec<Quantity> = records.iter().map(|r| r.share_seen().amount(resource)).collect();
    // Usage above a share fills the quota as much as share does (SeedRecord::held_seen); a
    // grant to that seed covers its own usage first, so that part costs no free headroom.
    let above: Vec<Quantity> = records
        .iter()
        .zip(&shares)
        .map(|(r, share)| r.held_seen().amount(resource).saturating_sub_to_zero(*share))
        .collect();
    let held = shares
        .iter()
        .chain(&above)
        .try_fold(Quantity::ZERO, |sum, q| sum.checked_add(*q))?;
    let mut free = limit.saturating_sub_to_zero(held);
    let over = held.saturating_sub_to_zero(limit);
    // Share alone never goes above the limit either (usage above the limit itself is not
    // covered by share: the seed admits nothing there anyway).
    let shares_total = shares
        .iter()
        .try_fold(Quantity::ZERO, |sum, s| sum.checked_add(*s))?;
    let mut unshared = limit.saturating_sub_to_zero(shares_total);

    // The most each holder may be granted on top of its share: up to what it could spend (its
    // ceiling, and for a group's member the other groups' limits).
    let room: Vec<Option<Quantity>> = records
        .iter()
        .zip(&shares)
        .map(|(r, share)| r.spendable(resource).map(|c| c.saturating_sub_to_zero(*share)))
        .collect();
    let within_room = |i: usize, q: Quantity| room[i].map_or(q, |r| q.min(r));
    // What each reachable seed needs beyond what it holds (never beyond its ceiling).
    let needs: Vec<Quantity> = records
        .iter()
        .enumerate()
        .map(|(i, record)| match record.demand(resource) {
            Some(want) if record.reachable && !record.retiring => {
                within_room(i, want.saturating_sub_to_zero(shares[i]))
            }
            _ => Quantity::ZERO,
        })
        .collect();
    // Seeds in the order their needs are met: least first (ties by name), so that when demands
    // compete, the one that can be met is met, and every round agrees on which one that is.
    let mut order: Vec<usize> = (0..records.len()).collect();
    order.sort_by_key(|&i| needs[i]);

    // Grants, from free headroom only, to reachable seeds that want more than they hold.
    let mut unmet = Quantity::ZERO;
    let mut unmet_of = vec![Quantity::ZERO; records.len()];
    let mut grants = vec![Quantity::ZERO; records.len()];
    for &i in &order {
        grants[i] = needs[i].min(free.checked_add(above[i])?).min(unshared);
        free = free.saturating_sub_to_zero(grants[i].saturating_sub_to_zero(above[i]));
        unshared = unshared.saturating_sub_to_zero(grants[i]);
        unmet_of[i] = needs[i].saturating_sub_to_zero(grants[i]);
        unmet = unmet.checked_add(unmet_of[i])?;
    }
    // A seed that had to ask gets half of what stays free on top, split among the holders that
    // could ask next (all but itself), so that the requests after this one do not each wait
    // for a round trip (the allotments' rule, one level up), and no one holder takes what many
    // will want (a group of a hundred projects: half of the group's headroom to the first
    // project that asks, a quarter to the next, leaves the rest asking at every create). Two
    // seeds: half. Never beyond its ceiling. In the same order as the grants. (Only reachable,
    // non-retiring seeds have needs, hence grants.)
    let others = i128::try_from(records.len().saturating_sub(1).max(1)).unwrap_or(i128::MAX);
    for &i in &order {
        if grants[i] > Quantity::ZERO {
            let extra = Quantity::from_nanos(free.as_nanos() / (2 * others));
            let extra = room[i].map_or(extra, |r| extra.min(r.saturating_sub_to_zero(grants[i])));
            grants[i] = grants[i].checked_add(extra)?;
            free = free.saturating_sub_to_zero(extra);
            unshared = unshared.saturating_sub_to_zero(extra);
        }
    }

    // Targets: what each seed holds plus its grant; nothing for retiring seeds. A seed not
    // heard from since this master started keeps the lower of its persisted target and what
    // it may hold, so a restart does not undo a move in progress.
    let mut targets: Vec<Quantity> = records
        .iter()
        .enumerate()
        .map(|(i, record)| {
            let planned = shares[i].checked_add(grants[i])?;
            Ok(if record.retiring {
                Quantity::ZERO
            } else if record.report.is_none() {
                record.target.get(resource).map_or(planned, |t| t.min(planned))
            } else {
                planned
            })
        })
        .collect::<Result<_, QuantityError>>()?;

    // Ask seeds with idle share and no demand of their own to release it: first what they hold
    // above committed + slack, then the slack. Only reachable seeds that reported, since idle
    // share is only known from a report. A holder that wants more than it holds is not idle up
    // to what it could spend, even where that leaves it no need (a group's member at its own
    // limit whose requests wait for the budget it holds): asked, it would give up what its own
    // requests wait for, and in a burst that room is still in transit when they give up. What
    // it holds above that it could never use (another group caps it lower), and is asked back.
    let asked = unmet.checked_add(over)?;
    let mut reclaim = asked;
    for above_slack in [true, false] {
        for (i, record) in records.iter().enumerate() {
            let Some(committed) = record.committed_seen(resource) else {
                continue;
            };
            if !record.reachable || record.retiring || needs[i] > Quantity::ZERO {
                continue;
            }
            let mut floor = if above_slack {
                committed.checked_add(slack).unwrap_or(committed)
            } else {
                committed
            };
            if record.wants_more(resource) {
                // Nothing bounding it and wanting more is a need; kept out all the same.
                let Some(spendable) = record.spendable(resource) else {
                    continue;
                };
                floor = floor.max(spendable);
            }
            let take = targets[i].saturating_sub_to_zero(floor).min(reclaim);
            targets[i] = targets[i].saturating_sub_to_zero(take);
            reclaim = reclaim.saturating_sub_to_zero(take);
        }
    }

    // Demands compete: what is left to reclaim can only come from seeds that want more
    // themselves. Their idle share moves to the seed met first (as much as it still needs), so
    // that fragments too small for any one seed's request do not sit idle on several seeds that
    // each wait for the others. The seed met first stays first (its need only shrinks), so share
    // never moves back and forth this way.
    let covered = asked.saturating_sub_to_zero(reclaim);
    if let Some(&first) = order.iter().find(|&&i| unmet_of[i] > Quantity::ZERO) {
        let uncovered = unmet_of[first].saturating_sub_to_zero(covered);
        let idle: Vec<Option<Quantity>> = (0..records.len())
            .map(|i| {
                let record = records[i];
                // Only seeds whose own need stays unmet this round (so reachable, not retiring):
                // a seed granted what it asked for is about to commit it.
                if i == first || unmet_of[i] == Quantity::ZERO {
                    return None;
                }
                Some(targets[i].saturating_sub_to_zero(record.committed_seen(resource)?))
            })
            .collect();
        let mut take_total = uncovered;
        for &i in order.iter().rev() {
            let Some(idle) = idle[i] else { continue };
            let take = idle.min(take_total);
            targets[i] = targets[i].saturating_sub_to_zero(take);
            take_total = take_total.saturating_sub_to_zero(take);
        }
    }

    // Usage no target covers (a catalog edit, a project that joined a group over its room)
    // fills the limit as targets do: the other seeds' targets are squeezed, below what they
    // commit if need be, until targets and that usage sum to the limit. They then admit nothing
    // more, give back what their webhooks hold, and release whatever their use frees.
    // What each holder commits, where known: not for one that has not reported, nor one that
    // cannot be reached (its last report may be stale), whose room is then not taken for idle.
    let committed: Vec<Option<Quantity>> = records
        .iter()
        .map(|r| r.committed_seen(resource).filter(|_| r.reachable))
        .collect();
    let uncovered: Vec<Quantity> = records
        .iter()
        .zip(&targets)
        .map(|(record, target)| {
            record
                .committed_seen(resource)
                .map_or(Quantity::ZERO, |committed| {
                    committed.saturating_sub_to_zero(*target)
                })
        })
        .collect();
    let total = targets
        .iter()
        .chain(&uncovered)
        .try_fold(Quantity::ZERO, |sum, t| sum.checked_add(*t))?;
    let squeeze = total.saturating_sub_to_zero(limit);
    squeeze_idle_first(
        &mut targets,
        &committed,
        |i| uncovered[i] == Quantity::ZERO,
        squeeze,
    );
    // A limit lowered below use: every target squeezed until they sum to the limit.
    let total = targets
        .iter()
        .try_fold(Quantity::ZERO, |sum, t| sum.checked_add(*t))?;
    let squeeze = total.saturating_sub_to_zero(limit);
    squeeze_idle_first(&mut targets, &committed, |_| true, squeeze);

    Ok(grants.into_iter().zip(targets).collect())
}

/// Lowers the targets of the holders `eligible` picks by `squeeze` in all: first what they hold
/// above what they are known to commit (room they could still admit into; none is known of a
/// holder whose `committed` is `None`), then the rest. Squeezing in order alone could take one
/// holder below its use while another kept room beside it, and the room would then be admitted
/// on top of that use (a limit lowered from 20 to 10: a, using 10, squeezed to 0, while b, using
/// 5 of 10 and waiting for more, kept its 10).
fn squeeze_idle_first(
    targets: &mut [Quantity],
    committed: &[Option<Quantity>],
    eligible: impl Fn(usize) -> bool,
    mut squeeze: Quantity,
) {
    for idle_only in [true, false] {
        for (i, target) in targets.iter_mut().enumerate() {
            if !eligible(i) {
                continue;
            }
            let floor = if idle_only {
                committed[i].unwrap_or(*target)
            } else {
                Quantity::ZERO
            };
            let take = target.saturating_sub_to_zero(floor).min(squeeze);
            *target = target.saturating_sub_to_zero(take);
            squeeze = squeeze.saturating_sub_to_zero(take);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{seed, view};
    use super::*;
    use crate::resources::ResourceDetails;
    use crate::shares::tests::cpu;

    #[test]
    fn grants_from_free_headroom_only() {
        let v = view(
            10,
            vec![("a", seed(4, 1, 3, Some(6))), ("b", seed(5, 0, 5, None))],
        );
        assert_eq!(v.free().unwrap(), cpu(2));
        let plan = v.plan(&cpu(0)).unwrap();
        assert_eq!(plan.grants["a"], cpu(2));
        assert_eq!(plan.targets["a"], cpu(5));
        assert_eq!(plan.targets["b"], cpu(5));
    }

    #[test]
    fn asks_idle_seeds_above_slack_first() {
        // a wants 8, holds 2; nothing is free; b holds 8 and uses 2 (slack 1); c holds 0.
        let v = view(
            10,
            vec![("a", seed(2, 0, 2, Some(8))), ("b", seed(8, 0, 2, None))],
        );
        let plan = v.plan(&cpu(1)).unwrap();
        assert!(plan.grants.is_empty());
        assert_eq!(plan.targets["b"], cpu(2));
        // Once b's release is seen, a gets it and b's target is what it holds.
        let v = view(
            10,
            vec![("a", seed(2, 0, 2, Some(8))), ("b", seed(8, 6, 2, None))],
        );
        let plan = v.plan(&cpu(1)).unwrap();
        assert_eq!(plan.grants["a"], cpu(6));
        assert_eq!(plan.targets["b"], cpu(2));
    }

    #[test]
    fn competing_demands_move_idle_fragments_to_the_seed_met_first() {
        // Limit 12: a holds 6.5 and uses 6, b holds 5.5 and uses 5; both want one more cpu.
        // Neither fits alone; together their idle halves make one cpu, for a (least need, then
        // name).
        let half = |n: i64| Quantity::from_nanos(i128::from(n) * 500_000_000);
        let mut a = seed(0, 0, 6, Some(7));
        a.granted.set(Resource::Cpu, Some(half(13)));
        let mut b = seed(0, 0, 5, Some(6));
        b.granted.set(Resource::Cpu, Some(half(11)));
        let v = view(12, vec![("a", a), ("b", b)]);
        let plan = v.plan(&cpu(1)).unwrap();
        assert!(plan.grants.is_empty());
        assert_eq!(plan.targets["a"].amount(Resource::Cpu), half(13));
        assert_eq!(plan.targets["b"], cpu(5));
        // Once b released its half, a gets it.
        let mut a = seed(0, 0, 6, Some(7));
        a.granted.set(Resource::Cpu, Some(half(13)));
        let mut b = seed(0, 0, 5, Some(6));
        b.granted.set(Resource::Cpu, Some(half(11)));
        b.report.as_mut().unwrap().released = {
            let mut r = ResourceDetails::default();
            r.set(Resource::Cpu, Some(half(1)));
            r
        };
        let v = view(12, vec![("a", a), ("b", b)]);
        let plan = v.plan(&cpu(1)).unwrap();
        assert_eq!(plan.grants["a"].amount(Resource::Cpu), half(1));
        assert_eq!(plan.targets["a"], cpu(7));
    }

    #[test]
    fn competing_demands_consolidate_fragments_that_cover_no_whole_need() {
        // Limit 10: a holds 8.5 and uses 8 (wants 15), b holds 1.5 and uses 1 (wants 5). b needs
        // least (3.5) and a's idle half cannot cover it, but it goes to b all the same: one seed
        // with a whole cpu idle can admit where two with a half each cannot.
        let half = |n: i64| Quantity::from_nanos(i128::from(n) * 500_000_000);
        let mut a = seed(0, 0, 8, Some(15));
        a.granted.set(Resource::Cpu, Some(half(17)));
        let mut b = seed(0, 0, 1, Some(5));
        b.granted.set(Resource::Cpu, Some(half(3)));
        let plan = view(10, vec![("a", a), ("b", b)]).plan(&cpu(1)).unwrap();
        assert_eq!(plan.targets["a"], cpu(8));
        assert_eq!(plan.targets["b"].amount(Resource::Cpu), half(3));
    }

    #[test]
    fn lowered_limit_squeezes_targets_and_unreachable_share_is_stuck() {
        let mut b = seed(6, 0, 5, None);
        b.reachable = false;
        let v = view(4, vec![("a", seed(4, 0, 1, None)), ("b", b)]);
        let plan = v.plan(&cpu(0)).unwrap();
        let targets: i64 = ["a", "b"]
            .iter()
            .map(|n| i64::try_from(plan.targets[*n].amount(Resource::Cpu).ceil_units()).unwrap())
            .sum();
        assert!(targets <= 4, "{plan:?}");
        assert_eq!(plan.stuck["b"], cpu(6));
        assert!(plan.grants.is_empty());
    }

    #[test]
    fn usage_above_a_share_is_held_not_free() {
        // Limit 10: a uses 6 on a share of 2 (a catalog edit made its Machines bigger); b holds
        // nothing and wants 8. Only 4 are free.
        let v = view(
            10,
            vec![("a", seed(2, 0, 6, None)), ("b", seed(0, 0, 0, Some(8)))],
        );
        assert_eq!(v.free().unwrap(), cpu(4));
        let plan = v.plan(&cpu(0)).unwrap();
        assert_eq!(plan.grants["b"], cpu(4));
        // a itself, wanting 8, gets its own usage covered without spending free headroom on
        // it (its 6 in use were already counted as held): 6 to reach 8, costing 2 of the 4
        // free, plus half of the 2 left (the bonus of a seed that had to ask).
        let v = view(
            10,
            vec![("a", seed(2, 0, 6, Some(8))), ("b", seed(0, 0, 0, None))],
        );
        let plan = v.plan(&cpu(0)).unwrap();
        assert_eq!(plan.grants["a"], cpu(7));
        assert_eq!(plan.targets["a"], cpu(9));
    }

    #[test]
    fn a_holder_is_never_granted_beyond_its_ceiling() {
        // A group of 1000 over projects whose own limits are 100: the asker wants 30 and would
        // get half the headroom on top; it gets at most its own limit.
        let mut asker = seed(10, 0, 10, Some(30));
        asker.ceiling = cpu(100);
        let v = view(1000, vec![("a", asker), ("b", seed(0, 0, 0, None))]);
        let plan = v.plan(&cpu(0)).unwrap();
        assert_eq!(plan.targets["a"], cpu(100), "{plan:?}");
        // A demand above the ceiling is met up to the ceiling, and asks nobody for more.
        let mut greedy = seed(10, 0, 10, Some(500));
        greedy.ceiling = cpu(20);
        let v = view(100, vec![("a", greedy), ("b", seed(80, 0, 0, None))]);
        let plan = v.plan(&cpu(0)).unwrap();
        assert_eq!(plan.grants["a"], cpu(10));
        assert_eq!(plan.targets["b"], cpu(80), "b is not asked for what a cannot use");
    }

    #[test]
    fn a_holder_at_its_ceiling_that_wants_more_keeps_what_it_holds() {
        // A group of 10 over two projects with own limits of 10: demo holds all 10, uses 9 and
        // wants 23 (its requests wait for the 10th); other holds nothing and wants 14. demo's
        // ceiling leaves it no need, but its 10th cpu is not idle: it stays with demo.
        let at_ceiling = |mut record: SeedRecord| {
            record.ceiling = cpu(10);
            record
        };
        let v = view(
            10,
            vec![
                ("demo", at_ceiling(seed(10, 0, 9, Some(23)))),
                ("other", at_ceiling(seed(0, 0, 0, Some(14)))),
            ],
        );
        let plan = v.plan(&cpu(0)).unwrap();
        assert_eq!(plan.targets["demo"], cpu(10), "{plan:?}");
        // Its requests gone (no demand), the idle cpu is asked back for other.
        let v = view(
            10,
            vec![
                ("demo", at_ceiling(seed(10, 0, 9, None))),
                ("other", at_ceiling(seed(0, 0, 0, Some(14)))),
            ],
        );
        assert_eq!(v.plan(&cpu(0)).unwrap().targets["demo"], cpu(9));
    }

    #[test]
    fn a_wanting_holder_gives_back_what_another_group_keeps_it_from_spending() {
        // demo (own limit 10) is in a second group of 4: holding all 10 of this group, using 4
        // and wanting more (its requests refused by the other group), it keeps 4; the 6 it
        // could never use go to other. Not granted past 4 either.
        let mut demo = seed(10, 0, 4, Some(30));
        demo.ceiling = cpu(10);
        demo.usable = cpu(4);
        let mut other = seed(0, 0, 0, Some(14));
        other.ceiling = cpu(10);
        let plan = view(10, vec![("demo", demo.clone()), ("other", other)])
            .plan(&cpu(0))
            .unwrap();
        assert_eq!(plan.targets["demo"], cpu(4), "{plan:?}");
        let mut asking = demo;
        asking.granted = cpu(2);
        let plan = view(10, vec![("demo", asking), ("other", seed(0, 0, 0, None))])
            .plan(&cpu(0))
            .unwrap();
        assert_eq!(plan.targets["demo"], cpu(4), "{plan:?}");
    }

    #[test]
    fn a_lowered_limit_takes_idle_room_before_anyone_is_squeezed_below_use() {
        // A limit lowered from 20 to 10: a holds 10 and uses 10 (as reported, or not reported
        // yet: its use is not known to be less); b holds 10, uses 5 and waits for more (at its
        // ceiling, or without one). Nothing may be left to admit: b's target goes to what it
        // commits before a is squeezed below its use.
        let unreported = SeedRecord {
            granted: cpu(10),
            target: cpu(10),
            ..SeedRecord::new()
        };
        for a in [seed(10, 0, 10, None), unreported] {
            for ceiling in [Some(10), None] {
                let mut b = seed(10, 0, 5, Some(12));
                if let Some(c) = ceiling {
                    b.ceiling = cpu(c);
                }
                let plan = view(10, vec![("a", a.clone()), ("b", b)]).plan(&cpu(0)).unwrap();
                let b = plan.targets["b"].amount(Resource::Cpu);
                assert!(b <= Quantity::from_units(5), "ceiling {ceiling:?}: {plan:?}");
            }
        }
    }

    #[test]
    fn headroom_on_top_of_a_grant_is_split_among_those_who_could_ask() {
        // Five holders, 100 free: the asker needs 4 and gets an eighth of the 96 left on top
        // (half, split among the four others), not half of it.
        let mut seeds = vec![("a", seed(0, 0, 0, Some(4)))];
        seeds.extend(["b", "c", "d", "e"].map(|n| (n, seed(0, 0, 0, None))));
        let plan = view(100, seeds).plan(&cpu(0)).unwrap();
        assert_eq!(plan.targets["a"], cpu(16), "{plan:?}");
        // Two holders: half, as before.
        let v = view(
            100,
            vec![("a", seed(0, 0, 0, Some(4))), ("b", seed(0, 0, 0, None))],
        );
        assert_eq!(v.plan(&cpu(0)).unwrap().targets["a"], cpu(52));
    }

    #[test]
    fn usage_above_a_share_squeezes_the_room_of_others() {
        // Limit 6 (a group): demo holds 6 and reports 6 committed (one of them a webhook's
        // allotment, returned later); other joined using 4 on no share. Demo's target goes
        // below what it commits, so that it gives back what is not in use and admits nothing.
        let v = view(
            6,
            vec![("demo", seed(6, 0, 6, None)), ("other", seed(0, 0, 4, None))],
        );
        let plan = v.plan(&cpu(0)).unwrap();
        assert_eq!(plan.targets["demo"], cpu(2), "{plan:?}");
        assert_eq!(plan.targets["other"], cpu(0));
        assert!(plan.grants.is_empty());
        // Other's use gone to 1: demo's target is back to what it holds.
        let v = view(
            6,
            vec![("demo", seed(6, 0, 5, None)), ("other", seed(0, 0, 1, None))],
        );
        assert_eq!(v.plan(&cpu(0)).unwrap().targets["demo"], cpu(5));
    }
}
