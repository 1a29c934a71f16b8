//! A holder's allotment carried from a deleted ledger into its successor (issue #32): what the
//! holder's writes on the successor do to it.

use super::AllotmentHolder;
use crate::ResourceDetails;

/// What a write does to the holder's entry carried from a deleted ledger
/// ([`AllotmentHolder::carried_after`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CarriedChange {
    /// It grants this much less: what the write records moves to the reservations.
    Shrinks(ResourceDetails),
    /// It goes: the write records all it granted.
    Goes,
}

impl CarriedChange {
    /// What the entry grants after the write (`None`: it goes).
    pub fn left(&self) -> Option<&ResourceDetails> {
        match self {
            CarriedChange::Shrinks(left) => Some(left),
            CarriedChange::Goes => None,
        }
    }
}

impl AllotmentHolder {
    /// What a write on the ledger `copy_uid` that records `recording` leaves of our entry carried
    /// from a deleted ledger (`carried`, under [`crate::ledger::carried_holder`]'s name): until
    /// we have written this ledger, everything we record was admitted from an older ledger's
    /// allotment, which the carried entry covers, so that much moves from it to the reservations
    /// (what is left covers what the deletion may have kept from our memory, until
    /// seed-controller removes it). `None`: the entry stays as it is.
    pub fn carried_after(
        &self,
        copy_uid: Option<&str>,
        carried: Option<&ResourceDetails>,
        recording: &ResourceDetails,
    ) -> Option<CarriedChange> {
        let carried = carried?;
        if self.quota_uid.as_deref() == copy_uid || recording.is_empty() {
            return None;
        }
        let left = carried.saturating_sub(recording);
        Some(if left.is_empty() {
            CarriedChange::Goes
        } else {
            CarriedChange::Shrinks(left)
        })
    }
}
