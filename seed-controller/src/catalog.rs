//! The admin size catalog: `ConfigMap` `kkp-quota-size-catalog` (key `catalog.yaml`) in the seed's
//! KKP namespace, watched. A catalog that does not parse keeps the previous one in use and is
//! reported (log and `kkp_quota_size_catalog_errors_total`); a deleted `ConfigMap` means the
//! shipped catalog alone.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kkp_quota_runtime::watch::relisting_watcher;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use provider_sizes::{AdminCatalog, SizeCatalog};
use tracing::{error, info, warn};

use crate::Shared;

pub const CONFIG_MAP: &str = "kkp-quota-size-catalog";
pub const KEY: &str = "catalog.yaml";
/// How long counting waits for the admin catalog before going on with the shipped one.
const GIVE_UP_WAITING: std::time::Duration = std::time::Duration::from_secs(30);

/// Why the catalog `ConfigMap` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum UnusableCatalog {
    #[error("ConfigMap {CONFIG_MAP} has no key {KEY}")]
    NoKey,
    #[error("ConfigMap {CONFIG_MAP}, key {KEY}, is not a valid size catalog")]
    Invalid(#[source] provider_sizes::CatalogError),
}

/// What the catalog `ConfigMap` says: a catalog, or why it cannot be used.
pub fn catalog_from(config_map: Option<&ConfigMap>) -> Result<SizeCatalog, UnusableCatalog> {
    let Some(config_map) = config_map else {
        return Ok(SizeCatalog::shipped());
    };
    let text = config_map
        .data
        .as_ref()
        .and_then(|d| d.get(KEY))
        .ok_or(UnusableCatalog::NoKey)?;
    let admin = AdminCatalog::parse(text).map_err(UnusableCatalog::Invalid)?;
    Ok(SizeCatalog::shipped().with_admin(&admin))
}

pub async fn run(shared: Arc<Shared>) {
    let api: Api<ConfigMap> = Api::namespaced(shared.seed.clone(), &shared.config.kubermatic_namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={CONFIG_MAP}"));
    let mut stream = relisting_watcher(api, config, None).default_backoff().boxed();
    let mut current: Option<String> = None;
    let started = std::time::Instant::now();
    let mut seen = false;
    while let Some(event) = stream.next().await {
        let object = match event {
            Ok(Event::Init) => {
                seen = false;
                continue;
            }
            Ok(Event::InitApply(cm) | Event::Apply(cm)) => {
                seen = true;
                Some(cm)
            }
            Ok(Event::Delete(_)) => None,
            Ok(Event::InitDone) => {
                let first = {
                    let mut state = shared.state();
                    let first = !state.catalog_loaded;
                    state.catalog_loaded = true;
                    first
                };
                if !seen && current.is_some() {
                    // Deleted while the watch was down.
                    apply(&shared, None, &mut current);
                }
                if first {
                    shared.wake_writer();
                }
                continue;
            }
            Err(e) => {
                warn!(error = %e, "size catalog watch failed; retrying");
                if started.elapsed() >= GIVE_UP_WAITING {
                    let first = {
                        let mut state = shared.state();
                        let first = !state.catalog_loaded;
                        state.catalog_loaded = true;
                        first
                    };
                    if first {
                        error!(
                            "cannot read ConfigMap {CONFIG_MAP}; counting with the shipped catalog until it can be read"
                        );
                        shared.metrics.catalog_errors.inc();
                        shared.wake_writer();
                    }
                }
                continue;
            }
        };
        apply(&shared, object.as_ref(), &mut current);
    }
}

fn apply(shared: &Shared, config_map: Option<&ConfigMap>, current: &mut Option<String>) {
    let text = config_map.and_then(|cm| cm.data.as_ref().and_then(|d| d.get(KEY)).cloned());
    if config_map.is_some() && text.is_some() && text == *current {
        return;
    }
    match catalog_from(config_map) {
        Ok(catalog) => {
            info!(admin_catalog = config_map.is_some(), "size catalog loaded");
            *current = text;
            shared.state().set_catalog(catalog);
            shared.wake_writer();
        }
        Err(e) => {
            shared.metrics.catalog_errors.inc();
            error!(error = %kkp_quota_runtime::chain::Chain(&e), "admin size catalog is invalid; keeping the previous catalog");
        }
    }
}
