//! The policy `reservedCounts` in the decision (the protocol itself is
//! `kkp_quota_crds::autoscaled`): a Machine of an autoscaled `MachineDeployment` is admitted from
//! the deployment's room, adding nothing to the usage; a deployment's create, or a raise of its
//! max size or its Machines' size, is checked as the growth of that room and reserved until
//! seed-controller counts it.

use kkp_quota_crds::ResourceDetails;
use kkp_quota_crds::autoscaled::{Room, admits_from_room, change_growth, change_uid, marked, nominal};

use super::{QuotaState, Reason, Request, Reserve, Verdict, decide_growth};

/// What the policy needs of a request, besides its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Autoscaled {
    /// A new Machine of an autoscaled deployment.
    Member(Box<Member>),
    /// A deployment's create or change.
    Change(Box<Change>),
}

/// A new Machine of an autoscaled deployment, as the deployment is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub cluster: String,
    /// The deployment's UID.
    pub deployment: String,
    pub max: u32,
    /// One Machine of its template.
    pub template: ResourceDetails,
}

/// A deployment's create (`old: None`) or change to `new` (`max`, one Machine's size). A
/// deployment that is not autoscaled (no usable bounds, or unsizeable) is `(0, size)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub cluster: String,
    /// The deployment's UID.
    pub deployment: String,
    pub old: Option<(u32, ResourceDetails)>,
    /// The `resourceVersion` the change is made on (none for a create).
    pub old_version: Option<String>,
    pub new: (u32, ResourceDetails),
}

/// Under the policy, the admission of a Machine of `size` from its deployment's room, when the
/// room holds it (`None`: decided as any Machine is).
pub(super) fn from_room(state: &QuotaState, member: &Member, size: &ResourceDetails) -> Option<Verdict> {
    if !state.reserved_counts {
        return None;
    }
    // Over the limit (the policy just turned on, the limit lowered, a catalog edit), a room
    // counted since is not one an admission held: nothing grows from it until the project fits.
    if !state.limit.overrun_by(&state.in_use().ok()?).is_empty() {
        return None;
    }
    let reservations = &state.room_reservations;
    let room = Room::find(
        &member.cluster,
        &member.deployment,
        &state.autoscaled,
        reservations,
        (member.max, &member.template),
    )
    .ok()??;
    let on_their_way = marked(&member.cluster, &member.deployment, reservations).ok()?;
    admits_from_room(&room, &on_their_way, size)
        .ok()?
        .then(|| Verdict {
            reserve: Some(Reserve {
                size: size.clone(),
                reserved: ResourceDetails::zero(),
                deployment: Some(member.deployment.clone()),
                uid: None,
            }),
            ..Verdict::allow(Reason::Fits)
        })
}

/// A deployment's create or change: under the policy, the growth of its room is checked as a
/// Machine's growth is and reserved under the change's UID; without the policy it asks nothing.
pub(super) fn decide_change(
    project: &str,
    state: &QuotaState,
    request: &Request,
    change: &Change,
) -> Verdict {
    if !state.reserved_counts {
        return Verdict::allow(Reason::Unchanged);
    }
    let counted = state
        .autoscaled
        .iter()
        .find(|a| a.cluster == change.cluster && a.uid == change.deployment);
    let old = change.old.as_ref().map(|(max, size)| (*max, size));
    let (max, size) = (change.new.0, &change.new.1);
    let growth = change_growth(
        counted,
        (&change.cluster, &change.deployment),
        &state.room_reservations,
        old,
        (max, size),
    )
    .and_then(|growth| Ok((growth, nominal(max, size)?)));
    let (growth, nominal) = match growth {
        Ok(parts) => parts,
        Err(e) => {
            return request.deny(
                Reason::Error,
                &format!("cannot be checked against the resource quota of project {project:?}: {e}"),
            );
        }
    };
    if growth.is_empty() {
        return Verdict::allow(Reason::Reduction);
    }
    let mut verdict = decide_growth(project, state, request, growth.clone());
    if let Some(reserve) = &mut verdict.reserve {
        *reserve = Reserve {
            size: nominal,
            reserved: growth,
            deployment: Some(change.deployment.clone()),
            uid: Some(change_uid(&change.deployment, change.old_version.as_deref())),
        };
    }
    verdict
}
