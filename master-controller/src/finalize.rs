//! Deleting a quota: every seed's copies first (the ledger, then KKP's), then the `ProjectQuota`,
//! then the finalizer on the master object.

use std::time::Duration;

use futures::future;
use jiff::Timestamp;
use kkp_quota_crds::kkp::Project;
use kkp_quota_crds::{ProjectQuota, QuotaLedger, ResourceQuota};
use kkp_quota_runtime::work_queue::Next;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use tracing::{info, warn};

use crate::api::{delete_gone, ignore_missing, ours};
use crate::ctx::Ctx;
use crate::seeds::SeedView;
use crate::{Error, fanout, ledger_guard, status};

/// Deletion: every seed's copies first (the ledger, then KKP's), then the `ProjectQuota`, then the
/// finalizer. A seed that cannot delete its copies holds the finalizer, and the
/// `SeedCleanupPending` condition says which.
pub(crate) async fn finalize(
    master_rq: &ResourceQuota,
    api: &Api<ResourceQuota>,
    views: &[SeedView],
    project: Option<&Project>,
    project_quota: Option<&ProjectQuota>,
    ctx: &Ctx,
) -> Result<Next, Error> {
    if !fanout::has_finalizer(master_rq) {
        return Ok(Next::AwaitChange);
    }
    let name = master_rq.name_any();
    let deletes = views.iter().map(|view| {
        let name = name.clone();
        async move {
            let Some(client) = view.client.clone() else {
                return Err(view.name.clone());
            };
            let dp = DeleteParams::default();
            let result = async {
                // Our finalizer released too: only this deletion may remove the ledger for good.
                let ledger =
                    ledger_guard::delete_ledger(&Api::<QuotaLedger>::all(client.clone()), &name, &dp).await?;
                let kkp = delete_gone(&Api::<ResourceQuota>::all(client), &name, &dp).await?;
                Ok::<bool, kube::Error>(ledger && kkp)
            }
            .await;
            match result {
                Ok(gone) => {
                    ctx.metrics.wrote(&view.name, "delete");
                    if gone { Ok(()) } else { Err(view.name.clone()) }
                }
                Err(e) => {
                    warn!(seed = %view.name, error = %e, "deleting the seed copies failed");
                    ctx.metrics.sync_error(&view.name, "delete");
                    Err(view.name.clone())
                }
            }
        }
    });
    let pending: Vec<String> = future::join_all(deletes)
        .await
        .into_iter()
        .filter_map(Result::err)
        .collect();
    let pq_api: Api<ProjectQuota> = Api::all(ctx.master.clone());
    if pending.is_empty() {
        // Owned by the master object, so a real cluster's garbage collector would delete it too;
        // deleting it here does not depend on one.
        delete_gone(&pq_api, &name, &DeleteParams::default()).await?;
        let patch = fanout::master_metadata_patch(master_rq, project, false);
        match api.patch(&name, &ours(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            // Already gone; or changed meanwhile, and the watch brings it back to us.
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(kube::Error::Api(e)) if e.code == 409 => return Ok(Next::AwaitChange),
            Err(e) => return Err(e.into()),
        }
        ctx.metrics.wrote("master", "finalize");
        ctx.metrics.forget_project(master_rq.project());
        ctx.kkp_copies.forget(&name);
        ctx.memory.forget(&name);
        info!("seed copies deleted; finalizer released");
        return Ok(Next::AwaitChange);
    }
    if let Some(pq) = project_quota {
        let status_now = pq.status.clone().unwrap_or_default();
        let conditions = status::merge_conditions(
            &status_now.conditions,
            &[status::cleanup_pending(&pending)],
            master_rq.metadata.generation,
            Timestamp::now(),
        );
        if !status::same_conditions(&status_now.conditions, &conditions) {
            let patch = serde_json::json!({ "status": { "conditions": conditions } });
            ignore_missing(
                pq_api
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await,
            )?;
            ctx.metrics.wrote("master", "status");
        }
    }
    warn!(seeds = %pending.join(", "), "seed copies not deleted yet; holding the finalizer");
    Ok(Next::After(Duration::from_secs(2)))
}
