//! The per-group series (`kkp_quota_group_limit`, `_usage`, `_usage_by_seed`, `_over_limit`,
//! `_budget`): set
//! after every pass of the group loop, each series of a group, project or resource no longer
//! there removed (groups are few: the registry's gauges serve).

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};

use kkp_quota_crds::{Resource, ResourceDetails};
use prometheus::{GaugeVec, Opts, Registry};

use crate::metrics::as_f64;

/// One group's figures, as its series show them.
#[derive(Debug, Clone, Default)]
pub struct GroupFigures {
    pub name: String,
    /// `spec.quota` (limited resources only).
    pub limit: ResourceDetails,
    /// What the selected projects use together, once known.
    pub usage: Option<ResourceDetails>,
    /// What they use together on each seed (its `status.bySeed`).
    pub by_seed: Vec<(String, ResourceDetails)>,
    /// A `shared` group's budget per member project, as its record holds it (granted less the
    /// release it counted).
    pub budgets: Vec<(String, ResourceDetails)>,
}

/// The five gauges, and which label sets each shows now.
pub struct GroupSeries {
    limit: GaugeVec,
    usage: GaugeVec,
    over: GaugeVec,
    budget: GaugeVec,
    by_seed: GaugeVec,
    shown: Mutex<[BTreeSet<Vec<String>>; 5]>,
}

impl GroupSeries {
    /// The gauges, registered in `registry`.
    ///
    /// # Panics
    /// When a definition is invalid or registered twice (a programming error).
    pub fn new(registry: &Registry) -> GroupSeries {
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            let g = GaugeVec::new(Opts::new(name, help), labels).expect("valid metric definition");
            registry.register(Box::new(g.clone())).expect("registered once");
            g
        };
        GroupSeries {
            limit: gauge(
                "kkp_quota_group_limit",
                "A quota group's limit (spec.quota), per limited resource.",
                &["group", "resource"],
            ),
            usage: gauge(
                "kkp_quota_group_usage",
                "What the projects a quota group selects use together.",
                &["group", "resource"],
            ),
            over: gauge(
                "kkp_quota_group_over_limit",
                "1 when a quota group's projects together use more than its limit.",
                &["group", "resource"],
            ),
            budget: gauge(
                "kkp_quota_group_budget",
                "The budget a shared quota group's record gives a member project.",
                &["group", "project", "resource"],
            ),
            by_seed: gauge(
                "kkp_quota_group_usage_by_seed",
                "What the projects a quota group selects use together on one seed.",
                &["group", "seed", "resource"],
            ),
            shown: Mutex::default(),
        }
    }

    /// Every group's series from one pass.
    pub fn set(&self, groups: &[GroupFigures]) {
        let mut now: [BTreeSet<Vec<String>>; 5] = Default::default();
        for g in groups {
            for (resource, limit) in g.limit.iter() {
                let labels = vec![g.name.clone(), resource.to_string()];
                self.limit.with_label_values(&labels).set(as_f64(limit));
                now[0].insert(labels.clone());
                if let Some(usage) = &g.usage {
                    let used = usage.amount(resource);
                    self.usage.with_label_values(&labels).set(as_f64(used));
                    self.over
                        .with_label_values(&labels)
                        .set(if used > limit { 1.0 } else { 0.0 });
                    now[1].insert(labels.clone());
                    now[2].insert(labels);
                }
            }
            for (project, budget) in &g.budgets {
                for &resource in Resource::ALL {
                    if g.limit.get(resource).is_none() {
                        continue;
                    }
                    let labels = vec![g.name.clone(), project.clone(), resource.to_string()];
                    self.budget
                        .with_label_values(&labels)
                        .set(as_f64(budget.amount(resource)));
                    now[3].insert(labels);
                }
            }
            for (seed, usage) in &g.by_seed {
                for (resource, _) in g.limit.iter() {
                    let labels = vec![g.name.clone(), seed.clone(), resource.to_string()];
                    self.by_seed
                        .with_label_values(&labels)
                        .set(as_f64(usage.amount(resource)));
                    now[4].insert(labels);
                }
            }
        }
        let mut shown = self.shown.lock().unwrap_or_else(PoisonError::into_inner);
        for (i, vec) in [&self.limit, &self.usage, &self.over, &self.budget, &self.by_seed]
            .into_iter()
            .enumerate()
        {
            for gone in shown[i].difference(&now[i]) {
                let labels: Vec<&str> = gone.iter().map(String::as_str).collect();
                let _ = vec.remove_label_values(&labels);
            }
        }
        *shown = now;
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;

    use super::*;
    use kkp_quota_crds::fixtures::cpu;

    #[test]
    fn series_follow_the_groups_and_go_with_them() {
        let registry = Registry::new();
        let series = GroupSeries::new(&registry);
        let text = || {
            let mut out = String::new();
            for family in registry.gather() {
                for m in family.get_metric() {
                    let labels: Vec<String> = m
                        .get_label()
                        .iter()
                        .map(|l| format!("{}={}", l.name(), l.value()))
                        .collect();
                    let _ = writeln!(
                        out,
                        "{} {} {}",
                        family.name(),
                        labels.join(","),
                        m.get_gauge().get_value()
                    );
                }
            }
            out
        };
        series.set(&[GroupFigures {
            name: "acme".into(),
            limit: cpu(6),
            usage: Some(cpu(7)),
            by_seed: vec![("seed-a".into(), cpu(5)), ("seed-b".into(), cpu(2))],
            budgets: vec![("demo".into(), cpu(4))],
        }]);
        let shown = text();
        assert!(
            shown.contains("kkp_quota_group_limit group=acme,resource=cpu 6"),
            "{shown}"
        );
        assert!(
            shown.contains("kkp_quota_group_usage group=acme,resource=cpu 7"),
            "{shown}"
        );
        assert!(
            shown.contains("kkp_quota_group_over_limit group=acme,resource=cpu 1"),
            "{shown}"
        );
        assert!(
            shown.contains("kkp_quota_group_budget group=acme,project=demo,resource=cpu 4"),
            "{shown}"
        );
        for (seed, used) in [("seed-a", 5), ("seed-b", 2)] {
            let line = format!("kkp_quota_group_usage_by_seed group=acme,resource=cpu,seed={seed} {used}");
            assert!(shown.contains(&line), "{shown}");
        }
        // The project leaves and seed-b is gone, then the group goes: their series go too.
        series.set(&[GroupFigures {
            name: "acme".into(),
            limit: cpu(6),
            usage: Some(cpu(1)),
            by_seed: vec![("seed-a".into(), cpu(1))],
            budgets: Vec::new(),
        }]);
        let shown = text();
        assert!(!shown.contains("kkp_quota_group_budget"), "{shown}");
        assert!(!shown.contains("seed=seed-b"), "{shown}");
        assert!(
            shown.contains("kkp_quota_group_usage_by_seed group=acme,resource=cpu,seed=seed-a 1"),
            "{shown}"
        );
        assert!(
            shown.contains("kkp_quota_group_over_limit group=acme,resource=cpu 0"),
            "{shown}"
        );
        series.set(&[]);
        assert!(text().is_empty(), "{}", text());
    }
}
