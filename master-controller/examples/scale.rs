//! master-controller at KKP scale: many projects with quotas over several seeds, each a real
//! kube-apiserver + etcd, the controller as its own process (so its memory is its own).
//!
//! Measured, and written to `master-controller/results/scale.md`:
//! - cold start (every quota on the master, no seed copy yet) until every seed has both copies
//!   of every quota and every master quota has its `globalUsage`;
//! - the controller's resident memory then, and after the latency runs;
//! - one quota edit on the master → the new limit in every seed's ledger (p50/p99);
//! - one seed's `localUsage` change → the master's `globalUsage` (p50/p99);
//! - where the machine's CPU went during the cold start (each group of processes, and idle).
//!
//! No seed-controllers run: the benchmark writes `localUsage` itself, as they would. The
//! controller serves the allocation webhook, as the chart installs it, unless
//! `--no-allocation-webhook`.
//!
//! ```sh
//! cargo build --release -p master-controller && \
//!     cargo run --release -p master-controller --example scale -- --projects 10000 --seeds 3
//! ```

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use clap::Parser;
use common::{cpu_mem, create_quota, set_local_usage, set_quota};
use e2e::bench::{mib, ms, percentile};
use e2e::components::{ComponentSpec, spawn};
use e2e::procfs::CpuTicks;
use e2e::wait::wait_for;
use e2e::{Fleet, FleetSpec};
use futures::{StreamExt, stream};
use kkp_quota_crds::kkp::{Project, ProjectSpec};
use kkp_quota_crds::{Quantity, QuotaLedger, Resource, ResourceQuota};
use kube::api::{ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

#[derive(Parser, Debug)]
struct Args {
    #[arg(long, default_value_t = 10_000)]
    projects: usize,
    #[arg(long, default_value_t = 3)]
    seeds: usize,
    /// Edits (and usage changes) timed, one at a time.
    #[arg(long, default_value_t = 50)]
    samples: usize,
    #[arg(long, default_value = "master-controller/results/scale.md")]
    out: PathBuf,
    /// Runs the controller under heaptrack (a heap profiler; Debian's `heaptrack`), its profile
    /// written to this file (`heaptrack_print FILE.zst` reads it). A profiling run, not a
    /// measurement: heaptrack slows every allocation.
    #[arg(long)]
    heaptrack: Option<PathBuf>,
    /// Also takes a CPU profile of the master's and the first seed's kube-apiserver over the
    /// cold start's first `--pprof-seconds`, written into this directory as `master.pprof` and
    /// `<seed>.pprof` (`go tool pprof -top FILE` reads them). A profiling run: sampling costs the
    /// API servers a little CPU.
    #[arg(long)]
    pprof: Option<PathBuf>,
    #[arg(long, default_value_t = 30)]
    pprof_seconds: u64,
    /// A flag passed on to the controller (repeatable), e.g. `--controller-flag=--resync-period=5s`
    /// to have its periodic resync fall inside the timed edits.
    #[arg(long = "controller-flag", allow_hyphen_values = true)]
    controller_flags: Vec<String>,
    /// Runs the controller without the allocation webhook. By default it serves it, as the chart
    /// installs it (every replica keeps the webhook's caches of quotas, projects and groups; no
    /// request is sent to it here).
    #[arg(long)]
    no_allocation_webhook: bool,
}

const CONVERGE_WITHIN: Duration = Duration::from_mins(20);
const SAMPLE_WITHIN: Duration = Duration::from_secs(30);

fn quota_name(i: usize) -> String {
    format!("project-p{i}")
}

/// Counts the objects of `api` for which `done` holds (one list, from the API server's cache).
async fn count<K>(api: &Api<K>, done: impl Fn(&K) -> bool) -> Result<usize>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let list = api.list(&ListParams::default().match_any()).await?;
    Ok(list.items.iter().filter(|o| done(o)).count())
}

/// How many objects `api` has (names only, from the API server's cache).
async fn count_names<K>(api: &Api<K>) -> Result<usize>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(api
        .list_metadata(&ListParams::default().match_any())
        .await?
        .items
        .len())
}

/// A watch of one object, established (its first event, the object as it is, seen).
struct Watch<K>(futures::stream::BoxStream<'static, Result<K, watcher::Error>>);

impl<K> Watch<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    async fn start(api: Api<K>, name: &str) -> Result<Watch<K>> {
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut events = watcher::watcher(api, config).applied_objects().boxed();
        events.next().await.context("watch ended")??;
        Ok(Watch(events))
    }

    /// When the object was first seen satisfying `done`.
    async fn until(mut self, done: impl Fn(&K) -> bool) -> Result<Instant> {
        tokio::time::timeout(SAMPLE_WITHIN, async {
            while let Some(object) = self.0.next().await {
                if done(&object?) {
                    return Ok(Instant::now());
                }
            }
            anyhow::bail!("watch ended")
        })
        .await
        .with_context(|| format!("no change seen within {SAMPLE_WITHIN:?}"))?
    }
}

/// `started` until every quota is on every seed (both copies, the master's limits) and has its
/// `globalUsage` on the master; prints progress.
async fn converge(fleet: &Fleet, seeds: &[String], projects: usize, started: Instant) -> Result<Duration> {
    let master: Api<ResourceQuota> = Api::all(fleet.master().client());
    loop {
        let mut pending = Vec::new();
        let folded = count(&master, |rq| {
            rq.status.as_ref().and_then(|s| s.global_usage.as_ref()).is_some()
        })
        .await?;
        if folded < projects {
            pending.push(format!("master {folded}"));
        }
        for seed in seeds {
            // Metadata only: a copy is created with its spec (server-side apply), and full lists
            // of every copy each second would load the API servers being measured.
            let client = fleet.seed(seed).client();
            let ledgers = count_names(&Api::<QuotaLedger>::all(client.clone())).await?;
            let copies = count_names(&Api::<ResourceQuota>::all(client)).await?;
            if ledgers < projects || copies < projects {
                pending.push(format!("{seed} {ledgers}/{copies}"));
            }
        }
        if pending.is_empty() {
            return Ok(started.elapsed());
        }
        ensure!(started.elapsed() < CONVERGE_WITHIN, "no convergence: {pending:?}");
        eprintln!(
            "{:>6.1} s: {}",
            started.elapsed().as_secs_f64(),
            pending.join(", ")
        );
        // The master's list is full objects (for the status): look less often the more there are.
        let pause = Duration::from_millis(u64::try_from(projects).unwrap_or(u64::MAX).max(1000));
        tokio::time::sleep(pause.min(Duration::from_secs(5))).await;
    }
}

/// A series of the controller's by (target, operation), every seed's summed as "all seeds":
/// `kkp_quota_master_writes_total` for its writes, `..._write_duration_seconds_sum` and
/// `_count` for their time.
fn by_write_kind(metrics: &str, series: &str) -> BTreeMap<(String, String), f64> {
    let mut by_kind = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix(series).and_then(|r| r.strip_prefix('{')) else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels.split(',').find_map(|l| {
                let value = l.strip_prefix(name)?.strip_prefix("=\"")?;
                Some(value.trim_end_matches('"').to_owned())
            })
        };
        let (Some(target), Some(operation), Ok(value)) =
            (label("target"), label("operation"), value.trim().parse::<f64>())
        else {
            continue;
        };
        let target = if target == "master" {
            target
        } else {
            "all seeds".to_owned()
        };
        *by_kind.entry((target, operation)).or_default() += value;
    }
    by_kind
}

/// The controller's reconciles of quotas: (how many, seconds in all), from its histogram.
fn reconciles(metrics: &str) -> (f64, f64) {
    let value = |series: &str| {
        e2e::system::sample(metrics, &format!("{series}{{controller=\"quota\"}}")).unwrap_or(0.0)
    };
    (
        value("kkp_quota_reconcile_duration_seconds_count"),
        value("kkp_quota_reconcile_duration_seconds_sum"),
    )
}

/// The reconciles a window would have seen without its edits: the periodic resync runs a slice
/// of every quota all the time (`--resync-period`, one minute by default), so at 10,000 quotas
/// about 170 a second, which the edits' window would otherwise count as theirs.
#[derive(Clone, Copy)]
struct Background {
    /// Measured while idle, right after convergence.
    reconciles_per_second: f64,
    /// How long the window lasted.
    seconds: f64,
}

/// What the controller's histograms say of a window: `before` and `after` are scrapes.
struct WriteTimes {
    /// Per (target, operation): writes, seconds in all.
    writes: BTreeMap<(String, String), (f64, f64)>,
    /// Reconciles, seconds in all.
    reconciles: (f64, f64),
}

impl WriteTimes {
    fn between(before: &str, after: &str) -> WriteTimes {
        let diff = |series: &str| {
            let (b, a) = (by_write_kind(before, series), by_write_kind(after, series));
            a.into_iter()
                .map(|(k, v)| {
                    let was = b.get(&k).copied().unwrap_or(0.0);
                    (k, v - was)
                })
                .collect::<BTreeMap<_, _>>()
        };
        let counts = diff("kkp_quota_master_write_duration_seconds_count");
        let sums = diff("kkp_quota_master_write_duration_seconds_sum");
        let writes = counts
            .into_iter()
            .filter(|(_, n)| *n > 0.0)
            .map(|(k, n)| {
                let sum = sums.get(&k).copied().unwrap_or(0.0);
                (k, (n, sum))
            })
            .collect();
        let (b, a) = (reconciles(before), reconciles(after));
        WriteTimes {
            writes,
            reconciles: (a.0 - b.0, a.1 - b.1),
        }
    }
}

/// Where the edits' time went, from the controller's histograms.
fn write_edit_times(
    out: &mut String,
    times: &WriteTimes,
    background: Background,
    edits: usize,
    latencies: &[Duration],
) -> Result<()> {
    #[allow(clippy::cast_precision_loss)]
    let (per_edit, mean_ms) = (
        |n: f64| n / edits.max(1) as f64,
        |n: f64, sum: f64| if n > 0.0 { sum * 1000.0 / n } else { 0.0 },
    );
    #[allow(clippy::cast_precision_loss)]
    let edit_mean =
        latencies.iter().map(Duration::as_secs_f64).sum::<f64>() * 1000.0 / latencies.len().max(1) as f64;
    writeln!(
        out,
        "\nWhere the edits' time went (the controller's `kkp_quota_master_write_duration_seconds` and `kkp_quota_reconcile_duration_seconds`, their growth over the {edits} edits; an edit's mean latency was {edit_mean:.1} ms):\n"
    )?;
    writeln!(out, "| | per edit | mean |\n| --- | ---: | ---: |")?;
    let (n, sum) = times.reconciles;
    let Background {
        reconciles_per_second: idle_rate,
        seconds,
    } = background;
    writeln!(
        out,
        "| reconciles (each: its reads, its decisions, its writes), all | {:.2} | {:.1} ms |",
        per_edit(n),
        mean_ms(n, sum)
    )?;
    writeln!(
        out,
        "| reconciles beyond the idle rate ({idle_rate:.1}/s, measured after the latency runs: the periodic resync, over the edits' {seconds:.1} s) | {:.2} | |",
        per_edit((n - idle_rate * seconds).max(0.0)),
    )?;
    for ((target, operation), (n, sum)) in &times.writes {
        writeln!(
            out,
            "| write: {target}, {operation} | {:.2} | {:.1} ms |",
            per_edit(*n),
            mean_ms(*n, *sum)
        )?;
    }
    Ok(())
}

/// The cold start's writes per quota, measured (the controller's own count).
fn write_writes(out: &mut String, writes: &BTreeMap<(String, String), f64>, projects: usize) -> Result<()> {
    #[allow(clippy::cast_precision_loss)]
    let per_quota = |n: f64| n / projects.max(1) as f64;
    let total: f64 = writes.values().sum();
    writeln!(
        out,
        "\nThe controller's writes during the cold start (its `kkp_quota_master_writes_total` at convergence): {total:.0} in all, {:.2} per quota. Per quota, by target and operation (every seed's writes summed):\n",
        per_quota(total)
    )?;
    writeln!(
        out,
        "| target | operation | writes per quota |\n| --- | --- | ---: |"
    )?;
    for ((target, operation), n) in writes {
        writeln!(out, "| {target} | {operation} | {:.2} |", per_quota(*n))?;
    }
    Ok(())
}

/// The groups of processes whose CPU the cold start is split into: the master's control
/// plane, the seeds', and the controller.
fn cpu_groups(fleet: &Fleet, seeds: &[String], controller: u32) -> [Vec<u32>; 3] {
    [
        fleet.master().pids(),
        seeds.iter().flat_map(|s| fleet.seed(s).pids()).collect(),
        vec![controller],
    ]
}

/// Where the machine's CPU went during `used`: each group's CPU seconds and its part of all the
/// cores' time.
#[allow(clippy::cast_precision_loss)]
fn write_cpu_split(out: &mut String, used: &CpuTicks) -> Result<()> {
    let per_second = e2e::procfs::ticks_per_second();
    let total = used.machine_total.max(1) as f64;
    let known = used.groups.iter().sum::<u64>() + used.this_process;
    writeln!(
        out,
        "\nWhere the machine's CPU went during the cold start ({} cores; CPU time of each group of processes from `/proc/<pid>/stat`, the machine's busy and idle time from `/proc/stat`):\n",
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get)
    )?;
    writeln!(
        out,
        "| | CPU seconds | part of all cores' time |\n| --- | ---: | ---: |"
    )?;
    let rows = [
        ("master kube-apiserver + etcd", used.group(0)),
        ("the seeds' kube-apiservers + etcds, together", used.group(1)),
        ("master-controller", used.group(2)),
        (
            "this program (its watches, the convergence check, the `localUsage` writes)",
            used.this_process,
        ),
        (
            "everything else on the machine",
            used.machine_busy.saturating_sub(known),
        ),
        ("idle", used.machine_total.saturating_sub(used.machine_busy)),
    ];
    for (what, ticks) in rows {
        writeln!(
            out,
            "| {what} | {:.1} | {:.0} % |",
            ticks as f64 / per_second,
            ticks as f64 / total * 100.0
        )?;
    }
    Ok(())
}

/// `component` run by heaptrack, its profile written to `file`.
fn heaptracked(component: ComponentSpec, file: &std::path::Path) -> ComponentSpec {
    let mut args = vec![
        "-o".to_owned(),
        file.display().to_string(),
        component.program.display().to_string(),
    ];
    args.extend(component.args);
    ComponentSpec {
        name: component.name,
        program: PathBuf::from("heaptrack"),
        args,
    }
}

/// The process heaptrack's script started (its child running the controller).
async fn traced_child(script: u32) -> Result<u32> {
    wait_for(SAMPLE_WITHIN, "heaptrack to start master-controller", || async {
        // Its command line, not its `comm` (which the kernel cuts at 15 bytes).
        e2e::procfs::children(script).into_iter().find(|c| {
            std::fs::read(format!("/proc/{c}/cmdline")).is_ok_and(|cmd| {
                cmd.split(|b| *b == 0)
                    .next()
                    .is_some_and(|p| p.ends_with(b"/master-controller"))
            })
        })
    })
    .await
}

/// SIGTERM to the traced controller, then waits for heaptrack's script to finish its profile.
async fn stop_traced(script: &mut e2e::components::RunningComponent, traced: u32) -> Result<()> {
    std::process::Command::new("kill")
        .args(["-TERM", &traced.to_string()])
        .status()?;
    let script = std::sync::Mutex::new(script);
    wait_for(Duration::from_mins(10), "heaptrack to finish its profile", || {
        let exited = script.lock().is_ok_and(|mut s| s.exit_status().is_some());
        async move { exited }
    })
    .await
}

/// Waits until the controller's writes have stopped: its `kkp_quota_master_writes_total` the
/// same over [`QUIET`]. After the last edit reached every seed, the statuses that follow it are
/// still being written; their timings belong to the edits.
async fn writes_settled(metrics_address: std::net::SocketAddr) -> Result<()> {
    let last = std::sync::Mutex::new((f64::NAN, Instant::now()));
    wait_for(SAMPLE_WITHIN, "the controller's writes to stop", || async {
        let text = e2e::system::scrape_metrics(metrics_address).await?;
        let total: f64 = by_write_kind(&text, "kkp_quota_master_writes_total")
            .values()
            .sum();
        let mut last = last.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
        #[allow(clippy::float_cmp)] // a counter: whole numbers, exact in an f64
        if total != last.0 {
            *last = (total, Instant::now());
        }
        ensure!(last.1.elapsed() >= QUIET, "{total} writes so far");
        Ok(())
    })
    .await
}

/// How long without a write counts as "the writes have stopped".
const QUIET: Duration = Duration::from_millis(300);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines)] // one measurement run, top to bottom
async fn main() -> Result<()> {
    let args = Args::parse();
    let seeds: Vec<String> = (0..args.seeds).map(|i| format!("seed-{i}")).collect();
    let spec = seeds.iter().fold(FleetSpec::empty(), |spec, s| spec.with_seed(s));
    let fleet = Fleet::start(spec).await?;
    let dir = tempfile::tempdir()?;
    fleet.write_dir(dir.path())?;

    // Every project and quota, before the controller starts.
    let creating = Instant::now();
    let master = fleet.master().client();
    stream::iter(0..args.projects)
        .map(|i| {
            let master = master.clone();
            async move {
                let project = format!("p{i}");
                Api::<Project>::all(master.clone())
                    .create(
                        &PostParams::default(),
                        &Project::new(
                            &project,
                            ProjectSpec {
                                name: project.clone(),
                            },
                        ),
                    )
                    .await?;
                create_quota(&Api::all(master), &quota_name(i), &project, cpu_mem(100, 100)).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<()>>>()?;
    eprintln!(
        "{} projects and quotas created in {:.1} s",
        args.projects,
        creating.elapsed().as_secs_f64()
    );

    // The controller, as its own process, built in the same profile as this program.
    let metrics_address = std::net::SocketAddr::from(([127, 0, 0, 1], e2e::system::free_port()?));
    let mut flags = vec![
        format!("--kubeconfig={}", dir.path().join("master.kubeconfig").display()),
        format!("--metrics-address={metrics_address}"),
        "--no-leader-election".to_owned(),
    ];
    if !args.no_allocation_webhook {
        let certs = e2e::certs::WebhookCerts::generate()?.write_to(&dir.path().join("webhook"))?;
        flags.extend([
            format!("--tls-cert-file={}", certs.cert.display()),
            format!("--tls-key-file={}", certs.key.display()),
            format!("--webhook-address=127.0.0.1:{}", e2e::system::free_port()?),
        ]);
    }
    flags.extend(args.controller_flags.iter().cloned());
    let component = ComponentSpec::workspace_bin("master-controller", flags)?;
    let component = match &args.heaptrack {
        Some(file) => heaptracked(component, file),
        None => component,
    };
    let started = Instant::now();
    let mut controller = spawn(&component, &dir.path().join("logs"))?;
    let pid = match args.heaptrack {
        Some(_) => traced_child(controller.pid()).await?,
        None => controller.pid(),
    };
    let groups = cpu_groups(&fleet, &seeds, pid);
    let cpu_before = CpuTicks::now(&groups);
    let profiles = args.pprof.as_ref().map(|dir| {
        let targets = [
            ("master".to_owned(), master.clone()),
            (seeds[0].clone(), fleet.seed(&seeds[0]).client()),
        ];
        let (dir, period) = (dir.clone(), Duration::from_secs(args.pprof_seconds));
        tokio::spawn(async move {
            std::fs::create_dir_all(&dir)?;
            futures::future::try_join_all(targets.iter().map(|(name, client)| {
                let file = dir.join(format!("{name}.pprof"));
                async move { e2e::pprof::cpu_profile(client, period, &file).await }
            }))
            .await
            .map(|_| ())
        })
    });
    let cold = converge(&fleet, &seeds, args.projects, started).await?;
    let cpu_cold_split = CpuTicks::now(&groups).since(&cpu_before);
    let cpu_cold = e2e::procfs::cpu_seconds(pid).unwrap_or(0.0);
    let cold_writes = by_write_kind(
        &e2e::system::scrape_metrics(metrics_address).await?,
        "kkp_quota_master_writes_total",
    );
    eprintln!("converged in {:.1} s", cold.as_secs_f64());
    if let Some(profiles) = profiles {
        profiles.await??;
        eprintln!("API server profiles written");
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let rss_idle = e2e::procfs::rss_bytes(pid).unwrap_or(0);

    // One quota edit → every seed's ledger, with the controller's own timing of its writes.
    let master_rqs: Api<ResourceQuota> = Api::all(master.clone());
    let before_edits = e2e::system::scrape_metrics(metrics_address).await?;
    let edits_began = Instant::now();
    let mut edits = Vec::new();
    for i in 0..args.samples {
        let name = quota_name((i * 7919) % args.projects);
        let cpu = 1000 + i64::try_from(i)?;
        let mut watches = Vec::new();
        for seed in &seeds {
            watches.push(Watch::start(Api::<QuotaLedger>::all(fleet.seed(seed).client()), &name).await?);
        }
        let began = Instant::now();
        set_quota(&master_rqs, &name, &cpu_mem(cpu, 100)).await?;
        let seen = futures::future::try_join_all(watches.into_iter().map(|w| {
            w.until(move |l: &QuotaLedger| l.spec.quota.amount(Resource::Cpu) == Quantity::from_units(cpu))
        }))
        .await?;
        edits.push(seen.into_iter().max().unwrap_or(began) - began);
    }
    writes_settled(metrics_address).await?;
    let edit_times = WriteTimes::between(
        &before_edits,
        &e2e::system::scrape_metrics(metrics_address).await?,
    );
    let edits_lasted = edits_began.elapsed().as_secs_f64();

    // One seed's usage → the master's globalUsage.
    let mut folds = Vec::new();
    for i in 0..args.samples {
        let name = quota_name((i * 7919) % args.projects);
        let writer = &seeds[i % seeds.len()];
        let used = 1 + i64::try_from(i)?;
        let seed_client: Client = fleet.seed(writer).client();
        let watch = Watch::start(master_rqs.clone(), &name).await?;
        let began = Instant::now();
        set_local_usage(&seed_client, &name, &cpu_mem(used, 1)).await?;
        let seen = watch
            .until(move |rq: &ResourceQuota| {
                rq.status
                    .as_ref()
                    .and_then(|s| s.global_usage.as_ref())
                    .is_some_and(|g| g.amount(Resource::Cpu) == Quantity::from_units(used))
            })
            .await?;
        folds.push(seen - began);
        set_local_usage(&seed_client, &name, &cpu_mem(0, 0)).await?;
    }
    // The idle reconciles (the periodic resync, spread over its period, which begins one period
    // after the start) over 10 s after the latency runs, so that the edits' own can be told.
    let idle_before = reconciles(&e2e::system::scrape_metrics(metrics_address).await?).0;
    let idle_began = Instant::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let background = Background {
        reconciles_per_second: (reconciles(&e2e::system::scrape_metrics(metrics_address).await?).0
            - idle_before)
            / idle_began.elapsed().as_secs_f64(),
        seconds: edits_lasted,
    };
    let rss_end = e2e::procfs::rss_bytes(pid).unwrap_or(0);
    let peak = e2e::procfs::peak_rss_bytes(pid).unwrap_or(0);
    if args.heaptrack.is_some() {
        // heaptrack writes its profile once the traced process ends.
        stop_traced(&mut controller, pid).await?;
    }
    drop(controller);
    edits.sort();
    folds.sort();

    let mut out = String::new();
    writeln!(out, "# master-controller at scale\n")?;
    writeln!(
        out,
        "Measured by `cargo run --release -p master-controller --example scale -- --projects {} --seeds {} --samples {}{}{}` on {} (shared), {}. The master and {} seeds are each a real kube-apiserver + etcd on loopback; the controller (release build) runs as its own process, {}; no seed-controllers run (the benchmark writes `localUsage` as they would).\n",
        args.projects,
        args.seeds,
        args.samples,
        if args.no_allocation_webhook {
            " --no-allocation-webhook"
        } else {
            ""
        },
        args.controller_flags
            .iter()
            .map(|f| format!(" --controller-flag={f}"))
            .collect::<Vec<_>>()
            .concat(),
        e2e::bench::host(),
        jiff::Timestamp::now().strftime("%Y-%m-%d %H:%M UTC"),
        args.seeds,
        if args.no_allocation_webhook {
            "without the allocation webhook"
        } else {
            "serving the allocation webhook as the chart installs it (its caches included; no request is sent to it)"
        },
    )?;
    writeln!(out, "| figure | value | target |\n| --- | ---: | --- |")?;
    writeln!(
        out,
        "| cold start → every seed has both copies of every quota, every master quota its `globalUsage` | {:.1} s | < 30 s |",
        cold.as_secs_f64()
    )?;
    writeln!(
        out,
        "| CPU time of the controller until then | {cpu_cold:.1} s | |"
    )?;
    writeln!(
        out,
        "| resident memory 10 s after convergence | {:.1} MiB | < 256 MiB |",
        mib(rss_idle)
    )?;
    writeln!(
        out,
        "| resident memory after the latency runs / peak | {:.1} / {:.1} MiB | |",
        mib(rss_end),
        mib(peak)
    )?;
    writeln!(
        out,
        "| one quota edit → the new limit in every seed's ledger, p50 / p99 ({} edits) | {} / {} | p99 < 100 ms |",
        edits.len(),
        ms(percentile(&edits, 0.5)),
        ms(percentile(&edits, 0.99))
    )?;
    writeln!(
        out,
        "| one seed's `localUsage` change → the master's `globalUsage`, p50 / p99 ({} changes) | {} / {} | |",
        folds.len(),
        ms(percentile(&folds, 0.5)),
        ms(percentile(&folds, 0.99))
    )?;
    write_edit_times(&mut out, &edit_times, background, edits.len(), &edits)?;
    write_writes(&mut out, &cold_writes, args.projects)?;
    write_cpu_split(&mut out, &cpu_cold_split)?;
    std::fs::write(&args.out, &out).with_context(|| format!("writing {}", args.out.display()))?;
    print!("{out}");
    eprintln!("written to {}", args.out.display());
    Ok(())
}
