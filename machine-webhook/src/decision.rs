//! The admission decision: pure functions over plain data, no I/O.
//!
//! For a Machine of project P the webhook reads the seed's copy of P's quota and computes
//!
//! ```text
//! in use = otherSeedsUsage + localUsage + sum(reservations[].reserved) + sum(allotments[].granted)
//! ```
//!
//! (`otherSeedsUsage` missing: `globalUsage - localUsage`, floored at zero). A webhook process
//! deciding for itself counts, instead of its own allotment, only what it admitted from it
//! ([`QuotaState::for_holder`]). A request fits when,
//! for every limited resource it asks for, `in use + request <= limit`. Deletes and changes that
//! grow nothing always pass, even over quota; a project without a quota always passes.
//!
//! Where the master has given the seed a share of the quota (`spec.shares`, docs/shares.md), a
//! request must also fit the seed's own capacity: `localUsage + reservations + allotments +
//! request <= min(share, target, limit)` ([`kkp_quota_crds::shares::fits_within`], the same test
//! the allotments use one level down). One that fits the quota but not the share is
//! [`Reason::ShareInTransit`]: the verdict carries the share to ask the master for.

use std::fmt;

use std::collections::BTreeMap;

use kkp_quota_crds::ledger::{allotted_total, reserved_total};
use kkp_quota_crds::shares::{self, SeedShare};
use kkp_quota_crds::{Exceeded, QuotaLedger, QuotaLedgerSpec, QuotaLedgerStatus, Resource, ResourceDetails};

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
}

/// What this seed may commit under its share, and who holds the rest.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SeedCapacity {
    /// `min(share, target, limit)` per limited resource.
    pub capacity: ResourceDetails,
    /// The share other seeds hold, as the master last saw it (for messages).
    pub others: BTreeMap<String, ResourceDetails>,
}

/// The ledger cannot be read: amounts that cannot be added up exactly, or a format newer than
/// this build understands (it might hold entries this build would not count).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the quota ledger cannot be read: {0}")]
pub struct StateError(String);

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
        let status = status.cloned().unwrap_or_default();
        status.format_supported().map_err(|e| StateError(e.to_string()))?;
        let seed = shares::objects::seed_share(spec, Some(&status)).map(|share: SeedShare| SeedCapacity {
            capacity: share.capacity(&spec.quota),
            others: spec.shares.as_ref().map(|s| s.others.clone()).unwrap_or_default(),
        });
        let local_usage = status.local_usage.unwrap_or_default();
        let other_seeds_usage = match status.other_seeds_usage {
            Some(other) => other,
            None => status
                .global_usage
                .unwrap_or_default()
                .saturating_sub(&local_usage),
        };
        let reserved = reserved_total(&status.reservations).map_err(|e| StateError(e.to_string()))?;
        let allotted = allotted_total(&status.allotments).map_err(|e| StateError(e.to_string()))?;
        Ok(QuotaState {
            limit: spec.quota.clone(),
            other_seeds_usage,
            local_usage,
            reserved,
            allotted,
            seed,
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
        state.reserved = state
            .reserved
            .checked_add(admitted_from_own)
            .map_err(|e| StateError(e.to_string()))?;
        Ok(state)
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
            return Ok(crate::escrow::grant_for(&seed.capacity, &committed));
        }
        let in_use = self.in_use()?.checked_add(extra_admitted).map_err(err)?;
        Ok(crate::escrow::grant_for(&self.limit, &in_use))
    }
}

/// What one Machine admission asks of the quota.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ask {
    /// A new Machine of this size.
    Create(ResourceDetails),
    /// A Machine whose size changes; `old` is `None` when the old object could not be sized
    /// (it then counts as nothing, as usage counts it).
    Update {
        old: Option<ResourceDetails>,
        new: ResourceDetails,
    },
    /// A change that does not touch the size (metadata, status, finalizers).
    Unchanged,
    /// A delete.
    Delete,
    /// The Machine cannot be sized; the text is provider-sizes' actionable message.
    Unsizeable(String),
}

impl Ask {
    /// What admitting it adds to the project's usage, or `None` when it adds nothing.
    pub fn growth(&self) -> Option<ResourceDetails> {
        let growth = match self {
            Ask::Create(size) => size.clone(),
            Ask::Update { old: None, new } => new.clone(),
            Ask::Update { old: Some(old), new } => old.growth_to(new),
            Ask::Unchanged | Ask::Delete | Ask::Unsizeable(_) => return None,
        };
        (!growth.is_empty()).then_some(growth)
    }

    /// The Machine's full size after admission, when known.
    pub fn new_size(&self) -> Option<&ResourceDetails> {
        match self {
            Ask::Create(size) | Ask::Update { new: size, .. } => Some(size),
            _ => None,
        }
    }

    fn is_update(&self) -> bool {
        matches!(self, Ask::Update { .. })
    }
}

/// Why a request was allowed or denied (bounded: used as a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// It fits in the quota.
    Fits,
    /// The project has no quota.
    NoQuota,
    /// A delete or a change that grows nothing.
    Reduction,
    /// A change that does not touch the size.
    Unchanged,
    /// It does not fit.
    QuotaExceeded,
    /// It fits the quota, but not the share this seed holds; the rest of the quota is held by
    /// other seeds (or not granted yet) and has to move here first.
    ShareInTransit,
    /// The Machine cannot be sized.
    Unsizeable,
    /// The request names a user cluster this seed does not know.
    UnknownCluster,
    /// The request could not be read.
    BadRequest,
    /// The decision or its reservation failed (conflicts, API errors, overflow).
    Error,
}

impl Reason {
    pub const ALL: &'static [Reason] = &[
        Reason::Fits,
        Reason::NoQuota,
        Reason::Reduction,
        Reason::Unchanged,
        Reason::QuotaExceeded,
        Reason::ShareInTransit,
        Reason::Unsizeable,
        Reason::UnknownCluster,
        Reason::BadRequest,
        Reason::Error,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Fits => "fits",
            Reason::NoQuota => "no_quota",
            Reason::Reduction => "reduction",
            Reason::Unchanged => "unchanged",
            Reason::QuotaExceeded => "quota_exceeded",
            Reason::ShareInTransit => "share_in_transit",
            Reason::Unsizeable => "unsizeable",
            Reason::UnknownCluster => "unknown_cluster",
            Reason::BadRequest => "bad_request",
            Reason::Error => "error",
        }
    }

    /// The CamelCase word for Kubernetes `Status.reason` and Event reasons.
    pub const fn camel(self) -> &'static str {
        match self {
            Reason::Fits => "Fits",
            Reason::NoQuota => "NoQuota",
            Reason::Reduction => "Reduction",
            Reason::Unchanged => "Unchanged",
            Reason::QuotaExceeded => "QuotaExceeded",
            Reason::ShareInTransit => "QuotaShareInTransit",
            Reason::Unsizeable => "Unsizeable",
            Reason::UnknownCluster => "UnknownCluster",
            Reason::BadRequest => "BadRequest",
            Reason::Error => "QuotaCheckFailed",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What to reserve for an admitted Machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserve {
    /// The Machine's full size once admitted.
    pub size: ResourceDetails,
    /// What this admission adds: the size for a create, the growth for an update.
    pub reserved: ResourceDetails,
}

/// The answer to one admission request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    pub reason: Reason,
    /// For denials: the message shown to whoever created the Machine.
    pub message: Option<String>,
    /// For denials: the same without the Machine's own name (generated names differ on every
    /// retry of a `MachineSet`), for the Event on the owner.
    pub event_message: Option<String>,
    /// Admission warnings (quota lowered below usage, ...).
    pub warnings: Vec<String>,
    /// For allowed requests that grow usage under a quota: the reservation to write.
    pub reserve: Option<Reserve>,
    /// For [`Reason::ShareInTransit`]: the share this seed should hold for the request to fit
    /// (absolute: what it committed plus the request).
    pub wants_share: Option<ResourceDetails>,
}

impl Verdict {
    pub fn allow(reason: Reason) -> Verdict {
        Verdict {
            allowed: true,
            reason,
            message: None,
            event_message: None,
            warnings: Vec::new(),
            reserve: None,
            wants_share: None,
        }
    }

    /// A denial; `detail` is the sentence after `machine "<name>"`.
    pub fn deny(reason: Reason, machine: &str, detail: &str) -> Verdict {
        Verdict {
            allowed: false,
            reason,
            message: Some(format!("machine {machine:?} {detail}")),
            event_message: Some(format!("a Machine {detail}")),
            warnings: Vec::new(),
            reserve: None,
            wants_share: None,
        }
    }

    #[must_use]
    pub fn with_warnings(mut self, warnings: Vec<String>) -> Verdict {
        self.warnings = warnings;
        self
    }
}

/// One request as the decision sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The Machine's name (for messages).
    pub machine: String,
    pub ask: Ask,
    /// Dry-run requests are decided but add nothing for later requests.
    pub dry_run: bool,
}

/// "a", "a and b", "a, b and c".
fn join_human(parts: &[String]) -> String {
    match parts {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// The sentence naming every resource that does not fit, in the quota's units:
/// `needs 4 cpu and 2Gi memory, project "x8k2" uses 14 of 16 cpu and 31Gi of 32Gi memory`.
pub fn exceeded_detail(project: &str, exceeded: &[Exceeded], update: bool) -> String {
    let needs: Vec<String> = exceeded
        .iter()
        .map(|e| {
            if update {
                format!("{} more {}", e.resource.amount(e.requested), e.resource.name())
            } else {
                e.resource.describe(e.requested)
            }
        })
        .collect();
    let uses: Vec<String> = exceeded
        .iter()
        .map(|e| {
            format!(
                "{} of {}",
                e.resource.amount(e.used),
                e.resource.describe(e.limit)
            )
        })
        .collect();
    format!(
        "needs {}, project {project:?} uses {}",
        join_human(&needs),
        join_human(&uses)
    )
}

/// Warnings for a project whose usage is already above its quota (the quota was lowered).
pub fn over_quota_warnings(project: &str, state: &QuotaState) -> Vec<String> {
    // Headroom held in allotments is not usage: it never makes a project "over".
    let Ok(in_use) = state.used() else {
        return Vec::new();
    };
    let over: Vec<Resource> = state.limit.overrun_by(&in_use);
    if over.is_empty() {
        return Vec::new();
    }
    let uses: Vec<String> = over
        .iter()
        .map(|&r| {
            format!(
                "{} of {}",
                r.amount(in_use.amount(r)),
                r.describe(state.limit.amount(r))
            )
        })
        .collect();
    vec![format!(
        "project {project:?} is over its resource quota: it uses {}; new Machines that need {} are denied until usage is back under the quota",
        join_human(&uses),
        join_human(&over.iter().map(|r| r.name().to_owned()).collect::<Vec<_>>())
    )]
}

/// Decides one request. `quota` is `None` when the project has no quota.
pub fn decide(project: &str, quota: Option<&QuotaState>, request: &Request) -> Verdict {
    let warnings = quota
        .map(|state| over_quota_warnings(project, state))
        .unwrap_or_default();
    let verdict = match (&request.ask, quota) {
        (Ask::Delete, _) => Verdict::allow(Reason::Reduction),
        (Ask::Unchanged, _) => Verdict::allow(Reason::Unchanged),
        (Ask::Create(_) | Ask::Update { .. }, _) if request.ask.growth().is_none() => {
            Verdict::allow(Reason::Reduction)
        }
        (_, None) => Verdict::allow(Reason::NoQuota),
        (Ask::Unsizeable(why), Some(_)) => Verdict::deny(
            Reason::Unsizeable,
            &request.machine,
            &format!(
                "cannot be sized, so it cannot be checked against the resource quota of project {project:?}: {why}"
            ),
        ),
        (ask, Some(state)) => match ask.growth() {
            None => Verdict::allow(Reason::Reduction),
            Some(growth) => decide_growth(project, state, &request.machine, ask, growth),
        },
    };
    verdict.with_warnings(warnings)
}

fn decide_growth(
    project: &str,
    state: &QuotaState,
    machine: &str,
    ask: &Ask,
    growth: ResourceDetails,
) -> Verdict {
    // Under shares, what fits the seed's capacity is admitted whatever the other seeds' usage
    // (as last folded, possibly stale) says: the shares alone keep the sum within the limit, and
    // the seed keeps admitting within its share while the master is away.
    if let (Some(_), Ok(None)) = (&state.seed, seed_shortfall(state, &growth)) {
        return Verdict {
            reserve: Some(Reserve {
                size: ask.new_size().cloned().unwrap_or_default(),
                reserved: growth,
            }),
            ..Verdict::allow(Reason::Fits)
        };
    }
    let exceeded = state
        .in_use()
        .map_err(|e| e.to_string())
        .and_then(|used| state.limit.exceeded_by(&used, &growth).map_err(|e| e.to_string()));
    match exceeded {
        Err(why) => Verdict::deny(
            Reason::Error,
            machine,
            &format!("cannot be checked against the resource quota of project {project:?}: {why}"),
        ),
        Ok(exceeded) if exceeded.is_empty() => match seed_shortfall(state, &growth) {
            Err(why) => Verdict::deny(
                Reason::Error,
                machine,
                &format!("cannot be checked against the resource quota of project {project:?}: {why}"),
            ),
            Ok(Some(wants)) => Verdict {
                wants_share: Some(wants),
                ..Verdict::deny(Reason::ShareInTransit, machine, &share_detail(project, state))
            },
            Ok(None) => Verdict {
                reserve: Some(Reserve {
                    size: ask.new_size().cloned().unwrap_or_default(),
                    reserved: growth,
                }),
                ..Verdict::allow(Reason::Fits)
            },
        },
        Ok(exceeded) if held_only_by_allotments(state, &growth) => Verdict {
            wants_share: state
                .committed()
                .ok()
                .map(|c| SeedShare::demand_for(&state.limit, &c, &growth)),
            ..Verdict::deny(
                Reason::ShareInTransit,
                machine,
                &format!(
                    "cannot be admitted yet: {}{}; trying again in a few seconds will succeed",
                    exceeded_detail(project, &exceeded, ask.is_update()),
                    held_note(&exceeded, &state.allotted)
                ),
            )
        },
        Ok(exceeded) => Verdict::deny(
            Reason::QuotaExceeded,
            machine,
            &format!(
                "{}{}",
                exceeded_detail(project, &exceeded, ask.is_update()),
                held_note(&exceeded, &state.allotted)
            ),
        ),
    }
}

/// Whether `growth` would fit the quota but for headroom other webhook processes hold: then it
/// waits for them to give it back (they do when they see this process's demand).
fn held_only_by_allotments(state: &QuotaState, growth: &ResourceDetails) -> bool {
    !state.allotted.is_empty()
        && state
            .used()
            .and_then(|used| {
                state
                    .limit
                    .exceeded_by(&used, growth)
                    .map_err(|e| StateError(e.to_string()))
            })
            .is_ok_and(|exceeded| exceeded.is_empty())
}

/// Under shares: `None` when `growth` fits the seed's capacity beside what it committed, else the
/// share it would need (`committed + growth`).
fn seed_shortfall(
    state: &QuotaState,
    growth: &ResourceDetails,
) -> Result<Option<ResourceDetails>, StateError> {
    let Some(seed) = &state.seed else {
        return Ok(None);
    };
    let committed = state.committed()?;
    Ok(shares::fits_within(&seed.capacity, &committed, growth)
        .err()
        .map(|_| SeedShare::demand_for(&state.limit, &committed, growth)))
}

/// Why a request that fits the quota waits for share: what the project uses, who holds the rest,
/// and that a retry succeeds once it has moved.
fn share_detail(project: &str, state: &QuotaState) -> String {
    let in_use = state.in_use().unwrap_or_default();
    let uses: Vec<String> = state
        .limit
        .iter()
        .map(|(r, limit)| format!("{} of {}", r.amount(in_use.amount(r)), r.describe(limit)))
        .collect();
    let holders: Vec<String> = state
        .seed
        .iter()
        .flat_map(|s| &s.others)
        .map(|(seed, share)| {
            let held: Vec<String> = state
                .limit
                .iter()
                .filter(|(r, _)| !share.amount(*r).is_zero())
                .map(|(r, _)| r.describe(share.amount(r)))
                .collect();
            format!("seed {seed:?} ({})", join_human(&held))
        })
        .collect();
    let rest = if holders.is_empty() {
        "the rest of the quota has not been granted to this seed yet".to_owned()
    } else {
        format!("the rest of the quota is held by {}", join_human(&holders))
    };
    format!(
        "cannot be admitted yet: project {project:?} uses {}, and {rest}; it is being moved to this seed, so trying again in a few seconds will succeed",
        join_human(&uses)
    )
}

/// When part of "in use" is headroom other webhook processes hold (allotments), says so: it comes
/// back when they record what they admitted or give it back.
fn held_note(exceeded: &[Exceeded], allotted: &ResourceDetails) -> String {
    let held: Vec<String> = exceeded
        .iter()
        .filter(|e| allotted.amount(e.resource) > kkp_quota_crds::Quantity::ZERO)
        .map(|e| e.resource.describe(allotted.amount(e.resource)))
        .collect();
    if held.is_empty() {
        String::new()
    } else {
        format!(
            " (of which {} is headroom held by other webhook processes, freed as they record their admissions or give it back)",
            join_human(&held)
        )
    }
}

/// Decides several waiting requests of one project in order against one snapshot: each admitted
/// (non-dry-run) request adds its reservation to the in-use of the ones after it.
pub fn decide_batch(project: &str, quota: Option<&QuotaState>, requests: &[Request]) -> Vec<Verdict> {
    let Some(initial) = quota else {
        return requests.iter().map(|r| decide(project, None, r)).collect();
    };
    let mut state = initial.clone();
    let mut verdicts = Vec::with_capacity(requests.len());
    // Requests waiting for share ask for all of them together: each one's demand counts the
    // ones before it, so one grant can cover the whole batch.
    let mut waiting = ResourceDetails::default();
    for request in requests {
        let mut verdict = decide(project, Some(&state), request);
        if let (Some(wants), Some(growth), false) =
            (&verdict.wants_share, request.ask.growth(), request.dry_run)
        {
            let wants = wants.checked_add(&shares::bounded_by(&state.limit, &waiting));
            match (wants, waiting.checked_add(&growth)) {
                (Ok(wants), Ok(sum)) => {
                    verdict.wants_share = Some(wants);
                    waiting = sum;
                }
                _ => verdict.wants_share = None,
            }
        }
        if let (Some(reserve), false) = (&verdict.reserve, request.dry_run) {
            match state.reserved.checked_add(&reserve.reserved) {
                Ok(sum) => state.reserved = sum,
                Err(e) => {
                    verdict = Verdict::deny(
                        Reason::Error,
                        &request.machine,
                        &format!("cannot be reserved in project {project:?}: {e}"),
                    );
                }
            }
        }
        verdicts.push(verdict);
    }
    verdicts
}

#[cfg(test)]
mod tests {
    use super::*;
    use kkp_quota_crds::{LedgerSubject, Quantity};
    use proptest::prelude::*;

    fn details(pairs: &[(Resource, &str)]) -> ResourceDetails {
        let mut d = ResourceDetails::default();
        for (r, text) in pairs {
            d.set(*r, Some(text.parse().unwrap()));
        }
        d
    }

    fn cpu(n: &str) -> ResourceDetails {
        details(&[(Resource::Cpu, n)])
    }

    fn state(limit: ResourceDetails, used: ResourceDetails) -> QuotaState {
        QuotaState {
            limit,
            local_usage: used,
            ..QuotaState::default()
        }
    }

    fn create(machine: &str, size: ResourceDetails) -> Request {
        Request {
            machine: machine.into(),
            ask: Ask::Create(size),
            dry_run: false,
        }
    }

    #[test]
    fn fits_and_reserves_the_size() {
        let s = state(cpu("16"), cpu("12"));
        let v = decide("x8k2", Some(&s), &create("worker-7f", cpu("4")));
        assert!(v.allowed);
        assert_eq!(v.reason, Reason::Fits);
        assert_eq!(
            v.reserve,
            Some(Reserve {
                size: cpu("4"),
                reserved: cpu("4")
            })
        );
        assert!(v.warnings.is_empty());
    }

    #[test]
    fn denial_names_the_resource_in_quota_units() {
        let s = state(cpu("16"), cpu("14"));
        let v = decide("x8k2", Some(&s), &create("worker-7f", cpu("4")));
        assert!(!v.allowed);
        assert_eq!(v.reason, Reason::QuotaExceeded);
        assert_eq!(
            v.message.as_deref(),
            Some(r#"machine "worker-7f" needs 4 cpu, project "x8k2" uses 14 of 16 cpu"#)
        );
        assert_eq!(
            v.event_message.as_deref(),
            Some(r#"a Machine needs 4 cpu, project "x8k2" uses 14 of 16 cpu"#)
        );
        assert_eq!(v.reserve, None);
    }

    #[test]
    fn denial_names_every_resource_that_does_not_fit() {
        let limit = details(&[
            (Resource::Cpu, "16"),
            (Resource::Memory, "32Gi"),
            (Resource::Storage, "1Ti"),
        ]);
        let used = details(&[
            (Resource::Cpu, "14"),
            (Resource::Memory, "31Gi"),
            (Resource::Storage, "10Gi"),
        ]);
        let size = details(&[
            (Resource::Cpu, "4"),
            (Resource::Memory, "2Gi"),
            (Resource::Storage, "20Gi"),
        ]);
        let v = decide("x8k2", Some(&state(limit, used)), &create("w", size));
        assert_eq!(
            v.message.as_deref(),
            Some(
                r#"machine "w" needs 4 cpu and 2Gi memory, project "x8k2" uses 14 of 16 cpu and 31Gi of 32Gi memory"#
            )
        );
    }

    #[test]
    fn a_ledger_of_a_newer_format_is_not_read() {
        let spec = QuotaLedgerSpec {
            subject: LedgerSubject::project("p"),
            quota: cpu("10"),
            shares: None,
        };
        let status = QuotaLedgerStatus {
            format_version: Some(kkp_quota_crds::quota_ledger::LEDGER_FORMAT + 1),
            ..QuotaLedgerStatus::default()
        };
        let e = QuotaState::from_parts(&spec, Some(&status)).unwrap_err();
        assert!(e.to_string().contains("upgrade this component"), "{e}");
        let current = QuotaLedgerStatus {
            format_version: Some(kkp_quota_crds::quota_ledger::LEDGER_FORMAT),
            ..QuotaLedgerStatus::default()
        };
        assert!(QuotaState::from_parts(&spec, Some(&current)).is_ok());
    }

    #[test]
    fn usage_sums_other_seeds_local_reservations_and_allotments() {
        let s = QuotaState {
            limit: cpu("16"),
            other_seeds_usage: cpu("4"),
            local_usage: cpu("5"),
            reserved: cpu("4"),
            allotted: cpu("1"),
            seed: None,
        };
        // Over the quota even without the held headroom: a real denial.
        let v = decide("p", Some(&s), &create("m", cpu("4")));
        assert_eq!(v.reason, Reason::QuotaExceeded);
        assert_eq!(
            v.message.as_deref(),
            Some(
                r#"machine "m" needs 4 cpu, project "p" uses 14 of 16 cpu (of which 1 cpu is headroom held by other webhook processes, freed as they record their admissions or give it back)"#
            )
        );
        // It fits once the held headroom is back: it waits for it, and says so.
        let v = decide("p", Some(&s), &create("m", cpu("3")));
        assert_eq!(v.reason, Reason::ShareInTransit);
        assert_eq!(
            v.message.as_deref(),
            Some(
                r#"machine "m" cannot be admitted yet: needs 3 cpu, project "p" uses 14 of 16 cpu (of which 1 cpu is headroom held by other webhook processes, freed as they record their admissions or give it back); trying again in a few seconds will succeed"#
            )
        );
        assert!(decide("p", Some(&s), &create("m", cpu("2"))).allowed);
    }

    #[test]
    fn a_holder_counts_what_it_admitted_instead_of_its_own_allotment() {
        use kkp_quota_crds::ledger::Allotment;
        let allotment = |holder: &str, granted: &str| Allotment {
            holder: holder.into(),
            granted: cpu(granted),
            expires_at: jiff::Timestamp::UNIX_EPOCH,
        };
        let spec = QuotaLedgerSpec {
            subject: LedgerSubject::project("p"),
            quota: cpu("16"),
            shares: None,
        };
        let status = QuotaLedgerStatus {
            local_usage: Some(cpu("4")),
            other_seeds_usage: Some(cpu("0")),
            allotments: vec![allotment("me", "5"), allotment("other", "3")],
            ..QuotaLedgerStatus::default()
        };
        // Anyone else: both allotments are taken.
        let everyone = QuotaState::from_parts(&spec, Some(&status)).unwrap();
        assert_eq!(
            everyone.in_use().unwrap().amount(Resource::Cpu),
            Quantity::from_units(12)
        );
        // "me", having admitted 2 from its own 5: the other's 3 and its own 2.
        let mine = QuotaState::for_holder(&spec, Some(&status), "me", &cpu("2")).unwrap();
        assert_eq!(
            mine.in_use().unwrap().amount(Resource::Cpu),
            Quantity::from_units(9)
        );
        assert_eq!(
            mine.used().unwrap().amount(Resource::Cpu),
            Quantity::from_units(6)
        );
        let v = decide("p", Some(&mine), &create("m", cpu("11")));
        assert_eq!(
            v.message.as_deref(),
            Some(
                r#"machine "m" needs 11 cpu, project "p" uses 9 of 16 cpu (of which 3 cpu is headroom held by other webhook processes, freed as they record their admissions or give it back)"#
            )
        );
        assert_eq!(
            decide("p", Some(&mine), &create("m", cpu("8"))).reason,
            Reason::ShareInTransit
        );
        // Held headroom is not usage: no over-quota warning for it.
        let lowered = QuotaLedgerSpec {
            quota: cpu("8"),
            ..spec.clone()
        };
        let state = QuotaState::for_holder(&lowered, Some(&status), "me", &cpu("2")).unwrap();
        assert!(over_quota_warnings("p", &state).is_empty());
    }

    #[test]
    fn from_copy_falls_back_to_global_minus_local() {
        let mut quota = QuotaLedger::new(
            "project-p",
            QuotaLedgerSpec {
                subject: LedgerSubject::project("p"),
                quota: cpu("16"),
                shares: None,
            },
        );
        quota.status = Some(QuotaLedgerStatus {
            global_usage: Some(cpu("10")),
            local_usage: Some(cpu("4")),
            ..QuotaLedgerStatus::default()
        });
        let s = QuotaState::from_copy(&quota).unwrap();
        assert_eq!(s.other_seeds_usage, cpu("6"));
        assert_eq!(
            s.in_use().unwrap(),
            cpu("10").checked_add(&ResourceDetails::zero()).unwrap()
        );
        // A local count fresher than the master's global figure: floored at zero.
        quota.status = Some(QuotaLedgerStatus {
            global_usage: Some(cpu("2")),
            local_usage: Some(cpu("4")),
            ..QuotaLedgerStatus::default()
        });
        assert_eq!(
            QuotaState::from_copy(&quota)
                .unwrap()
                .other_seeds_usage
                .amount(Resource::Cpu),
            Quantity::ZERO
        );
        // otherSeedsUsage wins when present.
        quota.status = Some(QuotaLedgerStatus {
            global_usage: Some(cpu("100")),
            local_usage: Some(cpu("4")),
            other_seeds_usage: Some(cpu("1")),
            ..QuotaLedgerStatus::default()
        });
        assert_eq!(QuotaState::from_copy(&quota).unwrap().other_seeds_usage, cpu("1"));
    }

    #[test]
    fn deletes_and_shrinks_pass_over_quota() {
        let s = state(cpu("16"), cpu("20"));
        let delete = Request {
            machine: "m".into(),
            ask: Ask::Delete,
            dry_run: false,
        };
        assert!(decide("p", Some(&s), &delete).allowed);
        let shrink = Request {
            machine: "m".into(),
            ask: Ask::Update {
                old: Some(cpu("4")),
                new: cpu("2"),
            },
            dry_run: false,
        };
        let v = decide("p", Some(&s), &shrink);
        assert!(v.allowed);
        assert_eq!(v.reason, Reason::Reduction);
        assert_eq!(v.reserve, None);
        // The over-quota warning rides along.
        assert_eq!(v.warnings.len(), 1);
    }

    #[test]
    fn growth_of_an_update_is_what_counts() {
        let s = state(cpu("16"), cpu("14"));
        let grow = |old: &str, new: &str| Request {
            machine: "m".into(),
            ask: Ask::Update {
                old: Some(cpu(old)),
                new: cpu(new),
            },
            dry_run: false,
        };
        let v = decide("p", Some(&s), &grow("2", "4"));
        assert!(v.allowed);
        assert_eq!(
            v.reserve,
            Some(Reserve {
                size: cpu("4"),
                reserved: cpu("2")
            })
        );
        let v = decide("p", Some(&s), &grow("2", "5"));
        assert_eq!(
            v.message.as_deref(),
            Some(r#"machine "m" needs 3 more cpu, project "p" uses 14 of 16 cpu"#)
        );
    }

    #[test]
    fn no_quota_allows_everything() {
        let v = decide(
            "p",
            None,
            &Request {
                machine: "m".into(),
                ask: Ask::Unsizeable("no".into()),
                dry_run: false,
            },
        );
        assert!(v.allowed);
        assert_eq!(v.reason, Reason::NoQuota);
        let v = decide("p", None, &create("m", cpu("64")));
        assert_eq!((v.allowed, v.reason, v.reserve), (true, Reason::NoQuota, None));
        let delete = Request {
            machine: "m".into(),
            ask: Ask::Delete,
            dry_run: false,
        };
        assert_eq!(decide("p", None, &delete).reason, Reason::Reduction);
    }

    #[test]
    fn unsizeable_is_denied_with_the_sizing_message() {
        let s = state(cpu("16"), cpu("0"));
        let v = decide(
            "p",
            Some(&s),
            &Request {
                machine: "m".into(),
                ask: Ask::Unsizeable("set cpus".into()),
                dry_run: false,
            },
        );
        assert!(!v.allowed);
        assert_eq!(v.reason, Reason::Unsizeable);
        assert!(v.message.as_deref().unwrap().ends_with(": set cpus"));
    }

    #[test]
    fn lowered_quota_denies_creates_with_a_warning() {
        let s = state(cpu("8"), cpu("12"));
        let v = decide("p", Some(&s), &create("m", cpu("1")));
        assert!(!v.allowed);
        assert_eq!(
            v.warnings,
            vec![r#"project "p" is over its resource quota: it uses 12 of 8 cpu; new Machines that need cpu are denied until usage is back under the quota"#.to_owned()]
        );
        // A request that asks nothing of the overrun resource still passes.
        let v = decide("p", Some(&s), &create("m", details(&[(Resource::Memory, "1Gi")])));
        assert!(v.allowed);
        assert_eq!(v.warnings.len(), 1);
    }

    fn with_share(mut s: QuotaState, capacity: &str, others: &[(&str, &str)]) -> QuotaState {
        s.seed = Some(SeedCapacity {
            capacity: cpu(capacity),
            others: others.iter().map(|(n, c)| ((*n).to_owned(), cpu(c))).collect(),
        });
        s
    }

    #[test]
    fn under_shares_a_request_must_fit_the_seeds_capacity_too() {
        // 16 cpu quota, 2 used here, the seed may commit 4, seed-b holds 10.
        let s = with_share(state(cpu("16"), cpu("2")), "4", &[("seed-b", "10")]);
        assert!(decide("p", Some(&s), &create("m", cpu("2"))).allowed);
        let v = decide("p", Some(&s), &create("m", cpu("3")));
        assert_eq!(v.reason, Reason::ShareInTransit);
        assert!(!v.allowed);
        assert_eq!(v.wants_share, Some(cpu("5")));
        assert_eq!(
            v.message.as_deref(),
            Some(
                r#"machine "m" cannot be admitted yet: project "p" uses 2 of 16 cpu, and the rest of the quota is held by seed "seed-b" (10 cpu); it is being moved to this seed, so trying again in a few seconds will succeed"#
            )
        );
        // Over the quota itself: a real denial, whatever the share.
        let v = decide("p", Some(&s), &create("m", cpu("15")));
        assert_eq!(v.reason, Reason::QuotaExceeded);
        assert_eq!(v.wants_share, None);
    }

    #[test]
    fn a_batch_asks_for_every_waiting_request_together() {
        let s = with_share(state(cpu("16"), cpu("0")), "2", &[]);
        let requests: Vec<Request> = (0..4).map(|i| create(&format!("m{i}"), cpu("1"))).collect();
        let verdicts = decide_batch("p", Some(&s), &requests);
        let allowed = verdicts.iter().filter(|v| v.allowed).count();
        assert_eq!(allowed, 2);
        assert_eq!(verdicts[2].wants_share, Some(cpu("3")));
        assert_eq!(verdicts[3].wants_share, Some(cpu("4")));
        assert!(
            verdicts[3]
                .message
                .as_deref()
                .unwrap()
                .contains("not been granted to this seed yet")
        );
    }

    #[test]
    fn batch_admits_in_order_until_full() {
        let s = state(cpu("16"), cpu("12"));
        let requests: Vec<Request> = (0..6).map(|i| create(&format!("m{i}"), cpu("1"))).collect();
        let verdicts = decide_batch("p", Some(&s), &requests);
        let allowed: Vec<bool> = verdicts.iter().map(|v| v.allowed).collect();
        assert_eq!(allowed, vec![true, true, true, true, false, false]);
        assert_eq!(
            verdicts[4].message.as_deref(),
            Some(r#"machine "m4" needs 1 cpu, project "p" uses 16 of 16 cpu"#)
        );
    }

    #[test]
    fn dry_runs_do_not_take_room() {
        let s = state(cpu("16"), cpu("15"));
        let mut dry = create("dry", cpu("1"));
        dry.dry_run = true;
        let verdicts = decide_batch("p", Some(&s), &[dry, create("real", cpu("1"))]);
        assert!(verdicts[0].allowed && verdicts[1].allowed);
    }

    proptest! {
        /// However a batch is made up, what it admits fits in the headroom, and every denial is
        /// justified: the request would not have fit on top of what was admitted before it.
        #[test]
        fn batch_never_overruns(limit in 0u32..64, used in 0u32..64, sizes in proptest::collection::vec(0u32..8, 0..40)) {
            let s = state(cpu(&limit.to_string()), cpu(&used.to_string()));
            let requests: Vec<Request> = sizes.iter().enumerate().map(|(i, n)| create(&format!("m{i}"), cpu(&n.to_string()))).collect();
            let verdicts = decide_batch("p", Some(&s), &requests);
            let mut admitted = 0u32;
            for (size, verdict) in sizes.iter().zip(&verdicts) {
                if verdict.allowed {
                    admitted += size;
                    prop_assert!(*size == 0 || used + admitted <= limit);
                } else {
                    prop_assert!(used + admitted + size > limit);
                }
            }
        }
    }
}
