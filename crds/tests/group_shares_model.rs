//! State-machine property test of a quota group's shares (`kkp_quota_crds::shares::group`), with
//! no servers: one group over two projects, each project with two seeds, every level running
//! the real protocol types: the group's record is a `MasterView` over its projects, each
//! project's record a `MasterView` over its seeds planned within `member_limit`, holding its
//! budget of the group as a `SeedShare`, and each seed admitting within its own `SeedShare`.
//!
//! Random interleavings of admissions, deletions, seed releases, project rounds (plan, grant,
//! release to the group, report), group rounds, and words and reports delayed, reordered,
//! duplicated and lost; a project master or the group's master restarting (what it read is
//! gone, its record stays); a project labelled out of the group and back in, each master reading
//! the label at its own time. After every step: what the seeds of the projects the group bounds
//! hold and use together stays within the group's limit (or, after a project joined over the
//! group's room, within what they held when it came in, coming down as that does: it keeps its
//! Machines and the group admits nothing more), and each project's within its own. After each
//! run, a liveness phase labels every project in, heals everything and checks that a lone seed
//! with demand gets all the headroom its project and group leave within a bounded number of fair
//! rounds.
//!
//! `PROPTEST_CASES` sets the number of runs (default 2000, about a second).
#![allow(
    clippy::unwrap_used,
    clippy::too_many_lines,
    // The failure summary is built once, on failure.
    clippy::format_push_string
)]

use std::collections::BTreeMap;

use kkp_quota_crds::shares::group::{
    committed_report, first_budget, first_demand, group_plan, holding_back, holdings_kept, keeps_holdings,
    member_demand, member_held, member_limit, member_release_due, member_report, planning_budget,
    remember_counts, remembered_on_leaving,
};
use kkp_quota_crds::shares::{MasterView, MasterWord, SeedRecord, SeedReport, SeedShare, fits_within};
use kkp_quota_crds::{Quantity, Resource, ResourceDetails};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

type Rd = ResourceDetails;

const PROJECTS: [&str; 2] = ["p0", "p1"];
const SEEDS: [&str; 2] = ["s0", "s1"];
/// Messages in flight beyond this are dropped, oldest first (senders resend).
const BAG_LIMIT: usize = 24;
/// Fair rounds the liveness phase allows: a move from another project's seed to the lone
/// seed takes the seed's release, its project's release, the group's grant, the project's
/// grant, each a round; a rebuilt record waits a round or two for its epoch (docs/shares.md).
const LIVENESS_ROUNDS: usize = 12;

fn cpu(n: i64) -> Rd {
    let mut d = Rd::default();
    d.set(Resource::Cpu, Some(Quantity::from_units(n)));
    d
}

/// Nanocores: shares move in fractions (half of what is free), so figures are compared exact.
fn nanos(d: &Rd) -> i128 {
    d.amount(Resource::Cpu).as_nanos()
}

const UNIT: i128 = 1_000_000_000;

fn units_of(d: &Rd) -> i64 {
    i64::try_from(nanos(d) / UNIT).unwrap()
}

/// For the failure summary only.
#[allow(clippy::cast_precision_loss)]
/// What a seed holding `share` may spend under `target` (cpu, nanocores): the smaller of the
/// two, the share where no target is set (`SeedShare::capacity` without the limit).
fn spendable(share: &Rd, target: &Rd) -> i128 {
    target
        .get(Resource::Cpu)
        .map_or(nanos(share), |target| nanos(share).min(target.as_nanos()))
}

fn units(d: &Rd) -> f64 {
    whole(d.amount(Resource::Cpu))
}

#[allow(clippy::cast_precision_loss)]
fn whole(q: Quantity) -> f64 {
    q.as_nanos() as f64 / 1e9
}

/// One seed's copy of one project's quota: its share, the limit its project sent with it, what
/// it uses (admitted, not deleted), and a demand while a request waits.
#[derive(Debug, Clone)]
struct SeedCopy {
    share: SeedShare,
    limit: Rd,
    used: i64,
    demand: Option<i64>,
    version: u64,
    /// The word it holds was sent while its project's master saw the project in the group
    /// (until one is, it admits within what its project gave it before: a limit and shares
    /// from outside the group, which travel like any lowered limit).
    bounded: bool,
}

impl Default for SeedCopy {
    fn default() -> SeedCopy {
        SeedCopy {
            share: SeedShare::default(),
            limit: Rd::default(),
            used: 0,
            demand: None,
            version: 0,
            bounded: true,
        }
    }
}

impl SeedCopy {
    fn report(&self) -> SeedReport {
        self.share
            .report(self.version, &cpu(self.used), self.demand.map(cpu).as_ref())
    }
}

/// A project's record (persisted) and what its master read (lost on a restart).
#[derive(Debug, Clone)]
struct Project {
    own: Rd,
    view: MasterView,
    version: u64,
    /// Its budget of the group: the word the group sent, and what it released (in its record).
    budget: SeedShare,
    /// The group's limit as this project last read it (with the group's word).
    group_limit: Rd,
    /// Its copy of the budget was lost with its record: the next word it reads is taken through
    /// `first_budget`, once its rebuilt record has its seeds' holdings.
    budget_lost: bool,
    /// What it last reported committed to the group (its record's copy keeps it).
    reported: Option<Rd>,
    /// The group's word (and limit) it read last while `budget_lost`.
    pending: Option<(MasterWord, Rd, bool)>,
    /// The group's record, as of the word taken last (or pending), keeps its new members'
    /// holdings (`holdings_kept`): never granted budget, the project then keeps what its seeds
    /// hold and asks for it (`planning_budget`, `first_demand`).
    kept: bool,
    /// Whether its master sees it selected by the group (its labels, through a cache that may
    /// lag the label's write): a member plans within its budget and reports; a project that is
    /// not plans within its own limit alone and holds no copy of a budget.
    member: bool,
    seeds: BTreeMap<&'static str, SeedCopy>,
}

impl Project {
    /// The group's word read (from its record, through a cache): taken as the copy's if newer;
    /// while the copy is lost, kept for the next round to take through `first_budget`.
    fn read_word(&mut self, word: MasterWord, limit: Rd, kept: bool) {
        if !self.member {
            return;
        }
        if self.budget_lost {
            self.pending = Some((word, limit, kept));
        } else if self.budget.receive(&word) {
            self.group_limit = limit;
            self.kept = kept;
        }
    }
}

#[derive(Debug, Clone)]
enum Message {
    ToSeed {
        project: usize,
        seed: &'static str,
        word: MasterWord,
        limit: Rd,
        /// Sent by a round of a project that was in the group.
        bounded: bool,
    },
    SeedReport {
        project: usize,
        seed: &'static str,
        report: SeedReport,
    },
    ToProject {
        project: usize,
        word: MasterWord,
        limit: Rd,
        /// The record keeps its new members' holdings (`holdings_kept`).
        kept: bool,
    },
    ProjectReport {
        project: usize,
        report: SeedReport,
    },
}

/// Usage appearing without an admission (`Op::Appear`) in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Appearing {
    Never,
    May,
    Appeared,
}

#[derive(Debug, Clone)]
struct World {
    group_limit: Rd,
    /// The largest limit the group had in this run: while an edit's lowering travels, seeds
    /// may still spend what was granted under the old one.
    ceiling: Rd,
    group: MasterView,
    group_version: u64,
    /// What the group's record remembers of projects that left it (`BudgetRecord::departed`).
    departed: BTreeMap<String, SeedRecord>,
    /// The master's etcd revision: a project's report carries its record's resourceVersion,
    /// which only grows, also across a re-created object (its record version does not).
    revision: u64,
    /// Every word the group sent each project: a project reads the group's record from a cache
    /// that may lag, so after its copy is lost it may take any of them first.
    history: Vec<Vec<(MasterWord, Rd, bool)>>,
    /// Off only to show what `first_budget` prevents.
    first_budget_rule: bool,
    /// Off only to show what the room check of `holdings_kept` prevents: the record then keeps
    /// its new members' holdings whenever it grants nothing.
    room_check: bool,
    /// Each project's label as written: whether the group selects it.
    label: Vec<bool>,
    /// Whether the group's master sees each project selected (its cache may lag the label).
    group_sees: Vec<bool>,
    /// What the seeds of the selected projects may hold together (nanocores): the group's
    /// ceiling, or more while a project that joined over the group's room holds what it brought
    /// (docs/groups.md: it keeps its Machines, and the group admits nothing more). It only
    /// comes down again as what they hold does.
    allowance: i128,
    /// Per project, what its seeds may hold or use together: its own limit; `None` when it has
    /// none, or once an edit of it was made in this run (see `Op::SetOwnLimit`).
    own_allowance: Vec<Option<i128>>,
    /// Whether usage may appear without an admission in this run (`Op::Appear`), and whether it
    /// did: projects and group are then over by what no admission decided, and grants made
    /// before the reports of it arrive may add to it (the window docs/limits.md names). The
    /// step invariants are off from then on; the settled check after the run still holds.
    appearing: Appearing,
    projects: Vec<Project>,
    bag: Vec<Message>,
}

#[derive(Debug, Clone)]
enum Op {
    Admit {
        project: usize,
        seed: usize,
        amount: i64,
    },
    Delete {
        project: usize,
        seed: usize,
        amount: i64,
    },
    SeedRelease {
        project: usize,
        seed: usize,
        quiet: bool,
    },
    SeedReport {
        project: usize,
        seed: usize,
    },
    ProjectRound {
        project: usize,
        quiet: bool,
    },
    GroupRound,
    Deliver {
        index: usize,
        keep: bool,
    },
    Drop {
        index: usize,
    },
    RestartProject {
        project: usize,
    },
    RestartGroup,
    /// The admin edits the group's limit.
    SetGroupLimit {
        limit: i64,
    },
    /// The group's record is lost (the `QuotaGroup` deleted and re-created, restored without
    /// status): everything it granted, its version.
    LoseGroupRecord,
    /// A project's record is lost (its `ProjectQuota` re-created): its seeds' grants and its
    /// copy of its budget.
    LoseProjectRecord {
        project: usize,
    },
    /// A project reads an older record of the group (its cache lags the group's writes).
    StaleWord {
        project: usize,
        index: usize,
    },
    /// Usage grows on a seed without an admission: the catalog edited so that its running
    /// Machines count bigger.
    Appear {
        project: usize,
        seed: usize,
        amount: i64,
    },
    /// The admin edits a project's own limit (`None`: removed), up or down.
    SetOwnLimit {
        project: usize,
        limit: Option<i64>,
    },
    /// The admin labels a project into the group, or out of it.
    Relabel {
        project: usize,
    },
    /// The group's master reads the project's label as it is now.
    GroupSeesLabel {
        project: usize,
    },
    /// The project's master reads its label as it is now.
    ProjectSeesLabel {
        project: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let p = 0..PROJECTS.len();
    let s = 0..SEEDS.len();
    prop_oneof![
        4 => (p.clone(), s.clone(), 1..4i64).prop_map(|(project, seed, amount)| Op::Admit { project, seed, amount }),
        2 => (p.clone(), s.clone(), 1..4i64).prop_map(|(project, seed, amount)| Op::Delete { project, seed, amount }),
        2 => (p.clone(), s.clone(), any::<bool>()).prop_map(|(project, seed, quiet)| Op::SeedRelease { project, seed, quiet }),
        3 => (p.clone(), s.clone()).prop_map(|(project, seed)| Op::SeedReport { project, seed }),
        3 => (p.clone(), any::<bool>()).prop_map(|(project, quiet)| Op::ProjectRound { project, quiet }),
        2 => Just(Op::GroupRound),
        8 => (any::<usize>(), prop::bool::weighted(0.1)).prop_map(|(index, keep)| Op::Deliver { index, keep }),
        1 => any::<usize>().prop_map(|index| Op::Drop { index }),
        1 => p.clone().prop_map(|project| Op::RestartProject { project }),
        1 => Just(Op::RestartGroup),
        1 => (2..14i64).prop_map(|limit| Op::SetGroupLimit { limit }),
        1 => Just(Op::LoseGroupRecord),
        1 => p.clone().prop_map(|project| Op::LoseProjectRecord { project }),
        2 => (p.clone(), any::<usize>()).prop_map(|(project, index)| Op::StaleWord { project, index }),
        1 => p.clone().prop_map(|project| Op::Relabel { project }),
        1 => (p.clone(), own_limit()).prop_map(|(project, limit)| Op::SetOwnLimit { project, limit }),
        1 => (p.clone(), s.clone(), 1..3i64).prop_map(|(project, seed, amount)| Op::Appear { project, seed, amount }),
        2 => p.clone().prop_map(|project| Op::GroupSeesLabel { project }),
        2 => p.prop_map(|project| Op::ProjectSeesLabel { project }),
    ]
}

fn slack() -> Rd {
    cpu(1)
}

impl World {
    fn new(group_limit: i64, own: [Option<i64>; 2]) -> World {
        let projects = own
            .iter()
            .map(|limit| Project {
                own: limit.map(cpu).unwrap_or_default(),
                view: MasterView {
                    limit: Rd::default(),
                    seeds: SEEDS
                        .iter()
                        .map(|s| ((*s).to_owned(), SeedRecord::new()))
                        .collect(),
                },
                version: 0,
                budget: SeedShare::default(),
                group_limit: cpu(group_limit),
                budget_lost: false,
                pending: None,
                kept: false,
                reported: None,
                member: true,
                seeds: SEEDS.iter().map(|s| (*s, SeedCopy::default())).collect(),
            })
            .collect();
        World {
            group_limit: cpu(group_limit),
            ceiling: cpu(group_limit),
            group: MasterView {
                limit: cpu(group_limit),
                seeds: PROJECTS
                    .iter()
                    .map(|p| ((*p).to_owned(), SeedRecord::new()))
                    .collect(),
            },
            group_version: 0,
            departed: BTreeMap::new(),
            revision: 0,
            history: vec![Vec::new(); PROJECTS.len()],
            first_budget_rule: true,
            room_check: true,
            label: vec![true; PROJECTS.len()],
            group_sees: vec![true; PROJECTS.len()],
            allowance: nanos(&cpu(group_limit)),
            own_allowance: own.iter().map(|o| o.map(|l| nanos(&cpu(l)))).collect(),
            appearing: Appearing::Never,
            projects,
            bag: Vec::new(),
        }
    }

    fn send(&mut self, message: Message) {
        if self.bag.len() >= BAG_LIMIT {
            self.bag.remove(0);
        }
        self.bag.push(message);
    }

    /// A seed admits `amount` within its capacity, or records the absolute share it wants.
    fn admit(&mut self, project: usize, seed: &'static str, amount: i64) -> bool {
        let copy = self.projects[project].seeds.get_mut(seed).unwrap();
        let capacity = copy.share.capacity(&copy.limit);
        // A seed that never heard from its project has no limit yet: it admits nothing.
        if copy.share.version == 0 {
            return false;
        }
        if fits_within(&capacity, &cpu(copy.used), &cpu(amount)).is_ok() {
            copy.used += amount;
            copy.demand = None;
            copy.version += 1;
            true
        } else {
            copy.demand = Some(copy.used + amount);
            copy.version += 1;
            false
        }
    }

    fn seed_release(&mut self, project: usize, seed: &'static str, quiet: bool) {
        let copy = self.projects[project].seeds.get_mut(seed).unwrap();
        if copy.share.version == 0 {
            return;
        }
        let due = copy.share.release_due(
            &copy.limit,
            &cpu(copy.used),
            &slack(),
            quiet && copy.demand.is_none(),
        );
        if !due.is_empty() {
            copy.share.release(&due).unwrap();
            copy.version += 1;
        }
    }

    /// One round of a project's master, persisted at once (its compare-and-swap): plan its
    /// seeds' shares within its member limit, release budget its seeds do not hold, send the
    /// words, report to the group.
    fn project_round(&mut self, project: usize, quiet: bool) {
        let first_budget_rule = self.first_budget_rule;
        self.revision += 1;
        let revision = self.revision;
        let p = &mut self.projects[project];
        // A record behind its seeds' copies (lost) is rebuilt from them, as on the real master.
        let (old_version, _) = p.view.adopt(p.version);
        let awaiting = p.view.awaiting_epoch(old_version + 1);
        if p.budget_lost
            && !awaiting
            && let Some((word, limit, kept)) = p.pending.take()
        {
            let held = member_held(&p.view, &limit).unwrap();
            p.budget = if first_budget_rule {
                first_budget(&word, &held)
            } else {
                let mut b = SeedShare::default();
                b.receive(&word);
                b
            };
            p.group_limit = limit;
            p.kept = kept;
            p.budget_lost = false;
        }
        let group_limit = p.group_limit.clone();
        let member = p.member;
        // A copy lost is one granted nothing yet; the word it would take says whether to keep
        // (only one granting nothing may: the master's `Holdings::take`).
        let kept = if p.budget_lost {
            p.pending
                .as_ref()
                .is_some_and(|(word, _, kept)| *kept && word.granted.is_empty())
        } else {
            p.kept
        };
        let keeping = member && keeps_holdings(Some(&p.budget), kept);
        p.view.limit = if member {
            let held = member_held(&p.view, &group_limit).unwrap();
            // A lost copy takes its word later; what it keeps is bounded by that word's target
            // now (the group's count of it).
            let mut copy = p.budget.clone();
            if p.budget_lost
                && let Some((word, _, _)) = &p.pending
            {
                copy.target = word.target.clone();
            }
            let planning = planning_budget(Some(&copy), kept, &held);
            member_limit(&p.own, [(&planning, &group_limit)])
        } else {
            p.own.clone()
        };
        let plan = p.view.plan_at(old_version + 1, &slack()).unwrap();
        p.view.apply(&plan).unwrap();
        let unmet = p.view.seeds.values().any(|r| r.unmet(&p.view.limit));
        let due = member_release_due(&p.budget, &group_limit, &p.view, &slack(), quiet && !unmet).unwrap();
        if member && !due.is_empty() && !p.budget_lost {
            p.budget.release(&due).unwrap();
        }
        p.version = old_version + 1;
        let version = p.version;
        let capacity = p.budget.capacity(&group_limit);
        // Repeated while it grows within the slack and the target (what the record's copy
        // keeps, so no write): the group reads up to the slack less than is committed.
        let fresh = member_report(&p.view, &group_limit, &p.budget).unwrap();
        let reported = committed_report(p.reported.as_ref(), &fresh, &p.budget.target, &slack());
        p.reported = Some(reported.clone());
        let report = SeedReport {
            version: revision,
            released: p.budget.released.clone(),
            committed: reported,
            demand: if keeping {
                first_demand(&p.view, &group_limit).unwrap()
            } else {
                member_demand(&p.view, &group_limit, &capacity).unwrap()
            },
            holds: Some(MasterWord {
                version: p.budget.version,
                granted: p.budget.granted.clone(),
                target: p.budget.target.clone(),
                released: Rd::default(),
            }),
        };
        // The seeds' limit: the project's own, or the group's where the project sets none.
        let limit = if p.own.get(Resource::Cpu).is_some() || !member {
            p.own.clone()
        } else {
            group_limit
        };
        let words: Vec<(&'static str, MasterWord)> = SEEDS
            .iter()
            .map(|s| {
                let r = &p.view.seeds[*s];
                let word = MasterWord {
                    version,
                    granted: r.granted.clone(),
                    target: r.target.clone(),
                    released: r.released_floor.clone(),
                };
                (*s, word)
            })
            .collect();
        for (seed, word) in words {
            self.send(Message::ToSeed {
                project,
                seed,
                word,
                limit: limit.clone(),
                bounded: member,
            });
        }
        if member {
            self.send(Message::ProjectReport { project, report });
        }
    }

    fn group_round(&mut self) {
        // Each member's own limit is the most it may be granted (`budgets::group_view`).
        for (project, name) in PROJECTS.iter().enumerate() {
            if let Some(r) = self.group.seeds.get_mut(*name) {
                r.ceiling = self.projects[project].own.clone();
            }
        }
        let (old_version, _) = self.group.adopt(self.group_version);
        let plan = group_plan(&self.group, old_version + 1, &slack()).unwrap();
        let kept = if self.room_check {
            holdings_kept(&self.group, old_version + 1).unwrap()
        } else {
            !holding_back(&self.group, old_version + 1).is_empty()
        };
        self.group.apply(&plan).unwrap();
        remember_counts(&mut self.group, kept);
        self.group_version = old_version + 1;
        let version = self.group_version;
        for (project, name) in PROJECTS.iter().enumerate() {
            let Some(r) = self.group.seeds.get(*name) else {
                continue;
            };
            let word = MasterWord {
                version,
                granted: r.granted.clone(),
                target: r.target.clone(),
                released: r.released_floor.clone(),
            };
            let limit = self.group_limit.clone();
            self.history[project].push((word.clone(), limit.clone(), kept));
            self.send(Message::ToProject {
                project,
                word,
                limit,
                kept,
            });
        }
    }

    fn deliver(&mut self, index: usize, keep: bool) {
        if self.bag.is_empty() {
            return;
        }
        let index = index % self.bag.len();
        let message = if keep {
            self.bag[index].clone()
        } else {
            self.bag.remove(index)
        };
        match message {
            Message::ToSeed {
                project,
                seed,
                word,
                limit,
                bounded,
            } => {
                let copy = self.projects[project].seeds.get_mut(seed).unwrap();
                if copy.share.receive(&word) {
                    copy.limit = limit;
                    copy.version += 1;
                    copy.bounded = bounded;
                }
            }
            Message::SeedReport {
                project,
                seed,
                report,
            } => {
                let record = self.projects[project].view.seeds.get_mut(seed).unwrap();
                record.observe(report);
            }
            Message::ToProject {
                project,
                word,
                limit,
                kept,
            } => self.projects[project].read_word(word, limit, kept),
            Message::ProjectReport { project, report } => {
                // A report of a project the group does not select is not read.
                if let Some(record) = self.group.seeds.get_mut(PROJECTS[project]) {
                    record.observe(report);
                }
            }
        }
    }

    fn run(&mut self, op: &Op) {
        match *op {
            Op::Admit {
                project,
                seed,
                amount,
            } => {
                self.admit(project, SEEDS[seed], amount);
            }
            Op::Delete {
                project,
                seed,
                amount,
            } => {
                let copy = self.projects[project].seeds.get_mut(SEEDS[seed]).unwrap();
                copy.used -= amount.min(copy.used);
                copy.version += 1;
            }
            Op::SeedRelease { project, seed, quiet } => self.seed_release(project, SEEDS[seed], quiet),
            Op::SeedReport { project, seed } => {
                let report = self.projects[project].seeds[SEEDS[seed]].report();
                self.send(Message::SeedReport {
                    project,
                    seed: SEEDS[seed],
                    report,
                });
            }
            Op::ProjectRound { project, quiet } => self.project_round(project, quiet),
            Op::GroupRound => self.group_round(),
            Op::Deliver { index, keep } => self.deliver(index, keep),
            Op::Drop { index } => {
                if !self.bag.is_empty() {
                    let index = index % self.bag.len();
                    self.bag.remove(index);
                }
            }
            Op::RestartProject { project } => {
                for record in self.projects[project].view.seeds.values_mut() {
                    record.report = None;
                }
            }
            Op::RestartGroup => {
                for record in self.group.seeds.values_mut() {
                    record.report = None;
                }
            }
            Op::SetGroupLimit { limit } => {
                self.group_limit = cpu(limit);
                self.group.limit = cpu(limit);
                if limit > units_of(&self.ceiling) {
                    self.ceiling = cpu(limit);
                    self.allowance = self.allowance.max(nanos(&self.ceiling));
                }
            }
            Op::LoseGroupRecord => {
                for record in self.group.seeds.values_mut() {
                    *record = SeedRecord::new();
                }
                self.departed.clear();
                self.group_version = 0;
            }
            Op::StaleWord { project, index } => {
                let history = &self.history[project];
                if !history.is_empty() {
                    let (word, limit, kept) = history[index % history.len()].clone();
                    self.projects[project].read_word(word, limit, kept);
                }
            }
            Op::Relabel { project } => {
                self.label[project] = !self.label[project];
            }
            Op::Appear {
                project,
                seed,
                amount,
            } => {
                if self.appearing != Appearing::Never {
                    let copy = self.projects[project].seeds.get_mut(SEEDS[seed]).unwrap();
                    copy.used += amount;
                    copy.version += 1;
                    self.appearing = Appearing::Appeared;
                }
            }
            Op::SetOwnLimit { project, limit } => {
                self.projects[project].own = limit.map(cpu).unwrap_or_default();
                // While the new limit travels its seeds admit within the old one, shares they
                // hold and, on a seed that had none, without any: a project's own limit under
                // edits is `shares_model`'s to check; here the group's under them.
                self.own_allowance[project] = None;
            }
            Op::GroupSeesLabel { project } => self.group_sees_label(project),
            Op::ProjectSeesLabel { project } => self.project_sees_label(project),
            Op::LoseProjectRecord { project } => {
                let p = &mut self.projects[project];
                for record in p.view.seeds.values_mut() {
                    *record = SeedRecord::new();
                }
                p.version = 0;
                p.budget = SeedShare::default();
                p.budget_lost = true;
                p.pending = None;
                p.kept = false;
                p.reported = None;
            }
        }
    }

    /// The group's master reads `project`'s label: a project selected anew gets an empty entry
    /// (no budget, no report yet) or the one the record remembered of it, one no longer selected
    /// leaves the record, its budget free, its count remembered (`remembered_on_leaving`).
    fn group_sees_label(&mut self, project: usize) {
        let selected = self.label[project];
        if selected == self.group_sees[project] {
            return;
        }
        self.group_sees[project] = selected;
        let name = PROJECTS[project].to_owned();
        if selected {
            // `SeedRecord::new` (reachable), not the default (unreachable).
            #[allow(clippy::unwrap_or_default)]
            let entry = self.departed.remove(&name).unwrap_or_else(SeedRecord::new);
            self.group.seeds.insert(name, entry);
        } else if let Some(remembered) = self
            .group
            .seeds
            .remove(&name)
            .as_ref()
            .and_then(remembered_on_leaving)
        {
            self.departed.insert(name, remembered);
        }
    }

    /// The project's master reads its label: selected anew, it holds no copy of a budget and
    /// takes its first word through `first_budget`; no longer selected, it drops its copy and
    /// plans within its own limit.
    fn project_sees_label(&mut self, project: usize) {
        let selected = self.label[project];
        let p = &mut self.projects[project];
        if selected == p.member {
            return;
        }
        p.member = selected;
        p.budget = SeedShare::default();
        p.budget_lost = selected;
        p.pending = None;
        p.kept = false;
        p.reported = None;
    }

    /// Whether the group bounds `project` now: labelled into it, its master planning within
    /// it, and every seed holding a word of such a round. Until then its seeds admit within what
    /// they were given from outside the group, and what they hold when it is bounded is brought
    /// in ([`World::run_checked`]).
    fn bounded(&self, project: usize) -> bool {
        let p = &self.projects[project];
        self.label[project] && p.member && p.seeds.values().all(|c| c.bounded)
    }

    /// `op`, then the check ([`World::checked`]).
    fn run_checked(&mut self, op: &Op) -> Result<(), TestCaseError> {
        self.checked(|world| world.run(op))
    }

    /// Every message in flight delivered, in order, each step checked.
    fn deliver_all(&mut self) -> Result<(), TestCaseError> {
        while !self.bag.is_empty() {
            self.run_checked(&Op::Deliver {
                index: 0,
                keep: false,
            })?;
        }
        Ok(())
    }

    /// The admin toggles `project`'s label and both masters read it, each step checked.
    fn relabel(&mut self, project: usize) -> Result<(), TestCaseError> {
        for op in [
            Op::Relabel { project },
            Op::GroupSeesLabel { project },
            Op::ProjectSeesLabel { project },
        ] {
            self.run_checked(&op)?;
        }
        Ok(())
    }

    /// `step`, then the check. A project the group comes to bound in this step brings in what
    /// its seeds held before it (with what was on its way): the allowance rises to what the
    /// projects bound now held then, and nothing more may be taken in the step itself.
    fn checked(&mut self, step: impl FnOnce(&mut World)) -> Result<(), TestCaseError> {
        let before: Vec<(bool, i128)> = (0..PROJECTS.len())
            .map(|p| (self.bounded(p), self.held_granted(p)))
            .collect();
        step(self);
        if (0..PROJECTS.len()).any(|p| self.bounded(p) && !before[p].0) {
            let held: i128 = (0..PROJECTS.len())
                .filter(|p| self.bounded(*p))
                .map(|p| before[p].1)
                .sum();
            self.allowance = self.allowance.max(held);
        }
        self.check()?;
        self.lower_allowance();
        Ok(())
    }

    /// What `project`'s seeds may spend or use, with the shares its record granted them and not
    /// yet delivered (each capped by its target, as [`World::held`] counts them).
    fn seeds_held_granted(&self, project: usize) -> i128 {
        let p = &self.projects[project];
        p.seeds
            .iter()
            .map(|(name, c)| {
                let granted = p
                    .view
                    .seeds
                    .get(*name)
                    .map_or(0, |r| spendable(&r.share_seen(), &r.target));
                spendable(&c.share.share(), &c.share.target)
                    .max(i128::from(c.used) * UNIT)
                    .max(granted)
            })
            .sum()
    }

    /// Once a step is done: the allowance comes down with what the selected projects hold
    /// (their shares on the way counted), never below the group's ceiling.
    fn lower_allowance(&mut self) {
        let held = self.held_members(Self::held_granted);
        self.allowance = nanos(&self.ceiling).max(self.allowance.min(held));
    }

    /// `held` summed over the projects the group bounds ([`World::bounded`]).
    fn held_members(&self, held: fn(&World, usize) -> i128) -> i128 {
        (0..PROJECTS.len())
            .filter(|p| self.bounded(*p))
            .map(|p| held(self, p))
            .sum()
    }

    /// [`World::held`], with what is on its way counted: each seed's share as its project's
    /// record grants it where that is more, and the project's budget as its copy or the group's
    /// record has it where that is more than its seeds hold (granted, not yet planned).
    fn held_granted(&self, project: usize) -> i128 {
        let p = &self.projects[project];
        let seeds = self.seeds_held_granted(project);
        let budget = self
            .group
            .seeds
            .get(PROJECTS[project])
            .map_or(0, |r| nanos(&r.share_seen()))
            .max(nanos(&p.budget.share()));
        seeds.max(budget)
    }

    /// What the seeds may spend or use, per project: `max(min(share, target), used)` per seed.
    /// A share above its target is not spendable (`SeedShare::capacity`), and a target only
    /// rises by a word of the project's record, whose plan counts the seed's whole share as held
    /// (`SeedRecord::held_seen`) within the project's limit, and reports it to the group
    /// (`member_held`). So a share above the target is counted by both records while it cannot
    /// be spent: a record rebuilt from a stale report (`MasterView::adopt`) may grant a seed a
    /// share it had given up, with target 0, and the seed releases it
    /// (`a_record_rebuilt_from_a_stale_report_grants_nothing_spendable_past_the_group`).
    fn held(&self, project: usize) -> i128 {
        self.projects[project]
            .seeds
            .values()
            .map(|c| spendable(&c.share.share(), &c.share.target).max(i128::from(c.used) * UNIT))
            .sum()
    }

    fn check(&self) -> Result<(), TestCaseError> {
        if self.appearing == Appearing::Appeared {
            return Ok(());
        }
        let allowance = self.allowance;
        let held = self.held_members(Self::held);
        prop_assert!(
            held <= allowance,
            "the seeds of the selected projects hold or use {held} where {allowance} is allowed (the group's {} nanocores): {}",
            nanos(&self.ceiling),
            self.summary()
        );
        for (i, allowance) in self.own_allowance.iter().enumerate() {
            if let Some(own) = *allowance {
                prop_assert!(
                    self.held(i) <= own,
                    "project {i}'s seeds hold or use {} where {own} is allowed: {}",
                    self.held(i),
                    self.summary()
                );
            }
        }
        Ok(())
    }

    /// The figures that matter, one line per party.
    fn summary(&self) -> String {
        let share = |s: &SeedShare| {
            format!(
                "granted {} released {} target {:?} v{}",
                units(&s.granted),
                units(&s.released),
                s.target.get(Resource::Cpu).map(whole),
                s.version
            )
        };
        let record = |r: &SeedRecord| {
            let report = r.report.as_ref().map(|rep| {
                format!(
                    "v{} released {} committed {} demand {:?}",
                    rep.version,
                    units(&rep.released),
                    units(&rep.committed),
                    rep.demand.as_ref().map(units)
                )
            });
            format!(
                "granted {} target {:?} floor {} report {report:?}",
                units(&r.granted),
                r.target.get(Resource::Cpu).map(whole),
                units(&r.released_floor)
            )
        };
        let mut out = format!(
            "\ngroup limit {} v{}, allowance {}, labelled {:?}, the group sees {:?}\n",
            units(&self.group_limit),
            self.group_version,
            self.allowance,
            self.label,
            self.group_sees
        );
        for (name, r) in &self.group.seeds {
            out += &format!("  group's {name}: {}\n", record(r));
        }
        for (i, p) in self.projects.iter().enumerate() {
            out += &format!(
                "project {i}: member {} own {:?} limit {:?} v{} budget {}\n",
                p.member,
                p.own.get(Resource::Cpu).map(whole),
                p.view.limit.get(Resource::Cpu).map(whole),
                p.version,
                share(&p.budget)
            );
            for (name, r) in &p.view.seeds {
                out += &format!("  p{i}'s {name}: {}\n", record(r));
            }
            for (name, c) in &p.seeds {
                out += &format!(
                    "  seed {name}: {} limit {:?} used {} demand {:?}\n",
                    share(&c.share),
                    c.limit.get(Resource::Cpu).map(whole),
                    c.used,
                    c.demand
                );
            }
        }
        out
    }

    /// `amount` admitted on `project`'s first seed, with fair rounds until it is.
    fn settle(&mut self, project: usize, amount: i64) {
        for _ in 0..LIVENESS_ROUNDS {
            if self.admit(project, SEEDS[0], amount) {
                return;
            }
            self.fair_round((project, SEEDS[0]));
        }
        panic!("not admitted: {}", self.summary());
    }

    /// Every message delivered but the group's (its master is away).
    fn drain_except_group(&mut self) {
        let (to_group, rest): (Vec<Message>, Vec<Message>) = std::mem::take(&mut self.bag)
            .into_iter()
            .partition(|m| matches!(m, Message::ToProject { .. } | Message::ProjectReport { .. }));
        self.bag = rest;
        self.drain();
        self.bag = to_group;
    }

    /// Every message delivered, nothing kept.
    fn drain(&mut self) {
        while !self.bag.is_empty() {
            self.deliver(0, false);
        }
    }

    /// One fair round: every seed releases and reports, every project plans, the group plans,
    /// every project plans again with the group's word, and every word arrives.
    fn fair_round(&mut self, wanting: (usize, &'static str)) {
        for project in 0..PROJECTS.len() {
            for seed in SEEDS {
                let quiet = (project, seed) != wanting;
                self.seed_release(project, seed, quiet);
                let report = self.projects[project].seeds[seed].report();
                self.send(Message::SeedReport {
                    project,
                    seed,
                    report,
                });
            }
        }
        self.drain();
        for project in 0..PROJECTS.len() {
            self.project_round(project, project != wanting.0);
        }
        self.drain();
        self.group_round();
        self.drain();
        for project in 0..PROJECTS.len() {
            self.project_round(project, project != wanting.0);
        }
        self.drain();
    }
}

fn own_limit() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![1 => Just(None), 3 => (2..14i64).prop_map(Some)]
}

fn check_run(
    group_limit: i64,
    own: [Option<i64>; 2],
    may_appear: bool,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let mut world = World::new(group_limit, own);
    if may_appear {
        world.appearing = Appearing::May;
    }
    for op in ops {
        world.run_checked(op)?;
    }
    // Every project labelled into the group, every master aware of it, and every seed holding
    // a word of it; checked step by step, as what a project brings in is.
    for project in 0..PROJECTS.len() {
        if !world.label[project] {
            world.run_checked(&Op::Relabel { project })?;
        }
        world.run_checked(&Op::GroupSeesLabel { project })?;
        world.run_checked(&Op::ProjectSeesLabel { project })?;
    }
    for round in [false, true] {
        world.deliver_all()?;
        if !round {
            for project in 0..PROJECTS.len() {
                world.run_checked(&Op::ProjectRound {
                    project,
                    quiet: false,
                })?;
            }
        }
    }
    // Liveness: deliveries healed, everything deleted, demands lapsed; seed s0 of project p0 asks for all the
    // headroom its project and group leave.
    world.drain();
    for project in 0..PROJECTS.len() {
        for seed in SEEDS {
            // Demands lapse (their TTL) once nobody asks any more.
            let copy = world.projects[project].seeds.get_mut(seed).unwrap();
            copy.used = 0;
            copy.demand = None;
            copy.version += 1;
        }
    }
    let own0 = world.projects[0]
        .own
        .get(Resource::Cpu)
        .map_or(i64::MAX, |q| i64::try_from(q.as_nanos() / UNIT).unwrap());
    let want = units_of(&world.group_limit).min(own0);
    let wanting = (0, SEEDS[0]);
    let mut admitted = false;
    for _ in 0..LIVENESS_ROUNDS {
        world.admit(0, SEEDS[0], want);
        if world.projects[0].seeds[SEEDS[0]].used == want {
            admitted = true;
            break;
        }
        // A project whose seeds only now take a word of the group (words lost before) brings in
        // what they hold, as in any step.
        world.checked(|world| world.fair_round(wanting))?;
    }
    prop_assert!(
        admitted,
        "a lone seed asking for {want} did not get it in {LIVENESS_ROUNDS} fair rounds: {}",
        world.summary()
    );
    // Settled (a lowered limit reaches every seed as a target, and they release): within the
    // group's limit as it is now, whatever it was before.
    for _ in 0..3 {
        world.fair_round(wanting);
    }
    let held: i128 = (0..PROJECTS.len()).map(|p| world.held(p)).sum();
    prop_assert!(
        held <= nanos(&world.group_limit),
        "settled, the seeds hold {held} of the group's {}: {}",
        nanos(&world.group_limit),
        world.summary()
    );
    Ok(())
}

#[test]
fn group_budgets_never_let_seeds_hold_more_than_the_group_or_a_project_allows() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(2000);
    let mut runner = TestRunner::new(Config {
        cases,
        ..Config::default()
    });
    let strategy = (
        2..14i64,
        [own_limit(), own_limit()],
        prop::bool::weighted(0.15),
        prop::collection::vec(op(), 1..160),
    );
    runner
        .run(&strategy, |(group_limit, own, may_appear, ops)| {
            check_run(group_limit, own, may_appear, &ops)
        })
        .unwrap();
}

/// A project whose record is lost reads the group's record from a cache that lags one write:
/// the write that gave another project what this one had released. Without `first_budget` it
/// takes that release back as its own while the group's master is away, and the group is
/// overrun: the scenario shows both.
#[test]
fn a_rebuilt_budget_does_not_take_back_what_the_group_gave_away() {
    assert!(rebuilt_budget_scenario(true).is_ok());
    let overrun = rebuilt_budget_scenario(false).unwrap_err();
    assert!(
        overrun
            .to_string()
            .contains("hold or use 6000000000 where 4000000000 is allowed"),
        "{overrun}"
    );
}

fn rebuilt_budget_scenario(first_budget_rule: bool) -> Result<(), TestCaseError> {
    let mut world = World::new(4, [None, None]);
    world.first_budget_rule = first_budget_rule;
    world.settle(0, 4);
    let early = world.history[0].len() - 1;
    // p0's Machines go; p1 wants 3: p0's budget moves to p1.
    world.projects[0].seeds.get_mut(SEEDS[0]).unwrap().used = 0;
    world.settle(1, 3);
    assert_eq!(world.held(1), 3 * UNIT);
    // p0's record is lost; its master reads the group's word from before the move, and the
    // group's master is away. Its seeds take the rebuilt record's epoch, then it grants.
    world.run(&Op::LoseProjectRecord { project: 0 });
    world.run(&Op::StaleWord {
        project: 0,
        index: early,
    });
    world.admit(0, SEEDS[0], 4);
    for _ in 0..4 {
        for seed in SEEDS {
            let report = world.projects[0].seeds[seed].report();
            world.send(Message::SeedReport {
                project: 0,
                seed,
                report,
            });
        }
        world.drain_except_group();
        world.project_round(0, false);
        world.drain_except_group();
        world.admit(0, SEEDS[0], 1);
        world.check()?;
    }
    Ok(())
}

/// A project labelled into the group while it uses 5 of its own, where the other uses 4 of the
/// group's 6 and asks for 2 more, and the group's master reads the label before the newcomer's
/// report: the group grants nothing on what it believes free (the newcomer's use), neither
/// before the report nor after it (the two are over the group together), and the member gets
/// its 2 once the newcomer's Machines are gone.
#[test]
fn a_project_joining_over_the_room_gets_the_group_nothing_more() {
    joining_scenario().unwrap();
}

fn joining_scenario() -> Result<(), TestCaseError> {
    let mut world = World::new(6, [Some(10), Some(10)]);
    // p1 leaves the group and uses 5 of its own; p0 uses 4 of the group's 6.
    for op in [
        Op::Relabel { project: 1 },
        Op::GroupSeesLabel { project: 1 },
        Op::ProjectSeesLabel { project: 1 },
    ] {
        world.run_checked(&op)?;
    }
    world.settle(1, 5);
    world.settle(0, 4);
    for _ in 0..3 {
        world.fair_round((1, SEEDS[1]));
    }
    let budget_before = world.group.seeds["p0"].share_seen();
    // p1 is labelled in; both masters read the label, p1 plans within the group (nothing yet)
    // and its seeds take that; its report to the group has not arrived.
    for op in [
        Op::Relabel { project: 1 },
        Op::GroupSeesLabel { project: 1 },
        Op::ProjectSeesLabel { project: 1 },
        Op::ProjectRound {
            project: 1,
            quiet: false,
        },
    ] {
        world.run_checked(&op)?;
    }
    let (held_back, rest): (Vec<Message>, Vec<Message>) = std::mem::take(&mut world.bag)
        .into_iter()
        .partition(|m| matches!(m, Message::ProjectReport { project: 1, .. }));
    world.bag = rest;
    world.deliver_all()?;
    // p0 asks for 2 more; its report reaches the group, which plans before p1's arrives.
    world.run_checked(&Op::Admit {
        project: 0,
        seed: 0,
        amount: 2,
    })?;
    for op in [
        Op::SeedReport { project: 0, seed: 0 },
        Op::Deliver {
            index: 0,
            keep: false,
        },
        Op::ProjectRound {
            project: 0,
            quiet: false,
        },
    ] {
        world.run_checked(&op)?;
    }
    world
        .bag
        .retain(|m| matches!(m, Message::ProjectReport { project: 0, .. }));
    for op in [
        Op::Deliver {
            index: 0,
            keep: false,
        },
        Op::GroupRound,
    ] {
        world.run_checked(&op)?;
    }
    prop_assert!(
        budget_before.covers(&world.group.seeds["p0"].share_seen()),
        "{}",
        world.summary()
    );
    // p1's report arrives; rounds go on while both keep their Machines: nothing for p0, whose
    // target leaves room for none of it (6 less p1's 5: 1, below the 4 it uses).
    world.bag.extend(held_back);
    for _ in 0..4 {
        world.fair_round((0, SEEDS[0]));
        world.check()?;
        prop_assert!(
            !world.admit(0, SEEDS[0], 2),
            "admitted over the group: {}",
            world.summary()
        );
    }
    prop_assert!(
        budget_before.covers(&world.group.seeds["p0"].share_seen()),
        "{}",
        world.summary()
    );
    prop_assert_eq!(&world.group.seeds["p0"].target, &cpu(1), "{}", world.summary());
    // p1's Machines go: p0 gets its 2.
    world.projects[1].seeds.get_mut(SEEDS[0]).unwrap().used = 0;
    world.settle(0, 2);
    world.check()
}

/// A group made over two busy projects: both labelled in at once, out of the group before, each
/// using 3 of its own 10 on one seed that holds share to spare (its slack at least). With room
/// for all they could hold (a group of 20, their own limits together), they keep their shares
/// while the group hears from them: each admits from them at once, before the group's first
/// grant, and the group's first budgets are what they hold. With none (a group of 5, p1's
/// reports lost), nothing is kept: both give up what they do not use and admit nothing more.
/// Without the room check (keeping whenever grants are held back) that run admits past the
/// group.
#[test]
fn a_group_made_over_busy_projects_keeps_their_shares_only_while_it_has_room() {
    made_over_busy_scenario(20, true).unwrap();
    made_over_busy_scenario(5, true).unwrap();
    // Caught by the scenario's own count, or earlier by the step check (what the seeds may
    // spend above what the projects brought in).
    let overrun = made_over_busy_scenario(5, false).unwrap_err().to_string();
    assert!(
        overrun.contains("admitted past the group")
            || overrun.contains("the seeds of the selected projects hold or use"),
        "{overrun}"
    );
}

fn made_over_busy_scenario(group_limit: i64, room_check: bool) -> Result<(), TestCaseError> {
    let mut world = World::new(group_limit, [Some(10), Some(10)]);
    world.room_check = room_check;
    for project in 0..PROJECTS.len() {
        world.relabel(project)?;
    }
    world.settle(1, 3);
    world.settle(0, 3);
    let held: Vec<i128> = (0..PROJECTS.len()).map(|p| world.held(p)).collect();
    prop_assert!(held.iter().all(|h| *h > 3 * UNIT), "{}", world.summary());
    for project in 0..PROJECTS.len() {
        world.relabel(project)?;
    }
    let room = group_limit >= 20;
    // With no room, p1's reports never reach the group.
    let deliver_all = |world: &mut World| {
        if !room {
            world
                .bag
                .retain(|m| !matches!(m, Message::ProjectReport { project: 1, .. }));
        }
        world.deliver_all()?;
        Ok::<(), TestCaseError>(())
    };
    // The group's first word reaches them before their first round with it.
    world.run_checked(&Op::GroupRound)?;
    deliver_all(&mut world)?;
    for round in 0..5 {
        for project in 0..PROJECTS.len() {
            world.run_checked(&Op::SeedReport { project, seed: 0 })?;
            world.run_checked(&Op::ProjectRound {
                project,
                quiet: false,
            })?;
        }
        deliver_all(&mut world)?;
        if round == 0 && room {
            // Before the group's first grant: both keep their idle share and admit from it.
            for project in 0..PROJECTS.len() {
                prop_assert!(
                    world.admit(project, SEEDS[0], 1),
                    "p{project} admitted nothing from the share it kept: {}",
                    world.summary()
                );
            }
        }
        world.run_checked(&Op::GroupRound)?;
        deliver_all(&mut world)?;
    }
    if room {
        // The first budgets: what each held (with the one admitted since), never less.
        for (project, name) in PROJECTS.iter().enumerate() {
            let budget = nanos(&world.group.seeds[*name].share_seen());
            prop_assert!(
                budget >= held[project],
                "p{project}'s budget {budget}: {}",
                world.summary()
            );
        }
    } else {
        for project in 0..PROJECTS.len() {
            prop_assert!(
                !world.admit(project, SEEDS[0], 1),
                "p{project} admitted past the group: {}",
                world.summary()
            );
        }
    }
    Ok(())
}

/// Both projects use 4 of their own 10 on one seed that holds 8, out of a group of 10. The
/// admin lowers their own limits to 5 each, so that together they fit the group, labels them
/// in, and raises p0's back to 10 once the group's first word (which keeps holdings: 5 + 5
/// fit) is out; no report reaches the group. The group counted p0 at 5: p0 must not keep, and
/// admit from, the 8 its seed still holds.
#[test]
fn an_own_limit_raised_while_the_group_keeps_holdings_gets_nothing_past_the_group() {
    own_limit_raised_scenario().unwrap();
}

/// A group of 10 over two projects with own limits of 10, both labelled out of it, each using
/// 4 on one seed that holds 8.
fn busy_outside_the_group() -> Result<World, TestCaseError> {
    let mut world = World::new(10, [Some(10), Some(10)]);
    for project in 0..PROJECTS.len() {
        world.relabel(project)?;
    }
    for project in 0..PROJECTS.len() {
        world.settle(project, 8);
    }
    for project in 0..PROJECTS.len() {
        world.run_checked(&Op::Delete {
            project,
            seed: 0,
            amount: 4,
        })?;
    }
    Ok(world)
}

fn own_limit_raised_scenario() -> Result<(), TestCaseError> {
    let mut world = busy_outside_the_group()?;
    let held: Vec<i128> = (0..PROJECTS.len()).map(|p| world.held(p)).collect();
    prop_assert!(held.iter().all(|h| *h >= 8 * UNIT), "{}", world.summary());
    for project in 0..PROJECTS.len() {
        world.run_checked(&Op::SetOwnLimit {
            project,
            limit: Some(5),
        })?;
        world.relabel(project)?;
    }
    world.bag.clear();
    world.run_checked(&Op::GroupRound)?;
    let deliver_all = |world: &mut World| {
        world.bag.retain(|m| !matches!(m, Message::ProjectReport { .. }));
        world.deliver_all()?;
        Ok::<(), TestCaseError>(())
    };
    deliver_all(&mut world)?;
    world.run_checked(&Op::SetOwnLimit {
        project: 0,
        limit: Some(10),
    })?;
    for _ in 0..3 {
        for project in 0..PROJECTS.len() {
            world.run_checked(&Op::ProjectRound {
                project,
                quiet: false,
            })?;
        }
        deliver_all(&mut world)?;
    }
    prop_assert!(world.projects[0].kept, "{}", world.summary());
    for project in 0..PROJECTS.len() {
        while world.admit(project, SEEDS[0], 1) {}
    }
    let used: i64 = world
        .projects
        .iter()
        .flat_map(|p| p.seeds.values())
        .map(|c| c.used)
        .sum();
    prop_assert!(used <= 10, "{used} used in a group of 10: {}", world.summary());
    Ok(())
}

/// Both projects use 3 of a group of 10, each with share to spare; the catalog is edited so
/// that p1's Machines count 6 more (12 of 10, no admission decided it). Once the reports and a
/// few rounds have gone round, the group has taken back what p0 held spare: nothing more is
/// admitted anywhere until usage falls, and then p0 gets its room back.
#[test]
fn usage_appearing_past_the_group_stops_admissions_once_it_is_reported() {
    appeared_scenario().unwrap();
}

fn appeared_scenario() -> Result<(), TestCaseError> {
    let mut world = World::new(10, [Some(10), Some(10)]);
    world.appearing = Appearing::May;
    world.settle(0, 3);
    world.settle(1, 3);
    world.run(&Op::Appear {
        project: 1,
        seed: 0,
        amount: 6,
    });
    for _ in 0..4 {
        world.fair_round((0, SEEDS[1]));
    }
    for (project, seed) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
        prop_assert!(
            !world.admit(project, SEEDS[seed], 1),
            "p{project} admitted on {} with the group at 12 of 10: {}",
            SEEDS[seed],
            world.summary()
        );
    }
    // The edit undone (or Machines deleted), and the refused requests' demands lapsed: p0's
    // room comes back, all of it.
    world.run(&Op::Delete {
        project: 1,
        seed: 0,
        amount: 6,
    });
    for project in &mut world.projects {
        for copy in project.seeds.values_mut() {
            copy.demand = None;
            copy.version += 1;
        }
    }
    world.settle(0, 4);
    Ok(())
}

/// Both projects use 4 of their own 10 on one seed that holds 8, outside a group of 10. p0 is
/// labelled in first: the group counts it at its own limit, 10, which fits, and keeps holdings
/// (word a). Both own limits are lowered to 5 and p1 is labelled in: at their lowered limits
/// 5 + 5 would fit (word b). p0's own limit goes back to 10 and p0, not having reported, acts
/// on word a (its cache lags). The group must still count p0 at what word a allowed, 10, so
/// word b keeps nothing: p1, which joined with 4 in use where the group had no room, admits
/// nothing more. (p0 spends what word a let it keep until a newer word reaches it: the window
/// docs/groups.md names for a project joining over the room.)
#[test]
fn a_member_acting_on_an_older_kept_word_gets_nothing_past_the_group() {
    older_kept_word_scenario(Rejoin::No).unwrap();
}

/// The same, with p0 labelled out of the group and back in after word a, both masters seeing
/// it (before it reports): the group's new entry for it must still count it at what word a
/// allowed, which p0 may still act on (`BudgetRecord::departed`).
#[test]
fn a_member_that_left_and_rejoined_gets_nothing_past_the_group_by_a_kept_word_from_before() {
    older_kept_word_scenario(Rejoin::NeverGranted).unwrap();
}

/// The same, with p0 granted budget before it leaves (a review found that a count remembered
/// only for members never granted let this one back in at its lowered limit): back in the
/// group it holds no copy of its budget, and takes word a from its cache as its first.
#[test]
fn a_member_granted_budget_that_left_and_rejoined_gets_nothing_past_the_group_by_a_kept_word_from_before() {
    older_kept_word_scenario(Rejoin::Granted).unwrap();
}

/// Whether p0 leaves the group and comes back after word a, and whether it was granted budget
/// before it left.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rejoin {
    No,
    NeverGranted,
    Granted,
}

fn older_kept_word_scenario(rejoin: Rejoin) -> Result<(), TestCaseError> {
    let mut world = busy_outside_the_group()?;
    world.bag.clear();
    // p0 alone: word a.
    world.relabel(0)?;
    world.run_checked(&Op::GroupRound)?;
    let word_a = world.history[0].len() - 1;
    prop_assert!(world.history[0][word_a].2, "word a keeps: {}", world.summary());
    world.bag.clear();
    if rejoin == Rejoin::Granted {
        for _ in 0..3 {
            world.checked(|world| world.fair_round((0, SEEDS[0])))?;
        }
        prop_assert!(
            !world.group.seeds[PROJECTS[0]].granted.is_empty(),
            "p0 granted: {}",
            world.summary()
        );
    }
    if rejoin != Rejoin::No {
        world.relabel(0)?;
        world.relabel(0)?;
    }
    // Both lowered to 5, p1 in: word b, which p1 takes and plans within.
    for project in 0..PROJECTS.len() {
        world.run_checked(&Op::SetOwnLimit {
            project,
            limit: Some(5),
        })?;
    }
    world.relabel(1)?;
    world.run_checked(&Op::GroupRound)?;
    world
        .bag
        .retain(|m| matches!(m, Message::ToProject { project: 1, .. }));
    let drain = |world: &mut World| {
        world
            .bag
            .retain(|m| !matches!(m, Message::ProjectReport { project: 0, .. }));
        world.deliver_all()?;
        Ok::<(), TestCaseError>(())
    };
    drain(&mut world)?;
    // p0 raised back to 10, and acting on word a; neither reports to the group.
    world.run_checked(&Op::SetOwnLimit {
        project: 0,
        limit: Some(10),
    })?;
    world.run_checked(&Op::StaleWord {
        project: 0,
        index: word_a,
    })?;
    for _ in 0..3 {
        for project in 0..PROJECTS.len() {
            world.run_checked(&Op::ProjectRound {
                project,
                quiet: false,
            })?;
        }
        world.bag.retain(|m| !matches!(m, Message::ProjectReport { .. }));
        drain(&mut world)?;
    }
    for seed in SEEDS {
        prop_assert!(
            !world.admit(1, seed, 1),
            "p1 admitted on {seed} in a group with no room: {}",
            world.summary()
        );
    }
    Ok(())
}

/// p0 holds a budget of 9 of a group of 10 and uses 4; p1 (its own limit 5) holds 5 and uses 2
/// outside the group. p0's own limit is lowered to 5 and its record lost, p1 is labelled in,
/// and the group's master restarts (it has heard from neither; on the real master a lost
/// record takes the project's report with it). Counted at its lowered limit, p0 and p1 would fit
/// (5 + 5) and p1 would keep, and admit from, the share it holds; p0 holds a budget of 9, so the
/// group has no room for p1's holdings, and p1 admits nothing more.
#[test]
fn an_unreported_member_is_counted_at_the_budget_it_holds() {
    unreported_budget_scenario().unwrap();
}

fn unreported_budget_scenario() -> Result<(), TestCaseError> {
    let mut world = World::new(10, [Some(10), Some(5)]);
    world.relabel(1)?;
    world.settle(0, 9);
    world.settle(1, 5);
    for (project, amount) in [(0, 5), (1, 3)] {
        world.run_checked(&Op::Delete {
            project,
            seed: 0,
            amount,
        })?;
    }
    let budget = nanos(&world.group.seeds["p0"].share_seen());
    prop_assert!(budget >= 9 * UNIT, "p0's budget {budget}: {}", world.summary());
    prop_assert!(world.held(1) >= 5 * UNIT, "{}", world.summary());
    world.bag.clear();
    world.run_checked(&Op::SetOwnLimit {
        project: 0,
        limit: Some(5),
    })?;
    world.run_checked(&Op::LoseProjectRecord { project: 0 })?;
    world.relabel(1)?;
    world.run_checked(&Op::RestartGroup)?;
    world.run_checked(&Op::GroupRound)?;
    world.run_checked(&Op::SetOwnLimit {
        project: 0,
        limit: Some(10),
    })?;
    // p1 plans with the group's word, then asks, round after round; no report reaches the
    // group. (Before its first round with the group reaches its seeds, they admit within what
    // they hold from outside it: docs/groups.md.)
    for round in 0..4 {
        if round > 0 {
            for seed in SEEDS {
                world.admit(1, seed, 1);
            }
        }
        for project in 0..PROJECTS.len() {
            for seed in 0..SEEDS.len() {
                world.run_checked(&Op::SeedReport { project, seed })?;
            }
        }
        world.bag.retain(|m| !matches!(m, Message::ProjectReport { .. }));
        world.deliver_all()?;
        for project in 0..PROJECTS.len() {
            world.run_checked(&Op::ProjectRound {
                project,
                quiet: false,
            })?;
        }
        world.bag.retain(|m| !matches!(m, Message::ProjectReport { .. }));
        world.deliver_all()?;
    }
    let used: i64 = world.projects[1].seeds.values().map(|c| c.used).sum();
    prop_assert!(
        used == 2,
        "p1 uses {used}, having joined with 2 where the group had no room: {}",
        world.summary()
    );
    Ok(())
}

/// A run the random test found (1 in about 400,000): project 0 (own limit 4) plans outside the
/// group of 2 and grants seed s1 2.5, is labelled back in, s1 gives the share up, and then
/// project 0's record is lost and rebuilt from s1's stale report: the new record grants s1 2.5
/// again, with target 0. s1 cannot spend it (its capacity is the smaller of share and target),
/// both records count it held, and s1 releases it; nothing past the group is ever spendable.
/// The group's check counts what a seed may spend ([`World::held`]); counting the nominal share
/// failed here.
#[test]
fn a_record_rebuilt_from_a_stale_report_grants_nothing_spendable_past_the_group() {
    use Op::{
        Admit, Deliver, GroupRound, LoseProjectRecord, ProjectRound, ProjectSeesLabel, Relabel, SeedReport,
        StaleWord,
    };
    const FIRST: Op = Deliver {
        index: 0,
        keep: false,
    };
    let round = |project| ProjectRound {
        project,
        quiet: false,
    };
    let admit = |project, seed| Admit {
        project,
        seed,
        amount: 1,
    };
    let deliver = |index| Deliver { index, keep: false };
    let ops = [
        round(0),
        deliver(932_280_040_485_710_929),
        FIRST,
        admit(0, 1),
        FIRST,
        SeedReport { project: 0, seed: 1 },
        SeedReport { project: 0, seed: 0 },
        StaleWord { project: 0, index: 0 },
        FIRST,
        admit(0, 0),
        GroupRound,
        Relabel { project: 0 },
        round(1),
        GroupRound,
        FIRST,
        admit(0, 0),
        ProjectSeesLabel { project: 0 },
        round(0),
        StaleWord { project: 0, index: 0 },
        admit(0, 0),
        Relabel { project: 0 },
        GroupRound,
        FIRST,
        round(0),
        GroupRound,
        FIRST,
        LoseProjectRecord { project: 0 },
        deliver(41_596_096_006_122_385),
        round(0),
        round(0),
        ProjectSeesLabel { project: 0 },
        deliver(8_720_670_062_063_509_065),
        admit(0, 0),
        admit(0, 0),
        round(0),
        admit(0, 0),
        round(0),
        SeedReport { project: 0, seed: 1 },
    ];
    // The state this is about, reached as `check_run` closes the run (every word delivered, a
    // round of each project): s1 holds more than the group's limit, none of it spendable.
    let mut world = World::new(2, [Some(4), None]);
    for op in &ops {
        world.run_checked(op).unwrap();
    }
    world.deliver_all().unwrap();
    for project in 0..PROJECTS.len() {
        world.run_checked(&round(project)).unwrap();
    }
    world.deliver_all().unwrap();
    let s1 = &world.projects[0].seeds["s1"].share;
    assert!(units(&s1.share()) > 2.0, "{}", world.summary());
    assert_eq!(
        s1.target.get(Resource::Cpu),
        Some(Quantity::ZERO),
        "{}",
        world.summary()
    );
    check_run(2, [Some(4), None], false, &ops).unwrap();
}
