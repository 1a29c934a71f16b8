//! What is allocated, pure: the quota limits the master's objects give each project, and their
//! sum over a group's projects.
//!
//! A project's allocation is the limit its quotas let it reach: per resource, of its KKP
//! `ResourceQuota`s, each made stricter by the `ProjectQuota` of the same name
//! ([`effective_limits`]), the greatest. Every quota counts, not only the one the seeds enforce
//! now: when that one goes, the next by name is in force. A resource a quota leaves unlimited
//! (or limits with a value this system cannot read) is unbounded; a project without any quota is
//! unbounded in everything. Allocations use a quota's convention: an absent resource is
//! unbounded.

use std::collections::BTreeMap;

use kkp_quota_crds::kkp::Project;
use kkp_quota_crds::project_quota::effective_limits;
use kkp_quota_crds::{ProjectQuota, QuotaGroupSpec, Resource, ResourceDetails, ResourceQuota};
use kube::ResourceExt as _;
use kube::core::{Selector, SelectorExt as _};

/// One KKP quota as the books hold it.
#[derive(Clone, Debug, PartialEq)]
pub struct KkpEntry {
    pub project: String,
    /// Its readable limits, without the unreadable ones (those are unbounded).
    pub limits: ResourceDetails,
    /// Being deleted (kept by master-controller's finalizer while its seeds are cleaned up): it
    /// limits nothing any more, as its deletion was checked.
    pub leaving: bool,
}

/// The master's quotas, projects and groups, as the allocation check reads them.
#[derive(Clone, Debug, Default)]
pub struct Books {
    /// KKP `ResourceQuota`s by name.
    pub kkp: BTreeMap<String, KkpEntry>,
    /// `ProjectQuota` `spec.quota`s by name (each stricter than the KKP quota of its name).
    pub ours: BTreeMap<String, ResourceDetails>,
    /// Projects not being deleted, by name: their labels.
    pub projects: BTreeMap<String, BTreeMap<String, String>>,
    /// `QuotaGroup` specs by name.
    pub groups: BTreeMap<String, QuotaGroupSpec>,
    /// Group specs allowed but perhaps not stored yet (`super::pending`), each checked beside
    /// the stored one of its name: a quota edit must fit both.
    pub pending_groups: Vec<(String, QuotaGroupSpec)>,
}

impl KkpEntry {
    pub fn of(quota: &ResourceQuota) -> KkpEntry {
        let mut limits = quota.spec.quota.limits.kkp_subset();
        for unreadable in &quota.spec.quota.unreadable {
            limits.set(unreadable.resource, None);
        }
        KkpEntry {
            project: quota.project().to_owned(),
            limits,
            leaving: quota.metadata.deletion_timestamp.is_some(),
        }
    }
}

impl Books {
    /// The books from the master's objects.
    pub fn from_objects<'a>(
        kkp: impl IntoIterator<Item = &'a ResourceQuota>,
        ours: impl IntoIterator<Item = &'a ProjectQuota>,
        projects: impl IntoIterator<Item = &'a Project>,
        groups: impl IntoIterator<Item = (String, QuotaGroupSpec)>,
    ) -> Books {
        Books {
            kkp: kkp.into_iter().map(|q| (q.name_any(), KkpEntry::of(q))).collect(),
            ours: ours
                .into_iter()
                .map(|q| (q.name_any(), q.spec.quota.clone()))
                .collect(),
            projects: projects
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .map(|p| (p.name_any(), p.labels().clone()))
                .collect(),
            groups: groups.into_iter().collect(),
            pending_groups: Vec::new(),
        }
    }

    /// The limit `project`'s quotas let it reach (absent: unbounded).
    pub fn allocated(&self, project: &str) -> ResourceDetails {
        let mut out: Option<ResourceDetails> = None;
        for (name, entry) in self
            .kkp
            .iter()
            .filter(|(_, e)| e.project == project && !e.leaving)
        {
            let limits = effective_limits(&entry.limits, self.ours.get(name));
            out = Some(match out {
                None => limits,
                Some(so_far) => greatest(&so_far, &limits),
            });
        }
        out.unwrap_or_default()
    }

    /// Only what decides `project`'s allocation: its KKP quotas and their `ProjectQuota`s (a
    /// copy to change and read again, cheaper than the whole books).
    #[must_use]
    pub fn clone_for(&self, project: &str) -> Books {
        let kkp: BTreeMap<String, KkpEntry> = self
            .kkp
            .iter()
            .filter(|(_, e)| e.project == project)
            .map(|(n, e)| (n.clone(), e.clone()))
            .collect();
        let ours = self
            .ours
            .iter()
            .filter(|(n, _)| kkp.contains_key(*n))
            .map(|(n, q)| (n.clone(), q.clone()))
            .collect();
        Books {
            kkp,
            ours,
            ..Books::default()
        }
    }

    /// The projects `group` selects, by name (none when its selector cannot be read).
    pub fn members(&self, group: &QuotaGroupSpec) -> Vec<&str> {
        let Ok(selector) = Selector::try_from(group.selector.clone()) else {
            return Vec::new();
        };
        self.projects
            .iter()
            .filter(|(_, labels)| selector.matches(labels))
            .map(|(name, _)| name.as_str())
            .collect()
    }

    /// The groups selecting `project`, by name (with the specs of [`Books::pending_groups`]).
    pub fn groups_of(&self, project: &str) -> Vec<(&str, &QuotaGroupSpec)> {
        let Some(labels) = self.projects.get(project) else {
            return Vec::new();
        };
        self.groups
            .iter()
            .chain(self.pending_groups.iter().map(|(name, spec)| (name, spec)))
            .filter(|(_, spec)| Selector::try_from(spec.selector.clone()).is_ok_and(|s| s.matches(labels)))
            .map(|(name, spec)| (name.as_str(), spec))
            .collect()
    }

    /// What `group`'s projects are allocated together, and each one's allocation.
    pub fn group_allocation(
        &self,
        group: &QuotaGroupSpec,
    ) -> (ResourceDetails, Vec<(String, ResourceDetails)>) {
        let each: Vec<(String, ResourceDetails)> = self
            .members(group)
            .into_iter()
            .map(|p| (p.to_owned(), self.allocated(p)))
            .collect();
        (sum(each.iter().map(|(_, a)| a)), each)
    }
}

/// Per resource the greater bound (absent, unbounded, is the greatest).
pub fn greatest(a: &ResourceDetails, b: &ResourceDetails) -> ResourceDetails {
    let mut out = ResourceDetails::default();
    for &r in Resource::ALL {
        if let (Some(x), Some(y)) = (a.get(r), b.get(r)) {
            out.set(r, Some(if x >= y { x } else { y }));
        }
    }
    out
}

/// Bounds added up: absent where any is absent (or where the sum does not fit a quantity). An
/// empty set of projects is allocated zero of everything.
pub fn sum<'a>(each: impl IntoIterator<Item = &'a ResourceDetails>) -> ResourceDetails {
    let mut out = ResourceDetails::zero();
    for allocation in each {
        for &r in Resource::ALL {
            let next = match (out.get(r), allocation.get(r)) {
                (Some(x), Some(y)) => x.checked_add(y).ok(),
                _ => None,
            };
            out.set(r, next);
        }
    }
    out
}

/// Whether bound `a` is above bound `b` (absent, unbounded, is above every amount).
pub fn above(a: Option<kkp_quota_crds::Quantity>, b: Option<kkp_quota_crds::Quantity>) -> bool {
    match (a, b) {
        (None, Some(_)) => true,
        (Some(x), Some(y)) => x > y,
        _ => false,
    }
}
