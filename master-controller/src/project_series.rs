//! The per-project series (`kkp_quota_limit`, `_usage`, `_reserved`, `_over_limit`, `_share`,
//! `_share_stuck`), kept as plain figures and written straight into the `/metrics` text.
//!
//! Why not the registry's gauges: at 10,000 projects over 3 seeds these are ~390,000 series. A
//! heap profile of the master at that scale (issue #16) found the registry's gauges holding
//! ~150 MB (each series its own label strings and descriptor), and every scrape copying them all
//! again into protobuf structs before encoding (another ~200 MB at its peak). Here a project is
//! one small record, and a scrape writes text from it directly.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::ops::Bound;
use std::sync::{Mutex, PoisonError};

use kkp_quota_crds::{Resource, ResourceDetails};
use kkp_quota_runtime::ops::{Cursor, ExtraSeries};

use crate::metrics::as_f64;

/// One project's figures, as its series show them. Per resource, in [`Resource::ALL`]'s order.
#[derive(Default)]
struct Figures {
    /// The limit, for limited resources.
    limit: Vec<Option<f64>>,
    /// Global usage, once known.
    global: Option<Vec<f64>>,
    /// Whether global usage is above the limit (compared as quantities, not floats), once known.
    over: Option<Vec<bool>>,
    /// Per seed: its usage.
    seeds: BTreeMap<String, Vec<f64>>,
    /// What cluster autoscalers may still add: `"global"` and per seed, the amounts above zero.
    reserved: BTreeMap<String, Vec<(Resource, f64)>>,
    /// Per seed in the share record: (resource, share, stuck share), limited resources only.
    shares: BTreeMap<String, Vec<(Resource, f64, f64)>>,
}

impl Figures {
    fn is_empty(&self) -> bool {
        self.limit.iter().all(Option::is_none)
            && self.global.is_none()
            && self.over.is_none()
            && self.seeds.is_empty()
            && self.reserved.is_empty()
            && self.shares.is_empty()
    }
}

/// Every project's figures, by project name.
#[derive(Default)]
pub struct ProjectSeries(Mutex<BTreeMap<String, Figures>>);

impl ProjectSeries {
    fn with(&self, project: &str, f: impl FnOnce(&mut Figures)) {
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let figures = all.entry(project.to_owned()).or_default();
        f(figures);
        if figures.is_empty() {
            all.remove(project);
        }
    }

    /// Limits, and global usage when known (an unknown one leaves the last known in place).
    pub fn set_quota(&self, project: &str, limit: &ResourceDetails, global: Option<&ResourceDetails>) {
        self.with(project, |f| {
            f.limit = Resource::ALL.iter().map(|&r| limit.get(r).map(as_f64)).collect();
            if let Some(g) = global {
                f.global = Some(Resource::ALL.iter().map(|&r| as_f64(g.amount(r))).collect());
                f.over = Some(
                    Resource::ALL
                        .iter()
                        .map(|&r| limit.get(r).is_some_and(|l| g.amount(r) > l))
                        .collect(),
                );
            }
        });
    }

    /// One seed's usage of a project.
    pub fn set_seed_usage(&self, project: &str, seed: &str, local: &ResourceDetails) {
        let usage = Resource::ALL.iter().map(|&r| as_f64(local.amount(r))).collect();
        self.with(project, |f| {
            f.seeds.insert(seed.to_owned(), usage);
        });
    }

    /// What the project's cluster autoscalers may still add: over every seed (`None`: no seed
    /// reports it) and per seed that reports it. Only amounts above zero have a series (most
    /// projects reserve nothing, and a series per resource and seed for each would be most of a
    /// scrape); series of seeds and resources no longer given go.
    pub fn set_reserved<'a>(
        &self,
        project: &str,
        global: Option<&ResourceDetails>,
        seeds: impl IntoIterator<Item = (&'a str, &'a ResourceDetails)>,
    ) {
        let amounts = |d: &ResourceDetails| {
            d.iter()
                .filter(|(_, q)| *q > kkp_quota_crds::Quantity::ZERO)
                .map(|(r, q)| (r, as_f64(q)))
                .collect::<Vec<_>>()
        };
        let reserved = global
            .map(|g| ("global".to_owned(), amounts(g)))
            .into_iter()
            .chain(seeds.into_iter().map(|(seed, r)| (seed.to_owned(), amounts(r))))
            .filter(|(_, amounts)| !amounts.is_empty())
            .collect();
        self.with(project, |f| f.reserved = reserved);
    }

    /// The shares of a project's seeds in its record (limited resources), `stuck` for the
    /// unreachable ones; seeds not in `shares` lose their share series.
    pub fn set_shares(
        &self,
        project: &str,
        shares: &BTreeMap<String, ResourceDetails>,
        stuck: &BTreeMap<String, ResourceDetails>,
    ) {
        self.with(project, |f| {
            f.shares = shares
                .iter()
                .map(|(seed, share)| {
                    let held = stuck.get(seed);
                    let per_resource = share
                        .iter()
                        .map(|(r, amount)| (r, as_f64(amount), held.map_or(0.0, |h| as_f64(h.amount(r)))))
                        .collect();
                    (seed.clone(), per_resource)
                })
                .filter(|(_, per_resource): &(String, Vec<_>)| !per_resource.is_empty())
                .collect();
        });
    }

    /// Every series of a project goes (its quota is gone).
    pub fn forget_project(&self, project: &str) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(project);
    }

    /// A seed's usage series go, in every project (the seed left the fleet).
    pub fn forget_seed(&self, seed: &str) {
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        for figures in all.values_mut() {
            figures.seeds.remove(seed);
            figures.reserved.remove(seed);
        }
        all.retain(|_, f| !f.is_empty());
    }
}

/// Projects per part of a scrape: a part is written under the lock, so the lock is held for
/// a part at a time, and the body in flight is a part (~250 KB), not the whole text.
const PART: usize = 256;

/// One family: its name, help, and how one project's samples of it are written.
struct Family {
    name: &'static str,
    help: &'static str,
    samples: fn(&mut String, &'static str, &str, &Figures),
}

/// The six families, in the order a scrape writes them.
const FAMILIES: [Family; 6] = [
    Family {
        name: "kkp_quota_limit",
        help: "Quota limit per project and resource (cores, bytes, count).",
        samples: |out, name, project, f| {
            for (&r, limit) in Resource::ALL.iter().zip(&f.limit) {
                if let Some(limit) = limit {
                    sample(out, name, &[("project", project), ("resource", r.name())], *limit);
                }
            }
        },
    },
    Family {
        name: "kkp_quota_usage",
        help: "Usage per project and resource; scope is \"global\" or the seed name.",
        samples: |out, name, project, f| {
            let scopes = f
                .global
                .iter()
                .map(|g| ("global", g))
                .chain(f.seeds.iter().map(|(seed, usage)| (seed.as_str(), usage)));
            for (scope, usage) in scopes {
                for (&r, used) in Resource::ALL.iter().zip(usage) {
                    let labels = [("project", project), ("resource", r.name()), ("scope", scope)];
                    sample(out, name, &labels, *used);
                }
            }
        },
    },
    Family {
        name: "kkp_quota_reserved",
        help: "What a project's cluster autoscalers may still add (max size minus replicas, times the Machine size), not counted in its usage; scope is \"global\" or the seed name.",
        samples: |out, name, project, f| {
            for (scope, reserved) in &f.reserved {
                for (r, amount) in reserved {
                    let labels = [
                        ("project", project),
                        ("resource", r.name()),
                        ("scope", scope.as_str()),
                    ];
                    sample(out, name, &labels, *amount);
                }
            }
        },
    },
    Family {
        name: "kkp_quota_over_limit",
        help: "1 while a project's usage is above its limit (e.g. after the quota was lowered).",
        samples: |out, name, project, f| {
            for (&r, over) in Resource::ALL.iter().zip(f.over.iter().flatten()) {
                let value = if *over { 1.0 } else { 0.0 };
                sample(out, name, &[("project", project), ("resource", r.name())], value);
            }
        },
    },
    Family {
        name: "kkp_quota_share",
        help: "Share of a project's limit a seed holds as the master sees it (granted minus released).",
        samples: |out, name, project, f| share_samples(out, name, project, f, |(_, share, _)| share),
    },
    Family {
        name: "kkp_quota_share_stuck",
        help: "Share held by a seed that cannot be reached (0 while it can): it cannot be moved.",
        samples: |out, name, project, f| share_samples(out, name, project, f, |(_, _, stuck)| stuck),
    },
];

/// One project's samples of a share family, `value` picking the figure from (resource, share,
/// stuck share).
fn share_samples(
    out: &mut String,
    name: &str,
    project: &str,
    f: &Figures,
    value: fn((Resource, f64, f64)) -> f64,
) {
    for (seed, per_resource) in &f.shares {
        for &entry in per_resource {
            let labels = [("project", project), ("resource", entry.0.name()), ("seed", seed)];
            sample(out, name, &labels, value(entry));
        }
    }
}

impl ExtraSeries for ProjectSeries {
    /// At most [`PART`] projects of one family per part.
    fn encode_part(&self, at: &mut Cursor, out: &mut String) -> bool {
        let Some(family) = FAMILIES.get(at.family) else {
            return true;
        };
        if at.after.is_none() {
            header(out, family.name, family.help);
        }
        let all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let from = match &at.after {
            Some(last) => Bound::Excluded(last.as_str()),
            None => Bound::Unbounded,
        };
        let mut written = 0;
        let mut last = None;
        for (project, figures) in all.range::<str, _>((from, Bound::Unbounded)).take(PART) {
            (family.samples)(out, family.name, project, figures);
            written += 1;
            last = Some(project);
        }
        if written < PART {
            at.family += 1;
            at.after = None;
        } else {
            at.after = last.cloned();
        }
        at.family >= FAMILIES.len()
    }
}

fn header(out: &mut String, name: &str, help: &str) {
    let help = help.replace('\\', "\\\\").replace('\n', "\\n");
    let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n");
}

/// One sample; label names in the order given (alphabetical, as the registry writes them).
fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: f64) {
    out.push_str(name);
    out.push('{');
    for (i, (label, v)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(label);
        out.push_str("=\"");
        for c in v.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    let _ = writeln!(out, "}} {value}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use kkp_quota_crds::Quantity;

    fn two_cpu() -> ResourceDetails {
        ResourceDetails {
            cpu: Some(Quantity::from_units(2)),
            ..ResourceDetails::default()
        }
    }

    fn text(series: &ProjectSeries) -> String {
        let mut out = String::new();
        kkp_quota_runtime::ops::encode_all(series, &mut out);
        out
    }

    #[test]
    fn a_scrape_in_parts_writes_each_family_once_and_whole() {
        let series = ProjectSeries::default();
        let cpu = two_cpu();
        let projects = 2 * PART + 7;
        for i in 0..projects {
            series.set_quota(&format!("p{i:04}"), &cpu, Some(&cpu));
        }
        let text = text(&series);
        for Family { name, .. } in FAMILIES {
            assert_eq!(
                text.matches(&format!("# TYPE {name} gauge\n")).count(),
                1,
                "{name}"
            );
        }
        let limits: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("kkp_quota_limit{"))
            .collect();
        assert_eq!(limits.len(), projects, "every project once");
        let mut sorted = limits.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted, limits, "in order, none twice");
        // A family's samples follow its header, before the next family's.
        let usage = text.find("# TYPE kkp_quota_usage").unwrap();
        let last_limit = text.rfind("kkp_quota_limit{").unwrap();
        assert!(last_limit < usage);
    }

    #[test]
    fn label_values_are_escaped() {
        let mut out = String::new();
        sample(&mut out, "m", &[("a", "x\"y\\z\nw")], 1.5);
        assert_eq!(out, "m{a=\"x\\\"y\\\\z\\nw\"} 1.5\n");
    }

    #[test]
    fn a_project_with_nothing_left_is_dropped() {
        let series = ProjectSeries::default();
        let cpu = two_cpu();
        series.set_seed_usage("demo", "seed-a", &cpu);
        assert!(text(&series).contains("scope=\"seed-a\""));
        series.forget_seed("seed-a");
        assert!(series.0.lock().unwrap().is_empty());
        series.set_quota("demo", &cpu, None);
        series.set_quota("demo", &ResourceDetails::default(), None);
        assert!(
            series.0.lock().unwrap().is_empty(),
            "no limit, no usage: nothing to show"
        );
    }
}
