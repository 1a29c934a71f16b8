//! The seed's ledgers as the users' views need them: the latest copy of each project's, and
//! since when the seed cannot be read. Fed by the writer's watch of the ledgers
//! (`crate::writer::watch_quotas`), so the views cost no watch of their own.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use jiff::Timestamp;
use kkp_quota_crds::QuotaLedger;
use kube::runtime::watcher::{self, Event};

#[derive(Debug, Default)]
pub struct Ledgers {
    by_project: BTreeMap<String, Arc<QuotaLedger>>,
    /// The projects seen since a relist began (`None`: no relist in progress).
    relisted: Option<BTreeSet<String>>,
    /// Since when the watch fails (`None`: it works).
    unreadable_since: Option<Timestamp>,
}

impl Ledgers {
    pub fn of(&self, project: &str) -> Option<&Arc<QuotaLedger>> {
        self.by_project.get(project)
    }

    pub fn unreadable_since(&self) -> Option<Timestamp> {
        self.unreadable_since
    }

    /// The seed answered a read: `true` if it was unreadable.
    pub fn readable_again(&mut self) -> bool {
        self.unreadable_since.take().is_some()
    }

    /// A read of the seed failed or hung: `true` if it was readable.
    pub fn unreadable(&mut self, now: Timestamp) -> bool {
        let first = self.unreadable_since.is_none();
        self.unreadable_since.get_or_insert(now);
        first
    }

    /// Takes one watch event in; `true` when a view may change.
    pub fn observe(&mut self, event: &Result<Event<QuotaLedger>, watcher::Error>, now: Timestamp) -> bool {
        let Ok(event) = event else {
            return self.unreadable(now);
        };
        let recovered = self.unreadable_since.take().is_some();
        match event {
            Event::Init => {
                self.relisted = Some(BTreeSet::new());
                recovered
            }
            Event::InitApply(ledger) => {
                if let Some(seen) = self.relisted.as_mut() {
                    seen.insert(ledger.project().to_owned());
                }
                self.apply(ledger);
                true
            }
            Event::Apply(ledger) => {
                self.apply(ledger);
                true
            }
            Event::InitDone => {
                // Ledgers deleted while the watch was down are not in the new listing.
                if let Some(seen) = self.relisted.take() {
                    self.by_project.retain(|project, _| seen.contains(project));
                }
                true
            }
            Event::Delete(ledger) => self.by_project.remove(ledger.project()).is_some() || recovered,
        }
    }

    fn apply(&mut self, ledger: &QuotaLedger) {
        self.by_project
            .insert(ledger.project().to_owned(), Arc::new(ledger.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kkp_quota_crds::fixtures::{at, cpu};
    use kkp_quota_crds::{LedgerSubject, QuotaLedgerSpec};

    fn ledger(project: &str) -> QuotaLedger {
        QuotaLedger::new(
            &format!("project-{project}"),
            QuotaLedgerSpec {
                subject: LedgerSubject::project(project),
                quota: cpu(8),
                shares: None,
                rollout_allowance: None,
                reserved_counts: false,
            },
        )
    }

    fn failed() -> Result<Event<QuotaLedger>, watcher::Error> {
        Err(watcher::Error::NoResourceVersion)
    }

    #[test]
    fn follows_the_watch_and_forgets_what_a_relist_no_longer_lists() {
        let mut ledgers = Ledgers::default();
        assert!(ledgers.observe(&Ok(Event::Apply(ledger("a"))), at(0)));
        assert!(ledgers.observe(&Ok(Event::Apply(ledger("b"))), at(1)));
        assert!(ledgers.of("a").is_some() && ledgers.of("b").is_some());
        // The watch breaks: unreadable since the first failure, not the last.
        assert!(ledgers.observe(&failed(), at(2)));
        assert!(!ledgers.observe(&failed(), at(3)));
        assert_eq!(ledgers.unreadable_since(), Some(at(2)));
        // The relist after it lists only "b": "a" was deleted meanwhile.
        ledgers.observe(&Ok(Event::Init), at(4));
        assert_eq!(ledgers.unreadable_since(), None);
        ledgers.observe(&Ok(Event::InitApply(ledger("b"))), at(4));
        assert!(ledgers.of("a").is_some(), "kept until the listing is complete");
        ledgers.observe(&Ok(Event::InitDone), at(4));
        assert!(ledgers.of("a").is_none() && ledgers.of("b").is_some());
        assert!(ledgers.observe(&Ok(Event::Delete(ledger("b"))), at(5)));
        assert!(ledgers.of("b").is_none());
    }
}
