//! The rollout allowance: an admin's opt-in, per project quota, that lets a `MachineDeployment`
//! at full quota roll out with its surge Machine instead of stalling.
//!
//! A surge Machine that replaces a Machine of the same `MachineDeployment` (one of an older
//! `MachineSet`, at least as large in every resource) may be admitted although it does not fit,
//! when the project is not over its limit before it ([`surge_fits`]). So the project goes over
//! its limit by at most that one Machine, and only until the replaced Machine is gone: the
//! next surge finds the project over and waits. Each surge is recorded in the ledger's
//! `status.rolloutSurges` beside its reservation (machine-webhook, in the same
//! compare-and-swap), counted apart in metrics, and removed by seed-controller once the
//! replaced Machine or the surge itself is gone ([`ended`]). A surge older than
//! `overdueAfterSeconds` is reported (metric and alert); nothing is removed for it.
//!
//! Under shares each seed applies the rule to its own capacity, so with rollouts on several
//! seeds at once the project can be over by one surge Machine per seed. Under a shared quota
//! group that limits a resource the surge asks for, the allowance does not apply
//! ([`SurgeRefusal::Grouped`]): the seed's capacity lies within the project's budget of the
//! group, and a surge past it could take the group over a limit its admins never relaxed.

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::resources::{Resource, ResourceDetails};
use crate::{Quantity, QuantityError};

/// The bound a surge is reported overdue after, when the allowance does not say.
pub const DEFAULT_OVERDUE_AFTER_SECONDS: u64 = 1800;

/// `spec.rolloutAllowance` of a `ProjectQuota` (admins) and of every seed's `QuotaLedger`
/// (copied by master-controller). Absent: no Machine is ever admitted over the limit.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutAllowance {
    /// How long one surge Machine may keep the project over its limit before it is reported
    /// overdue (`kkp_quota_rollout_surge_overdue_at_seconds`, alert `KkpQuotaRolloutSurgeOverdue`).
    /// Nothing is removed when it is.
    #[serde(default = "default_overdue_after")]
    #[schemars(range(min = 1))]
    pub overdue_after_seconds: u64,
}

fn default_overdue_after() -> u64 {
    DEFAULT_OVERDUE_AFTER_SECONDS
}

impl Default for RolloutAllowance {
    fn default() -> RolloutAllowance {
        RolloutAllowance {
            overdue_after_seconds: DEFAULT_OVERDUE_AFTER_SECONDS,
        }
    }
}

/// One surge Machine admitted over the limit (`status.rolloutSurges` of a `QuotaLedger`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutSurge {
    /// The user cluster (the `Cluster` on the seed) of both Machines.
    pub cluster: String,
    /// The surge Machine's UID.
    pub uid: String,
    /// `namespace/name` of the surge Machine, for people.
    pub machine: String,
    /// `namespace/name` of its `MachineDeployment`.
    pub deployment: String,
    /// The UID of the Machine it replaces; the surge ends when that one is gone.
    pub replaces: String,
    /// `namespace/name` of the replaced Machine, for people.
    pub replaces_machine: String,
    /// What the surge added to the project's usage.
    pub size: ResourceDetails,
    /// When the webhook admitted it.
    #[schemars(with = "String")]
    pub admitted_at: Timestamp,
}

/// Why a surge cannot be admitted over the limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SurgeRefusal {
    /// The project (or, under shares, this seed) is already over the bound in a resource the
    /// surge asks for: another surge is still running, or usage is over for another reason.
    #[error(
        "the project is already over its limit of {0} (another surge Machine may not have replaced its Machine yet)"
    )]
    AlreadyOver(String),
    /// The replaced Machine is smaller than the surge in some resource: replacing it would not
    /// bring the project back under its limit.
    #[error("the Machine it replaces is smaller in {0}")]
    Larger(String),
    /// Only a new Machine can be a surge.
    #[error("only a new Machine can be a rollout surge")]
    NotACreate,
    /// A shared quota group bounds the project in a resource the surge asks for (the group
    /// names, joined): the allowance is the project's opt-in over its own limit, and a group's
    /// limit is its admins', who never opted in, so a surge under a group must fit it.
    #[error("the project is in quota group {0}, which admits no Machine over its limit")]
    Grouped(String),
    /// The ledger cannot be read.
    #[error("the quota ledger cannot be read: {0}")]
    Unreadable(String),
    /// The allowance is not on for the project.
    #[error("the project's quota has no rollout allowance")]
    NotAllowed,
    /// The Machine is not a surge replacing another of its `MachineDeployment`.
    #[error("{0}")]
    NoReplacement(String),
    /// What tells whether it is one could not be read (the message names what and why).
    #[error("{0}")]
    Lookup(String),
    /// The amounts cannot be compared exactly.
    #[error(transparent)]
    Quantity(#[from] QuantityError),
}

/// Whether a surge asking `growth`, replacing a Machine of size `replaced`, may be admitted
/// beside `committed` under `bound` (the limit beside everything in use, or under shares this
/// seed's capacity beside what it committed): the replaced Machine is at least as large in every
/// resource, and nothing the surge asks for is over the bound already. Absent bounds are
/// unlimited.
pub fn surge_fits(
    bound: &ResourceDetails,
    committed: &ResourceDetails,
    growth: &ResourceDetails,
    replaced: &ResourceDetails,
) -> Result<(), SurgeRefusal> {
    let smaller: Vec<&str> = Resource::ALL
        .iter()
        .filter(|&&r| growth.amount(r) > replaced.amount(r))
        .map(|r| r.name())
        .collect();
    if !smaller.is_empty() {
        return Err(SurgeRefusal::Larger(smaller.join(", ")));
    }
    let over: Vec<String> = Resource::ALL
        .iter()
        .filter(|&&r| growth.amount(r) > Quantity::ZERO)
        .filter_map(|&r| bound.get(r).map(|limit| (r, limit)))
        .filter(|&(r, limit)| committed.amount(r) > limit)
        .map(|(r, limit)| r.describe(limit))
        .collect();
    if !over.is_empty() {
        return Err(SurgeRefusal::AlreadyOver(over.join(", ")));
    }
    Ok(())
}

/// Where a Machine named by a surge stands, as seed-controller sees its cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// Counted now.
    There,
    /// Seen deleted, or absent from a cluster watched in full.
    Gone,
    /// Not known: the cluster is not watched in full (unsettled, not listed yet), or the
    /// Machine may not have appeared yet.
    Unknown,
}

/// The surges that have ended, by index: their replaced Machine is gone, or the surge Machine
/// itself is (deleted: the rollout went back; or never created). `replaced` tells where a
/// replaced Machine of a cluster stands, `surge_gone` whether a surge Machine is gone (one not
/// seen yet may still appear while its reservation lasts: not gone).
pub fn ended(
    surges: &[RolloutSurge],
    replaced: impl Fn(&str, &str) -> Presence,
    surge_gone: impl Fn(&str, &str) -> bool,
) -> Vec<usize> {
    surges
        .iter()
        .enumerate()
        .filter(|(_, s)| {
            replaced(&s.cluster, &s.replaces) == Presence::Gone || surge_gone(&s.cluster, &s.uid)
        })
        .map(|(i, _)| i)
        .collect()
}

/// What the surges add over the limit together.
pub fn surge_total(surges: &[RolloutSurge]) -> Result<ResourceDetails, QuantityError> {
    ResourceDetails::checked_sum(surges.iter().map(|s| &s.size))
}

/// When the oldest surge was admitted, if any.
pub fn oldest(surges: &[RolloutSurge]) -> Option<Timestamp> {
    surges.iter().map(|s| s.admitted_at).min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::cpu;

    fn surge(cluster: &str, uid: &str, replaces: &str) -> RolloutSurge {
        RolloutSurge {
            cluster: cluster.into(),
            uid: uid.into(),
            machine: format!("kube-system/{uid}"),
            deployment: "kube-system/workers".into(),
            replaces: replaces.into(),
            replaces_machine: format!("kube-system/{replaces}"),
            size: cpu(2),
            admitted_at: crate::fixtures::at(0),
        }
    }

    #[test]
    fn a_surge_fits_only_at_or_under_the_bound_and_only_replacing_a_machine_as_large() {
        // At the limit exactly: the surge may go over by itself.
        assert_eq!(surge_fits(&cpu(16), &cpu(16), &cpu(2), &cpu(2)), Ok(()));
        assert_eq!(surge_fits(&cpu(16), &cpu(10), &cpu(2), &cpu(4)), Ok(()));
        // Already over (a running surge): refused.
        assert!(matches!(
            surge_fits(&cpu(16), &cpu(18), &cpu(2), &cpu(2)),
            Err(SurgeRefusal::AlreadyOver(_))
        ));
        // Replacing a smaller Machine would leave the project over: refused.
        assert!(matches!(
            surge_fits(&cpu(16), &cpu(16), &cpu(4), &cpu(2)),
            Err(SurgeRefusal::Larger(_))
        ));
        // Over in a resource the surge does not ask for: not its concern.
        let mut bound = cpu(16);
        bound.set(Resource::Memory, Some("8Gi".parse().unwrap()));
        let mut committed = cpu(16);
        committed.set(Resource::Memory, Some("9Gi".parse().unwrap()));
        assert_eq!(surge_fits(&bound, &committed, &cpu(2), &cpu(2)), Ok(()));
        // Unlimited resources bound nothing.
        assert_eq!(
            surge_fits(&ResourceDetails::default(), &cpu(99), &cpu(2), &cpu(2)),
            Ok(())
        );
    }

    #[test]
    fn a_surge_ends_when_its_replaced_machine_or_itself_is_gone_and_not_before() {
        let surges = [
            surge("a", "new1", "old1"),
            surge("a", "new2", "old2"),
            surge("b", "new3", "old3"),
        ];
        let replaced = |cluster: &str, uid: &str| match (cluster, uid) {
            ("a", "old1") => Presence::Gone,
            ("a", "old2") => Presence::There,
            _ => Presence::Unknown,
        };
        assert_eq!(ended(&surges, replaced, |_, _| false), vec![0]);
        assert_eq!(
            ended(&surges, replaced, |c, uid| (c, uid) == ("b", "new3")),
            vec![0, 2]
        );
        assert_eq!(
            surge_total(&surges).unwrap().amount(Resource::Cpu),
            Quantity::from_units(6)
        );
        assert_eq!(oldest(&surges), Some(crate::fixtures::at(0)));
        assert_eq!(oldest(&[]), None);
    }

    #[test]
    fn an_allowance_written_empty_has_the_default_bound() {
        let allowance: RolloutAllowance = serde_json::from_str("{}").unwrap();
        assert_eq!(allowance.overdue_after_seconds, DEFAULT_OVERDUE_AFTER_SECONDS);
    }
}
