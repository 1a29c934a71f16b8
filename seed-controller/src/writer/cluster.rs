//! The write of one `Cluster`'s status on the seed: `status.resourceUsage` and the
//! `ResourceQuotaUsage` condition (merge patch, only when they changed), and the cluster's usage,
//! unsizeable-Machine and counted-at-last-size gauges.

use std::collections::BTreeSet;
use std::time::Instant;

use jiff::Timestamp;
use kkp_quota_crds::kkp::Cluster;
use kkp_quota_crds::{Quantity, Resource};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use tracing::debug;

use super::report::{set_usage_gauges, timed};
use crate::state::CONDITION_TYPE;
use crate::{Error, Shared};

pub(super) async fn write_cluster(shared: &Shared, name: &str) -> Result<(), Error> {
    let started = Instant::now();
    let result = write_cluster_inner(shared, name).await;
    timed(shared, "cluster", started, &result);
    result
}

async fn write_cluster_inner(shared: &Shared, name: &str) -> Result<(), Error> {
    let Some(plan) = shared.state().cluster_plan(name) else {
        return Ok(());
    };
    let project = plan.project.clone().unwrap_or_default();
    if let Some(usage) = &plan.usage {
        // The cluster itself counts one, as in its project's usage.
        let mut usage = usage.clone();
        usage.set(Resource::Clusters, Some(Quantity::from_units(1)));
        set_usage_gauges(&shared.metrics.cluster_usage, &[name, &project], &usage);
    }
    let labels: BTreeSet<(String, String, String)> = plan.unsizeable.keys().cloned().collect();
    for ((provider, flavour, reason), count) in &plan.unsizeable {
        #[allow(clippy::cast_precision_loss)]
        shared
            .metrics
            .unsizeable
            .with_label_values(&[name, provider, flavour, reason])
            .set(*count as f64);
    }
    for (provider, flavour, reason) in shared.state().exported_unsizeable(name, labels) {
        let _ = shared
            .metrics
            .unsizeable
            .remove_label_values(&[name, &provider, &flavour, &reason]);
    }
    let mut labels = BTreeSet::new();
    for ((provider, flavour, reason), count) in &plan.at_last_size {
        #[allow(clippy::cast_precision_loss)]
        shared
            .metrics
            .counted_at_last_size
            .with_label_values(&[name, &project, provider, flavour, reason])
            .set(*count as f64);
        labels.insert((project.clone(), provider.clone(), flavour.clone(), reason.clone()));
    }
    for (project, provider, flavour, reason) in shared.state().exported_last_size(name, labels) {
        let _ = shared
            .metrics
            .counted_at_last_size
            .remove_label_values(&[name, &project, &provider, &flavour, &reason]);
    }
    if plan.unchanged {
        return Ok(());
    }
    let mut condition = plan.condition.clone();
    let previous = plan
        .observed
        .as_ref()
        .and_then(|s| s.conditions.get(CONDITION_TYPE));
    condition.last_transition_time = match previous {
        Some(p) if p.status == condition.status => p.last_transition_time.clone(),
        _ => Some(
            Timestamp::now()
                .round(jiff::Unit::Second)
                .unwrap_or_else(|_| Timestamp::now())
                .to_string(),
        ),
    };
    condition.last_heartbeat_time = condition.last_transition_time.clone();
    let mut status = json!({ "conditions": { CONDITION_TYPE: condition } });
    if let Some(usage) = &plan.usage {
        // Only what KKP's Cluster declares; gpu and machine count are in the metrics.
        status["resourceUsage"] = serde_json::to_value(usage.kkp_subset()).unwrap_or(Value::Null);
    }
    let api: Api<Cluster> = Api::all(shared.seed.clone());
    match api
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
    {
        Ok(_) => {}
        // Deleted meanwhile: nothing to write.
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    debug!(usage = ?plan.usage.as_ref().map(ToString::to_string), reason = %condition.reason, "cluster status written");
    shared.state().cluster_written(name, plan.usage, plan.condition);
    Ok(())
}
