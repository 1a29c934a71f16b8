//! Raises allowed but perhaps not stored yet, shared by every replica that answers the webhook,
//! pure (docs/groups.md, "Allocation mode: one decision at a time").
//!
//! The API server stores an edit only after every webhook allowed it, and each replica decides
//! from its own watch caches: two raises decided at once (by two replicas, or one after another
//! faster than a cache follows) could each fit alone and overrun together. So every allowed edit
//! of a quota in an `allocation` group is first written into one record (a `ConfigMap`, written
//! with its `resourceVersion` as a precondition), and the answer "allowed" comes only after that
//! write. A decider reads the record afresh and counts each entry over its cache
//! ([`count`]); two deciders that read the same record version cannot both write theirs, so the
//! second decides again with the first's raise counted.
//!
//! An entry is *settled* once the decider's cache shows its object at a later version than the
//! one the edit was made on (the edit was stored, or overtaken by a later edit, itself recorded):
//! then the cache alone counts. Entries leave the record only by age (the server's
//! `PENDING_FOR`, each replica timing them from when it first saw them), never because one
//! replica's cache shows them settled: another replica's cache may still lag.

use std::collections::BTreeMap;

use kkp_quota_crds::{QuotaGroupSpec, ResourceDetails};
use serde::{Deserialize, Serialize};

use super::books::{Books, KkpEntry, greatest};

/// The object an entry is about.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "camelCase")]
pub enum Object {
    /// A KKP `ResourceQuota`, by name.
    Kkp(String),
    /// A `ProjectQuota`, by name.
    Ours(String),
    /// A `QuotaGroup`, by name.
    Group(String),
}

/// One edit allowed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub object: Object,
    /// The object's UID (set before admission, also on a create).
    pub uid: String,
    /// The `resourceVersion` the edit was made on; absent for a create.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// The KKP quota's project (for a `ProjectQuota`, that of the KKP quota of its name).
    #[serde(default)]
    pub project: String,
    /// What the edit sets: the KKP quota's readable limits, or the `ProjectQuota`'s `spec.quota`
    /// (a deletion: none, so unlimited, or no tightening).
    #[serde(default)]
    pub limits: ResourceDetails,
    /// A group's new spec (an `allocation` group created or changed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<QuotaGroupSpec>,
}

/// What a decider's cache holds of an object: its UID and `resourceVersion`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cached {
    pub uid: String,
    pub version: String,
}

impl Entry {
    /// Whether `cached` shows this edit's object past the version the edit was made on.
    /// Versions are compared as the numbers the API server makes them; one that is not a number
    /// never settles anything (the entry then counts until it ages out).
    pub fn settled_by(&self, cached: Option<&Cached>) -> bool {
        let Some(cached) = cached.filter(|c| c.uid == self.uid) else {
            return false;
        };
        match &self.base {
            None => true,
            Some(base) => match (base.parse::<u64>(), cached.version.parse::<u64>()) {
                (Ok(base), Ok(now)) => now > base,
                _ => false,
            },
        }
    }
}

/// Counts the unsettled `entries` into `books`: each as the greater of what the cache shows and
/// what the edit sets (either may be what is stored when the edit lands), per resource; a
/// group's new spec beside its stored one.
pub fn count(books: &mut Books, entries: &[Entry], cached: &BTreeMap<Object, Cached>) {
    for (i, entry) in entries
        .iter()
        .enumerate()
        .filter(|(_, e)| !e.settled_by(cached.get(&e.object)))
    {
        match &entry.object {
            Object::Kkp(name) => {
                let pending = KkpEntry {
                    project: entry.project.clone(),
                    limits: entry.limits.clone(),
                    leaving: false,
                };
                match books.kkp.get_mut(name) {
                    None => {
                        books.kkp.insert(name.clone(), pending);
                    }
                    Some(now) if now.project == entry.project => {
                        now.limits = greatest(&now.limits, &entry.limits);
                    }
                    // Another project's (the subject moved, or the name was re-created for
                    // another project): both count, each for its project, the pending one
                    // without the `ProjectQuota` of the name (looser).
                    Some(_) => {
                        books.kkp.insert(format!("{name}\u{0}pending-{i}"), pending);
                    }
                }
            }
            Object::Group(name) => {
                if let Some(spec) = &entry.group {
                    books.pending_groups.push((name.clone(), spec.clone()));
                }
            }
            Object::Ours(name) => {
                let counted = match books.ours.get(name) {
                    Some(now) => greatest(now, &entry.limits),
                    None => entry.limits.clone(),
                };
                books.ours.insert(name.clone(), counted);
            }
        }
    }
}

/// The record after `new` is allowed: appended. An earlier entry of the same object stays until
/// it ages out: the later edit may yet fail while the earlier one lands.
pub fn record_after(kept: &[Entry], new: Vec<Entry>) -> Vec<Entry> {
    let mut out = kept.to_vec();
    out.extend(new);
    out
}
