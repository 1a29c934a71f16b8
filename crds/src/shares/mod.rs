//! Per-seed shares of a project quota (escrow, the demarcation protocol), pure: no I/O.
//!
//! The master divides every limited resource of a quota into shares, one per seed, and keeps
//! `sum(shares) <= limit`; a seed admits only within its own share, so seeds never spend the same
//! headroom. A share grows only from headroom no seed holds (a master grant) and shrinks only by
//! the seed's own release, written in the same compare-and-swap as its admissions. The webhook
//! allotments of `machine-webhook` are the same idea one level down: sub-shares of the seed's
//! share. [`fits_within`] is the one admission test for both levels.
//!
//! - [`seed`]: what a seed holds ([`SeedShare`]) and reports ([`SeedReport`]).
//! - [`allotment`]: one webhook process's allotment in a seed's ledger ([`AllotmentHolder`]).
//! - [`group`]: a quota group's budgets for its projects, the same escrow one level up;
//!   [`budgets`] reads and writes them on the `QuotaGroup` and the `ProjectQuota`s.
//! - [`master`]: the master's view ([`MasterView`]) and its [`Plan`] of grants and targets.
//! - [`objects`]: reading and writing that state on the `QuotaLedger`s and the `ProjectQuota`.
//!
//! `docs/shares.md` gives the protocol and why `sum(shares) <= limit` holds.

pub mod allotment;
pub mod budgets;
pub mod group;
pub mod master;
pub mod objects;
pub mod seed;

use std::fmt;

pub use allotment::AllotmentHolder;
pub use master::{MasterView, Plan, SeedRecord, epoch_start};
pub use seed::{MasterWord, SeedReport, SeedShare};

use crate::quantity::Quantity;
use crate::resources::{Exceeded, ResourceDetails};

/// A request that does not fit: every limited resource it would take over the capacity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Shortfall {
    /// One entry per resource; `limit` is the capacity, `used` what was committed.
    pub exceeded: Vec<Exceeded>,
}

impl fmt::Display for Shortfall {
    /// `cpu: 3 committed + 2 requested > 4 available; memory: ...`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.exceeded.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            let r = e.resource;
            write!(
                f,
                "{r}: {} committed + {} requested > {} available",
                r.amount(e.used),
                r.amount(e.requested),
                r.amount(e.limit)
            )?;
        }
        Ok(())
    }
}

/// One level of escrow: whether `request` fits within `capacity` on top of `committed`.
///
/// `capacity` reads like a quota limit: a resource absent from it is unlimited. A resource the
/// request does not ask for never fails, even when `committed` is already above the capacity
/// (deletes and shrinks always pass). A sum that overflows does not fit.
///
/// Used at both levels: a seed's capacity ([`SeedShare::capacity`]) against its committed
/// usage, and a webhook process's allotment (made a capacity with [`bounded_by`]) against what
/// it admitted from it.
pub fn fits_within(
    capacity: &ResourceDetails,
    committed: &ResourceDetails,
    request: &ResourceDetails,
) -> Result<(), Shortfall> {
    let mut exceeded = Vec::new();
    for (resource, limit) in capacity.iter() {
        let requested = request.amount(resource);
        if requested <= Quantity::ZERO {
            continue;
        }
        let used = committed.amount(resource);
        if !used.checked_add(requested).is_ok_and(|total| total <= limit) {
            exceeded.push(Exceeded {
                resource,
                requested,
                used,
                limit,
            });
        }
    }
    if exceeded.is_empty() {
        Ok(())
    } else {
        Err(Shortfall { exceeded })
    }
}

/// The slack a seed keeps above what it committed (and the master leaves it when it asks idle
/// share back): `percent` of every limited resource of `limit`, rounded up to a millicore of cpu
/// or a whole unit of every other resource, so that released amounts stay whole bytes, GPUs and
/// Machines. Unlimited resources have no slack (and no share). Exact, and never overflows: a
/// product too large to compute is divided first.
pub fn slack(limit: &ResourceDetails, percent: u32) -> ResourceDetails {
    per_limited(limit, |resource, amount| {
        let nanos = amount.as_nanos().max(0);
        let pct = i128::from(percent);
        let scaled = nanos
            .checked_mul(pct)
            .map_or_else(|| nanos / 100 * pct, |n| n / 100 + i128::from(n % 100 != 0));
        let granule = match resource {
            crate::Resource::Cpu => Quantity::from_millis(1).as_nanos(),
            _ => Quantity::from_units(1).as_nanos(),
        };
        let rounded = scaled / granule + i128::from(scaled % granule != 0);
        Quantity::from_nanos(rounded.saturating_mul(granule))
    })
}

/// Per resource the smallest of `amounts` that name it; absent where none does.
pub fn smallest<'a>(amounts: impl IntoIterator<Item = &'a ResourceDetails>) -> ResourceDetails {
    let mut out = ResourceDetails::default();
    for amount in amounts {
        for (resource, b) in amount.iter() {
            let smaller = out.get(resource).map_or(b, |a| a.min(b));
            out.set(resource, Some(smaller));
        }
    }
    out
}

/// Per resource, the largest of several amounts (a resource absent from all stays absent);
/// `None` for none. How several demands for share are merged into one.
pub fn largest<'a>(amounts: impl IntoIterator<Item = &'a ResourceDetails>) -> Option<ResourceDetails> {
    let mut out: Option<ResourceDetails> = None;
    for amount in amounts {
        let merged = out.get_or_insert_with(ResourceDetails::default);
        for (resource, b) in amount.iter() {
            let larger = merged.get(resource).map_or(b, |a| a.max(b));
            merged.set(resource, Some(larger));
        }
    }
    out
}

/// `amounts` as a capacity for the resources `limit` limits: those present (absent amounts as
/// zero), every other resource absent, that is unlimited.
pub fn bounded_by(limit: &ResourceDetails, amounts: &ResourceDetails) -> ResourceDetails {
    per_limited(limit, |resource, _| amounts.amount(resource))
}

/// A value for every resource `limit` limits, nothing for the others.
fn per_limited(
    limit: &ResourceDetails,
    mut value: impl FnMut(crate::Resource, Quantity) -> Quantity,
) -> ResourceDetails {
    let mut out = ResourceDetails::default();
    for (resource, limit) in limit.iter() {
        out.set(resource, Some(value(resource, limit)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Resource;

    pub(crate) use crate::fixtures::cpu;

    /// A copy holding `granted - released` cpu, at version 1, with an optional target.
    pub(crate) fn seed_share(granted: i64, released: i64, target: Option<i64>) -> SeedShare {
        SeedShare {
            granted: cpu(granted),
            released: cpu(released),
            target: target.map(cpu).unwrap_or_default(),
            version: 1,
        }
    }

    #[test]
    fn fits_only_within_the_limited_capacity() {
        assert!(fits_within(&cpu(4), &cpu(2), &cpu(2)).is_ok());
        let short = fits_within(&cpu(4), &cpu(3), &cpu(2)).unwrap_err();
        assert_eq!(short.to_string(), "cpu: 3 committed + 2 requested > 4 available");
        // Unlimited resources never stop a request; a request of nothing always fits.
        let mut mem = ResourceDetails::default();
        mem.set(Resource::Memory, Some(Quantity::from_units(100)));
        assert!(fits_within(&cpu(0), &cpu(5), &mem).is_ok());
        // Overflow does not fit.
        let huge = ResourceDetails {
            cpu: Some(Quantity::from_nanos(i128::MAX)),
            ..ResourceDetails::default()
        };
        assert!(fits_within(&huge, &huge, &cpu(1)).is_err());
    }

    #[test]
    fn slack_is_a_percentage_of_each_limit_rounded_up_to_whole_units() {
        let mut limit = cpu(10);
        limit.set(Resource::Memory, Some(Quantity::from_gibibytes(1)));
        limit.set(Resource::Machines, Some(Quantity::from_units(3)));
        let s = slack(&limit, 10);
        assert_eq!(s.amount(Resource::Cpu), Quantity::from_units(1));
        // 107374182.4 bytes -> 107374183.
        assert_eq!(s.amount(Resource::Memory), Quantity::from_units(107_374_183));
        // 0.3 machines -> 1.
        assert_eq!(s.amount(Resource::Machines), Quantity::from_units(1));
        assert_eq!(s.get(Resource::Gpu), None, "unlimited: no slack");
        assert_eq!(
            slack(&cpu(1), 15).amount(Resource::Cpu),
            Quantity::from_millis(150)
        );
        let millis = ResourceDetails {
            cpu: Some(Quantity::from_millis(2500)),
            ..ResourceDetails::default()
        };
        assert_eq!(slack(&millis, 10).cpu, Some(Quantity::from_millis(250)));
        assert_eq!(slack(&cpu(7), 0), cpu(0));
        assert_eq!(slack(&cpu(10), 100), cpu(10));
        let huge = ResourceDetails {
            cpu: Some(Quantity::from_nanos(i128::MAX)),
            ..ResourceDetails::default()
        };
        assert!(
            slack(&huge, 50).cpu.is_some_and(|q| q > Quantity::ZERO),
            "no overflow"
        );
    }

    #[test]
    fn largest_is_per_resource() {
        let mut mem = cpu(1);
        mem.set(Resource::Memory, Some(Quantity::from_units(5)));
        let merged = largest([&cpu(4), &mem]).unwrap();
        assert_eq!(merged.amount(Resource::Cpu), Quantity::from_units(4));
        assert_eq!(merged.amount(Resource::Memory), Quantity::from_units(5));
        assert_eq!(merged.get(Resource::Gpu), None);
        assert!(largest([]).is_none());
    }

    #[test]
    fn bounded_by_keeps_limited_resources_only() {
        let mut limit = cpu(16);
        limit.set(Resource::Gpu, Some(Quantity::from_units(1)));
        let mut expected = cpu(3);
        expected.set(Resource::Gpu, Some(Quantity::ZERO));
        let mut amounts = cpu(3);
        amounts.set(Resource::Memory, Some(Quantity::from_units(9)));
        assert_eq!(bounded_by(&limit, &amounts), expected);
    }
}
