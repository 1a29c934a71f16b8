//! The allocation webhook's caches: of each kind of object it reads, by name, only what a
//! decision reads (a KKP quota's project and limits, a `ProjectQuota`'s limits, a project's
//! labels, a group's spec) and the object's UID and version. Every replica keeps them beside the
//! leader's own caches; whole objects took some 1.7 KB each, about 50 MB at 10,000 projects.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, PoisonError, RwLock};

use futures::future::BoxFuture;
use futures::{FutureExt as _, StreamExt as _};
use kkp_quota_runtime::watch::relisting_watcher;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource, ResourceExt as _};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tracing::debug;

use super::pending::{Cached, Object};

/// One kind's objects, by name: what a decision reads of each, and its UID and version.
pub(super) struct Cache<V> {
    entries: RwLock<BTreeMap<String, (V, Option<Cached>)>>,
    ready: watch::Sender<bool>,
}

impl<V: Clone> Cache<V> {
    /// Waits until the first full list is in.
    pub async fn ready(&self) {
        let mut ready = self.ready.subscribe();
        let _ = ready.wait_for(|r| *r).await;
    }

    /// What is read of each object, by name; its UID and version go into `cached` under
    /// `object(name)`.
    pub fn snapshot(
        &self,
        object: fn(String) -> Object,
        cached: &mut BTreeMap<Object, Cached>,
    ) -> BTreeMap<String, V> {
        let entries = self.entries.read().unwrap_or_else(PoisonError::into_inner);
        entries
            .iter()
            .map(|(name, (value, c))| {
                if let Some(c) = c {
                    cached.insert(object(name.clone()), c.clone());
                }
                (name.clone(), value.clone())
            })
            .collect()
    }

    /// What is read of each object, by name.
    pub fn values(&self) -> BTreeMap<String, V> {
        let entries = self.entries.read().unwrap_or_else(PoisonError::into_inner);
        entries
            .iter()
            .map(|(name, (value, _))| (name.clone(), value.clone()))
            .collect()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, (V, Option<Cached>)>> {
        self.entries.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A cache of `api`'s objects, each as `read` takes it (`None`: not kept), and the future that
/// keeps it.
pub(super) fn keep<K, V>(api: Api<K>, read: fn(&K) -> Option<V>) -> (Arc<Cache<V>>, BoxFuture<'static, ()>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    V: Clone + Send + Sync + 'static,
{
    let cache = Arc::new(Cache {
        entries: RwLock::new(BTreeMap::new()),
        ready: watch::Sender::new(false),
    });
    let entry = move |object: &K| {
        let meta = object.meta();
        let cached = (meta.uid.clone())
            .zip(meta.resource_version.clone())
            .map(|(uid, version)| Cached { uid, version });
        read(object).map(|value| (value, cached))
    };
    let run = {
        let cache = Arc::clone(&cache);
        async move {
            let mut events = relisting_watcher(api, watcher::Config::default(), None)
                .default_backoff()
                .boxed();
            let mut listed = BTreeMap::new();
            while let Some(event) = events.next().await {
                match event {
                    Ok(Event::Init) => listed.clear(),
                    Ok(Event::InitApply(object)) => {
                        if let Some(e) = entry(&object) {
                            listed.insert(object.name_any(), e);
                        }
                    }
                    Ok(Event::InitDone) => {
                        *cache.write() = std::mem::take(&mut listed);
                        cache.ready.send_replace(true);
                    }
                    Ok(Event::Apply(object)) => {
                        let name = object.name_any();
                        match entry(&object) {
                            Some(e) => cache.write().insert(name, e),
                            None => cache.write().remove(&name),
                        };
                    }
                    Ok(Event::Delete(object)) => {
                        cache.write().remove(&object.name_any());
                    }
                    Err(e) => debug!(kind = std::any::type_name::<K>(), error = %e, "allocation cache watch"),
                }
            }
        }
        .boxed()
    };
    (cache, run)
}
