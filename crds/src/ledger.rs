//! Admission reservations: Machines the webhook admitted that usage does not count yet.
//!
//! They live in the seed quota copy's status, so the decision and the reservation are one write
//! conditioned on `resourceVersion` (compare-and-swap), and they survive any restart.

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

/// The resources all reservations hold.
pub fn reserved_total(reservations: &[Reservation]) -> Result<ResourceDetails, crate::QuantityError> {
    ResourceDetails::checked_sum(reservations.iter().map(|r| &r.reserved))
}
