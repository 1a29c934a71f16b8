//! How long a ledger's demands, allotments and reservations live, as one observer judges them
//! (issue #32, finding 8). `expiresAt` and `createdAt` are written by the webhook's clock; judged
//! by another machine's clock, a skew of 30 s expires every demand on arrival, a skew of a minute
//! drops allotments still in use, and a reservation judged by a clock far enough ahead goes
//! before its Machine appears (its headroom admitted again meanwhile). So an entry that carries `ttlSeconds` lives, for each observer, `ttlSeconds` from the
//! moment that observer first saw it (this `expiresAt` of this holder), by the observer's own
//! clock. It first sees an entry at or after the write, so it never counts it shorter-lived
//! than the writer meant (an allotment is never removed while its holder may admit from it); an
//! observer that restarts counts entries anew, which only makes them live longer. Entries
//! without `ttlSeconds` (older writers) keep their `expiresAt`. A reservation's lifetime is the
//! observer's own (`--reservation-ttl`): it counts from when the observer first saw the
//! reservation, so [`Observed`] gives each one with `createdAt` replaced by that moment.
//!
//! [`Lifetimes::observe`] gives the status with each `expiresAt` replaced by the observer's
//! judgement, for deciding only: never write it back (each entry is its holder's).

use std::collections::{HashMap, HashSet};

use jiff::{SignedDuration, Timestamp};

use crate::ledger::{Allotment, Reservation};
use crate::quota_ledger::{QuotaLedgerStatus, ShareDemand};

/// `ttlSeconds` for a lifetime of `ttl`: whole seconds, rounded up (never shorter than meant).
pub fn ttl_seconds(ttl: std::time::Duration) -> u64 {
    ttl.as_secs().saturating_add(u64::from(ttl.subsec_nanos() > 0))
}

/// Which list of a ledger's status an entry is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EntryKind {
    Demand,
    Allotment,
    Reservation,
}

impl EntryKind {
    pub const ALL: &'static [EntryKind] = &[EntryKind::Demand, EntryKind::Allotment, EntryKind::Reservation];

    /// The metrics label value.
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::Demand => "demand",
            EntryKind::Allotment => "allotment",
            EntryKind::Reservation => "reservation",
        }
    }
}

/// One entry's identity: a renewal writes a new `expiresAt`, so it is a new entry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    kind: EntryKind,
    holder: String,
    expires_at: Timestamp,
}

/// The clock skew seen on an entry seen for the first time: the observer's clock minus the
/// writer's at the write (`expiresAt − ttlSeconds`), in seconds. It includes the delay from the
/// write to the observation, so it is an upper bound on how far the observer is ahead, and a
/// lower bound (negated) on how far it is behind.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Skew {
    pub kind: EntryKind,
    pub seconds: f64,
}

/// What [`Lifetimes::observe`] gives: the entries as this observer judges them.
#[derive(Clone, Debug, PartialEq)]
pub struct Observed {
    /// `status.demands`, each `expiresAt` replaced by when this observer judges it expires.
    pub demands: Vec<ShareDemand>,
    /// `status.allotments`, likewise.
    pub allotments: Vec<Allotment>,
    /// `status.reservations`, each `createdAt` replaced by when this observer first saw it.
    pub reservations: Vec<Reservation>,
    /// The skew seen on each entry seen for the first time now.
    pub skews: Vec<Skew>,
}

impl Observed {
    /// `status` with the judged entries in place of its own.
    pub fn status(self, status: &QuotaLedgerStatus) -> QuotaLedgerStatus {
        QuotaLedgerStatus {
            allotments: self.allotments,
            demands: self.demands,
            reservations: self.reservations,
            ..status.clone()
        }
    }
}

/// When one observer first saw each entry of each ledger, by its own clock.
#[derive(Clone, Debug, Default)]
pub struct Lifetimes {
    ledgers: HashMap<String, HashMap<Key, Timestamp>>,
}

impl Lifetimes {
    pub fn new() -> Lifetimes {
        Lifetimes::default()
    }

    /// Takes in one read of `ledger`'s `status` at `now` (this observer's clock): remembers
    /// entries new to it, forgets those gone from the ledger, and gives its demands and
    /// allotments as this observer judges them.
    pub fn observe(&mut self, ledger: &str, status: &QuotaLedgerStatus, now: Timestamp) -> Observed {
        let before = self.ledgers.remove(ledger).unwrap_or_default();
        let mut seen = HashMap::new();
        let mut skews = Vec::new();
        let mut judge = |kind: EntryKind, holder: &str, expires_at: Timestamp, ttl: Option<u64>| {
            let Some(ttl) = ttl else {
                return expires_at;
            };
            let ttl = SignedDuration::from_secs(i64::try_from(ttl).unwrap_or(i64::MAX));
            let key = Key {
                kind,
                holder: holder.to_owned(),
                expires_at,
            };
            let first = if let Some(&first) = before.get(&key) {
                first
            } else {
                if let Ok(written) = expires_at.checked_sub(ttl) {
                    skews.push(Skew {
                        kind,
                        seconds: now.duration_since(written).as_secs_f64(),
                    });
                }
                now
            };
            seen.insert(key, first);
            first.saturating_add(ttl).unwrap_or(Timestamp::MAX)
        };
        let demands: Vec<ShareDemand> = status
            .demands
            .iter()
            .map(|d| ShareDemand {
                expires_at: judge(EntryKind::Demand, &d.holder, d.expires_at, d.ttl_seconds),
                ..d.clone()
            })
            .collect();
        let allotments: Vec<Allotment> = status
            .allotments
            .iter()
            .map(|a| Allotment {
                expires_at: judge(EntryKind::Allotment, &a.holder, a.expires_at, a.ttl_seconds),
                ..a.clone()
            })
            .collect();
        let reservations: Vec<Reservation> = status
            .reservations
            .iter()
            .map(|r| {
                let key = Key {
                    kind: EntryKind::Reservation,
                    holder: format!("{}/{}", r.cluster, r.uid),
                    expires_at: r.created_at,
                };
                let first = before.get(&key).copied().unwrap_or_else(|| {
                    skews.push(Skew {
                        kind: EntryKind::Reservation,
                        seconds: now.duration_since(r.created_at).as_secs_f64(),
                    });
                    now
                });
                seen.insert(key, first);
                Reservation {
                    created_at: first,
                    ..r.clone()
                }
            })
            .collect();
        if !seen.is_empty() {
            self.ledgers.insert(ledger.to_owned(), seen);
        }
        Observed {
            demands,
            allotments,
            reservations,
            skews,
        }
    }

    /// Forgets a ledger that is gone.
    pub fn forget(&mut self, ledger: &str) {
        self.ledgers.remove(ledger);
    }

    /// Forgets every ledger not in `present` (after a fresh list).
    pub fn keep_only(&mut self, present: &HashSet<&str>) {
        self.ledgers.retain(|name, _| present.contains(name.as_str()));
    }

    /// How many entries are remembered (for tests and bounds).
    pub fn len(&self) -> usize {
        self.ledgers.values().map(HashMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.ledgers.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ResourceDetails;
    use crate::shares::objects::live_demands;

    use crate::fixtures::at;

    fn demand(holder: &str, expires: i64, ttl: Option<u64>) -> ShareDemand {
        ShareDemand {
            holder: holder.into(),
            amount: ResourceDetails::default(),
            expires_at: at(expires),
            ttl_seconds: ttl,
        }
    }

    fn allotment(holder: &str, expires: i64, ttl: Option<u64>) -> Allotment {
        Allotment {
            holder: holder.into(),
            granted: ResourceDetails::default(),
            expires_at: at(expires),
            ttl_seconds: ttl,
        }
    }

    fn status(demands: Vec<ShareDemand>, allotments: Vec<Allotment>) -> QuotaLedgerStatus {
        QuotaLedgerStatus {
            allotments,
            demands,
            ..QuotaLedgerStatus::default()
        }
    }

    #[test]
    fn ttl_seconds_round_up() {
        assert_eq!(ttl_seconds(std::time::Duration::from_secs(30)), 30);
        assert_eq!(ttl_seconds(std::time::Duration::from_millis(1)), 1);
        assert_eq!(ttl_seconds(std::time::Duration::ZERO), 0);
    }

    #[test]
    fn a_writer_clock_behind_does_not_expire_a_demand_on_arrival() {
        // The webhook's clock is 30 s behind: it writes at its 70 (our 100) a demand for 30 s.
        let mut l = Lifetimes::new();
        let s = status(vec![demand("w", 100, Some(30))], vec![]);
        let seen = l.observe("q", &s, at(100));
        assert_eq!(seen.demands[0].expires_at, at(130));
        assert_eq!(live_demands(&seen.clone().status(&s), at(100)).count(), 1);
        assert_eq!(
            seen.skews,
            vec![Skew {
                kind: EntryKind::Demand,
                seconds: 30.0
            }]
        );
        // Seen again later: judged from the first sight, and no new skew.
        let again = l.observe("q", &s, at(129));
        assert_eq!(live_demands(&again.clone().status(&s), at(129)).count(), 1);
        assert!(again.skews.is_empty());
        assert_eq!(
            live_demands(&l.observe("q", &s, at(130)).status(&s), at(130)).count(),
            0
        );
        // The written status is untouched.
        assert_eq!(s.demands[0].expires_at, at(100));
    }

    #[test]
    fn an_observer_clock_ahead_keeps_an_allotment_its_whole_lifetime() {
        // The seed-controller is 60 s ahead: the holder's `expiresAt` 120 reads as 60 s old.
        let mut l = Lifetimes::new();
        let s = status(vec![], vec![allotment("w", 120, Some(120))]);
        let seen = l.observe("q", &s, at(60));
        assert_eq!(seen.allotments[0].expires_at, at(180));
        assert_eq!(seen.skews[0].kind, EntryKind::Allotment);
        assert!((seen.skews[0].seconds - 60.0).abs() < f64::EPSILON);
    }

    #[test]
    fn a_renewal_is_a_new_entry_and_gone_entries_are_forgotten() {
        let mut l = Lifetimes::new();
        l.observe("q", &status(vec![demand("w", 30, Some(30))], vec![]), at(0));
        // Renewed at 20: new `expiresAt`, lives from when it is seen.
        let renewed = l.observe("q", &status(vec![demand("w", 50, Some(30))], vec![]), at(20));
        assert_eq!(renewed.demands[0].expires_at, at(50));
        assert_eq!(l.len(), 1);
        // Gone, then back (an older read): seen anew, so it lives longer, never shorter.
        l.observe("q", &status(vec![], vec![]), at(21));
        assert!(l.is_empty());
        let back = l.observe("q", &status(vec![demand("w", 50, Some(30))], vec![]), at(25));
        assert_eq!(back.demands[0].expires_at, at(55));
        l.forget("q");
        assert!(l.is_empty());
    }

    #[test]
    fn a_reservation_lives_its_ttl_from_when_the_observer_first_saw_it() {
        // The webhook's clock is 90 s behind: a reservation it dates 10 reads, at our 100, as
        // 90 s old; with a 2 minute TTL it would go at our 130, maybe before its Machine exists.
        let mut l = Lifetimes::new();
        let r = Reservation {
            cluster: "c".into(),
            uid: "u".into(),
            size: ResourceDetails::default(),
            reserved: ResourceDetails::default(),
            created_at: at(10),
            deployment: None,
        };
        let s = QuotaLedgerStatus {
            reservations: vec![r],
            ..QuotaLedgerStatus::default()
        };
        let seen = l.observe("q", &s, at(100));
        assert_eq!(seen.reservations[0].created_at, at(100));
        assert_eq!(seen.skews[0].kind, EntryKind::Reservation);
        assert!((seen.skews[0].seconds - 90.0).abs() < f64::EPSILON);
        // Later reads keep the first sight; the written status is untouched.
        let again = l.observe("q", &s, at(200));
        assert_eq!(again.reservations[0].created_at, at(100));
        assert!(again.skews.is_empty());
        assert_eq!(s.reservations[0].created_at, at(10));
    }

    #[test]
    fn entries_without_a_lifetime_keep_their_expiry_and_ledgers_are_apart() {
        let mut l = Lifetimes::new();
        let s = status(vec![demand("old", 10, None)], vec![allotment("w", 40, Some(30))]);
        let seen = l.observe("a", &s, at(0));
        assert_eq!(seen.demands[0].expires_at, at(10));
        assert_eq!(seen.allotments[0].expires_at, at(30));
        assert_eq!(seen.skews.len(), 1);
        // Another ledger with the same entry is its own.
        let other = l.observe("b", &s, at(5));
        assert_eq!(other.allotments[0].expires_at, at(35));
        l.keep_only(&HashSet::from(["b"]));
        assert_eq!(l.len(), 1);
    }
}
