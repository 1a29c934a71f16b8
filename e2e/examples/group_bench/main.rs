//! Benchmark (run by hand and by `make bench`, not a test): admission through a shared quota
//! group of 100 projects, against the same load with the projects' own quotas only (issue #36:
//! the group should cost less than 10 % of throughput).
//!
//! The whole system runs as real processes (master-controller, seed-controller and
//! machine-webhook, in the profile this example is built in) beside real API servers: a master,
//! one seed, and a few user-cluster API servers ("hosts"). A hundred user clusters, one per
//! project, do not fit on a 2-core machine as a hundred API servers, so each project's cluster is
//! *simulated*: a namespace `c<i>` on host `i mod hosts`, its KKP `Cluster` on the seed (label
//! `project-id`), whose admin kubeconfig's context namespace is `c<i>`; seed-controller runs with
//! `--machine-namespace-from-kubeconfig` (one Machine watch per simulated cluster, as in
//! seed-controller's scale benchmark). Each simulated cluster has its own
//! `ValidatingWebhookConfiguration` on its host (selecting its namespace, with the URL signed for
//! its cluster), written here the way seed-controller writes one per real user cluster; so
//! seed-controller runs without `--webhook-url`, and without the quota view (one per cluster,
//! cluster-scoped, would collide on a shared host).
//!
//! Two modes, phases interleaved: the projects' own quotas only, and the same with a `shared`
//! `QuotaGroup` over all of them, its limit far from what they use. In every phase each project
//! has one client creating Machines (1 cpu) one after another (one create per project at a time,
//! the load of the seed's measurement of 2.6 creates per namespace per second, here as fast as
//! the machine allows). Then a check, not timed: the group's limit lowered to what runs plus
//! half a Machine per project, and a burst of two creates per project, of which no more than the
//! headroom may be admitted.
//!
//! ```text
//! cargo run --release -p e2e --example group_bench [-- --projects 100 --hosts 2 --rounds 4 --creates 20]
//! ```
//!
//! Writes `e2e/results/groups.md`.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use clap::Parser;
use e2e::api_writes::Writes;
use e2e::bench::rate;
use e2e::machines::is_quota_denial;
use e2e::procfs::CpuTicks;
use e2e::system::{Credentials, System, Webhooks};
use e2e::{Fleet, FleetSpec, wait_for};
use futures::future::join_all;
use futures::{StreamExt as _, TryStreamExt as _, stream};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kkp_quota_crds::kkp::Project;
use kkp_quota_crds::{QuotaGroup, QuotaLedger};
use kkp_quota_runtime::webhook_auth::SigningKeys;
use kkp_quota_runtime::webhook_config;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

mod group;
mod made_tight;
mod report;
mod simulated;

use group::{group_off, group_on, in_force, overrun_state, wait_room};
use simulated::{Simulated, cluster_name, create_simulated, machine, project_name, register};

const SEED: &str = "seed-a";
const GROUP: &str = "bench-group";
/// The label that puts a project in [`GROUP`] (every bench project has it; the group's
/// existence is the switch between the modes).
const LABEL: &str = "kkp-quota.dev/bench-group";
/// Each project's own cpu limit: far from anything a run creates.
const OWN_CPU: i64 = 100_000;
const WAIT: Duration = Duration::from_mins(3);
const MANAGER: &str = "group-bench";

#[derive(Parser, Debug)]
struct Args {
    /// Projects in the group, each with one simulated user cluster and one client.
    #[arg(long, default_value_t = 100)]
    projects: usize,
    /// User-cluster API servers the simulated clusters are spread over.
    #[arg(long, default_value_t = 2)]
    hosts: usize,
    /// Rounds; each measures both modes once, in an order that changes every round.
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// Creates per project in a measured phase (after an unmeasured warm-up of a quarter of it).
    #[arg(long, default_value_t = 20)]
    creates: usize,
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/results/groups.md"))]
    out: std::path::PathBuf,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Projects,
    Group,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Projects => "the projects' own quotas only",
            Mode::Group => "the same, and a shared group over all of them",
        }
    }
}

/// The processes whose CPU time is measured, in the table's order (the clients, this program,
/// come last).
const CPU_GROUPS: [&str; 6] = [
    "hosts' API servers + etcds",
    "seed API server + etcd",
    "master API server + etcd",
    "master-controller",
    "seed-controller",
    "machine-webhook",
];

fn cpu_groups(fleet: &Fleet, system: &System, hosts: &[String]) -> Vec<Vec<u32>> {
    let kind = |k: &str| -> Vec<u32> { system.of_kind(k).map(e2e::system::Component::pid).collect() };
    vec![
        hosts.iter().flat_map(|h| fleet.user_cluster(h).pids()).collect(),
        fleet.seed(SEED).pids(),
        fleet.master().pids(),
        kind("master-controller"),
        kind("seed-controller"),
        kind("machine-webhook"),
    ]
}

/// What one phase measured.
struct Phase {
    mode: Mode,
    attempted: usize,
    admitted: usize,
    /// Quota denials; of them, those naming the group.
    denied: usize,
    denied_by_group: usize,
    /// Refused without a decision ("could not be updated in time; try again": the webhook's
    /// ledger write did not land within the API server's timeout): fail-closed, never an
    /// overrun, but what a user would have to retry.
    failed: usize,
    /// The first denial's message, as the user saw it.
    first_denial: Option<String>,
    elapsed: Duration,
    latencies: Vec<Duration>,
    webhook: Webhooks,
    cpu: CpuTicks,
    /// Writes the master's and the seed's API servers served during the phase.
    master_writes: Writes,
    seed_writes: Writes,
    /// Reads the master's API server served during the phase.
    master_reads: Writes,
}

/// A group created over the busy projects: from its write until every project's seed had room
/// for a phase again, and what the warm-up right after it met.
struct Transition {
    settled: Duration,
    warm_attempted: usize,
    warm_denied: usize,
    warm_failed: usize,
}

/// Everything [`measure`] measured.
struct Measured {
    phases: Vec<Phase>,
    transitions: Vec<Transition>,
    /// The group created tighter than its members' own quotas together ([`made_tight`]).
    made_tight: Transition,
    /// Where that window's time went.
    sweep: made_tight::Sweep,
    /// The check's phase, and the headroom it had.
    tight: Phase,
    headroom: usize,
}

/// One client per project, each creating `creates` Machines of 1 cpu one after another.
async fn phase(sim: &Simulated, mode: Mode, tag: &str, creates: usize) -> Result<Phase> {
    let start = Instant::now();
    let runs = (0..sim.clusters).map(|i| {
        let api = sim.machines(i);
        async move {
            let mut out = Vec::with_capacity(creates);
            for n in 0..creates {
                let began = Instant::now();
                let result = api
                    .create(&PostParams::default(), &machine(&format!("{tag}-{n}"), 1))
                    .await;
                out.push((i, began.elapsed(), result.map(|_| ())));
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
        denied_by_group: 0,
        failed: 0,
        first_denial: None,
        elapsed,
        latencies: Vec::with_capacity(results.len()),
        webhook: Webhooks::default(),
        cpu: CpuTicks::default(),
        master_writes: Writes::default(),
        seed_writes: Writes::default(),
        master_reads: Writes::default(),
    };
    for (i, latency, result) in results {
        phase.latencies.push(latency);
        match result {
            Ok(()) => phase.admitted += 1,
            Err(e) if is_quota_denial(&e, &project_name(i)) => {
                phase.denied += 1;
                if let kube::Error::Api(status) = &e {
                    phase.first_denial.get_or_insert_with(|| status.message.clone());
                }
                phase.denied_by_group += usize::from(e.to_string().contains(&format!("group {GROUP:?}")));
            }
            Err(kube::Error::Api(s)) if s.reason == "QuotaCheckFailed" => phase.failed += 1,
            Err(e) => bail!("{}: a create in {} failed: {e}", mode.label(), cluster_name(i)),
        }
    }
    phase.latencies.sort();
    Ok(phase)
}

/// The check: the group's limit lowered to what runs (`running`) plus a headroom of half a
/// Machine per project, in force once its record counts no more held than that; then two
/// creates per project at once. Fails on more admitted than the headroom; returns the phase and
/// the headroom.
async fn enforced(fleet: &Fleet, sim: &Simulated, projects: usize, running: usize) -> Result<(Phase, usize)> {
    let headroom = projects.div_ceil(2);
    let counted = sim.count().await?;
    ensure!(
        counted == running,
        "{counted} Machines exist where the benchmark counted {running} admitted"
    );
    let limit = i64::try_from(running + headroom)?;
    group_on(fleet, projects, limit, None).await?;
    wait_for(
        WAIT,
        "the lowered limit in force on every member's seed",
        || async { in_force(fleet, limit).await.ok()?.then_some(()) },
    )
    .await?;
    let tight = phase(sim, Mode::Group, "tight", 2).await?;
    eprintln!(
        "tight: {} of {} admitted, {} denied ({} naming the group), {} failed, headroom {headroom}",
        tight.admitted, tight.attempted, tight.denied, tight.denied_by_group, tight.failed
    );
    if let Some(message) = &tight.first_denial {
        eprintln!("tight: the first denial: {message}");
    }
    if tight.admitted > headroom {
        eprintln!("{}", overrun_state(fleet, sim, projects).await?);
        let group = Api::<QuotaGroup>::all(fleet.master().client()).get(GROUP).await?;
        bail!(
            "the group admitted {} over a headroom of {headroom} ({} Machines exist now); the group: {}",
            tight.admitted,
            sim.count().await?,
            serde_json::to_string(&group.status)?
        );
    }

    Ok((tight, headroom))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines)]
async fn main() -> Result<()> {
    let args = Args::parse();
    ensure!(
        args.projects > 0 && args.hosts > 0 && args.rounds > 0 && args.creates > 0,
        "every count must be at least 1"
    );
    kkp_quota_runtime::telemetry::init_tracing(false);
    let hosts: Vec<String> = (0..args.hosts).map(|i| format!("host-{i}")).collect();
    let mut spec = FleetSpec::empty().with_seed(SEED).with_project("hosts");
    for host in &hosts {
        spec = spec.with_user_cluster(host, SEED, "hosts");
    }
    for i in 0..args.projects {
        spec = spec.with_project(&project_name(i));
    }
    tokio::task::spawn_blocking(e2e::system::build_components)
        .await
        .context("building the components")??;
    let set_up = Instant::now();
    let fleet = Fleet::start(spec).await?;
    stream::iter(0..args.projects)
        .map(|i| create_simulated(&fleet, &hosts, i))
        .buffer_unordered(8)
        .try_collect::<Vec<()>>()
        .await?;
    let dir = tempfile::tempdir().context("a directory for the fleet's files")?;
    fleet.write_dir(dir.path())?;
    let credentials = Credentials::for_fleet(&fleet, dir.path(), false).await?;
    let mut system = System::start_as(
        &fleet,
        dir.path(),
        &[
            ("seed-controller", "--machine-namespace-from-kubeconfig"),
            ("seed-controller", "--quota-view=false"),
        ],
        &credentials,
    )
    .await?;
    let listen = system
        .of_kind("machine-webhook")
        .next()
        .and_then(|w| w.flag("--listen-address"))
        .context("the webhook's address")?
        .to_owned();
    // This benchmark writes the webhook configurations itself, one per simulated cluster.
    system
        .component_mut(&format!("seed-controller-{SEED}"))
        .context("no seed-controller")?
        .restart_without("--webhook-")?;
    system.wait_ready(WAIT).await?;
    let sim = Simulated {
        hosts: hosts.iter().map(|h| fleet.user_cluster(h).client()).collect(),
        clusters: args.projects,
    };
    for host in &sim.hosts {
        match Api::<ValidatingWebhookConfiguration>::all(host.clone())
            .delete(webhook_config::NAME, &DeleteParams::default())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e).context("removing seed-controller's configuration"),
        }
    }
    let keys = SigningKeys::load(&system.url_signing_keys)?;
    let ca = std::fs::read(&system.webhook_ca)?;
    let base = format!("https://{listen}");
    stream::iter(0..args.projects)
        .map(|i| register(&fleet, &sim, &base, &keys, &ca, i))
        .buffer_unordered(8)
        .try_collect::<Vec<()>>()
        .await?;

    // Every project: its label and its own quota, counted on the seed.
    let projects_api = Api::<Project>::all(fleet.master().client());
    stream::iter(0..args.projects)
        .map(|i| {
            let projects_api = projects_api.clone();
            let fleet = &fleet;
            async move {
                projects_api
                    .patch(
                        &project_name(i),
                        &PatchParams::default(),
                        &Patch::Merge(&json!({"metadata": {"labels": {LABEL: "yes"}}})),
                    )
                    .await?;
                let quota = e2e::demo::cpu_quota(&project_name(i), &OWN_CPU.to_string());
                e2e::demo::apply_quota(fleet, &quota, MANAGER).await
            }
        })
        .buffer_unordered(8)
        .try_collect::<Vec<()>>()
        .await?;
    let ledgers = Api::<QuotaLedger>::all(fleet.seed(SEED).client());
    wait_for(WAIT, "every project's ledger counted", || async {
        let list = ledgers.list(&ListParams::default()).await.ok()?;
        let counted = list
            .items
            .iter()
            .filter(|l| l.status.as_ref().is_some_and(|s| s.local_usage.is_some()))
            .count();
        (counted >= args.projects).then_some(())
    })
    .await?;
    // Enforced through every simulated cluster: a dry-run create admitted, one too big denied
    // by the project's quota (so the webhook is called with the right project).
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    for i in 0..args.projects {
        let api = sim.machines(i);
        wait_for(
            WAIT,
            &format!("a dry-run create in {} admitted", cluster_name(i)),
            || async { api.create(&dry, &machine("probe", 1)).await.ok().map(|_| ()) },
        )
        .await?;
        match api.create(&dry, &machine("too-big", OWN_CPU + 1)).await {
            Err(e) if is_quota_denial(&e, &project_name(i)) => {}
            other => bail!(
                "{}: a Machine over the quota was not denied: {other:?}",
                cluster_name(i)
            ),
        }
    }
    let set_up = set_up.elapsed();
    eprintln!("set up in {:.0} s", set_up.as_secs_f64());

    let measured = match measure(&args, &fleet, &system, &sim, &hosts).await {
        Ok(measured) => measured,
        Err(e) => {
            // The components' logs say why; the fleet's directory goes with the fleet.
            let kept = std::env::temp_dir().join(format!("group-bench-logs-{}", std::process::id()));
            std::fs::create_dir_all(&kept)?;
            for entry in std::fs::read_dir(dir.path().join("logs"))? {
                let entry = entry?;
                std::fs::copy(entry.path(), kept.join(entry.file_name()))?;
            }
            eprintln!("the components' logs are kept in {}", kept.display());
            return Err(e);
        }
    };
    let out = report::report(&args, &measured, set_up)?;
    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.out, &out)?;
    print!("{out}");
    eprintln!("written to {}", args.out.display());
    drop(system);
    drop(fleet);
    Ok(())
}

/// Both modes, rounds interleaved, then the group enforced: the phases, the check's phase and its
/// headroom.
async fn measure(
    args: &Args,
    fleet: &Fleet,
    system: &System,
    sim: &Simulated,
    hosts: &[String],
) -> Result<Measured> {
    let groups = cpu_groups(fleet, system, hosts);
    let far = OWN_CPU * i64::try_from(args.projects)?;
    let mut phases: Vec<Phase> = Vec::new();
    let mut transitions: Vec<Transition> = Vec::new();
    let mut running = 0usize;
    let modes = [Mode::Projects, Mode::Group];
    for round in 0..args.rounds {
        for mode in e2e::bench::round_order(&modes, round) {
            let began = Instant::now();
            let created = match mode {
                Mode::Projects => {
                    group_off(fleet).await?;
                    false
                }
                Mode::Group => group_on(fleet, args.projects, far, None).await?.created,
            };
            let warm = phase(
                sim,
                mode,
                &format!("w{round}-{}", phases.len()),
                args.creates.div_ceil(4),
            )
            .await?;
            running += warm.admitted;
            wait_room(fleet, args.projects, i64::try_from(args.creates)?).await?;
            if created {
                transitions.push(Transition {
                    settled: began.elapsed(),
                    warm_attempted: warm.attempted,
                    warm_denied: warm.denied,
                    warm_failed: warm.failed,
                });
            }
            let before = Webhooks::scrape(system).await?;
            let cpu_before = CpuTicks::now(&groups);
            let master_before = Writes::scrape(&fleet.master().client()).await?;
            let seed_before = Writes::scrape(&fleet.seed(SEED).client()).await?;
            let master_reads_before = Writes::scrape_reads(&fleet.master().client()).await?;
            let mut p = phase(sim, mode, &format!("r{round}-{}", phases.len()), args.creates).await?;
            p.cpu = CpuTicks::now(&groups).since(&cpu_before);
            p.master_writes = Writes::scrape(&fleet.master().client())
                .await?
                .since(&master_before);
            p.seed_writes = Writes::scrape(&fleet.seed(SEED).client())
                .await?
                .since(&seed_before);
            p.master_reads = Writes::scrape_reads(&fleet.master().client())
                .await?
                .since(&master_reads_before);
            p.webhook = Webhooks::scrape(system).await?.since(&before);
            running += p.admitted;
            eprintln!(
                "round {round}: {}: {} of {} admitted in {:.2} s ({:.1}/s)",
                mode.label(),
                p.admitted,
                p.attempted,
                p.elapsed.as_secs_f64(),
                rate(p.attempted, p.elapsed)
            );
            ensure!(
                p.denied == 0,
                "{}: {} creates denied far from every limit, the first: {}",
                mode.label(),
                p.denied,
                p.first_denial.as_deref().unwrap_or_default()
            );
            phases.push(p);
        }
    }

    // A group made tight over the busy projects leaves some of them using more than their
    // first budgets (what they admitted before its word reached them): the check right after
    // it is the harder one.
    let (made_tight, sweep, admitted) =
        made_tight::made_tight(fleet, system, sim, args.projects, running).await?;
    running += admitted;
    let (tight, headroom) = enforced(fleet, sim, args.projects, running).await?;

    Ok(Measured {
        phases,
        transitions,
        made_tight,
        sweep,
        tight,
        headroom,
    })
}
