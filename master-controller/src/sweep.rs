//! The orphan sweep: seed ledgers (and the KKP copy beside each) without a master quota, and
//! `ProjectQuota`s whose KKP quota is gone, are deleted (what a garbage collector would do for
//! their owner references).

use std::collections::BTreeSet;
use std::sync::Arc;

use kkp_quota_crds::{ProjectQuota, QuotaLedger, ResourceQuota};
use kube::api::DeleteParams;
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::api::delete_gone;
use crate::ledger_guard;
use crate::metrics::Metrics;
use crate::seeds::Seeds;

/// Deletes seed ledgers (and the KKP copy beside each) that have no master object, and
/// `ProjectQuota`s whose KKP quota is gone (what a garbage collector would do for their owner
/// reference). Runs after the master cache is complete.
pub(crate) async fn orphan_sweep(
    master: Client,
    quotas: Store<ResourceQuota>,
    project_quotas: Store<ProjectQuota>,
    seeds: Seeds,
    wake: Arc<Notify>,
    metrics: Metrics,
) {
    let _ = quotas.wait_until_ready().await;
    let _ = project_quotas.wait_until_ready().await;
    loop {
        wake.notified().await;
        let masters: BTreeSet<String> = quotas.state().iter().map(|q| q.name_any()).collect();
        for (seed, client, copies) in seeds.fresh_orphans(&masters) {
            let api: Api<QuotaLedger> = Api::all(client.clone());
            let kkp_api: Api<ResourceQuota> = Api::all(client);
            for (name, copy) in copies {
                // Conditioned on the copy's UID: a copy re-created meanwhile is not touched.
                let dp = DeleteParams {
                    preconditions: Some(kube::api::Preconditions {
                        uid: copy.uid.clone(),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                // Our finalizer released too (an orphan is ours to remove for good).
                match ledger_guard::delete_ledger(&api, &name, &dp).await {
                    Ok(_) => {
                        info!(seed = %seed, quota = %name, project = %copy.project, "deleted seed copy without a master object");
                        metrics.wrote(&seed, "delete");
                        if let Err(e) = delete_gone(&kkp_api, &name, &DeleteParams::default()).await {
                            warn!(seed = %seed, quota = %name, error = %e, "deleting an orphaned KKP copy failed");
                            metrics.sync_error(&seed, "delete");
                        }
                    }
                    Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                    Err(e) => {
                        warn!(seed = %seed, quota = %name, error = %e, "deleting an orphaned copy failed");
                        metrics.sync_error(&seed, "delete");
                    }
                }
            }
        }
        sweep_project_quotas(&master, &project_quotas, &masters, &metrics).await;
        // Every copy written wakes the sweep, and a sweep looks at every quota: at most one
        // sweep per pause, or a cold start over 10,000 quotas spends its time sweeping.
        tokio::time::sleep(PAUSE).await;
    }
}

/// The shortest time between two sweeps; an orphan waits at most this long longer.
const PAUSE: std::time::Duration = std::time::Duration::from_secs(2);

/// Deletes `ProjectQuota`s owned by a KKP quota that no longer exists (an admin's own
/// `ProjectQuota`, owned by nothing, is left alone until a KKP quota adopts it).
async fn sweep_project_quotas(
    master: &Client,
    project_quotas: &Store<ProjectQuota>,
    masters: &BTreeSet<String>,
    metrics: &Metrics,
) {
    let api: Api<ProjectQuota> = Api::all(master.clone());
    for pq in project_quotas.state() {
        let name = pq.name_any();
        let owned = pq.owner_references().iter().any(|o| o.kind == "ResourceQuota");
        if !owned || masters.contains(&name) || pq.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let dp = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: pq.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&name, &dp).await {
            Ok(_) => {
                info!(quota = %name, project = %pq.project(), "deleted ProjectQuota whose ResourceQuota is gone");
                metrics.wrote("master", "delete");
            }
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => {
                warn!(quota = %name, error = %e, "deleting an orphaned ProjectQuota failed");
                metrics.sync_error("master", "delete");
            }
        }
    }
}
