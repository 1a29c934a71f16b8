//! What master-controller last wrote onto KKP's `ResourceQuota` copies on the seeds, and the
//! watch that tells when a copy stopped being what was written (deleted or edited by hand, a
//! seed rebuilt or restored): the memory of that copy is dropped and its quota reconciled, so
//! the copy is written again.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kkp_quota_crds::ResourceQuota;
use kkp_quota_runtime::watch::relisting_watcher;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use tracing::{debug, info, warn};

use crate::fingerprint::Fingerprint;
use crate::seeds::{SeedBackoff, SeedLink, Triggers};

/// What this process last wrote onto KKP's `ResourceQuota` copy on each seed, per (seed, quota),
/// as fingerprints: of the apply body, and of the copy's `globalUsage` as KKP reads it (what this
/// process wrote, or what the copy's status held in the answer to its apply). With
/// 10,000 quotas over 3 seeds the apply bodies themselves took 66 MB of the heap, so the copies
/// are watched by their metadata only ([`watch`]); each is written once per process and
/// whenever it would change, or stopped being what was written.
#[derive(Default, Clone)]
pub(crate) struct KkpCopies(Arc<Mutex<Memory>>);

#[derive(Default)]
struct Memory {
    copies: HashMap<(String, String), KkpCopy>,
    /// Applies recorded so far: orders each record against the start of a list.
    applies: u64,
}

#[derive(Default, Clone)]
pub(crate) struct KkpCopy {
    pub applied: Option<Fingerprint>,
    pub status: Option<Fingerprint>,
    /// The copy's `metadata.generation` in the answer to this process's last apply: a copy
    /// seen at another has had its spec changed by someone else (or restored from a backup).
    generation: Option<i64>,
    /// An apply of it is under way: its answer may be one generation on.
    applying: bool,
    /// `Memory::applies` when its last apply was recorded.
    recorded: u64,
    /// When this process last took the copy back from someone else's edit (see [`Retake`]).
    taken_back: Option<Instant>,
}

/// How soon a copy someone else keeps editing is taken back again: a second edit within this
/// of the last retake waits for the quota's next reconcile (the periodic resync at the latest),
/// so that two writers of one copy (another controller syncing KKP's quotas to the seeds with
/// another spec) do not fight at the speed of their watches.
pub(crate) const RETAKE_PAUSE: Duration = Duration::from_mins(1);

/// What a copy seen at an unexpected generation calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retake {
    /// Reconcile its quota now: the copy is applied again.
    Now,
    /// Taken back less than [`RETAKE_PAUSE`] ago already: applied again at its quota's next
    /// reconcile, whatever calls it.
    Later,
}

/// Where a list began, against the applies recorded: a copy applied after it may be missing
/// from the list, or listed as it was before the apply, and is not judged by it.
#[derive(Clone, Copy)]
pub(crate) struct ListStart(u64);

impl KkpCopies {
    fn lock(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn get(&self, seed: &str, name: &str) -> KkpCopy {
        self.lock()
            .copies
            .get(&(seed.to_owned(), name.to_owned()))
            .cloned()
            .unwrap_or_default()
    }

    fn with(&self, seed: &str, name: &str, f: impl FnOnce(&mut KkpCopy, u64)) {
        let mut memory = self.lock();
        memory.applies += 1;
        let at = memory.applies;
        f(
            memory
                .copies
                .entry((seed.to_owned(), name.to_owned()))
                .or_default(),
            at,
        );
    }

    /// An apply of the copy is about to be sent.
    pub fn applying(&self, seed: &str, name: &str) {
        self.with(seed, name, |c, _| c.applying = true);
    }

    /// The apply failed: what the copy holds is not known.
    pub fn apply_failed(&self, seed: &str, name: &str) {
        self.with(seed, name, |c, _| {
            c.applying = false;
            c.applied = None;
        });
    }

    /// The apply of body `applied` was answered with the copy at `generation`, its status
    /// reading `status`.
    pub fn applied(
        &self,
        seed: &str,
        name: &str,
        applied: Fingerprint,
        generation: Option<i64>,
        status: Fingerprint,
    ) {
        self.with(seed, name, |c, at| {
            *c = KkpCopy {
                applied: Some(applied),
                status: Some(status),
                generation,
                applying: false,
                recorded: at,
                taken_back: c.taken_back,
            };
        });
    }

    /// The copy's status now reads `status`.
    pub fn status_written(&self, seed: &str, name: &str, status: Fingerprint) {
        if let Some(c) = self.lock().copies.get_mut(&(seed.to_owned(), name.to_owned())) {
            c.status = Some(status);
        }
    }

    /// Forgets quota `name` on every seed (the quota is gone).
    pub fn forget(&self, name: &str) {
        self.lock().copies.retain(|(_, n), _| n != name);
    }

    /// Forgets every copy on `seed` (the seed left the fleet).
    pub fn forget_seed(&self, seed: &str) {
        self.lock().copies.retain(|(s, _), _| s != seed);
    }

    /// A copy on `seed` was deleted: forgets it. Returns whether this process had written it.
    pub fn deleted(&self, seed: &str, name: &str) -> bool {
        self.lock()
            .copies
            .remove(&(seed.to_owned(), name.to_owned()))
            .is_some_and(|c| c.applied.is_some())
    }

    /// A list of `seed`'s copies is about to begin.
    pub fn list_starts(&self) -> ListStart {
        ListStart(self.lock().applies)
    }

    /// The list begun at `start` is complete: forgets the copies on `seed` applied before it and
    /// not listed (deleted while the watch was away). Returns their names.
    pub fn listed(&self, seed: &str, start: ListStart, names: &BTreeSet<String>) -> Vec<String> {
        let mut gone = Vec::new();
        self.lock().copies.retain(|(s, n), c| {
            let judged = s == seed && c.applied.is_some() && !c.applying && c.recorded <= start.0;
            let keep = !judged || names.contains(n);
            if !keep {
                gone.push(n.clone());
            }
            keep
        });
        gone
    }

    /// A copy on `seed` was seen at `generation`, by a list begun at `listed` or (`None`) by the
    /// watch after it. When that is not the generation this process's own writes leave, its spec
    /// is no longer known to be what was written, and the next reconcile applies it again.
    /// Returns when to reconcile it ([`Retake`]; `None`: nothing to do). A watch event is never
    /// older than the apply before it, but may come before that apply's answer (one generation
    /// on); a list may be older than the last apply (it is not judged by it) and shows a
    /// restored backup's older generation.
    pub fn seen(
        &self,
        seed: &str,
        name: &str,
        generation: Option<i64>,
        listed: Option<ListStart>,
        at: Instant,
    ) -> Option<Retake> {
        let mut memory = self.lock();
        let c = memory.copies.get_mut(&(seed.to_owned(), name.to_owned()))?;
        let (Some(ours), Some(observed), Some(_)) = (c.generation, generation, c.applied) else {
            return None;
        };
        let moved = match listed {
            Some(start) => !c.applying && c.recorded <= start.0 && observed != ours,
            None => observed > ours + i64::from(c.applying),
        };
        if !moved {
            return None;
        }
        c.applied = None;
        // Two writers fight through the watch; a list (a restart, a restore, a kubeconfig
        // pointed at another cluster) is answered at once.
        let recently = c
            .taken_back
            .is_some_and(|last| at.duration_since(last) < RETAKE_PAUSE);
        if listed.is_none() && recently {
            return Some(Retake::Later);
        }
        c.taken_back = Some(at);
        Some(Retake::Now)
    }
}

/// Watches KKP's copies on one seed, by their metadata (no cache), until aborted: a copy that is
/// deleted, missing from a fresh list, or seen with a spec this process did not write has its
/// quota reconciled. Without it a copy deleted by hand stayed away until its quota changed.
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
            match event {
                Ok(Event::Init) => {
                    // Emitted before the list is asked for.
                    listing.clear();
                    start = copies.list_starts();
                }
                Ok(Event::InitApply(copy)) => {
                    let name = copy.name_any();
                    let retake = copies.seen(
                        &seed,
                        &name,
                        copy.metadata.generation,
                        Some(start),
                        Instant::now(),
                    );
                    retake_copy(&name, retake, "differs from what was written", &triggers);
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
                    let retake = copies.seen(&seed, &name, copy.metadata.generation, None, Instant::now());
                    retake_copy(&name, retake, "was changed by someone else", &triggers);
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
fn retake_copy(name: &str, retake: Option<Retake>, why: &str, triggers: &Triggers) {
    match retake {
        None => {}
        Some(Retake::Now) => {
            info!(quota = %name, "KKP's copy {why}; writing it again");
            triggers.quota(name);
        }
        Some(Retake::Later) => warn!(
            quota = %name,
            "KKP's copy {why} again, within {RETAKE_PAUSE:?} of the last time: another writer keeps changing it (KKP's own quota synchronizer?); writing it again at the quota's next reconcile only"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t0() -> Instant {
        static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *T0.get_or_init(Instant::now)
    }

    fn written(copies: &KkpCopies, seed: &str, name: &str, generation: i64) {
        let f = Fingerprint::of(&serde_json::json!(name));
        copies.applied(seed, name, f, Some(generation), f);
    }

    #[test]
    fn a_copy_seen_by_the_watch_past_its_own_generation_is_written_again_once() {
        let copies = KkpCopies::default();
        written(&copies, "a", "q", 3);
        assert!(
            copies.seen("a", "q", Some(3), None, t0()).is_none(),
            "its own generation"
        );
        assert!(
            copies.seen("a", "q", Some(2), None, t0()).is_none(),
            "an event from before the apply"
        );
        assert!(
            copies.seen("b", "q", Some(9), None, t0()).is_none(),
            "never written on that seed"
        );
        assert!(
            copies.seen("a", "q", Some(4), None, t0()).is_some(),
            "edited by hand"
        );
        assert!(copies.get("a", "q").applied.is_none());
        assert!(
            copies.seen("a", "q", Some(5), None, t0()).is_none(),
            "already due"
        );
    }

    #[test]
    fn an_own_apply_seen_before_its_answer_is_not_taken_for_an_edit() {
        let copies = KkpCopies::default();
        written(&copies, "a", "q", 3);
        copies.applying("a", "q");
        assert!(
            copies.seen("a", "q", Some(4), None, t0()).is_none(),
            "this apply's own event"
        );
        assert!(
            copies.seen("a", "q", Some(5), None, t0()).is_some(),
            "and an edit after it"
        );
        written(&copies, "a", "q", 4);
        copies.applying("a", "q");
        copies.apply_failed("a", "q");
        assert!(
            copies.get("a", "q").applied.is_none(),
            "a failed apply leaves it due"
        );
    }

    #[test]
    fn a_list_judges_only_what_was_applied_before_it_began() {
        let copies = KkpCopies::default();
        written(&copies, "a", "q", 6);
        let start = copies.list_starts();
        written(&copies, "a", "late", 1);
        assert!(copies.seen("a", "q", Some(6), Some(start), t0()).is_none());
        assert!(
            copies.seen("a", "late", Some(7), Some(start), t0()).is_none(),
            "applied after the list began"
        );
        assert!(
            copies.seen("a", "q", Some(2), Some(start), t0()).is_some(),
            "restored from an older backup"
        );
        let listed = BTreeSet::new();
        assert_eq!(
            copies.listed("a", start, &listed),
            Vec::<String>::new(),
            "q is due already, late is newer"
        );
    }

    #[test]
    fn a_copy_another_writer_keeps_changing_is_taken_back_once_a_minute() {
        let copies = KkpCopies::default();
        let seen = |generation, at| copies.seen("a", "q", Some(generation), None, at);
        written(&copies, "a", "q", 1);
        assert_eq!(seen(2, t0()), Some(Retake::Now));
        written(&copies, "a", "q", 3);
        assert_eq!(
            seen(4, t0() + Duration::from_secs(5)),
            Some(Retake::Later),
            "again at once"
        );
        assert!(
            copies.get("a", "q").applied.is_none(),
            "still applied at the next reconcile"
        );
        written(&copies, "a", "q", 5);
        assert_eq!(seen(6, t0() + RETAKE_PAUSE), Some(Retake::Now), "a minute on");
        // A list (the watch restarted, a restore) is answered at once.
        written(&copies, "a", "q", 7);
        let start = copies.list_starts();
        let listed = copies.seen("a", "q", Some(3), Some(start), t0() + RETAKE_PAUSE);
        assert_eq!(listed, Some(Retake::Now));
    }

    #[test]
    fn a_copy_deleted_or_not_listed_is_forgotten() {
        let copies = KkpCopies::default();
        for name in ["q1", "q2", "q3"] {
            written(&copies, "a", name, 1);
            written(&copies, "b", name, 1);
        }
        assert!(copies.deleted("a", "q1"));
        assert!(!copies.deleted("a", "q1"), "already forgotten");
        assert!(copies.get("a", "q1").applied.is_none());
        let start = copies.list_starts();
        let listed: BTreeSet<String> = ["q3".to_owned(), "unknown".to_owned()].into();
        assert_eq!(copies.listed("a", start, &listed), vec!["q2".to_owned()]);
        assert!(copies.get("a", "q3").applied.is_some());
        assert!(
            copies.get("b", "q2").applied.is_some(),
            "another seed's copies stay"
        );
        copies.forget_seed("b");
        assert!(copies.get("b", "q3").applied.is_none());
    }
}
