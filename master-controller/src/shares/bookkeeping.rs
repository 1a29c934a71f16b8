//! What metrics and logs need from one round to the next, pure: when a seed's demand was first
//! seen unmet (grant latency), whose `released` grew, which seeds became or stopped being stuck,
//! and whom a write asks to release.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use kkp_quota_crds::ResourceDetails;
use kkp_quota_crds::shares::MasterView;

/// Grant latency bookkeeping. `since` holds, per seed, when the master first saw its demand
/// unmet. `before` is this round's view before the plan (seen at `seen`), `after` the record
/// persisted at `landed` (`None` when nothing was written this round). Returns the latencies
/// of the demands the write covered; a demand that went away, or was met without a write, is
/// dropped without a sample.
pub fn grant_latencies(
    since: &mut BTreeMap<String, Instant>,
    before: &MasterView,
    after: Option<&MasterView>,
    seen: Instant,
    landed: Instant,
) -> Vec<(String, Duration)> {
    since.retain(|name, _| before.seeds.get(name).is_some_and(|r| r.unmet(&before.limit)));
    for (name, record) in &before.seeds {
        if record.unmet(&before.limit) {
            since.entry(name.clone()).or_insert(seen);
        }
    }
    let Some(after) = after else {
        return Vec::new();
    };
    let covered: Vec<String> = since
        .keys()
        .filter(|name| after.seeds.get(*name).is_some_and(|r| !r.unmet(&after.limit)))
        .cloned()
        .collect();
    covered
        .into_iter()
        .filter_map(|name| {
            let at = since.remove(&name)?;
            Some((name, landed.saturating_duration_since(at)))
        })
        .collect()
}

/// The seeds whose reported `released` grew since the last round (`seen` holds the last one
/// read per seed; the first read of a seed is not a release). Seeds gone from the view are
/// forgotten. A list, not a map: a quota has a handful of seeds, and a map's smallest node
/// holds eleven (at 10,000 quotas the maps took 20 MB, issue #16).
pub fn releases(seen: &mut Vec<(String, ResourceDetails)>, view: &MasterView) -> Vec<String> {
    seen.retain(|(name, _)| view.seeds.contains_key(name));
    let mut grew = Vec::new();
    for (name, record) in &view.seeds {
        let Some(report) = &record.report else {
            continue;
        };
        match seen.iter_mut().find(|(seed, _)| seed == name) {
            Some((_, old)) => {
                if !old.covers(&report.released) {
                    grew.push(name.clone());
                }
                old.clone_from(&report.released);
            }
            None => seen.push((name.clone(), report.released.clone())),
        }
    }
    grew
}

/// Seeds that became stuck, and seeds that no longer are, since the last round (`stuck` holds
/// the last round's).
pub fn stuck_transitions(
    stuck: &mut BTreeSet<String>,
    now_stuck: &BTreeMap<String, ResourceDetails>,
) -> (Vec<String>, Vec<String>) {
    let became: Vec<String> = now_stuck
        .keys()
        .filter(|n| !stuck.contains(*n))
        .cloned()
        .collect();
    let cleared: Vec<String> = stuck
        .iter()
        .filter(|n| !now_stuck.contains_key(*n))
        .cloned()
        .collect();
    *stuck = now_stuck.keys().cloned().collect();
    (became, cleared)
}

/// Seeds whose target the write lowers below the share they hold: they are asked to release.
/// Each with its new target and the share the master sees it hold.
pub fn asked_to_release(
    before: &MasterView,
    after: &MasterView,
) -> Vec<(String, ResourceDetails, ResourceDetails)> {
    after
        .seeds
        .iter()
        .filter_map(|(name, new)| {
            let old = before.seeds.get(name)?;
            let share = new.share_within(&after.limit);
            let asks = after.limit.iter().any(|(resource, _)| {
                let Some(target) = new.target.get(resource) else {
                    return false;
                };
                let lowered = old.target.get(resource).is_none_or(|was| target < was);
                lowered && target < share.amount(resource)
            });
            asks.then(|| (name.clone(), new.target.clone(), share))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shares::view::tests::{cpu, mv, with_report};
    use kkp_quota_crds::shares::SeedRecord;

    #[test]
    fn grant_latency_runs_from_first_unmet_to_the_covering_write() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        let t2 = t0 + Duration::from_secs(3);
        let mut since = BTreeMap::new();
        // Round 1: a wants 6, holds 2; nothing written (waiting for a release elsewhere).
        let before = mv(vec![
            ("a", with_report(2, 0, Some(6))),
            ("b", with_report(8, 0, None)),
        ]);
        assert!(grant_latencies(&mut since, &before, None, t0, t0).is_empty());
        assert_eq!(since.get("a"), Some(&t0));
        // Round 2: still unmet; the write grants only part of it.
        let after = mv(vec![("a", with_report(4, 0, Some(6)))]);
        assert!(grant_latencies(&mut since, &before, Some(&after), t1, t1).is_empty());
        assert_eq!(since.get("a"), Some(&t0), "the first sighting counts");
        // Round 3: the write covers it.
        let after = mv(vec![("a", with_report(6, 0, Some(6)))]);
        let samples = grant_latencies(&mut since, &before, Some(&after), t2, t2);
        assert_eq!(samples, vec![("a".to_owned(), Duration::from_secs(3))]);
        assert!(since.is_empty());
        // A demand that goes away is dropped without a sample.
        grant_latencies(&mut since, &before, None, t0, t0);
        let gone = mv(vec![("a", with_report(2, 0, None))]);
        assert!(grant_latencies(&mut since, &gone, None, t1, t1).is_empty());
        assert!(since.is_empty());
    }

    #[test]
    fn releases_count_growth_after_the_first_read() {
        let mut seen = Vec::new();
        assert!(releases(&mut seen, &mv(vec![("a", with_report(5, 1, None))])).is_empty());
        assert!(releases(&mut seen, &mv(vec![("a", with_report(5, 1, None))])).is_empty());
        assert_eq!(
            releases(&mut seen, &mv(vec![("a", with_report(5, 3, None))])),
            vec!["a".to_owned()]
        );
        // No report this round: nothing forgotten, nothing counted.
        assert!(releases(&mut seen, &mv(vec![("a", SeedRecord::new())])).is_empty());
        assert!(releases(&mut seen, &mv(vec![])).is_empty());
        assert!(seen.is_empty());
    }

    #[test]
    fn stuck_is_reported_once_per_transition() {
        let mut stuck = BTreeSet::new();
        let now = BTreeMap::from([("b".to_owned(), cpu(3))]);
        assert_eq!(
            stuck_transitions(&mut stuck, &now),
            (vec!["b".to_owned()], vec![])
        );
        assert_eq!(stuck_transitions(&mut stuck, &now), (vec![], vec![]));
        assert_eq!(
            stuck_transitions(&mut stuck, &BTreeMap::new()),
            (vec![], vec!["b".to_owned()])
        );
    }

    #[test]
    fn a_lowered_target_below_the_share_asks_for_a_release() {
        let before = mv(vec![
            ("a", with_report(6, 0, None)),
            ("b", with_report(2, 0, None)),
        ]);
        let mut after = before.clone();
        after.seeds.get_mut("a").unwrap().target = cpu(1);
        after.seeds.get_mut("b").unwrap().target = cpu(4);
        let asked = asked_to_release(&before, &after);
        assert_eq!(asked, vec![("a".to_owned(), cpu(1), cpu(6))]);
        // Lowered, but not below what it holds (it released already): no ask.
        let mut released = before.clone();
        let a = released.seeds.get_mut("a").unwrap();
        a.report.as_mut().unwrap().released = cpu(5);
        let mut after = released.clone();
        after.seeds.get_mut("a").unwrap().target = cpu(1);
        assert!(asked_to_release(&released, &after).is_empty());
    }
}
