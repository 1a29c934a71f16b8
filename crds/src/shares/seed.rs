//! The seed's side: the share it holds, what it may admit, what it releases, what it reports.
//!
//! Everything here lives in the seed's copy of the quota and is written with compare-and-swap
//! together with the admissions (reservations, allotments, `localUsage`); `granted` and `target`
//! are the exception: the master writes them, from its own record only.

use super::{Shortfall, fits_within, per_limited};
use crate::quantity::{Quantity, QuantityError};
use crate::resources::ResourceDetails;

/// What the master writes onto a seed's copy, taken from its own record once that record is
/// persisted: never anything the record does not hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MasterWord {
    /// The master record's version these values come from; older words are ignored.
    pub version: u64,
    /// Cumulative grants to this seed.
    pub granted: ResourceDetails,
    /// The share the master wants this seed to hold (absent: no ceiling).
    pub target: ResourceDetails,
    /// What the record says this seed released at least (a floor under its `released`).
    pub released: ResourceDetails,
}

/// A seed's share of one project quota, as its copy holds it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeedShare {
    /// Cumulative grants, as last written by the master; only grows, never above the record.
    pub granted: ResourceDetails,
    /// Cumulative releases; only grows, written by this seed alone, in the same
    /// compare-and-swap as its admissions.
    pub released: ResourceDetails,
    /// The share the master wants this seed to hold; an absent resource sets no ceiling.
    pub target: ResourceDetails,
    /// The master record version `granted` and `target` come from.
    pub version: u64,
}

impl SeedShare {
    /// `granted - released`: the headroom this seed holds (absent counting as zero).
    pub fn share(&self) -> ResourceDetails {
        self.granted.saturating_sub(&self.released)
    }

    /// What the seed may commit in all, per resource `limit` limits: `min(share, target, limit)`.
    /// The limit (the copy's spec) is in the minimum so that a lowered quota stops admissions as
    /// soon as either the spec or the target reaches the seed. Unlimited resources are absent.
    pub fn capacity(&self, limit: &ResourceDetails) -> ResourceDetails {
        let share = self.share();
        per_limited(limit, |resource, limit| {
            let held = share.amount(resource).min(limit);
            self.target.get(resource).map_or(held, |target| held.min(target))
        })
    }

    /// [`SeedShare::capacity`], further bounded by the quota beside what the other seeds use
    /// (`limit - others_usage`, as the master last folded it): a seed never admits while the
    /// project's known usage is at the limit, even within its share. Usage can exceed a share
    /// without any admission (a catalog edit that makes running Machines bigger, a limit added
    /// to a resource already in use, a cluster moved between seeds), and the share alone would
    /// then let this seed admit into room another seed already fills.
    pub fn capacity_beside(
        &self,
        limit: &ResourceDetails,
        others_usage: &ResourceDetails,
    ) -> ResourceDetails {
        let capacity = self.capacity(limit);
        per_limited(limit, |resource, limit| {
            let room = limit.saturating_sub_to_zero(others_usage.amount(resource));
            capacity.amount(resource).min(room)
        })
    }

    /// Whether the master asks for share back: for a resource `limit` limits, the target is
    /// below the share held. Headroom held inside the seed (webhook processes' allotments) then
    /// goes back, so that the seed can release it.
    pub fn asked_back(&self, limit: &ResourceDetails) -> bool {
        let share = self.share();
        limit.iter().any(|(resource, limit)| {
            self.target
                .get(resource)
                .is_some_and(|target| target < share.amount(resource).min(limit))
        })
    }

    /// Whether `request` may be admitted on top of `committed`
    /// (`localUsage + reservations + allotments`), within [`SeedShare::capacity_beside`].
    pub fn fits(
        &self,
        limit: &ResourceDetails,
        others_usage: &ResourceDetails,
        committed: &ResourceDetails,
        request: &ResourceDetails,
    ) -> Result<(), Shortfall> {
        fits_within(&self.capacity_beside(limit, others_usage), committed, request)
    }

    /// The absolute share to ask the master for so that `request` fits: `committed + request`
    /// for every limited resource. Absolute, so a demand read twice or out of order asks for the
    /// same thing.
    pub fn demand_for(
        limit: &ResourceDetails,
        committed: &ResourceDetails,
        request: &ResourceDetails,
    ) -> ResourceDetails {
        per_limited(limit, |resource, _| {
            let want = committed.amount(resource).checked_add(request.amount(resource));
            // An overflowing want is a want for more than any limit.
            want.unwrap_or(Quantity::from_nanos(i128::MAX))
        })
    }

    /// What to release now, per limited resource: the share above `max(target, committed)`, and
    /// when `quiet` (no demand, no admission for a while) also the share above
    /// `committed + slack`. Never anything committed: the share after the release is at least
    /// `committed`.
    pub fn release_due(
        &self,
        limit: &ResourceDetails,
        committed: &ResourceDetails,
        slack: &ResourceDetails,
        quiet: bool,
    ) -> ResourceDetails {
        let share = self.share();
        per_limited(limit, |resource, _| {
            let share = share.amount(resource);
            let committed = committed.amount(resource);
            let mut keep = self.target.get(resource).map_or(share, |t| t.max(committed));
            if quiet {
                let idle_keep = committed.checked_add(slack.amount(resource)).unwrap_or(share);
                keep = keep.min(idle_keep.max(committed));
            }
            share.saturating_sub_to_zero(keep)
        })
    }

    /// Adds `amount` to `released`. Must be written in the same compare-and-swap as the
    /// admissions whose `committed` [`SeedShare::release_due`] was computed from.
    pub fn release(&mut self, amount: &ResourceDetails) -> Result<(), QuantityError> {
        self.released = self.released.checked_add(amount)?;
        Ok(())
    }

    /// Takes the master's word if it is newer than what this copy holds, as the ledger does (the
    /// master's apply replaces `spec.shares`; its rule refuses older versions only). `granted`
    /// is the word's: it only grows while the record does, and a record rebuilt from a stale
    /// reading may say less, which only shrinks this seed's share. `released` never stays below
    /// the word's floor.
    pub fn receive(&mut self, word: &MasterWord) -> bool {
        if word.version <= self.version {
            return false;
        }
        self.granted = word.granted.clone();
        self.released = larger(&self.released, &word.released);
        self.target = word.target.clone();
        self.version = word.version;
        true
    }

    /// What this seed reports to the master, from one version of its copy.
    pub fn report(
        &self,
        version: u64,
        committed: &ResourceDetails,
        demand: Option<&ResourceDetails>,
    ) -> SeedReport {
        SeedReport {
            version,
            released: self.released.clone(),
            committed: committed.clone(),
            demand: demand.cloned(),
            holds: Some(MasterWord {
                version: self.version,
                granted: self.granted.clone(),
                target: self.target.clone(),
                released: ResourceDetails::default(),
            }),
        }
    }
}

/// Per resource the larger of `a` and `b` (absent in both stays absent): [`super::largest`] of
/// the two.
pub(crate) fn larger(a: &ResourceDetails, b: &ResourceDetails) -> ResourceDetails {
    super::largest([a, b]).unwrap_or_default()
}

/// What the master reads from a seed's copy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeedReport {
    /// A counter the seed bumps on every write of its copy; the master keeps the newest report.
    pub version: u64,
    /// Cumulative releases (only grows, so an old report under-counts: safe).
    pub released: ResourceDetails,
    /// `localUsage + reservations + allotments` (only used to pick whom to ask for release).
    pub committed: ResourceDetails,
    /// The absolute share wanted, while a request waits for one ([`SeedShare::demand_for`]).
    pub demand: Option<ResourceDetails>,
    /// The master's word the seed's copy holds (`spec.shares`; its floor is in `released`):
    /// what a lost or restored master record is rebuilt from ([`super::MasterView::adopt`]).
    pub holds: Option<MasterWord>,
}

impl SeedReport {
    /// Nothing `limit` limits is committed on the seed: what it uses besides (a cluster while
    /// `clusters` is unlimited) never keeps it in the master's record.
    pub fn uses_nothing_of(&self, limit: &ResourceDetails) -> bool {
        super::bounded_by(limit, &self.committed).is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shares::tests::{cpu, seed_share as share};

    #[test]
    fn capacity_is_the_smallest_of_share_target_and_limit() {
        assert_eq!(share(10, 2, None).capacity(&cpu(16)), cpu(8));
        assert_eq!(share(10, 2, Some(5)).capacity(&cpu(16)), cpu(5));
        assert_eq!(share(10, 2, Some(9)).capacity(&cpu(6)), cpu(6));
        // A new seed holds nothing of a limited resource.
        assert_eq!(SeedShare::default().capacity(&cpu(16)), cpu(0));
        let none = ResourceDetails::default();
        assert!(
            share(10, 2, Some(5))
                .fits(&cpu(16), &none, &cpu(3), &cpu(2))
                .is_ok()
        );
        assert!(
            share(10, 2, Some(5))
                .fits(&cpu(16), &none, &cpu(4), &cpu(2))
                .is_err()
        );
    }

    #[test]
    fn capacity_beside_leaves_room_for_what_other_seeds_use() {
        // Limit 10, a share of 8, but another seed uses 6 (beyond its own share): 4 at most.
        assert_eq!(share(8, 0, None).capacity_beside(&cpu(10), &cpu(6)), cpu(4));
        assert!(
            share(8, 0, None)
                .fits(&cpu(10), &cpu(6), &cpu(3), &cpu(1))
                .is_ok()
        );
        assert!(
            share(8, 0, None)
                .fits(&cpu(10), &cpu(6), &cpu(3), &cpu(2))
                .is_err()
        );
        // Others at or above the limit: nothing, however large the share.
        assert_eq!(share(8, 0, None).capacity_beside(&cpu(10), &cpu(12)), cpu(0));
        // Others well inside the limit: the share decides.
        assert_eq!(share(3, 0, None).capacity_beside(&cpu(10), &cpu(2)), cpu(3));
    }

    #[test]
    fn release_never_touches_what_is_committed() {
        // Target 3 but 6 committed: keep 6.
        assert_eq!(
            share(10, 0, Some(3)).release_due(&cpu(16), &cpu(6), &cpu(1), false),
            cpu(4)
        );
        assert_eq!(
            share(10, 0, Some(3)).release_due(&cpu(16), &cpu(2), &cpu(1), false),
            cpu(7)
        );
        // No target, not quiet: keep everything; quiet: keep committed + slack.
        assert_eq!(
            share(10, 0, None).release_due(&cpu(16), &cpu(2), &cpu(1), false),
            cpu(0)
        );
        assert_eq!(
            share(10, 0, None).release_due(&cpu(16), &cpu(2), &cpu(1), true),
            cpu(7)
        );
        // Committed above the share (never happens, but): release nothing.
        assert_eq!(
            share(4, 0, Some(0)).release_due(&cpu(16), &cpu(6), &cpu(0), true),
            cpu(0)
        );
    }

    #[test]
    fn words_apply_in_version_order_and_replace_what_the_copy_holds() {
        let mut s = share(4, 0, None);
        let word = |version, granted, target| MasterWord {
            version,
            granted: cpu(granted),
            target: cpu(target),
            released: ResourceDetails::default(),
        };
        assert!(s.receive(&word(3, 6, 6)));
        assert!(!s.receive(&word(2, 9, 9)));
        assert_eq!((s.granted.clone(), s.target.clone()), (cpu(6), cpu(6)));
        // A rebuilt record may say less than the copy held: the word is what counts.
        assert!(s.receive(&word(4, 5, 2)));
        assert_eq!((s.granted.clone(), s.target.clone()), (cpu(5), cpu(2)));
    }

    #[test]
    fn the_words_released_floor_takes_back_share_a_lost_status_would_give() {
        // The ledger was re-created: its own released is gone, granted 10 would be all share.
        let mut s = share(10, 0, None);
        let floor = MasterWord {
            version: 5,
            granted: cpu(10),
            target: cpu(3),
            released: cpu(7),
        };
        assert!(s.receive(&floor));
        assert_eq!(s.share(), cpu(3));
        // A floor never lowers what the seed released itself.
        let mut s = share(10, 8, None);
        assert!(s.receive(&floor));
        assert_eq!(s.share(), cpu(2));
    }

    #[test]
    fn demand_is_absolute() {
        assert_eq!(SeedShare::demand_for(&cpu(16), &cpu(3), &cpu(4)), cpu(7));
    }
}
