//! What one write of a project's quota copy does, decided without I/O from one snapshot of the
//! state and one read of the copy: the `localUsage`, the reservations, allotments and demands it
//! drops, the Machines held back or judged, the `lastKnownSizes` it writes ([`decide`]); the
//! status that write produces
//! ([`status_after`], from which the share release is computed); its compare-and-swap patch
//! ([`ledger_patch`]); and when the ledger next needs a write although nothing changes
//! ([`ledger_due`]).

use std::collections::HashSet;
use std::time::Instant;

use jiff::{SignedDuration, Timestamp};
use kkp_quota_crds::autoscaled::{AutoscaledDeployment, counted_rooms};
use kkp_quota_crds::ledger::group;
use kkp_quota_crds::quota_ledger::LEDGER_FORMAT;
use kkp_quota_crds::rollout::{self, Presence};
use kkp_quota_crds::{
    LastKnownSize, QuantityError, QuotaLedger, QuotaLedgerSpec, QuotaLedgerStatus, ResourceDetails,
};
use kube::ResourceExt;
use serde_json::{Value, json};

use crate::Config;
use crate::ledger::{
    DropReason, allotments_to_expire, grace_ends, held_back, remaining, reservations_to_drop, unadmitted,
    usage_without_held,
};
use crate::shares::{self, Release};
use crate::state::ProjectPlan;

/// What one write of a project's quota copy does, from one snapshot and one read of the copy.
pub(super) struct Decision {
    /// `localUsage`: the plan's usage without the held-back Machines.
    pub(super) local_usage: ResourceDetails,
    /// `reservedUsage` to write (the autoscalers' room), when known (`ProjectPlan`). Under the
    /// policy `reservedCounts`, the rooms counted in `localUsage`.
    pub(super) reserved_usage: Option<ResourceDetails>,
    /// `status.autoscaled` to write, when known and not what the copy read has.
    pub(super) autoscaled: Option<Vec<AutoscaledDeployment>>,
    /// Reservations dropped (by index).
    pub(super) drops: Vec<(usize, DropReason)>,
    /// Allotments removed (by index).
    pub(super) expired: Vec<usize>,
    /// Share demands removed (by index): their `expiresAt` has passed.
    pub(super) demands_expired: Vec<usize>,
    /// The copy read had allotments: a Machine judged unadmitted had its grace to be recorded.
    pub(super) had_allotments: bool,
    /// `(cluster, uid)` of Machines held back (not counted, not judged).
    pub(super) held: Vec<(String, String)>,
    /// When the earliest held-back Machine's grace ends.
    pub(super) grace_end: Option<Instant>,
    /// `(cluster, uid)` of appeared Machines judged now, and those of them with no reservation.
    pub(super) checked: Vec<(String, String)>,
    pub(super) bypassed: Vec<(String, String)>,
    /// `status.lastKnownSizes` to write, when it is not what the copy read has.
    pub(super) last_known: Option<Vec<LastKnownSize>>,
    /// Rollout surges removed (by index): the Machine each replaced, or the surge itself, is gone.
    pub(super) surges_ended: Vec<usize>,
}

impl Decision {
    /// Whether the `localUsage` or `reservedUsage` to write is not what `status` has (a write
    /// is due for them).
    pub(super) fn usage_differs(&self, status: &QuotaLedgerStatus) -> bool {
        let same = |written: Option<&ResourceDetails>, wanted: &ResourceDetails| {
            written.is_some_and(|w| crate::usage::same_usage(w, wanted))
        };
        !same(status.local_usage.as_ref(), &self.local_usage)
            || self.autoscaled.is_some()
            || self
                .reserved_usage
                .as_ref()
                .is_some_and(|r| !same(status.reserved_usage.as_ref(), r))
    }
}

pub(super) fn decide(
    plan: &ProjectPlan,
    spec: &QuotaLedgerSpec,
    status: &QuotaLedgerStatus,
    config: &Config,
) -> Result<Decision, QuantityError> {
    let ttl = SignedDuration::try_from(config.reservation_ttl).unwrap_or(SignedDuration::MAX);
    let grace = config.admission_record_grace;
    let now = Timestamp::now();
    let instant = Instant::now();
    let drops = reservations_to_drop(&status.reservations, &plan.counted, now, ttl);
    let expired = allotments_to_expire(&status.allotments, plan.project_unsettled, now);
    let demands_expired = shares::demands_to_expire(&status.demands, now);
    // A Machine is left out of the count only while an allotment that stays in the written copy
    // may cover it. In a write that removes an expired allotment nothing is held back: the
    // removed one may have covered it (its holder died), and a Machine counted twice for a moment
    // is safe where one counted nowhere is not. An allotment granting nothing covers nothing
    // (its holder admits nothing from it).
    let has_allotments = expired.is_empty() && status.allotments.iter().any(|a| !a.granted.is_empty());
    let held = held_back(
        &plan.appeared,
        &status.reservations,
        has_allotments,
        instant,
        grace,
    );
    let local_usage = usage_without_held(&plan.local_usage, &plan.counted, &plan.appeared, &held)?;
    let kept = remaining(&status.reservations, drops.iter().map(|(i, _)| *i));
    let (entries, counting) = autoscaled_entries(plan, status);
    // Without the policy no room counts, but a Machine admitted from one while it was on (and
    // not counted yet) still does; and no entry is written, so that the webhook admits from a
    // room only once a write under the policy counts it.
    let (local_usage, reserved_usage, autoscaled) = if spec.reserved_counts {
        let rooms = counted_rooms(&counting, &kept)?;
        (local_usage.checked_add(&rooms)?, Some(rooms), entries)
    } else {
        let coming = counted_rooms(&[], &kept)?;
        (
            local_usage.checked_add(&coming)?,
            plan.reserved_usage.clone(),
            Vec::new(),
        )
    };
    let held_set: HashSet<usize> = held.iter().copied().collect();
    let judged: Vec<_> = plan
        .appeared
        .iter()
        .enumerate()
        .filter(|(i, _)| !held_set.contains(i))
        .map(|(_, a)| a)
        .collect();
    Ok(Decision {
        local_usage,
        reserved_usage,
        autoscaled: (autoscaled != status.autoscaled).then_some(autoscaled),
        expired,
        demands_expired,
        had_allotments: !status.allotments.is_empty(),
        grace_end: grace_ends(&plan.appeared, &held, grace),
        held: held.iter().map(|&i| plan.appeared[i].key()).collect(),
        checked: judged.iter().map(|a| a.key()).collect(),
        bypassed: unadmitted(judged.iter().copied(), &status.reservations),
        last_known: last_known_change(&plan.last_known, &status.last_known_sizes),
        surges_ended: surges_ended(plan, status, &drops),
        drops,
    })
}

/// The autoscaled deployments to write (under the policy `reservedCounts`), and those whose
/// rooms this write counts: the plan's, and for a cluster whose deployments have not been listed
/// yet, the ledger's own (written as they are, counted with no members: each room its whole
/// nominal size, more than it is, never less).
fn autoscaled_entries(
    plan: &ProjectPlan,
    status: &QuotaLedgerStatus,
) -> (Vec<AutoscaledDeployment>, Vec<AutoscaledDeployment>) {
    let standing: Vec<&AutoscaledDeployment> = status
        .autoscaled
        .iter()
        .filter(|a| plan.autoscaled_unknown.contains(&a.cluster))
        .collect();
    let mut written = plan.autoscaled.clone();
    written.extend(standing.iter().map(|a| (*a).clone()));
    let mut counting = plan.autoscaled.clone();
    counting.extend(standing.iter().map(|a| AutoscaledDeployment {
        members: ResourceDetails::zero(),
        ..(*a).clone()
    }));
    (written, counting)
}

/// The rollout surges that end with this write: the Machine each replaced is gone, or the surge
/// Machine is: seen deleted, or never created (another admission webhook refused it, or the
/// webhook's answer was lost), which shows when its reservation expires with it nowhere.
/// Otherwise the record would keep its replaced Machine taken, and the rollout stuck.
fn surges_ended(plan: &ProjectPlan, status: &QuotaLedgerStatus, drops: &[(usize, DropReason)]) -> Vec<usize> {
    let kept = remaining(&status.reservations, drops.iter().map(|(i, _)| *i));
    let reserved: HashSet<(&str, &str)> = kept
        .iter()
        .map(|r| (r.cluster.as_str(), r.uid.as_str()))
        .collect();
    rollout::ended(
        &status.rollout_surges,
        |cluster, uid| plan.presence(cluster, uid),
        |cluster, uid| {
            plan.seen_gone(cluster, uid)
                || (plan.presence(cluster, uid) == Presence::Gone && !reserved.contains(&(cluster, uid)))
        },
    )
}

/// The plan's `lastKnownSizes` (sorted), if the copy read does not hold the same.
fn last_known_change(planned: &[LastKnownSize], read: &[LastKnownSize]) -> Option<Vec<LastKnownSize>> {
    let mut read = read.to_vec();
    crate::state::sort_last_known(&mut read);
    (planned != read.as_slice()).then(|| planned.to_vec())
}

/// The status the write of `decision` produces from `status` as read: its `localUsage`, the
/// reservations, allotments and demands it keeps, the rest (`released` among it) as read.
pub(super) fn status_after(status: &QuotaLedgerStatus, decision: &Decision) -> QuotaLedgerStatus {
    QuotaLedgerStatus {
        local_usage: Some(decision.local_usage.clone()),
        reserved_usage: decision
            .reserved_usage
            .clone()
            .or_else(|| status.reserved_usage.clone()),
        reservations: remaining(&status.reservations, decision.drops.iter().map(|(i, _)| *i)),
        allotments: remaining(&status.allotments, decision.expired.iter().copied()),
        demands: remaining(&status.demands, decision.demands_expired.iter().copied()),
        last_known_sizes: decision
            .last_known
            .clone()
            .unwrap_or_else(|| status.last_known_sizes.clone()),
        rollout_surges: remaining(&status.rollout_surges, decision.surges_ended.iter().copied()),
        autoscaled: decision
            .autoscaled
            .clone()
            .unwrap_or_else(|| status.autoscaled.clone()),
        ..status.clone()
    }
}

/// The compare-and-swap merge patch of a write: `localUsage`, and what the write drops or
/// releases, conditioned on the `resourceVersion` read.
pub(super) fn ledger_patch(
    quota: &QuotaLedger,
    status: &QuotaLedgerStatus,
    decision: &Decision,
    release: Option<&Release>,
) -> Value {
    let mut patch = json!({
        "metadata": { "resourceVersion": quota.resource_version() },
        "status": { "formatVersion": LEDGER_FORMAT, "localUsage": decision.local_usage },
    });
    if let Some(reserved) = &decision.reserved_usage {
        patch["status"]["reservedUsage"] = json!(reserved);
    }
    if let Some(autoscaled) = &decision.autoscaled {
        patch["status"]["autoscaled"] = if autoscaled.is_empty() {
            Value::Null
        } else {
            json!(autoscaled)
        };
    }
    if !decision.drops.is_empty() {
        let kept = remaining(&status.reservations, decision.drops.iter().map(|(i, _)| *i));
        patch["status"]["reservations"] = if kept.is_empty() {
            Value::Null
        } else {
            json!(group(&kept))
        };
    }
    // Written only when some go, so an unchanged list (the holders' to change) is never
    // rewritten.
    if !decision.expired.is_empty() {
        let kept = remaining(&status.allotments, decision.expired.iter().copied());
        patch["status"]["allotments"] = if kept.is_empty() {
            Value::Null
        } else {
            serde_json::to_value(&kept).unwrap_or(Value::Null)
        };
    }
    // Likewise the demands (each holder's own to write).
    if !decision.demands_expired.is_empty() {
        let kept = remaining(&status.demands, decision.demands_expired.iter().copied());
        patch["status"]["demands"] = if kept.is_empty() {
            Value::Null
        } else {
            serde_json::to_value(&kept).unwrap_or(Value::Null)
        };
    }
    // Machines counted at their last known size: with the `localUsage` that counts them, so a
    // restarted controller finds them.
    if let Some(last_known) = &decision.last_known {
        patch["status"]["lastKnownSizes"] = if last_known.is_empty() {
            Value::Null
        } else {
            serde_json::to_value(last_known).unwrap_or(Value::Null)
        };
    }
    // Surges end only here; new ones are the webhook's to add (by compare-and-swap too).
    if !decision.surges_ended.is_empty() {
        let kept = remaining(&status.rollout_surges, decision.surges_ended.iter().copied());
        patch["status"]["rolloutSurges"] = if kept.is_empty() {
            Value::Null
        } else {
            serde_json::to_value(&kept).unwrap_or(Value::Null)
        };
    }
    // The release rides on this compare-and-swap: it was computed from the status this very
    // write produces, so nothing can be admitted against share on its way out.
    if let Some(release) = release {
        patch["status"]["released"] = json!(release.released);
    }
    patch
}

/// The first write of a re-created ledger writes every list it carries over from its
/// predecessor ([`crate::succession`]), not only the lists a drop changes.
pub(super) fn carry_over(patch: &mut Value, status: &QuotaLedgerStatus, decision: &Decision) {
    let after = status_after(status, decision);
    let or_null = |v: Value, empty: bool| if empty { Value::Null } else { v };
    patch["status"]["reservations"] =
        or_null(json!(group(&after.reservations)), after.reservations.is_empty());
    patch["status"]["allotments"] = or_null(json!(after.allotments), after.allotments.is_empty());
    patch["status"]["rolloutSurges"] = or_null(json!(after.rollout_surges), after.rollout_surges.is_empty());
    patch["status"]["lastKnownSizes"] =
        or_null(json!(after.last_known_sizes), after.last_known_sizes.is_empty());
    // Shown only, but kept as the predecessor had it until the deployments are listed.
    if let Some(reserved) = &after.reserved_usage {
        patch["status"]["reservedUsage"] = json!(reserved);
    }
}

/// When a quota copy's ledger next needs a write although nothing changes: its oldest
/// reservation's TTL ends, or its earliest allotment expires.
pub(super) fn ledger_due(status: &QuotaLedgerStatus, ttl: SignedDuration) -> Option<Timestamp> {
    let reservation = status
        .reservations
        .iter()
        .map(|r| r.created_at.saturating_add(ttl).unwrap_or(Timestamp::MAX))
        .min();
    let allotment = status.allotments.iter().map(|a| a.expires_at).min();
    reservation.into_iter().chain(allotment).min()
}

#[cfg(test)]
mod tests {
    use kkp_quota_crds::LastKnownSize;

    use super::last_known_change;

    fn entry(cluster: &str, uid: &str) -> LastKnownSize {
        LastKnownSize {
            cluster: cluster.into(),
            uid: uid.into(),
            machine: String::new(),
            size: kkp_quota_crds::ResourceDetails::zero(),
        }
    }

    #[test]
    fn last_known_sizes_are_written_only_when_they_differ_in_content() {
        let planned = vec![entry("a", "1"), entry("b", "2")];
        assert_eq!(
            last_known_change(&planned, &[entry("b", "2"), entry("a", "1")]),
            None
        );
        assert_eq!(
            last_known_change(&planned, &[entry("a", "1")]),
            Some(planned.clone())
        );
        assert_eq!(last_known_change(&[], &[entry("a", "1")]), Some(vec![]));
        assert_eq!(last_known_change(&[], &[]), None);
    }

    /// A surge ends with the Machine it replaced, or with itself: deleted, or never created
    /// (its reservation gone with it nowhere), and not before.
    #[test]
    fn a_surge_ends_when_either_machine_is_gone_or_the_surge_never_came() {
        use std::collections::HashSet;

        use kkp_quota_crds::fixtures::{at, cpu};
        use kkp_quota_crds::ledger::Reservation;
        use kkp_quota_crds::rollout::RolloutSurge;
        use kkp_quota_crds::{QuotaLedgerStatus, ResourceDetails};

        use super::surges_ended;
        use crate::ledger::Counted;
        use crate::state::ProjectPlan;

        let plan = |counted: &[&str], gone: &[&str]| {
            let mut c = Counted::default();
            for uid in counted {
                c.machines.insert(("c".into(), (*uid).into()), cpu(2));
            }
            c.gone = gone
                .iter()
                .map(|uid| ("c".to_owned(), (*uid).to_owned()))
                .collect();
            ProjectPlan {
                project: "p".into(),
                local_usage: ResourceDetails::default(),
                reserved_usage: None,
                autoscaled: Vec::new(),
                autoscaled_unknown: HashSet::new(),
                counted: c,
                appeared: Vec::new(),
                project_unsettled: false,
                last_known: Vec::new(),
                watched: HashSet::from(["c".to_owned()]),
                known: HashSet::from(["c".to_owned()]),
            }
        };
        let status = |reserved: bool| QuotaLedgerStatus {
            rollout_surges: vec![RolloutSurge {
                cluster: "c".into(),
                uid: "new".into(),
                machine: "ns/new".into(),
                deployment: "ns/d".into(),
                replaces: "old".into(),
                replaces_machine: "ns/old".into(),
                size: cpu(2),
                admitted_at: at(0),
            }],
            reservations: if reserved {
                vec![Reservation {
                    cluster: "c".into(),
                    uid: "new".into(),
                    size: cpu(2),
                    reserved: cpu(2),
                    created_at: at(0),
                    deployment: None,
                }]
            } else {
                Vec::new()
            },
            ..QuotaLedgerStatus::default()
        };
        let none: Vec<usize> = Vec::new();
        // Admitted, not seen yet, reserved: runs. Counted: runs.
        assert_eq!(surges_ended(&plan(&["old"], &[]), &status(true), &[]), none);
        assert_eq!(
            surges_ended(&plan(&["old", "new"], &[]), &status(false), &[]),
            none
        );
        // The replaced Machine gone (absent from the watched cluster, or seen deleted): ends.
        assert_eq!(surges_ended(&plan(&["new"], &[]), &status(false), &[]), [0]);
        assert_eq!(surges_ended(&plan(&["new"], &["old"]), &status(false), &[]), [0]);
        // The surge deleted, or never created (its reservation dropped in this very write): ends.
        assert_eq!(surges_ended(&plan(&["old"], &["new"]), &status(false), &[]), [0]);
        assert_eq!(
            surges_ended(
                &plan(&["old"], &[]),
                &status(true),
                &[(0, crate::ledger::DropReason::Expired)]
            ),
            [0]
        );
    }
}

#[cfg(test)]
mod policy_tests {
    use std::collections::HashSet;

    use jiff::Timestamp;
    use kkp_quota_crds::autoscaled::{AutoscaledDeployment, change_reservation};
    use kkp_quota_crds::fixtures::cpu;
    use kkp_quota_crds::ledger::Reservation;
    use kkp_quota_crds::{LedgerSubject, QuotaLedgerSpec, QuotaLedgerStatus, Resource, ResourceDetails};

    use super::decide;
    use crate::Config;
    use crate::ledger::Counted;
    use crate::state::ProjectPlan;

    /// `None`: cluster `c` has not listed its deployments yet.
    fn plan(autoscaled: Option<Vec<AutoscaledDeployment>>, version: &str) -> ProjectPlan {
        let mut counted = Counted::default();
        counted.machines.insert(("c".into(), "m1".into()), cpu(2));
        counted
            .deployments
            .insert(("c".into(), "d".into()), version.to_owned());
        ProjectPlan {
            project: "p".into(),
            local_usage: cpu(2),
            reserved_usage: Some(cpu(100)),
            autoscaled_unknown: if autoscaled.is_some() {
                HashSet::new()
            } else {
                HashSet::from(["c".to_owned()])
            },
            autoscaled: autoscaled.unwrap_or_default(),
            counted,
            appeared: Vec::new(),
            project_unsettled: false,
            last_known: Vec::new(),
            watched: HashSet::from(["c".to_owned()]),
            known: HashSet::from(["c".to_owned()]),
        }
    }

    fn entry(max: u32, members: i64) -> AutoscaledDeployment {
        AutoscaledDeployment {
            cluster: "c".into(),
            uid: "d".into(),
            name: "kube-system/md".into(),
            max,
            size: cpu(2),
            members: cpu(members),
        }
    }

    fn spec(reserved_counts: bool) -> QuotaLedgerSpec {
        QuotaLedgerSpec {
            subject: LedgerSubject::project("p"),
            quota: cpu(20),
            shares: None,
            rollout_allowance: None,
            reserved_counts,
        }
    }

    fn local_cpu(d: &super::Decision) -> i64 {
        let amount = d.local_usage.amount(Resource::Cpu);
        (0..100)
            .find(|&n| kkp_quota_crds::Quantity::from_units(n) == amount)
            .unwrap()
    }

    #[test]
    fn under_the_policy_the_rooms_count_and_machines_on_their_way_outlive_them() {
        let config = Config::for_tests("seed");
        let on_its_way = Reservation {
            cluster: "c".into(),
            uid: "m9".into(),
            size: cpu(2),
            reserved: ResourceDetails::zero(),
            created_at: Timestamp::now(),
            deployment: Some("d".into()),
        };
        let status = QuotaLedgerStatus {
            reservations: vec![on_its_way],
            ..QuotaLedgerStatus::default()
        };
        // max 4 of 2 cpu, one member (2 cpu): room 6; the Machine on its way is inside it.
        let d = decide(&plan(Some(vec![entry(4, 2)]), "5"), &spec(true), &status, &config).unwrap();
        assert_eq!(local_cpu(&d), 2 + 6);
        assert!(crate::usage::same_usage(
            d.reserved_usage.as_ref().unwrap(),
            &cpu(6)
        ));
        assert_eq!(
            d.autoscaled,
            Some(vec![entry(4, 2)]),
            "written: the ledger has none"
        );
        // Policy off: shown apart, not counted.
        let d = decide(
            &plan(Some(vec![entry(4, 2)]), "5"),
            &spec(false),
            &status,
            &config,
        )
        .unwrap();
        assert_eq!(
            local_cpu(&d),
            2 + 2,
            "no room, but the Machine on its way from it counts"
        );
        assert_eq!(
            d.reserved_usage,
            Some(cpu(100)),
            "the plan's, (max - replicas) x size"
        );
        assert_eq!(
            d.autoscaled, None,
            "no entries without the policy (the ledger has none)"
        );
        let had = QuotaLedgerStatus {
            autoscaled: vec![entry(4, 2)],
            ..status.clone()
        };
        let d = decide(&plan(Some(vec![entry(4, 2)]), "5"), &spec(false), &had, &config).unwrap();
        assert_eq!(
            d.autoscaled,
            Some(Vec::new()),
            "turned off: the entries go, with the rooms"
        );
        // Lowered to 1 (room 0): the Machine on its way still counts.
        let d = decide(&plan(Some(vec![entry(1, 2)]), "5"), &spec(true), &status, &config).unwrap();
        assert_eq!(local_cpu(&d), 2 + 2);
        // Deployments not listed yet: the ledger's entries count, whole.
        let listed = QuotaLedgerStatus {
            autoscaled: vec![entry(4, 2)],
            ..QuotaLedgerStatus::default()
        };
        let d = decide(&plan(None, "5"), &spec(true), &listed, &config).unwrap();
        assert_eq!((local_cpu(&d), d.autoscaled.clone()), (2 + 8, None));
        // One cluster listed (a new deployment there), another not yet: each counts its own.
        let other = AutoscaledDeployment {
            cluster: "c2".into(),
            ..entry(2, 2)
        };
        let mut mixed = plan(Some(vec![entry(4, 2)]), "5");
        mixed.autoscaled_unknown.insert("c2".into());
        let read = QuotaLedgerStatus {
            autoscaled: vec![other.clone()],
            ..QuotaLedgerStatus::default()
        };
        let d = decide(&mixed, &spec(true), &read, &config).unwrap();
        assert_eq!(
            local_cpu(&d),
            2 + 6 + 4,
            "c's room of 6, and c2's as the ledger has it, whole"
        );
        assert_eq!(d.autoscaled, Some(vec![entry(4, 2), other]));
    }

    #[test]
    fn a_change_reservation_goes_with_a_count_of_a_later_version() {
        let config = Config::for_tests("seed");
        let raise =
            change_reservation(("c", "d"), Some("5"), &cpu(4), (6, &cpu(2)), Timestamp::now()).unwrap();
        let status = QuotaLedgerStatus {
            reservations: vec![raise],
            ..QuotaLedgerStatus::default()
        };
        let d = decide(&plan(Some(vec![entry(4, 2)]), "5"), &spec(true), &status, &config).unwrap();
        assert!(
            d.drops.is_empty(),
            "the count is of the version the raise was made on"
        );
        let d = decide(&plan(Some(vec![entry(6, 2)]), "6"), &spec(true), &status, &config).unwrap();
        assert_eq!(d.drops.len(), 1);
        assert_eq!(local_cpu(&d), 2 + 10);
    }
}
