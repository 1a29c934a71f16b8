//! What the webhook knows of a project's quota, read from the seed's `QuotaLedger`: the limit,
//! everything in use, and (under shares) what this seed may commit.

use std::collections::BTreeMap;

use kkp_quota_crds::autoscaled::AutoscaledDeployment;
use kkp_quota_crds::ledger::{Reservation, allotted_total, reserved_total};
use kkp_quota_crds::shares::{self, SeedShare};
use kkp_quota_crds::{LedgerGroup, QuotaLedger, QuotaLedgerSpec, QuotaLedgerStatus, ResourceDetails};

/// What the webhook knows of a project's quota: the limit and everything already in use.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QuotaState {
    /// Absent resources are unlimited.
    pub limit: ResourceDetails,
    /// Every other seed's usage, as the master last folded it.
    pub other_seeds_usage: ResourceDetails,
    /// This seed's own count (seed-controller).
    pub local_usage: ResourceDetails,
    /// Admitted on this seed, not counted yet.
    pub reserved: ResourceDetails,
    /// Headroom held by webhook processes (allotments); for [`QuotaState::for_holder`], the
    /// other holders' allotments plus what the holder itself admitted from its own.
    pub allotted: ResourceDetails,
    /// This seed's share, when shares are in force on the ledger.
    pub seed: Option<SeedCapacity>,
    /// The policy `reservedCounts` (`kkp_quota_crds::autoscaled`).
    pub reserved_counts: bool,
    /// Under it: the autoscaled deployments as seed-controller last counted them.
    pub autoscaled: Vec<AutoscaledDeployment>,
    /// Under it: the reservations marked with a deployment (its Machines on their way, its
    /// changes not counted yet).
    pub room_reservations: Vec<Reservation>,
    /// The shared groups bounding the project, as the master last carried them into the ledger
    /// (for denials that name the group; the share alone keeps the group's limit).
    pub groups: Vec<LedgerGroup>,
}

/// What this seed may commit under its share, and who holds the rest.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SeedCapacity {
    /// `min(share, target, limit, limit - otherSeedsUsage)` per limited resource
    /// ([`SeedShare::capacity_beside`]).
    pub capacity: ResourceDetails,
    /// The share other seeds hold, as the master last saw it (for messages).
    pub others: BTreeMap<String, ResourceDetails>,
}

/// The ledger cannot be read: amounts that cannot be added up exactly, or a format newer than
/// this build understands (it might hold entries this build would not count).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the quota ledger cannot be read: {0}")]
pub struct StateError(pub(super) String);

impl QuotaState {
    /// Reads a seed quota copy.
    pub fn from_copy(quota: &QuotaLedger) -> Result<QuotaState, StateError> {
        QuotaState::from_parts(&quota.spec, quota.status.as_ref())
    }

    /// Reads a seed quota copy's spec and status.
    pub fn from_parts(
        spec: &QuotaLedgerSpec,
        status: Option<&QuotaLedgerStatus>,
    ) -> Result<QuotaState, StateError> {
        // Borrowed, not cloned: the status holds every reservation.
        let default_status = QuotaLedgerStatus::default();
        let status = status.unwrap_or(&default_status);
        status.format_supported().map_err(|e| StateError(e.to_string()))?;
        let local_usage = status.local_usage.clone().unwrap_or_default();
        let other_seeds_usage = match &status.other_seeds_usage {
            Some(other) => other.clone(),
            None => status
                .global_usage
                .clone()
                .unwrap_or_default()
                .saturating_sub(&local_usage),
        };
        let seed = shares::objects::seed_share(spec, Some(status)).map(|share: SeedShare| SeedCapacity {
            capacity: share.capacity_beside(&spec.quota, &other_seeds_usage),
            others: spec.shares.as_ref().map(|s| s.others.clone()).unwrap_or_default(),
        });
        let reserved = reserved_total(&status.reservations).map_err(|e| StateError(e.to_string()))?;
        let allotted = allotted_total(&status.allotments).map_err(|e| StateError(e.to_string()))?;
        let (autoscaled, room_reservations) = if spec.reserved_counts {
            let marked = status.reservations.iter().filter(|r| r.deployment.is_some());
            (status.autoscaled.clone(), marked.cloned().collect())
        } else {
            (Vec::new(), Vec::new())
        };
        Ok(QuotaState {
            limit: spec.quota.clone(),
            other_seeds_usage,
            local_usage,
            reserved,
            allotted,
            seed,
            reserved_counts: spec.reserved_counts,
            autoscaled,
            room_reservations,
            groups: spec.shares.as_ref().map(|s| s.groups.clone()).unwrap_or_default(),
        })
    }

    /// The state as the webhook process `holder` sees it: its own allotment is replaced by
    /// `admitted_from_own`, what it admitted from that allotment and has not recorded yet (counted
    /// as reserved: they are admitted Machines); `allotted` is the other holders' alone.
    pub fn for_holder(
        spec: &QuotaLedgerSpec,
        status: Option<&QuotaLedgerStatus>,
        holder: &str,
        admitted_from_own: &ResourceDetails,
    ) -> Result<QuotaState, StateError> {
        let mut state = QuotaState::from_parts(spec, status)?;
        let others = status
            .map(|s| s.allotments.iter().filter(|a| a.holder != holder))
            .into_iter()
            .flatten();
        state.allotted = ResourceDetails::checked_sum(others.map(|a| &a.granted))
            .map_err(|e| StateError(e.to_string()))?;
        state.with_own_admitted(admitted_from_own)
    }

    /// A state of [`QuotaState::for_holder`] made with nothing admitted, given what the holder
    /// has admitted from its allotment since (the fast path keeps one such state per copy of the
    /// ledger, so that an admission costs no pass over the ledger's reservations).
    pub fn with_own_admitted(
        mut self,
        admitted_from_own: &ResourceDetails,
    ) -> Result<QuotaState, StateError> {
        self.reserved = self
            .reserved
            .checked_add(admitted_from_own)
            .map_err(|e| StateError(e.to_string()))?;
        Ok(self)
    }

    /// Takes in an admission decided in a batch, so that the requests after it see it: a
    /// Machine from a deployment's room, or a deployment's change.
    pub fn note_room_reservation(&mut self, request: &super::Request, reserve: &super::Reserve) {
        let (Some(deployment), Some(autoscaled)) = (&reserve.deployment, &request.autoscaled) else {
            return;
        };
        let cluster = match autoscaled {
            super::Autoscaled::Member(m) => &m.cluster,
            super::Autoscaled::Change(c) => &c.cluster,
        };
        self.room_reservations.push(Reservation {
            cluster: cluster.clone(),
            uid: reserve.uid.clone().unwrap_or_default(),
            size: reserve.size.clone(),
            reserved: reserve.reserved.clone(),
            created_at: jiff::Timestamp::UNIX_EPOCH,
            deployment: Some(deployment.clone()),
        });
    }

    /// What is used or admitted: `otherSeedsUsage + localUsage + reservations`, without headroom
    /// held in allotments.
    pub fn used(&self) -> Result<ResourceDetails, StateError> {
        self.other_seeds_usage
            .checked_add(&self.local_usage)
            .and_then(|sum| sum.checked_add(&self.reserved))
            .map_err(|e| StateError(e.to_string()))
    }

    /// `otherSeedsUsage + localUsage + reservations + allotments`: what a request must fit beside.
    pub fn in_use(&self) -> Result<ResourceDetails, StateError> {
        self.used()?
            .checked_add(&self.allotted)
            .map_err(|e| StateError(e.to_string()))
    }

    /// What this seed has committed: `localUsage + reservations + allotments` (what its share
    /// must cover).
    pub fn committed(&self) -> Result<ResourceDetails, StateError> {
        self.local_usage
            .checked_add(&self.reserved)
            .and_then(|sum| sum.checked_add(&self.allotted))
            .map_err(|e| StateError(e.to_string()))
    }

    /// The most an allotment may take: half of what is left under the limit or, under shares,
    /// under the seed's capacity (`in_use`/`committed` without the holder's own allotment).
    pub fn allotment_room(&self, extra_admitted: &ResourceDetails) -> Result<ResourceDetails, StateError> {
        let err = |e: kkp_quota_crds::QuantityError| StateError(e.to_string());
        if let Some(seed) = &self.seed {
            let committed = self.committed()?.checked_add(extra_admitted).map_err(err)?;
            return Ok(kkp_quota_crds::shares::allotment::grant_for(
                &seed.capacity,
                &committed,
            ));
        }
        let in_use = self.in_use()?.checked_add(extra_admitted).map_err(err)?;
        Ok(kkp_quota_crds::shares::allotment::grant_for(&self.limit, &in_use))
    }
}
