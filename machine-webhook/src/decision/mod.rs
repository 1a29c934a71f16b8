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
//! request <= min(share, target, limit, limit - otherSeedsUsage)` ([`kkp_quota_crds::shares::fits_within`], the same test
//! the allotments use one level down). One that fits the quota but not the share is
//! [`Reason::ShareInTransit`]: the verdict carries the share to ask the master for.

use std::fmt;

use kkp_quota_crds::shares::{self, SeedShare};
use kkp_quota_crds::{Exceeded, Resource, ResourceDetails};

pub mod autoscaled;
mod gap;
mod messages;
mod state;
mod surge;
#[cfg(test)]
mod tests;

pub use gap::{LedgerGap, decide_batch_without_ledger, decide_without_ledger, is_counted, is_counted_json};
pub use messages::{
    ROLLOUT_WAYS_OUT, dry_run_answer, exceeded_detail, machines_that_fit, near_limit_warnings,
    over_quota_warnings, rollout_blocked, rollout_hint,
};
pub use state::{QuotaState, SeedCapacity, StateError};
pub use surge::{Replaced, decide_surge, grouped};

use autoscaled::{Autoscaled, decide_change, from_room};
use messages::{budget_short_groups, full_groups, group_detail, held_note, share_detail};

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
    /// It grows usage of a project whose quota is on this seed without a usable ledger: KKP's
    /// copy of the quota is here and the `QuotaLedger` is not, or it is not counted yet
    /// ([`LedgerGap`]). Fails closed until the ledger is back and counted.
    LedgerMissing,
    /// The request names a user cluster this seed does not know.
    UnknownCluster,
    /// A surge Machine of a `MachineDeployment` rollout admitted over the limit by the quota's
    /// rollout allowance (`kkp_quota_crds::rollout`).
    RolloutSurge,
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
        Reason::LedgerMissing,
        Reason::UnknownCluster,
        Reason::RolloutSurge,
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
            Reason::LedgerMissing => "ledger_missing",
            Reason::UnknownCluster => "unknown_cluster",
            Reason::RolloutSurge => "rollout_surge",
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
            Reason::LedgerMissing => "QuotaLedgerMissing",
            Reason::UnknownCluster => "UnknownCluster",
            Reason::RolloutSurge => "RolloutSurge",
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
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reserve {
    /// The Machine's full size once admitted.
    pub size: ResourceDetails,
    /// What this admission adds: the size for a create, the growth for an update.
    pub reserved: ResourceDetails,
    /// The autoscaled deployment (UID) whose room admitted it, or whose change it is
    /// (`kkp_quota_crds::autoscaled`).
    pub deployment: Option<String>,
    /// The reservation's UID when it is not the object's: a deployment change's
    /// (`kkp_quota_crds::autoscaled::change_uid`).
    pub uid: Option<String>,
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
    /// For a denial that names quota groups (the request fits its project's own quota, but a
    /// group bounding the project has no room): every group it names, in the denial's order.
    pub refused_by_groups: Vec<GroupRefusal>,
}

/// A quota group a denial names, and the resources it has no room for (as the denial says).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRefusal {
    pub group: String,
    pub resources: Vec<Resource>,
}

impl GroupRefusal {
    /// One per group of [`full_groups`], with the resources each has no room for.
    fn from_full(full: &[(&str, Vec<Exceeded>)]) -> Vec<GroupRefusal> {
        full.iter()
            .map(|(group, exceeded)| GroupRefusal {
                group: (*group).to_owned(),
                resources: exceeded.iter().map(|e| e.resource).collect(),
            })
            .collect()
    }
}

impl Verdict {
    /// Whether the request waits for share (up to `--share-wait`, decided again on every change
    /// of the ledger) before this verdict is its answer: one in transit, and one a shared group
    /// refuses by the figures the ledger last carried. Those figures lag (they come with the
    /// master's writes) and may count what another project's webhooks hold only for a moment;
    /// answered at once, a burst's requests were refused while the budget they asked for was on
    /// its way to this seed, and it then sat idle (a group of 10 admitted 9).
    pub fn waits_for_share(&self) -> bool {
        self.reason == Reason::ShareInTransit
            || (!self.allowed && self.wants_share.is_some() && !self.refused_by_groups.is_empty())
    }

    pub fn allow(reason: Reason) -> Verdict {
        Verdict {
            allowed: true,
            reason,
            message: None,
            event_message: None,
            warnings: Vec::new(),
            reserve: None,
            wants_share: None,
            refused_by_groups: Vec::new(),
        }
    }

    /// A denial of a Machine; `detail` is the sentence after `machine "<name>"`.
    pub fn deny(reason: Reason, machine: &str, detail: &str) -> Verdict {
        Verdict::deny_subject(Subject::Machine, reason, machine, detail)
    }

    /// A denial of a Machine or a `Cluster`; `detail` is the sentence after `machine "<name>"`
    /// (`cluster "<name>"`).
    pub fn deny_subject(subject: Subject, reason: Reason, name: &str, detail: &str) -> Verdict {
        Verdict {
            allowed: false,
            reason,
            message: Some(format!("{} {name:?} {detail}", subject.noun())),
            event_message: Some(format!("a {} {detail}", subject.kind())),
            warnings: Vec::new(),
            reserve: None,
            wants_share: None,
            refused_by_groups: Vec::new(),
        }
    }

    #[must_use]
    pub fn with_warnings(mut self, warnings: Vec<String>) -> Verdict {
        self.warnings = warnings;
        self
    }

    /// Every `(group, resource)` this verdict refuses for: one pair per group its denial names
    /// and resource that group has no room for; none when it is allowed or names no group.
    pub fn group_denials(&self) -> impl Iterator<Item = (&str, Resource)> {
        self.refused_by_groups
            .iter()
            .filter(|_| !self.allowed)
            .flat_map(|refusal| refusal.resources.iter().map(|&r| (refusal.group.as_str(), r)))
    }
}

/// What an admission request is about: a Machine in a user cluster, or a KKP `Cluster` on the
/// seed (which asks for `clusters: 1`, docs/capacity.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Subject {
    #[default]
    Machine,
    Cluster,
    /// A `MachineDeployment` whose autoscaler's room counts (`reservedCounts`).
    Deployment,
}

impl Subject {
    /// The word before its name in a denial: `machine "worker-1"`.
    pub const fn noun(self) -> &'static str {
        match self {
            Subject::Machine => "machine",
            Subject::Cluster => "cluster",
            Subject::Deployment => "machinedeployment",
        }
    }

    /// Its kind, as in an Event: `a Machine`.
    pub const fn kind(self) -> &'static str {
        match self {
            Subject::Machine => "Machine",
            Subject::Cluster => "Cluster",
            Subject::Deployment => "MachineDeployment",
        }
    }
}

/// One request as the decision sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The Machine's name (for messages); a `Cluster`'s, under [`Subject::Cluster`] (the field
    /// kept its name from before `Cluster`s were decided too).
    pub machine: String,
    pub ask: Ask,
    /// Dry-run requests are decided but add nothing for later requests.
    pub dry_run: bool,
    pub subject: Subject,
    /// Under the policy `reservedCounts`: a Machine of an autoscaled deployment, or a
    /// deployment's change ([`autoscaled`]).
    pub autoscaled: Option<Autoscaled>,
}

impl Request {
    /// A denial of this request's Machine or `Cluster`.
    pub fn deny(&self, reason: Reason, detail: &str) -> Verdict {
        Verdict::deny_subject(self.subject, reason, &self.machine, detail)
    }
}

/// Decides one request. `quota` is `None` when the project has no quota.
pub fn decide(project: &str, quota: Option<&QuotaState>, request: &Request) -> Verdict {
    let mut warnings = quota
        .map(|state| over_quota_warnings(project, state))
        .unwrap_or_default();
    if let (Some(state), Some(Autoscaled::Change(change))) = (quota, &request.autoscaled) {
        return decide_change(project, state, request, change).with_warnings(warnings);
    }
    if let (Some(state), Some(Autoscaled::Member(member)), Some(size)) =
        (quota, &request.autoscaled, request.ask.new_size())
        && let Some(verdict) = from_room(state, member, size)
    {
        return verdict.with_warnings(warnings);
    }
    let verdict = match (&request.ask, quota) {
        (Ask::Delete, _) => Verdict::allow(Reason::Reduction),
        (Ask::Unchanged, _) => Verdict::allow(Reason::Unchanged),
        (Ask::Create(_) | Ask::Update { .. }, _) if request.ask.growth().is_none() => {
            Verdict::allow(Reason::Reduction)
        }
        (_, None) => Verdict::allow(Reason::NoQuota),
        (Ask::Unsizeable(why), Some(_)) => request.deny(Reason::Unsizeable, &unsizeable_detail(project, why)),
        (ask, Some(state)) => match ask.growth() {
            None => Verdict::allow(Reason::Reduction),
            Some(growth) => decide_growth(project, state, request, growth),
        },
    };
    // A dry run never asks for share: one that fits the quota but waits for room held elsewhere
    // is answered as the real create would end, admitted, and says so.
    let verdict = if request.dry_run && verdict.reason == Reason::ShareInTransit {
        warnings.push(messages::DRY_RUN_ROOM_ELSEWHERE.to_owned());
        Verdict::allow(Reason::Fits)
    } else {
        verdict
    };
    if let (Some(state), Some(growth), true) = (quota, request.ask.growth(), verdict.reason == Reason::Fits) {
        warnings.extend(near_limit_warnings(project, state, &growth));
    }
    if let (Some(state), Ask::Create(size), true) = (quota, &request.ask, request.dry_run) {
        warnings.push(dry_run_answer(project, state, size));
    }
    verdict.with_warnings(warnings)
}

/// The denial text of a Machine that cannot be sized, under a quota.
fn unsizeable_detail(project: &str, why: &str) -> String {
    format!(
        "cannot be sized, so it cannot be checked against the resource quota of project {project:?}: {why}"
    )
}

fn decide_growth(project: &str, state: &QuotaState, request: &Request, growth: ResourceDetails) -> Verdict {
    let ask = &request.ask;
    let shortfall = match seed_shortfall(state, &growth) {
        Ok(shortfall) => shortfall,
        Err(why) => {
            return request.deny(
                Reason::Error,
                &format!("cannot be checked against the resource quota of project {project:?}: {why}"),
            );
        }
    };
    // Under shares, what fits the seed's capacity is admitted: the shares keep the sum within the
    // limit, and the seed keeps admitting within its share while the master is away. The
    // capacity already leaves room for what the other seeds use (as last folded), since usage
    // can exceed a share without any admission.
    if state.seed.is_some() && shortfall.is_none() {
        return fits(ask, growth);
    }
    let exceeded = state
        .in_use()
        .map_err(|e| e.to_string())
        .and_then(|used| state.limit.exceeded_by(&used, &growth).map_err(|e| e.to_string()));
    match exceeded {
        Err(why) => request.deny(
            Reason::Error,
            &format!("cannot be checked against the resource quota of project {project:?}: {why}"),
        ),
        Ok(exceeded) if exceeded.is_empty() => match shortfall {
            None => fits(ask, growth),
            // A group bounding the project is full (as last carried): refused naming it once the
            // wait for share ends without it (`Verdict::waits_for_share`), and the demand goes
            // out meanwhile, so that figures gone stale are refreshed or room moves here.
            Some(wants) => {
                let full = full_groups(state, &growth);
                Verdict {
                    wants_share: Some(wants),
                    ..match group_detail(project, &full, grows_by(request), request.subject) {
                        Some(detail) => Verdict {
                            refused_by_groups: GroupRefusal::from_full(&full),
                            ..deny_for_room(request, detail)
                        },
                        // Denied for share: named by the groups whose budget the other
                        // projects hold (the room waited for that did not come).
                        None => Verdict {
                            refused_by_groups: GroupRefusal::from_full(&budget_short_groups(state, &growth)),
                            ..request.deny(Reason::ShareInTransit, &share_detail(project, state))
                        },
                    }
                }
            }
        },
        Ok(exceeded) if held_only_by_allotments(state, &growth) => Verdict {
            wants_share: demand_for(state, &growth).ok(),
            ..request.deny(
                Reason::ShareInTransit,
                &format!(
                    "cannot be admitted yet: {}{}; trying again in a few seconds will succeed",
                    exceeded_detail(project, &exceeded, ask.is_update(), request.subject),
                    held_note(&exceeded, &state.allotted)
                ),
            )
        },
        Ok(exceeded) => {
            let detail = format!(
                "{}{}",
                exceeded_detail(project, &exceeded, grows_by(request), request.subject),
                held_note(&exceeded, &state.allotted)
            );
            deny_for_room(request, detail)
        }
    }
}

/// Whether the request's amounts are what it adds ("2 more cpu") rather than a whole size.
fn grows_by(request: &Request) -> bool {
    request.ask.is_update() || request.subject == Subject::Deployment
}

/// The denial of a request that does not fit a limit: `detail` names it, with the way out for
/// the kind of object.
fn deny_for_room(request: &Request, detail: String) -> Verdict {
    let detail = match request.subject {
        Subject::Machine => detail,
        Subject::Cluster => {
            format!("cannot be created: {detail}; delete a cluster or ask an admin to raise the limit")
        }
        Subject::Deployment => format!(
            "cannot grow to its max size: {detail}; under the project's policy reservedCounts the room its \
             cluster autoscaler may grow it into counts as usage: lower its max size \
             (cluster.k8s.io/cluster-api-autoscaler-node-group-max-size) or ask an admin to raise the limit"
        ),
    };
    request.deny(Reason::QuotaExceeded, &detail)
}

/// An admission that reserves `growth` (the Machine's full size once admitted is kept too).
fn fits(ask: &Ask, growth: ResourceDetails) -> Verdict {
    Verdict {
        reserve: Some(Reserve {
            size: ask.new_size().cloned().unwrap_or_default(),
            reserved: growth,
            ..Reserve::default()
        }),
        ..Verdict::allow(Reason::Fits)
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
    if shares::fits_within(&seed.capacity, &committed, growth).is_ok() {
        return Ok(None);
    }
    demand_for(state, growth).map(Some)
}

/// The absolute share the seed would need for `growth` beside what it committed.
fn demand_for(state: &QuotaState, growth: &ResourceDetails) -> Result<ResourceDetails, StateError> {
    Ok(SeedShare::demand_for(&state.limit, &state.committed()?, growth))
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
            state.note_room_reservation(request, reserve);
            match state.reserved.checked_add(&reserve.reserved) {
                Ok(sum) => state.reserved = sum,
                Err(e) => {
                    verdict = request.deny(
                        Reason::Error,
                        &format!("cannot be reserved in project {project:?}: {e}"),
                    );
                }
            }
        }
        verdicts.push(verdict);
    }
    verdicts
}
