//! The record of allowed raises ([`super::pending`]) in the API server: `ConfigMap`
//! `kkp-quota-allocation-record` (key `entries`, a JSON list), read afresh for every decision
//! and written with its `resourceVersion` as a precondition.
//!
//! A record deleted or made unreadable by hand reads as empty (and is written anew): its entries
//! mattered only while some cache lagged behind their edits, so the window this leaves is the
//! edits allowed in the moment before (docs/groups.md).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use tracing::warn;

use super::pending::Entry;

/// The record's name.
pub const NAME: &str = "kkp-quota-allocation-record";
const KEY: &str = "entries";

/// The record as read: its entries and the version to write on (`None`: there is none).
#[derive(Debug)]
pub struct Read {
    pub entries: Vec<Entry>,
    pub version: Option<String>,
}

/// Why a write did not land.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// Someone wrote the record since it was read: decide again.
    #[error("the record changed since it was read")]
    Conflict,
    #[error(transparent)]
    Kube(kube::Error),
}

pub async fn read(api: &Api<ConfigMap>) -> Result<Read, kube::Error> {
    let Some(map) = api.get_opt(NAME).await? else {
        return Ok(Read {
            entries: Vec::new(),
            version: None,
        });
    };
    let text = map
        .data
        .as_ref()
        .and_then(|d| d.get(KEY))
        .map_or("[]", String::as_str);
    let entries = serde_json::from_str(text).unwrap_or_else(|e| {
        warn!(record = NAME, error = %e, "the allocation record cannot be read; it is written anew");
        Vec::new()
    });
    Ok(Read {
        entries,
        version: map.metadata.resource_version,
    })
}

pub async fn write(
    api: &Api<ConfigMap>,
    entries: &[Entry],
    version: Option<String>,
) -> Result<(), WriteError> {
    let text = serde_json::to_string(entries).map_err(|e| WriteError::Kube(kube::Error::SerdeError(e)))?;
    let map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(NAME.to_owned()),
            resource_version: version.clone(),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(KEY.to_owned(), text)])),
        ..ConfigMap::default()
    };
    let result = match version {
        Some(_) => api.replace(NAME, &PostParams::default(), &map).await.map(drop),
        None => api.create(&PostParams::default(), &map).await.map(drop),
    };
    match result {
        Ok(()) => Ok(()),
        // A version that moved (409 Conflict), or a record created meanwhile (409 AlreadyExists).
        Err(kube::Error::Api(status)) if status.code == 409 => Err(WriteError::Conflict),
        Err(e) => Err(WriteError::Kube(e)),
    }
}
