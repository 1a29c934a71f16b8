//! `status`: the limits in force, use and room, from a user cluster's view or the master.

use std::fmt::Write as _;

use jiff::{SignedDuration, Timestamp};
use kkp_quota_crds::{ProjectQuota, QuotaView, Resource, ResourceDetails};
use serde::Serialize;

use crate::Error;
use crate::read::Quotas;
use crate::table;

/// A view not confirmed for this long is probably kept by nobody: seed-controller confirms it
/// every minute while it runs.
const OLD_VIEW: SignedDuration = SignedDuration::from_mins(5);

#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum Source {
    UserCluster,
    Master,
}

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
    pub source: Source,
    pub projects: Vec<ProjectStatus>,
}

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct ProjectStatus {
    pub project: String,
    /// A user cluster's view: `Current`, `Counting`, `Stale` or `NoQuota`. The master: `Current`
    /// or the conditions in force (`QuotaExceeded`, `SeedsStale`, `SeedCleanupPending`).
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirmed_at: Option<Timestamp>,
    pub resources: Vec<ResourceRow>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<ClusterRow>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub other_seeds: Option<ResourceDetails>,
    /// What cluster autoscalers may still add, not counted in `used` (docs/capacity.md): over
    /// every seed on the master, on this seed in a user cluster.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved: Option<ResourceDetails>,
    /// The policy `reservedCounts`: `reserved` is held for the autoscalers, inside `used`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub reserved_counts: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub seeds: Vec<SeedRow>,
}

/// One resource: used, and the limit and room when it is limited.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRow {
    pub resource: Resource,
    pub used: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub free: Option<String>,
}

#[derive(Serialize, Debug)]
pub struct ClusterRow {
    pub cluster: String,
    pub usage: ResourceDetails,
}

/// One seed of a project, as the master sees it.
#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct SeedRow {
    pub name: String,
    pub usage: ResourceDetails,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share: Option<ResourceDetails>,
    pub stale: bool,
    /// Holds share that the others cannot have until it is back (or declared gone).
    pub stuck: bool,
}

/// The report for every project here, or only `project`.
pub fn report(quotas: &Quotas, project: Option<&str>, now: Timestamp) -> Result<StatusReport, Error> {
    let wanted = |name: &str| project.is_none_or(|p| p == name);
    let (source, projects): (Source, Vec<ProjectStatus>) = match quotas {
        Quotas::Views(views) => (
            Source::UserCluster,
            views
                .iter()
                .filter(|v| wanted(&v.spec.project))
                .map(|v| from_view(v, now))
                .collect(),
        ),
        Quotas::Master(quotas) => (
            Source::Master,
            quotas
                .iter()
                .filter(|q| wanted(q.project()))
                .map(from_master)
                .collect(),
        ),
    };
    if let (Some(project), true) = (project, projects.is_empty()) {
        return Err(Error::NoSuchProject(project.to_owned()));
    }
    Ok(StatusReport { source, projects })
}

/// Used, limit and free for every resource that is limited or used.
pub fn resource_rows(limits: &ResourceDetails, used: &ResourceDetails) -> Vec<ResourceRow> {
    let room = kkp_quota_crds::fit::room(limits, used);
    Resource::ALL
        .iter()
        .filter(|&&r| limits.get(r).is_some() || !used.amount(r).is_zero())
        .map(|&r| ResourceRow {
            resource: r,
            used: r.amount(used.amount(r)),
            limit: limits.get(r).map(|l| r.amount(l)),
            free: room.get(r).map(|q| r.amount(q)),
        })
        .collect()
}

fn from_view(view: &QuotaView, now: Timestamp) -> ProjectStatus {
    let status = view.status.clone().unwrap_or_default();
    let mut message = status.message.clone();
    if let Some(at) = status.confirmed_at
        && now.duration_since(at) > OLD_VIEW
    {
        let old = format!(
            "not confirmed for {}: the seed's seed-controller may not be running",
            ago(now, at)
        );
        message = Some(message.map_or(old.clone(), |m| format!("{m}; {old}")));
    }
    ProjectStatus {
        project: view.spec.project.clone(),
        state: format!("{:?}", status.state),
        message,
        confirmed_at: status.confirmed_at,
        resources: resource_rows(&status.limits, &status.used),
        clusters: status
            .clusters
            .iter()
            .map(|c| ClusterRow {
                cluster: c.cluster.clone(),
                usage: c.usage.clone(),
            })
            .collect(),
        other_seeds: Some(status.other_seeds.clone()).filter(|o| !o.is_empty()),
        reserved: Some(status.autoscaler_reserved.clone()).filter(|r| !r.is_empty()),
        reserved_counts: status.reserved_counts,
        seeds: Vec::new(),
    }
}

fn from_master(quota: &ProjectQuota) -> ProjectStatus {
    let status = quota.status.clone().unwrap_or_default();
    let in_force: Vec<String> = status
        .conditions
        .iter()
        .filter(|c| c.status == "True")
        .map(|c| c.type_.clone())
        .collect();
    let messages: Vec<String> = status
        .conditions
        .iter()
        .filter(|c| c.status == "True" && !c.message.is_empty())
        .map(|c| c.message.clone())
        .collect();
    ProjectStatus {
        project: quota.project().to_owned(),
        state: if in_force.is_empty() {
            "Current".to_owned()
        } else {
            in_force.join(",")
        },
        message: Some(messages.join("; ")).filter(|m| !m.is_empty()),
        confirmed_at: None,
        resources: resource_rows(
            &status.limits.clone().unwrap_or_default(),
            &status.global_usage.clone().unwrap_or_default(),
        ),
        clusters: Vec::new(),
        other_seeds: None,
        reserved: status.reserved.clone().filter(|r| !r.is_empty()),
        reserved_counts: quota.spec.reserved_counts,
        seeds: status
            .seeds
            .iter()
            .map(|s| SeedRow {
                name: s.name.clone(),
                usage: s.usage.clone().unwrap_or_default(),
                share: s.share.clone(),
                stale: s.stale,
                stuck: s.stuck,
            })
            .collect(),
    }
}

/// `12s`, `3m`, `2h`, `5d`: how long ago, as kubectl writes ages.
pub fn ago(now: Timestamp, then: Timestamp) -> String {
    let seconds = now.duration_since(then).as_secs().max(0);
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// `2 cpu, 4Gi memory`: every non-zero amount, or `nothing`.
pub fn describe(details: &ResourceDetails) -> String {
    let parts: Vec<String> = details
        .iter()
        .filter(|(_, q)| !q.is_zero())
        .map(|(r, q)| r.describe(q))
        .collect();
    if parts.is_empty() {
        "nothing".to_owned()
    } else {
        parts.join(", ")
    }
}

/// The table form: one block per project, or on the master without `--project`, one line per
/// project and the seeds that need an admin.
pub fn table(report: &StatusReport) -> String {
    if report.projects.is_empty() {
        return "no project quotas here\n".to_owned();
    }
    if report.source == Source::Master && report.projects.len() > 1 {
        return summary(report);
    }
    let now = Timestamp::now();
    let blocks: Vec<String> = report
        .projects
        .iter()
        .map(|p| block(p, report.source, now))
        .collect();
    blocks.join("\n")
}

fn block(project: &ProjectStatus, source: Source, now: Timestamp) -> String {
    let mut out = format!("project {}: {}", project.project, project.state);
    if let Some(at) = project.confirmed_at {
        let _ = write!(out, ", confirmed {} ago", ago(now, at));
    }
    out += "\n";
    if let Some(message) = &project.message {
        let _ = writeln!(out, "  {message}");
    }
    out += &resource_table(&project.resources);
    if !project.clusters.is_empty() {
        let rows: Vec<Vec<String>> = project
            .clusters
            .iter()
            .map(|c| vec![c.cluster.clone(), describe(&c.usage)])
            .collect();
        out += "\n";
        out += &table::draw(&["CLUSTER (THIS SEED)", "USES"], &rows);
    }
    if let Some(other) = &project.other_seeds {
        let _ = writeln!(out, "clusters on other seeds use {}", describe(other));
    }
    if let Some(reserved) = &project.reserved {
        let here = if source == Source::UserCluster {
            " on this seed"
        } else {
            ""
        };
        let how = if project.reserved_counts {
            "held for them: counted in USED"
        } else {
            "reserved; not in USED"
        };
        let _ = writeln!(
            out,
            "cluster autoscalers{here} may still add {} ({how})",
            describe(reserved)
        );
    }
    if !project.seeds.is_empty() {
        let rows: Vec<Vec<String>> = project.seeds.iter().map(seed_cells).collect();
        out += "\n";
        out += &table::draw(&["SEED", "STATE", "USES", "SHARE"], &rows);
    }
    out
}

fn seed_cells(seed: &SeedRow) -> Vec<String> {
    let state = match (seed.stale, seed.stuck) {
        (_, true) => "stuck",
        (true, false) => "stale",
        (false, false) => "current",
    };
    vec![
        seed.name.clone(),
        state.to_owned(),
        describe(&seed.usage),
        seed.share.as_ref().map_or_else(|| "-".to_owned(), describe),
    ]
}

/// Resource by resource: used, limit and free (`-` when unlimited).
pub fn resource_table(rows: &[ResourceRow]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.resource.name().to_owned(),
                r.used.clone(),
                r.limit.clone().unwrap_or_else(|| "-".to_owned()),
                r.free.clone().unwrap_or_else(|| "-".to_owned()),
            ]
        })
        .collect();
    table::draw(&["RESOURCE", "USED", "LIMIT", "FREE"], &cells)
}

/// `used/limit`, or `used` when unlimited.
pub fn used_of(rows: &[ResourceRow], resource: Resource) -> String {
    rows.iter().find(|r| r.resource == resource).map_or_else(
        || "-".to_owned(),
        |r| match &r.limit {
            Some(limit) => format!("{}/{limit}", r.used),
            None => r.used.clone(),
        },
    )
}

fn summary(report: &StatusReport) -> String {
    let names: Vec<String> = Resource::ALL.iter().map(|r| r.name().to_uppercase()).collect();
    let mut headers = vec!["PROJECT", "STATE"];
    headers.extend(names.iter().map(String::as_str));
    let rows: Vec<Vec<String>> = report
        .projects
        .iter()
        .map(|p| {
            let mut row = vec![p.project.clone(), p.state.clone()];
            row.extend(Resource::ALL.iter().map(|&r| used_of(&p.resources, r)));
            row
        })
        .collect();
    let mut out = table::draw(&headers, &rows);
    let troubled: Vec<Vec<String>> = report
        .projects
        .iter()
        .flat_map(|p| {
            p.seeds.iter().filter(|s| s.stale || s.stuck).map(|s| {
                let mut cells = seed_cells(s);
                cells.insert(0, p.project.clone());
                cells
            })
        })
        .collect();
    if !troubled.is_empty() {
        out += "\nseeds that are stale, or hold share the others cannot use:\n";
        out += &table::draw(&["PROJECT", "SEED", "STATE", "USES", "SHARE"], &troubled);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{project_quota, view};
    use serde_json::json;

    fn at(text: &str) -> Timestamp {
        text.parse().expect("a timestamp")
    }

    #[test]
    fn a_user_cluster_shows_its_project_resource_by_resource() {
        let v = view(
            "demo",
            "Current",
            &json!({"cpu": "16", "memory": "64Gi"}),
            &json!({"cpu": "2", "memory": "4Gi", "storage": "50Gi"}),
        );
        let report = report(&Quotas::Views(vec![v]), None, at("2026-11-27T06:00:04Z")).expect("a report");
        let demo = &report.projects[0];
        assert_eq!(demo.state, "Current");
        assert_eq!(demo.message, None);
        assert_eq!(
            demo.resources[0],
            ResourceRow {
                resource: Resource::Cpu,
                used: "2".into(),
                limit: Some("16".into()),
                free: Some("14".into())
            }
        );
        // Storage is used but not limited: shown, with no limit and no room.
        assert_eq!(demo.resources[2].limit, None);
        let text = block(demo, Source::UserCluster, at("2026-11-27T06:00:04Z"));
        assert!(text.starts_with("project demo: Current, confirmed 4s ago\nRESOURCE   USED   LIMIT   FREE\ncpu        2      16      14\n"), "{text}");
        assert!(
            text.contains("alpha                 2 cpu, 4Gi memory, 50Gi storage"),
            "{text}"
        );
    }

    #[test]
    fn capacity_reserved_for_autoscalers_is_shown_apart_from_use() {
        let mut v = view("demo", "Current", &json!({"cpu": "16"}), &json!({"cpu": "2"}));
        let status = v.status.as_mut().expect("a status");
        status
            .autoscaler_reserved
            .set(Resource::Cpu, Some("8".parse().expect("cpu")));
        let here = report(&Quotas::Views(vec![v]), None, at("2026-11-27T06:00:04Z")).expect("a report");
        let text = table(&here);
        assert!(
            text.contains("cpu        2      16      14\n"),
            "reserved is not in USED nor FREE: {text}"
        );
        assert!(
            text.contains("cluster autoscalers on this seed may still add 8 cpu (reserved; not in USED)"),
            "{text}"
        );
        let mut quota = project_quota("demo", &json!({"cpu": "16"}), &json!({"cpu": "2"}), &json!([]));
        let status = quota.status.as_mut().expect("a status");
        status.reserved = Some(serde_json::from_value(json!({"cpu": "4", "memory": "0"})).expect("amounts"));
        let master = report(&Quotas::Master(vec![quota]), None, Timestamp::now()).expect("a report");
        assert!(
            table(&master).contains("\ncluster autoscalers may still add 4 cpu (reserved; not in USED)"),
            "{}",
            table(&master)
        );
        let json = serde_json::to_value(&master).expect("JSON");
        assert_eq!(json["projects"][0]["reserved"]["cpu"], "4");
        // Under reservedCounts the same room is held, inside USED.
        let mut held = project_quota("demo", &json!({"cpu": "16"}), &json!({"cpu": "6"}), &json!([]));
        held.spec.reserved_counts = true;
        held.status.as_mut().expect("a status").reserved =
            Some(serde_json::from_value(json!({"cpu": "4"})).expect("amounts"));
        let held = report(&Quotas::Master(vec![held]), None, Timestamp::now()).expect("a report");
        assert!(
            table(&held)
                .contains("\ncluster autoscalers may still add 4 cpu (held for them: counted in USED)"),
            "{}",
            table(&held)
        );
    }

    #[test]
    fn a_view_nobody_confirms_says_so() {
        let v = view("demo", "Current", &json!({"cpu": "16"}), &json!({"cpu": "2"}));
        let report = report(&Quotas::Views(vec![v]), None, at("2026-11-27T07:00:00Z")).expect("a report");
        let message = report.projects[0].message.clone().unwrap_or_default();
        assert_eq!(
            message,
            "not confirmed for 60m: the seed's seed-controller may not be running"
        );
    }

    #[test]
    fn the_master_lists_every_project_and_the_seeds_that_need_an_admin() {
        let quotas = Quotas::Master(vec![
            project_quota(
                "demo",
                &json!({"cpu": "16"}),
                &json!({"cpu": "2"}),
                &json!([
                    {"name": "seed-a", "usage": {"cpu": "2"}, "share": {"cpu": "8"}},
                    {"name": "seed-b", "usage": {"cpu": "0"}, "stale": true, "stuck": true, "share": {"cpu": "8"}},
                ]),
            ),
            project_quota("other", &json!({"cpu": "4"}), &json!({"cpu": "1"}), &json!([])),
        ]);
        let report = report(&quotas, None, Timestamp::now()).expect("a report");
        let text = table(&report);
        assert!(text.starts_with("PROJECT   STATE     CPU    MEMORY"), "{text}");
        assert!(text.contains("\ndemo      Current   2/16   -"), "{text}");
        assert!(text.contains("seed-b   stuck   nothing   8 cpu"), "{text}");
        assert!(matches!(
            super::report(&quotas, Some("nope"), Timestamp::now()),
            Err(Error::NoSuchProject(_))
        ));
        let one = super::report(&quotas, Some("demo"), Timestamp::now()).expect("one project");
        assert!(
            table(&one).contains("SEED     STATE     USES      SHARE"),
            "{}",
            table(&one)
        );
    }

    #[test]
    fn ages_read_like_kubectls() {
        let now = at("2026-11-27T06:00:00Z");
        assert_eq!(ago(now, at("2026-11-27T05:59:01Z")), "59s");
        assert_eq!(ago(now, at("2026-11-27T05:50:00Z")), "10m");
        assert_eq!(ago(now, at("2026-11-27T01:00:00Z")), "5h");
        assert_eq!(ago(now, at("2026-11-20T06:00:00Z")), "7d");
    }
}
