//! The group made tighter than its members' own quotas together, over busy projects: how long
//! until it grants, what the creates in that window met, and where the window's time went (when
//! each member took the group's word, and what the master did meanwhile, from its metrics).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result};
use e2e::Fleet;
use e2e::system::System;

use super::{GROUP, Mode, Simulated, Transition, group_off, group_on, phase};

/// Rounds of creates in a group made tighter than its members' own quotas together; at most this
/// many, so that its room covers every one of them.
pub const MADE_TIGHT_ROUNDS: usize = 20;

/// Where a window's time went: when the members took the group's word, and the master's work.
#[derive(Default)]
pub struct Sweep {
    /// From the group's write, when each member's copy first held a word of the group (sorted).
    pub taken: Vec<Duration>,
    /// From the group's write, when every member held one, and when the group granted.
    pub all_holding: Duration,
    pub granting: Duration,
    /// The master's share rounds (`kkp_quota_reconcile_duration_seconds{controller="quota"}`)
    /// and its passes over the groups (`controller="group"`) in the window: how many, and the
    /// seconds they took together.
    pub quota_rounds: (u64, f64),
    pub group_passes: (u64, f64),
    /// The master's writes in the window by target and operation
    /// (`kkp_quota_master_write_duration_seconds`): how many, and their seconds together.
    pub writes: BTreeMap<String, (u64, f64)>,
    /// Share record writes that lost their compare-and-swap in the window.
    pub conflicts: u64,
}

impl Sweep {
    /// The `q` quantile of the members' take times.
    pub fn taken_at(&self, q: f64) -> Duration {
        e2e::bench::percentile(&self.taken, q)
    }
}

/// The group deleted and created again with room for [`MADE_TIGHT_ROUNDS`] Machines per project
/// beyond what runs (`running`), far below their own quotas together: it keeps no holdings, so
/// each project's seed drops to what it commits until every project has taken the group's word
/// and reported, and the group grants. From the group's write, every project's client creates
/// one Machine per round, round after round, until the group grants: what that window costs the
/// creates made in it, how long it lasts and where its time went. Returns them and the Machines
/// admitted.
pub async fn made_tight(
    fleet: &Fleet,
    system: &System,
    sim: &Simulated,
    projects: usize,
    running: usize,
) -> Result<(Transition, Sweep, usize)> {
    group_off(fleet).await?;
    let master = system
        .of_kind("master-controller")
        .next()
        .context("no master-controller")?;
    let before = master.scrape().await?;
    let limit = i64::try_from(running + MADE_TIGHT_ROUNDS * projects)?;
    let granting = AtomicBool::new(false);
    let taken = Mutex::new(BTreeMap::new());
    let (settled, rounds) = tokio::join!(
        async {
            let settling = group_on(fleet, projects, limit, Some(&taken)).await;
            granting.store(true, Ordering::Relaxed);
            settling
        },
        async {
            let mut rounds = Vec::new();
            while !granting.load(Ordering::Relaxed) && rounds.len() < MADE_TIGHT_ROUNDS {
                rounds.push(phase(sim, Mode::Group, &format!("made-{}", rounds.len()), 1).await?);
            }
            Ok::<_, anyhow::Error>(rounds)
        }
    );
    let after = master.scrape().await?;
    let rounds = rounds?;
    let settled = settled?;
    let mut taken: Vec<Duration> = taken.into_inner().unwrap_or_default().into_values().collect();
    taken.sort();
    let sweep = Sweep {
        taken,
        all_holding: settled.holding,
        granting: settled.granting,
        quota_rounds: grown(
            &before,
            &after,
            "kkp_quota_reconcile_duration_seconds",
            "{controller=\"quota\"}",
        ),
        group_passes: grown(
            &before,
            &after,
            "kkp_quota_reconcile_duration_seconds",
            "{controller=\"group\"}",
        ),
        writes: grown_by_labels(&before, &after, "kkp_quota_master_write_duration_seconds"),
        conflicts: counter(&after, "kkp_quota_share_record_conflicts_total")
            .saturating_sub(counter(&before, "kkp_quota_share_record_conflicts_total")),
    };
    let transition = Transition {
        settled: settled.granting,
        warm_attempted: rounds.iter().map(|p| p.attempted).sum(),
        warm_denied: rounds.iter().map(|p| p.denied).sum(),
        warm_failed: rounds.iter().map(|p| p.failed).sum(),
    };
    eprintln!(
        "made tight: granting after {:.1} s; {} creates in {} rounds meanwhile, {} denied, {} refused without a decision",
        transition.settled.as_secs_f64(),
        transition.warm_attempted,
        rounds.len(),
        transition.warm_denied,
        transition.warm_failed
    );
    eprintln!(
        "made tight: members took {GROUP}'s word after {:.1} / {:.1} / {:.1} s (p10 / p50 / p90), all after {:.1} s; master: {} share rounds ({:.1} s together), {} group passes ({:.1} s), {} conflicts; writes {:?}",
        sweep.taken_at(0.1).as_secs_f64(),
        sweep.taken_at(0.5).as_secs_f64(),
        sweep.taken_at(0.9).as_secs_f64(),
        sweep.all_holding.as_secs_f64(),
        sweep.quota_rounds.0,
        sweep.quota_rounds.1,
        sweep.group_passes.0,
        sweep.group_passes.1,
        sweep.conflicts,
        sweep.writes
    );
    Ok((transition, sweep, rounds.iter().map(|p| p.admitted).sum()))
}

/// The growth of histogram `name`'s series `labels` (as exposed, braces included) between two
/// scrapes: observations, and their seconds together.
fn grown(before: &str, after: &str, name: &str, labels: &str) -> (u64, f64) {
    let read = |text: &str| {
        let count = e2e::system::sample(text, &format!("{name}_count{labels}")).unwrap_or(0.0);
        let sum = e2e::system::sample(text, &format!("{name}_sum{labels}")).unwrap_or(0.0);
        (count, sum)
    };
    let (c0, s0) = read(before);
    let (c1, s1) = read(after);
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let count = (c1 - c0).max(0.0) as u64;
    (count, (s1 - s0).max(0.0))
}

/// [`grown`] for every series of histogram `name`, by its labels.
fn grown_by_labels(before: &str, after: &str, name: &str) -> BTreeMap<String, (u64, f64)> {
    let prefix = format!("{name}_count");
    after
        .lines()
        .filter_map(|line| {
            line.strip_prefix(&prefix)?
                .split_once(' ')
                .map(|(labels, _)| labels.to_owned())
        })
        .map(|labels| {
            let grew = grown(before, after, name, &labels);
            (labels, grew)
        })
        .filter(|(_, (count, _))| *count > 0)
        .collect()
}

fn counter(text: &str, series: &str) -> u64 {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let value = e2e::system::sample(text, series).unwrap_or(0.0).max(0.0) as u64;
    value
}
