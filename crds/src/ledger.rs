//! The admission ledger in a seed's `QuotaLedger` status: what the webhook admitted that usage
//! does not count yet.
//!
//! - [`Reservation`]: one admitted Machine. On the wire, reservations that share cluster, sizes
//!   and time are one [`ReservationGroup`] listing their Machines' UIDs: a burst of one
//!   `MachineDeployment` is one small entry, not hundreds, which keeps every ledger write (and
//!   every API server's decoding, validating and watching of it) cheap.
//! - [`Allotment`]: headroom one webhook process holds so that it can admit without a write per
//!   Machine; what it admits from it is inside `granted` until it records those Machines as
//!   reservations (moving their size out of `granted` in the same write).
//!
//! Both are written with compare-and-swap on `resourceVersion` and survive any restart, so an
//! admitted Machine is always covered by something in the API server.

use std::collections::HashMap;

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::resources::ResourceDetails;

pub mod lifetimes;

/// One admitted Machine, reserved until seed-controller counts it or the reservation expires.
/// In memory only; see [`ReservationGroup`] for how it is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// The user cluster (KKP cluster ID) the Machine is in.
    pub cluster: String,
    /// The Machine's UID as the API server assigned it before admission.
    pub uid: String,
    /// The Machine's full size once admitted; it is counted when usage sees this size.
    pub size: ResourceDetails,
    /// What this admission added to the project's usage (the whole size for a create, the
    /// growth for an update).
    pub reserved: ResourceDetails,
    /// When the webhook admitted it; used for expiry.
    pub created_at: Timestamp,
    /// The autoscaled `MachineDeployment` (UID) whose counted room admitted it, under the policy
    /// `reservedCounts` (`crate::autoscaled`); its `reserved` is then zero. A deployment's own
    /// create or raise names itself.
    pub deployment: Option<String>,
}

/// Reservations as written in `status.reservations`: the Machines (by UID) of one user cluster
/// admitted at the same size, growth and time (and from the same deployment's room).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReservationGroup {
    /// The user cluster (KKP cluster ID) the Machines are in.
    pub cluster: String,
    /// Each Machine's full size once admitted; a Machine is counted when usage sees this size.
    pub size: ResourceDetails,
    /// What each admission added to the project's usage (the whole size for a create, the
    /// growth for an update).
    pub reserved: ResourceDetails,
    /// When the webhook admitted (or recorded) them; used for expiry.
    #[schemars(with = "String")]
    pub created_at: Timestamp,
    /// The autoscaled `MachineDeployment` (UID) whose room admitted them (`crate::autoscaled`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment: Option<String>,
    /// The Machines' UIDs, as the API server assigned them before admission.
    pub uids: Vec<String>,
}

/// What reservations are grouped by on the wire: cluster, sizes, time and deployment.
type GroupKey<'a> = (
    &'a str,
    &'a ResourceDetails,
    &'a ResourceDetails,
    Timestamp,
    Option<&'a str>,
);

/// `reservations` grouped for the wire, groups in order of their first reservation, UIDs in
/// order within each group.
pub fn group(reservations: &[Reservation]) -> Vec<ReservationGroup> {
    let mut groups: Vec<ReservationGroup> = Vec::new();
    let mut index: HashMap<GroupKey<'_>, usize> = HashMap::new();
    for r in reservations {
        let key = (
            r.cluster.as_str(),
            &r.size,
            &r.reserved,
            r.created_at,
            r.deployment.as_deref(),
        );
        if let Some(&i) = index.get(&key) {
            groups[i].uids.push(r.uid.clone());
        } else {
            index.insert(key, groups.len());
            groups.push(ReservationGroup {
                cluster: r.cluster.clone(),
                size: r.size.clone(),
                reserved: r.reserved.clone(),
                created_at: r.created_at,
                deployment: r.deployment.clone(),
                uids: vec![r.uid.clone()],
            });
        }
    }
    groups
}

/// One [`Reservation`] per UID of every group, in order.
pub fn ungroup(groups: &[ReservationGroup]) -> Vec<Reservation> {
    groups
        .iter()
        .flat_map(|g| {
            g.uids.iter().map(|uid| Reservation {
                cluster: g.cluster.clone(),
                uid: uid.clone(),
                size: g.size.clone(),
                reserved: g.reserved.clone(),
                created_at: g.created_at,
                deployment: g.deployment.clone(),
            })
        })
        .collect()
}

/// `#[serde(with = "grouped")]` for a `Vec<Reservation>` written as groups.
pub mod grouped {
    use super::{
        Deserialize, Deserializer, Reservation, ReservationGroup, Serialize, Serializer, group, ungroup,
    };

    pub fn serialize<S: Serializer>(reservations: &[Reservation], serializer: S) -> Result<S::Ok, S::Error> {
        group(reservations).serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<Reservation>, D::Error> {
        Ok(ungroup(&Vec::<ReservationGroup>::deserialize(deserializer)?))
    }
}

/// Headroom held by one webhook process (escrow). Only its holder changes it; seed-controller
/// removes it once `expiresAt` has passed and none of the project's clusters is unsettled.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Allotment {
    /// The webhook process holding it (a fresh identity on every start, so a restarted process
    /// never reuses headroom its predecessor may have admitted Machines from).
    pub holder: String,
    /// What the holder may admit without another write; Machines admitted from it stay inside
    /// it until recorded as reservations.
    pub granted: ResourceDetails,
    /// The holder renews it before this; after it, the holder admits nothing more from it. By
    /// the holder's clock: readers that find `ttlSeconds` judge by that instead.
    #[schemars(with = "String")]
    pub expires_at: Timestamp,
    /// The lifetime the holder meant (`expiresAt` minus the holder's clock at the write):
    /// seed-controller removes the allotment only this long after it first saw this
    /// `expiresAt`, by its own clock (`kkp_quota_crds::ledger::lifetimes`), so a clock ahead of
    /// the holder's never drops it while in use. Absent (older writers): `expiresAt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
}

/// What seed-controller appends to the holder of an allotment it carries from a deleted ledger
/// into its successor (`seed-controller/src/succession.rs`). No live process takes the carried
/// entry for its own, so none removes it on its next write: it covers what was admitted before
/// the deletion for the whole admission record grace, whatever the holder remembers of that.
pub const CARRIED_SUFFIX: &str = "/carried";

/// `holder` as a carried entry names it ([`CARRIED_SUFFIX`], once).
pub fn carried_holder(holder: &str) -> String {
    if holder.ends_with(CARRIED_SUFFIX) {
        holder.to_owned()
    } else {
        format!("{holder}{CARRIED_SUFFIX}")
    }
}

/// The resources all allotments hold.
pub fn allotted_total(allotments: &[Allotment]) -> Result<ResourceDetails, crate::QuantityError> {
    ResourceDetails::checked_sum(allotments.iter().map(|a| &a.granted))
}

/// The resources all reservations hold.
pub fn reserved_total(reservations: &[Reservation]) -> Result<ResourceDetails, crate::QuantityError> {
    ResourceDetails::checked_sum(reservations.iter().map(|r| &r.reserved))
}

/// A holder list of a ledger's status (`allotments`, `demands`) as JSON for a merge patch:
/// `holder`'s entry replaced by `own` (removed when `None`), every other entry kept exactly as
/// read, and `null` when none remains (which removes the field).
pub fn with_own_entry(
    raw: &[serde_json::Value],
    holder: &str,
    own: Option<serde_json::Value>,
) -> serde_json::Value {
    let mut list: Vec<serde_json::Value> = raw
        .iter()
        .filter(|e| e.get("holder").and_then(serde_json::Value::as_str) != Some(holder))
        .cloned()
        .collect();
    list.extend(own);
    if list.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::Value::Array(list)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Quantity, Resource};
    use proptest::prelude::*;

    fn size(cpu: i64) -> ResourceDetails {
        let mut d = ResourceDetails::zero();
        d.set(Resource::Cpu, Some(Quantity::from_units(cpu)));
        d.set(Resource::Machines, Some(Quantity::from_units(1)));
        d
    }

    fn reservation(cluster: u8, uid: usize, cpu: i64, reserved: i64, secs: i64) -> Reservation {
        Reservation {
            cluster: format!("c{cluster}"),
            uid: format!("u{uid}"),
            size: size(cpu),
            reserved: size(reserved),
            created_at: Timestamp::from_second(1_800_000_000 + secs).unwrap(),
            deployment: None,
        }
    }

    #[test]
    fn a_holder_rewriting_its_entry_leaves_its_carried_one() {
        let entry = |holder: &str| serde_json::json!({"holder": holder, "granted": {"cpu": "1"}});
        let raw = [entry("me"), entry(&carried_holder("me")), entry("other")];
        let written = with_own_entry(&raw, "me", None);
        let holders: Vec<&str> = written
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["holder"].as_str())
            .collect();
        assert_eq!(holders, ["me/carried", "other"]);
        assert_eq!(carried_holder("me/carried"), "me/carried");
    }

    #[test]
    fn a_burst_of_one_cluster_is_one_group() {
        let rs: Vec<Reservation> = (0..50).map(|i| reservation(0, i, 4, 4, 0)).collect();
        let groups = group(&rs);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].uids.len(), 50);
        let json = serde_json::to_value(&groups).unwrap();
        assert_eq!(json[0]["uids"][49], "u49");
        assert_eq!(json[0]["size"]["cpu"], "4");
    }

    proptest! {
        /// Grouping loses nothing: ungrouping gives back every reservation, each group's
        /// members share cluster, sizes and time, and no two groups share all four.
        #[test]
        fn grouping_round_trips(
            entries in proptest::collection::vec((0u8..3, 1i64..4, 1i64..4, 0i64..3), 0..60),
        ) {
            let rs: Vec<Reservation> = entries
                .iter()
                .enumerate()
                .map(|(uid, (c, cpu, reserved, secs))| reservation(*c, uid, *cpu, *reserved, *secs))
                .collect();
            let groups = group(&rs);
            let mut back = ungroup(&groups);
            let mut expected = rs.clone();
            back.sort_by(|a, b| a.uid.cmp(&b.uid));
            expected.sort_by(|a, b| a.uid.cmp(&b.uid));
            prop_assert_eq!(&back, &expected);
            for (i, a) in groups.iter().enumerate() {
                for b in &groups[i + 1..] {
                    prop_assert!((&a.cluster, &a.size, &a.reserved, a.created_at) != (&b.cluster, &b.size, &b.reserved, b.created_at));
                }
            }
            // Through JSON as the status field carries it.
            let status = crate::QuotaLedgerStatus { reservations: rs.clone(), ..Default::default() };
            let parsed: crate::QuotaLedgerStatus = serde_json::from_value(serde_json::to_value(&status).unwrap()).unwrap();
            let mut parsed = parsed.reservations;
            parsed.sort_by(|a, b| a.uid.cmp(&b.uid));
            prop_assert_eq!(parsed, expected);
        }
    }
}
