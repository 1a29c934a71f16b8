//! The demo project `make demo` sets up: a quota for project `demo` on the master, which
//! master-controller fans out to every seed; and a quota group in allocation mode over `demo` and
//! `other`.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, Result};
use kkp_quota_crds::quota::{SUBJECT_KIND_LABEL, SUBJECT_NAME_LABEL};
use kkp_quota_crds::{KkpQuota, QuotaLedger, ResourceDetails, ResourceQuota, ResourceQuotaSpec, Subject};
use kube::Api;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};

use crate::{Fleet, machines, wait_for};

/// The demo project's quota, as written in the log line.
pub const DEMO_QUOTA: &str = "cpu=16, memory=64Gi, storage=1Ti";

/// A project quota named as KKP names them (`project-<id>`), with the subject labels. Only
/// KKP's resources (cpu, memory, storage) are kept: KKP's object has no others.
pub fn project_quota(project: &str, quota: &ResourceDetails) -> ResourceQuota {
    let mut object = ResourceQuota::new(
        &format!("project-{project}"),
        ResourceQuotaSpec {
            subject: Subject::project(project),
            quota: KkpQuota::new(quota),
        },
    );
    object.metadata = ObjectMeta {
        name: Some(format!("project-{project}")),
        labels: Some(
            [
                (SUBJECT_NAME_LABEL.to_owned(), project.to_owned()),
                (SUBJECT_KIND_LABEL.to_owned(), "project".to_owned()),
            ]
            .into(),
        ),
        ..ObjectMeta::default()
    };
    object
}

/// [`project_quota`] limiting cpu alone, to `cpu` (a quantity: `"8"`, `"500m"`).
pub fn cpu_quota(project: &str, cpu: &str) -> ResourceQuota {
    let limits: ResourceDetails =
        serde_json::from_value(serde_json::json!({ "cpu": cpu })).expect("a valid cpu quantity");
    project_quota(project, &limits)
}

/// Writes `quota` on the master (server-side apply as `manager`, forced).
pub async fn apply_quota(fleet: &Fleet, quota: &ResourceQuota, manager: &str) -> Result<()> {
    let name = quota.metadata.name.clone().context("a quota without a name")?;
    Api::<ResourceQuota>::all(fleet.master().client())
        .patch(&name, &PatchParams::apply(manager).force(), &Patch::Apply(quota))
        .await
        .with_context(|| format!("writing the quota {name}"))?;
    Ok(())
}

/// Writes (server-side apply) the demo project's quota on the master.
pub async fn write_demo_project(fleet: &Fleet) -> Result<()> {
    let quota: ResourceDetails = serde_json::from_value(serde_json::json!({
        "cpu": "16", "memory": "64Gi", "storage": "1Ti"
    }))?;
    apply_quota(fleet, &project_quota("demo", &quota), "kkp-quota-demo").await
}

/// The demo's quota group, in allocation mode: projects `demo` and `other` (label
/// `customer=demo-co`) share 32 cpu and 128Gi of quota limits; `demo-owner` may move them
/// between the two.
pub const DEMO_GROUP: &str = "demo-co";

/// Registers master-controller's allocation webhook (at `webhook`, its certificate signed by
/// `ca_pem`) on the master, gives project `other` a quota of 8 cpu and 32Gi, labels `demo` and
/// `other` and creates [`DEMO_GROUP`] over them (docs/groups.md, "Allocation mode").
pub async fn write_demo_group(fleet: &Fleet, webhook: std::net::SocketAddr, ca_pem: &str) -> Result<()> {
    use kkp_quota_runtime::allocation_config;
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};

    let master = fleet.master().client();
    let params = PatchParams::apply("kkp-quota-demo").force();
    let configuration: DynamicObject =
        serde_json::from_value(allocation_config::configuration(&serde_json::json!({
            "url": format!("https://{webhook}{}", allocation_config::PATH),
            "caBundle": k8s_openapi::ByteString(ca_pem.as_bytes().to_vec()),
        })))?;
    let gvk = GroupVersionKind::gvk(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingWebhookConfiguration",
    );
    Api::<DynamicObject>::all_with(master.clone(), &ApiResource::from_gvk(&gvk))
        .patch(allocation_config::NAME, &params, &Patch::Apply(&configuration))
        .await
        .context("registering the allocation webhook on the master")?;
    let other: ResourceDetails = serde_json::from_value(serde_json::json!({"cpu": "8", "memory": "32Gi"}))?;
    apply_quota(fleet, &project_quota("other", &other), "kkp-quota-demo").await?;
    let projects = Api::<kkp_quota_crds::kkp::Project>::all(master.clone());
    let label = serde_json::json!({"metadata": {"labels": {"customer": DEMO_GROUP}}});
    for project in ["demo", "other"] {
        projects
            .patch(project, &PatchParams::default(), &Patch::Merge(&label))
            .await
            .with_context(|| format!("labelling project {project}"))?;
    }
    let group: kkp_quota_crds::QuotaGroup = serde_json::from_value(serde_json::json!({
        "apiVersion": "kkp-quota.dev/v1alpha1",
        "kind": "QuotaGroup",
        "metadata": {"name": DEMO_GROUP},
        "spec": {
            "selector": {"matchLabels": {"customer": DEMO_GROUP}},
            "mode": "allocation",
            "quota": {"cpu": "32", "memory": "128Gi"},
            "owners": [{"kind": "User", "name": "demo-owner"}],
        },
    }))?;
    let groups = Api::<kkp_quota_crds::QuotaGroup>::all(master);
    // The webhook refuses the group until its caches hold other's quota (unlimited before).
    wait_for(Duration::from_mins(1), "the demo group accepted", || async {
        groups
            .patch(DEMO_GROUP, &params, &Patch::Apply(&group))
            .await
            .map_err(|e| tracing::debug!(error = %e, "the demo group, refused for now"))
            .ok()
    })
    .await?;
    Ok(())
}

/// The demo's shared quota group (docs/groups.md, "Shared mode"): what `demo` and `other` run
/// together, over every seed, at most [`DEMO_SHARED_CPU`] cpu.
pub const DEMO_SHARED_GROUP: &str = "demo-co-usage";
pub const DEMO_SHARED_CPU: &str = "18";

/// Creates [`DEMO_SHARED_GROUP`] over the projects labelled into [`DEMO_GROUP`] (after
/// [`write_demo_group`]) and waits until `other`'s quota is in force where it has clusters.
pub async fn write_demo_shared_group(fleet: &Fleet) -> Result<()> {
    let group: kkp_quota_crds::QuotaGroup = serde_json::from_value(serde_json::json!({
        "apiVersion": "kkp-quota.dev/v1alpha1",
        "kind": "QuotaGroup",
        "metadata": {"name": DEMO_SHARED_GROUP},
        "spec": {
            "selector": {"matchLabels": {"customer": DEMO_GROUP}},
            "quota": {"cpu": DEMO_SHARED_CPU},
        },
    }))?;
    Api::<kkp_quota_crds::QuotaGroup>::all(fleet.master().client())
        .patch(
            DEMO_SHARED_GROUP,
            &PatchParams::apply("kkp-quota-demo").force(),
            &Patch::Apply(&group),
        )
        .await
        .context("creating the demo's shared group")?;
    wait_in_force(fleet, "other", Duration::from_mins(2)).await
}

/// Waits until `project`'s quota is in force wherever the project has a user cluster, as a user
/// sees it: every seed's `QuotaLedger` is counted (seed-controller wrote `status.localUsage`),
/// and a dry-run create of a 1-cpu Machine through each user cluster is admitted. Between a
/// quota's first write and that point the webhook refuses growth as `ledger_missing` (fail
/// closed, issue #32), so a test that creates at once races seed-controller's first count.
pub async fn wait_in_force(fleet: &Fleet, project: &str, timeout: Duration) -> Result<()> {
    let name = format!("project-{project}");
    let users: Vec<_> = fleet
        .spec()
        .user_clusters
        .iter()
        .filter(|u| u.project == project)
        .collect();
    let seeds: BTreeSet<&str> = users.iter().map(|u| u.seed.as_str()).collect();
    for seed in seeds {
        let ledgers = Api::<QuotaLedger>::all(fleet.seed(seed).client());
        wait_for(timeout, &format!("{seed}'s ledger {name} counted"), || async {
            let status = ledgers.get(&name).await.ok()?.status?;
            status.local_usage.map(|_| ())
        })
        .await?;
    }
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    for user in users {
        let api = machines::api(fleet, &user.name);
        wait_for(
            timeout,
            &format!("a dry-run create in {} admitted", user.name),
            || async {
                match api
                    .create(&dry, &machines::vsphere("quota-in-force-probe", 1))
                    .await
                {
                    // 409: admitted, then found to exist (admission runs before storage).
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                    Err(e) => Err(e.to_string()),
                }
            },
        )
        .await?;
    }
    Ok(())
}

/// Waits until `project`'s `ProjectQuota` on the master counts `global` clusters in all and
/// `per_seed[i]` on `seeds[i]` (issue #38: every `Cluster` of the project counts one).
pub async fn wait_clusters_counted(
    master: &kube::Client,
    project: &str,
    seeds: &[&str],
    global: i64,
    per_seed: &[i64],
    timeout: Duration,
) -> Result<()> {
    use kkp_quota_crds::{ProjectQuota, Quantity, Resource};
    let quotas = Api::<ProjectQuota>::all(master.clone());
    let name = format!("project-{project}");
    let counted = |usage: Option<&ResourceDetails>| usage.map(|u| u.amount(Resource::Clusters));
    let what = format!("clusters {global} in all, {per_seed:?} on {seeds:?}");
    wait_for(timeout, &what, || async {
        let status = quotas.get(&name).await.ok()?.status?;
        let on = |seed: &str| counted(status.seeds.iter().find(|s| s.name == seed)?.usage.as_ref());
        (counted(status.global_usage.as_ref()) == Some(Quantity::from_units(global))
            && seeds
                .iter()
                .zip(per_seed)
                .all(|(seed, want)| on(seed) == Some(Quantity::from_units(*want))))
        .then_some(())
    })
    .await
}
