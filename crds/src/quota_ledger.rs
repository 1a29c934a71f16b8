//! `QuotaLedger` (`kkp-quota.dev/v1alpha1`, cluster-scoped, on every seed): one per project
//! quota and seed, with the same name and subject labels as KKP's `ResourceQuota`. It holds what
//! KKP's object cannot: the full limits (with gpu and machine count), this seed's usage of every
//! resource, the other seeds' usage, and the admission ledger (reservations and allotments).
//!
//! Owners: master-controller applies `spec` and writes `status.otherSeedsUsage`; seed-controller
//! writes `status.localUsage` and removes counted reservations and expired allotments; machine-webhook adds reservations and keeps its own
//! allotment. The last two write by compare-and-swap on `resourceVersion` (docs/architecture.md).
//! master-controller creates it with the quota and deletes it with the quota.

use std::collections::BTreeMap;

use jiff::Timestamp;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ledger::{Allotment, Reservation, ReservationGroup};
use crate::quota::Subject;
use crate::resources::ResourceDetails;
use crate::rollout::{RolloutAllowance, RolloutSurge};

/// This project's API group.
pub const GROUP: &str = "kkp-quota.dev";
/// The version of every object in [`GROUP`].
pub const VERSION: &str = "v1alpha1";

/// The ledger format this build reads and writes (`status.formatVersion`). A reader refuses a
/// ledger with a newer format (it may hold entries it would not count); see docs/architecture.md,
/// "Ledger format", for how a format change is rolled out.
pub const LEDGER_FORMAT: u32 = 1;

/// master-controller's finalizer on every ledger it applies, removed only when it deletes the
/// ledger itself (its quota is gone): a ledger deleted by hand, or by removing its CRD, stays
/// (Terminating) and keeps its reservations and allotments, instead of leaving the seed without
/// an admission ledger.
pub const LEDGER_FINALIZER: &str = "kkp-quota.dev/ledger-protection";

/// One project quota as one seed enforces it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "kkp-quota.dev",
    version = "v1alpha1",
    kind = "QuotaLedger",
    plural = "quotaledgers",
    shortname = "qledger",
    status = "QuotaLedgerStatus",
    printcolumn = r#"{"name":"Subject","type":"string","jsonPath":".spec.subject.name"}"#,
    printcolumn = r#"{"name":"CPU here","type":"string","jsonPath":".status.localUsage.cpu"}"#,
    printcolumn = r#"{"name":"CPU limit","type":"string","jsonPath":".spec.quota.cpu"}"#,
    printcolumn = r#"{"name":"Memory here","type":"string","jsonPath":".status.localUsage.memory"}"#,
    printcolumn = r#"{"name":"Memory limit","type":"string","jsonPath":".spec.quota.memory"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(oldSelf.shares) || (has(self.shares) && self.shares.version >= oldSelf.shares.version)",
    "message": "shares come from the master's record and never go back to an older version"
}]))]
pub struct QuotaLedgerSpec {
    /// The project. Immutable.
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "subject is immutable"}]))]
    pub subject: LedgerSubject,
    /// The effective limits (KKP's quota and the project's `ProjectQuota`, the lower of the two
    /// per resource); an absent resource is unlimited. Written by master-controller.
    #[serde(default)]
    pub quota: ResourceDetails,
    /// This seed's share of the quota, copied from the master's record (docs/shares.md).
    /// Absent: shares are not in force on this ledger (no master has granted any yet, or a
    /// master of a version without shares), and the webhook checks the global usage alone.
    /// Written by master-controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shares: Option<LedgerShares>,
    /// The project's rollout allowance, copied from its `ProjectQuota` (`crate::rollout`).
    /// Absent: no Machine is admitted over the limit. Written by master-controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_allowance: Option<RolloutAllowance>,
    /// The project's policy `reservedCounts`, copied from its `ProjectQuota`
    /// (`crate::autoscaled`): the room its cluster autoscalers may grow into counts as usage
    /// (in `status.localUsage`), and their Machines are admitted from it. Written by
    /// master-controller.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reserved_counts: bool,
}

/// A seed's share as the master's record holds it. The seed's share is
/// `granted - status.released`; it admits within `min(share, target, quota)`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LedgerShares {
    /// The version of the master's record these values come from; never goes back.
    pub version: u64,
    /// Everything ever granted to this seed (cumulative, only grows).
    #[serde(default)]
    pub granted: ResourceDetails,
    /// The share the master wants this seed to hold; the seed releases what it holds above
    /// `max(target, committed)`. An absent resource sets no ceiling.
    #[serde(default)]
    pub target: ResourceDetails,
    /// What the master's record says this seed has released at least: the seed counts
    /// `max(status.released, this)` as released, so a ledger re-created empty or restored from
    /// an older backup never holds share the master already counted as returned.
    #[serde(default, skip_serializing_if = "ResourceDetails::is_empty")]
    pub released: ResourceDetails,
    /// The share the master last saw each other seed hold, by seed name. For messages only: a
    /// change here alone does not make the master rewrite the ledger.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub others: BTreeMap<String, ResourceDetails>,
    /// The shared `QuotaGroup`s that bound the project (docs/groups.md), as the master last saw
    /// them: a request that fits the project's own quota but not a group's is refused naming the
    /// group, once its wait for share ends. Like `others`, a change here alone does not make the
    /// master rewrite the ledger; it refreshes them when this seed has a demand waiting.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<LedgerGroup>,
}

/// A group bounding the project, as a seed's ledger carries it ([`LedgerShares::groups`]).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LedgerGroup {
    /// The `QuotaGroup`'s name.
    pub name: String,
    /// Its limits; an absent resource is unlimited.
    #[serde(default)]
    pub quota: ResourceDetails,
    /// What the group's other projects use, as its status last summed them.
    #[serde(default)]
    pub others_usage: ResourceDetails,
    /// What the group's other projects hold of it as budget (granted and not given back), as
    /// its record last said: room this project's request may wait for and not get while they
    /// keep it. For denials only: a request refused after waiting for share names the group
    /// when this leaves it no room.
    #[serde(default, skip_serializing_if = "ResourceDetails::is_empty")]
    pub others_held: ResourceDetails,
}

impl LedgerShares {
    /// The master's word in it (version, grants, target), without `others`: two ledgers with
    /// the same word need no write, so a release on one seed does not make the master rewrite
    /// every other seed's ledger only to refresh a message.
    pub fn word(&self) -> MasterWord<'_> {
        MasterWord {
            version: self.version,
            granted: &self.granted,
            target: &self.target,
            released: &self.released,
        }
    }
}

/// What [`LedgerShares::word`] returns.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct MasterWord<'a> {
    pub version: u64,
    pub granted: &'a ResourceDetails,
    pub target: &'a ResourceDetails,
    pub released: &'a ResourceDetails,
}

/// The subject, as KKP's `ResourceQuota` names it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct LedgerSubject {
    /// The project ID.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Only `project` exists.
    #[serde(default = "project_kind")]
    #[schemars(extend("enum" = ["project"]))]
    pub kind: String,
}

fn project_kind() -> String {
    crate::quota::PROJECT_KIND.to_owned()
}

impl From<&Subject> for LedgerSubject {
    fn from(s: &Subject) -> LedgerSubject {
        LedgerSubject {
            name: s.name.clone(),
            kind: s.kind.clone(),
        }
    }
}

impl LedgerSubject {
    pub fn project(name: impl Into<String>) -> LedgerSubject {
        LedgerSubject {
            name: name.into(),
            kind: project_kind(),
        }
    }
}

/// Each field has exactly one writer (docs/architecture.md, "Objects and who writes what").
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotaLedgerStatus {
    /// The format of this status ([`LEDGER_FORMAT`]); absent means 1. Written with every
    /// ledger write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format_version: Option<u32>,
    /// Usage summed over every seed, as older master-controllers wrote it; read only where
    /// `otherSeedsUsage` is missing. The master now removes it: readers add this seed's
    /// `localUsage` to `otherSeedsUsage`, so one seed's usage change rewrites only the other
    /// seeds' ledgers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_usage: Option<ResourceDetails>,
    /// Usage on this seed. Written by seed-controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_usage: Option<ResourceDetails>,
    /// What this seed's cluster autoscalers may still add to the project: per `MachineDeployment`
    /// with autoscaling bounds, `(max - replicas) x` its Machines' size (`crate::reserved`).
    /// Shown, not counted in `localUsage` nor admitted against (docs/capacity.md). Written by
    /// seed-controller, with `localUsage`; absent from ledgers of older writers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_usage: Option<ResourceDetails>,
    /// Every autoscaled `MachineDeployment` of the project on this seed as last counted: its
    /// maximum, its template's size and its counted Machines (`crate::autoscaled`). The webhook
    /// admits a deployment's Machines from its room by these under `spec.reservedCounts`.
    /// Written by seed-controller, with `localUsage`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub autoscaled: Vec<crate::autoscaled::AutoscaledDeployment>,
    /// The usage of every other seed as the master last folded it, so that the webhook can add
    /// this seed's own, fresher `localUsage`. Written by master-controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other_seeds_usage: Option<ResourceDetails>,
    /// Machines admitted by the webhook and not yet counted in `localUsage`. Added by
    /// machine-webhook, removed by seed-controller when it counts the Machine, both with writes
    /// conditioned on `resourceVersion`. Written as groups: one entry per cluster, size and
    /// time, listing the UIDs of the Machines admitted so.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "crate::ledger::grouped"
    )]
    #[schemars(with = "Vec<ReservationGroup>")]
    pub reservations: Vec<Reservation>,
    /// Headroom held by webhook processes, each admitting from its own without a write per
    /// Machine. Written by machine-webhook (its holder); expired ones are removed by
    /// seed-controller.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allotments: Vec<Allotment>,
    /// Share this seed gave back to the master (cumulative, only grows). Written by
    /// seed-controller, in the same compare-and-swap as `localUsage`, so that nothing is admitted
    /// against share on its way out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released: Option<ResourceDetails>,
    /// Requests for more share, one per webhook process with requests that fit the project's
    /// global headroom but not this seed's share (or not beside other processes' allotments).
    /// The master grants towards the largest; other holders give their allotments back. Each
    /// holder writes its own entry; seed-controller removes expired ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub demands: Vec<ShareDemand>,
    /// Machines on this seed that were sized once and can no longer be (their size catalog entry
    /// was removed, their flavour renamed): counted in `localUsage` at the size they last had
    /// until they are deleted, so that their room is not admitted again. Kept here so that a
    /// restarted seed-controller counts them the same. Written by seed-controller, in the same
    /// write as `localUsage`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub last_known_sizes: Vec<LastKnownSize>,
    /// Surge Machines admitted over the limit by the rollout allowance (`crate::rollout`), each
    /// until the Machine it replaces is gone. Added by machine-webhook with the surge's
    /// reservation, removed by seed-controller, both by compare-and-swap.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rollout_surges: Vec<RolloutSurge>,
}

/// A Machine counted at its last known size (`status.lastKnownSizes`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastKnownSize {
    /// Its user cluster (the `Cluster` on the seed).
    pub cluster: String,
    /// The Machine's UID.
    pub uid: String,
    /// `namespace/name` of the Machine, for people.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub machine: String,
    /// The size it is counted at: the one it had when it could last be sized.
    pub size: ResourceDetails,
}

/// One webhook process's request for more share.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShareDemand {
    /// The webhook process asking (as in `allotments[].holder`).
    pub holder: String,
    /// The share wanted, absolute: what this seed had committed plus the request that did not
    /// fit, per limited resource (absolute, so a demand read twice asks for the same thing).
    pub amount: ResourceDetails,
    /// Renewed while requests wait; after it, the demand no longer counts. By the writer's clock:
    /// readers that find `ttlSeconds` judge by that instead (other clocks may be skewed).
    #[schemars(with = "String")]
    pub expires_at: Timestamp,
    /// The lifetime the writer meant (`expiresAt` minus the writer's clock at the write): a
    /// reader counts the demand live for this long after it first saw this `expiresAt`, by its
    /// own clock (`kkp_quota_crds::ledger::lifetimes`). Absent (older writers): `expiresAt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
}

impl QuotaLedger {
    /// The project this ledger belongs to.
    pub fn project(&self) -> &str {
        &self.spec.subject.name
    }
}

impl QuotaLedgerStatus {
    /// Whether this build can read the status: its format is not newer than [`LEDGER_FORMAT`].
    pub fn format_supported(&self) -> Result<(), UnsupportedFormat> {
        match self.format_version {
            Some(v) if v > LEDGER_FORMAT => Err(UnsupportedFormat(v)),
            _ => Ok(()),
        }
    }
}

/// A ledger written by a newer version of this system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the quota ledger has format {0}, newer than the {LEDGER_FORMAT} this version understands; upgrade this component"
)]
pub struct UnsupportedFormat(pub u32);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newer_format_is_refused_and_an_absent_one_is_the_first() {
        let mut s = QuotaLedgerStatus::default();
        assert!(s.format_supported().is_ok());
        s.format_version = Some(LEDGER_FORMAT);
        assert!(s.format_supported().is_ok());
        s.format_version = Some(LEDGER_FORMAT + 1);
        assert_eq!(s.format_supported(), Err(UnsupportedFormat(LEDGER_FORMAT + 1)));
    }
}
