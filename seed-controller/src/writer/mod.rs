//! The writes: `Cluster.status.resourceUsage` and its `ResourceQuotaUsage` condition (in KKP's
//! shape), the seed's `QuotaLedger` `status.localUsage` together with the reservations and
//! expired allotments it makes obsolete, and the same usage in KKP's shape on KKP's own
//! `ResourceQuota` copy.
//!
//! The quota copy write is one JSON merge patch on `/status` carrying the `resourceVersion` it
//! was computed from (compare-and-swap): `localUsage` grows by a Machine in the same write that
//! drops the Machine's reservation, so an admitted Machine is never counted zero times or twice.
//! While the copy has allotments, a Machine that appeared without a reservation is held back
//! (left out of `localUsage`, not judged) until it is reserved or `--admission-record-grace` has
//! passed; the writer wakes itself when the earliest grace ends. On 409 Conflict the copy is read
//! again and the write recomputed. Nothing is written when nothing changed.
//!
//! Under per-seed shares (`spec.shares` set, docs/shares.md) the same write also removes expired
//! `demands` and releases share (`released` grows) computed from the very status it produces:
//! `crate::shares` decides.
//!
//! This file holds the writer's loop ([`run`]): what is dirty or due is written, a few at a time,
//! and retried when it fails. The rest, one idea a file:
//! - `decision`: what a ledger write does, pure (`decide`, the patch, when the ledger is next
//!   due);
//! - `project`: the write of a project's quota copy (its compare-and-swap loop, the share
//!   release, KKP's copy, the Machines judged);
//! - `cluster`: the write of a `Cluster`'s status;
//! - `report`: the metrics and logs of the writes;
//! - `watch`: the watch of the quota copies that makes them due ([`watch_quotas`]).

mod cluster;
mod decision;
mod project;
mod report;
mod watch;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt, stream};
use jiff::Timestamp;
use kkp_quota_crds::QuotaLedgerStatus;
use tracing::{Instrument, info, info_span, warn};

use crate::{Error, Shared};
use cluster::write_cluster;
use project::write_project;
pub use watch::watch_quotas;

/// How many writes run at once.
const CONCURRENCY: usize = 16;
/// Compare-and-swap attempts before giving up for this round (the project stays dirty).
const MAX_ATTEMPTS: usize = 20;

type Outcome = (Option<String>, Option<String>, Result<(), Error>);

/// `status` as this process judges it at `now` (its own clock), for deciding, never for writing
/// back: each demand and allotment with `ttlSeconds` lives that long from when this process first
/// saw it, whatever the webhook's clock wrote in `expiresAt` (issue #32, finding 8). An
/// allotment is so never removed while its holder may still admit from it, and a demand never
/// expires on arrival.
fn judge_lifetimes(
    shared: &Shared,
    project: &str,
    status: &QuotaLedgerStatus,
    now: Timestamp,
) -> QuotaLedgerStatus {
    let observed = shared.state().lifetimes.observe(project, status, now);
    for skew in &observed.skews {
        shared
            .metrics
            .clock_skew
            .with_label_values(&[skew.kind.as_str()])
            .set(skew.seconds);
    }
    observed.status(status)
}

/// Waits for changes and writes them, until aborted.
pub async fn run(shared: Arc<Shared>) {
    loop {
        // Woken by a change, when the grace of a held-back Machine ends, or when a quiet period
        // ends.
        let wakeup = {
            let state = shared.state();
            state
                .grace_wakeups
                .values()
                .chain(state.share_wakeups.values())
                .min()
                .copied()
        };
        match wakeup {
            Some(at) => {
                tokio::select! {
                    () = shared.notify.notified() => {}
                    () = tokio::time::sleep_until(tokio::time::Instant::from_std(at)) => {}
                }
            }
            None => shared.notify.notified().await,
        }
        let (clusters, projects) = {
            let mut state = shared.state();
            let now = Instant::now();
            let state = &mut *state;
            for wakeups in [&mut state.grace_wakeups, &mut state.share_wakeups] {
                let due: Vec<String> = wakeups
                    .iter()
                    .filter(|(_, at)| **at <= now)
                    .map(|(p, _)| p.clone())
                    .collect();
                for project in due {
                    wakeups.remove(&project);
                    state.dirty_projects.insert(project);
                }
            }
            if !(state.clusters_listed && state.catalog_loaded) {
                continue;
            }
            (
                std::mem::take(&mut state.dirty_clusters),
                std::mem::take(&mut state.dirty_projects),
            )
        };
        let mut writes: Vec<futures::future::BoxFuture<'static, Outcome>> = Vec::new();
        for name in clusters {
            let shared = Arc::clone(&shared);
            writes.push(
                async move {
                    let span = info_span!("write_cluster", cluster = %name);
                    let result = write_cluster(&shared, &name).instrument(span).await;
                    (Some(name), None, result)
                }
                .boxed(),
            );
        }
        for project in projects {
            let shared = Arc::clone(&shared);
            writes.push(
                async move {
                    let span = info_span!("write_project", project = %project);
                    let result = write_project(&shared, &project).instrument(span).await;
                    (None, Some(project), result)
                }
                .boxed(),
            );
        }
        let outcomes: Vec<Outcome> = stream::iter(writes).buffer_unordered(CONCURRENCY).collect().await;
        let mut failed = Vec::new();
        for (cluster, project, result) in outcomes {
            if let Err(e) = result {
                warn!(cluster = ?cluster, project = ?project, error = %e, "write failed; will retry");
                failed.push((cluster, project));
            }
        }
        if !failed.is_empty() {
            {
                let mut state = shared.state();
                for (cluster, project) in failed {
                    state.dirty_clusters.extend(cluster);
                    state.dirty_projects.extend(project);
                }
            }
            let retry = Arc::clone(&shared);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                retry.wake_writer();
            });
        }
        if !shared.readiness.is_ready() && shared.state().initially_synced() {
            info!("initial sync complete; ready");
            shared.readiness.set(true);
        }
    }
}
