//! What the webhook keeps of the seed in memory, from watches: the `QuotaLedger` copies, the
//! metadata of KKP's `ResourceQuota` copies (which projects have a quota here), the `Cluster`
//! objects and the admin size catalog. Nothing here calls a cloud API or another
//! cluster; the admission path only reads these maps.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use futures::{Stream, StreamExt as _};
use k8s_openapi::api::core::v1::ConfigMap;
use kkp_quota_crds::kkp::Cluster;
use kkp_quota_crds::quota::{PROJECT_KIND, SUBJECT_KIND_LABEL, SUBJECT_NAME_LABEL};
use kkp_quota_crds::{QuotaLedger, QuotaLedgerSpec, QuotaLedgerStatus, ResourceQuota};
use kkp_quota_runtime::watch::relisting_watcher;
use kube::api::{ApiResource, DynamicObject, PartialObjectMeta};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt as _};
use provider_sizes::{AdminCatalog, SizeCatalog};
use serde::de::DeserializeOwned;
use tracing::{info, warn};

use crate::decision::{LedgerGap, QuotaState, StateError, is_counted_json};

/// The admin size catalog: `ConfigMap` in the seed's kubermatic namespace.
pub const SIZE_CATALOG_CONFIGMAP: &str = "kkp-quota-size-catalog";
/// Its key.
pub const SIZE_CATALOG_KEY: &str = "catalog.yaml";

/// A watched set of objects, keyed by `namespace/name` (or `name`), optionally indexed by one
/// string an object yields (the project whose quota it is), so that the admission path finds a
/// project's objects without a pass over every object of the seed.
#[derive(Debug)]
pub struct Mirror<K> {
    store: RwLock<Store<K>>,
    index: Option<fn(&K) -> Option<String>>,
    synced: AtomicBool,
}

#[derive(Debug)]
struct Store<K> {
    objects: HashMap<String, Arc<K>>,
    /// Index value → the keys of the objects that yield it (empty without an index).
    indexed: HashMap<String, BTreeSet<String>>,
}

impl<K> Default for Store<K> {
    fn default() -> Self {
        Store {
            objects: HashMap::new(),
            indexed: HashMap::new(),
        }
    }
}

impl<K> Default for Mirror<K> {
    fn default() -> Self {
        Mirror {
            store: RwLock::new(Store::default()),
            index: None,
            synced: AtomicBool::new(false),
        }
    }
}

fn key_of<K: Resource>(object: &K) -> String {
    match object.meta().namespace.as_deref() {
        Some(ns) => format!("{ns}/{}", object.name_any()),
        None => object.name_any(),
    }
}

impl<K: Resource> Mirror<K> {
    /// A mirror indexed by what `index` yields for each object ([`Mirror::first_indexed`]).
    pub fn indexed(index: fn(&K) -> Option<String>) -> Self {
        Mirror {
            index: Some(index),
            ..Mirror::default()
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Store<K>> {
        self.store
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn get(&self, key: &str) -> Option<Arc<K>> {
        self.read().objects.get(key).cloned()
    }

    /// Every object.
    pub fn all(&self) -> Vec<Arc<K>> {
        self.read().objects.values().cloned().collect()
    }

    /// The first object (by key) that matches.
    pub fn find(&self, mut matches: impl FnMut(&K) -> bool) -> Option<Arc<K>> {
        let store = self.read();
        let mut found: Vec<(&String, &Arc<K>)> = store.objects.iter().filter(|(_, o)| matches(o)).collect();
        found.sort_by(|a, b| a.0.cmp(b.0));
        found.first().map(|(_, o)| Arc::clone(o))
    }

    /// The first object (by key) whose index value is `value` (as [`Mirror::find`] would find
    /// it with the index function as the test, without looking at any other object).
    pub fn first_indexed(&self, value: &str) -> Option<Arc<K>> {
        let store = self.read();
        let key = store.indexed.get(value)?.first()?;
        store.objects.get(key).cloned()
    }

    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Store<K>> {
        self.store
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn insert(&self, store: &mut Store<K>, key: String, object: Arc<K>) {
        self.unindex(store, &key);
        if let Some(value) = self.index.and_then(|index| index(&object)) {
            store.indexed.entry(value).or_default().insert(key.clone());
        }
        store.objects.insert(key, object);
    }

    fn unindex(&self, store: &mut Store<K>, key: &str) {
        let Some(index) = self.index else { return };
        let Some(value) = store.objects.get(key).and_then(|old| index(old)) else {
            return;
        };
        if let Some(keys) = store.indexed.get_mut(&value) {
            keys.remove(key);
            if keys.is_empty() {
                store.indexed.remove(&value);
            }
        }
    }

    /// Applies one watch event. `buffer` collects a relist until it is complete, so readers never
    /// see a half-listed set.
    fn apply(&self, event: Event<K>, buffer: &mut Option<HashMap<String, Arc<K>>>) {
        match event {
            Event::Apply(object) => {
                let mut store = self.write();
                self.insert(&mut store, key_of(&object), Arc::new(object));
            }
            Event::Delete(object) => {
                let key = key_of(&object);
                let mut store = self.write();
                self.unindex(&mut store, &key);
                store.objects.remove(&key);
            }
            Event::Init => *buffer = Some(HashMap::new()),
            Event::InitApply(object) => {
                buffer
                    .get_or_insert_with(HashMap::new)
                    .insert(key_of(&object), Arc::new(object));
            }
            Event::InitDone => {
                let mut listed = Store::default();
                for (key, object) in buffer.take().unwrap_or_default() {
                    self.insert(&mut listed, key, object);
                }
                *self.write() = listed;
                self.synced.store(true, Ordering::SeqCst);
            }
        }
    }

    /// Keeps the mirror up to date from a watch stream until the stream ends.
    async fn follow(
        &self,
        what: &str,
        stream: impl Stream<Item = Result<Event<K>, watcher::Error>>,
        mut on_change: impl FnMut(&Self),
    ) {
        let mut buffer = None;
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(event) => {
                    self.apply(event, &mut buffer);
                    on_change(self);
                }
                Err(e) => warn!(error = %e, watch = what, "watch failed; retrying"),
            }
        }
    }
}

/// The seed as the webhook sees it.
#[derive(Debug)]
pub struct SeedCache {
    pub quotas: Mirror<DynamicObject>,
    /// Bumped on every quota ledger event: what requests waiting for share wait on.
    quota_changes: tokio::sync::watch::Sender<u64>,
    /// KKP's `ResourceQuota` copies master-controller writes beside each ledger (metadata only:
    /// the labels say whose quota it is). One without its ledger means the ledger is missing.
    pub kkp_quotas: Mirror<PartialObjectMeta<ResourceQuota>>,
    pub clusters: Mirror<Cluster>,
    catalog: RwLock<SizeCatalog>,
    catalog_synced: AtomicBool,
    quota_resource: ApiResource,
    /// Times the ledgers were listed again because the seed's data went back in time (an etcd
    /// restore): copies this process wrote before that are no newer than the cache's.
    restores: std::sync::atomic::AtomicU64,
    /// After such a restore, per ledger: the master's word version it carried before. A ledger
    /// carrying an older word is not used until the master has rewritten it.
    restored: Mutex<HashMap<String, u64>>,
}

/// A quota copy as read: its name, resourceVersion, typed spec and status, and the raw
/// reservations (kept as JSON so that fields this version does not know survive our writes).
#[derive(Debug, Clone)]
pub struct QuotaCopy {
    pub name: String,
    pub resource_version: Option<String>,
    pub spec: QuotaLedgerSpec,
    pub status: Option<QuotaLedgerStatus>,
    pub raw_reservations: Vec<serde_json::Value>,
    /// `status.allotments` as JSON, for the same reason.
    pub raw_allotments: Vec<serde_json::Value>,
    /// `status.demands` as JSON, for the same reason.
    pub raw_demands: Vec<serde_json::Value>,
    pub uid: Option<String>,
}

/// A quota copy could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("quota {name}: {source}")]
    Parse { name: String, source: serde_json::Error },
    #[error("quota {name}: {source}")]
    State { name: String, source: StateError },
}

fn parse<T: DeserializeOwned + Default>(
    name: &str,
    value: Option<&serde_json::Value>,
) -> Result<T, CopyError> {
    match value {
        None | Some(serde_json::Value::Null) => Ok(T::default()),
        Some(v) => serde_json::from_value(v.clone()).map_err(|source| CopyError::Parse {
            name: name.to_owned(),
            source,
        }),
    }
}

impl QuotaCopy {
    pub fn from_dynamic(object: &DynamicObject) -> Result<QuotaCopy, CopyError> {
        let name = object.name_any();
        let spec: QuotaLedgerSpec = match object.data.get("spec") {
            Some(v) => serde_json::from_value(v.clone()).map_err(|source| CopyError::Parse {
                name: name.clone(),
                source,
            })?,
            None => {
                return Err(CopyError::Parse {
                    name,
                    source: serde::de::Error::custom("no spec"),
                });
            }
        };
        let status: Option<QuotaLedgerStatus> = match object.data.get("status") {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => Some(parse(&name, Some(v))?),
        };
        let raw_list = |field: &str| {
            object
                .data
                .get("status")
                .and_then(|s| s.get(field))
                .and_then(serde_json::Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        Ok(QuotaCopy {
            name,
            resource_version: object.metadata.resource_version.clone(),
            spec,
            status,
            raw_reservations: raw_list("reservations"),
            raw_allotments: raw_list("allotments"),
            raw_demands: raw_list("demands"),
            uid: object.metadata.uid.clone(),
        })
    }

    pub fn state(&self) -> Result<QuotaState, CopyError> {
        QuotaState::from_parts(&self.spec, self.status.as_ref()).map_err(|source| CopyError::State {
            name: self.name.clone(),
            source,
        })
    }

    /// Reserved Machines (not groups).
    pub fn reservation_count(&self) -> usize {
        self.status.as_ref().map_or(0, |s| s.reservations.len())
    }
}

/// The master's word version a ledger carries (`spec.shares.version`).
pub fn word_version(ledger: &DynamicObject) -> Option<u64> {
    ledger.data.get("spec")?.get("shares")?.get("version")?.as_u64()
}

/// Whether a quota object is the project's quota (by labels, never by name).
pub fn is_quota_of(object: &impl Resource, project: &str) -> bool {
    project_of(object).as_deref() == Some(project)
}

/// The project whose quota `object` is (the index of the quota mirrors), as [`is_quota_of`]
/// reads the labels.
fn project_of(object: &impl Resource) -> Option<String> {
    let labels = object.labels();
    (labels.get(SUBJECT_KIND_LABEL).map(String::as_str) == Some(PROJECT_KIND))
        .then(|| labels.get(SUBJECT_NAME_LABEL).cloned())
        .flatten()
}

impl SeedCache {
    pub fn new() -> SeedCache {
        SeedCache {
            quotas: Mirror::indexed(project_of),
            quota_changes: tokio::sync::watch::Sender::new(0),
            kkp_quotas: Mirror::indexed(project_of),
            clusters: Mirror::default(),
            catalog: RwLock::new(SizeCatalog::shipped()),
            catalog_synced: AtomicBool::new(false),
            quota_resource: ApiResource::erase::<QuotaLedger>(&()),
            restores: std::sync::atomic::AtomicU64::new(0),
            restored: Mutex::default(),
        }
    }

    /// How often the seed's data went back in time while this process ran ([`Self::run`]).
    pub fn restores(&self) -> u64 {
        self.restores.load(Ordering::SeqCst)
    }

    /// The seed's data went back in time (its watch had to list again, or a fresh read came back
    /// older than the cache): remembers the master's word version each ledger carried before,
    /// from the cache (which still holds the objects from before), unless an earlier restore
    /// remembered a newer one.
    pub fn note_restore(&self) {
        let mut restored = self
            .restored
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for ledger in self.quotas.all() {
            if let Some(version) = word_version(&ledger) {
                let known = restored.entry(ledger.name_any()).or_insert(version);
                *known = (*known).max(version);
            }
        }
        self.restores.fetch_add(1, Ordering::SeqCst);
        warn!(
            ledgers = restored.len(),
            "this seed's data went back in time (an etcd restore?): ledgers carrying an older word of the master wait for a newer one"
        );
    }

    /// Whether `ledger` carries an older word of the master than it did before a restore of the
    /// seed's data (forgotten once it carries one as new).
    pub fn behind_a_restore(&self, ledger: &DynamicObject) -> bool {
        let mut restored = self
            .restored
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let name = ledger.name_any();
        let Some(&before) = restored.get(&name) else {
            return false;
        };
        if word_version(ledger).unwrap_or(0) >= before {
            restored.remove(&name);
            return false;
        }
        true
    }

    /// Why `ledger`, as cached, cannot be decided on yet, if it cannot: it is behind a restore
    /// of the seed's data, or not counted yet (it holds nothing of what already runs).
    pub fn ledger_gap(&self, ledger: &DynamicObject) -> Option<LedgerGap> {
        if self.behind_a_restore(ledger) {
            return Some(LedgerGap::Restored);
        }
        (!is_counted_json(ledger.data.get("status"))).then_some(LedgerGap::Uncounted)
    }

    pub fn quota_resource(&self) -> &ApiResource {
        &self.quota_resource
    }

    /// Every watch has listed once.
    pub fn is_synced(&self) -> bool {
        self.quotas.is_synced()
            && self.kkp_quotas.is_synced()
            && self.clusters.is_synced()
            && self.catalog_synced.load(Ordering::SeqCst)
    }

    /// Changes whenever a quota ledger on the seed changes.
    pub fn quota_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.quota_changes.subscribe()
    }

    /// The project's quota copy, if it has one.
    pub fn quota_for(&self, project: &str) -> Option<Arc<DynamicObject>> {
        self.quotas.first_indexed(project)
    }

    /// The name of KKP's copy of the project's quota on this seed, if there is one.
    pub fn kkp_quota_for(&self, project: &str) -> Option<String> {
        self.kkp_quotas.first_indexed(project).map(|q| q.name_any())
    }

    pub fn cluster(&self, name: &str) -> Option<Arc<Cluster>> {
        self.clusters.get(name)
    }

    pub fn catalog(&self) -> SizeCatalog {
        self.catalog
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set_catalog(&self, configmap: Option<&ConfigMap>) {
        let text = configmap
            .and_then(|cm| cm.data.as_ref())
            .and_then(|d| d.get(SIZE_CATALOG_KEY));
        let catalog = match text {
            None => SizeCatalog::shipped(),
            Some(text) => match AdminCatalog::parse(text) {
                Ok(admin) => {
                    info!(entries = admin.len(), "loaded the admin size catalog");
                    SizeCatalog::shipped().with_admin(&admin)
                }
                Err(e) => {
                    warn!(error = %e, "the admin size catalog is invalid; keeping the previous one");
                    return;
                }
            },
        };
        *self
            .catalog
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = catalog;
    }

    /// Runs the watches until dropped.
    pub async fn run(self: Arc<Self>, client: Client, kubermatic_namespace: String) {
        let cache = Arc::clone(&self);
        let quotas = relisting_watcher(
            Api::<DynamicObject>::all_with(client.clone(), &self.quota_resource),
            watcher::Config::default(),
            Some(Arc::new(move || cache.note_restore())),
        )
        .default_backoff();
        // Metadata only: the labels are all that is read.
        let kkp_quotas = relisting_watcher(
            Api::<PartialObjectMeta<ResourceQuota>>::all(client.clone()),
            watcher::Config::default(),
            None,
        )
        .default_backoff();
        let clusters = relisting_watcher(
            Api::<Cluster>::all(client.clone()),
            watcher::Config::default(),
            None,
        )
        .default_backoff();
        let catalog = relisting_watcher(
            Api::<ConfigMap>::namespaced(client, &kubermatic_namespace),
            watcher::Config::default().fields(&format!("metadata.name={SIZE_CATALOG_CONFIGMAP}")),
            None,
        )
        .default_backoff();
        let catalog_mirror: Mirror<ConfigMap> = Mirror::default();
        tokio::join!(
            self.quotas.follow("quotaledgers", quotas, |_| {
                self.quota_changes.send_modify(|n| *n = n.wrapping_add(1));
            }),
            self.kkp_quotas.follow("resourcequotas", kkp_quotas, |_| {}),
            self.clusters.follow("clusters", clusters, |_| {}),
            catalog_mirror.follow("size catalog", catalog, |m| {
                if m.is_synced() {
                    self.set_catalog(
                        m.get(&format!("{kubermatic_namespace}/{SIZE_CATALOG_CONFIGMAP}"))
                            .as_deref(),
                    );
                    self.catalog_synced.store(true, Ordering::SeqCst);
                }
            }),
        );
    }
}

impl Default for SeedCache {
    fn default() -> Self {
        SeedCache::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(name: &str, project: Option<&str>) -> DynamicObject {
        let mut object = DynamicObject::new(name, &ApiResource::erase::<QuotaLedger>(&()));
        if let Some(project) = project {
            object.metadata.labels = Some(
                [
                    (SUBJECT_KIND_LABEL.to_owned(), PROJECT_KIND.to_owned()),
                    (SUBJECT_NAME_LABEL.to_owned(), project.to_owned()),
                ]
                .into(),
            );
        }
        object
    }

    fn name(found: Option<Arc<DynamicObject>>) -> Option<String> {
        found.map(|o| o.name_any())
    }

    #[test]
    fn the_index_finds_what_a_pass_over_every_object_finds() {
        let mirror: Mirror<DynamicObject> = Mirror::indexed(project_of);
        let mut buffer = None;
        for event in [
            Event::Init,
            Event::InitApply(ledger("b", Some("demo"))),
            Event::InitApply(ledger("a", Some("demo"))),
            Event::InitApply(ledger("c", Some("other"))),
            Event::InitApply(ledger("d", None)),
            Event::InitDone,
        ] {
            mirror.apply(event, &mut buffer);
        }
        let scan = |project: &str| name(mirror.find(|q| is_quota_of(q, project)));
        for project in ["demo", "other", "none"] {
            assert_eq!(name(mirror.first_indexed(project)), scan(project), "{project}");
        }
        assert_eq!(name(mirror.first_indexed("demo")).as_deref(), Some("a"));
        // Relabelled: it leaves its old project's entry.
        mirror.apply(Event::Apply(ledger("a", Some("other"))), &mut buffer);
        assert_eq!(name(mirror.first_indexed("demo")).as_deref(), Some("b"));
        assert_eq!(name(mirror.first_indexed("other")).as_deref(), Some("a"));
        // Deleted, and labels dropped.
        mirror.apply(Event::Delete(ledger("b", Some("demo"))), &mut buffer);
        mirror.apply(Event::Apply(ledger("a", None)), &mut buffer);
        assert_eq!(name(mirror.first_indexed("demo")), None);
        assert_eq!(name(mirror.first_indexed("other")).as_deref(), Some("c"));
        // A relist replaces the index with the listed objects'.
        for event in [
            Event::Init,
            Event::InitApply(ledger("e", Some("demo"))),
            Event::InitDone,
        ] {
            mirror.apply(event, &mut buffer);
        }
        assert_eq!(name(mirror.first_indexed("demo")).as_deref(), Some("e"));
        assert_eq!(name(mirror.first_indexed("other")), None);
    }
}
