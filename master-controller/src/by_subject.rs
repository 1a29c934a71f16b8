//! Which master `ResourceQuota`s each subject (a project, a user) has, kept from the quota watch
//! ([`QuotasBySubject::observe`]). A quota's siblings are asked for on every quota event, every
//! `Project` event and every reconcile (which of a project's quotas is in force,
//! `crate::not_in_force`); scanning every quota each time made the master's cold start over
//! 10,000 quotas quadratic in the controller's CPU.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use kkp_quota_crds::ResourceQuota;
use kube::runtime::watcher::Event;

/// A quota's subject: its kind and name.
type Subject = (String, String);

/// See the module. Cheap to clone (shared).
#[derive(Clone, Default)]
pub struct QuotasBySubject(Arc<Mutex<Index>>);

#[derive(Default)]
struct Index {
    names: HashMap<Subject, BTreeSet<String>>,
    subject_of: HashMap<String, Subject>,
    /// What a relist has brought so far (from `Init` to `InitDone`), replacing the index at its
    /// end: a quota deleted while the watch was down is gone from the new list.
    relisting: Option<Vec<(String, Subject)>>,
}

fn subject_of(quota: &ResourceQuota) -> Subject {
    (quota.spec.subject.kind.clone(), quota.spec.subject.name.clone())
}

fn name_of(quota: &ResourceQuota) -> String {
    quota.metadata.name.clone().unwrap_or_default()
}

impl Index {
    fn insert(&mut self, name: String, subject: Subject) {
        if let Some(old) = self.subject_of.get(&name)
            && *old != subject
        {
            let old = old.clone();
            self.remove(&name, &old);
        }
        self.names
            .entry(subject.clone())
            .or_default()
            .insert(name.clone());
        self.subject_of.insert(name, subject);
    }

    fn remove(&mut self, name: &str, subject: &Subject) {
        if let Some(names) = self.names.get_mut(subject) {
            names.remove(name);
            if names.is_empty() {
                self.names.remove(subject);
            }
        }
        self.subject_of.remove(name);
    }
}

impl QuotasBySubject {
    fn with<T>(&self, f: impl FnOnce(&mut Index) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Follows one event of the quota watch (the same events the reflector's store applies).
    pub fn observe(&self, event: &Event<ResourceQuota>) {
        self.with(|index| match event {
            Event::Apply(quota) => index.insert(name_of(quota), subject_of(quota)),
            Event::Delete(quota) => {
                let name = name_of(quota);
                if let Some(subject) = index.subject_of.get(&name).cloned() {
                    index.remove(&name, &subject);
                }
            }
            Event::Init => index.relisting = Some(Vec::new()),
            Event::InitApply(quota) => index
                .relisting
                .get_or_insert_with(Vec::new)
                .push((name_of(quota), subject_of(quota))),
            Event::InitDone => {
                let listed = index.relisting.take().unwrap_or_default();
                index.names.clear();
                index.subject_of.clear();
                for (name, subject) in listed {
                    index.insert(name, subject);
                }
            }
        });
    }

    /// The names of every quota whose subject is `kind`/`name`, in name order.
    pub fn of(&self, kind: &str, name: &str) -> Vec<String> {
        let subject = (kind.to_owned(), name.to_owned());
        self.with(|index| {
            index
                .names
                .get(&subject)
                .map(|names| names.iter().cloned().collect())
                .unwrap_or_default()
        })
    }

    /// The names of the other quotas with `quota`'s subject.
    pub fn siblings(&self, quota: &ResourceQuota) -> Vec<String> {
        let own = name_of(quota);
        let mut names = self.of(&quota.spec.subject.kind, &quota.spec.subject.name);
        names.retain(|n| *n != own);
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::not_in_force::tests::quota;

    #[test]
    fn follows_applies_deletes_moves_and_relists() {
        let index = QuotasBySubject::default();
        let kind = quota("x", "x").spec.subject.kind;
        for (name, project) in [("b", "demo"), ("a", "demo"), ("c", "other")] {
            index.observe(&Event::Apply(quota(name, project)));
        }
        assert_eq!(index.of(&kind, "demo"), ["a", "b"]);
        assert_eq!(index.siblings(&quota("a", "demo")), ["b"]);
        // A quota moved to another subject leaves the old one.
        index.observe(&Event::Apply(quota("b", "other")));
        assert_eq!(index.of(&kind, "demo"), ["a"]);
        assert_eq!(index.of(&kind, "other"), ["b", "c"]);
        index.observe(&Event::Delete(quota("c", "other")));
        assert_eq!(index.of(&kind, "other"), ["b"]);
        // A relist replaces everything at its end: "a" was deleted while the watch was down.
        index.observe(&Event::Init);
        index.observe(&Event::InitApply(quota("b", "other")));
        assert_eq!(
            index.of(&kind, "demo"),
            ["a"],
            "the old index serves until the list is done"
        );
        index.observe(&Event::InitApply(quota("d", "demo")));
        index.observe(&Event::InitDone);
        assert_eq!(index.of(&kind, "demo"), ["d"]);
        assert_eq!(index.of(&kind, "other"), ["b"]);
        assert!(index.of(&kind, "nobody").is_empty());
    }
}
