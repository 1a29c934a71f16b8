//! The policy `reservedCounts: true`, pure (docs/capacity.md, "Step 4"): the room a cluster
//! autoscaler may grow a `MachineDeployment` into counts as usage, and the deployment's own
//! Machines are admitted from that room.
//!
//! An autoscaled deployment's *footprint* is its nominal size, `max x its template's size`, or
//! what its members (the counted Machines its selector selects) add up to where that is more, per
//! resource. Under the policy a seed's `localUsage` is every counted Machine once, plus every
//! autoscaled deployment's *room*, `nominal - members` per resource, never negative
//! ([`AutoscaledDeployment`], written to the ledger by seed-controller). A Machine is a member
//! of the deployment that controls the `MachineSet` that controls it (as machine-controller
//! owns them), so of one deployment at most. So:
//!
//! - A Machine of the deployment is admitted from the room while `members + marked + its size`
//!   stays within the nominal size ([`admits_from_room`]): its reservation is *marked* with the
//!   deployment and adds nothing to the usage. Counting it adds its size and takes as much off the
//!   room: the usage does not move.
//! - A Machine deleted gives its size back to its deployment's room, never more: the footprint
//!   never grows without an admission, even when members are of an older, smaller template.
//! - A Machine whose deployment is not known yet is counted alone, beside the whole room: more
//!   than it will be, never less. One that no deployment's room admits is admitted as any
//!   Machine is, by its full size.
//! - A deployment's create, or a raise of its `max` or of its template's size, grows the room:
//!   [`change_growth`] is checked against the quota like a Machine's growth and reserved
//!   ([`change_reservation`]) until seed-controller counts a version of the deployment after
//!   the one the change was made on ([`change_is_counted`]). Lowering `max` or deleting the
//!   deployment frees room at seed-controller's next count.

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ledger::Reservation;
use crate::quantity::QuantityError;
use crate::resources::ResourceDetails;

/// One autoscaled `MachineDeployment` as seed-controller last counted it, in the ledger's
/// `status.autoscaled`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoscaledDeployment {
    /// The user cluster (KKP cluster ID).
    pub cluster: String,
    /// The deployment's UID.
    pub uid: String,
    /// `namespace/name`, for people.
    pub name: String,
    /// The cluster autoscaler's maximum size for it.
    pub max: u32,
    /// One Machine of its template.
    pub size: ResourceDetails,
    /// Its counted Machines (those of its `MachineSet`s), summed.
    pub members: ResourceDetails,
}

impl AutoscaledDeployment {
    /// `max` Machines of its template.
    pub fn nominal(&self) -> Result<ResourceDetails, QuantityError> {
        nominal(self.max, &self.size)
    }

    /// What its room counts: the nominal size less its members, per resource, never negative.
    pub fn reserved(&self) -> Result<ResourceDetails, QuantityError> {
        Ok(self.nominal()?.saturating_sub(&self.members))
    }
}

/// `max` Machines of `size`: what an autoscaled deployment may grow to, and what seed-controller
/// counts it at under its own UID, for the reservation of its create or raise to go.
pub fn nominal(max: u32, size: &ResourceDetails) -> Result<ResourceDetails, QuantityError> {
    size.checked_times(i64::from(max))
}

/// Per resource, the lesser amount (absent counting as zero).
fn lesser(a: &ResourceDetails, b: &ResourceDetails) -> ResourceDetails {
    a.saturating_sub(&a.saturating_sub(b))
}

/// Per resource, the greater amount (absent counting as zero).
fn greater(a: &ResourceDetails, b: &ResourceDetails) -> Result<ResourceDetails, QuantityError> {
    a.checked_add(&a.growth_to(b))
}

/// The UID of the reservation of a deployment's change: the deployment's UID and the
/// `resourceVersion` the change was made on (none for a create), so that seed-controller can
/// tell a view of the deployment from before the change ([`change_is_counted`]).
pub fn change_uid(deployment_uid: &str, old_version: Option<&str>) -> String {
    format!("{deployment_uid}@{}", old_version.unwrap_or_default())
}

/// The reservations of deployment `uid`'s creates and raises not counted yet.
pub fn changes_of<'a>(
    cluster: &'a str,
    uid: &'a str,
    reservations: &'a [Reservation],
) -> impl Iterator<Item = &'a Reservation> + 'a {
    reservations
        .iter()
        .filter(move |r| r.cluster == cluster && r.deployment.as_deref() == Some(uid) && is_change_of(uid, r))
}

/// What the ledger covers of deployment `uid`'s nominal size: `counted`, the size it counts it
/// at, and its changes not counted yet.
fn covered(
    counted: ResourceDetails,
    cluster: &str,
    uid: &str,
    reservations: &[Reservation],
) -> Result<ResourceDetails, QuantityError> {
    let mut covered = counted;
    for change in changes_of(cluster, uid, reservations) {
        covered = covered.checked_add(&change.reserved)?;
    }
    Ok(covered)
}

/// A deployment's room as the ledger covers it, for the Machine being decided: the nominal size
/// its Machines may fill and what is taken of it already.
#[derive(Debug, Clone)]
pub struct Room {
    pub nominal: ResourceDetails,
    /// Its members.
    pub taken: ResourceDetails,
}

impl Room {
    /// The room the ledger covers for deployment `uid` in `cluster`, as it is now (`max`
    /// Machines of `size`): no more than the deployment's nominal size now (a count from before a
    /// lowering still counts the room the lowering gave up), nor than what the ledger covers
    /// (its count and its changes not counted yet). `None` until seed-controller counts the
    /// deployment: before, its Machines are admitted by their full size (a count may find
    /// Machines of it that no reservation says are).
    pub fn find(
        cluster: &str,
        uid: &str,
        autoscaled: &[AutoscaledDeployment],
        reservations: &[Reservation],
        (max, size): (u32, &ResourceDetails),
    ) -> Result<Option<Room>, QuantityError> {
        let Some(counted) = autoscaled.iter().find(|a| a.cluster == cluster && a.uid == uid) else {
            return Ok(None);
        };
        let covered = covered(counted.nominal()?, cluster, uid, reservations)?;
        Ok(Some(Room {
            nominal: lesser(&covered, &nominal(max, size)?),
            taken: counted.members.clone(),
        }))
    }
}

/// What the Machines admitted from deployment `uid`'s room in `cluster` and not counted yet add
/// up to: the reservations marked with it that hold nothing themselves (not its changes).
pub fn marked(
    cluster: &str,
    uid: &str,
    reservations: &[Reservation],
) -> Result<ResourceDetails, QuantityError> {
    ResourceDetails::checked_sum(
        reservations
            .iter()
            .filter(|r| r.cluster == cluster && r.deployment.as_deref() == Some(uid) && r.reserved.is_empty())
            .filter(|r| !is_change_of(uid, r))
            .map(|r| &r.size),
    )
}

fn is_change_of(uid: &str, reservation: &Reservation) -> bool {
    reservation
        .uid
        .strip_prefix(uid)
        .is_some_and(|rest| rest.starts_with('@'))
}

/// What the policy counts for the rooms of a seed's autoscaled deployments, with the ledger's
/// reservations as they are after the count settled those it counted: each deployment's room,
/// but no less than the Machines admitted from it and not counted yet (a lowering of `max`, or a
/// delete of the deployment, while they were on their way takes the room away; they are still
/// coming, and counted as they were admitted).
pub fn counted_rooms(
    autoscaled: &[AutoscaledDeployment],
    reservations: &[Reservation],
) -> Result<ResourceDetails, QuantityError> {
    let mut total = ResourceDetails::zero();
    for entry in autoscaled {
        let coming = marked(&entry.cluster, &entry.uid, reservations)?;
        total = total.checked_add(&greater(&entry.reserved()?, &coming)?)?;
    }
    for r in reservations {
        let Some(uid) = r.deployment.as_deref() else {
            continue;
        };
        let counted = autoscaled.iter().any(|a| a.cluster == r.cluster && a.uid == uid);
        if !counted && r.reserved.is_empty() && !is_change_of(uid, r) {
            total = total.checked_add(&r.size)?;
        }
    }
    Ok(total)
}

/// Whether a new Machine of `size` is admitted from `room`, Machines of `marked` of the
/// deployment being on their way: while what is taken, marked and it stay within the nominal
/// size.
pub fn admits_from_room(
    room: &Room,
    marked: &ResourceDetails,
    size: &ResourceDetails,
) -> Result<bool, QuantityError> {
    let taken = room.taken.checked_add(marked)?.checked_add(size)?;
    Ok(room.nominal.covers(&taken))
}

/// What a deployment's create or change from `old` to `new` (`max` Machines of `size`; `None`
/// or a zero `max` for a deployment that is not autoscaled) adds to the usage, per resource and
/// never negative: the raise of its nominal size over `old`'s, and at least its nominal size
/// less what the ledger covers of it (its count and its changes not counted yet).
///
/// The raise over `old` is held whatever the ledger covers: a count from before a lowering still
/// counts the room the lowering gave up, and a count that sees a later version of the deployment
/// removes the earlier changes' reservations. Members do not lessen it either: a count from a
/// view that has seen Machines deleted but not this change counts the old nominal size's room.
pub fn change_growth(
    counted: Option<&AutoscaledDeployment>,
    (cluster, uid): (&str, &str),
    reservations: &[Reservation],
    old: Option<(u32, &ResourceDetails)>,
    (max, size): (u32, &ResourceDetails),
) -> Result<ResourceDetails, QuantityError> {
    let new = nominal(max, size)?;
    let old = match old {
        Some((old_max, old_size)) => nominal(old_max, old_size)?,
        None => ResourceDetails::zero(),
    };
    let counted_nominal =
        counted.map_or_else(|| Ok(ResourceDetails::zero()), AutoscaledDeployment::nominal)?;
    let covered = covered(counted_nominal, cluster, uid, reservations)?;
    greater(&old.growth_to(&new), &covered.growth_to(&new))
}

/// The reservation of a change admitted with `growth`: the deployment's change UID
/// ([`change_uid`]), marked with the deployment, at its new nominal size (for people: what it
/// may grow to).
pub fn change_reservation(
    (cluster, uid): (&str, &str),
    old_version: Option<&str>,
    growth: &ResourceDetails,
    (max, size): (u32, &ResourceDetails),
    now: Timestamp,
) -> Result<Reservation, QuantityError> {
    Ok(Reservation {
        cluster: cluster.to_owned(),
        uid: change_uid(uid, old_version),
        size: nominal(max, size)?,
        reserved: growth.clone(),
        created_at: now,
        deployment: Some(uid.to_owned()),
    })
}

/// Whether seed-controller's count of deployment `uid` at `resourceVersion` `seen` settles a
/// change reservation of it: the count is of a version after the one the change was made on
/// (then the change is in it, or was never stored). A create's settles with any count of the
/// deployment. Versions that are not numbers settle nothing (the reservation expires instead).
pub fn change_is_counted(uid: &str, seen: &str, reservation: &Reservation) -> bool {
    let Some(made_on) = reservation
        .uid
        .strip_prefix(uid)
        .and_then(|rest| rest.strip_prefix('@'))
    else {
        return false;
    };
    if made_on.is_empty() {
        return true;
    }
    match (made_on.parse::<u64>(), seen.parse::<u64>()) {
        (Ok(made_on), Ok(seen)) => seen > made_on,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Quantity, Resource};

    fn size(cpu: i64) -> ResourceDetails {
        let mut d = ResourceDetails::default();
        d.set(Resource::Cpu, Some(Quantity::from_units(cpu)));
        d.set(Resource::Machines, Some(Quantity::from_units(1)));
        d
    }

    fn times(d: &ResourceDetails, n: i64) -> ResourceDetails {
        d.checked_times(n).unwrap()
    }

    fn entry(max: u32, members: ResourceDetails) -> AutoscaledDeployment {
        AutoscaledDeployment {
            cluster: "c".into(),
            uid: "d".into(),
            name: "ns/md".into(),
            max,
            size: size(2),
            members,
        }
    }

    fn machine(uid: &str, size: ResourceDetails) -> Reservation {
        Reservation {
            cluster: "c".into(),
            uid: uid.into(),
            size,
            reserved: ResourceDetails::zero(),
            created_at: Timestamp::UNIX_EPOCH,
            deployment: Some("d".into()),
        }
    }

    fn change(old_version: Option<&str>, growth: &ResourceDetails, max: u32) -> Reservation {
        change_reservation(
            ("c", "d"),
            old_version,
            growth,
            (max, &size(2)),
            Timestamp::UNIX_EPOCH,
        )
        .unwrap()
    }

    fn cpu(d: &ResourceDetails) -> Quantity {
        d.amount(Resource::Cpu)
    }

    #[test]
    fn room_admits_machines_while_the_nominal_size_holds_them() {
        let counted = [entry(4, times(&size(2), 2))];
        let room = Room::find("c", "d", &counted, &[], (4, &size(2)))
            .unwrap()
            .unwrap();
        let admits = |marked: &ResourceDetails, machine: &ResourceDetails| {
            admits_from_room(&room, marked, machine).unwrap()
        };
        assert!(admits(&ResourceDetails::zero(), &size(2)));
        assert!(admits(&size(2), &size(2)));
        assert!(!admits(&times(&size(2), 2), &size(2)), "4 = 2 counted + 2 marked");
        assert!(!admits(&size(2), &size(3)), "6 + 3 cpu is over 8");
        assert!(admits(&size(2), &size(1)), "a smaller Machine fits what is left");
        assert_eq!(cpu(&counted[0].reserved().unwrap()), Quantity::from_units(4));
        assert!(
            entry(2, times(&size(2), 5)).reserved().unwrap().is_empty(),
            "scaled past max by hand"
        );
        // Members of an older, bigger template: the room is what the nominal size leaves.
        assert_eq!(
            cpu(&entry(4, size(7)).reserved().unwrap()),
            Quantity::from_units(1)
        );
        // Lowered to 3 since the count: the room is that of 3.
        let lowered = Room::find("c", "d", &counted, &[], (3, &size(2)))
            .unwrap()
            .unwrap();
        assert!(!admits_from_room(&lowered, &size(2), &size(2)).unwrap());
        assert!(
            Room::find("c", "other", &counted, &[], (3, &size(2)))
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn changes_not_counted_yet_make_room_and_are_not_machines() {
        let create = change(None, &times(&size(2), 3), 3);
        assert_eq!(create.uid, "d@");
        let raise = change(Some("7"), &size(2), 4);
        let reservations = vec![create, machine("m1", size(2)), raise];
        let marked = marked("c", "d", &reservations).unwrap();
        assert_eq!(
            cpu(&marked),
            Quantity::from_units(2),
            "its changes are not Machines"
        );
        assert!(
            Room::find("c", "d", &[], &reservations, (4, &size(2)))
                .unwrap()
                .is_none(),
            "no room before the deployment is counted"
        );
        // Counted at 3 with one member, raised to 4 since: room for 2 besides the marked one.
        let counted = entry(3, size(2));
        let room = Room::find(
            "c",
            "d",
            std::slice::from_ref(&counted),
            &reservations[2..],
            (4, &size(2)),
        )
        .unwrap()
        .unwrap();
        assert_eq!(cpu(&room.nominal), Quantity::from_units(8));
        assert!(admits_from_room(&room, &marked, &times(&size(2), 2)).unwrap());
        assert!(!admits_from_room(&room, &marked, &times(&size(2), 3)).unwrap());
        // A deployment whose UID begins like this one's is another.
        assert_eq!(changes_of("c", "d-2", &reservations).count(), 0);
    }

    #[test]
    fn a_change_holds_its_raise_and_what_the_ledger_does_not_cover() {
        let growth = |counted: Option<&AutoscaledDeployment>,
                      reservations: &[Reservation],
                      old: Option<u32>,
                      max: u32| {
            let two = size(2);
            cpu(&change_growth(
                counted,
                ("c", "d"),
                reservations,
                old.map(|o| (o, &two)),
                (max, &two),
            )
            .unwrap())
        };
        assert_eq!(
            growth(None, &[], None, 6),
            Quantity::from_units(12),
            "a create: all of max"
        );
        let counted = entry(4, times(&size(2), 3));
        assert_eq!(
            growth(Some(&counted), &[], Some(4), 6),
            Quantity::from_units(4),
            "a raise by 2"
        );
        assert_eq!(
            growth(Some(&counted), &[], Some(4), 2),
            Quantity::ZERO,
            "lowering"
        );
        // Lowered to 1 since the count, raised to 5 now: the counted room of 4 is not there.
        assert_eq!(growth(Some(&counted), &[], Some(1), 5), Quantity::from_units(8));
        // Raised to 6 before (not counted yet), raised to 7 now: one more.
        let pending = [change(Some("7"), &times(&size(2), 2), 6)];
        assert_eq!(
            growth(Some(&counted), &pending, Some(6), 7),
            Quantity::from_units(2)
        );
        // Not counted at all, but existing with 5: all of the new nominal size.
        assert_eq!(growth(None, &[], Some(5), 6), Quantity::from_units(12));
        // A bigger template: the whole nominal size at the new size, less the counted one.
        let three = size(3);
        let bigger =
            change_growth(Some(&counted), ("c", "d"), &[], Some((4, &size(2))), (4, &three)).unwrap();
        assert_eq!(cpu(&bigger), Quantity::from_units(4));
    }

    #[test]
    fn a_change_is_counted_by_a_count_of_a_later_version() {
        let create = change(None, &size(2), 1);
        assert!(change_is_counted("d", "1", &create));
        let raise = change(Some("10"), &size(2), 2);
        assert!(
            !change_is_counted("d", "9", &raise),
            "a view from before the change"
        );
        assert!(
            !change_is_counted("d", "10", &raise),
            "the version the change was made on"
        );
        assert!(change_is_counted("d", "11", &raise));
        assert!(
            !change_is_counted("d", "x", &raise),
            "not a number: it expires instead"
        );
        assert!(!change_is_counted("e", "11", &raise), "another deployment's");
        assert!(
            !change_is_counted("d", "11", &machine("m", size(2))),
            "a Machine's"
        );
    }
}
