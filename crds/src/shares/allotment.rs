//! One webhook process's allotment in one seed ledger (escrow one level below [`super::SeedShare`]),
//! pure: a state machine with time passed in. The webhook drives it around its I/O; the model test
//! (`crds/tests/shares_model.rs`) drives the same type with writes that land, conflict, time out
//! or land with their answer lost, and with processes that crash.
//!
//! A process holds one allotment per project in the seed's ledger (`status.allotments`). It
//! admits from it by counting in memory ([`AllotmentHolder::admit`]) and records what it admitted
//! as reservations a moment later, in one write that also moves their size out of `granted`
//! ([`AllotmentHolder::begin_write`], then [`AllotmentHolder::landed`] or
//! [`AllotmentHolder::write_failed`]). Because `granted` is in the API server before anything is
//! admitted from it, a crash loses nothing: the dead holder's allotment keeps covering what it
//! admitted until seed-controller has counted those Machines and the allotment expired.
//!
//! Every write is conditioned on the ledger's `resourceVersion`, so allotments never overlap each
//! other or the reservations: a write keeps `usage + reservations + allotments <= capacity` for
//! what it grants. While a write is in flight, admissions stay within [`cap_while_writing`], which
//! the ledger covers whether the write lands or not.

use std::time::{Duration, Instant};

use super::{bounded_by, fits_within as fits_capacity};
use crate::ledger::Reservation;
use crate::{Quantity, QuantityError, Resource, ResourceDetails};

/// How allotments are held.
#[derive(Debug, Clone)]
pub struct AllotmentConfig {
    /// An allotment not renewed within this time expires (seed-controller removes it); the
    /// holder admits from it only during the first half, and renews it after a quarter.
    pub ttl: Duration,
    /// Admissions from the allotment are recorded as reservations this soon.
    pub record_after: Duration,
    /// An allotment is given back after this long without requests for its project.
    pub release_after: Duration,
}

impl Default for AllotmentConfig {
    fn default() -> Self {
        AllotmentConfig {
            ttl: Duration::from_mins(2),
            record_after: Duration::from_millis(500),
            release_after: Duration::from_secs(10),
        }
    }
}

/// What a holder takes: half of what is left under the limit once everything else is counted,
/// per limited resource (the other half stays for other holders and for the exact, written
/// decision). Unlimited resources need no allotment and are absent.
pub fn grant_for(limit: &ResourceDetails, in_use: &ResourceDetails) -> ResourceDetails {
    let mut grant = ResourceDetails::default();
    for (resource, limit) in limit.iter() {
        let free = limit.saturating_sub_to_zero(in_use.amount(resource));
        grant.set(resource, Some(Quantity::from_nanos(free.as_nanos() / 2)));
    }
    grant
}

/// Whether `growth` still fits in `cap` on top of `admitted`, for every resource the `limit`
/// limits (a resource the cap lacks counts as zero: a limit added after the grant stops fast
/// admissions of that resource until the next write). The seed's own admission test
/// ([`super::fits_within`]), with the allotment as the capacity.
pub fn fits_within(
    limit: &ResourceDetails,
    cap: &ResourceDetails,
    admitted: &ResourceDetails,
    growth: &ResourceDetails,
) -> bool {
    fits_capacity(&bounded_by(limit, cap), admitted, growth).is_ok()
}

/// While a write that records `recording` and replaces the grant `old` by `new` is in flight,
/// the most the holder may have admitted from its allotment in all: covered both if the write
/// fails (`old`) and if it succeeds (`new` plus what it records).
pub fn cap_while_writing(
    old: &ResourceDetails,
    new: &ResourceDetails,
    recording: &ResourceDetails,
) -> ResourceDetails {
    let mut cap = ResourceDetails::default();
    for &resource in Resource::ALL {
        let after = new
            .amount(resource)
            .checked_add(recording.amount(resource))
            .unwrap_or(Quantity::ZERO);
        let amount = old.amount(resource).min(after);
        if old.get(resource).is_some() || new.get(resource).is_some() {
            cap.set(resource, Some(amount));
        }
    }
    cap
}

/// What the holder sees in the newest copy of the ledger, for an admission without a write.
#[derive(Debug, Clone, Copy)]
pub struct LedgerSight<'a> {
    /// The copy's UID (a re-created ledger has a new one, without our allotment).
    pub quota_uid: Option<&'a str>,
    /// seed-controller has counted the seed's Machines into it.
    pub counted: bool,
    /// Headroom we hold is wanted elsewhere (`machine-webhook`'s `allotment_wanted_back`).
    pub wanted_back: bool,
    /// Our entry in `status.allotments`, as the copy has it.
    pub own_granted: Option<&'a ResourceDetails>,
}

/// The answer of [`AllotmentHolder::admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FastAdmission {
    /// Admitted from the allotment; `record`: the first admission since the last write, or the
    /// one that took the allotment past its low-water mark ([`past_low_water`]), so the worker
    /// should be woken to record it (and, past the mark, to refill at once).
    Admitted { record: bool },
    /// Our allotment is wanted elsewhere: it goes back at the next write (wake the worker), and
    /// the request waits for a write.
    WantedBack,
    /// The request waits for a write.
    Wait,
}

/// What a pass of the worker is about, for [`AllotmentHolder::next_grant`].
#[derive(Debug, Clone, Copy, Default)]
#[allow(clippy::struct_excessive_bools)]
pub struct Pass {
    /// It decides requests (an upkeep pass has none).
    pub requests: bool,
    /// Headroom we hold is wanted elsewhere.
    pub wanted_elsewhere: bool,
    /// Requests of ours wait for share.
    pub wants_share: bool,
    /// The process is stopping.
    pub stopping: bool,
}

/// A write planned on one copy of the ledger, for [`AllotmentHolder::begin_write`].
#[derive(Debug, Clone)]
pub struct Planned<'a> {
    /// The copy's UID.
    pub copy_uid: Option<&'a str>,
    /// Our entry in the copy's `status.allotments` (zero: none).
    pub own_granted: &'a ResourceDetails,
    /// Our allotment after the write (`None`: none).
    pub grant: Option<ResourceDetails>,
    /// The write sets our entry in `status.allotments`.
    pub writes_allotment: bool,
    /// The write changes anything at all.
    pub writes: bool,
    /// The pass decides requests.
    pub requests: bool,
}

/// A write begun by [`AllotmentHolder::begin_write`]: what it records and grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteStart {
    /// How many of the holder's admissions (oldest first) this write records, and their total.
    pub recorded: usize,
    pub recorded_total: ResourceDetails,
    /// Our allotment after the write (`None`: none).
    pub grant: Option<ResourceDetails>,
    /// The write sets our entry in `status.allotments` (renews, changes or removes it).
    pub writes_allotment: bool,
    /// The in-flight cap before this write set its own (back in force when the write certainly
    /// did not land).
    prior_cap: Option<ResourceDetails>,
}

/// What [`AllotmentHolder::landed`] changed, for the logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holding {
    Taken,
    Kept,
    GivenBack,
    None,
}

/// One process's standing in one project's ledger: its allotment, what it admitted from it and
/// has not recorded yet, its writes' bounds and its backoff.
#[derive(Debug, Clone, Default)]
#[allow(clippy::struct_excessive_bools)] // independent facts about the holder, not states of one
pub struct AllotmentHolder {
    /// The ledger (by UID) our allotment is in.
    quota_uid: Option<String>,
    /// Our allotment is in the ledger, granting `granted`.
    holding: bool,
    granted: ResourceDetails,
    /// Admissions without a write stop at this instant unless a write renews the allotment.
    usable_until: Option<Instant>,
    /// The last write that renewed it began here.
    renewed: Option<Instant>,
    /// Admitted from the allotment, not yet recorded as reservations (oldest first).
    admitted: Vec<(Instant, Reservation)>,
    admitted_total: ResourceDetails,
    /// While a write is in flight, or after one whose outcome is unknown: the most
    /// `admitted_total` may reach.
    cap_in_flight: Option<ResourceDetails>,
    last_request: Option<Instant>,
    /// A write that set our allotment ended without telling whether it landed: one may be in the
    /// ledger although `holding` is false, so upkeep writes again soon.
    maybe_holding: bool,
    /// Failed writes in a row, and no upkeep before this (backoff).
    failures: u32,
    not_before: Option<Instant>,
    /// Another process waits for headroom: give our allotment back at the next write.
    give_back: bool,
    /// Half the allotment is spent: the next write (due at once) records it and takes a new one
    /// while the rest still serves, so that requests do not wait for a refill.
    top_up: bool,
}

/// Whether what was admitted from `granted` has reached half of it, for any resource it grants
/// (the low-water mark at which the holder refills ahead of need).
pub fn past_low_water(granted: &ResourceDetails, admitted: &ResourceDetails) -> bool {
    granted.iter().any(|(resource, granted)| {
        granted > Quantity::ZERO
            && admitted
                .amount(resource)
                .checked_add(admitted.amount(resource))
                .map_or(true, |twice| twice >= granted)
    })
}

impl AllotmentHolder {
    pub fn holding(&self) -> bool {
        self.holding
    }

    /// The ledger (by UID) our allotment is in.
    pub fn quota_uid(&self) -> Option<&str> {
        self.quota_uid.as_deref()
    }

    pub fn granted(&self) -> &ResourceDetails {
        &self.granted
    }

    /// Admitted from the allotment and not recorded yet (oldest first).
    pub fn admitted(&self) -> impl Iterator<Item = &Reservation> {
        self.admitted.iter().map(|(_, r)| r)
    }

    pub fn admitted_total(&self) -> &ResourceDetails {
        &self.admitted_total
    }

    /// Something of ours may be in the ledger, or is still to be recorded there.
    pub fn holds_anything(&self) -> bool {
        self.holding || self.maybe_holding || !self.admitted.is_empty()
    }

    pub fn idle_since(&self, since: Duration, now: Instant) -> bool {
        self.last_request
            .is_none_or(|t| now.saturating_duration_since(t) >= since)
    }

    /// Nothing held, nothing to record, no request for `idle`: the holder may be dropped.
    pub fn quiet(&self, idle: Duration, now: Instant) -> bool {
        !self.holding && self.admitted.is_empty() && self.idle_since(idle, now)
    }

    /// A request for the project arrived.
    pub fn request_seen(&mut self, now: Instant) {
        self.last_request = Some(now);
    }

    /// Admits a request growing usage by `growth` from the allotment, when the allotment is
    /// current in the newest copy (`sight`), the request fits the quota as everything else in
    /// the ledger leaves it (`decide`, given what we admitted so far: `None` if it does not fit,
    /// `Some(None)` for a dry run, `Some(Some(reservation))` to admit), and it fits what is left
    /// of the allotment.
    pub fn admit<F>(
        &mut self,
        now: Instant,
        sight: Option<&LedgerSight<'_>>,
        limit: &ResourceDetails,
        growth: &ResourceDetails,
        decide: F,
    ) -> FastAdmission
    where
        F: FnOnce(&ResourceDetails) -> Option<Option<Reservation>>,
    {
        self.request_seen(now);
        if !self.holding || self.usable_until.is_none_or(|t| now >= t) {
            return FastAdmission::Wait;
        }
        let Some(sight) = sight else {
            return FastAdmission::Wait;
        };
        if sight.quota_uid != self.quota_uid.as_deref() || !sight.counted {
            return FastAdmission::Wait;
        }
        // Another process waits for headroom, or the master asks for share back: ours goes back
        // at our next write, and nothing more is admitted from it meanwhile.
        if sight.wanted_back {
            self.give_back = true;
            return FastAdmission::WantedBack;
        }
        // Our allotment must still be in the ledger as we wrote it (seed-controller removes
        // expired ones).
        if sight.own_granted != Some(&self.granted) {
            return FastAdmission::Wait;
        }
        let Some(reservation) = decide(&self.admitted_total) else {
            return FastAdmission::Wait;
        };
        let cap = self.cap_in_flight.as_ref().unwrap_or(&self.granted);
        if !fits_within(limit, cap, &self.admitted_total, growth) {
            return FastAdmission::Wait;
        }
        let mut record = false;
        if let Some(reservation) = reservation {
            let Ok(total) = self.admitted_total.checked_add(&reservation.reserved) else {
                return FastAdmission::Wait;
            };
            self.admitted_total = total;
            record = self.admitted.is_empty();
            self.admitted.push((now, reservation));
            // No write in flight (it would take the refill already): refill now.
            if !self.top_up
                && self.cap_in_flight.is_none()
                && past_low_water(&self.granted, &self.admitted_total)
            {
                self.top_up = true;
                record = true;
            }
        }
        FastAdmission::Admitted { record }
    }

    /// Marks the allotment to go back when headroom is `wanted` elsewhere; whether it goes.
    pub fn wanted_back(&mut self, wanted: bool) -> bool {
        let goes = wanted && self.holding;
        self.give_back |= goes;
        goes
    }

    /// The admissions a write on a copy should record (those `in_ledger` already are there: a
    /// write whose answer was lost landed them), and their total.
    pub fn unrecorded(
        &self,
        in_ledger: impl Fn(&Reservation) -> bool,
    ) -> Result<(Vec<Reservation>, ResourceDetails), QuantityError> {
        let mut total = ResourceDetails::zero();
        let mut list = Vec::new();
        for (_, reservation) in &self.admitted {
            if in_ledger(reservation) {
                continue;
            }
            total = total.checked_add(&reservation.reserved)?;
            list.push(reservation.clone());
        }
        Ok((list, total))
    }

    /// Our allotment after the next write: none while idle (no request in this write and none
    /// for `release_after`), while headroom is wanted elsewhere or our own requests want share,
    /// or while stopping; else `room` (what the quota leaves beside everything else), if any.
    pub fn next_grant(
        &mut self,
        now: Instant,
        config: &AllotmentConfig,
        pass: Pass,
        room: impl FnOnce() -> Option<ResourceDetails>,
    ) -> Option<ResourceDetails> {
        self.give_back = false;
        let idle = !pass.requests && self.idle_since(config.release_after, now);
        if idle || pass.wanted_elsewhere || pass.wants_share || pass.stopping {
            return None;
        }
        // No room is no allotment: an entry of zero would cost a write now and another to give
        // it back.
        room().filter(|room| !room.is_empty())
    }

    /// A quarter of the TTL passed since the last renewal: the next write renews.
    pub fn renewal_due(&self, now: Instant, ttl: Duration) -> bool {
        self.renewed
            .is_none_or(|t| now.saturating_duration_since(t) >= ttl / 4)
    }

    /// A write planned on a copy begins: it records every admission so far, and sets our
    /// allotment to `planned.grant`. When it writes anything, admissions meanwhile are bounded by
    /// [`cap_while_writing`], so they stay covered whether it lands or not.
    pub fn begin_write(&mut self, now: Instant, planned: Planned<'_>) -> WriteStart {
        let Planned {
            copy_uid,
            own_granted,
            grant,
            writes_allotment,
            writes,
            requests,
        } = planned;
        self.top_up = false;
        let start = WriteStart {
            recorded: self.admitted.len(),
            recorded_total: self.admitted_total.clone(),
            grant,
            writes_allotment,
            prior_cap: self.cap_in_flight.clone(),
        };
        if writes {
            // A cap still set is from a write whose outcome is unknown (it may have landed), so
            // it bounds this one too. Otherwise the grant we hold, as far as the copy shows it.
            let old = match &self.cap_in_flight {
                Some(cap) => cap.clone(),
                None if self.holding && self.quota_uid.as_deref() == copy_uid => {
                    cap_while_writing(&self.granted, own_granted, &ResourceDetails::default())
                }
                None => ResourceDetails::default(),
            };
            let new = start.grant.clone().unwrap_or_default();
            self.cap_in_flight = Some(cap_while_writing(&old, &new, &start.recorded_total));
        }
        if requests {
            self.last_request = Some(now);
        }
        start
    }

    /// The write begun at `started` on the copy with UID `copy_uid` landed: what it recorded
    /// leaves the holder, and the allotment is what it wrote.
    pub fn landed(
        &mut self,
        started: Instant,
        copy_uid: Option<&str>,
        write: &WriteStart,
        ttl: Duration,
    ) -> Holding {
        self.admitted.drain(..write.recorded.min(self.admitted.len()));
        self.admitted_total = self.admitted_total.saturating_sub(&write.recorded_total);
        self.cap_in_flight = None;
        self.maybe_holding = false;
        self.succeeded();
        self.quota_uid = copy_uid.map(str::to_owned);
        let was = self.holding;
        if let Some(grant) = &write.grant {
            if write.writes_allotment {
                self.renewed = Some(started);
                self.usable_until = Some(started + ttl / 2);
            }
            self.holding = true;
            self.granted = grant.clone();
            if was { Holding::Kept } else { Holding::Taken }
        } else {
            self.holding = false;
            self.granted = ResourceDetails::default();
            self.usable_until = None;
            self.renewed = None;
            if was { Holding::GivenBack } else { Holding::None }
        }
    }

    /// The write failed. A `conflict` certainly did not land: the bound in force before it is
    /// back. Anything else may have landed: its bound stays, and so may our allotment.
    pub fn write_failed(&mut self, write: &WriteStart, conflict: bool) {
        if conflict {
            self.cap_in_flight.clone_from(&write.prior_cap);
        } else {
            self.maybe_holding |= write.writes_allotment;
        }
    }

    /// A pass wrote nothing. Without an allotment in `grant`, nothing of ours is in the copy
    /// (seed-controller removed it, or we gave it back): not holding, which is certain only on a
    /// `verified` (fresh) read.
    pub fn nothing_written(&mut self, grant: bool, verified: bool) {
        if !grant {
            self.holding = false;
            self.usable_until = None;
            self.maybe_holding &= !verified;
        }
        self.succeeded();
    }

    /// A pass gave up (its writes failed or were refused): upkeep backs off. `maybe_landed`: a
    /// write may still land (it timed out), with an allotment of ours in it.
    pub fn gave_up(&mut self, now: Instant, maybe_landed: bool) {
        self.failures = self.failures.saturating_add(1);
        let backoff = Duration::from_millis(100)
            .saturating_mul(1 << self.failures.min(6))
            .min(Duration::from_secs(5));
        self.not_before = Some(now + backoff);
        self.maybe_holding |= maybe_landed;
    }

    fn succeeded(&mut self) {
        self.failures = 0;
        self.not_before = None;
    }

    /// The project's ledger is gone: nothing is held. Admissions not recorded yet stay, to be
    /// recorded if a ledger comes back (they are Machines that exist); meanwhile upkeep backs off.
    pub fn forget(&mut self, now: Instant) {
        let kept = AllotmentHolder {
            last_request: self.last_request,
            admitted: std::mem::take(&mut self.admitted),
            admitted_total: std::mem::take(&mut self.admitted_total),
            failures: self.failures,
            ..AllotmentHolder::default()
        };
        *self = kept;
        if !self.admitted.is_empty() {
            self.gave_up(now, false);
        }
    }

    /// When upkeep is due without requests (record admissions, renew or give back the
    /// allotment), after any backoff.
    pub fn upkeep_due(&self, now: Instant, config: &AllotmentConfig, stopping: bool) -> Option<Instant> {
        let due = self.upkeep_wanted(now, config, stopping)?;
        Some(self.not_before.map_or(due, |t| due.max(t)))
    }

    fn upkeep_wanted(&self, now: Instant, config: &AllotmentConfig, stopping: bool) -> Option<Instant> {
        if stopping && self.holds_anything() {
            return Some(now);
        }
        // Headroom wanted elsewhere goes back at once (recording what we admitted with it).
        if (self.give_back || self.top_up) && self.holding {
            return Some(now);
        }
        if let Some((first, _)) = self.admitted.first() {
            return Some(*first + config.record_after);
        }
        if self.maybe_holding {
            return Some(now + config.record_after);
        }
        if !self.holding {
            return None;
        }
        let renew = self.renewed.map(|t| t + config.ttl / 4);
        let release = self.last_request.map(|t| t + config.release_after);
        match (renew, release) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

mod carried;
pub use carried::CarriedChange;

#[cfg(test)]
mod tests;
