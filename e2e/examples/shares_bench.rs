//! Benchmark (run by hand, not a test): one quota over two seeds, on the whole system as real
//! processes (master-controller, and a seed-controller and a machine-webhook per seed), in the
//! profile this example is built in.
//!
//! - **Burst throughput**: `clients` concurrent clients, each creating `creates` Machines (1 cpu)
//!   one after another, in four modes measured in the same run, rounds interleaved, each phase
//!   after an unmeasured warm-up of a quarter of its creates in its own mode: a project
//!   without quota (the webhook decides nothing), a quota far from its limit used from one seed,
//!   the same used from both seeds, and a tight quota (headroom 5% of the creates) used from both
//!   seeds, where exactly the headroom must be admitted (checked, not timed).
//! - **Share transfer**: with a quota of one cpu held idle by one seed, the latency of a create
//!   on the other seed (the master asks the holder to release, then grants), against a create on
//!   the seed that already holds the share.
//!
//! ```text
//! cargo run --release -p e2e --example shares_bench [-- <rounds> <clients> <creates per client> <transfers>]
//! ```
//!
//! Writes `e2e/results/shares.md`. With `SHARES_BENCH_PPROF=DIR`, a profiling run: seed-a's API
//! server's CPU profile over each measured phase goes into DIR.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use e2e::api_writes::Writes;
use e2e::bench::{Buckets, histogram_quantile, median, ms, percentile, rate};
use e2e::machines::{self, is_quota_denial};
use e2e::procfs::CpuTicks;
use e2e::system::{FleetWithSystem, Webhooks, sample};
use e2e::{Fleet, FleetSpec, wait_for};
use futures::future::join_all;
use kkp_quota_crds::machine::Machine;
use kkp_quota_crds::shares::objects::committed;
use kkp_quota_crds::{ProjectQuota, QuotaLedger, QuotaLedgerStatus, Resource, ResourceDetails};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};

const NAME: &str = "project-demo";
const SEEDS: [&str; 2] = ["seed-a", "seed-b"];
const WAIT: Duration = Duration::from_mins(2);
/// How long each phase's profile samples, with `SHARES_BENCH_PPROF` (a phase lasts 2-3 s).
const PROFILE_FOR: Duration = Duration::from_secs(2);
/// Clusters of project `demo` (with the quota) and of project `free` (without). Every mode
/// loads two user clusters, so that modes compare at the same number of busy API servers.
const DEMO: [&str; 3] = ["alpha", "beta", "gamma"];
const ONE_SEED: [&str; 2] = ["alpha", "beta"];
const BOTH_SEEDS: [&str; 2] = ["alpha", "gamma"];
const NO_QUOTA: [&str; 2] = ["delta", "epsilon"];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    NoQuota,
    OneSeed,
    BothSeeds,
    Tight,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::NoQuota => "project without quota (webhook decides nothing), both seeds",
            Mode::OneSeed => "quota far from the limit, one seed",
            Mode::BothSeeds => "quota far from the limit, both seeds",
            Mode::Tight => "tight quota (headroom 5% of the creates), both seeds",
        }
    }

    /// For file names.
    fn short(self) -> &'static str {
        match self {
            Mode::NoQuota => "none",
            Mode::OneSeed => "one-seed",
            Mode::BothSeeds => "both-seeds",
            Mode::Tight => "tight",
        }
    }

    fn clusters(self) -> &'static [&'static str] {
        match self {
            Mode::NoQuota => &NO_QUOTA,
            Mode::OneSeed => &ONE_SEED,
            Mode::BothSeeds | Mode::Tight => &BOTH_SEEDS,
        }
    }
}

/// What one phase measured.
struct Phase {
    mode: Mode,
    attempted: usize,
    admitted: usize,
    denied: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
    /// What the webhooks' histograms counted during the phase.
    webhooks: Webhooks,
    /// CPU ticks each of [`CPU_GROUPS`] used during the phase.
    cpu: CpuTicks,
    /// Writes each of [`WRITE_TARGETS`] served during the phase.
    writes: Vec<Writes>,
}

/// The clusters whose writes are counted, in the table's order (the user clusters get the
/// Machines themselves, the same in every mode).
const WRITE_TARGETS: [&str; 3] = ["master", "seed-a", "seed-b"];

async fn scrape_writes(fleet: &Fleet) -> Result<Vec<Writes>> {
    let mut all = Vec::new();
    for target in WRITE_TARGETS {
        let client = if target == "master" {
            fleet.master().client()
        } else {
            fleet.seed(target).client()
        };
        all.push(Writes::scrape(&client).await?);
    }
    Ok(all)
}

/// The groups of processes whose CPU time is measured, in the table's order (this program,
/// the clients, comes last: [`CpuTicks::this_process`]).
const CPU_GROUPS: [&str; 6] = [
    "user clusters' API servers + etcds",
    "seeds' API servers + etcds",
    "master API server + etcd",
    "master-controller",
    "seed-controllers",
    "machine-webhooks",
];

/// The pids of each of [`CPU_GROUPS`].
fn cpu_groups(setup: &FleetWithSystem) -> Vec<Vec<u32>> {
    let fleet = &setup.fleet;
    let planes = |names: &mut dyn Iterator<Item = &str>| -> Vec<u32> {
        names
            .flat_map(|n| fleet.get(n).map(e2e::ControlPlane::pids).unwrap_or_default())
            .collect()
    };
    let kind = |k: &str| -> Vec<u32> { setup.system.of_kind(k).map(e2e::system::Component::pid).collect() };
    vec![
        planes(&mut DEMO.iter().chain(&NO_QUOTA).copied()),
        planes(&mut SEEDS.iter().copied()),
        fleet.master().pids(),
        kind("master-controller"),
        kind("seed-controller"),
        kind("machine-webhook"),
    ]
}

/// "count / p50 / p99" of what a histogram counted.
fn summary(buckets: &[(f64, u64)]) -> String {
    let count = buckets.last().map_or(0, |b| b.1);
    let q = |q: f64| histogram_quantile(buckets, q) * 1000.0;
    format!("{count} / {:.2} ms / {:.2} ms", q(0.5), q(0.99))
}

fn machine(name: &str) -> Machine {
    e2e::machines::vsphere(name, 1)
}

async fn set_quota(fleet: &Fleet, cpu: i64) -> Result<()> {
    let quota = e2e::demo::cpu_quota("demo", &cpu.to_string());
    e2e::demo::apply_quota(fleet, &quota, "shares-bench").await?;
    for seed in ["seed-a", "seed-b"] {
        let ledgers = Api::<QuotaLedger>::all(fleet.seed(seed).client());
        wait_for(WAIT, &format!("quota {cpu} on {seed}"), || async {
            let ledger = ledgers.get(NAME).await.ok()?;
            let limit = ledger.spec.quota.get(Resource::Cpu)?;
            (limit.ceil_units() == i128::from(cpu) && ledger.spec.shares.is_some()).then_some(())
        })
        .await?;
    }
    Ok(())
}

/// Deletes every Machine of `clusters`, then waits, in causal order, until no seed has anything
/// committed, the master's view shows every seed without usage, and every seed's fold of the
/// others (by which the webhook tells a wait for share from a full quota) caught up with it.
/// Checking the folds first would race a fold of the deleted Machines still on its way.
async fn clean(fleet: &Fleet, clusters: &[&str]) -> Result<()> {
    for cluster in clusters {
        machines::api(fleet, cluster)
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await?;
    }
    // No ledger yet (no quota written yet): nothing committed, nothing folded.
    each_ledger(fleet, "idle", |status| {
        committed(status).is_ok_and(|c| no_machines(&c))
    })
    .await?;
    let quotas = Api::<ProjectQuota>::all(fleet.master().client());
    wait_for(WAIT, "the master's view of the seeds idle", || async {
        let Some(quota) = quotas.get_opt(NAME).await.ok()? else {
            return Some(());
        };
        let status = quota.status.unwrap_or_default();
        let idle = status
            .seeds
            .iter()
            .all(|s| s.usage.as_ref().is_none_or(no_machines));
        idle.then_some(())
    })
    .await?;
    each_ledger(fleet, "fold of the others caught up", |status| {
        status.other_seeds_usage.as_ref().is_none_or(no_machines)
    })
    .await?;
    Ok(())
}

/// Nothing a Machine asks for is used or held: the project's clusters stay counted (they are
/// not this benchmark's to delete), so "idle" leaves `clusters` out.
fn no_machines(usage: &ResourceDetails) -> bool {
    usage
        .iter()
        .all(|(resource, amount)| !resource.asked_by_machines() || amount.is_zero())
}

/// Waits, seed after seed, until the project's ledger status satisfies `ok` (a seed without the
/// ledger yet counts as satisfying it).
async fn each_ledger(fleet: &Fleet, what: &str, ok: impl Fn(&QuotaLedgerStatus) -> bool) -> Result<()> {
    for seed in SEEDS {
        let ledgers = Api::<QuotaLedger>::all(fleet.seed(seed).client());
        wait_for(WAIT, &format!("{seed}: {what}"), || async {
            match ledgers.get_opt(NAME).await.ok()? {
                None => Some(()),
                Some(ledger) => ok(&ledger.status.unwrap_or_default()).then_some(()),
            }
        })
        .await?;
    }
    Ok(())
}

/// `clients` clients, each creating `creates` Machines one after another, over `mode`'s clusters.
async fn phase(fleet: &Fleet, mode: Mode, tag: &str, clients: usize, creates: usize) -> Result<Phase> {
    let clusters = mode.clusters();
    let start = Instant::now();
    let runs = (0..clients).map(|c| {
        let api = machines::api(fleet, clusters[c % clusters.len()]);
        async move {
            let mut out = Vec::with_capacity(creates);
            for i in 0..creates {
                let began = Instant::now();
                let result = api
                    .create(&PostParams::default(), &machine(&format!("{tag}-{c}-{i}")))
                    .await;
                out.push((began.elapsed(), result.map(|_| ())));
            }
            out
        }
    });
    let results: Vec<_> = join_all(runs).await.into_iter().flatten().collect();
    let elapsed = start.elapsed();
    let mut phase = Phase {
        mode,
        attempted: results.len(),
        admitted: 0,
        denied: 0,
        elapsed,
        latencies: Vec::with_capacity(results.len()),
        webhooks: Webhooks::default(),
        cpu: CpuTicks::default(),
        writes: Vec::new(),
    };
    for (latency, result) in results {
        phase.latencies.push(latency);
        match result {
            Ok(()) => phase.admitted += 1,
            Err(e) if is_quota_denial(&e, "demo") => phase.denied += 1,
            Err(e) => bail!("{}: a create failed: {e}", mode.label()),
        }
    }
    Ok(phase)
}

/// One create on `cluster`, timed; `None` when it was denied (reported, not retried).
async fn timed_create(fleet: &Fleet, cluster: &str, name: &str) -> Result<Option<Duration>> {
    let began = Instant::now();
    match machines::api(fleet, cluster)
        .create(&PostParams::default(), &machine(name))
        .await
    {
        Ok(_) => Ok(Some(began.elapsed())),
        Err(e) if is_quota_denial(&e, "demo") => {
            eprintln!("{name} on {cluster} denied: {e}");
            Ok(None)
        }
        Err(e) => Err(e).with_context(|| format!("{name} on {cluster}")),
    }
}

/// The master's `kkp_quota_share_grant_latency_seconds` sum and count.
async fn grant_latency(setup: &FleetWithSystem) -> Result<(f64, f64)> {
    let master = setup
        .system
        .of_kind("master-controller")
        .next()
        .context("no master-controller")?;
    let text = master.scrape().await?;
    let value = |name: &str| sample(&text, name).unwrap_or(0.0);
    Ok((
        value("kkp_quota_share_grant_latency_seconds_sum"),
        value("kkp_quota_share_grant_latency_seconds_count"),
    ))
}

fn arg(n: usize, default: usize) -> Result<usize> {
    std::env::args().nth(n).map_or(Ok(default), |a| {
        a.parse().with_context(|| format!("argument {n}: {a}"))
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines)]
async fn main() -> Result<()> {
    let rounds = arg(1, 5)?;
    let clients = arg(2, 16)?;
    // 60 each: 960 creates a phase, about a second. With 15 (a third of a second) the first
    // requests' wait for share at a phase's start was a third of the phase's time.
    let creates = arg(3, 60)?;
    let transfers = arg(4, 20)?;
    let total = clients * creates;
    let far = i64::try_from(total * 10)?;
    let tight = i64::try_from((total * 5).div_ceil(100))?;

    let spec = FleetSpec::empty()
        .with_seed("seed-a")
        .with_seed("seed-b")
        .with_project("demo")
        .with_project("free")
        .with_user_cluster("alpha", "seed-a", "demo")
        .with_user_cluster("beta", "seed-a", "demo")
        .with_user_cluster("gamma", "seed-b", "demo")
        .with_user_cluster("delta", "seed-a", "free")
        .with_user_cluster("epsilon", "seed-b", "free");
    // A profiling run (not a measurement): seed-a's API server sampled over the first
    // PROFILE_FOR of every measured phase, into this directory (`go tool pprof -top FILE`).
    let profiles = std::env::var_os("SHARES_BENCH_PPROF").map(std::path::PathBuf::from);
    if let Some(dir) = &profiles {
        std::fs::create_dir_all(dir)?;
    }
    let setup = FleetWithSystem::start(spec).await?;
    let fleet = &setup.fleet;
    let groups = cpu_groups(&setup);

    // Burst throughput, rounds interleaved.
    let mut phases = Vec::new();
    let modes = [Mode::NoQuota, Mode::OneSeed, Mode::BothSeeds, Mode::Tight];
    for round in 0..rounds {
        for mode in e2e::bench::round_order(&modes, round) {
            if mode != Mode::NoQuota {
                set_quota(fleet, if mode == Mode::Tight { tight } else { far }).await?;
            }
            // An unmeasured warm-up in the same mode (a quarter of the phase), then cleaned
            // away: the phase then measures the mode itself, not the move out of its
            // predecessor's state (the quota lowered from far to tight, share held by the
            // seed the last mode used, API servers paced for another rate). The move of share
            // to a seed without it is measured apart, below (share transfer).
            let warm = phase(
                fleet,
                mode,
                &format!("w{round}-{}", phases.len()),
                clients,
                creates.div_ceil(4),
            )
            .await?;
            ensure!(
                mode != Mode::Tight || warm.admitted <= usize::try_from(tight)?,
                "tight warm-up: {} admitted, over the headroom {tight}",
                warm.admitted
            );
            clean(fleet, mode.clusters()).await?;
            let before = Webhooks::scrape(&setup.system).await?;
            let cpu_before = CpuTicks::now(&groups);
            let writes_before = scrape_writes(fleet).await?;
            let tag = format!("r{round}-{}", phases.len());
            let measured = phase(fleet, mode, &tag, clients, creates);
            let mut p = match &profiles {
                None => measured.await?,
                Some(dir) => {
                    let file = dir.join(format!("r{round}-{}-seed-a.pprof", mode.short()));
                    let seed_a = fleet.seed("seed-a").client();
                    let profile = e2e::pprof::cpu_profile(&seed_a, PROFILE_FOR, &file);
                    let (p, sampled) = futures::join!(measured, profile);
                    sampled?;
                    p?
                }
            };
            p.cpu = CpuTicks::now(&groups).since(&cpu_before);
            p.writes = scrape_writes(fleet)
                .await?
                .iter()
                .zip(&writes_before)
                .map(|(after, before)| after.since(before))
                .collect();
            p.webhooks = Webhooks::scrape(&setup.system).await?.since(&before);
            eprintln!(
                "round {round}: {}: {} of {} admitted in {:.2} s",
                mode.label(),
                p.admitted,
                p.attempted,
                p.elapsed.as_secs_f64()
            );
            // Never over: that would be a broken promise, not a slow run. Fewer than the
            // headroom is reported in the table (share left in fragments too small to use).
            ensure!(
                mode != Mode::Tight || p.admitted <= usize::try_from(tight)?,
                "tight: {} admitted, over the headroom {tight}",
                p.admitted
            );
            clean(fleet, mode.clusters()).await?;
            phases.push(p);
        }
    }

    // Share transfer: one cpu, held idle by the seed that last used it.
    set_quota(fleet, 1).await?;
    let (sum0, count0) = grant_latency(&setup).await?;
    let mut moved = Vec::new();
    let mut stayed = Vec::new();
    let mut denied = (0, 0);
    for i in 0..transfers {
        let cluster = if i % 2 == 0 { "gamma" } else { "alpha" };
        match timed_create(fleet, cluster, &format!("move-{i}")).await? {
            Some(latency) => moved.push(latency),
            None => denied.0 += 1,
        }
        clean(fleet, &[cluster]).await?;
        match timed_create(fleet, cluster, &format!("stay-{i}")).await? {
            Some(latency) => stayed.push(latency),
            None => denied.1 += 1,
        }
        clean(fleet, &[cluster]).await?;
    }
    let (sum1, count1) = grant_latency(&setup).await?;
    moved.sort();
    stayed.sort();

    // The results file.
    let mut out = String::new();
    writeln!(
        out,
        "# Per-seed shares: burst throughput and share transfer latency\n"
    )?;
    writeln!(
        out,
        "Measured by `cargo run --release -p e2e --example shares_bench -- {rounds} {clients} {creates} {transfers}` on {} ({}), rounds interleaved, each mode measured once per round, in an order that changes every round (`e2e::bench::round_order`: a mode runs at another position and after another mode from round to round), each phase after an unmeasured warm-up of a quarter of its creates in its own mode, cleaned away before the phase (so a phase measures its mode, not the move of share and quota out of its predecessor's state; that move is the share transfer below). The whole system runs as real release-built processes beside a fleet of real API servers: master, seed-a (user clusters alpha, beta of project `demo`; delta of project `free`), seed-b (gamma of `demo`; epsilon of `free`). Every mode loads two user clusters: without quota delta and epsilon, one seed alpha and beta, both seeds alpha and gamma. Every Machine is 1 cpu.\n",
        jiff::Zoned::now().date(),
        e2e::bench::host(),
    )?;
    writeln!(out, "## Burst throughput\n")?;
    writeln!(
        out,
        "{clients} clients each create {creates} Machines one after another ({total} per phase), spread over the mode's clusters. \"Far from the limit\" is a quota of {far} cpu; \"tight\" is {tight} cpu, so at most {tight} of {total} may be admitted (over would fail the run; the table gives what was admitted in each round) and the rest are denied, many only after waiting up to the webhook's share wait (3 s) for share the other seed holds. Rates are medians over the rounds; the ratio is to the project without quota in the same run (the webhooks are called and decide nothing). Decision latency is request received to answer sent inside the webhooks (`kkp_quota_admission_duration_seconds` of both seeds' webhooks, interpolated within buckets); a request that waits for share counts its wait.\n"
    )?;
    writeln!(
        out,
        "| mode | creates decided/s | ratio | admitted per phase | create p50 | create p99 | decision p50 | decision p99 |"
    )?;
    writeln!(out, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")?;
    let base = median(
        phases
            .iter()
            .filter(|p| p.mode == Mode::NoQuota)
            .map(|p| rate(p.attempted, p.elapsed))
            .collect(),
    );
    for mode in [Mode::NoQuota, Mode::OneSeed, Mode::BothSeeds, Mode::Tight] {
        let of: Vec<&Phase> = phases.iter().filter(|p| p.mode == mode).collect();
        let r = median(of.iter().map(|p| rate(p.attempted, p.elapsed)).collect());
        let mut lat: Vec<Duration> = of.iter().flat_map(|p| p.latencies.iter().copied()).collect();
        lat.sort();
        let admitted: Vec<String> = of.iter().map(|p| p.admitted.to_string()).collect();
        let mut webhooks = Webhooks::default();
        for p in &of {
            webhooks.add(&p.webhooks);
        }
        let decision = |q: f64| format!("{:.2} ms", histogram_quantile(&webhooks.decision, q) * 1000.0);
        writeln!(
            out,
            "| {} | {r:.1} | {:.2} | {} | {} | {} | {} | {} |",
            mode.label(),
            r / base,
            admitted.join(", "),
            ms(percentile(&lat, 0.5)),
            ms(percentile(&lat, 0.99)),
            decision(0.5),
            decision(0.99),
        )?;
    }
    writeln!(
        out,
        "\nWhere the decisions' time goes, over every phase of the mode (both webhooks summed: `kkp_quota_reservation_wait_seconds{{path}}`, the reserver's part of a growing request's decision, from the allotment in memory or queued for a ledger write, share waits included; `kkp_quota_share_wait_seconds{{result}}`, the requests that waited for share to reach their seed; `kkp_quota_share_demands_total`, the demands written). Each cell is requests / p50 / p99.\n"
    )?;
    writeln!(
        out,
        "| mode | from the allotment | queued for a write | waited for share, admitted | waited for share, denied | demands written |"
    )?;
    writeln!(out, "| --- | ---: | ---: | ---: | ---: | ---: |")?;
    for mode in [Mode::OneSeed, Mode::BothSeeds, Mode::Tight] {
        let mut w = Webhooks::default();
        for p in phases.iter().filter(|p| p.mode == mode) {
            w.add(&p.webhooks);
        }
        writeln!(
            out,
            "| {} | {} | {} | {} | {} | {:.0} |",
            mode.label(),
            summary(&w.allotment),
            summary(&w.write),
            summary(&w.share_allowed),
            summary(&w.share_denied),
            w.demands,
        )?;
    }
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    writeln!(
        out,
        "\nWhere the CPU goes: every process shares the same {cores} cores, so creates/s follows what a create costs in all of them together. CPU ms per create (user + system time from `/proc/<pid>/stat`, over every phase of the mode, divided by its creates):\n"
    )?;
    writeln!(
        out,
        "| mode | all | {} | this program (the clients) |",
        CPU_GROUPS.join(" | ")
    )?;
    writeln!(out, "| --- | ---:{} |", " | ---:".repeat(CPU_GROUPS.len() + 1))?;
    let per_second = e2e::procfs::ticks_per_second();
    for mode in [Mode::NoQuota, Mode::OneSeed, Mode::BothSeeds, Mode::Tight] {
        let of: Vec<&Phase> = phases.iter().filter(|p| p.mode == mode).collect();
        let mut used = CpuTicks::default();
        for p in &of {
            used.add(&p.cpu);
        }
        let creates = of.iter().map(|p| p.attempted).sum::<usize>();
        writeln!(
            out,
            "| {} | {} |",
            mode.label(),
            used.per_create_row(per_second, creates)
        )?;
    }
    writeln!(
        out,
        "\nWrites per 100 creates each cluster's API server served besides the Machines (its `apiserver_request_total`, every write verb, over every phase of the mode; the write that ends a phase's last fold may land after it):\n"
    )?;
    writeln!(out, "| mode | {} |", WRITE_TARGETS.join(" | "))?;
    writeln!(out, "| --- |{}", " --- |".repeat(WRITE_TARGETS.len()))?;
    for mode in [Mode::NoQuota, Mode::OneSeed, Mode::BothSeeds, Mode::Tight] {
        let of: Vec<&Phase> = phases.iter().filter(|p| p.mode == mode).collect();
        #[allow(clippy::cast_precision_loss)]
        let creates = of.iter().map(|p| p.attempted).sum::<usize>() as f64;
        let cells: Vec<String> = (0..WRITE_TARGETS.len())
            .map(|t| {
                let mut w = Writes::default();
                for p in &of {
                    if let Some(more) = p.writes.get(t) {
                        w.add(more);
                    }
                }
                format!("**{:.1}**: {}", w.total_per_100(creates), w.per_100(creates))
            })
            .collect();
        writeln!(out, "| {} | {} |", mode.label(), cells.join(" | "))?;
    }
    writeln!(out, "\nPer phase:\n")?;
    writeln!(
        out,
        "| phase | mode | admitted | denied | seconds | creates/s | queued for a write | waited for share | demands written |"
    )?;
    writeln!(
        out,
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )?;
    for (i, p) in phases.iter().enumerate() {
        let count = |b: &Buckets| b.last().map_or(0, |b| b.1);
        writeln!(
            out,
            "| {i} | {} | {} | {} | {:.2} | {:.1} | {} | {} | {:.0} |",
            p.mode.label(),
            p.admitted,
            p.denied,
            p.elapsed.as_secs_f64(),
            rate(p.attempted, p.elapsed),
            count(&p.webhooks.write),
            count(&p.webhooks.share_allowed) + count(&p.webhooks.share_denied),
            p.webhooks.demands,
        )?;
    }
    writeln!(out, "\n## Share transfer\n")?;
    writeln!(
        out,
        "A quota of 1 cpu. {transfers} times, alternately on gamma (seed-b) and alpha (seed-a): one create on the seed that does not hold the share, which is held idle by the other (the master lowers the holder's target, the holder's seed-controller releases in its compare-and-swap write, the master grants, the webhook decides again), then, after deleting it, one create on the same seed, which now holds the share. Latency is the create call as the user sees it.\n"
    )?;
    writeln!(out, "| create | p50 | p99 | max |")?;
    writeln!(out, "| --- | ---: | ---: | ---: |")?;
    for (label, v) in [
        ("share moves from the other seed", &moved),
        ("share already held", &stayed),
    ] {
        writeln!(
            out,
            "| {label} | {} | {} | {} |",
            ms(percentile(v, 0.5)),
            ms(percentile(v, 0.99)),
            ms(v.last().copied().unwrap_or_default())
        )?;
    }
    writeln!(
        out,
        "\nDenied although the quota was free (the webhook judged the project full from a fold of the other seed's usage that had not caught up, or the share did not arrive within the wait): {} of {transfers} creates that needed a transfer, {} of {transfers} on the seed holding the share. They are left out of the latencies above.",
        denied.0, denied.1
    )?;
    let grants = count1 - count0;
    if grants > 0.0 {
        writeln!(
            out,
            "\nThe master's own view (`kkp_quota_share_grant_latency_seconds`, from first seeing a demand above the share to the persisted grant that covers it): {grants:.0} grants, mean {:.1} ms.",
            (sum1 - sum0) / grants * 1000.0
        )?;
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/results/shares.md");
    std::fs::create_dir_all(concat!(env!("CARGO_MANIFEST_DIR"), "/results"))?;
    std::fs::write(path, &out)?;
    print!("{out}");
    eprintln!("written to {path}");
    drop(setup);
    Ok(())
}
