//! The rollout allowance at admission: a new Machine refused for room that replaces a Machine of
//! the same `MachineDeployment` is admitted over the limit when the ledger allows rollouts and
//! the project is not over already (`kkp_quota_crds::rollout::surge_fits`, the rule every
//! component shares), and no shared quota group bounds the project in what the surge asks for.

use kkp_quota_crds::rollout::{SurgeRefusal, surge_fits};
use kkp_quota_crds::{LedgerGroup, Quantity, ResourceDetails};

use super::{Ask, QuotaState, Reason, Request, Reserve, Verdict};

/// The Machine a surge replaces, as found in the user cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replaced {
    /// `namespace/name` of the `MachineDeployment` rolling out.
    pub deployment: String,
    /// The replaced Machine's UID and `namespace/name`.
    pub uid: String,
    pub machine: String,
    /// Its size.
    pub size: ResourceDetails,
}

/// Why the allowance does not apply under `groups` (those bounding the project, as its ledger
/// carries them) to a surge growing the project by `growth`: a group limits something it asks
/// for. Checked before the user cluster is read for the replaced Machine, and again on the
/// ledger the surge is written to.
pub fn grouped(groups: &[LedgerGroup], growth: &ResourceDetails) -> Option<SurgeRefusal> {
    let names: Vec<&str> = groups
        .iter()
        .filter(|group| {
            growth
                .iter()
                .any(|(resource, q)| q > Quantity::ZERO && group.quota.get(resource).is_some())
        })
        .map(|group| group.name.as_str())
        .collect();
    (!names.is_empty()).then(|| SurgeRefusal::Grouped(names.join(", ")))
}

/// The verdict for a surge over the limit, or why the allowance does not apply. `state` is the
/// ledger as read, every allotment counted whole (the surge is written apart from any allotment).
pub fn decide_surge(
    project: &str,
    state: &QuotaState,
    request: &Request,
    replaced: &Replaced,
) -> Result<Verdict, SurgeRefusal> {
    let (Ask::Create(size), Some(growth)) = (&request.ask, request.ask.growth()) else {
        return Err(SurgeRefusal::NotACreate);
    };
    if let Some(refusal) = grouped(&state.groups, &growth) {
        return Err(refusal);
    }
    let quantity = |e: super::StateError| SurgeRefusal::Unreadable(e.to_string());
    match &state.seed {
        Some(seed) => surge_fits(
            &seed.capacity,
            &state.committed().map_err(quantity)?,
            &growth,
            &replaced.size,
        )?,
        None => surge_fits(
            &state.limit,
            &state.in_use().map_err(quantity)?,
            &growth,
            &replaced.size,
        )?,
    }
    Ok(Verdict {
        reserve: Some(Reserve {
            size: size.clone(),
            reserved: growth.clone(),
            ..Reserve::default()
        }),
        warnings: vec![format!(
            "admitted over the quota of project {project:?} by its rollout allowance: it replaces machine {:?} of MachineDeployment {:?}, and the project is over its limit by {growth} until that Machine is deleted",
            replaced.machine, replaced.deployment
        )],
        ..Verdict::allow(Reason::RolloutSurge)
    })
}

#[cfg(test)]
mod tests {
    use kkp_quota_crds::fixtures::cpu;

    use super::*;
    use crate::decision::SeedCapacity;

    fn state(limit: i64, used: i64) -> QuotaState {
        QuotaState {
            limit: cpu(limit),
            local_usage: cpu(used),
            ..QuotaState::default()
        }
    }

    fn replaced(size: i64) -> Replaced {
        Replaced {
            deployment: "kube-system/workers".into(),
            uid: "old-uid".into(),
            machine: "kube-system/workers-1-a".into(),
            size: cpu(size),
        }
    }

    fn create(size: i64) -> Request {
        Request {
            machine: "workers-2-a".into(),
            ask: Ask::Create(cpu(size)),
            dry_run: false,
            subject: crate::decision::Subject::Machine,
            autoscaled: None,
        }
    }

    #[test]
    fn a_surge_at_full_quota_is_admitted_over_the_limit_by_its_own_size_and_says_so() {
        let verdict = decide_surge("demo", &state(16, 16), &create(2), &replaced(2)).unwrap();
        assert!(verdict.allowed);
        assert_eq!(verdict.reason, Reason::RolloutSurge);
        assert_eq!(verdict.reserve.as_ref().unwrap().reserved, cpu(2));
        assert!(
            verdict.warnings[0].contains("rollout allowance"),
            "{:?}",
            verdict.warnings
        );
        assert!(verdict.warnings[0].contains("kube-system/workers-1-a"));
    }

    #[test]
    fn a_second_surge_while_the_first_runs_is_refused() {
        // 16 used + the first surge's 2 reserved: over already.
        let mut running = state(16, 16);
        running.reserved = cpu(2);
        assert!(matches!(
            decide_surge("demo", &running, &create(2), &replaced(2)),
            Err(SurgeRefusal::AlreadyOver(_))
        ));
        // A Machine larger than the one it replaces never comes in over the limit.
        assert!(matches!(
            decide_surge("demo", &state(16, 16), &create(4), &replaced(2)),
            Err(SurgeRefusal::Larger(_))
        ));
        // Nor anything but a create.
        let update = Request {
            ask: Ask::Update {
                old: Some(cpu(1)),
                new: cpu(2),
            },
            ..create(2)
        };
        assert_eq!(
            decide_surge("demo", &state(16, 16), &update, &replaced(2)),
            Err(SurgeRefusal::NotACreate)
        );
    }

    #[test]
    fn under_a_group_that_limits_what_it_asks_for_a_surge_is_never_admitted_over() {
        // The seed's capacity (8) lies within the project's budget of group acme: a surge past
        // it could take acme over its limit.
        let mut grouped = state(16, 8);
        grouped.seed = Some(SeedCapacity {
            capacity: cpu(8),
            ..SeedCapacity::default()
        });
        grouped.groups = vec![LedgerGroup {
            name: "acme".into(),
            quota: cpu(32),
            others_usage: cpu(20),
            others_held: ResourceDetails::default(),
        }];
        let refusal = decide_surge("demo", &grouped, &create(2), &replaced(2)).unwrap_err();
        assert_eq!(refusal, SurgeRefusal::Grouped("acme".into()));
        assert!(refusal.to_string().contains("quota group acme"), "{refusal}");
        // A group that limits only what the surge does not ask for leaves the allowance on.
        let mut gpu_only = ResourceDetails::default();
        gpu_only.set(kkp_quota_crds::Resource::Gpu, Some(Quantity::from_units(1)));
        grouped.groups[0].quota = gpu_only;
        assert!(decide_surge("demo", &grouped, &create(2), &replaced(2)).is_ok());
    }

    #[test]
    fn under_shares_the_bound_is_the_seeds_capacity() {
        // The seed holds 8 of 16 and has committed all 8; the other seed's share is its own.
        let mut at_share = state(16, 8);
        at_share.seed = Some(SeedCapacity {
            capacity: cpu(8),
            ..SeedCapacity::default()
        });
        assert!(decide_surge("demo", &at_share, &create(2), &replaced(2)).is_ok());
        at_share.local_usage = cpu(9);
        assert!(matches!(
            decide_surge("demo", &at_share, &create(2), &replaced(2)),
            Err(SurgeRefusal::AlreadyOver(_))
        ));
    }
}
