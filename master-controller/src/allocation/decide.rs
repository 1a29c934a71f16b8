//! Whether an edit on the master keeps every `allocation` group within its limit, and whether a
//! group owner may make it, pure (docs/groups.md, "Allocation mode").
//!
//! - A quota edit (KKP `ResourceQuota` or `ProjectQuota`: create, update, delete) that raises
//!   its project's allocation of some resource is refused when, for an `allocation` group
//!   selecting the project that caps that resource, the group's projects would then be
//!   allocated more than the cap. Edits that raise nothing (reductions) always pass, even in a
//!   group that is over its cap already.
//! - A group edit in `allocation` mode is refused when its projects would be allocated more than
//!   the new cap of some resource, unless the edit makes that no worse (the same selector, still
//!   `allocation`, a cap not lowered).
//! - A requester named in some group's `owners` may edit only the quotas of projects that a
//!   group they own selects, and no group at all.

use std::collections::BTreeSet;

use kkp_quota_crds::{GroupMode, QuotaGroupSpec, Resource, ResourceDetails};

use super::books::{Books, KkpEntry, above, sum};

/// What is being written.
#[derive(Clone, Debug)]
pub enum Edit {
    /// A KKP `ResourceQuota` created or changed (`new`), or deleted (`None`); `old_project` is
    /// the project it had before, if any.
    Kkp {
        name: String,
        old_project: Option<String>,
        new: Option<KkpEntry>,
    },
    /// A `ProjectQuota` (its `spec.quota`) created or changed, or deleted (`None`).
    Ours {
        name: String,
        project: String,
        new: Option<ResourceDetails>,
    },
    /// A `QuotaGroup` created or changed (`new`), or deleted (`None`).
    Group {
        name: String,
        new: Option<QuotaGroupSpec>,
    },
}

/// Who asks, as the API server authenticated them.
#[derive(Clone, Debug, Default)]
pub struct Requester {
    pub username: String,
    pub groups: Vec<String>,
}

/// The answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    Denied(String),
}

/// Decides `edit` by `who` against `books` (the objects before the edit).
pub fn decide(books: &Books, edit: &Edit, who: &Requester) -> Verdict {
    if let Some(refusal) = ownership(books, edit, who) {
        return Verdict::Denied(refusal);
    }
    let refusals = match edit {
        Edit::Group { name, new: Some(new) } => group_edit(books, name, new),
        Edit::Group { new: None, .. } => Vec::new(),
        Edit::Kkp { name, new, .. } => match new {
            Some(entry) => quota_edit(books, &entry.project, Some((name, new.as_ref())), None),
            // A deleted KKP quota leaves its project; its allocation can only grow.
            None => match books.kkp.get(name) {
                Some(old) => quota_edit(books, &old.project, Some((name, None)), None),
                None => Vec::new(),
            },
        },
        // A `ProjectQuota` tightens the KKP quota of its name, whose project it is.
        Edit::Ours { name, project, new } => {
            let project = books
                .kkp
                .get(name)
                .map_or(project.as_str(), |e| e.project.as_str());
            quota_edit(books, project, None, Some((name, new.as_ref())))
        }
    };
    if refusals.is_empty() {
        Verdict::Allowed
    } else {
        Verdict::Denied(refusals.join("; "))
    }
}

/// A group owner's edit outside their groups' projects, refused with why.
fn ownership(books: &Books, edit: &Edit, who: &Requester) -> Option<String> {
    let owned: Vec<(&str, &QuotaGroupSpec)> = books
        .groups
        .iter()
        .filter(|(_, g)| g.owners.iter().any(|o| o.is(&who.username, &who.groups)))
        .map(|(n, g)| (n.as_str(), g))
        .collect();
    if owned.is_empty() {
        return None;
    }
    let names: Vec<&str> = owned.iter().map(|(n, _)| *n).collect();
    let projects: BTreeSet<&str> = match edit {
        Edit::Group { name, .. } => {
            return Some(format!(
                "{} owns quota groups {} and may edit their projects' quotas, not group {name}",
                who.username,
                names.join(", ")
            ));
        }
        Edit::Kkp {
            name,
            old_project,
            new,
        } => old_project
            .iter()
            .map(String::as_str)
            .chain(new.as_ref().map(|e| e.project.as_str()))
            .chain(books.kkp.get(name).map(|e| e.project.as_str()))
            .collect(),
        Edit::Ours { project, .. } => BTreeSet::from([project.as_str()]),
    };
    let outside: Vec<&str> = projects
        .into_iter()
        .filter(|p| !owned.iter().any(|(_, g)| books.members(g).contains(p)))
        .collect();
    if outside.is_empty() {
        return None;
    }
    Some(format!(
        "{} owns quota groups {} and may edit only their projects' quotas: project {} is in none of them",
        who.username,
        names.join(", "),
        outside.join(", ")
    ))
}

/// The refusals for an edit of `project`'s quotas: one KKP quota replaced (`None`: deleted),
/// or one `ProjectQuota`.
fn quota_edit(
    books: &Books,
    project: &str,
    kkp: Option<(&String, Option<&KkpEntry>)>,
    ours: Option<(&String, Option<&ResourceDetails>)>,
) -> Vec<String> {
    let before = books.allocated(project);
    let mut after_books = books.clone_for(project);
    if let Some((name, entry)) = kkp {
        match entry {
            Some(entry) => after_books.kkp.insert(name.clone(), entry.clone()),
            None => after_books.kkp.remove(name),
        };
    }
    if let Some((name, quota)) = ours {
        match quota {
            Some(quota) => after_books.ours.insert(name.clone(), quota.clone()),
            None => after_books.ours.remove(name),
        };
    }
    let after = after_books.allocated(project);
    let raised: Vec<Resource> = Resource::ALL
        .iter()
        .copied()
        .filter(|&r| above(after.get(r), before.get(r)))
        .collect();
    if raised.is_empty() {
        return Vec::new();
    }
    let mut refusals = Vec::new();
    for (group, spec) in books.groups_of(project) {
        if spec.mode != GroupMode::Allocation {
            continue;
        }
        let each: Vec<(String, ResourceDetails)> = books
            .members(spec)
            .into_iter()
            .map(|m| {
                let allocation = if m == project {
                    after.clone()
                } else {
                    books.allocated(m)
                };
                (m.to_owned(), allocation)
            })
            .collect();
        let total = sum(each.iter().map(|(_, a)| a));
        for &r in &raised {
            let Some(cap) = spec.quota.get(r) else { continue };
            if above(total.get(r), Some(cap)) {
                refusals.push(format!(
                    "quota group {group} allocates at most {} to its projects; with this edit they would be allocated {} ({})",
                    r.describe(cap),
                    bound(r, total.get(r)),
                    breakdown(r, &each)
                ));
            }
        }
    }
    refusals
}

/// The refusals for a group created or changed to `new`.
fn group_edit(books: &Books, name: &str, new: &QuotaGroupSpec) -> Vec<String> {
    if new.mode != GroupMode::Allocation {
        return Vec::new();
    }
    let old = books.groups.get(name);
    let (total, each) = books.group_allocation(new);
    let mut refusals = Vec::new();
    for (r, cap) in new.quota.iter() {
        if !above(total.get(r), Some(cap)) {
            continue;
        }
        let no_worse = old.is_some_and(|old| {
            old.mode == GroupMode::Allocation
                && old.selector == new.selector
                && old.quota.get(r).is_some_and(|old_cap| cap >= old_cap)
        });
        if !no_worse {
            refusals.push(format!(
                "quota group {name} would allocate at most {}, but its projects are allocated {} already ({}): lower their quotas first",
                r.describe(cap),
                bound(r, total.get(r)),
                breakdown(r, &each)
            ));
        }
    }
    refusals
}

/// An allocation for a person: `12 cpu`, or `unlimited cpu`.
fn bound(r: Resource, amount: Option<kkp_quota_crds::Quantity>) -> String {
    match amount {
        Some(amount) => r.describe(amount),
        None => format!("unlimited {r}"),
    }
}

/// `demo 12, other unlimited`: each project's allocation of `r`.
fn breakdown(r: Resource, each: &[(String, ResourceDetails)]) -> String {
    if each.is_empty() {
        return "no projects".to_owned();
    }
    each.iter()
        .map(|(p, a)| match a.get(r) {
            Some(amount) => format!("{p} {}", r.amount(amount)),
            None => format!("{p} unlimited"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}
