//! Whether an edit on the master keeps every `allocation` group within its limit, and whether a
//! group owner may make it, pure (docs/groups.md, "Allocation mode").
//!
//! - A quota edit (KKP `ResourceQuota` or `ProjectQuota`: create, update, delete) that loosens
//!   a limit is refused when, for an `allocation` group selecting its project that caps that
//!   resource, the group's projects would then be allocated more than the cap. Whether an edit
//!   loosens is read from the object before and after (as the API server sends them), never
//!   from caches, which may lag or hold edits that never landed: a `ResourceQuota` or
//!   `ProjectQuota` with a limit raised or removed, a `ProjectQuota` deleted, a KKP quota deleted
//!   or moved to another project (its old project loses it), and a KKP quota created for a
//!   project that has one already (a project's first quota only ever lowers it from unlimited).
//!   Everything else always passes, even in a group over its cap.
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
    /// A KKP `ResourceQuota`: `old` as stored (`None`: a create), `new` as it will be (`None`:
    /// a delete).
    Kkp {
        name: String,
        old: Option<KkpEntry>,
        new: Option<KkpEntry>,
    },
    /// A `ProjectQuota`'s `spec.quota`: `old` as stored (`None`: a create), `new` as it will be
    /// (`None`: a delete).
    Ours {
        name: String,
        project: String,
        old: Option<ResourceDetails>,
        new: Option<ResourceDetails>,
    },
    /// A `QuotaGroup`: `old` as stored (`None`: a create), `new` as it will be (`None`: a
    /// delete).
    Group {
        name: String,
        old: Option<QuotaGroupSpec>,
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
    let mut refusals = match edit {
        Edit::Group {
            name,
            old,
            new: Some(new),
        } => group_edit(books, name, old.as_ref(), new),
        Edit::Group { new: None, .. } => Vec::new(),
        Edit::Kkp { .. } | Edit::Ours { .. } => quota_changes(books, edit)
            .into_iter()
            .flat_map(|(project, kkp, ours, may_loosen)| quota_edit(books, project, kkp, ours, &may_loosen))
            .collect(),
    };
    // A group and its copy being changed (`Books::pending_groups`) may refuse alike.
    let mut seen = BTreeSet::new();
    refusals.retain(|r| seen.insert(r.clone()));
    if refusals.is_empty() {
        Verdict::Allowed
    } else {
        Verdict::Denied(refusals.join("; "))
    }
}

/// One project's quotas changed (a KKP quota replaced, `None`: removed from it; or a
/// `ProjectQuota`), and the resources the change may loosen.
type QuotaChange<'a> = (
    &'a str,
    Option<(&'a String, Option<&'a KkpEntry>)>,
    Option<(&'a String, Option<&'a ResourceDetails>)>,
    Vec<Resource>,
);

/// The resources whose limit `new` loosens from `old` (an absent limit is no limit).
fn loosened(old: Option<&ResourceDetails>, new: Option<&ResourceDetails>) -> Vec<Resource> {
    let none = ResourceDetails::default();
    let (old, new) = (old.unwrap_or(&none), new.unwrap_or(&none));
    Resource::ALL
        .iter()
        .copied()
        .filter(|&r| above(new.get(r), old.get(r)))
        .collect()
}

/// What a quota edit changes, project by project, and what it may loosen there.
fn quota_changes<'a>(books: &'a Books, edit: &'a Edit) -> Vec<QuotaChange<'a>> {
    let mut changes: Vec<QuotaChange<'a>> = Vec::new();
    match edit {
        Edit::Kkp { name, old, new } => {
            if let Some(n) = new {
                let kept = old.as_ref().filter(|o| o.project == n.project);
                let may_loosen = match kept {
                    Some(o) => loosened(Some(&o.limits), Some(&n.limits)),
                    // Created, or moved in: only a project that has a quota already can gain.
                    None if books
                        .kkp
                        .iter()
                        .any(|(k, e)| e.project == n.project && k != name && !e.leaving) =>
                    {
                        Resource::ALL.to_vec()
                    }
                    None => Vec::new(),
                };
                changes.push((n.project.as_str(), Some((name, Some(n))), None, may_loosen));
            }
            // Deleted, or moved out: its old project loses it (unlimited if it was the only one).
            if let Some(o) = old
                .as_ref()
                .filter(|o| new.as_ref().is_none_or(|n| n.project != o.project))
            {
                changes.push((
                    o.project.as_str(),
                    Some((name, None)),
                    None,
                    Resource::ALL.to_vec(),
                ));
            }
        }
        // A `ProjectQuota` of a KKP quota being deleted tightens nothing any more.
        Edit::Ours { name, .. } if books.kkp.get(name).is_some_and(|e| e.leaving) => {}
        // A `ProjectQuota` tightens the KKP quota of its name, whose project it is.
        Edit::Ours {
            name,
            project,
            old,
            new,
        } => {
            let project = books
                .kkp
                .get(name)
                .map_or(project.as_str(), |e| e.project.as_str());
            changes.push((
                project,
                None,
                Some((name, new.as_ref())),
                loosened(old.as_ref(), new.as_ref()),
            ));
        }
        Edit::Group { .. } => {}
    }
    changes.retain(|(.., may_loosen)| !may_loosen.is_empty());
    changes
}

/// Whether a quota edit may loosen some limit (what the record must hold before the edit is
/// allowed: an edit that loosens nothing cannot take a group over).
pub fn raises(books: &Books, edit: &Edit) -> bool {
    !quota_changes(books, edit).is_empty()
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
    // Groups are RBAC's to guard: refusing owners here could lock an admin who is also an owner
    // out of the very group that names them.
    let projects: BTreeSet<&str> = match edit {
        Edit::Group { .. } => return None,
        Edit::Kkp { name, old, new } => old
            .iter()
            .chain(new)
            .map(|e| e.project.as_str())
            .chain(books.kkp.get(name).map(|e| e.project.as_str()))
            .collect(),
        Edit::Ours { name, project, .. } => std::iter::once(project.as_str())
            .chain(books.kkp.get(name).map(|e| e.project.as_str()))
            .collect(),
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

/// `project`'s allocation after one KKP quota is replaced (`None`: removed) or one
/// `ProjectQuota` (counting its other quotas as the books hold them).
fn allocated_after(
    books: &Books,
    project: &str,
    kkp: Option<(&String, Option<&KkpEntry>)>,
    ours: Option<(&String, Option<&ResourceDetails>)>,
) -> ResourceDetails {
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
    after_books.allocated(project)
}

/// The refusals for an edit of `project`'s quotas (one KKP quota replaced, `None`: removed; or
/// one `ProjectQuota`) that may loosen the resources `may_loosen`.
fn quota_edit(
    books: &Books,
    project: &str,
    kkp: Option<(&String, Option<&KkpEntry>)>,
    ours: Option<(&String, Option<&ResourceDetails>)>,
    may_loosen: &[Resource],
) -> Vec<String> {
    let after = allocated_after(books, project, kkp, ours);
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
        for &r in may_loosen {
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
/// `old` is the group as stored (the request's `oldObject`), never a cache's: "no worse" is
/// judged against what is there.
fn group_edit(books: &Books, name: &str, old: Option<&QuotaGroupSpec>, new: &QuotaGroupSpec) -> Vec<String> {
    if new.mode != GroupMode::Allocation {
        return Vec::new();
    }
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
