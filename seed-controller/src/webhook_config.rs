//! The `ValidatingWebhookConfiguration` `kkp-quota-machines` in every user cluster: points the
//! user cluster's apiserver at the machine-webhook for Machine CREATE and UPDATE (or CREATE
//! only, [`Operations::Create`]); and `kkp-quota-clusters` on the seed, for `Cluster` creates
//! (`--cluster-webhook`, docs/capacity.md). Applied with
//! server-side apply (field manager `kkp-quota-seed-controller`), watched, and applied again when
//! it is deleted or edited.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kkp_quota_crds::kkp::Cluster;
use kkp_quota_runtime::watch::relisting_watcher;
use kkp_quota_runtime::webhook_auth::{ReloadingKeys, SigningKeys};
use kube::api::{Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde_json::Value;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::Shared;

pub use kkp_quota_runtime::webhook_config::{
    CLUSTERS_NAME, MATCH_CONDITION_NAME, NAME, Operations, PROVIDER_SPEC_CHANGES_ONLY, clusters_url,
    contains, desired, desired_for_clusters, url,
};

pub const FIELD_MANAGER: &str = "kkp-quota-seed-controller";

/// How often the URL-signing key file is checked for a change.
pub const KEY_POLL: Duration = Duration::from_secs(1);

/// Every [`KEY_POLL`], `read`s a file into `sender` when what it holds now differs from what
/// was sent by `same`; what a read cannot give (`None`) never replaces what was sent. Each
/// change is logged as `what` and makes every user cluster's configuration be written again.
async fn follow_file<T, F, Fut>(
    sender: &watch::Sender<Option<T>>,
    what: &str,
    mut read: F,
    same: impl Fn(&T, &T) -> bool,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let mut ticker = tokio::time::interval(KEY_POLL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let Some(current) = read().await else { continue };
        sender.send_if_modified(|held| {
            let changed = held.as_ref().is_none_or(|h| !same(h, &current));
            if changed {
                info!("{what} changed: rewriting every user cluster's webhook configuration");
                *held = Some(current);
            }
            changed
        });
    }
}

/// The keys the webhook URLs are signed with, as a channel that changes when the first
/// (signing) key does, until the task is aborted.
pub async fn follow_keys(keys: Arc<ReloadingKeys>, shared: Arc<Shared>) {
    let read = || std::future::ready(Some(keys.current()));
    follow_file(&shared.url_keys, "URL-signing key", read, |a, b| {
        a.signing_fingerprint() == b.signing_fingerprint()
    })
    .await;
}

type CaReceiver = watch::Receiver<Option<Arc<Vec<u8>>>>;

/// The CA bundle in `path`; `None` while it is empty (a Secret not yet filled).
pub async fn read_ca(path: &std::path::Path) -> std::io::Result<Option<Arc<Vec<u8>>>> {
    match tokio::fs::read(path).await {
        Ok(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => Ok(None),
        Ok(bytes) => Ok(Some(Arc::new(bytes))),
        // A mounted Secret without the key yet: the same as empty.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The CA bundle of `path` as a channel that changes when the file does (a rotated CA reaching
/// the mounted file), until the task is aborted. A file briefly empty (a Secret being
/// rewritten) never takes the CA away.
pub async fn follow_ca(path: std::path::PathBuf, shared: Arc<Shared>) {
    let read = || async {
        read_ca(&path).await.unwrap_or_else(|e| {
            warn!(file = %path.display(), error = %e, "cannot read the webhook CA bundle");
            None
        })
    };
    follow_file(&shared.webhook_ca, "webhook CA bundle", read, |a, b| a == b).await;
}

/// The user cluster's `Cluster` UID on the seed (retried until it is read).
async fn cluster_uid(seed: &Client, cluster: &str) -> String {
    let api: Api<Cluster> = Api::all(seed.clone());
    let mut delay = Duration::from_millis(200);
    loop {
        match api.get(cluster).await {
            Ok(object) => return object.metadata.uid.unwrap_or_default(),
            Err(e) => {
                warn!(error = %e, cluster, "cannot read the Cluster for its webhook URL; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// Which configuration [`keep`] keeps.
#[derive(Debug, Clone)]
pub enum Target {
    /// `kkp-quota-machines` in this user cluster (its URL signed over the `Cluster`'s UID).
    UserCluster(String),
    /// `kkp-quota-clusters` on the seed itself: its `Cluster` creates.
    SeedClusters,
}

impl Target {
    fn config_name(&self) -> &'static str {
        match self {
            Target::UserCluster(_) => NAME,
            Target::SeedClusters => CLUSTERS_NAME,
        }
    }

    /// The UID its URL is signed over: the user cluster's `Cluster` (read until it is); none
    /// for the seed's, which is signed over its name alone.
    async fn uid(&self, shared: &Shared) -> String {
        match self {
            Target::UserCluster(cluster) => cluster_uid(&shared.seed, cluster).await,
            Target::SeedClusters => String::new(),
        }
    }

    /// The configuration it should have with these keys and CA bundle.
    fn desired(
        &self,
        shared: &Shared,
        base: &str,
        uid: &str,
        keys: Option<&SigningKeys>,
        ca: Option<&[u8]>,
    ) -> Value {
        match self {
            Target::UserCluster(cluster) => desired(
                &url(cluster, uid, base, keys),
                ca,
                shared.config.webhook_operations,
            ),
            Target::SeedClusters => {
                desired_for_clusters(&clusters_url(&shared.config.seed_name, base, keys), ca)
            }
        }
    }
}

/// Keeps one configuration until the task is aborted: applied when it is missing or differs,
/// and again whenever the signing key changes (new token in the URL) or, for a user cluster, the
/// `Cluster`'s UID does (re-read every `--resync-period`).
pub async fn keep(client: Client, shared: Arc<Shared>, target: Target) {
    let Some(base) = shared.config.webhook_url.clone() else {
        return;
    };
    let mut keys = shared.url_keys.subscribe();
    let mut ca = shared.webhook_ca.subscribe();
    // With a CA file that is still empty (a certificate not issued yet), a configuration
    // without a CA would make the API server distrust the webhook: wait for the CA.
    if shared.config.webhook_ca_file.is_some() && ca.wait_for(Option::is_some).await.is_err() {
        return;
    }
    let name = target.config_name();
    let mut uid = target.uid(&shared).await;
    // What the configuration should be now, from the latest keys and CA.
    let build = |uid: &str, keys: &watch::Receiver<Option<Arc<SigningKeys>>>, ca: &CaReceiver| {
        let ca = ca.borrow();
        target.desired(
            &shared,
            &base,
            uid,
            keys.borrow().as_deref(),
            ca.as_deref().map(Vec::as_slice),
        )
    };
    let mut wanted = build(&uid, &keys, &ca);
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = relisting_watcher(api.clone(), config, None)
        .default_backoff()
        .boxed();
    let mut seen = false;
    let mut actual: Option<Value> = None;
    let mut recheck = tokio::time::interval(shared.config.resync_period);
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    recheck.tick().await;
    let mut keys_open = true;
    let mut ca_open = true;
    loop {
        let needs_apply = tokio::select! {
            event = stream.next() => match event {
                None => return,
                Some(Ok(Event::Init)) => {
                    seen = false;
                    false
                }
                Some(Ok(Event::InitApply(object) | Event::Apply(object))) => {
                    seen = true;
                    actual = serde_json::to_value(&object).ok();
                    !actual.as_ref().is_some_and(|a| contains(a, &wanted))
                }
                Some(Ok(Event::InitDone)) => !seen,
                Some(Ok(Event::Delete(_))) => {
                    seen = false;
                    actual = None;
                    true
                }
                Some(Err(e)) => {
                    warn!(error = %e, "watch of the webhook configuration failed; retrying");
                    false
                }
            },
            changed = keys.changed(), if keys_open => {
                if changed.is_err() {
                    keys_open = false;
                    false
                } else {
                    wanted = build(&uid, &keys, &ca);
                    seen && !actual.as_ref().is_some_and(|a| contains(a, &wanted))
                }
            }
            changed = ca.changed(), if ca_open => {
                if changed.is_err() {
                    ca_open = false;
                    false
                } else {
                    wanted = build(&uid, &keys, &ca);
                    seen && !actual.as_ref().is_some_and(|a| contains(a, &wanted))
                }
            }
            _ = recheck.tick(), if matches!(target, Target::UserCluster(_)) => {
                let now = target.uid(&shared).await;
                if now == uid {
                    false
                } else {
                    info!(?target, "the Cluster was recreated (new UID): new webhook URL");
                    uid = now;
                    wanted = build(&uid, &keys, &ca);
                    true
                }
            }
        };
        if needs_apply {
            let params = PatchParams::apply(FIELD_MANAGER).force();
            match api.patch(name, &params, &Patch::Apply(&wanted)).await {
                Ok(_) => info!(name, "webhook configuration applied"),
                Err(e) => {
                    warn!(error = %e, "could not apply the webhook configuration; retrying on the next event");
                }
            }
        }
    }
}
