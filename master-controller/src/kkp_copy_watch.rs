//! The watch of KKP's `ResourceQuota` copies on one seed, by their metadata only (no cache),
//! that tells [`KkpCopies`] what happens to them: a copy deleted, missing from a fresh list, or
//! changed by someone else has its quota reconciled, and is written again. Without it a copy
//! deleted by hand stayed away until its quota changed.

use std::collections::BTreeSet;

use futures::StreamExt;
use kkp_quota_crds::ResourceQuota;
use kkp_quota_runtime::watch::relisting_watcher;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::kkp_copies::{KkpCopies, RETAKE_PAUSE, Retake, Sighting};
use crate::seeds::{SeedBackoff, SeedLink, Triggers};

/// Watches KKP's copies on `seed` until aborted.
pub(crate) async fn watch(
    seed: String,
    client: Client,
    copies: KkpCopies,
    triggers: Triggers,
    link: SeedLink,
) {
    let api: Api<PartialObjectMeta<ResourceQuota>> = Api::all(client);
    let mut backoff = SeedBackoff::new(link.max_backoff);
    loop {
        let mut events = relisting_watcher(api.clone(), watcher::Config::default(), None).boxed();
        let mut listing = BTreeSet::new();
        let mut start = copies.list_starts();
        while let Some(event) = events.next().await {
            let now = Instant::now().into_std();
            match event {
                Ok(Event::Init) => {
                    // Emitted before the list is asked for.
                    listing.clear();
                    start = copies.list_starts();
                }
                Ok(Event::InitApply(copy)) => {
                    let name = copy.name_any();
                    let retake = copies.seen(&seed, &name, Sighting::of(&copy.metadata), Some(start), now);
                    act(&name, retake, "differs from what was written", &triggers);
                    listing.insert(name);
                }
                Ok(Event::InitDone) => {
                    backoff.reset();
                    for name in copies.listed(&seed, start, &std::mem::take(&mut listing)) {
                        info!(quota = %name, "KKP's copy is gone; writing it again");
                        triggers.quota(&name);
                    }
                }
                Ok(Event::Apply(copy)) => {
                    let name = copy.name_any();
                    let retake = copies.seen(&seed, &name, Sighting::of(&copy.metadata), None, now);
                    act(&name, retake, "was changed by someone else", &triggers);
                }
                Ok(Event::Delete(copy)) => {
                    let name = copy.name_any();
                    if copies.deleted(&seed, &name) {
                        debug!(quota = %name, "KKP's copy deleted");
                        triggers.quota(&name);
                    }
                }
                Err(e) => {
                    // The ledger watch says whether the seed is reachable; this one only retries.
                    warn!(error = %e, "watching KKP's copies failed; retrying");
                    break;
                }
            }
        }
        tokio::time::sleep(backoff.next().unwrap_or(link.max_backoff)).await;
    }
}

/// Acts on [`KkpCopies::seen`]'s answer for copy `name` (`why` it is taken back, for the log).
fn act(name: &str, retake: Option<Retake>, why: &str, triggers: &Triggers) {
    match retake {
        None => {}
        Some(Retake::Now) => {
            info!(quota = %name, "KKP's copy {why}; writing it again");
            triggers.quota(name);
        }
        Some(Retake::At(when)) => {
            warn!(
                quota = %name,
                "KKP's copy {why} again, within {RETAKE_PAUSE:?} of the last time: another writer keeps changing it (KKP's own quota synchronizer?); writing it again when that time has passed"
            );
            let (triggers, name) = (triggers.clone(), name.to_owned());
            tokio::spawn(async move {
                tokio::time::sleep_until(Instant::from_std(when)).await;
                triggers.quota(&name);
            });
        }
    }
}
