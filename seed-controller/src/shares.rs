//! The seed's side of per-seed shares (docs/shares.md), pure: what a write of the `QuotaLedger`
//! releases, which demands it drops, when the ledger is quiet, and when it is next due.
//!
//! A release is decided from the very status the write produces (`localUsage` written, the
//! reservations and allotments it keeps) and carried by that same compare-and-swap write as
//! `status.released = old released + release`, so nothing is admitted against share on its way
//! out; on a conflict it is recomputed from the new read. `kkp_quota_crds::shares::SeedShare::
//! release_due` says how much: the share above `max(target, committed)`, and when quiet also the
//! share above `committed + slack`. Never anything committed.
//!
//! **Quiet** means: no live demand in the ledger, none of the project's clusters unsettled, and no
//! sign of admissions for the quiet period: the ledger was last seen with reservations,
//! allotments or live demands, or with `localUsage` growing, at least that long ago. A project
//! first seen (e.g. after a restart) counts as active at that moment.

use jiff::{SignedDuration, Timestamp};
use kkp_quota_crds::quota_ledger::{QuotaLedgerSpec, QuotaLedgerStatus, ShareDemand};
use kkp_quota_crds::shares::objects::{committed, live_demands, seed_share};
use kkp_quota_crds::{Quantity, QuantityError, ResourceDetails};

/// The share settings (`--share-quiet-period`, `--share-slack-percent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub quiet_period: SignedDuration,
    pub slack_percent: u32,
}

/// Why share is released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// The share is above `max(target, committed)`: the master asks for it back.
    Target,
    /// The seed is quiet and holds more than `committed + slack`.
    Quiet,
    /// Both: above the target, and quiet with even less kept.
    TargetAndQuiet,
}

impl Why {
    pub fn as_str(self) -> &'static str {
        match self {
            Why::Target => "target lowered",
            Why::Quiet => "quiet",
            Why::TargetAndQuiet => "target lowered and quiet",
        }
    }
}

/// A release to carry in a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    /// What is released now (only the resources with a positive amount).
    pub amount: ResourceDetails,
    /// The new cumulative `status.released`: the old one plus `amount`.
    pub released: ResourceDetails,
    pub why: Why,
}

/// Only the positive amounts of `d`.
fn positive(d: &ResourceDetails) -> ResourceDetails {
    let mut out = ResourceDetails::default();
    for (resource, amount) in d.iter() {
        if amount > Quantity::ZERO {
            out.set(resource, Some(amount));
        }
    }
    out
}

/// The release a write producing the status `after` carries (its `released` still the one read),
/// or `None` when shares are not in force on this ledger or nothing is due.
pub fn release(
    spec: &QuotaLedgerSpec,
    after: &QuotaLedgerStatus,
    slack: &ResourceDetails,
    quiet: bool,
) -> Result<Option<Release>, QuantityError> {
    let Some(share) = seed_share(spec, Some(after)) else {
        return Ok(None);
    };
    let committed = committed(after)?;
    let amount = positive(&share.release_due(&spec.quota, &committed, slack, quiet));
    if amount.is_empty() {
        return Ok(None);
    }
    let asked = positive(&share.release_due(&spec.quota, &committed, slack, false));
    let why = if asked.is_empty() {
        Why::Quiet
    } else if asked == amount {
        Why::Target
    } else {
        Why::TargetAndQuiet
    };
    let mut released = share.clone();
    released.release(&amount)?;
    Ok(Some(Release {
        amount,
        released: released.released,
        why,
    }))
}

/// The demands (by index) whose `expiresAt` has passed at `now`.
pub fn demands_to_expire(demands: &[ShareDemand], now: Timestamp) -> Vec<usize> {
    demands
        .iter()
        .enumerate()
        .filter(|(_, d)| d.expires_at <= now)
        .map(|(i, _)| i)
        .collect()
}

/// Signs that a ledger is being admitted against: reservations, allotments or live demands.
fn busy(status: &QuotaLedgerStatus, now: Timestamp) -> bool {
    !status.reservations.is_empty()
        || !status.allotments.is_empty()
        || live_demands(status, now).next().is_some()
}

/// When a project's ledger last showed signs of admissions, and the `localUsage` last seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Activity {
    pub last_active: Timestamp,
    pub usage_seen: ResourceDetails,
}

impl Activity {
    /// A ledger first seen at `now` (nothing known before: active now).
    pub fn first(status: &QuotaLedgerStatus, now: Timestamp) -> Activity {
        Activity {
            last_active: now,
            usage_seen: status.local_usage.clone().unwrap_or_default(),
        }
    }

    /// Takes in one status of the ledger at `now`: one read, or the status a write produces.
    pub fn observe(&mut self, status: &QuotaLedgerStatus, now: Timestamp) {
        let usage = status.local_usage.clone().unwrap_or_default();
        if busy(status, now) || !self.usage_seen.covers(&usage) {
            self.touch(now);
        }
        self.usage_seen = usage;
    }

    /// A sign of admissions at `now` (e.g. a write that makes `localUsage` grow).
    pub fn touch(&mut self, now: Timestamp) {
        self.last_active = self.last_active.max(now);
    }

    /// When the quiet period after the last sign of admissions ends.
    pub fn quiet_from(&self, period: SignedDuration) -> Timestamp {
        self.last_active.saturating_add(period).unwrap_or(Timestamp::MAX)
    }

    /// Whether a ledger with this (written or read) status is quiet at `now`.
    pub fn quiet(
        &self,
        status: &QuotaLedgerStatus,
        project_unsettled: bool,
        period: SignedDuration,
        now: Timestamp,
    ) -> bool {
        !project_unsettled && live_demands(status, now).next().is_none() && self.quiet_from(period) <= now
    }
}

/// What a ledger as read asks of the writer, share-wise.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Upkeep {
    /// A write is due now: a release is due, or a demand expired.
    pub due_now: bool,
    /// When one will be next without any event: the earliest live demand expires, or the quiet
    /// period of an idle ledger (no reservations, allotments, live demands) ends while a quiet
    /// release would then be due. Not while a cluster of the project is unsettled: settling
    /// marks the project for a write anyway.
    pub next: Option<Timestamp>,
}

/// What the ledger `spec`/`status` (as read) needs, share-wise, at `now`.
pub fn upkeep(
    spec: &QuotaLedgerSpec,
    status: &QuotaLedgerStatus,
    activity: &Activity,
    project_unsettled: bool,
    settings: Settings,
    now: Timestamp,
) -> Result<Upkeep, QuantityError> {
    let slack = kkp_quota_crds::shares::slack(&spec.quota, settings.slack_percent);
    let quiet = activity.quiet(status, project_unsettled, settings.quiet_period, now);
    let releasing = release(spec, status, &slack, quiet)?.is_some();
    let due_now = releasing || !demands_to_expire(&status.demands, now).is_empty();
    let mut next = live_demands(status, now).map(|d| d.expires_at).min();
    // A busy ledger needs a change (an event) before it can be quiet, an unsettled project its
    // settling (which marks it for a write); an idle one is looked at again when its quiet period
    // ends.
    if !releasing
        && !quiet
        && !project_unsettled
        && !busy(status, now)
        && release(spec, status, &slack, true)?.is_some()
    {
        next = Some(activity.quiet_from(settings.quiet_period));
    }
    Ok(Upkeep { due_now, next })
}

#[cfg(test)]
mod tests {

    use super::*;
    use kkp_quota_crds::ledger::{Allotment, Reservation};
    use kkp_quota_crds::quota_ledger::LedgerShares;
    use kkp_quota_crds::shares::slack;
    use kkp_quota_crds::{LedgerSubject, Resource};
    use proptest::prelude::*;

    use kkp_quota_crds::fixtures::cpu;

    use kkp_quota_crds::fixtures::at;

    fn spec(limit: i64, granted: i64, target: Option<i64>) -> QuotaLedgerSpec {
        QuotaLedgerSpec {
            rollout_allowance: None,
            subject: LedgerSubject::project("p"),
            quota: cpu(limit),
            shares: Some(LedgerShares {
                version: 1,
                granted: cpu(granted),
                target: target.map(cpu).unwrap_or_default(),
                ..LedgerShares::default()
            }),
            reserved_counts: false,
        }
    }

    fn status(local: i64, reserved: i64, allotted: i64, released: i64) -> QuotaLedgerStatus {
        QuotaLedgerStatus {
            local_usage: Some(cpu(local)),
            reservations: (reserved > 0)
                .then(|| Reservation {
                    cluster: "c".into(),
                    uid: "u".into(),
                    size: cpu(reserved),
                    reserved: cpu(reserved),
                    created_at: at(0),
                    deployment: None,
                })
                .into_iter()
                .collect(),
            allotments: (allotted > 0)
                .then(|| Allotment {
                    holder: "h".into(),
                    granted: cpu(allotted),
                    expires_at: at(1000),
                    ttl_seconds: None,
                })
                .into_iter()
                .collect(),
            released: (released > 0).then(|| cpu(released)),
            ..QuotaLedgerStatus::default()
        }
    }

    fn demand(holder: &str, amount: i64, expires_at: Timestamp) -> ShareDemand {
        ShareDemand {
            holder: holder.into(),
            amount: cpu(amount),
            expires_at,
            ttl_seconds: None,
        }
    }

    const SETTINGS: Settings = Settings {
        quiet_period: SignedDuration::from_secs(30),
        slack_percent: 10,
    };

    #[test]
    fn a_lowered_target_is_released_down_to_max_of_target_and_committed() {
        let slack = cpu(1);
        // Nothing committed: down to the target.
        let r = release(&spec(16, 10, Some(4)), &status(0, 0, 0, 0), &slack, false)
            .unwrap()
            .unwrap();
        assert_eq!(
            (r.amount.clone(), r.released.clone(), r.why),
            (cpu(6), cpu(6), Why::Target)
        );
        // Already released: nothing more.
        assert_eq!(
            release(&spec(16, 10, Some(4)), &status(0, 0, 0, 6), &slack, false).unwrap(),
            None
        );
        // 5 committed (2 used, 1 reserved, 2 allotted): keep 5.
        let r = release(&spec(16, 10, Some(4)), &status(2, 1, 2, 0), &slack, false)
            .unwrap()
            .unwrap();
        assert_eq!(r.released, cpu(5));
        // Quiet as well: down to committed + slack where that is lower than the target.
        let r = release(&spec(16, 10, Some(8)), &status(2, 0, 0, 1), &slack, true)
            .unwrap()
            .unwrap();
        assert_eq!(
            (r.amount.clone(), r.released.clone(), r.why),
            (cpu(6), cpu(7), Why::TargetAndQuiet)
        );
        let r = release(&spec(16, 10, None), &status(2, 0, 0, 0), &slack, true)
            .unwrap()
            .unwrap();
        assert_eq!((r.amount, r.why), (cpu(7), Why::Quiet));
        // Not quiet, no target: keep everything.
        assert_eq!(
            release(&spec(16, 10, None), &status(2, 0, 0, 0), &slack, false).unwrap(),
            None
        );
    }

    #[test]
    fn no_shares_no_release() {
        let mut s = spec(16, 10, Some(0));
        s.shares = None;
        assert_eq!(release(&s, &status(0, 0, 0, 0), &cpu(0), true).unwrap(), None);
        let u = upkeep(
            &s,
            &status(0, 0, 0, 0),
            &Activity::first(&status(0, 0, 0, 0), at(0)),
            false,
            SETTINGS,
            at(1000),
        )
        .unwrap();
        assert_eq!(u, Upkeep::default());
    }

    #[test]
    fn demands_expire_at_expires_at() {
        let demands = vec![
            demand("old", 3, at(-1)),
            demand("live", 3, at(10)),
            demand("now", 3, at(0)),
        ];
        assert_eq!(demands_to_expire(&demands, at(0)), vec![0, 2]);
        assert!(demands_to_expire(&demands[1..2], at(0)).is_empty());
    }

    #[test]
    fn quiet_needs_the_period_without_signs_of_admissions() {
        let period = SETTINGS.quiet_period;
        let idle = status(2, 0, 0, 0);
        let mut a = Activity::first(&idle, at(0));
        assert!(!a.quiet(&idle, false, period, at(29)));
        assert!(a.quiet(&idle, false, period, at(30)));
        assert!(
            !a.quiet(&idle, true, period, at(30)),
            "an unsettled cluster hides admissions"
        );
        // Usage that shrinks or stays is no sign; growth is.
        a.observe(&status(1, 0, 0, 0), at(40));
        assert_eq!(a.last_active, at(0));
        a.observe(&status(3, 0, 0, 0), at(50));
        assert_eq!(a.last_active, at(50));
        // Reservations, allotments, live demands are.
        a.observe(&status(3, 1, 0, 0), at(60));
        assert_eq!(a.last_active, at(60));
        a.observe(&status(3, 0, 1, 0), at(70));
        assert_eq!(a.last_active, at(70));
        let mut with_demand = status(3, 0, 0, 0);
        with_demand.demands = vec![demand("w", 9, at(200))];
        a.observe(&with_demand, at(80));
        assert_eq!(a.last_active, at(80));
        assert!(!a.quiet(&with_demand, false, period, at(150)), "a live demand");
        // An expired demand is none.
        with_demand.demands = vec![demand("w", 9, at(85))];
        a.observe(&with_demand, at(90));
        assert_eq!(a.last_active, at(80));
        assert!(a.quiet(&with_demand, false, period, at(110)));
    }

    #[test]
    fn upkeep_is_due_now_or_when_the_quiet_period_ends() {
        let idle = status(2, 0, 0, 0);
        let a = Activity::first(&idle, at(0));
        // Target lowered: due now.
        let u = upkeep(&spec(16, 10, Some(4)), &idle, &a, false, SETTINGS, at(1)).unwrap();
        assert!(u.due_now);
        // Target at the share: due when quiet (slack 1.6 of 16: keep 3.6 of 10).
        let u = upkeep(&spec(16, 10, Some(10)), &idle, &a, false, SETTINGS, at(1)).unwrap();
        assert_eq!(
            u,
            Upkeep {
                due_now: false,
                next: Some(at(30))
            }
        );
        let u = upkeep(&spec(16, 10, Some(10)), &idle, &a, false, SETTINGS, at(30)).unwrap();
        assert!(u.due_now);
        // An unsettled cluster: not quiet, and no timer (its settling marks the project).
        let u = upkeep(&spec(16, 10, Some(10)), &idle, &a, true, SETTINGS, at(30)).unwrap();
        assert_eq!(
            u,
            Upkeep {
                due_now: false,
                next: None
            }
        );
        // Busy (a reservation): no timer; the change that ends it is an event.
        let u = upkeep(
            &spec(16, 10, Some(10)),
            &status(2, 1, 0, 0),
            &a,
            false,
            SETTINGS,
            at(1),
        )
        .unwrap();
        assert_eq!(u, Upkeep::default());
        // Nothing to give even when quiet: never due.
        let u = upkeep(&spec(16, 3, Some(10)), &idle, &a, false, SETTINGS, at(1)).unwrap();
        assert_eq!(u, Upkeep::default());
        // A live demand: due when it expires; an expired one: due now.
        let mut s = idle.clone();
        s.demands = vec![demand("w", 12, at(20)), demand("v", 12, at(25))];
        let u = upkeep(&spec(16, 10, Some(10)), &s, &a, false, SETTINGS, at(1)).unwrap();
        assert_eq!(
            u,
            Upkeep {
                due_now: false,
                next: Some(at(20))
            }
        );
        let u = upkeep(&spec(16, 10, Some(10)), &s, &a, false, SETTINGS, at(21)).unwrap();
        assert_eq!(
            u,
            Upkeep {
                due_now: true,
                next: Some(at(25))
            }
        );
    }

    proptest! {
        /// After a write carrying the release: the share covers what that write commits (when the
        /// share covered it before; never below it otherwise, since nothing is released then),
        /// `released` never decreases, and nothing committed with a target below the share is
        /// released down to the target (or to `min(target, slack)` when quiet).
        #[test]
        fn releases_keep_what_is_committed(
            granted in 0i64..40,
            released in 0i64..40,
            target in proptest::option::of(0i64..40),
            limit in 1i64..40,
            local in 0i64..20,
            reserved in 0i64..10,
            allotted in 0i64..10,
            slack_percent in 0u32..=100,
            quiet in any::<bool>(),
        ) {
            let spec = spec(limit, granted, target);
            let after = status(local, reserved, allotted, released);
            let slack = slack(&spec.quota, slack_percent);
            let committed = committed(&after).unwrap();
            let share = seed_share(&spec, Some(&after)).unwrap();
            let before = share.share().amount(Resource::Cpu);
            let r = release(&spec, &after, &slack, quiet).unwrap();
            let new_released = r.as_ref().map_or_else(|| cpu(released), |r| r.released.clone());
            let old = Quantity::from_units(released);
            prop_assert!(new_released.amount(Resource::Cpu) >= old, "released decreased");
            let held = Quantity::from_units(granted).saturating_sub_to_zero(new_released.amount(Resource::Cpu));
            let c = committed.amount(Resource::Cpu);
            if before >= c {
                prop_assert!(held >= c, "share {held} below committed {c}");
            } else {
                prop_assert!(r.is_none(), "released while over-committed");
            }
            if let Some(r) = &r {
                prop_assert!(r.amount.amount(Resource::Cpu) > Quantity::ZERO);
                prop_assert_eq!(r.released.amount(Resource::Cpu), old.checked_add(r.amount.amount(Resource::Cpu)).unwrap());
            }
            if let Some(t) = target {
                let t = Quantity::from_units(t);
                if c == Quantity::ZERO && t < before {
                    let want = if quiet { t.min(slack.amount(Resource::Cpu)) } else { t };
                    prop_assert_eq!(held, want);
                }
                // Never above the target afterwards unless committed is.
                prop_assert!(held <= t.max(c));
            }
            // A second decision from the state the write produced releases nothing more.
            let mut next = after.clone();
            next.released = Some(new_released);
            prop_assert_eq!(release(&spec, &next, &slack, quiet).unwrap(), None);
        }
    }
}
