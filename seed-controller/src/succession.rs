//! A ledger deleted and re-created (issue #32, finding 2): its successor's first count carries
//! what the predecessor held last.
//!
//! The webhook answers admissions from a ledger's reservations and allotments before the Machines
//! they admit reach the user cluster's API server. A ledger forced away mid-burst (deleted with
//! its finalizer stripped, its CRD re-installed) takes with it the record of Machines admitted
//! but not created yet; a successor counted from what runs would miss them, admit their room
//! again and release share that is still in use: an overrun (two runs of the fleet test saw 12
//! and 14 Machines on a 10-cpu quota). So seed-controller keeps the last state of each project's
//! ledger as its watch saw it (the `DELETED` event carries the final one), and the first write of
//! an uncounted successor takes in the predecessor's reservations, allotments, rollout surges
//! and last known sizes beside the count. From there the usual rules settle them: a reservation
//! goes when its Machine is counted, a new Machine is held back while an allotment may cover it.
//! A carried allotment is renamed (`<holder>/carried`), so that its holder does not take it for
//! its own and remove it: it shrinks by what the holder records of its admissions on the old
//! ledger, and the rest goes when the admission record grace ends.
//!
//! An uncounted ledger the watch has not shown yet is not counted: its watch event (which comes
//! after its predecessor's deletion) asks for the write. A watch that has not shown it after
//! [`UNSEEN_LIMIT`] is broken or far behind: the ledger is counted then without a predecessor,
//! rather than refusing growth for good.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use jiff::{SignedDuration, Timestamp};
use kkp_quota_crds::ledger::lifetimes::ttl_seconds;
use kkp_quota_crds::ledger::{Allotment, carried_holder};
use kkp_quota_crds::{QuotaLedger, QuotaLedgerStatus};
use kube::ResourceExt as _;
use kube::runtime::watcher::Event;

/// Takes one event of the writer's ledger watch in, before the watch's own record of each
/// project's ledger (`crate::view::Ledgers`) does: that record still shows what it replaces.
pub fn observe(shared: &crate::Shared, event: &Result<Event<QuotaLedger>, kube::runtime::watcher::Error>) {
    let Ok(event) = event else { return };
    let project = match event {
        Event::Apply(l) | Event::InitApply(l) | Event::Delete(l) => l.project(),
        Event::Init | Event::InitDone => return,
    };
    let mut state = shared.state();
    let state = &mut *state;
    let shown = state.ledgers.of(project).map(|l| &**l);
    state.successions.observe(shown, event, Instant::now());
}

/// How long an uncounted ledger waits for the watch to show it before it is counted all the same.
pub const UNSEEN_LIMIT: Duration = Duration::from_secs(10);

/// The last state of a project's deleted ledger.
#[derive(Debug, Clone)]
struct Predecessor {
    uid: String,
    status: QuotaLedgerStatus,
    gone_at: Instant,
}

/// What an uncounted ledger's first write starts from.
#[derive(Debug, PartialEq)]
pub enum Succession<'a> {
    /// The watch has not shown this ledger yet: no write until it has.
    Unseen,
    /// The project's first ledger on this seed (or its predecessor is long gone).
    First,
    /// It replaces a deleted ledger, whose last status is this.
    After(&'a QuotaLedgerStatus),
}

/// Each project's deleted ledger, as the watch last saw it. Which ledger is current is the
/// watch's own record (`crate::view::Ledgers`), read before it takes an event in.
#[derive(Debug, Default)]
pub struct Successions {
    predecessors: HashMap<String, Predecessor>,
    /// Project -> an uncounted ledger (by UID) the watch had not shown when a write first
    /// wanted it, and when.
    unseen: HashMap<String, (String, Instant)>,
}

impl Successions {
    /// Takes one watch event in, given the project's ledger as the watch showed it before
    /// (`shown`): a deletion makes the deleted ledger (in its final state) the predecessor, and
    /// so does a ledger with another UID than the shown one (its deletion was missed while the
    /// watch re-listed).
    pub fn observe(&mut self, shown: Option<&QuotaLedger>, event: &Event<QuotaLedger>, now: Instant) {
        match event {
            Event::Apply(ledger) | Event::InitApply(ledger) => {
                if let Some(old) = shown.filter(|old| old.uid() != ledger.uid()) {
                    self.gone(ledger.project(), old, now);
                }
            }
            Event::Delete(ledger) => self.gone(ledger.project(), ledger, now),
            Event::Init | Event::InitDone => {}
        }
    }

    fn gone(&mut self, project: &str, ledger: &QuotaLedger, now: Instant) {
        let uid = ledger.uid().unwrap_or_default();
        let status = ledger.status.clone().unwrap_or_default();
        // A ledger deleted before its first count never took in its own predecessor's entries:
        // they pass on to the next one.
        let status = match self.predecessors.remove(project) {
            Some(older) if status.local_usage.is_none() && older.uid != uid => {
                inherit(&status, &older.status)
            }
            _ => status,
        };
        self.predecessors.insert(
            project.to_owned(),
            Predecessor {
                uid,
                status,
                gone_at: now,
            },
        );
    }

    /// What the uncounted ledger `uid` of `project` starts from, the watch showing the ledger
    /// `shown_uid` for the project. A predecessor gone longer than `keep` ago is no longer
    /// carried: every admission from it has long become a Machine (counted) or expired.
    pub fn for_uncounted(
        &mut self,
        project: &str,
        uid: &str,
        shown_uid: Option<&str>,
        now: Instant,
        keep: Duration,
    ) -> Succession<'_> {
        if shown_uid != Some(uid) {
            let since = match self.unseen.get(project) {
                Some((u, since)) if u == uid => *since,
                _ => {
                    self.unseen.insert(project.to_owned(), (uid.to_owned(), now));
                    now
                }
            };
            if now.saturating_duration_since(since) < UNSEEN_LIMIT {
                return Succession::Unseen;
            }
            return Succession::First;
        }
        self.unseen.remove(project);
        match self.predecessors.get(project) {
            Some(p) if p.uid != uid && now.saturating_duration_since(p.gone_at) < keep => {
                Succession::After(&p.status)
            }
            _ => Succession::First,
        }
    }

    /// Forgets predecessors gone longer than `keep` ago.
    pub fn prune(&mut self, now: Instant, keep: Duration) {
        self.predecessors
            .retain(|_, p| now.saturating_duration_since(p.gone_at) < keep);
        self.unseen
            .retain(|_, (_, since)| now.saturating_duration_since(*since) < keep);
    }
}

/// `successor` with the entries of `predecessor` it does not have: reservations (by cluster and
/// UID), allotments (by holder), rollout surges and last known sizes (by cluster and UID). Its
/// own entries win; `localUsage`, `released`, demands and the master's fields stay its own.
pub fn inherit(successor: &QuotaLedgerStatus, predecessor: &QuotaLedgerStatus) -> QuotaLedgerStatus {
    let mut status = successor.clone();
    take_missing(&mut status.reservations, &predecessor.reservations, |a, b| {
        (&a.cluster, &a.uid) == (&b.cluster, &b.uid)
    });
    take_missing(&mut status.allotments, &predecessor.allotments, |a, b| {
        a.holder == b.holder
    });
    take_missing(&mut status.rollout_surges, &predecessor.rollout_surges, |a, b| {
        (&a.cluster, &a.uid) == (&b.cluster, &b.uid)
    });
    take_missing(
        &mut status.last_known_sizes,
        &predecessor.last_known_sizes,
        |a, b| (&a.cluster, &a.uid) == (&b.cluster, &b.uid),
    );
    status
}

/// [`inherit`] for a successor's first count at `now`: the allotments taken in are renamed as
/// carried ([`carried_holder`]) and live `grace` from now (`--admission-record-grace`, the time
/// an admitted Machine takes to show), not their holders' TTL. They cover the Machines admitted
/// from them before the deletion and still on their way: no holder admits from an entry in a
/// ledger it has not written (its admissions without a write check the ledger's UID), and no
/// holder removes a carried entry (it is not its own), so they cover those Machines whatever the
/// holder records of them; seed-controller removes them when the grace ends.
pub fn inherit_for_count(
    successor: &QuotaLedgerStatus,
    predecessor: &QuotaLedgerStatus,
    now: Timestamp,
    grace: Duration,
) -> QuotaLedgerStatus {
    let carried = QuotaLedgerStatus {
        allotments: renamed_as_carried(&predecessor.allotments),
        ..predecessor.clone()
    };
    let mut status = inherit(successor, &carried);
    let expires_at = SignedDuration::try_from(grace)
        .ok()
        .and_then(|g| now.checked_add(g).ok())
        .unwrap_or(now);
    for allotment in &mut status.allotments {
        if !successor.allotments.iter().any(|o| o.holder == allotment.holder) {
            allotment.expires_at = expires_at;
            allotment.ttl_seconds = Some(ttl_seconds(grace));
        }
    }
    status
}

/// `allotments` under their carried names, one entry per name: a holder's entry carried before
/// and the one it wrote on the ledger since are carried as one, granting both.
fn renamed_as_carried(allotments: &[Allotment]) -> Vec<Allotment> {
    let mut carried: Vec<Allotment> = Vec::with_capacity(allotments.len());
    for allotment in allotments {
        let holder = carried_holder(&allotment.holder);
        let same = carried.iter_mut().find(|c| c.holder == holder);
        let summed = same.and_then(|c| Some((c.granted.checked_add(&allotment.granted).ok()?, c)));
        match summed {
            Some((granted, entry)) => entry.granted = granted,
            // (Sums that overflow stay apart.)
            None => carried.push(Allotment {
                holder,
                ..allotment.clone()
            }),
        }
    }
    carried
}

/// Appends to `own` each entry of `theirs` it has no `same` entry for.
fn take_missing<T: Clone>(own: &mut Vec<T>, theirs: &[T], same: impl Fn(&T, &T) -> bool) {
    for entry in theirs {
        if !own.iter().any(|o| same(o, entry)) {
            own.push(entry.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use kkp_quota_crds::fixtures::{at, cpu};
    use kkp_quota_crds::ledger::{Allotment, Reservation};

    use super::*;

    const KEEP: Duration = Duration::from_mins(2);

    fn reservation(uid: &str) -> Reservation {
        Reservation {
            cluster: "alpha".into(),
            uid: uid.into(),
            size: cpu(1),
            reserved: cpu(1),
            created_at: at(0),
            deployment: None,
        }
    }

    fn allotment(holder: &str, granted: i64) -> Allotment {
        Allotment {
            holder: holder.into(),
            granted: cpu(granted),
            expires_at: at(120),
            ttl_seconds: Some(120),
        }
    }

    fn held(reservations: &[&str], allotments: &[(&str, i64)]) -> QuotaLedgerStatus {
        QuotaLedgerStatus {
            local_usage: Some(cpu(3)),
            reservations: reservations.iter().map(|u| reservation(u)).collect(),
            allotments: allotments.iter().map(|(h, g)| allotment(h, *g)).collect(),
            ..QuotaLedgerStatus::default()
        }
    }

    #[test]
    fn a_successor_takes_in_what_it_lacks_and_keeps_its_own() {
        let old = held(&["u1", "u2"], &[("a", 4), ("b", 2)]);
        let new = QuotaLedgerStatus {
            reservations: vec![reservation("u2"), reservation("u3")],
            allotments: vec![allotment("b", 1)],
            ..QuotaLedgerStatus::default()
        };
        let merged = inherit(&new, &old);
        let uids: Vec<&str> = merged.reservations.iter().map(|r| r.uid.as_str()).collect();
        assert_eq!(uids, ["u2", "u3", "u1"]);
        assert_eq!(merged.allotments, [allotment("b", 1), allotment("a", 4)]);
        // Its own count, not the predecessor's.
        assert_eq!(merged.local_usage, None);
    }

    #[test]
    fn carried_allotments_live_the_grace_and_the_successors_own_keep_theirs() {
        let old = held(&[], &[("a", 4), ("b", 2)]);
        let new = QuotaLedgerStatus {
            allotments: vec![allotment("b", 1)],
            ..QuotaLedgerStatus::default()
        };
        let merged = inherit_for_count(&new, &old, at(1000), Duration::from_secs(5));
        assert_eq!(merged.allotments[0], allotment("b", 1));
        // Both of the predecessor's come in renamed, b's beside b's own entry: the process that
        // wrote b again on the new ledger does not take the carried one for its own.
        let carried: Vec<_> = merged.allotments[1..]
            .iter()
            .map(|a| (a.holder.as_str(), a.expires_at, a.ttl_seconds))
            .collect();
        assert_eq!(
            carried,
            [("a/carried", at(1005), Some(5)), ("b/carried", at(1005), Some(5))]
        );
        // Carried again (the successor deleted after its count): renamed once only.
        let again = inherit_for_count(
            &QuotaLedgerStatus::default(),
            &merged,
            at(1001),
            Duration::from_secs(5),
        );
        let holders: Vec<&str> = again.allotments.iter().map(|a| a.holder.as_str()).collect();
        assert_eq!(holders, ["b/carried", "a/carried"]);
        assert_eq!(again.allotments[0].granted, cpu(3), "b's own 1 and its carried 2");
    }

    fn ledger(uid: &str, status: QuotaLedgerStatus) -> QuotaLedger {
        let mut ledger = QuotaLedger::new(
            "project-demo",
            kkp_quota_crds::QuotaLedgerSpec {
                subject: kkp_quota_crds::LedgerSubject::project("demo"),
                quota: cpu(8),
                shares: None,
                rollout_allowance: None,
                reserved_counts: false,
            },
        );
        ledger.metadata.uid = Some(uid.to_owned());
        ledger.status = Some(status);
        ledger
    }

    #[test]
    fn a_deleted_ledger_is_the_predecessor_of_the_next() {
        let now = Instant::now();
        let mut s = Successions::default();
        let old = ledger("old", held(&["u1"], &[("a", 4)]));
        s.observe(None, &Event::Apply(old.clone()), now);
        assert_eq!(
            s.for_uncounted("demo", "old", Some("old"), now, KEEP),
            Succession::First
        );
        s.observe(Some(&old), &Event::Delete(old.clone()), now);
        // Not seen by the watch yet: no count, unless the watch stays silent too long.
        assert_eq!(
            s.for_uncounted("demo", "new", None, now, KEEP),
            Succession::Unseen
        );
        assert_eq!(
            s.for_uncounted("demo", "new", None, now + UNSEEN_LIMIT, KEEP),
            Succession::First
        );
        let new = ledger("new", QuotaLedgerStatus::default());
        s.observe(None, &Event::Apply(new), now);
        let carried = old.status.as_ref().unwrap();
        assert_eq!(
            s.for_uncounted("demo", "new", Some("new"), now, KEEP),
            Succession::After(carried)
        );
        // Long after, nothing is carried.
        assert_eq!(
            s.for_uncounted("demo", "new", Some("new"), now + KEEP, KEEP),
            Succession::First
        );
    }

    #[test]
    fn a_deletion_missed_by_a_relisting_watch_is_seen_by_the_new_uid() {
        let now = Instant::now();
        let mut s = Successions::default();
        let old = ledger("old", held(&["u1"], &[]));
        s.observe(
            Some(&old),
            &Event::InitApply(ledger("new", QuotaLedgerStatus::default())),
            now,
        );
        assert_eq!(
            s.for_uncounted("demo", "new", Some("new"), now, KEEP),
            Succession::After(old.status.as_ref().unwrap())
        );
    }

    #[test]
    fn entries_pass_through_a_successor_deleted_before_its_count() {
        let now = Instant::now();
        let mut s = Successions::default();
        let first = ledger("1", held(&["u1"], &[("a", 4)]));
        s.observe(Some(&first), &Event::Delete(first.clone()), now);
        let second = ledger(
            "2",
            QuotaLedgerStatus {
                reservations: vec![reservation("u2")],
                ..QuotaLedgerStatus::default()
            },
        );
        s.observe(Some(&second), &Event::Delete(second.clone()), now);
        let Succession::After(carried) = s.for_uncounted("demo", "3", Some("3"), now, KEEP) else {
            panic!("no predecessor");
        };
        let uids: Vec<&str> = carried.reservations.iter().map(|r| r.uid.as_str()).collect();
        assert_eq!(uids, ["u2", "u1"]);
        assert_eq!(carried.allotments.len(), 1);
        s.prune(now + KEEP, KEEP);
        assert_eq!(
            s.for_uncounted("demo", "3", Some("3"), now, KEEP),
            Succession::First
        );
    }
}
