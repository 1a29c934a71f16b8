//! The seed side of a reconcile: KKP's copy and the ledger applied on every fresh seed, and
//! the folded usage written back onto them.

use std::sync::Arc;
use std::time::Instant;

use futures::future;
use kkp_quota_crds::quota_ledger::LedgerShares;
use kkp_quota_crds::{QuotaLedger, ResourceDetails, ResourceQuota};
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use tracing::{Instrument, debug, info_span, warn};

use crate::api::{bounded, ignore_missing, ours};
use crate::ctx::Ctx;
use crate::fanout::{self, FIELD_MANAGER};
use crate::fingerprint::Fingerprint;
use crate::fold;
use crate::kkp_copies::{Retake, Sighting};
use crate::seed_ledger::SeedLedger;
use crate::seeds::SeedView;
use crate::status_patches;

/// `otherSeedsUsage` back onto every fresh seed's ledger, and `globalUsage` onto its KKP copy,
/// where changed. Returns the seeds where a write failed.
pub(crate) async fn write_seed_statuses(
    name: &str,
    views: &[SeedView],
    folded: &fold::Folded,
    ctx: &Ctx,
) -> Vec<String> {
    let writes = views.iter().filter(|v| v.health.is_fresh()).filter_map(|v| {
        let ledger = v.copy.as_ref()?;
        let client = v.client.clone()?;
        let others = folded.others.get(&v.name).cloned().flatten();
        let ledger_patch = status_patches::ledger_status_patch(ledger, others.as_ref());
        let known = ctx.kkp_copies.get(&v.name, name).status;
        let kkp_patch = folded
            .global
            .as_ref()
            .map(status_patches::kkp_copy_status_patch)
            .filter(|(written, _)| known != Some(*written));
        if ledger_patch.is_none() && kkp_patch.is_none() {
            return None;
        }
        let seed = v.name.clone();
        Some(async move {
            let written = async {
                if let Some(patch) = ledger_patch {
                    let api: Api<QuotaLedger> = Api::all(client.clone());
                    patch_status(&api, name, &PatchParams::default(), &patch, &seed, ctx).await?;
                }
                if let Some((written, patch)) = kkp_patch {
                    let api: Api<ResourceQuota> = Api::all(client);
                    patch_status(&api, name, &ours(), &patch, &seed, ctx).await?;
                    ctx.kkp_copies.status_written(&seed, name, written);
                }
                Ok::<(), kube::Error>(())
            }
            .await;
            written.map_err(|e| {
                warn!(seed = %seed, error = %e, "writing the seed copies' status failed");
                ctx.metrics.sync_error(&seed, "status");
                seed
            })
        })
    });
    future::join_all(writes)
        .await
        .into_iter()
        .filter_map(Result::err)
        .collect()
}

/// A merge patch of one seed object's `/status`, bounded, timed and counted; an object gone
/// meanwhile is nothing to write.
async fn patch_status<K>(
    api: &Api<K>,
    name: &str,
    params: &PatchParams,
    patch: &serde_json::Value,
    seed: &str,
    ctx: &Ctx,
) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = Patch::Merge(patch);
    let write = bounded(api.patch_status(name, params, &patch));
    ignore_missing(ctx.metrics.timed_write(seed, "status", write).await)
}

/// Applies KKP's copy and the ledger on one seed if it is fresh and they are out of date (KKP's
/// first, so the seed-controller finds it when the ledger appears). `shares` is the seed's part
/// of the persisted share record, never of an unpersisted plan. Returns the view with the
/// ledger as it is now, and the write's failure (logged and counted here already) or when KKP's
/// copy is to be applied again (changed by someone else while it was applied, or a retake
/// waiting out its pause, [`crate::kkp_copies::KkpCopies::retake_waits_until`]). While the
/// seed has a demand waiting (`waiting`), the groups its ledger carries for denials are
/// refreshed too ([`fanout::groups_stale`]).
pub(crate) async fn fan_out(
    master_rq: &ResourceQuota,
    limits: &ResourceDetails,
    shares: Option<LedgerShares>,
    policies: fanout::Policies<'_>,
    view: &SeedView,
    waiting: bool,
    ctx: &Ctx,
) -> (SeedView, Result<Option<Retake>, kube::Error>) {
    let mut view = view.clone();
    let Some(client) = view.client.clone() else {
        return (view, Ok(None));
    };
    if !view.health.is_fresh() {
        return (view, Ok(None));
    }
    let name = master_rq.name_any();
    if let Some(ledger) = &view.copy {
        ctx.hand_deletes.note(&view.name, &name, ledger);
    }
    let kkp_body = fanout::copy_apply_body(master_rq);
    let kkp_fingerprint = Fingerprint::of(&kkp_body);
    // A retake that waited out its pause (another writer keeps changing the copy) is due too.
    let kkp_due = ctx.kkp_copies.get(&view.name, &name).applied != Some(kkp_fingerprint)
        || ctx.kkp_copies.take_back_due(&view.name, &name, Instant::now());
    // One being deleted without our finalizer cannot be given it (the API server refuses new
    // finalizers then): it is left to go, and re-created once gone.
    let ledger_due = !view.copy.as_ref().is_some_and(|c| {
        (c.deleting && !c.protected)
            || (fanout::ledger_in_sync(master_rq, limits, shares.as_ref(), policies, c)
                && !fanout::groups_stale(shares.as_ref(), c, waiting))
    });
    // A retake waiting out its pause: a turn at its time is asked for again (this turn
    // cancelled the retry time an earlier turn asked for).
    let waits = (!kkp_due)
        .then(|| ctx.kkp_copies.retake_waits_until(&view.name, &name))
        .flatten()
        .map(Retake::At);
    if !kkp_due && !ledger_due {
        return (view, Ok(waits));
    }
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let seed = view.name.as_str();
    // Boxed: two API calls held at once make a large future.
    let kkp = Box::pin(async {
        if kkp_due {
            let api: Api<ResourceQuota> = Api::all(client.clone());
            // Dropped unlanded (failed, or cancelled with the ledger's apply), the copy counts
            // as unknown.
            let applying = ctx.kkp_copies.applying(seed, &name);
            let copy = ctx
                .metrics
                .timed_write(
                    seed,
                    "apply",
                    bounded(api.patch(&name, &params, &Patch::Apply(&kkp_body))),
                )
                .await?;
            // The answer says what the copy's status holds: a status write that would say the
            // same (a new copy's "nothing used", a restarted master's unchanged figure) is skipped.
            let holds = copy.status.as_ref().and_then(|s| s.global_usage.as_ref());
            return Ok(applying.landed(
                kkp_fingerprint,
                Sighting::of(&copy.metadata),
                status_patches::kkp_copy_reading(holds),
                Instant::now(),
            ));
        }
        Ok::<_, kube::Error>(None)
    });
    let ledger = Box::pin(async {
        if !ledger_due {
            return Ok(None);
        }
        let api: Api<QuotaLedger> = Api::all(client.clone());
        let body = fanout::ledger_apply_body(master_rq, limits, shares.as_ref(), policies);
        ctx.metrics
            .timed_write(
                seed,
                "apply",
                bounded(api.patch(&name, &params, &Patch::Apply(&body))),
            )
            .await
            .map(Some)
    });
    let result = async {
        if view.copy.is_some() {
            // Both exist: neither waits for the other (a quota edit reaches the ledger one
            // write sooner).
            futures::try_join!(kkp, ledger)
        } else {
            // KKP's copy first, so the seed-controller finds it when the ledger appears.
            let retake = kkp.await?;
            Ok((retake, ledger.await?))
        }
    }
    .instrument(info_span!("apply", seed = %view.name))
    .await;
    match result {
        Ok((retake, ledger)) => {
            debug!(seed = %view.name, "seed copies applied");
            if let Some(ledger) = ledger {
                view.copy = Some(Arc::new(SeedLedger::from(&ledger)));
            }
            (view, Ok(retake.or(waits)))
        }
        Err(e) => {
            warn!(seed = %view.name, error = %e, "applying the seed copies failed");
            ctx.metrics.sync_error(&view.name, "apply");
            (view, Err(e))
        }
    }
}
