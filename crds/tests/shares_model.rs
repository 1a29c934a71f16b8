//! State-machine property test of the per-seed share protocol (`kkp_quota_crds::shares`), with
//! no servers: a master and 2-3 seeds, each with a seed-controller and one webhook process, over
//! random interleavings of admissions, counting, deletions, demand, master plans and writes,
//! the webhook's allotment (the real `AllotmentHolder`, its writes landing, conflicting, timing
//! out, landing with their answer lost or landing late), time passing,
//! message delay, reordering, duplication and loss, releases, quota edits, crashes, partitions
//! and seed removal, and rollout surges admitted over the limit by the rollout allowance (counted
//! apart: every invariant holds for what is committed besides them). Every reachable state is checked (see `World::check`); after each run, a
//! liveness phase heals everything and checks that a lone seed with demand gets all the free
//! headroom within a bounded number of fair rounds.
//!
//! `PROPTEST_CASES` sets the number of runs (default 600, a few seconds).
#![allow(
    clippy::unwrap_used,
    clippy::too_many_lines,
    clippy::cast_possible_truncation,
    // A test model: message sizes and the run's flags are no concern.
    clippy::large_enum_variant,
    clippy::struct_excessive_bools
)]

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use kkp_quota_crds::ledger::Reservation;
use kkp_quota_crds::rollout::surge_fits;
use kkp_quota_crds::shares::allotment::{
    AllotmentConfig, CarriedChange, FastAdmission, LedgerSight, Pass, Planned, WriteStart, grant_for,
};
use kkp_quota_crds::shares::{
    AllotmentHolder, MasterView, MasterWord, SeedRecord, SeedReport, SeedShare, bounded_by, fits_within,
    largest,
};
use kkp_quota_crds::{Quantity, Resource, ResourceDetails};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

const RESOURCES: [Resource; 2] = [Resource::Cpu, Resource::Memory];
/// Messages in flight beyond this are dropped, oldest first (senders resend).
const BAG_LIMIT: usize = 40;
/// Fair rounds the liveness phase allows (one round: report, plan, persist, send, release).
const LIVENESS_ROUNDS: usize = 4;
/// Rounds a rebuilt record adds: one for the seeds to take its epoch before it grants, and one
/// more for a rebuild that found a seed holding more than it read.
const REBUILD_ROUNDS: usize = 2;
/// Set on a process's key in `status.allotments` for its entry carried from a deleted ledger.
const CARRIED: u32 = 1 << 31;

type Rd = ResourceDetails;

fn units(n: u8) -> Quantity {
    Quantity::from_units(i64::from(n))
}

/// Amounts for the first `n` resources of [`RESOURCES`].
fn rd(n: usize, values: [u8; 2]) -> Rd {
    let mut d = Rd::default();
    for (r, v) in RESOURCES.iter().zip(values).take(n) {
        d.set(*r, Some(units(v)));
    }
    d
}

fn add(a: &Rd, b: &Rd) -> Rd {
    a.checked_add(b).unwrap()
}

/// The seed's copy of the quota: everything in it is written together (compare-and-swap on
/// `version`), except `limit` and the master's fields of `share`, which the master writes.
#[derive(Debug, Clone)]
struct Copy {
    version: u64,
    /// The ledger object's UID: a re-created ledger is another object.
    incarnation: u64,
    limit: Rd,
    share: SeedShare,
    counted: Rd,
    /// Reservations of admissions decided by a write.
    reserved: Rd,
    /// Reservations recorded from webhook allotments, by Machine.
    recorded: BTreeMap<u64, Rd>,
    /// `status.allotments`: per webhook process (by its generation; with [`CARRIED`] set, its
    /// entry carried from a deleted ledger), what it holds and when seed-controller first saw
    /// that entry (it judges expiry from then).
    allotments: BTreeMap<u32, (Rd, Instant)>,
    demand: Option<Rd>,
    /// What the other seeds use, as the master last folded it (`otherSeedsUsage`).
    others: Rd,
}

impl Copy {
    fn committed(&self) -> Rd {
        let mut total = add(&self.counted, &self.reserved);
        for size in self.recorded.values() {
            total = add(&total, size);
        }
        for (held, _) in self.allotments.values() {
            total = add(&total, held);
        }
        total
    }

    fn uid(&self) -> String {
        format!("ledger-{}", self.incarnation)
    }
}

/// A webhook write of the allotment in flight: the copy version it is conditioned on, the
/// process that sent it, when it began, what it records and the allotment it sets.
#[derive(Debug, Clone)]
struct Flight {
    version: u64,
    process: u32,
    started: Instant,
    start: WriteStart,
    records: Vec<(u64, Rd)>,
    /// What the write does to the process's carried entry (`None`: nothing), as
    /// `AllotmentHolder::carried_after` decides.
    carried: Option<CarriedChange>,
}

#[derive(Debug, Clone)]
struct Seed {
    name: String,
    copy: Copy,
    /// The webhook process (the real state machine) and its generation (a crash starts the
    /// next one, under a new holder name).
    webhook: AllotmentHolder,
    process: u32,
    /// Its write in flight, and one write whose process stopped waiting for it (it timed out,
    /// or the process crashed) that may still land.
    flight: Option<Flight>,
    stray: Option<Flight>,
    /// Machines admitted from allotments and not counted yet (by any process, dead or alive):
    /// they exist, covered by their reservation or by their holder's allotment.
    machines: BTreeMap<u64, (u32, Rd)>,
    /// Machines from allotments that seed-controller counted (a reservation of one recorded
    /// again later is dropped as counted, as seed-controller does).
    counted_machines: BTreeSet<u64>,
    /// A release the seed-controller computed from the copy at a version, not yet written.
    pending_release: Option<(u64, Rd)>,
    partitioned: bool,
    /// Counted usage that appeared without any admission (a catalog edit made Machines bigger,
    /// a limit added to a resource in use, a cluster moved here), still counted.
    unadmitted: Rd,
    /// Surge Machines admitted over the limit by the rollout allowance (`kkp_quota_crds::rollout`),
    /// each until the Machine of the same size it replaces is deleted: what is really over by
    /// the admin's leave, whatever the ledger keeps (a re-created ledger forgets its records, not
    /// the Machines).
    surges: Vec<Rd>,
}

impl Seed {
    /// What really exists or is admitted: never more than `committed`.
    fn real_usage(&self) -> Rd {
        let c = &self.copy;
        let mut total = add(&c.counted, &c.reserved);
        for (_, size) in self.machines.values() {
            total = add(&total, size);
        }
        total
    }

    /// Reservations recorded again for Machines already counted (a holder that could not tell:
    /// its write's answer was lost, or the ledger was re-created): counted twice until
    /// seed-controller drops them. Conservative, so left out of the invariants.
    fn counted_twice(&self) -> Rd {
        let mut total = Rd::default();
        for (uid, size) in &self.copy.recorded {
            if self.counted_machines.contains(uid) {
                total = add(&total, size);
            }
        }
        total
    }

    /// `committed` without what is counted twice.
    fn committed_once(&self) -> Rd {
        self.copy.committed().saturating_sub(&self.counted_twice())
    }

    /// `committed_once` without the running surges, counted apart: what the share must cover.
    fn committed_apart(&self) -> Rd {
        let surging = ResourceDetails::checked_sum(self.surges.iter()).unwrap();
        self.committed_once().saturating_sub(&surging)
    }

    /// Seed-controller counts the Machines admitted from allotments that neither a reservation
    /// nor their holder's allotment covers any more (they exist; it counts every Machine past
    /// its grace period).
    fn count_uncovered_machines(&mut self) {
        let uncovered: Vec<u64> = self
            .machines
            .iter()
            .filter(|(uid, (process, _))| {
                !self.copy.recorded.contains_key(uid)
                    && !self.copy.allotments.contains_key(process)
                    && !self.copy.allotments.contains_key(&(process | CARRIED))
            })
            .map(|(uid, _)| *uid)
            .collect();
        for uid in uncovered {
            let (_, size) = self.machines.remove(&uid).unwrap();
            self.copy.counted = add(&self.copy.counted, &size);
            self.counted_machines.insert(uid);
        }
    }

    /// Everything the ledger commits but this process's own allotment
    /// (`QuotaState::for_holder` in machine-webhook).
    fn committed_beside_own(&self) -> Rd {
        let mut total = add(&self.copy.counted, &self.copy.reserved);
        for size in self.copy.recorded.values() {
            total = add(&total, size);
        }
        for (process, (held, _)) in &self.copy.allotments {
            if *process != self.process {
                total = add(&total, held);
            }
        }
        total
    }

    /// machine-webhook's `allotment_wanted_back` (one process per seed here, so no other
    /// process waits): the master asks share back, or the seed commits more than its capacity
    /// beside the other seeds.
    fn allotment_wanted_back(&self) -> bool {
        let c = &self.copy;
        let capacity = c.share.capacity_beside(&c.limit, &c.others);
        c.share.asked_back(&c.limit) || !capacity.covers(&bounded_by(&c.limit, &c.committed()))
    }

    fn bump(&mut self) {
        self.copy.version += 1;
    }
}

/// The master's own object: limit (spec) and record (granted, target, retiring per seed).
#[derive(Debug, Clone)]
struct Persisted {
    /// The object's version (compare-and-swap).
    version: u64,
    /// The record's own version (the one in every word sent to seeds); restarts from zero when
    /// the record is lost.
    record_version: u64,
    record: MasterView,
}

#[derive(Debug, Clone)]
struct Master {
    /// The master's last read of its own object (maybe stale).
    cache: Persisted,
    reports: BTreeMap<String, SeedReport>,
}

#[derive(Debug, Clone)]
enum Msg {
    Word {
        seed: usize,
        limit: Rd,
        word: MasterWord,
    },
    Report {
        seed: usize,
        report: SeedReport,
    },
    /// The master's fold of the other seeds' usage, written into a seed's copy.
    Fold {
        seed: usize,
        others: Rd,
    },
}

#[derive(Debug, Clone)]
enum Step {
    Admit {
        seed: usize,
        amount: [u8; 2],
        ask: bool,
    },
    AdmitFromAllotment {
        seed: usize,
        amount: [u8; 2],
    },
    /// The webhook plans a write on the copy as it is (recording what it admitted, taking,
    /// renewing or giving back its allotment); `requests`: the pass decides requests (else it
    /// is upkeep, and an idle holder gives its allotment back).
    BeginWrite {
        seed: usize,
        requests: bool,
    },
    /// The write in flight ends: 0 lands and is answered, 1 lands with its answer lost, 2 fails
    /// (a conflict when the copy moved, else an error), 3 times out and may still land later.
    EndWrite {
        seed: usize,
        how: u8,
    },
    /// A whole webhook pass: a write planned and landed at once.
    WritePass {
        seed: usize,
    },
    /// A write times out, the process admits from its allotment meanwhile, then the write lands
    /// after all.
    LateLanding {
        seed: usize,
        amount: [u8; 2],
    },
    /// A write whose process stopped waiting lands now, if the copy has not moved.
    StrayLands {
        seed: usize,
    },
    /// Time passes for every clock.
    Tick {
        secs: u64,
    },
    Count {
        seed: usize,
    },
    Delete {
        seed: usize,
        amount: [u8; 2],
    },
    /// A rollout's surge Machine of this size, replacing a counted Machine as large, admitted
    /// over the limit if the allowance's rule lets it.
    Surge {
        seed: usize,
        amount: [u8; 2],
    },
    /// The oldest surge's replaced Machine is deleted: the rollout step is done.
    SurgeEnds {
        seed: usize,
    },
    /// Usage that appears without any admission.
    Appear {
        seed: usize,
        amount: [u8; 2],
    },
    CrashWebhook {
        seed: usize,
    },
    /// The master's record lost: the `ProjectQuota` deleted and re-created, its CRD re-installed,
    /// or the master restored from a backup without status. The record starts again from
    /// nothing at version zero (which seeds are retiring is the fleet's, so it stays).
    LoseRecord,
    /// The seed's ledger deleted (by hand, or its CRD re-installed) and re-created by the master
    /// from its cached record: the status is gone (released, reservations, allotments, demand).
    /// The webhook admits nothing until seed-controller has counted it, and seed-controller's
    /// first count carries the deleted ledger's reservations and allotments as its watch last
    /// saw them (`seed-controller/src/succession.rs`): Machines admitted from them may not exist
    /// yet.
    RecreateLedger {
        seed: usize,
        /// The webhook saw the ledger missing in between (and forgot its allotment).
        seen_gap: bool,
        /// Every Machine admitted so far exists when the new ledger is counted (else those not
        /// counted yet come later, covered only by what the new ledger carried over).
        created: bool,
    },
    ExpireAllotment {
        seed: usize,
    },
    Withdraw {
        seed: usize,
    },
    Report {
        seed: usize,
    },
    DecideRelease {
        seed: usize,
        quiet: bool,
    },
    WriteRelease {
        seed: usize,
    },
    CrashSeedController {
        seed: usize,
    },
    MasterRefresh,
    MasterPlan,
    ServerApply {
        pick: usize,
        land: bool,
    },
    MasterSend,
    CrashMaster,
    RestartMaster,
    QuotaEdit {
        resource: usize,
        by: u8,
        lower: bool,
    },
    Deliver {
        pick: usize,
        dup: bool,
    },
    Drop {
        pick: usize,
    },
    Partition {
        seed: usize,
    },
    Heal {
        seed: usize,
    },
    Retire {
        seed: usize,
    },
    /// Composite steps, so that random runs reach deep states: a whole master round (refresh,
    /// plan, the write lands, refresh, send), several deliveries, a release decided and written.
    MasterRound,
    DeliverMany {
        picks: Vec<usize>,
    },
    ReleaseNow {
        seed: usize,
        quiet: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    let seed = 0..3_usize;
    let amount = [0..4_u8, 0..4_u8];
    prop_oneof![
        6 => (seed.clone(), amount.clone(), prop::bool::weighted(0.8))
            .prop_map(|(seed, amount, ask)| Step::Admit { seed, amount, ask }),
        5 => (seed.clone(), amount.clone())
            .prop_map(|(seed, amount)| Step::AdmitFromAllotment { seed, amount }),
        2 => (seed.clone(), prop::bool::weighted(0.8))
            .prop_map(|(seed, requests)| Step::BeginWrite { seed, requests }),
        2 => (seed.clone(), prop_oneof![5 => Just(0_u8), 1 => Just(1), 1 => Just(2), 1 => Just(3)])
            .prop_map(|(seed, how)| Step::EndWrite { seed, how }),
        1 => seed.clone().prop_map(|seed| Step::StrayLands { seed }),
        4 => seed.clone().prop_map(|seed| Step::WritePass { seed }),
        1 => (seed.clone(), amount.clone()).prop_map(|(seed, amount)| Step::LateLanding { seed, amount }),
        1 => prop_oneof![Just(1_u64), Just(15), Just(31), Just(61)].prop_map(|secs| Step::Tick { secs }),
        2 => seed.clone().prop_map(|seed| Step::Count { seed }),
        2 => (seed.clone(), amount.clone()).prop_map(|(seed, amount)| Step::Delete { seed, amount }),
        4 => (seed.clone(), amount.clone()).prop_map(|(seed, amount)| Step::Surge { seed, amount }),
        2 => seed.clone().prop_map(|seed| Step::SurgeEnds { seed }),
        1 => (seed.clone(), amount).prop_map(|(seed, amount)| Step::Appear { seed, amount }),
        1 => seed.clone().prop_map(|seed| Step::CrashWebhook { seed }),
        1 => (seed.clone(), any::<bool>(), any::<bool>())
            .prop_map(|(seed, seen_gap, created)| Step::RecreateLedger { seed, seen_gap, created }),
        1 => Just(Step::LoseRecord),
        1 => seed.clone().prop_map(|seed| Step::ExpireAllotment { seed }),
        1 => seed.clone().prop_map(|seed| Step::Withdraw { seed }),
        1 => seed.clone().prop_map(|seed| Step::Report { seed }),
        4 => (seed.clone(), prop::bool::weighted(0.7)).prop_map(|(seed, quiet)| Step::DecideRelease { seed, quiet }),
        4 => seed.clone().prop_map(|seed| Step::WriteRelease { seed }),
        1 => seed.clone().prop_map(|seed| Step::CrashSeedController { seed }),
        2 => Just(Step::MasterRefresh),
        3 => Just(Step::MasterPlan),
        3 => (any::<usize>(), prop::bool::weighted(0.8))
            .prop_map(|(pick, land)| Step::ServerApply { pick, land }),
        2 => Just(Step::MasterSend),
        1 => Just(Step::CrashMaster),
        1 => Just(Step::RestartMaster),
        1 => (0..2_usize, 0..4_u8, prop::bool::weighted(0.1))
            .prop_map(|(resource, by, lower)| Step::QuotaEdit { resource, by, lower }),
        8 => (any::<usize>(), prop::bool::weighted(0.15)).prop_map(|(pick, dup)| Step::Deliver { pick, dup }),
        1 => any::<usize>().prop_map(|pick| Step::Drop { pick }),
        1 => seed.clone().prop_map(|seed| Step::Partition { seed }),
        1 => (seed.clone(), prop::bool::weighted(0.1)).prop_map(|(seed, retire)| if retire {
            Step::Retire { seed }
        } else {
            Step::Heal { seed }
        }),
        4 => Just(Step::MasterRound),
        4 => prop::collection::vec(any::<usize>(), 1..8).prop_map(|picks| Step::DeliverMany { picks }),
        2 => (seed, any::<bool>()).prop_map(|(seed, quiet)| Step::ReleaseNow { seed, quiet }),
    ]
}

#[derive(Debug, Clone)]
struct Setup {
    seeds: usize,
    resources: usize,
    limit: [u8; 2],
    slack: [u8; 2],
    steps: Vec<Step>,
    lone: usize,
    /// Whether usage may appear without admission in this run: it suspends the invariants
    /// that assume every use was admitted, so most runs go without.
    appear: bool,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        2..=3_usize,
        1..=2_usize,
        [4..13_u8, 4..13_u8],
        [0..3_u8, 0..3_u8],
        prop::collection::vec(step(), 0..200),
        0..3_usize,
        prop::bool::weighted(0.3),
    )
        .prop_map(|(seeds, resources, limit, slack, steps, lone, appear)| Setup {
            seeds,
            resources,
            limit,
            slack,
            steps,
            lone,
            appear,
        })
}

/// Batches of random runs added when the first did not reach every rare state
/// ([`Coverage::rare_states_reached`]).
const MORE_BATCHES: usize = 4;

/// What the runs exercised, so that a model that never reaches the interesting states fails.
#[derive(Debug, Default)]
struct Coverage {
    landed_grants: usize,
    failed_writes: usize,
    releases: usize,
    admitted_after_grant: usize,
    lowered_runs: usize,
    liveness_checked: usize,
    /// Liveness runs in which the lone seed needed share that other seeds first had to release.
    liveness_moved_share: usize,
    forgotten: usize,
    /// Runs where usage appeared without admission.
    appeared_runs: usize,
    /// Ledgers re-created with their status lost.
    recreated: usize,
    /// Of those, re-created with admitted Machines not created yet, covered only by what the
    /// new ledger carried over.
    recreated_in_flight: usize,
    /// Webhook writes that moved what they recorded out of their carried entry (a few in 3,000
    /// runs; `a_carried_allotment_shrinks_by_what_its_holder_records` makes one for sure).
    carried_recorded: usize,
    /// Master records lost, and rebuilt from the seeds' copies.
    lost_records: usize,
    adopted: usize,
    /// Admissions from an allotment, webhook writes that conflicted, writes that landed after
    /// their process stopped waiting, allotments that expired.
    fast_admissions: usize,
    allotment_conflicts: usize,
    late_landings: usize,
    expired_allotments: usize,
    /// Surges admitted over the limit by the rollout allowance, and those refused by its rule.
    surges: usize,
    surges_refused: usize,
}

struct World {
    n: usize,
    slack: Rd,
    seeds: Vec<Seed>,
    persisted: Persisted,
    master: Option<Master>,
    /// Record writes in flight: the object version they are conditioned on, the record version
    /// they carry, the record.
    limbo: Vec<(u64, u64, bool, MasterView)>,
    /// A rebuilt record landed, or a ledger was re-created, in this step: each takes back what
    /// was forgotten (grants by a lost record; releases the master had not persisted as a floor
    /// yet, and so never counted as free), so the exposure it restores is no new grant.
    restored_now: bool,
    /// Per seed, the most ever granted in a persisted record (the record itself may be lost).
    granted_high: BTreeMap<String, Rd>,
    bag: Vec<Msg>,
    lowered: bool,
    /// Usage appeared without admission at some point in this run.
    appeared: bool,
    /// The master's record was lost at some point in this run.
    record_lost: bool,
    /// [`Setup::appear`].
    appear_enabled: bool,
    /// Every clock (skew is tested on the fleet, `e2e/tests/clock_skew.rs`).
    now: Instant,
    allotment: AllotmentConfig,
    next_machine: u64,
}

impl World {
    fn new(s: &Setup) -> World {
        let limit = rd(s.resources, s.limit);
        let zero = rd(s.resources, [0, 0]);
        let seeds: Vec<Seed> = (0..s.seeds)
            .map(|i| Seed {
                name: format!("seed-{i}"),
                copy: Copy {
                    version: 0,
                    incarnation: 0,
                    limit: limit.clone(),
                    share: SeedShare::default(),
                    counted: zero.clone(),
                    reserved: zero.clone(),
                    recorded: BTreeMap::new(),
                    allotments: BTreeMap::new(),
                    demand: None,
                    others: zero.clone(),
                },
                webhook: AllotmentHolder::default(),
                process: 0,
                flight: None,
                stray: None,
                machines: BTreeMap::new(),
                counted_machines: BTreeSet::new(),
                pending_release: None,
                partitioned: false,
                unadmitted: zero.clone(),
                surges: Vec::new(),
            })
            .collect();
        let record = MasterView {
            limit,
            seeds: seeds
                .iter()
                .map(|s| (s.name.clone(), SeedRecord::new()))
                .collect(),
        };
        let persisted = Persisted {
            version: 1,
            record_version: 1,
            record,
        };
        World {
            n: s.resources,
            slack: rd(s.resources, s.slack),
            seeds,
            master: Some(Master {
                cache: persisted.clone(),
                reports: BTreeMap::new(),
            }),
            persisted,
            limbo: Vec::new(),
            granted_high: BTreeMap::new(),
            restored_now: false,
            bag: Vec::new(),
            lowered: false,
            appeared: false,
            record_lost: false,
            appear_enabled: s.appear,
            now: Instant::now(),
            allotment: AllotmentConfig::default(),
            next_machine: 0,
        }
    }

    fn limit(&self) -> &Rd {
        &self.persisted.record.limit
    }

    fn send(&mut self, msg: Msg) {
        if self.bag.len() >= BAG_LIMIT {
            self.bag.remove(0);
        }
        self.bag.push(msg);
    }

    /// The master's view for planning: its cached record, its reports, reachability.
    fn master_view(&self, master: &Master) -> MasterView {
        let mut view = master.cache.record.clone();
        for (name, record) in &mut view.seeds {
            record.report = master.reports.get(name).cloned();
            record.reachable = self.seeds.iter().any(|s| &s.name == name && !s.partitioned);
        }
        view
    }

    /// `sum over seeds in the record of (granted in the record - released)`: what the master's
    /// record says seeds may hold at most.
    fn record_exposure(&self) -> Rd {
        let mut total = rd(self.n, [0, 0]);
        for seed in &self.seeds {
            if let Some(r) = self.persisted.record.seeds.get(&seed.name) {
                total = add(&total, &r.granted.saturating_sub(&seed.copy.share.released));
            }
        }
        total
    }

    /// Seed `i`'s copy as the master reads it now.
    fn report_of(&self, i: usize) -> SeedReport {
        let s = &self.seeds[i];
        s.copy
            .share
            .report(s.copy.version, &s.copy.committed(), s.copy.demand.as_ref())
    }

    fn deliverable(&self, msg: &Msg) -> bool {
        match msg {
            Msg::Word { seed, .. } | Msg::Fold { seed, .. } => !self.seeds[*seed].partitioned,
            Msg::Report { seed, .. } => !self.seeds[*seed].partitioned && self.master.is_some(),
        }
    }

    fn deliver(&mut self, msg: Msg) {
        match msg {
            Msg::Word { seed, limit, word } => {
                let s = &mut self.seeds[seed];
                // The limit rides on every apply of the ledger; the share word only on a newer
                // version (an older one is refused by the ledger's rule, the limit with it).
                let current = word.version == s.copy.share.version && limit != s.copy.limit;
                if s.copy.share.receive(&word) || current {
                    s.copy.limit = limit;
                    s.bump();
                }
                // A record rebuilt from a stale reading may give a seed less than it committed:
                // that use is above its share from then on, as if it had appeared unadmitted
                // (the master counts it as held all the same).
                let over = s.copy.committed().saturating_sub(&s.copy.share.share());
                s.unadmitted = largest([&s.unadmitted, &over]).unwrap_or_default();
            }
            Msg::Fold { seed, others } => {
                let s = &mut self.seeds[seed];
                s.copy.others = others;
                s.bump();
            }
            Msg::Report { seed, report } => {
                let name = self.seeds[seed].name.clone();
                if let Some(m) = &mut self.master {
                    let mut record = SeedRecord::new();
                    if let Some(old) = m.reports.remove(&name) {
                        record.observe(old);
                    }
                    record.observe(report);
                    m.reports.insert(name, record.report.unwrap());
                }
            }
        }
    }

    /// One step; every write of a seed's copy also puts its new state in flight to the master
    /// (the master watches the copies). Returns an error when an admission broke its own rule.
    fn step(&mut self, step: &Step, cov: &mut Coverage) -> Result<(), String> {
        let versions: Vec<u64> = self.seeds.iter().map(|s| s.copy.version).collect();
        self.step_inner(step, cov)?;
        for (i, before) in versions.into_iter().enumerate() {
            if self.seeds[i].copy.version != before {
                self.step_inner(&Step::Report { seed: i }, cov)?;
            }
        }
        Ok(())
    }

    fn step_inner(&mut self, step: &Step, cov: &mut Coverage) -> Result<(), String> {
        let n = self.n;
        let len = self.seeds.len();
        match step {
            Step::MasterRound => {
                for s in [Step::MasterRefresh, Step::MasterPlan] {
                    self.step(&s, cov)?;
                }
                if !self.limbo.is_empty() {
                    let pick = self.limbo.len() - 1;
                    self.step(&Step::ServerApply { pick, land: true }, cov)?;
                }
                for s in [Step::MasterRefresh, Step::MasterSend] {
                    self.step(&s, cov)?;
                }
                return Ok(());
            }
            Step::DeliverMany { picks } => {
                for &pick in picks {
                    self.step(&Step::Deliver { pick, dup: false }, cov)?;
                }
                return Ok(());
            }
            &Step::WritePass { seed } => {
                if self.seeds[seed % self.seeds.len()].flight.is_none() {
                    self.step(&Step::BeginWrite { seed, requests: true }, cov)?;
                    return self.step(&Step::EndWrite { seed, how: 0 }, cov);
                }
                return Ok(());
            }
            &Step::LateLanding { seed, amount } => {
                if self.seeds[seed % self.seeds.len()].flight.is_none() {
                    for s in [
                        Step::BeginWrite { seed, requests: true },
                        Step::EndWrite { seed, how: 3 },
                        Step::AdmitFromAllotment { seed, amount },
                        Step::StrayLands { seed },
                    ] {
                        self.step(&s, cov)?;
                    }
                }
                return Ok(());
            }
            &Step::ReleaseNow { seed, quiet } => {
                self.step(&Step::DecideRelease { seed, quiet }, cov)?;
                return self.step(&Step::WriteRelease { seed }, cov);
            }
            _ => {}
        }
        match *step {
            Step::Admit { seed, amount, ask } => {
                let s = &mut self.seeds[seed % len];
                let request = rd(n, amount);
                let committed = s.copy.committed();
                if request.is_empty() {
                    return Ok(());
                }
                if s.copy
                    .share
                    .fits(&s.copy.limit, &s.copy.others, &committed, &request)
                    .is_ok()
                {
                    let before = s.committed_once();
                    s.copy.reserved = add(&s.copy.reserved, &request);
                    s.copy.demand = None;
                    s.bump();
                    check_within_capacity(s, &before)?;
                    if !s.copy.share.granted.is_empty() && !request.is_empty() {
                        cov.admitted_after_grant += 1;
                    }
                    self.check_beside_others(seed % len, &before)?;
                } else if ask {
                    s.copy.demand = Some(SeedShare::demand_for(&s.copy.limit, &committed, &request));
                    s.bump();
                }
            }
            Step::AdmitFromAllotment { seed, amount } => {
                let request = rd(n, amount);
                if request.is_empty() {
                    return Ok(());
                }
                self.next_machine += 1;
                let uid = self.next_machine;
                let now = self.now;
                let s = &mut self.seeds[seed % len];
                let own = s.copy.allotments.get(&s.process).map(|(held, _)| held.clone());
                let uid_text = s.copy.uid();
                let sight = LedgerSight {
                    quota_uid: Some(&uid_text),
                    counted: true,
                    wanted_back: s.allotment_wanted_back(),
                    own_granted: own.as_ref(),
                };
                // The quota as everything but our own allotment leaves it, with what we admitted
                // from it (`QuotaState::for_holder` and `decide` in machine-webhook).
                let beside = s.committed_beside_own();
                let (limit, others, share) = (&s.copy.limit, &s.copy.others, &s.copy.share);
                let answer = s.webhook.admit(now, Some(&sight), limit, &request, |admitted| {
                    share
                        .fits(limit, others, &add(&beside, admitted), &request)
                        .ok()
                        .map(|()| Some(reservation(uid, &request)))
                });
                if let FastAdmission::Admitted { .. } = answer {
                    s.machines.insert(uid, (s.process, request));
                    cov.fast_admissions += 1;
                }
            }
            Step::BeginWrite { seed, requests } => {
                let now = self.now;
                let config = self.allotment.clone();
                let s = &mut self.seeds[seed % len];
                if s.flight.is_some() {
                    return Ok(());
                }
                let recorded = &s.copy.recorded;
                let (unrecorded, unrecorded_total) = s
                    .webhook
                    .unrecorded(|r| recorded.contains_key(&uid_of(r)))
                    .unwrap();
                let beside = add(&s.committed_beside_own(), &unrecorded_total);
                let capacity = s.copy.share.capacity_beside(&s.copy.limit, &s.copy.others);
                let wanted_elsewhere = s.allotment_wanted_back();
                let pass = Pass {
                    requests,
                    wanted_elsewhere,
                    wants_share: false,
                    stopping: false,
                };
                let grant = s
                    .webhook
                    .next_grant(now, &config, pass, || Some(grant_for(&capacity, &beside)));
                let own = s.copy.allotments.get(&s.process).map(|(held, _)| held.clone());
                let writes_allotment = match (&own, &grant) {
                    (None, None) => false,
                    (Some(own), Some(grant)) => {
                        own != grant || s.webhook.renewal_due(now, config.ttl) || !unrecorded.is_empty()
                    }
                    _ => true,
                };
                let writes = writes_allotment || !unrecorded.is_empty();
                if !writes {
                    s.webhook.nothing_written(grant.is_some(), true);
                    return Ok(());
                }
                let uid_text = s.copy.uid();
                let carried = s.webhook.carried_after(
                    Some(&uid_text),
                    s.copy
                        .allotments
                        .get(&(s.process | CARRIED))
                        .map(|(held, _)| held),
                    &unrecorded_total,
                );
                let own_granted = own.unwrap_or_default();
                let start = s.webhook.begin_write(
                    now,
                    Planned {
                        copy_uid: Some(&uid_text),
                        own_granted: &own_granted,
                        grant,
                        writes_allotment,
                        writes,
                        requests,
                    },
                );
                s.flight = Some(Flight {
                    version: s.copy.version,
                    process: s.process,
                    started: now,
                    start,
                    records: unrecorded
                        .iter()
                        .map(|r| (uid_of(r), r.reserved.clone()))
                        .collect(),
                    carried,
                });
            }
            Step::EndWrite { seed, how } => {
                let i = seed % len;
                let Some(flight) = self.seeds[i].flight.take() else {
                    return Ok(());
                };
                let now = self.now;
                let ttl = self.allotment.ttl;
                if how == 3 {
                    // Timed out: the process gives up on it; it may still land.
                    let s = &mut self.seeds[i];
                    s.webhook.write_failed(&flight.start, false);
                    s.webhook.gave_up(now, true);
                    s.stray = Some(flight);
                    return Ok(());
                }
                let landed = how <= 1 && self.land(i, &flight)?;
                if landed && flight.carried.is_some() {
                    cov.carried_recorded += 1;
                }
                let s = &mut self.seeds[i];
                let uid_text = s.copy.uid();
                match (how, landed) {
                    (0, true) => {
                        s.webhook
                            .landed(flight.started, Some(&uid_text), &flight.start, ttl);
                    }
                    (_, false) if flight.version != s.copy.version => {
                        cov.allotment_conflicts += 1;
                        s.webhook.write_failed(&flight.start, true);
                    }
                    _ => {
                        s.webhook.write_failed(&flight.start, false);
                        s.webhook.gave_up(now, true);
                    }
                }
            }
            Step::StrayLands { seed } => {
                let i = seed % len;
                if let Some(flight) = self.seeds[i].stray.take()
                    && self.land(i, &flight)?
                {
                    cov.late_landings += 1;
                }
            }
            Step::Tick { secs } => self.now += Duration::from_secs(secs),
            Step::Count { seed } => {
                let s = &mut self.seeds[seed % len];
                s.copy.counted = add(&s.copy.counted, &s.copy.reserved);
                s.copy.reserved = rd(n, [0, 0]);
                // Machines with a reservation are counted, and the reservation dropped; one
                // already counted is only dropped.
                for (uid, size) in std::mem::take(&mut s.copy.recorded) {
                    if s.counted_machines.insert(uid) {
                        s.machines.remove(&uid);
                        s.copy.counted = add(&s.copy.counted, &size);
                    }
                }
                s.bump();
            }
            Step::Delete { seed, amount } => {
                let s = &mut self.seeds[seed % len];
                s.copy.counted = s.copy.counted.saturating_sub(&rd(n, amount));
                // What is above the share shrinks with the use: never more allowed than there is.
                let excess = s.copy.committed().saturating_sub(&s.copy.share.share());
                s.unadmitted = s.unadmitted.saturating_sub(&s.unadmitted.saturating_sub(&excess));
                s.bump();
            }
            Step::Surge { seed, amount } => {
                let request = rd(n, amount);
                let s = &mut self.seeds[seed % len];
                // Only a Machine that replaces one as large that is counted.
                if request.is_empty() || !s.copy.counted.covers(&request) {
                    return Ok(());
                }
                // machine-webhook's rule (`decide_surge`): every allotment counted whole.
                let capacity = s.copy.share.capacity_beside(&s.copy.limit, &s.copy.others);
                if surge_fits(&capacity, &s.copy.committed(), &request, &request).is_err() {
                    cov.surges_refused += 1;
                    return Ok(());
                }
                let before = s.committed_apart();
                s.copy.reserved = add(&s.copy.reserved, &request);
                s.surges.push(request);
                s.bump();
                check_within_capacity(s, &before)?;
                self.check_beside_others(seed % len, &before)?;
                cov.surges += 1;
            }
            Step::SurgeEnds { seed } => {
                let s = &mut self.seeds[seed % len];
                if s.surges.is_empty() {
                    return Ok(());
                }
                let replaced = s.surges.remove(0);
                s.copy.counted = s.copy.counted.saturating_sub(&replaced);
                s.bump();
            }
            Step::Appear { seed, amount } => {
                let amount = rd(n, amount);
                if !self.appear_enabled || amount.iter().all(|(_, q)| q == Quantity::ZERO) {
                    return Ok(());
                }
                let s = &mut self.seeds[seed % len];
                s.copy.counted = add(&s.copy.counted, &amount);
                s.unadmitted = add(&s.unadmitted, &amount);
                s.bump();
                self.appeared = true;
            }
            Step::CrashWebhook { seed } => {
                // What it admitted exists, covered by its allotment until that expires; its write
                // in flight may still land.
                let s = &mut self.seeds[seed % len];
                s.webhook = AllotmentHolder::default();
                s.process += 1;
                if let Some(flight) = s.flight.take() {
                    s.stray = Some(flight);
                }
            }
            Step::LoseRecord => {
                for record in self.persisted.record.seeds.values_mut() {
                    *record = SeedRecord {
                        retiring: record.retiring,
                        ..SeedRecord::new()
                    };
                }
                self.persisted.version += 1;
                self.persisted.record_version = 0;
                self.record_lost = true;
                cov.lost_records += 1;
            }
            Step::RecreateLedger {
                seed,
                seen_gap,
                created,
            } => {
                let i = seed % len;
                // The master creates it in a round's send, from the newest record it knows
                // (its own last write included, and none of its writes still in flight): a
                // master behind its own record re-reads first.
                let Some(master) = self
                    .master
                    .as_ref()
                    .filter(|m| m.cache.version == self.persisted.version && self.limbo.is_empty())
                else {
                    return Ok(());
                };
                let Some(rec) = master.cache.record.seeds.get(&self.seeds[i].name) else {
                    return Ok(());
                };
                let word = MasterWord {
                    version: master.cache.record_version,
                    granted: rec.granted.clone(),
                    target: rec.target.clone(),
                    released: rec.released_floor.clone(),
                };
                let limit = master.cache.record.limit.clone();
                let zero = rd(n, [0, 0]);
                let (now, ttl) = (self.now, self.allotment.ttl);
                let s = &mut self.seeds[i];
                // Counted anew, carrying the reservations and allotments of the deleted ledger.
                // When every admitted Machine exists, those with a reservation are counted (the
                // reservation dropped) and those from an allotment are held back while it is
                // carried; else only what was counted before is, and the rest stays covered by
                // what was carried over.
                if !created && (!s.machines.is_empty() || !s.copy.reserved.is_empty()) {
                    cov.recreated_in_flight += 1;
                }
                if created {
                    s.copy.counted = add(&s.copy.counted, &s.copy.reserved);
                    s.copy.reserved = zero.clone();
                    for (uid, size) in std::mem::take(&mut s.copy.recorded) {
                        if s.counted_machines.insert(uid) {
                            s.machines.remove(&uid);
                            s.copy.counted = add(&s.copy.counted, &size);
                        }
                    }
                    s.count_uncovered_machines();
                }
                // Carried allotments cover only what was admitted before the deletion (no holder
                // admits from an entry in a ledger it has not written): seed-controller gives
                // them the admission record grace, not the holders' TTL, and renames them, so
                // that no holder removes one as its own (`ledger::carried_holder`).
                let grace = Duration::from_secs(5);
                let carried_seen = now.checked_sub(ttl.saturating_sub(grace)).unwrap_or(now);
                let mut carried: BTreeMap<u32, (Rd, Instant)> = BTreeMap::new();
                for (process, (held, seen)) in std::mem::take(&mut s.copy.allotments) {
                    let entry = carried
                        .entry(process | CARRIED)
                        .or_insert_with(|| (zero.clone(), carried_seen));
                    entry.0 = add(&entry.0, &held);
                    entry.1 = entry.1.min(seen);
                }
                s.copy.allotments = carried;
                s.copy.incarnation += 1;
                if seen_gap {
                    s.webhook.forget(now);
                }
                s.copy.share = SeedShare::default();
                s.copy.share.receive(&word);
                // A record lost too (rebuilt from nothing but this seed's usage): what runs is
                // above the share, as if it had appeared without admission.
                let over = s.copy.committed().saturating_sub(&s.copy.share.share());
                s.unadmitted = largest([&s.unadmitted, &over]).unwrap_or_default();
                self.appeared |= !over.is_empty() && over.iter().any(|(_, q)| q > Quantity::ZERO);
                s.copy.limit = limit;
                s.copy.demand = None;
                s.copy.others = zero;
                s.pending_release = None;
                s.bump();
                // The master reads a seed's ledgers through one ordered watch: every report of
                // the deleted ledger reaches it before the deletion, and the deletion before the
                // new ledger. (Not modelled: a round between the old ledger's last report and
                // its deletion, after the master created the new one; see docs/operations.md.)
                self.bag
                    .retain(|msg| !matches!(msg, Msg::Report { seed, .. } if *seed == i));
                self.restored_now = true;
                let name = self.seeds[i].name.clone();
                if let Some(m) = &mut self.master {
                    m.reports.remove(&name);
                }
                cov.recreated += 1;
            }
            Step::ExpireAllotment { seed } => {
                // seed-controller removes allotments a TTL after it first saw them (a dead
                // process never renews), and counts the Machines no allotment covers any more.
                let (now, ttl) = (self.now, self.allotment.ttl);
                let s = &mut self.seeds[seed % len];
                let before = s.copy.allotments.len();
                s.copy.allotments.retain(|_, (_, seen)| now < *seen + ttl);
                if s.copy.allotments.len() < before {
                    s.count_uncovered_machines();
                    s.bump();
                    cov.expired_allotments += 1;
                }
            }
            Step::Withdraw { seed } => {
                let s = &mut self.seeds[seed % len];
                s.copy.demand = None;
                s.bump();
            }
            Step::Report { seed } => {
                let report = self.report_of(seed % len);
                self.send(Msg::Report {
                    seed: seed % len,
                    report,
                });
            }
            Step::DecideRelease { seed, quiet } => {
                let s = &mut self.seeds[seed % len];
                let quiet = quiet && s.copy.demand.is_none();
                let due = s
                    .copy
                    .share
                    .release_due(&s.copy.limit, &s.copy.committed(), &self.slack, quiet);
                s.pending_release = Some((s.copy.version, due));
            }
            Step::WriteRelease { seed } => {
                let s = &mut self.seeds[seed % len];
                if let Some((version, due)) = s.pending_release.take()
                    && version == s.copy.version
                    && !due.is_empty()
                {
                    s.copy.share.release(&due).unwrap();
                    s.bump();
                    cov.releases += 1;
                }
            }
            Step::CrashSeedController { seed } => self.seeds[seed % len].pending_release = None,
            Step::MasterRefresh => {
                if let Some(m) = &mut self.master {
                    m.cache = self.persisted.clone();
                }
            }
            Step::MasterPlan => {
                if let Some(m) = &self.master {
                    let mut view = self.master_view(m);
                    let (base, adopted) = view.adopt(m.cache.record_version);
                    cov.adopted += usize::from(adopted);
                    let plan = view.plan_at(base + 1, &self.slack).unwrap();
                    if view.apply(&plan).unwrap() || adopted {
                        // Only the record is persisted: reports and reachability are not.
                        for record in view.seeds.values_mut() {
                            record.report = None;
                            record.reachable = true;
                        }
                        self.limbo.push((m.cache.version, base + 1, adopted, view));
                    }
                }
            }
            Step::ServerApply { pick, land } => {
                if !self.limbo.is_empty() {
                    let (base, record_version, adopted, record) = self.limbo.remove(pick % self.limbo.len());
                    self.restored_now |= land && adopted && base == self.persisted.version;
                    if land && base == self.persisted.version {
                        let grew = record.seeds.iter().any(|(name, r)| {
                            self.persisted
                                .record
                                .seeds
                                .get(name)
                                .is_some_and(|old| old.granted != r.granted)
                        });
                        cov.landed_grants += usize::from(grew);
                        cov.forgotten += self.persisted.record.seeds.len() - record.seeds.len();
                        for (name, r) in &record.seeds {
                            let high = self.granted_high.entry(name.clone()).or_default();
                            *high = largest([&*high, &r.granted]).unwrap_or_default();
                        }
                        self.persisted = Persisted {
                            version: self.persisted.version + 1,
                            record_version,
                            record,
                        };
                    } else {
                        cov.failed_writes += 1;
                    }
                }
            }
            Step::MasterSend => {
                if let Some(m) = &self.master {
                    let words: Vec<Msg> = self
                        .seeds
                        .iter()
                        .enumerate()
                        .filter_map(|(i, s)| {
                            let r = m.cache.record.seeds.get(&s.name)?;
                            Some(Msg::Word {
                                seed: i,
                                limit: m.cache.record.limit.clone(),
                                word: MasterWord {
                                    version: m.cache.record_version,
                                    granted: r.granted.clone(),
                                    target: r.target.clone(),
                                    released: r.released_floor.clone(),
                                },
                            })
                        })
                        .collect();
                    // The fold: every other seed's committed as the master last read it.
                    let folds: Vec<Msg> = (0..self.seeds.len())
                        .map(|i| {
                            let others: Vec<Rd> = self
                                .seeds
                                .iter()
                                .enumerate()
                                .filter(|(j, _)| *j != i)
                                .filter_map(|(_, s)| m.reports.get(&s.name).map(|r| r.committed.clone()))
                                .collect();
                            let others = ResourceDetails::checked_sum(others.iter()).unwrap();
                            Msg::Fold { seed: i, others }
                        })
                        .collect();
                    for w in words.into_iter().chain(folds) {
                        self.send(w);
                    }
                }
            }
            Step::CrashMaster => self.master = None,
            Step::RestartMaster => {
                if self.master.is_none() {
                    // The new process lists every seed it reaches before it plans anything
                    // (master-controller's settling): it starts from their copies as they are.
                    let reports = (0..len)
                        .filter(|&i| !self.seeds[i].partitioned)
                        .map(|i| (self.seeds[i].name.clone(), self.report_of(i)))
                        .collect();
                    self.master = Some(Master {
                        cache: self.persisted.clone(),
                        reports,
                    });
                }
            }
            Step::QuotaEdit { resource, by, lower } => {
                if resource < n {
                    let r = RESOURCES[resource];
                    let old = self.limit().amount(r);
                    let new = if lower {
                        old.saturating_sub_to_zero(units(by))
                    } else {
                        old.checked_add(units(by)).unwrap()
                    };
                    self.lowered |= new < old;
                    self.persisted.record.limit.set(r, Some(new));
                    self.persisted.version += 1;
                }
            }
            Step::Deliver { pick, dup } => {
                if !self.bag.is_empty() {
                    let i = pick % self.bag.len();
                    if self.deliverable(&self.bag[i]) {
                        let msg = if dup {
                            self.bag[i].clone()
                        } else {
                            self.bag.remove(i)
                        };
                        self.deliver(msg);
                    }
                }
            }
            Step::Drop { pick } => {
                if !self.bag.is_empty() {
                    self.bag.remove(pick % self.bag.len());
                }
            }
            Step::Partition { seed } => self.seeds[seed % len].partitioned = true,
            Step::Heal { seed } => {
                // The master's watch reconnects with a list: it reads the copy as it is.
                let i = seed % len;
                if std::mem::replace(&mut self.seeds[i].partitioned, false) {
                    let report = self.report_of(i);
                    self.deliver(Msg::Report { seed: i, report });
                }
            }
            Step::MasterRound
            | Step::DeliverMany { .. }
            | Step::ReleaseNow { .. }
            | Step::WritePass { .. }
            | Step::LateLanding { .. } => {}
            Step::Retire { seed } => {
                // Never all seeds: the liveness phase needs one.
                let name = self.seeds[seed % len].name.clone();
                let retiring = self
                    .persisted
                    .record
                    .seeds
                    .values()
                    .filter(|r| r.retiring)
                    .count();
                if retiring + 1 < len
                    && let Some(r) = self.persisted.record.seeds.get_mut(&name)
                {
                    r.retiring = true;
                    self.persisted.version += 1;
                }
            }
        }
        Ok(())
    }

    /// A webhook write lands on seed `i` if the copy has not moved since it was planned
    /// (compare-and-swap); checked like every admission.
    fn land(&mut self, i: usize, flight: &Flight) -> Result<bool, String> {
        let now = self.now;
        let s = &mut self.seeds[i];
        if flight.version != s.copy.version {
            return Ok(false);
        }
        let before = s.committed_once();
        for (uid, size) in &flight.records {
            s.copy.recorded.insert(*uid, size.clone());
        }
        if flight.start.writes_allotment {
            match &flight.start.grant {
                Some(grant) => {
                    s.copy.allotments.insert(flight.process, (grant.clone(), now));
                }
                None => {
                    s.copy.allotments.remove(&flight.process);
                }
            }
        }
        let carried_key = flight.process | CARRIED;
        match &flight.carried {
            Some(CarriedChange::Shrinks(left)) => {
                if let Some(entry) = s.copy.allotments.get_mut(&carried_key) {
                    entry.0 = left.clone();
                }
            }
            Some(CarriedChange::Goes) => {
                s.copy.allotments.remove(&carried_key);
            }
            None => {}
        }
        s.bump();
        check_within_capacity(s, &before)?;
        self.check_beside_others(i, &before)?;
        Ok(true)
    }

    /// The invariants, checked in every reachable state. `exposure_before` is the record
    /// exposure before the step.
    fn check(&self, exposure_before: &Rd) -> Result<(), String> {
        let limit = self.limit();
        let exposure = self.record_exposure();
        for (r, limit) in limit.iter() {
            let mut sum_exposure = Quantity::ZERO;
            for s in &self.seeds {
                let share = s.copy.share.share().amount(r);
                if s.real_usage().amount(r) > s.committed_once().amount(r) {
                    return Err(format!("{}: {r} used beyond committed", s.name));
                }
                // The rollout allowance's bound: a seed is over its share by at most one surge
                // Machine (the largest running), never by surges stacked on each other.
                let largest_surge = s
                    .surges
                    .iter()
                    .map(|g| g.amount(r))
                    .max()
                    .unwrap_or(Quantity::ZERO);
                if s.committed_once()
                    .amount(r)
                    .saturating_sub_to_zero(s.unadmitted.amount(r))
                    > share.checked_add(largest_surge).unwrap()
                {
                    return Err(format!(
                        "{}: {r} committed {:?} above share {share:?} by more than one surge ({:?})",
                        s.name,
                        s.committed_once().amount(r),
                        s.surges
                    ));
                }
                // Surges are over by the admin's leave, counted apart.
                let committed = s.committed_apart().amount(r);
                if committed.saturating_sub_to_zero(s.unadmitted.amount(r)) > share {
                    return Err(format!(
                        "{}: {r} committed {committed:?} above share {share:?}",
                        s.name
                    ));
                }
                if let Some(high) = self.granted_high.get(&s.name)
                    && s.copy.share.granted.amount(r) > high.amount(r)
                {
                    return Err(format!(
                        "{}: {r} granted on the seed above the master's record",
                        s.name
                    ));
                }
                sum_exposure = sum_exposure.checked_add(share.max(committed)).unwrap();
            }
            if !self.lowered && !self.appeared && sum_exposure > limit {
                return Err(format!(
                    "{r}: sum of max(share, committed) {sum_exposure:?} > limit {limit:?}"
                ));
            }
            let (now, before) = (exposure.amount(r), exposure_before.amount(r));
            // Usage that appeared without admission is covered by share when its seed asks
            // (what it holds counts as held either way), so the record may then grant past
            // the limit what only restates that usage.
            if !self.appeared && (!self.lowered || (now > before && !self.restored_now)) && now > limit {
                return Err(format!("{r}: record exposure {now:?} > limit {limit:?}"));
            }
        }
        Ok(())
    }

    /// After seed `i` admitted (for each resource its committed grew from `before`): what all
    /// seeds committed together is within the limit, unless seed `i` could not know better: its fold of the others' usage was behind
    /// what they commit now, or the limit was lowered. This is the rule usage that appears
    /// without admission tests: a share alone would admit into room such usage already fills.
    fn check_beside_others(&self, i: usize, before: &Rd) -> Result<(), String> {
        if self.lowered {
            return Ok(());
        }
        let seed = &self.seeds[i];
        for (r, limit) in self.limit().iter() {
            if seed.committed_apart().amount(r) <= before.amount(r) {
                continue;
            }
            let total = self
                .seeds
                .iter()
                .try_fold(Quantity::ZERO, |sum, s| {
                    sum.checked_add(s.committed_apart().amount(r))
                })
                .unwrap();
            let others_now = total.saturating_sub_to_zero(seed.committed_apart().amount(r));
            if total > limit && seed.copy.others.amount(r) >= others_now {
                return Err(format!(
                    "{}: admitted {r} to a total of {total:?} > limit {limit:?} while it knew the \
                     other seeds use {:?}",
                    seed.name,
                    seed.copy.others.amount(r)
                ));
            }
        }
        Ok(())
    }

    fn liveness_rounds(&self) -> usize {
        LIVENESS_ROUNDS + if self.record_lost { REBUILD_ROUNDS } else { 0 }
    }

    /// Liveness: heal, settle, then a lone seed asks for all the headroom left; within
    /// [`LIVENESS_ROUNDS`] fair rounds it must fit.
    fn liveness(&mut self, lone: usize, cov: &mut Coverage) -> Result<(), String> {
        for s in &mut self.seeds {
            s.partitioned = false;
        }
        // Every rollout finishes.
        for i in 0..self.seeds.len() {
            while !self.seeds[i].surges.is_empty() {
                self.step(&Step::SurgeEnds { seed: i }, cov)?;
            }
        }
        if self.master.is_none() {
            self.master = Some(Master {
                cache: self.persisted.clone(),
                reports: BTreeMap::new(),
            });
        }
        self.settle_limbo(cov);
        // Every webhook write ends, the webhooks idle and give their allotments back (recording
        // what they admitted), and dead processes' allotments expire.
        for i in 0..self.seeds.len() {
            self.step(&Step::EndWrite { seed: i, how: 0 }, cov)?;
            self.step(&Step::StrayLands { seed: i }, cov)?;
        }
        let idle = self.allotment.ttl + Duration::from_secs(1);
        self.now += idle;
        for i in 0..self.seeds.len() {
            self.step(
                &Step::BeginWrite {
                    seed: i,
                    requests: false,
                },
                cov,
            )?;
            self.step(&Step::EndWrite { seed: i, how: 0 }, cov)?;
            self.step(&Step::ExpireAllotment { seed: i }, cov)?;
            self.step(&Step::Count { seed: i }, cov)?;
            self.step(&Step::Withdraw { seed: i }, cov)?;
            self.seeds[i].pending_release = None;
        }
        // The lone seed: one that is in the record and not retiring.
        let candidates: Vec<usize> = (0..self.seeds.len())
            .filter(|&i| {
                let name = &self.seeds[i].name;
                self.persisted.record.seeds.get(name).is_some_and(|r| !r.retiring)
            })
            .collect();
        let Some(&lone) = candidates.get(lone % candidates.len().max(1)) else {
            return Ok(());
        };
        let total = ResourceDetails::checked_sum(
            self.seeds
                .iter()
                .map(|s| s.copy.committed())
                .collect::<Vec<_>>()
                .iter(),
        )
        .unwrap();
        let request = bounded_by(self.limit(), &self.limit().saturating_sub(&total));
        if request.is_empty() {
            return Ok(());
        }
        cov.liveness_checked += 1;
        let mut view = self.persisted.record.clone();
        for (name, r) in &mut view.seeds {
            let seed = self.seeds.iter().find(|s| &s.name == name).unwrap();
            r.report = Some(seed.copy.share.report(0, &seed.copy.committed(), None));
        }
        let lone_free = add(&view.free().unwrap(), &self.seeds[lone].copy.share.share());
        if fits_within(
            &bounded_by(self.limit(), &lone_free),
            &self.seeds[lone].copy.committed(),
            &request,
        )
        .is_err()
        {
            cov.liveness_moved_share += 1;
        }
        {
            let s = &mut self.seeds[lone];
            s.copy.demand = Some(SeedShare::demand_for(
                &s.copy.limit,
                &s.copy.committed(),
                &request,
            ));
            s.bump();
        }
        for _ in 0..self.liveness_rounds() {
            self.fair_round(cov)?;
            let s = &self.seeds[lone];
            if s.copy
                .share
                .fits(&s.copy.limit, &s.copy.others, &s.copy.committed(), &request)
                .is_ok()
            {
                return self.greed(lone, cov);
            }
        }
        let s = &self.seeds[lone];
        Err(format!(
            "{} never got {request} (committed {}, share {}, target {}); master record {:?}",
            s.name,
            s.copy.committed(),
            s.copy.share.share(),
            s.copy.share.target,
            self.persisted.record
        ))
    }

    /// Then the lone seed asks for the whole limit: within [`LIVENESS_ROUNDS`] its capacity must
    /// reach `limit - sum of the other seeds' committed`, and taking all of it must keep every
    /// invariant (headroom counted twice anywhere shows up here as an overrun).
    fn greed(&mut self, lone: usize, cov: &mut Coverage) -> Result<(), String> {
        let limit = self.limit().clone();
        let others: Vec<Rd> = (0..self.seeds.len())
            .filter(|&i| i != lone)
            .map(|i| self.seeds[i].copy.committed())
            .collect();
        let others = ResourceDetails::checked_sum(others.iter()).unwrap();
        let expected = bounded_by(&limit, &limit.saturating_sub(&others));
        {
            let s = &mut self.seeds[lone];
            s.copy.demand = Some(SeedShare::demand_for(&limit, &ResourceDetails::default(), &limit));
            s.bump();
        }
        for _ in 0..self.liveness_rounds() {
            self.fair_round(cov)?;
        }
        let s = &mut self.seeds[lone];
        let capacity = s.copy.share.capacity_beside(&s.copy.limit, &s.copy.others);
        if !capacity.covers(&expected) {
            return Err(format!("{} reached capacity {capacity}, not {expected}", s.name));
        }
        let before = self.record_exposure();
        let s = &mut self.seeds[lone];
        let take = capacity.saturating_sub(&s.copy.committed());
        s.copy.reserved = add(&s.copy.reserved, &take);
        s.copy.demand = None;
        s.bump();
        self.check(&before)
    }

    /// One fair round: every seed reports, everything is delivered, the master plans, persists
    /// and sends, everything is delivered, every seed releases what is due.
    fn fair_round(&mut self, cov: &mut Coverage) -> Result<(), String> {
        for i in 0..self.seeds.len() {
            self.step(&Step::Report { seed: i }, cov)?;
        }
        self.deliver_all();
        self.step(&Step::MasterRefresh, cov)?;
        self.step(&Step::MasterPlan, cov)?;
        self.settle_limbo(cov);
        self.step(&Step::MasterRefresh, cov)?;
        self.step(&Step::MasterSend, cov)?;
        self.deliver_all();
        for i in 0..self.seeds.len() {
            self.step(
                &Step::DecideRelease {
                    seed: i,
                    quiet: false,
                },
                cov,
            )?;
            self.step(&Step::WriteRelease { seed: i }, cov)?;
        }
        self.check(&self.record_exposure())
    }

    fn settle_limbo(&mut self, cov: &mut Coverage) {
        while !self.limbo.is_empty() {
            self.step(&Step::ServerApply { pick: 0, land: true }, cov)
                .unwrap();
        }
    }

    fn deliver_all(&mut self) {
        for msg in std::mem::take(&mut self.bag) {
            self.deliver(msg);
        }
    }
}

/// A Machine's UID in the model.
fn uid_of(reservation: &Reservation) -> u64 {
    reservation.uid.parse().unwrap()
}

fn reservation(uid: u64, size: &Rd) -> Reservation {
    Reservation {
        cluster: "user-cluster".into(),
        uid: uid.to_string(),
        size: size.clone(),
        reserved: size.clone(),
        created_at: Timestamp::UNIX_EPOCH,
        deployment: None,
    }
}

/// An admission that grew `committed` must leave it within the seed's capacity as it sees it.
fn check_within_capacity(s: &Seed, before: &Rd) -> Result<(), String> {
    // Computed here, not by `SeedShare::capacity`: min(share, target, limit) as the seed sees it.
    let (share, target) = (s.copy.share.share(), &s.copy.share.target);
    let mut capacity = Rd::default();
    for (r, limit) in s.copy.limit.iter() {
        let held = share.amount(r).min(limit);
        capacity.set(r, Some(target.get(r).map_or(held, |t| held.min(t))));
    }
    let after = s.committed_apart();
    for (r, cap) in capacity.iter() {
        if after.amount(r) > before.amount(r) && after.amount(r) > cap {
            return Err(format!(
                "{}: admission took {r} committed to {after} above capacity {capacity}",
                s.name
            ));
        }
    }
    Ok(())
}

fn run(setup: &Setup, cov: &mut Coverage) -> Result<(), String> {
    let mut world = World::new(setup);
    for (i, step) in setup.steps.iter().enumerate() {
        let before = world.record_exposure();
        world.restored_now = false;
        world
            .step(step, cov)
            .and_then(|()| world.check(&before))
            .map_err(|e| format!("after step {i} {step:?}: {e}"))?;
    }
    cov.lowered_runs += usize::from(world.lowered);
    cov.appeared_runs += usize::from(world.appeared);
    world
        .liveness(setup.lone, cov)
        .map_err(|e| format!("liveness: {e}"))
}

#[test]
fn shares_hold_the_limit_and_follow_demand() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(600);
    let coverage = RefCell::new(Coverage::default());
    // Every case checks the limit. The rarest states (a ledger re-created with Machines on their
    // way: about 4 in 600 runs, so none in about 1 of 70 batches) get more random runs, at most
    // `MORE_BATCHES` batches more, rather than a fixed seed that would explore the same runs on
    // every CI run.
    let mut batches = 0;
    loop {
        batches += 1;
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        });
        let result = runner.run(&setup(), |setup| {
            let mut cov = coverage.borrow_mut();
            run(&setup, &mut cov).map_err(TestCaseError::fail)
        });
        if let Err(e) = result {
            panic!("{e}");
        }
        if coverage.borrow().rare_states_reached() || batches > MORE_BATCHES {
            break;
        }
    }
    let cov = coverage.into_inner();
    eprintln!("{batches} x {cases} runs: {cov:?}");
    assert!(
        cov.landed_grants > 0 && cov.failed_writes > 0 && cov.releases > 0,
        "{cov:?}"
    );
    assert!(
        cov.admitted_after_grant > 0
            && cov.lowered_runs > 0
            && cov.liveness_moved_share > 0
            && cov.appeared_runs > 0
            && cov.recreated > 0
            && cov.recreated_in_flight > 0
            && cov.adopted > 0
            && cov.fast_admissions > 0
            && cov.allotment_conflicts > 0
            && cov.late_landings > 0
            && cov.expired_allotments > 0
            && cov.surges > 0
            && cov.surges_refused > 0,
        "{cov:?}"
    );
}

impl Coverage {
    /// The states a batch of random runs may miss by chance.
    fn rare_states_reached(&self) -> bool {
        self.recreated_in_flight > 0
            && self.late_landings > 0
            && self.expired_allotments > 0
            && self.surges > 0
    }
}

/// A directed run: two seeds, one resource limited to `limit`, no slack; every step checked,
/// every message delivered after it.
struct Directed {
    world: World,
    cov: Coverage,
}

impl Directed {
    fn new(limit: u8) -> Directed {
        let setup = Setup {
            seeds: 2,
            resources: 1,
            limit: [limit, limit],
            slack: [0, 0],
            steps: Vec::new(),
            lone: 0,
            appear: false,
        };
        Directed {
            world: World::new(&setup),
            cov: Coverage::default(),
        }
    }

    fn run(&mut self, steps: &[Step]) {
        let world = &mut self.world;
        for step in steps {
            let before = world.record_exposure();
            world.restored_now = false;
            world
                .step(step, &mut self.cov)
                .and_then(|()| world.check(&before))
                .unwrap_or_else(|e| panic!("{step:?}: {e}"));
            world.deliver_all();
        }
    }
}

impl std::ops::Deref for Directed {
    type Target = World;
    fn deref(&self) -> &World {
        &self.world
    }
}

/// A directed run of the case the released floor exists for: seed-0 releases its share, the
/// master grants it to seed-1, then seed-0's ledger is deleted and re-created with its status
/// (its `released`) gone. The floor the master persisted with the grant keeps seed-0's share at
/// zero; without it, seed-0 would hold its old share again beside seed-1's.
#[test]
fn a_recreated_ledger_does_not_regain_released_share() {
    let mut world = Directed::new(4);
    let run = |world: &mut Directed, steps: &[Step]| world.run(steps);
    let admit = |seed| Step::Admit {
        seed,
        amount: [4, 0],
        ask: true,
    };
    run(
        &mut world,
        &[admit(0), Step::MasterRound, admit(0), Step::Count { seed: 0 }],
    );
    assert_eq!(
        world.seeds[0].copy.committed(),
        rd(1, [4, 0]),
        "seed-0 took the quota"
    );
    run(
        &mut world,
        &[
            Step::Delete {
                seed: 0,
                amount: [4, 0],
            },
            Step::ReleaseNow { seed: 0, quiet: true },
            admit(1),
            Step::MasterRound,
            Step::MasterRound,
            admit(1),
        ],
    );
    assert_eq!(
        world.seeds[1].copy.committed(),
        rd(1, [4, 0]),
        "seed-1 got it all"
    );
    run(
        &mut world,
        &[Step::RecreateLedger {
            seed: 0,
            seen_gap: false,
            created: true,
        }],
    );
    assert_eq!(world.seeds[0].copy.share.share(), rd(1, [0, 0]));
    run(&mut world, &[admit(0), Step::MasterRound, admit(0)]);
    assert_eq!(
        world.seeds[0].copy.committed(),
        rd(1, [0, 0]),
        "nothing left for seed-0"
    );
}

/// The case a 20,000-run search found (shrunk): the record is lost twice, the second time while
/// the master had just restarted. A master that planned before reading the seeds rebuilt the
/// record at the epoch the first rebuild had used; a word of the first rebuild, still in flight,
/// then gave seed-1 share the new record never counted (6.5 held of 4). master-controller lists
/// every seed before it plans (settling), as the model's restart now does, so the rebuild sees
/// the seeds holding that epoch and starts the next one.
#[test]
#[rustfmt::skip] // the shrunk input, one line per few steps
#[allow(clippy::unreadable_literal)] // message picks as proptest drew them
fn a_second_rebuild_after_a_restart_starts_a_new_epoch() {
    let setup = Setup {
        seeds: 2, resources: 1, limit: [4, 4], slack: [0, 0], lone: 0, appear: false,
        steps: vec![
            Step::Heal{ seed: 0 }, Step::Heal{ seed: 0 }, Step::MasterRound,
            Step::BeginWrite{ seed: 0, requests: true }, Step::EndWrite{ seed: 0, how: 0 }, Step::Deliver{ pick: 23559233957936850, dup: false },
            Step::Admit{ seed: 0, amount: [0, 0], ask: false },
            Step::Admit{ seed: 0, amount: [0, 0], ask: false },
            Step::Admit{ seed: 0, amount: [0, 0], ask: false }, Step::MasterRound,
            Step::Admit{ seed: 0, amount: [0, 0], ask: false }, Step::Count{ seed: 0 },
            Step::Count{ seed: 0 }, Step::Drop{ pick: 14840904018879573 },
            Step::ExpireAllotment{ seed: 0 }, Step::DecideRelease{ seed: 0, quiet: false },
            Step::Deliver{ pick: 4939619343711732483, dup: false },
            Step::Admit{ seed: 0, amount: [0, 0], ask: false }, Step::CrashMaster,
            Step::Admit{ seed: 0, amount: [1, 0], ask: true },
            Step::Admit{ seed: 0, amount: [1, 0], ask: true }, Step::Heal{ seed: 0 },
            Step::Count{ seed: 0 }, Step::Admit{ seed: 0, amount: [1, 0], ask: true },
            Step::Admit{ seed: 0, amount: [0, 0], ask: false },
            Step::Admit{ seed: 0, amount: [1, 0], ask: true }, Step::LoseRecord,
            Step::Admit{ seed: 0, amount: [0, 0], ask: false },
            Step::Admit{ seed: 0, amount: [0, 0], ask: false }, Step::Withdraw{ seed: 0 },
            Step::RestartMaster, Step::RestartMaster, Step::MasterRound, Step::RestartMaster,
            Step::Deliver{ pick: 409247456277468230, dup: false }, Step::MasterRound,
            Step::MasterRound, Step::MasterSend, Step::Admit{ seed: 1, amount: [1, 0], ask: true },
            Step::Admit{ seed: 0, amount: [0, 0], ask: false }, Step::Count{ seed: 0 },
            Step::MasterRound, Step::MasterSend,
            Step::DeliverMany{ picks: vec![5585936425648788002, 1285941529526506809, 6626785079213838040] },
            Step::DeliverMany{ picks: vec![3207740834522026244, 4924498773510926136, 1342218683237513753, 0, 3982978505753847694, 3250985389495271075] },
            Step::Count{ seed: 0 }, Step::Deliver{ pick: 3131363752721505442, dup: false },
            Step::Admit{ seed: 0, amount: [0, 0], ask: false }, Step::ExpireAllotment{ seed: 0 },
            Step::MasterRound, Step::Admit{ seed: 0, amount: [0, 0], ask: false },
            Step::CrashMaster, Step::Retire{ seed: 1 }, Step::RestartMaster, Step::LoseRecord,
            Step::Admit{ seed: 0, amount: [0, 0], ask: false },
            Step::Admit{ seed: 0, amount: [0, 0], ask: false }, Step::MasterRound,
            Step::Admit{ seed: 0, amount: [0, 0], ask: false }, Step::ExpireAllotment{ seed: 0 },
            Step::ExpireAllotment{ seed: 0 }, Step::Admit{ seed: 0, amount: [0, 0], ask: false },
        ],
    };
    let mut cov = Coverage::default();
    run(&setup, &mut cov).unwrap();
    assert_eq!(cov.lost_records, 2);
}

/// A quota of 8 with seed-0 holding all of it as share, and its webhook an allotment of 4.
fn with_allotment_on_seed_0() -> Directed {
    let mut world = Directed::new(8);
    world.run(&[
        Step::Admit {
            seed: 0,
            amount: [8, 0],
            ask: true,
        },
        Step::MasterRound,
        Step::BeginWrite {
            seed: 0,
            requests: true,
        },
        Step::EndWrite { seed: 0, how: 0 },
    ]);
    world
}

/// The webhook level on its own: seed-0 gets share, its webhook takes an allotment, admits from
/// it without a write, and records what it admitted; a crash in between leaves the Machines
/// covered by the dead process's allotment until they are counted.
#[test]
fn a_webhook_admits_from_its_allotment_and_records_it() {
    let mut world = with_allotment_on_seed_0();
    let run = |world: &mut Directed, steps: &[Step]| world.run(steps);
    let fast = |amount| Step::AdmitFromAllotment {
        seed: 0,
        amount: [amount, 0],
    };
    let s = &world.seeds[0];
    assert_eq!(
        s.copy.allotments.get(&0).map(|(g, _)| g.clone()),
        Some(rd(1, [4, 0]))
    );
    run(&mut world, &[fast(3), fast(2), fast(1)]);
    assert_eq!(world.seeds[0].machines.len(), 2, "3 + 1 fit in 4, 2 more did not");
    run(
        &mut world,
        &[
            Step::BeginWrite {
                seed: 0,
                requests: false,
            },
            fast(1),
            Step::CrashWebhook { seed: 0 },
            Step::StrayLands { seed: 0 },
        ],
    );
    let s = &world.seeds[0];
    assert_eq!(s.copy.recorded.len(), 2, "the write landed after the crash");
    assert_eq!(s.machines.len(), 2, "nothing admitted during the write");
    run(&mut world, &[Step::Count { seed: 0 }]);
    assert!(world.seeds[0].machines.is_empty());
    assert_eq!(world.seeds[0].copy.counted, rd(1, [4, 0]));
}

/// A ledger re-created while a Machine admitted from the webhook's allotment is on its way
/// (issue #32): the new ledger carries the allotment under its own key, the webhook's first
/// write there records the Machine and moves that much out of the carried entry, and the rest
/// goes when the grace ends.
#[test]
fn a_carried_allotment_shrinks_by_what_its_holder_records() {
    let mut world = with_allotment_on_seed_0();
    let run = |world: &mut Directed, steps: &[Step]| world.run(steps);
    run(
        &mut world,
        &[
            Step::AdmitFromAllotment {
                seed: 0,
                amount: [3, 0],
            },
            Step::RecreateLedger {
                seed: 0,
                seen_gap: false,
                created: false,
            },
        ],
    );
    let s = &world.seeds[0];
    assert_eq!(s.machines.len(), 1, "the Machine is on its way");
    assert_eq!(
        s.copy.allotments.get(&CARRIED).map(|(g, _)| g.clone()),
        Some(rd(1, [4, 0])),
        "carried under its own key"
    );
    run(
        &mut world,
        &[
            Step::BeginWrite {
                seed: 0,
                requests: false,
            },
            Step::EndWrite { seed: 0, how: 0 },
        ],
    );
    let s = &world.seeds[0];
    assert_eq!(s.copy.recorded.len(), 1, "recorded on the new ledger");
    assert_eq!(
        s.copy
            .allotments
            .get(&CARRIED)
            .map(|(g, _)| g.amount(Resource::Cpu)),
        Some(units(1)),
        "what it recorded moved out of the carried entry"
    );
    run(
        &mut world,
        &[
            Step::Count { seed: 0 },
            Step::Tick { secs: 15 },
            Step::ExpireAllotment { seed: 0 },
        ],
    );
    let s = &world.seeds[0];
    assert!(!s.copy.allotments.contains_key(&CARRIED), "gone after the grace");
    assert_eq!(s.copy.counted.amount(Resource::Cpu), units(3));
}
