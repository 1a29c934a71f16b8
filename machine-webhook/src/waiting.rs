//! Owners waiting for room, pure: the `MachineSet`s (or `MachineDeployment`s) whose new Machines
//! this process refused for want of room, and which of them to wake when room appears.
//!
//! A refused `MachineSet` retries with doubling gaps (minutes, after a while), so room that
//! appears elsewhere (a raised limit, a Machine deleted in another cluster of the project, share
//! arriving from another seed) would otherwise wait for its next retry or its controller's
//! resync. [`Waiting::to_wake`] picks, oldest refusal first, the owners whose refused Machine now
//! fits beside the ones picked before it: as many as can now fit, and none while nothing fits.
//! An owner is woken once per refusal, and never twice within [`WakeConfig::min_gap`], so a wake
//! that finds no room after all (another process's allotment, a race) cannot loop.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use kkp_quota_crds::ResourceDetails;

/// The object a refused Machine belongs to, in its user cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Owner {
    pub cluster: String,
    pub namespace: String,
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
}

/// Why a Machine was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The project's quota had no room for it.
    NoRoom,
    /// The quota had room, but not this seed's share (`share_in_transit`).
    ShareElsewhere,
    /// The project's ledger could not be used.
    LedgerMissing,
}

/// What admission would say now to a waiting size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoomNow {
    /// Admitted.
    Fits,
    /// It fits the quota, not this seed's share yet: a retry asks the master for share and
    /// waits for it.
    ShareElsewhere,
    /// Refused.
    NoRoom,
}

impl RoomNow {
    /// Whether an owner refused for `refusal` is woken: when its Machine fits, or when the
    /// quota has room again for a Machine refused for want of it (the retry moves the share);
    /// not while the share it waits for has still not arrived.
    fn wakes(self, refusal: Refusal) -> bool {
        match self {
            RoomNow::Fits => true,
            RoomNow::ShareElsewhere => refusal != Refusal::ShareElsewhere,
            RoomNow::NoRoom => false,
        }
    }
}

/// Bounds on remembering and waking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WakeConfig {
    /// How long after its last refusal an owner is still woken.
    pub remember: Duration,
    /// The least time between two wakes of one owner.
    pub min_gap: Duration,
    /// The most owners woken in one pass over one project.
    pub max_per_pass: usize,
    /// The most owners remembered; the longest-refused are forgotten first.
    pub max_owners: usize,
}

impl Default for WakeConfig {
    fn default() -> WakeConfig {
        WakeConfig {
            remember: Duration::from_hours(1),
            min_gap: Duration::from_secs(10),
            max_per_pass: 20,
            max_owners: 10_000,
        }
    }
}

#[derive(Debug, Clone)]
struct Waiter {
    project: String,
    /// The last refused Machine's size.
    size: ResourceDetails,
    refusal: Refusal,
    refused_at: Timestamp,
    woken_at: Option<Timestamp>,
}

impl Waiter {
    /// Refused again since it was last woken (or never woken).
    fn waits(&self) -> bool {
        self.woken_at.is_none_or(|woken| woken < self.refused_at)
    }
}

/// The owners this process refused, by owner.
#[derive(Debug, Default)]
pub struct Waiting {
    config: WakeConfig,
    waiters: HashMap<Owner, Waiter>,
}

fn signed(duration: Duration) -> SignedDuration {
    SignedDuration::try_from(duration).unwrap_or(SignedDuration::MAX)
}

impl Waiting {
    pub fn new(config: WakeConfig) -> Waiting {
        Waiting {
            config,
            waiters: HashMap::new(),
        }
    }

    /// A new Machine of `owner`, of `size`, was refused for room in `project`.
    pub fn refused(
        &mut self,
        owner: Owner,
        project: &str,
        size: ResourceDetails,
        refusal: Refusal,
        now: Timestamp,
    ) {
        let woken_at = self.waiters.get(&owner).and_then(|w| w.woken_at);
        self.waiters.insert(
            owner,
            Waiter {
                project: project.to_owned(),
                size,
                refusal,
                refused_at: now,
                woken_at,
            },
        );
        if self.waiters.len() > self.config.max_owners
            && let Some(oldest) = self
                .waiters
                .iter()
                .min_by_key(|(owner, w)| (w.refused_at, (*owner).clone()))
                .map(|(owner, _)| owner.clone())
        {
            self.waiters.remove(&oldest);
        }
    }

    /// The projects with an owner waiting to be woken.
    pub fn projects(&self) -> BTreeSet<String> {
        self.waiters
            .values()
            .filter(|w| w.waits())
            .map(|w| w.project.clone())
            .collect()
    }

    /// Owners remembered (woken or not).
    pub fn len(&self) -> usize {
        self.waiters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }

    /// The owners of `project` to wake now, marked woken. `room` gets the waiting sizes in
    /// order (oldest refusal first) and answers, for each, what admission would say beside the
    /// ones before it that fit (`decide_batch` does exactly that); its answer may be shorter.
    pub fn to_wake(
        &mut self,
        project: &str,
        now: Timestamp,
        room: impl FnOnce(&[ResourceDetails]) -> Vec<RoomNow>,
    ) -> Vec<Owner> {
        let remember = signed(self.config.remember);
        self.waiters
            .retain(|_, w| now.duration_since(w.refused_at) < remember);
        let min_gap = signed(self.config.min_gap);
        let mut candidates: Vec<(&Owner, &Waiter)> = self
            .waiters
            .iter()
            .filter(|(_, w)| {
                w.project == project
                    && w.waits()
                    && w.woken_at
                        .is_none_or(|woken| now.duration_since(woken) >= min_gap)
            })
            .collect();
        candidates.sort_by(|(a, x), (b, y)| (x.refused_at, a).cmp(&(y.refused_at, b)));
        candidates.truncate(self.config.max_per_pass);
        let sizes: Vec<ResourceDetails> = candidates.iter().map(|(_, w)| w.size.clone()).collect();
        let owners: Vec<(Owner, Refusal)> = candidates
            .into_iter()
            .map(|(o, w)| (o.clone(), w.refusal))
            .collect();
        let answers = if owners.is_empty() {
            Vec::new()
        } else {
            room(&sizes)
        };
        let woken: Vec<Owner> = owners
            .into_iter()
            .zip(answers)
            .filter_map(|((owner, refusal), now)| now.wakes(refusal).then_some(owner))
            .collect();
        for owner in &woken {
            if let Some(waiter) = self.waiters.get_mut(owner) {
                waiter.woken_at = Some(now);
            }
        }
        woken
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
