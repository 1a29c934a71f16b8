//! What master-controller last wrote onto KKP's `ResourceQuota` copies on the seeds, and when a
//! copy stopped being that (deleted or edited by someone else, a seed rebuilt or restored, a
//! kubeconfig pointed at another cluster): its memory is dropped and its quota reconciled, so
//! the copy is written again. Pure bookkeeping; the watch that feeds it is
//! [`crate::kkp_copy_watch`].

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

use crate::fingerprint::Fingerprint;

/// What this process last wrote onto KKP's `ResourceQuota` copy on each seed, per (seed, quota),
/// as fingerprints: of the apply body, and of the copy's `globalUsage` as KKP reads it (what this
/// process wrote, or what the copy's status held in the answer to its apply). With
/// 10,000 quotas over 3 seeds the apply bodies themselves took 66 MB of the heap, so the copies
/// are watched by their metadata only; each is written once per process and whenever it would
/// change, or stopped being what was written.
#[derive(Default, Clone)]
pub(crate) struct KkpCopies(Arc<Mutex<Memory>>);

#[derive(Default)]
struct Memory {
    copies: HashMap<(String, String), KkpCopy>,
    /// Applies recorded so far: orders each record against the start of a list.
    applies: u64,
}

/// A copy as its metadata shows it: what moves when someone else changes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sighting {
    /// `metadata.generation`: moves with every change of the spec.
    generation: Option<i64>,
    /// The UID and the labels (a copy re-created, or its labels edited, moves no generation;
    /// the webhook's fail-closed check knows a quota by the copy's labels).
    identity: Fingerprint,
}

impl Sighting {
    pub fn of(meta: &ObjectMeta) -> Sighting {
        Sighting {
            generation: meta.generation,
            identity: Fingerprint::of(&json!({"uid": meta.uid, "labels": meta.labels})),
        }
    }
}

#[derive(Default, Clone)]
pub(crate) struct KkpCopy {
    pub applied: Option<Fingerprint>,
    pub status: Option<Fingerprint>,
    /// The copy as the answer to this process's last apply showed it.
    written: Option<Sighting>,
    /// An apply of it is under way: what is seen meanwhile is judged against its answer.
    applying: bool,
    /// While applying: the newest generation seen, and whether the copy was seen deleted.
    newest_seen: Option<i64>,
    seen_deleted: bool,
    /// `Memory::applies` when its last apply was recorded.
    recorded: u64,
    /// When this process began taking the copy back from someone else's edits ([`Retake`]):
    /// the start of the current [`RETAKE_PAUSE`], the retakes in it, and whether one is waiting
    /// for it to end.
    taken_back: Option<Instant>,
    retakes: u8,
    retake_waiting: bool,
}

/// How often a copy someone else keeps editing is taken back: [`RETAKES_PER_PAUSE`] times at
/// once within this, then once when it has passed, so that two writers of one copy (another
/// controller syncing KKP's quotas to the seeds with another spec) write it a few times a
/// minute each instead of fighting at the speed of their watches. A person's few edits in a
/// row are all taken back at once.
pub(crate) const RETAKE_PAUSE: Duration = Duration::from_mins(1);

/// Retakes at once within one [`RETAKE_PAUSE`].
pub(crate) const RETAKES_PER_PAUSE: u8 = 3;

/// What a copy seen changed by someone else calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retake {
    /// Reconcile its quota now: the copy is applied again.
    Now,
    /// Taken back less than [`RETAKE_PAUSE`] ago already: reconcile its quota at this instant
    /// ([`KkpCopies::take_back_due`] then says the copy is due).
    At(Instant),
}

/// Where a list began, against the applies recorded: a copy applied after it may be missing
/// from the list, or listed as it was before the apply, and is not judged by it.
#[derive(Clone, Copy)]
pub(crate) struct ListStart(u64);

/// An apply of a copy under way ([`KkpCopies::applying`]); dropped without
/// [`Applying::landed`] (the apply failed, or was cancelled), the copy counts as unknown.
pub(crate) struct Applying<'a> {
    copies: &'a KkpCopies,
    key: Option<(String, String)>,
}

impl Applying<'_> {
    /// The apply of body `applied` was answered at `at` with the copy as `sighting` shows it,
    /// its status reading `status`. Returns when to apply it again, if it must: the copy was
    /// seen deleted, or past the answer's generation, while the apply was under way (someone
    /// else's edit after it), under the same pause as [`KkpCopies::seen`].
    pub fn landed(
        mut self,
        applied: Fingerprint,
        sighting: Sighting,
        status: Fingerprint,
        at: Instant,
    ) -> Option<Retake> {
        let key = self.key.take()?;
        let mut memory = self.copies.lock();
        memory.applies += 1;
        let recorded = memory.applies;
        let c = memory.copies.entry(key).or_default();
        let again = c.seen_deleted || c.newest_seen > sighting.generation;
        *c = KkpCopy {
            applied: Some(applied),
            status: Some(status),
            written: Some(sighting),
            recorded,
            taken_back: c.taken_back,
            retakes: c.retakes,
            ..KkpCopy::default()
        };
        again.then(|| c.retake(at))?
    }
}

impl Drop for Applying<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let mut memory = self.copies.lock();
            let c = memory.copies.entry(key).or_default();
            c.applying = false;
            c.applied = None;
        }
    }
}

impl KkpCopies {
    fn lock(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn key(seed: &str, name: &str) -> (String, String) {
        (seed.to_owned(), name.to_owned())
    }

    pub fn get(&self, seed: &str, name: &str) -> KkpCopy {
        self.lock()
            .copies
            .get(&Self::key(seed, name))
            .cloned()
            .unwrap_or_default()
    }

    /// An apply of the copy is about to be sent.
    pub fn applying(&self, seed: &str, name: &str) -> Applying<'_> {
        let key = Self::key(seed, name);
        let mut memory = self.lock();
        let c = memory.copies.entry(key.clone()).or_default();
        c.applying = true;
        c.newest_seen = None;
        c.seen_deleted = false;
        Applying {
            copies: self,
            key: Some(key),
        }
    }

    /// The copy's status now reads `status`.
    pub fn status_written(&self, seed: &str, name: &str, status: Fingerprint) {
        if let Some(c) = self.lock().copies.get_mut(&Self::key(seed, name)) {
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

    /// A copy on `seed` was deleted: forgets it. Returns whether its quota is to be reconciled
    /// (this process had written it). While an apply of it is under way the apply's answer
    /// decides ([`Applying::landed`]).
    pub fn deleted(&self, seed: &str, name: &str) -> bool {
        let mut memory = self.lock();
        let key = Self::key(seed, name);
        match memory.copies.get_mut(&key) {
            Some(c) if c.applying => {
                c.seen_deleted = true;
                false
            }
            Some(_) => memory.copies.remove(&key).is_some_and(|c| c.applied.is_some()),
            None => false,
        }
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

    /// A copy on `seed` was seen as `sighting` shows it, by a list begun at `listed` or
    /// (`None`) by the watch after it. When that is not what this process's own writes leave,
    /// the copy is no longer known to be what was written; returns when to apply it again
    /// ([`Retake`]; `None`: nothing to do). A watch event is never older than the apply before
    /// it (its generation is not judged as moved when lower); a list may be older than the last
    /// apply (it is not judged by it) and shows a restored backup's older generation. While an
    /// apply is under way, what is seen is judged by its answer ([`Applying::landed`]).
    pub fn seen(
        &self,
        seed: &str,
        name: &str,
        sighting: Sighting,
        listed: Option<ListStart>,
        at: Instant,
    ) -> Option<Retake> {
        let mut memory = self.lock();
        let c = memory.copies.get_mut(&Self::key(seed, name))?;
        if c.applying {
            c.newest_seen = c.newest_seen.max(sighting.generation);
            return None;
        }
        let (Some(ours), Some(_)) = (c.written, c.applied) else {
            return None;
        };
        let moved = sighting.identity != ours.identity
            || match listed {
                Some(_) => sighting.generation != ours.generation,
                None => sighting.generation > ours.generation,
            };
        if !moved || listed.is_some_and(|start| c.recorded > start.0) {
            return None;
        }
        // Two writers fight through the watch; a list (a restart, a restore, a kubeconfig
        // pointed at another cluster) is answered at once.
        if listed.is_some() {
            c.taken_back = None;
            c.retakes = 0;
        }
        c.retake(at)
    }

    /// Whether a retake that waited out its pause ([`Retake::At`]) is due at `at`: the copy is
    /// then taken to be applied again (its memory dropped).
    pub fn take_back_due(&self, seed: &str, name: &str, at: Instant) -> bool {
        let mut memory = self.lock();
        let Some(c) = memory.copies.get_mut(&Self::key(seed, name)) else {
            return false;
        };
        if !c.retake_waiting || c.taken_back.is_some_and(|last| at < last + RETAKE_PAUSE) {
            return false;
        }
        c.retake_waiting = false;
        c.applied = None;
        c.taken_back = Some(at);
        c.retakes = 1;
        true
    }

    /// When a retake that waits out its pause ([`Retake::At`]) falls due, if one waits. A
    /// reconcile of the quota before then asks for it again: the turn that answered the first
    /// [`Retake::At`] with a retry time is replaced by the next turn's answer.
    pub fn retake_waits_until(&self, seed: &str, name: &str) -> Option<Instant> {
        let memory = self.lock();
        let c = memory.copies.get(&Self::key(seed, name))?;
        let pause_began = c.taken_back?;
        c.retake_waiting.then_some(pause_began + RETAKE_PAUSE)
    }
}

impl KkpCopy {
    /// The copy is no longer what was written, at `at`: to be applied again now (its memory
    /// dropped), or, past [`RETAKES_PER_PAUSE`] in the current [`RETAKE_PAUSE`], once it has
    /// passed (`None`: a retake is waiting already).
    fn retake(&mut self, at: Instant) -> Option<Retake> {
        let start = match self.taken_back {
            Some(start) if at < start + RETAKE_PAUSE => start,
            _ => {
                self.retakes = 0;
                *self.taken_back.insert(at)
            }
        };
        if self.retakes < RETAKES_PER_PAUSE {
            self.retakes += 1;
            self.applied = None;
            self.retake_waiting = false;
            return Some(Retake::Now);
        }
        (!std::mem::replace(&mut self.retake_waiting, true)).then_some(Retake::At(start + RETAKE_PAUSE))
    }
}

#[cfg(test)]
mod tests;
