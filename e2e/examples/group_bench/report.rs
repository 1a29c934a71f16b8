//! The results file of the group benchmark: what [`super::measure`] measured, as Markdown.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Result;
use e2e::bench::{Buckets, histogram_quantile, median, ms, per_round_ratios, percentile, rate};
use e2e::procfs::CpuTicks;
use e2e::system::Webhooks;

use super::{Args, CPU_GROUPS, Measured, Mode, OWN_CPU, Phase, Writes};

/// The results file.
#[allow(clippy::too_many_lines)] // one file, written top to bottom
pub(super) fn report(args: &Args, measured: &Measured, set_up: Duration) -> Result<String> {
    let Measured {
        phases,
        transitions,
        made_tight,
        sweep,
        tight,
        headroom,
    } = measured;
    let headroom = *headroom;
    let mut out = String::new();
    let projects = args.projects;
    writeln!(
        out,
        "# A shared quota group of {projects} projects: admission throughput\n"
    )?;
    writeln!(
        out,
        "Measured by `cargo run --release -p e2e --example group_bench -- --projects {projects} --hosts {} --rounds {} --creates {}` on {} ({}). The whole system runs as real processes built in the {} beside real API servers: a master, one seed, {} user-cluster API servers. Each of the {projects} projects has one simulated user cluster (a namespace on one of those API servers, its KKP `Cluster` on the seed, its own webhook configuration with its signed URL; seed-controller watches each one's Machines as it would a cluster's), so {projects} projects fit on this machine; set-up took {:.0} s. Every project has its own quota of {OWN_CPU} cpu. In every phase each project has one client creating 1-cpu Machines one after another ({} per project, {} per phase), after an unmeasured warm-up of a quarter of that in the same mode and a wait until every project's seed holds share for the phase (so a phase measures admission, not share moving: the cost of moving it is measured apart, below); Machines are kept, so every phase starts with more of them. Modes alternate, in an order that changes every round (`e2e::bench::round_order`). The group mode's group is `shared`, over all {projects} projects, with a limit of {} cpu (far from what they use: each member's budget, not its own quota, is what its seed's shares are planned within).\n",
        args.hosts,
        args.rounds,
        args.creates,
        jiff::Zoned::now().date(),
        e2e::bench::host(),
        e2e::bench::profile(),
        args.hosts,
        set_up.as_secs_f64(),
        args.creates,
        args.creates * projects,
        OWN_CPU * i64::try_from(projects)?,
    )?;
    let of = |mode: Mode| -> Vec<&Phase> { phases.iter().filter(|p| p.mode == mode).collect() };
    let rates = |mode: Mode| -> Vec<f64> { of(mode).iter().map(|p| rate(p.attempted, p.elapsed)).collect() };
    let base = rates(Mode::Projects);
    let ratios = per_round_ratios(&rates(Mode::Group), &base);
    let ratio = median(ratios.clone());
    let shown: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
    writeln!(
        out,
        "**With the group / without: {ratio:.2} of the throughput (median of the rounds' ratios: {}; goal: at least 0.90).**\n",
        shown.join(", ")
    )?;
    writeln!(
        out,
        "| mode | creates/s (median of rounds) | create p50 | create p99 | decision p50 | decision p99 | waited for share: admitted / denied | demands written |"
    )?;
    writeln!(out, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")?;
    for mode in [Mode::Projects, Mode::Group] {
        let phases = of(mode);
        let mut latencies: Vec<Duration> = phases.iter().flat_map(|p| p.latencies.iter().copied()).collect();
        latencies.sort();
        let mut webhook = Webhooks::default();
        for p in &phases {
            webhook.add(&p.webhook);
        }
        let decision = |q: f64| format!("{:.2} ms", histogram_quantile(&webhook.decision, q) * 1000.0);
        let count = |b: &Buckets| b.last().map_or(0, |b| b.1);
        writeln!(
            out,
            "| {} | {:.1} | {} | {} | {} | {} | {} / {} | {:.0} |",
            mode.label(),
            median(rates(mode)),
            ms(percentile(&latencies, 0.5)),
            ms(percentile(&latencies, 0.99)),
            decision(0.5),
            decision(0.99),
            count(&webhook.share_allowed),
            count(&webhook.share_denied),
            webhook.demands,
        )?;
    }
    let per_second = e2e::procfs::ticks_per_second();
    writeln!(
        out,
        "\nCPU ms per create (user + system time from `/proc/<pid>/stat` over every phase of the mode, divided by its creates; every process shares the machine's cores, so creates/s follows what a create costs in all of them together):\n"
    )?;
    writeln!(
        out,
        "| mode | all | {} | this program (the clients) |",
        CPU_GROUPS.join(" | ")
    )?;
    writeln!(out, "| --- | ---:{} |", " | ---:".repeat(CPU_GROUPS.len() + 1))?;
    for mode in [Mode::Projects, Mode::Group] {
        let phases = of(mode);
        let mut used = CpuTicks::default();
        for p in &phases {
            used.add(&p.cpu);
        }
        let creates = phases.iter().map(|p| p.attempted).sum::<usize>();
        writeln!(
            out,
            "| {} | {} |",
            mode.label(),
            used.per_create_row(per_second, creates)
        )?;
    }
    writeln!(
        out,
        "\nWrites per 100 creates the master's and the seed's API servers served (their `apiserver_request_total`, every write verb, over every phase of the mode; the Machines themselves are written to the hosts, not here):\n"
    )?;
    writeln!(out, "| mode | master | seed |")?;
    writeln!(out, "| --- | --- | --- |")?;
    for mode in [Mode::Projects, Mode::Group] {
        let phases = of(mode);
        #[allow(clippy::cast_precision_loss)]
        let creates = phases.iter().map(|p| p.attempted).sum::<usize>().max(1) as f64;
        let (mut master, mut seed) = (Writes::default(), Writes::default());
        for p in &phases {
            master.add(&p.master_writes);
            seed.add(&p.seed_writes);
        }
        writeln!(
            out,
            "| {} | {} | {} |",
            mode.label(),
            master.per_100(creates),
            seed.per_100(creates)
        )?;
    }
    writeln!(
        out,
        "\nReads per 100 creates the master's API server served (`GET`, `LIST`, and `WATCH` requests begun, over every phase of the mode):\n"
    )?;
    writeln!(out, "| mode | master |")?;
    writeln!(out, "| --- | --- |")?;
    for mode in [Mode::Projects, Mode::Group] {
        let phases = of(mode);
        #[allow(clippy::cast_precision_loss)]
        let creates = phases.iter().map(|p| p.attempted).sum::<usize>().max(1) as f64;
        let mut reads = Writes::default();
        for p in &phases {
            reads.add(&p.master_reads);
        }
        writeln!(out, "| {} | {} |", mode.label(), reads.per_100(creates))?;
    }
    writeln!(out, "\nPer phase:\n")?;
    writeln!(
        out,
        "| phase | mode | admitted | refused without a decision (\"try again\") | seconds | creates/s | create p99 |"
    )?;
    writeln!(out, "| ---: | --- | ---: | ---: | ---: | ---: | ---: |")?;
    for (i, p) in phases.iter().enumerate() {
        writeln!(
            out,
            "| {i} | {} | {} | {} | {:.2} | {:.1} | {} |",
            p.mode.label(),
            p.admitted,
            p.failed,
            p.elapsed.as_secs_f64(),
            rate(p.attempted, p.elapsed),
            ms(percentile(&p.latencies, 0.99)),
        )?;
    }
    writeln!(out, "\n## A group created over busy projects\n")?;
    writeln!(
        out,
        "Before each group phase that found no group, the group was created over the {projects} projects, all with Machines and shares of their own. The group's limit covers what every project could hold (their own quotas together), so until it has heard from every project its record keeps their holdings (`holdingsKept`, docs/groups.md): each project's seed keeps the share it holds and admits from it, and the group's first budgets are what they hold; a group tighter than that would lower each seed's share to what it commits until budgets are granted. The warm-up runs at once; the measured phase waits until every project's seed holds share for the phase again (above). A create in that window that finds no share waits for it (up to the webhook's share wait, 3 s) and is denied if it does not arrive.\n"
    )?;
    writeln!(
        out,
        "| group created | settled after | warm-up creates | denied | refused without a decision |"
    )?;
    writeln!(out, "| ---: | ---: | ---: | ---: | ---: |")?;
    for (i, t) in transitions.iter().enumerate() {
        writeln!(
            out,
            "| {} | {:.1} s | {} | {} | {} |",
            i + 1,
            t.settled.as_secs_f64(),
            t.warm_attempted,
            t.warm_denied,
            t.warm_failed
        )?;
    }
    writeln!(
        out,
        "\n## A group created tighter than its projects' quotas together\n"
    )?;
    writeln!(
        out,
        "The group deleted, then created again over the same busy projects with room for {} more Machines per project, far below their own quotas together ({OWN_CPU} cpu each): it keeps no holdings, so every project's seed drops to what it commits until every project has taken the group's word and reported and the group grants (docs/limits.md). From the group's write, every project's client created one Machine per round, round after round, until the group granted (every project holding its word, `GrantsHeld` false): **granting after {:.1} s; {} creates meanwhile, {} denied**, {} refused without a decision.",
        super::made_tight::MADE_TIGHT_ROUNDS,
        made_tight.settled.as_secs_f64(),
        made_tight.warm_attempted,
        made_tight.warm_denied,
        made_tight.warm_failed
    )?;
    sweep_table(&mut out, sweep)?;
    writeln!(out, "\n## The group enforced\n")?;
    writeln!(
        out,
        "Checked, not timed: the group's limit lowered to the cpu of every Machine created so far plus {headroom} (half a Machine per project), in force once every project's copy holds the group's current word, every project's seed its project's current record, and the record counts no more held than that (each project at the larger of its budget and what it reported committed); it runs right after the group made tight below; then every project's client creates two Machines at once ({} creates). Admitted: **{} of a headroom of {headroom}** (more fails the run; fewer is headroom left in budgets too small for a Machine, or not moved to the projects that asked before their wait for share ended); {} denied, {} of them naming the group; {} refused without a decision (the webhook's ledger write did not land in time: \"try again\"); {:.2} s, create p99 {}.",
        tight.attempted,
        tight.admitted,
        tight.denied,
        tight.denied_by_group,
        tight.failed,
        tight.elapsed.as_secs_f64(),
        ms(percentile(&tight.latencies, 0.99)),
    )?;
    Ok(out)
}

/// Where the made-tight window's time went ([`super::made_tight::Sweep`]).
fn sweep_table(out: &mut String, sweep: &super::made_tight::Sweep) -> Result<()> {
    let mean_ms = |(count, seconds): (u64, f64)| {
        #[allow(clippy::cast_precision_loss)]
        let mean = if count == 0 {
            0.0
        } else {
            seconds * 1000.0 / count as f64
        };
        mean
    };
    writeln!(
        out,
        "\nWhere that window went, from the group's write: the members first seen holding its word (the benchmark's own polling) after {:.1} / {:.1} / {:.1} s (p10 / p50 / p90), every member after {:.1} s, the group granting after {:.1} s. The master meanwhile (its metrics): {} share rounds, {:.1} s together (mean {:.0} ms; `--concurrency` 16), {} passes over the groups, {:.1} s together (mean {:.0} ms), {} share record writes that lost their compare-and-swap.\n",
        sweep.taken_at(0.1).as_secs_f64(),
        sweep.taken_at(0.5).as_secs_f64(),
        sweep.taken_at(0.9).as_secs_f64(),
        sweep.all_holding.as_secs_f64(),
        sweep.granting.as_secs_f64(),
        sweep.quota_rounds.0,
        sweep.quota_rounds.1,
        mean_ms(sweep.quota_rounds),
        sweep.group_passes.0,
        sweep.group_passes.1,
        mean_ms(sweep.group_passes),
        sweep.conflicts,
    )?;
    writeln!(
        out,
        "| the master's writes in the window | count | seconds together | mean |"
    )?;
    writeln!(out, "| --- | ---: | ---: | ---: |")?;
    for (labels, grew) in &sweep.writes {
        writeln!(
            out,
            "| `{labels}` | {} | {:.1} | {:.0} ms |",
            grew.0,
            grew.1,
            mean_ms(*grew)
        )?;
    }
    Ok(())
}
