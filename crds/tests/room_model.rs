//! State-machine property test of the policy `reservedCounts` (`kkp_quota_crds::autoscaled`), with
//! no servers: one seed's ledger, its seed-controller counting from a view of the user cluster
//! that lags behind, and webhook admissions of Machines (from a deployment's room or by their
//! full size) and of deployment creates, raises, lowerings and template changes, each written by
//! compare-and-swap and landing, conflicting, or landing with its object never stored. Machines
//! are deleted, deployments deleted and created again, seed-controller may not know yet which
//! deployment a Machine is of, and an admin turns the policy off and on again.
//!
//! The invariants, after every step: the Machines are within the limit, and the ledger counts at
//! least them. In runs where the policy stays on, also: what the user cluster holds, every Machine once plus every
//! autoscaled deployment's room, is within the limit, and the ledger counts at least as much.
//! (It may count more for a while: a count from a view that has not seen a deployment's change
//! yet counts its old room beside the change's reservation.) At the end, with seed-controller
//! caught up, the ledger counts exactly what is held.
//!
//! `PROPTEST_CASES` sets the number of runs (default 1500, a second or two).
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::collections::BTreeSet;

use jiff::Timestamp;
use kkp_quota_crds::autoscaled::{
    AutoscaledDeployment, Room, admits_from_room, change_growth, change_is_counted, change_reservation,
    counted_rooms, marked,
};
use kkp_quota_crds::ledger::Reservation;
use kkp_quota_crds::{Quantity, Resource, ResourceDetails};
use proptest::prelude::*;

type Rd = ResourceDetails;

const LIMIT: i64 = 16;
const CLUSTER: &str = "c";
const DEPLOYMENTS: usize = 2;

fn size(cpu: u8) -> Rd {
    let mut d = Rd::default();
    d.set(Resource::Cpu, Some(Quantity::from_units(i64::from(cpu))));
    d.set(Resource::Machines, Some(Quantity::from_units(1)));
    d
}

fn cpu(d: &Rd) -> i64 {
    let q = d.amount(Resource::Cpu);
    (0..=1000)
        .find(|&n| Quantity::from_units(n) == q)
        .expect("small whole cpu")
}

#[derive(Debug, Clone, PartialEq)]
struct Machine {
    uid: String,
    cpu: u8,
    /// The deployment (UID) whose `MachineSet` controls it.
    owner: Option<String>,
    /// In seed-controller's view: its `MachineSet` is not seen yet, so its deployment is not
    /// known.
    unattributed: bool,
}

#[derive(Debug, Clone, PartialEq)]
struct Deployment {
    uid: String,
    max: u32,
    cpu: u8,
    /// Its `resourceVersion`.
    version: u64,
}

/// The user cluster.
#[derive(Debug, Clone, Default, PartialEq)]
struct Cluster {
    machines: Vec<Machine>,
    deployments: [Option<Deployment>; DEPLOYMENTS],
    /// Every Machine and deployment UID deleted so far.
    deleted: BTreeSet<String>,
    /// The last `resourceVersion` given.
    revision: u64,
}

impl Cluster {
    fn members(&self, uid: &str) -> Rd {
        let sizes: Vec<Rd> = self
            .machines
            .iter()
            .filter(|m| m.owner.as_deref() == Some(uid) && !m.unattributed)
            .map(|m| size(m.cpu))
            .collect();
        Rd::checked_sum(sizes.iter()).unwrap()
    }

    fn entries(&self) -> Vec<AutoscaledDeployment> {
        self.deployments
            .iter()
            .enumerate()
            .filter_map(|(i, d)| {
                d.as_ref().map(|d| AutoscaledDeployment {
                    cluster: CLUSTER.into(),
                    uid: d.uid.clone(),
                    name: format!("ns/md-{i}"),
                    max: d.max,
                    size: size(d.cpu),
                    members: self.members(&d.uid),
                })
            })
            .collect()
    }

    /// Every Machine once, and every deployment's room: what the policy counts.
    fn usage(&self) -> Rd {
        let mut parts: Vec<Rd> = self.machines.iter().map(|m| size(m.cpu)).collect();
        parts.extend(self.entries().iter().map(|e| e.reserved().unwrap()));
        Rd::checked_sum(parts.iter()).unwrap()
    }
}

#[derive(Debug, Clone, Default)]
struct Ledger {
    version: u64,
    /// `spec.reservedCounts` (on when a run starts).
    policy: bool,
    local_usage: Rd,
    autoscaled: Vec<AutoscaledDeployment>,
    reservations: Vec<Reservation>,
}

impl Ledger {
    fn in_use(&self) -> Rd {
        let reserved: Vec<&Rd> = self.reservations.iter().map(|r| &r.reserved).collect();
        self.local_usage
            .checked_add(&Rd::checked_sum(reserved).unwrap())
            .unwrap()
    }

    fn fits(&self, growth: &Rd) -> bool {
        cpu(&self.in_use()) + cpu(growth) <= LIMIT
    }

    fn over_limit(&self) -> bool {
        cpu(&self.in_use()) > LIMIT
    }
}

/// What a write stores once it lands.
#[derive(Debug, Clone)]
enum Object {
    Machine(Machine),
    /// A deployment's change, made on this version of it (none for a create).
    Deployment(usize, Deployment, Option<u64>),
}

#[derive(Debug, Clone)]
struct Write {
    on_version: u64,
    reservation: Reservation,
    object: Object,
}

#[derive(Debug, Clone)]
enum Step {
    /// A Machine of deployment `owner` (or of none).
    AskMachine {
        owner: Option<usize>,
        cpu: u8,
    },
    /// Create, or change, deployment `d` to `max` Machines of `cpu`.
    ChangeDeployment {
        d: usize,
        max: u8,
        cpu: u8,
    },
    DeleteDeployment {
        d: usize,
    },
    DeleteMachine {
        pick: u8,
    },
    /// The oldest (or a later) write in flight lands: stored (0), landed with its object never
    /// stored (1), or dropped (2: the webhook crashed or gave up).
    Land {
        pick: u8,
        how: u8,
    },
    /// seed-controller's view takes in the user cluster as it is now, but for the owner of
    /// Machine `unowned` (when there is one: its `MachineSet` is not seen yet).
    Look {
        unowned: u8,
    },
    /// seed-controller counts from its view.
    Count,
    /// An admin turns the policy off, or on again (the master writes the ledger's spec).
    TogglePolicy,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => (prop::option::weighted(0.8, 0..DEPLOYMENTS), 1u8..4).prop_map(|(owner, cpu)| Step::AskMachine { owner, cpu }),
        2 => (0..DEPLOYMENTS, 0u8..6, 1u8..4).prop_map(|(d, max, cpu)| Step::ChangeDeployment { d, max, cpu }),
        1 => (0..DEPLOYMENTS).prop_map(|d| Step::DeleteDeployment { d }),
        2 => any::<u8>().prop_map(|pick| Step::DeleteMachine { pick }),
        5 => (any::<u8>(), prop_oneof![6 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8)])
            .prop_map(|(pick, how)| Step::Land { pick, how }),
        3 => any::<u8>().prop_map(|unowned| Step::Look { unowned }),
        3 => Just(Step::Count),
        1 => Just(Step::TogglePolicy),
    ]
}

#[derive(Debug, Default)]
struct World {
    cluster: Cluster,
    view: Cluster,
    ledger: Ledger,
    in_flight: Vec<Write>,
    next_uid: u64,
    generation: [u32; DEPLOYMENTS],
    /// Machines admitted from a room, and refused by both ways (for coverage).
    from_room: u32,
    refused: u32,
    /// The reservations (UID and size) of writes that landed with their object never stored.
    lost: Vec<(String, Rd)>,
    /// The policy was turned off or on again at least once.
    toggled: bool,
}

impl World {
    fn uid(&mut self) -> String {
        self.next_uid += 1;
        format!("m{}", self.next_uid)
    }

    fn plan(&mut self, reservation: Reservation, object: Object) {
        self.in_flight.push(Write {
            on_version: self.ledger.version,
            reservation,
            object,
        });
    }

    fn ask_machine(&mut self, owner: Option<usize>, machine_cpu: u8) {
        // A Machine's `MachineSet` is made by its deployment: there is one.
        let deployment = match owner {
            Some(d) => match self.cluster.deployments[d].clone() {
                Some(deployment) => Some(deployment),
                None => return,
            },
            None => None,
        };
        let machine = Machine {
            uid: self.uid(),
            cpu: machine_cpu,
            owner: deployment.as_ref().map(|dep| dep.uid.clone()),
            unattributed: false,
        };
        let machine_size = size(machine_cpu);
        // The webhook reads the owner as it is now.
        let room_open = self.ledger.policy && !self.ledger.over_limit();
        let from_room = room_open
            && deployment.as_ref().is_some_and(|dep| {
                let template = size(dep.cpu);
                let room = Room::find(
                    CLUSTER,
                    &dep.uid,
                    &self.ledger.autoscaled,
                    &self.ledger.reservations,
                    (dep.max, &template),
                )
                .unwrap();
                let on_their_way = marked(CLUSTER, &dep.uid, &self.ledger.reservations).unwrap();
                room.is_some_and(|room| admits_from_room(&room, &on_their_way, &machine_size).unwrap())
            });
        let reserved = if from_room {
            self.from_room += 1;
            Rd::zero()
        } else if self.ledger.fits(&machine_size) {
            machine_size.clone()
        } else {
            self.refused += 1;
            return;
        };
        let reservation = Reservation {
            cluster: CLUSTER.into(),
            uid: machine.uid.clone(),
            size: machine_size,
            reserved,
            created_at: Timestamp::UNIX_EPOCH,
            deployment: deployment.filter(|_| from_room).map(|dep| dep.uid),
        };
        self.plan(reservation, Object::Machine(machine));
    }

    fn change_deployment(&mut self, d: usize, max: u8, template_cpu: u8) {
        let before = self.cluster.deployments[d].clone();
        let old_template = before.as_ref().map(|o| size(o.cpu));
        let old = before
            .as_ref()
            .zip(old_template.as_ref())
            .map(|(o, t)| (o.max, t));
        let old_version = before.as_ref().map(|o| o.version.to_string());
        let uid = if let Some(dep) = &self.cluster.deployments[d] {
            dep.uid.clone()
        } else {
            self.generation[d] += 1;
            format!("d{d}-{}", self.generation[d])
        };
        let template = size(template_cpu);
        let counted = self.ledger.autoscaled.iter().find(|a| a.uid == uid);
        let growth = change_growth(
            counted,
            (CLUSTER, &uid),
            &self.ledger.reservations,
            old,
            (u32::from(max), &template),
        )
        .unwrap();
        let mut deployment = Deployment {
            uid: uid.clone(),
            max: u32::from(max),
            cpu: template_cpu,
            version: 0,
        };
        // Without the policy a deployment asks nothing.
        if growth.is_empty() || !self.ledger.policy {
            // Nothing to check or record: stored at once.
            self.cluster.revision += 1;
            deployment.version = self.cluster.revision;
            self.cluster.deployments[d] = Some(deployment);
            return;
        }
        if !self.ledger.fits(&growth) {
            self.refused += 1;
            return;
        }
        let reservation = change_reservation(
            (CLUSTER, &uid),
            old_version.as_deref(),
            &growth,
            (u32::from(max), &template),
            Timestamp::UNIX_EPOCH,
        )
        .unwrap();
        let made_on = before.as_ref().map(|b| b.version);
        self.plan(reservation, Object::Deployment(d, deployment, made_on));
    }

    fn land(&mut self, pick: u8, how: u8) {
        if self.in_flight.is_empty() {
            return;
        }
        let write = self.in_flight.remove(usize::from(pick) % self.in_flight.len());
        if how == 2 || write.on_version != self.ledger.version {
            return;
        }
        self.ledger.version += 1;
        // Appended, as the webhook does: two admissions of changes made on one version (of
        // which the API server stores one) are both held until counted.
        let uid = write.reservation.uid.clone();
        let write_size = write.reservation.size.clone();
        self.ledger.reservations.push(write.reservation);
        if how == 1 {
            self.lost.push((uid, write_size));
            return;
        }
        match write.object {
            Object::Machine(m) => self.cluster.machines.push(m),
            Object::Deployment(d, mut dep, made_on) => {
                // The API server stores a change only on the version it was admitted on (else it
                // admits it again, on the version there is: another step here); a change of a
                // deployment deleted meanwhile is not stored.
                let now = self.cluster.deployments[d].as_ref().map(|n| n.version);
                if now == made_on && !self.cluster.deleted.contains(&dep.uid) {
                    self.cluster.revision += 1;
                    dep.version = self.cluster.revision;
                    self.cluster.deployments[d] = Some(dep);
                } else {
                    self.lost.push((uid, write_size));
                }
            }
        }
    }

    fn count(&mut self) {
        let view = &self.view;
        let entries = view.entries();
        let parts: Vec<Rd> = view.machines.iter().map(|m| size(m.cpu)).collect();
        let counted = |r: &Reservation| {
            view.machines
                .iter()
                .any(|m| m.uid == r.uid && size(m.cpu) == r.size)
                || view
                    .deployments
                    .iter()
                    .flatten()
                    .any(|d| change_is_counted(&d.uid, &d.version.to_string(), r))
        };
        let gone = |r: &Reservation| {
            view.deleted.contains(&r.uid)
                || r.deployment
                    .as_ref()
                    .is_some_and(|d| r.uid.starts_with(&format!("{d}@")) && view.deleted.contains(d))
        };
        self.ledger.reservations.retain(|r| !counted(r) && !gone(r));
        // Without the policy no room counts and no entry is written; Machines on their way from
        // a room still count.
        let entries = if self.ledger.policy { entries } else { Vec::new() };
        self.ledger.local_usage = Rd::checked_sum(parts.iter())
            .unwrap()
            .checked_add(&counted_rooms(&entries, &self.ledger.reservations).unwrap())
            .unwrap();
        self.ledger.autoscaled = entries;
        self.ledger.version += 1;
    }

    fn apply(&mut self, step: &Step) {
        match *step {
            Step::AskMachine { owner, cpu } => self.ask_machine(owner, cpu),
            Step::ChangeDeployment { d, max, cpu } => self.change_deployment(d, max, cpu),
            Step::DeleteDeployment { d } => {
                if let Some(dep) = self.cluster.deployments[d].take() {
                    self.cluster.deleted.insert(dep.uid);
                }
            }
            Step::DeleteMachine { pick } => {
                if !self.cluster.machines.is_empty() {
                    let i = usize::from(pick) % self.cluster.machines.len();
                    let m = self.cluster.machines.remove(i);
                    self.cluster.deleted.insert(m.uid);
                }
            }
            Step::Land { pick, how } => self.land(pick, how),
            Step::Look { unowned } => {
                self.view = self.cluster.clone();
                if let Some(m) = self.view.machines.get_mut(usize::from(unowned)) {
                    m.unattributed = true;
                }
            }
            Step::Count => self.count(),
            Step::TogglePolicy => {
                self.ledger.policy = !self.ledger.policy;
                self.ledger.version += 1;
                self.toggled = true;
            }
        }
    }

    fn check(&self) -> Result<(), String> {
        let machines: i64 = self.cluster.machines.iter().map(|m| i64::from(m.cpu)).sum();
        if machines > LIMIT {
            return Err(format!(
                "the user cluster runs {machines} cpu of Machines over the limit {LIMIT}"
            ));
        }
        let counted = cpu(&self.ledger.in_use());
        if counted < machines {
            return Err(format!(
                "the ledger counts {counted} cpu of the {machines} of Machines"
            ));
        }
        // Turning the policy on counts rooms no admission held (the project may then be over its
        // limit, as with a lowered limit): the stricter invariants hold for runs without that.
        if self.toggled {
            return Ok(());
        }
        let held = cpu(&self.cluster.usage());
        if held > LIMIT {
            return Err(format!(
                "the user cluster holds {held} cpu over the limit {LIMIT}"
            ));
        }
        let counted = cpu(&self.ledger.in_use());
        if counted < held {
            return Err(format!(
                "the ledger counts {counted} cpu of the {held} the user cluster holds"
            ));
        }
        Ok(())
    }

    /// Once nothing is in flight, the reservations of writes whose object was never stored have
    /// expired, and seed-controller has seen everything, the ledger counts exactly what the user
    /// cluster holds.
    fn check_settled(&mut self) -> Result<(), String> {
        self.in_flight.clear();
        let lost = std::mem::take(&mut self.lost);
        self.ledger
            .reservations
            .retain(|r| !lost.iter().any(|(uid, size)| *uid == r.uid && *size == r.size));
        self.apply(&Step::Look { unowned: u8::MAX });
        self.apply(&Step::Count);
        let machines: i64 = self.cluster.machines.iter().map(|m| i64::from(m.cpu)).sum();
        let held = if self.ledger.policy {
            cpu(&self.cluster.usage())
        } else {
            machines
        };
        let counted = cpu(&self.ledger.in_use());
        if counted != held {
            return Err(format!(
                "settled, the ledger counts {counted} cpu for the {held} held"
            ));
        }
        Ok(())
    }
}

fn run(steps: &[Step]) -> Result<World, String> {
    let mut world = play(steps)?;
    world.check_settled().map_err(|e| format!("{e}\n{world:#?}"))?;
    Ok(world)
}

/// The steps, each checked.
fn play(steps: &[Step]) -> Result<World, String> {
    let mut world = World::default();
    world.ledger.policy = true;
    let trace = std::env::var_os("ROOM_MODEL_TRACE").is_some();
    for (i, step) in steps.iter().enumerate() {
        world.apply(step);
        if trace {
            eprintln!(
                "{i}: {step:?}\n   held {} counted {} local {} machines {:?} deployments {:?} view {:?} {:?} entries {:?} reservations {:?}",
                cpu(&world.cluster.usage()),
                cpu(&world.ledger.in_use()),
                cpu(&world.ledger.local_usage),
                world
                    .cluster
                    .machines
                    .iter()
                    .map(|m| (&m.uid, m.cpu, &m.owner))
                    .collect::<Vec<_>>(),
                world.cluster.deployments,
                world
                    .view
                    .machines
                    .iter()
                    .map(|m| (&m.uid, m.cpu, &m.owner))
                    .collect::<Vec<_>>(),
                world.view.deployments,
                world
                    .ledger
                    .autoscaled
                    .iter()
                    .map(|e| (&e.uid, e.max, cpu(&e.size), cpu(&e.members)))
                    .collect::<Vec<_>>(),
                world
                    .ledger
                    .reservations
                    .iter()
                    .map(|r| (&r.uid, cpu(&r.size), cpu(&r.reserved), &r.deployment))
                    .collect::<Vec<_>>(),
            );
        }
        world
            .check()
            .map_err(|e| format!("after step {i} ({step:?}): {e}\n{world:#?}"))?;
    }
    Ok(world)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(1500), ..ProptestConfig::default() })]

    /// Whatever the interleaving, neither what runs and may run, nor what the ledger counts, is
    /// ever above the limit.
    #[test]
    fn room_is_never_oversold(steps in prop::collection::vec(step(), 1..120)) {
        run(&steps).map_err(TestCaseError::fail)?;
    }
}

/// The autoscaler's way, at a full quota: a deployment of max 4 admitted while it fits, then its
/// Machines one after another, all from its room, while a Machine of no deployment is refused.
#[test]
fn the_autoscalers_machines_come_from_the_room_others_are_refused() {
    let mut steps = vec![
        Step::ChangeDeployment { d: 0, max: 4, cpu: 4 },
        Step::Land { pick: 0, how: 0 },
        Step::Look { unowned: u8::MAX },
        Step::Count,
    ];
    for _ in 0..4 {
        steps.push(Step::AskMachine {
            owner: Some(0),
            cpu: 4,
        });
        steps.push(Step::Land { pick: 0, how: 0 });
    }
    steps.extend([
        Step::AskMachine { owner: None, cpu: 1 },
        Step::AskMachine {
            owner: Some(0),
            cpu: 4,
        },
        Step::ChangeDeployment { d: 1, max: 1, cpu: 1 },
    ]);
    let world = run(&steps).unwrap();
    assert_eq!(world.cluster.machines.len(), 4);
    assert_eq!(
        world.from_room, 4,
        "every Machine of the deployment came from its room"
    );
    assert_eq!(
        world.refused, 3,
        "a fifth, another Machine and another deployment do not fit"
    );
    // Lowering max frees the room at the next count.
    let mut world = world;
    world.apply(&Step::ChangeDeployment { d: 0, max: 2, cpu: 4 });
    world.apply(&Step::Look { unowned: u8::MAX });
    world.apply(&Step::Count);
    assert_eq!(cpu(&world.ledger.in_use()), 16, "4 Machines run; no room is left");
    world.apply(&Step::DeleteMachine { pick: 0 });
    world.apply(&Step::DeleteMachine { pick: 0 });
    world.apply(&Step::Look { unowned: u8::MAX });
    world.apply(&Step::Count);
    assert_eq!(
        cpu(&world.ledger.in_use()),
        8,
        "2 Machines, max 2: nothing reserved"
    );
    world.apply(&Step::AskMachine { owner: None, cpu: 4 });
    assert_eq!(world.in_flight.len(), 1, "a Machine of no deployment fits again");
}

/// A lowering of `max` while a Machine admitted from the room is on its way: the count that sees
/// the lowering but not the Machine still counts the Machine.
#[test]
fn a_machine_on_its_way_outlives_the_room_it_came_from() {
    let steps = [
        Step::ChangeDeployment { d: 0, max: 3, cpu: 1 },
        Step::Land { pick: 0, how: 0 },
        Step::Look { unowned: u8::MAX },
        Step::Count,
        Step::AskMachine {
            owner: Some(0),
            cpu: 1,
        },
        Step::ChangeDeployment { d: 0, max: 0, cpu: 1 },
        Step::Look { unowned: u8::MAX },
        Step::Land { pick: 0, how: 0 },
        Step::Count,
    ];
    let world = run(&steps).unwrap();
    assert_eq!(world.from_room, 1);
    assert_eq!(
        cpu(&world.ledger.in_use()),
        1,
        "the Machine counts though the room is gone"
    );
}

/// A raise after a lowering that the count has not seen: the raise holds all it adds over the
/// lowered deployment, though the count still counts the room from before the lowering.
#[test]
fn a_raise_after_a_lowering_holds_its_whole_raise() {
    let steps = [
        Step::ChangeDeployment { d: 0, max: 3, cpu: 1 },
        Step::Land { pick: 0, how: 0 },
        Step::Look { unowned: u8::MAX },
        Step::Count,
        Step::ChangeDeployment { d: 0, max: 0, cpu: 1 },
        Step::ChangeDeployment { d: 0, max: 2, cpu: 1 },
        Step::Land { pick: 0, how: 0 },
        // The count sees the lowering, not the raise: the raise's reservation stays.
        Step::Count,
    ];
    let mut world = play(&steps[..7]).unwrap();
    world.view.deployments[0].as_mut().unwrap().max = 0;
    world.view.deployments[0].as_mut().unwrap().version = 2;
    world.apply(&steps[7]);
    world.check().unwrap();
    assert_eq!(cpu(&world.ledger.in_use()), 2);
}

/// The policy turned on over rooms no admission held, beyond the limit: nothing grows from them.
#[test]
fn rooms_counted_by_turning_the_policy_on_are_not_admitted_from_while_over() {
    let mut steps = vec![
        Step::TogglePolicy,
        Step::ChangeDeployment { d: 0, max: 5, cpu: 3 },
    ];
    for _ in 0..3 {
        steps.push(Step::AskMachine { owner: None, cpu: 3 });
        steps.push(Step::Land { pick: 0, how: 0 });
    }
    steps.extend([Step::TogglePolicy, Step::Look { unowned: u8::MAX }, Step::Count]);
    for _ in 0..3 {
        steps.push(Step::AskMachine {
            owner: Some(0),
            cpu: 3,
        });
        steps.push(Step::Land { pick: 0, how: 0 });
    }
    let world = run(&steps).unwrap();
    assert_eq!(world.from_room, 0);
    assert_eq!(
        world.cluster.machines.len(),
        3,
        "9 cpu run, and 9 + 15 of room are over 16"
    );
}
