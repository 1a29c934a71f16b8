//! How many Machines of one size fit in a quota's room: the webhook's dry-run answer and the
//! kubectl plugin's `fits` both count with this, so a user gets the same number from either.

use crate::{Quantity, Resource, ResourceDetails};

/// The count, and the resource that allows the fewest (the reason there are not more).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fit {
    pub count: u64,
    pub tightest: Resource,
}

/// The room left under each limit, `limit - used` and never below zero; unlimited resources
/// are absent. What a user's view and the plugin show as free, and what [`machines_that_fit`]
/// divides.
pub fn room(limits: &ResourceDetails, used: &ResourceDetails) -> ResourceDetails {
    let mut room = ResourceDetails::default();
    for (resource, limit) in limits.iter() {
        room.set(
            resource,
            Some(limit.saturating_sub_to_zero(used.amount(resource))),
        );
    }
    room
}

/// How many Machines of `size` fit beside `used` under `limits`: the fewest over every limited
/// resource the size asks for. `None` when no limit applies to anything the size asks for.
/// Usage above a limit leaves no room (never a negative count).
pub fn machines_that_fit(
    limits: &ResourceDetails,
    used: &ResourceDetails,
    size: &ResourceDetails,
) -> Option<Fit> {
    room(limits, used)
        .iter()
        .filter(|&(r, _)| size.amount(r) > Quantity::ZERO)
        .map(|(r, room)| {
            let count = u64::try_from(room.as_nanos() / size.amount(r).as_nanos()).unwrap_or(u64::MAX);
            Fit { count, tightest: r }
        })
        .min_by_key(|fit| fit.count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn details(pairs: &[(Resource, &str)]) -> ResourceDetails {
        let mut d = ResourceDetails::default();
        for (r, q) in pairs {
            d.set(*r, Some(q.parse().expect("a quantity")));
        }
        d
    }

    #[test]
    fn the_tightest_limited_resource_decides() {
        let limits = details(&[(Resource::Cpu, "16"), (Resource::Memory, "32Gi")]);
        let used = details(&[(Resource::Cpu, "2"), (Resource::Memory, "4Gi")]);
        let size = details(&[
            (Resource::Cpu, "2"),
            (Resource::Memory, "8Gi"),
            (Resource::Storage, "50Gi"),
        ]);
        assert_eq!(
            machines_that_fit(&limits, &used, &size),
            Some(Fit {
                count: 3,
                tightest: Resource::Memory
            })
        );
    }

    #[test]
    fn unlimited_needs_and_usage_over_the_limit() {
        let size = details(&[(Resource::Cpu, "500m")]);
        assert_eq!(
            machines_that_fit(
                &details(&[(Resource::Gpu, "1")]),
                &ResourceDetails::default(),
                &size
            ),
            None
        );
        let limits = details(&[(Resource::Cpu, "4")]);
        let over = details(&[(Resource::Cpu, "5")]);
        assert_eq!(
            machines_that_fit(&limits, &over, &size),
            Some(Fit {
                count: 0,
                tightest: Resource::Cpu
            })
        );
        // Milli-cpu rooms count exactly: 1.5 cpu left holds three half-cpu Machines.
        let used = details(&[(Resource::Cpu, "2500m")]);
        assert_eq!(machines_that_fit(&limits, &used, &size).map(|f| f.count), Some(3));
    }
}
