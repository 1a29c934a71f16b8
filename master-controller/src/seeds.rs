//! The seed set: every `Seed` on the master, a client built from the kubeconfig Secret it
//! references, and one watch of `QuotaLedger`s (the seed side of every quota) per seed.
//!
//! - Seeds added, removed, or whose kubeconfig Secret changes are picked up without a restart
//!   (the `Seed`s and the `Secret`s of the seed namespace are watched, and the set is
//!   re-resolved on every change and every ten seconds).
//! - Each seed's copies are watched by a task of its own: a seed that cannot be reached is
//!   retried with backoff ([`SeedBackoff`]) and never stalls the others. Its cache (the last
//!   copies seen) stays while it is unreachable: that is the "last known usage" the fold keeps
//!   counting.
//! - After a failure the watch starts over with a full list, so a seed becomes fresh again only
//!   once the cache is complete and current ("catch up at once").

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use futures::{FutureExt, StreamExt, stream};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Secret;
use kkp_quota_crds::QuotaLedger;
use kkp_quota_crds::kkp::{KUBECONFIG_KEY, Seed};
use kkp_quota_crds::ledger::lifetimes::Lifetimes;
use kkp_quota_runtime::chain::Chain;
use kkp_quota_runtime::kubeconfig::{client_from_yaml, kubeconfig_from_secret};
use kkp_quota_runtime::watch::relisting_watcher;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, reflector};
use kube::{Api, Client, ResourceExt};
use tokio::sync::{Notify, mpsc};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::task::AbortOnDropHandle;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::fold::Health;
use crate::kkp_copies::KkpCopies;
use crate::metrics::Metrics;
use crate::seed_ledger::SeedLedger;

/// What is known about one seed.
#[derive(Clone)]
pub struct SeedState {
    /// `None` while its kubeconfig cannot be read.
    pub client: Option<Client>,
    pub health: Health,
    /// The quota ledgers on the seed, as last seen (what the master reads of them), by name.
    pub copies: BTreeMap<String, Arc<SeedLedger>>,
}

/// One seed's part of one quota, copied out of the shared state for a reconcile.
#[derive(Clone)]
pub struct SeedView {
    pub name: String,
    pub client: Option<Client>,
    pub health: Health,
    pub copy: Option<Arc<SeedLedger>>,
}

/// A ledger and its name (the quota's).
pub type NamedLedger = (String, Arc<SeedLedger>);

/// The shared seed state, and what was written onto KKP's copies on the seeds.
#[derive(Clone, Default)]
pub struct Seeds(
    Arc<RwLock<BTreeMap<String, SeedState>>>,
    Arc<AtomicBool>,
    KkpCopies,
);

impl Seeds {
    /// True once the `Seed` objects have been listed and resolved at least once. Before that
    /// the seed set is empty for lack of knowledge, not because there are no seeds: nothing may
    /// be folded, released or deleted on its basis.
    pub fn resolved(&self) -> bool {
        self.1.load(Ordering::SeqCst)
    }

    fn write<T>(&self, f: impl FnOnce(&mut BTreeMap<String, SeedState>) -> T) -> T {
        f(&mut self.0.write().unwrap_or_else(PoisonError::into_inner))
    }

    fn read<T>(&self, f: impl FnOnce(&BTreeMap<String, SeedState>) -> T) -> T {
        f(&self.0.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Every seed's view of quota `name`.
    pub fn views(&self, name: &str) -> Vec<SeedView> {
        self.read(|seeds| {
            seeds
                .iter()
                .map(|(seed, s)| SeedView {
                    name: seed.clone(),
                    client: s.client.clone(),
                    health: s.health,
                    copy: s.copies.get(name).cloned(),
                })
                .collect()
        })
    }

    /// The seed names.
    pub fn names(&self) -> Vec<String> {
        self.read(|seeds| seeds.keys().cloned().collect())
    }

    /// Fresh seeds with their client and their ledgers (by name) that have no name in `masters`
    /// and are not being deleted, or are and still carry our finalizer (its release failed).
    pub fn fresh_orphans(&self, masters: &BTreeSet<String>) -> Vec<(String, Client, Vec<NamedLedger>)> {
        self.read(|seeds| {
            seeds
                .iter()
                .filter(|(_, s)| s.health.is_fresh())
                .filter_map(|(n, s)| {
                    let orphans = s
                        .copies
                        .iter()
                        .filter(|(name, copy)| !masters.contains(*name) && (!copy.deleting || copy.protected))
                        .map(|(name, copy)| (name.clone(), copy.clone()))
                        .collect();
                    Some((n.clone(), s.client.clone()?, orphans))
                })
                .collect()
        })
    }

    /// What was written onto KKP's copies on the seeds.
    pub(crate) fn kkp_copies(&self) -> &KkpCopies {
        &self.2
    }

    /// The health of a seed, if it is part of the fleet.
    pub fn health(&self, seed: &str) -> Option<Health> {
        self.read(|seeds| seeds.get(seed).map(|s| s.health))
    }
}

/// Ways to ask the quota controller for work.
#[derive(Clone)]
pub struct Triggers {
    /// Reconcile one master quota (by name).
    pub one: mpsc::UnboundedSender<String>,
    /// Reconcile every master quota.
    pub all: mpsc::UnboundedSender<()>,
    /// Look for seed copies without a master object.
    pub orphans: Arc<Notify>,
}

impl Triggers {
    pub(crate) fn quota(&self, name: &str) {
        let _ = self.one.send(name.to_owned());
    }

    fn everything(&self) {
        let _ = self.all.send(());
        self.orphans.notify_one();
    }
}

/// Exponential backoff for a seed's watch: 250 ms doubling to `max`, reset after a full sync.
pub struct SeedBackoff {
    next: Duration,
    max: Duration,
}

impl SeedBackoff {
    pub const MIN: Duration = Duration::from_millis(250);

    pub fn new(max: Duration) -> SeedBackoff {
        SeedBackoff { next: Self::MIN, max }
    }

    pub fn reset(&mut self) {
        self.next = Self::MIN;
    }
}

impl Iterator for SeedBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let now = self.next;
        self.next = (self.next * 2).min(self.max);
        Some(now)
    }
}

/// The Secret (namespace, name) holding `seed`'s kubeconfig: the one named by `template`
/// (`{seed}` replaced by the seed's name) in `namespace` when given, else the `Seed`'s own
/// `spec.kubeconfig` (its namespace defaulting to `namespace`).
pub fn kubeconfig_secret(seed: &Seed, namespace: &str, template: Option<&str>) -> (String, String) {
    if let Some(template) = template {
        return (namespace.to_owned(), template.replace("{seed}", &seed.name_any()));
    }
    let r = &seed.spec.kubeconfig;
    let ns = r
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| namespace.to_owned());
    (ns, r.name.clone().unwrap_or_default())
}

struct Running {
    kubeconfig: String,
    _task: AbortOnDropHandle<()>,
}

/// Keeps the seed set in line with the `Seed` objects in `namespace` on the master, for as
/// long as the returned future runs. Dropping it stops every seed watch.
pub async fn manage(
    master: Client,
    namespace: String,
    seeds: Seeds,
    triggers: Triggers,
    metrics: Metrics,
    link: SeedLink,
    kubeconfig_secret_template: Option<String>,
) {
    let seed_api: Api<Seed> = Api::namespaced(master.clone(), &namespace);
    let secret_api: Api<PartialObjectMeta<Secret>> = Api::namespaced(master.clone(), &namespace);
    let (store, writer) = reflector::store();
    let seed_events = reflector(
        writer,
        relisting_watcher(seed_api, watcher::Config::default(), None),
    )
    .default_backoff()
    .map(|_| ());
    // Only the fact that a Secret changed matters; its content is read when resolving.
    let secret_events = relisting_watcher(secret_api, watcher::Config::default(), None)
        .default_backoff()
        .map(|_| ());
    let ticks = stream::unfold(
        tokio::time::interval(Duration::from_secs(10)),
        |mut t| async move {
            t.tick().await;
            Some(((), t))
        },
    );
    let mut events = stream::select(
        stream::select(seed_events.boxed(), secret_events.boxed()),
        ticks.boxed(),
    );
    let mut running: BTreeMap<String, Running> = BTreeMap::new();
    while events.next().await.is_some() {
        // The store fills as `events` is polled; act only on a complete list of Seeds.
        if store.wait_until_ready().now_or_never().is_none() {
            continue;
        }
        let wanted: BTreeMap<String, (String, String)> = store
            .state()
            .iter()
            .map(|s| {
                let secret = kubeconfig_secret(s, &namespace, kubeconfig_secret_template.as_deref());
                (s.name_any(), secret)
            })
            .collect();
        let mut changed = false;
        for (name, (secret_ns, secret_name)) in &wanted {
            let text = kubeconfig_from_secret(&master, secret_ns, secret_name, KUBECONFIG_KEY).await;
            changed |= configure(name, text, &mut running, &seeds, &triggers, &metrics, link).await;
        }
        let gone: Vec<String> = seeds
            .names()
            .into_iter()
            .filter(|n| !wanted.contains_key(n))
            .collect();
        for name in gone {
            info!(seed = %name, "seed removed from the fleet");
            running.remove(&name);
            seeds.write(|s| s.remove(&name));
            seeds.kkp_copies().forget_seed(&name);
            metrics.forget_seed(&name);
            changed = true;
        }
        if !seeds.resolved() {
            seeds.1.store(true, Ordering::SeqCst);
            changed = true;
        }
        if changed {
            triggers.everything();
        }
    }
}

/// Starts, restarts (kubeconfig rotated) or keeps the watch of one seed. Returns whether the
/// seed set changed.
async fn configure(
    name: &str,
    text: Result<String, kkp_quota_runtime::RuntimeError>,
    running: &mut BTreeMap<String, Running>,
    seeds: &Seeds,
    triggers: &Triggers,
    metrics: &Metrics,
    link: SeedLink,
) -> bool {
    let new_state = || SeedState {
        client: None,
        health: Health::Unknown {
            since: Timestamp::now(),
        },
        copies: BTreeMap::new(),
    };
    let text = match text {
        Ok(t) => t,
        Err(e) => {
            if running.contains_key(name) {
                // Keep using the client we have; the Secret may be mid-rotation.
                return false;
            }
            metrics.sync_error(name, "kubeconfig");
            // Counted as unreachable (not "about to sync"), so it shows in the conditions.
            let added = seeds.write(|s| {
                let new = !s.contains_key(name);
                let state = s.entry(name.to_owned()).or_insert_with(new_state);
                state.health = state.health.failed(Timestamp::now());
                new
            });
            if added {
                warn!(seed = %name, error = %Chain(&e), "cannot read the seed's kubeconfig; retrying");
                metrics.seed_stale.with_label_values(&[name]).set(1.0);
            }
            return added;
        }
    };
    if running.get(name).is_some_and(|r| r.kubeconfig == text) {
        return false;
    }
    let client = match client_from_yaml(&text).await {
        Ok(c) => c,
        Err(e) => {
            warn!(seed = %name, error = %Chain(&e), "the seed's kubeconfig is invalid; retrying");
            metrics.sync_error(name, "kubeconfig");
            return false;
        }
    };
    info!(seed = %name, rotated = running.contains_key(name), "watching seed");
    seeds.write(|s| s.entry(name.to_owned()).or_insert_with(new_state).client = Some(client.clone()));
    let ledgers = watch_seed(
        name.to_owned(),
        client.clone(),
        seeds.clone(),
        triggers.clone(),
        metrics.clone(),
        link,
    );
    let kkp_copies = crate::kkp_copy_watch::watch(
        name.to_owned(),
        client,
        seeds.kkp_copies().clone(),
        triggers.clone(),
        link,
    );
    let task = tokio::spawn(
        async move {
            futures::join!(ledgers, kkp_copies);
        }
        .instrument(info_span!("seed", seed = %name)),
    );
    running.insert(
        name.to_owned(),
        Running {
            kubeconfig: text,
            _task: AbortOnDropHandle::new(task),
        },
    );
    true
}

/// Watches one seed's quota copies until aborted.
async fn watch_seed(
    seed: String,
    client: Client,
    seeds: Seeds,
    triggers: Triggers,
    metrics: Metrics,
    link: SeedLink,
) {
    let api: Api<QuotaLedger> = Api::all(client.clone());
    let mut backoff = SeedBackoff::new(link.max_backoff);
    // When this master first saw each demand: kept across watch restarts (issue #32, finding 8).
    let mut lifetimes = Lifetimes::new();
    loop {
        let mut events = relisting_watcher(api.clone(), watcher::Config::default(), None).boxed();
        let mut buffer: BTreeMap<String, Arc<SeedLedger>> = BTreeMap::new();
        let mut probes = tokio::time::interval_at(Instant::now() + link.probe_every, link.probe_every);
        probes.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            let event = tokio::select! {
                event = events.next() => match event {
                    Some(event) => event,
                    None => break,
                },
                _ = probes.tick() => {
                    // A watch on a server that stopped answering (frozen, or a network that
                    // drops packets) neither ends nor fails for minutes: after a quiet period,
                    // ask it something.
                    if answers(&seed, &client, link.probe_every, &seeds, &triggers, &metrics).await {
                        continue;
                    }
                    break;
                }
            };
            // An event is an answer: the next probe is due a whole period after it.
            if event.is_ok() {
                probes.reset();
            }
            let now = Timestamp::now();
            match event {
                Ok(Event::Init) => buffer.clear(),
                Ok(Event::InitApply(rq)) => {
                    let ledger = SeedLedger::observed(&rq, &mut lifetimes, now, |skew| {
                        metrics.observed_skew(&seed, skew);
                    });
                    buffer.insert(rq.name_any(), Arc::new(ledger));
                }
                Ok(Event::InitDone) => {
                    let listed = std::mem::take(&mut buffer);
                    lifetimes.keep_only(&listed.keys().map(String::as_str).collect());
                    let new_names: BTreeSet<String> = listed.keys().cloned().collect();
                    let (old_names, was_fresh) = seeds.write(|s| {
                        let Some(state) = s.get_mut(&seed) else {
                            return (BTreeSet::new(), true);
                        };
                        let old: BTreeSet<String> = state.copies.keys().cloned().collect();
                        let was_fresh = state.health.is_fresh();
                        state.copies = listed;
                        state.health = state.health.synced(now);
                        (old, was_fresh)
                    });
                    backoff.reset();
                    metrics.seed_stale.with_label_values(&[&seed]).set(0.0);
                    set_last_sync(&metrics, &seed, now);
                    if was_fresh {
                        for name in old_names.union(&new_names) {
                            triggers.quota(name);
                        }
                        triggers.orphans.notify_one();
                    } else {
                        info!(copies = new_names.len(), "seed synced");
                        triggers.everything();
                    }
                }
                Ok(Event::Apply(rq)) => {
                    let name = rq.name_any();
                    let ledger = Arc::new(SeedLedger::observed(&rq, &mut lifetimes, now, |skew| {
                        metrics.observed_skew(&seed, skew);
                    }));
                    seeds.write(|s| {
                        if let Some(state) = s.get_mut(&seed) {
                            state.copies.insert(name.clone(), ledger);
                            state.health = state.health.touched(now);
                        }
                    });
                    set_last_sync(&metrics, &seed, now);
                    debug!(quota = %name, "copy changed");
                    triggers.quota(&name);
                    triggers.orphans.notify_one();
                }
                Ok(Event::Delete(rq)) => {
                    let name = rq.name_any();
                    lifetimes.forget(&name);
                    seeds.write(|s| {
                        if let Some(state) = s.get_mut(&seed) {
                            state.copies.remove(&name);
                            state.health = state.health.touched(now);
                        }
                    });
                    triggers.quota(&name);
                }
                Err(e) => {
                    unreachable_seed(&seed, &seeds, &triggers, &metrics, "watch", &e.to_string());
                    break;
                }
            }
        }
        tokio::time::sleep(backoff.next().unwrap_or(link.max_backoff)).await;
    }
}

/// Probes the seed: an answer is news from it too (while it is healthy, the age of its last sync
/// stays within a probe period, idle or busy); no answer makes it unreachable.
async fn answers(
    seed: &str,
    client: &Client,
    within: Duration,
    seeds: &Seeds,
    triggers: &Triggers,
    metrics: &Metrics,
) -> bool {
    match probe(client, within).await {
        Ok(()) => {
            set_last_sync(metrics, seed, Timestamp::now());
            true
        }
        Err(why) => {
            let why = kkp_quota_runtime::chain::Chain(&why).to_string();
            unreachable_seed(seed, seeds, triggers, metrics, "probe", &why);
            false
        }
    }
}

/// Why a seed's API server did not answer the probe.
#[derive(Debug, thiserror::Error)]
enum ProbeError {
    #[error("asking for its version")]
    Failed(#[source] kube::Error),
    #[error("no answer within {0:?}")]
    Silent(Duration),
}

/// Asks the seed's API server for its version, failing when no answer comes within `within`.
async fn probe(client: &Client, within: Duration) -> Result<(), ProbeError> {
    match tokio::time::timeout(within, client.apiserver_version()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(ProbeError::Failed(e)),
        Err(_) => Err(ProbeError::Silent(within)),
    }
}

/// The seed cannot be reached (`how`: by its watch or by the probe): its last known usage and
/// share stay, marked stale, until a fresh list.
fn unreachable_seed(seed: &str, seeds: &Seeds, triggers: &Triggers, metrics: &Metrics, how: &str, why: &str) {
    let now = Timestamp::now();
    let became_stale = seeds.write(|s| {
        s.get_mut(seed).is_some_and(|state| {
            let before = state.health;
            state.health = state.health.failed(now);
            !matches!(before, Health::Stale { .. })
        })
    });
    metrics.sync_error(seed, how);
    metrics.seed_stale.with_label_values(&[seed]).set(1.0);
    if became_stale {
        warn!(error = %why, by = how, "seed unreachable; keeping its last known usage");
        triggers.everything();
    } else {
        debug!(error = %why, by = how, "seed still unreachable");
    }
}

/// How the master keeps in touch with a seed.
#[derive(Clone, Copy, Debug)]
pub struct SeedLink {
    /// Longest wait between two attempts to reach an unreachable seed.
    pub max_backoff: Duration,
    /// After how long without a watch event the seed's API server is asked whether it still
    /// answers, and how long it has to answer before the seed counts as unreachable.
    pub probe_every: Duration,
}

#[allow(clippy::cast_precision_loss)]
fn set_last_sync(metrics: &Metrics, seed: &str, now: Timestamp) {
    metrics
        .seed_last_sync
        .with_label_values(&[seed])
        .set(now.as_millisecond() as f64 / 1000.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        let mut b = SeedBackoff::new(Duration::from_secs(2));
        let first: Vec<Duration> = b.by_ref().take(6).collect();
        assert_eq!(first[0], Duration::from_millis(250));
        assert_eq!(first[1], Duration::from_millis(500));
        assert_eq!(first[5], Duration::from_secs(2));
        b.reset();
        assert_eq!(b.next(), Some(Duration::from_millis(250)));
    }

    #[test]
    fn the_kubeconfig_secret_is_the_seeds_own_unless_a_template_names_one() {
        use k8s_openapi::api::core::v1::ObjectReference;
        use kkp_quota_crds::kkp::SeedSpec;
        let mut seed = Seed::new(
            "europe",
            SeedSpec {
                kubeconfig: ObjectReference {
                    name: Some("kubeconfig-europe".into()),
                    ..ObjectReference::default()
                },
            },
        );
        let own = kubeconfig_secret(&seed, "kubermatic", None);
        assert_eq!(own, ("kubermatic".into(), "kubeconfig-europe".into()));
        seed.spec.kubeconfig.namespace = Some("elsewhere".into());
        assert_eq!(kubeconfig_secret(&seed, "kubermatic", None).0, "elsewhere");
        // A template always reads from the seed namespace, whatever the Seed says.
        let named = kubeconfig_secret(&seed, "kubermatic", Some("kkp-quota-seed-{seed}"));
        assert_eq!(named, ("kubermatic".into(), "kkp-quota-seed-europe".into()));
    }
}
