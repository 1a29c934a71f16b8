//! The admission ledger in a seed quota copy's status: what the webhook admitted that usage
//! does not count yet.
//!
//! - [`Reservation`]: one admitted Machine, named.
//! - [`Allotment`]: headroom one webhook process holds so that it can admit without a write per
//!   Machine; what it admits from it is inside `granted` until it records those Machines as
//!   reservations (moving their size out of `granted` in the same write).
//!
//! Both are written with compare-and-swap on `resourceVersion` and survive any restart, so an
//! admitted Machine is always covered by something in the API server.

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::resources::ResourceDetails;

/// One admitted Machine, reserved until seed-controller counts it or the reservation expires.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Reservation {
    /// The user cluster (KKP cluster ID) the Machine is in.
    pub cluster: String,
    pub namespace: String,
    pub name: String,
    /// The Machine's UID as the API server assigned it before admission.
    pub uid: String,
    /// The Machine's full size once admitted; it is counted when usage sees this size.
    pub size: ResourceDetails,
    /// What this admission added to the project's usage (the whole size for a create, the
    /// growth for an update).
    pub reserved: ResourceDetails,
    /// When the webhook admitted it; used for expiry.
    #[schemars(with = "String")]
    pub created_at: Timestamp,
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
    /// The holder renews it before this; after it, the holder admits nothing more from it.
    #[schemars(with = "String")]
    pub expires_at: Timestamp,
}

/// The resources all allotments hold.
pub fn allotted_total(allotments: &[Allotment]) -> Result<ResourceDetails, crate::QuantityError> {
    ResourceDetails::checked_sum(allotments.iter().map(|a| &a.granted))
}

/// The resources all reservations hold.
pub fn reserved_total(reservations: &[Reservation]) -> Result<ResourceDetails, crate::QuantityError> {
    ResourceDetails::checked_sum(reservations.iter().map(|r| &r.reserved))
}
