//! The master's book of every `QuotaGroup`: the group loop's store, or this process's own write
//! of a group when newer, so that a share round right after a group pass plans with what that
//! pass wrote; and which `shared` groups select a project.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};

use kkp_quota_crds::kkp::Project;
use kkp_quota_crds::quota_group::GroupMode;
use kkp_quota_crds::{QuotaGroup, ResourceDetails};
use kube::ResourceExt as _;
use kube::core::{Selector, SelectorExt as _};

/// The newest of every group this process knows: the group loop's store, or its own write when
/// that is newer (the store lags them). Read by every share round, once the group loop has
/// listed every group ([`GroupBook::wait_ready`]).
#[derive(Clone, Default)]
pub struct GroupBook {
    groups: Arc<RwLock<BTreeMap<String, Arc<QuotaGroup>>>>,
    ready: Arc<(std::sync::atomic::AtomicBool, tokio::sync::Notify)>,
}

/// `group` from the store, or `own`, this process's write of the same object, when newer.
fn newer_of(own: Option<&Arc<QuotaGroup>>, group: &Arc<QuotaGroup>) -> Arc<QuotaGroup> {
    let own = own.filter(|own| own.uid() == group.uid()).cloned();
    crate::shares::view::newest(Some(Arc::clone(group)), own).unwrap_or_else(|| Arc::clone(group))
}

impl GroupBook {
    /// Takes the store's groups, keeping this process's own writes that are newer.
    pub fn update(&self, groups: &[Arc<QuotaGroup>]) {
        let mut book = self.groups.write().unwrap_or_else(PoisonError::into_inner);
        let mut fresh = BTreeMap::new();
        for group in groups {
            let name = group.name_any();
            let newest = newer_of(book.get(&name), group);
            fresh.insert(name, newest);
        }
        *book = fresh;
        drop(book);
        self.ready.0.store(true, std::sync::atomic::Ordering::Release);
        self.ready.1.notify_waiters();
    }

    /// Returns once [`GroupBook::update`] has run with a complete listing.
    pub async fn wait_ready(&self) {
        loop {
            let notified = self.ready.1.notified();
            if self.ready.0.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }

    /// Whether the book holds `group` (same object) with the same spec.
    pub fn has_spec(&self, group: &QuotaGroup) -> bool {
        let book = self.groups.read().unwrap_or_else(PoisonError::into_inner);
        book.get(&group.name_any())
            .is_some_and(|own| own.uid() == group.uid() && own.spec == group.spec)
    }

    /// `group`, or this process's own newer write of it.
    pub fn newest(&self, group: &Arc<QuotaGroup>) -> Arc<QuotaGroup> {
        let book = self.groups.read().unwrap_or_else(PoisonError::into_inner);
        newer_of(book.get(&group.name_any()), group)
    }

    /// Remembers a group this process just wrote.
    pub fn wrote(&self, group: QuotaGroup) {
        let mut book = self.groups.write().unwrap_or_else(PoisonError::into_inner);
        book.insert(group.name_any(), Arc::new(group));
    }

    /// The `shared` groups but `group`, each with its selector, read once (one that cannot be
    /// read selects nothing, as in the group's status), and its limits: what else bounds the
    /// members of `group` ([`crate::budgets::other_groups_limits`]).
    pub fn other_shared(&self, group: &str) -> Vec<(Selector, ResourceDetails)> {
        let book = self.groups.read().unwrap_or_else(PoisonError::into_inner);
        book.iter()
            .filter(|(name, g)| {
                name.as_str() != group && g.spec.mode == GroupMode::Shared && !g.spec.quota.is_empty()
            })
            .filter_map(|(_, g)| {
                let selector = Selector::try_from(g.spec.selector.clone()).ok()?;
                Some((selector, g.spec.quota.clone()))
            })
            .collect()
    }

    /// The `shared` groups whose selector picks `project` (a selector that cannot be read picks
    /// nothing, as in the group's status).
    pub fn selecting(&self, project: &Project) -> Vec<Arc<QuotaGroup>> {
        let book = self.groups.read().unwrap_or_else(PoisonError::into_inner);
        book.values()
            .filter(|g| g.spec.mode == GroupMode::Shared && !g.spec.quota.is_empty())
            .filter(|g| {
                Selector::try_from(g.spec.selector.clone()).is_ok_and(|s| s.matches(project.labels()))
            })
            .cloned()
            .collect()
    }
}
