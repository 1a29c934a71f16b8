//! Quota objects as the cluster would hand them over, for the unit tests.

use kkp_quota_crds::{ProjectQuota, QuotaView};
use serde_json::{Value, json};

/// A user cluster's view: `used` and `limits` as `{cpu: "2", ...}`.
pub fn view(project: &str, state: &str, limits: &Value, used: &Value) -> QuotaView {
    serde_json::from_value(json!({
        "apiVersion": "kkp-quota.dev/v1alpha1",
        "kind": "QuotaView",
        "metadata": {"name": format!("project-{project}")},
        "spec": {"project": project},
        "status": {
            "state": state,
            "limits": limits,
            "used": used,
            "clusters": [{"cluster": "alpha", "usage": used}],
            "confirmedAt": "2026-11-27T06:00:00Z",
        }
    }))
    .expect("a QuotaView")
}

/// The master's quota of `project`, with `seeds` as its status lists them.
pub fn project_quota(project: &str, limits: &Value, used: &Value, seeds: &Value) -> ProjectQuota {
    serde_json::from_value(json!({
        "apiVersion": "kkp-quota.dev/v1alpha1",
        "kind": "ProjectQuota",
        "metadata": {"name": format!("project-{project}")},
        "spec": {"subject": {"name": project, "kind": "project"}},
        "status": {"limits": limits, "globalUsage": used, "seeds": seeds}
    }))
    .expect("a ProjectQuota")
}
