//! `top`: the master's projects by how much of their quota they use, fullest first.

use kkp_quota_crds::{Resource, ResourceDetails};
use serde::Serialize;

use crate::Error;
use crate::read::Quotas;
use crate::status::{ResourceRow, resource_rows, used_of};
use crate::table;

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct TopReport {
    /// Ordered by this resource alone; otherwise by each project's fullest resource.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<Resource>,
    pub projects: Vec<TopRow>,
}

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct TopRow {
    pub project: String,
    /// The resource the order is by (absent when none of them is limited).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fullest: Option<Resource>,
    /// Percent of its limit used (one decimal).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub percent: Option<f64>,
    pub resources: Vec<ResourceRow>,
}

/// Every project's quota ordered by use (on the master only).
pub fn report(quotas: &Quotas, by: Option<Resource>) -> Result<TopReport, Error> {
    let Quotas::Master(quotas) = quotas else {
        return Err(Error::TopNeedsMaster);
    };
    let mut projects: Vec<TopRow> = quotas
        .iter()
        .map(|q| {
            let status = q.status.clone().unwrap_or_default();
            let limits = status.limits.unwrap_or_default();
            let used = status.global_usage.unwrap_or_default();
            let fullest = fullest(&limits, &used, by);
            TopRow {
                project: q.project().to_owned(),
                fullest: fullest.map(|(r, _)| r),
                percent: fullest.map(|(_, p)| (p * 10.0).round() / 10.0),
                resources: resource_rows(&limits, &used),
            }
        })
        .collect();
    projects.sort_by(|a, b| {
        let key = |row: &TopRow| row.percent.unwrap_or(-1.0);
        key(b).total_cmp(&key(a)).then_with(|| a.project.cmp(&b.project))
    });
    Ok(TopReport { by, projects })
}

/// The limited resource used most (as a percent of its limit), or `only` if it is limited.
fn fullest(
    limits: &ResourceDetails,
    used: &ResourceDetails,
    only: Option<Resource>,
) -> Option<(Resource, f64)> {
    limits
        .iter()
        .filter(|(r, _)| only.is_none_or(|o| o == *r))
        .map(|(r, limit)| (r, percent(used.amount(r).as_nanos(), limit.as_nanos())))
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

#[allow(
    clippy::cast_precision_loss,
    reason = "a percent for ordering and reading; 53 bits are plenty"
)]
fn percent(used: i128, limit: i128) -> f64 {
    if limit <= 0 {
        return if used > 0 { f64::INFINITY } else { 0.0 };
    }
    used as f64 * 100.0 / limit as f64
}

/// The table form: one line per project, fullest first.
pub fn table(report: &TopReport) -> String {
    let names: Vec<String> = Resource::ALL.iter().map(|r| r.name().to_uppercase()).collect();
    let mut headers = vec!["PROJECT", "USED %", "OF"];
    headers.extend(names.iter().map(String::as_str));
    let rows: Vec<Vec<String>> = report
        .projects
        .iter()
        .map(|p| {
            let mut row = vec![
                p.project.clone(),
                p.percent.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}")),
                p.fullest.map_or_else(|| "-".to_owned(), |r| r.name().to_owned()),
            ];
            row.extend(Resource::ALL.iter().map(|&r| used_of(&p.resources, r)));
            row
        })
        .collect();
    if rows.is_empty() {
        return "no project quotas here\n".to_owned();
    }
    table::draw(&headers, &rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{project_quota, view};
    use serde_json::json;

    #[test]
    fn fullest_first_by_any_resource_or_by_one() {
        let quotas = Quotas::Master(vec![
            project_quota(
                "cpu-heavy",
                &json!({"cpu": "10", "memory": "100Gi"}),
                &json!({"cpu": "9", "memory": "1Gi"}),
                &json!([]),
            ),
            project_quota(
                "memory-heavy",
                &json!({"cpu": "10", "memory": "10Gi"}),
                &json!({"cpu": "1", "memory": "5Gi"}),
                &json!([]),
            ),
            project_quota("unlimited", &json!({}), &json!({"cpu": "50"}), &json!([])),
        ]);
        let any = report(&quotas, None).expect("the master");
        let order: Vec<(&str, Option<f64>)> = any
            .projects
            .iter()
            .map(|p| (p.project.as_str(), p.percent))
            .collect();
        assert_eq!(
            order,
            [
                ("cpu-heavy", Some(90.0)),
                ("memory-heavy", Some(50.0)),
                ("unlimited", None)
            ]
        );
        let by_memory = report(&quotas, Some(Resource::Memory)).expect("the master");
        assert_eq!(by_memory.projects[0].project, "memory-heavy");
        assert_eq!(by_memory.projects[1].percent, Some(1.0));
        let text = table(&any);
        assert!(
            text.contains("cpu-heavy      90.0     cpu      9/10   1Gi/100Gi"),
            "{text}"
        );
    }

    #[test]
    fn a_user_cluster_cannot_rank_projects() {
        let v = view("demo", "Current", &json!({}), &json!({}));
        assert!(matches!(
            report(&Quotas::Views(vec![v]), None),
            Err(Error::TopNeedsMaster)
        ));
    }
}
