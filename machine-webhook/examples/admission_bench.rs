//! Benchmark (run by hand, not a test): Machine create throughput through real API servers,
//! 16 concurrent clients over three user clusters of one project, in five modes measured in the
//! same run, phases interleaved:
//!
//! - no webhook at all;
//! - the webhook called, but the project has no quota (what any webhook costs here);
//! - the webhook enforcing, every admission waiting for its batch's ledger write (allotments off);
//! - the webhook enforcing with allotments (the default);
//! - the same, tight: the quota leaves room for 5% of the phase's creates, so every request is
//!   contested; exactly that many must be admitted (more fails the run).
//!
//! Also the decision latency, ledger writes, and the CPU each process group used per create.
//!
//! ```text
//! cargo run --release -p machine-webhook --example admission_bench [-- <creates per client> <rounds> <clients> <record after, ms>]
//! ```
//!
//! Writes `machine-webhook/results/admission.md` (or `admission-<clients>-clients.md`).
//! For profiling, `BENCH_ONLY=<part of a mode's label>` runs only the modes it names (a partial
//! run writes no results file) and `BENCH_FLEET_DIR=<dir>` writes the fleet's kubeconfigs
//! there, so that the API servers' `/debug/pprof` can be read while it runs.
//! `BENCH_PPROF_DIR=<dir>` profiles every user cluster's API server over the first
//! `BENCH_PPROF_SECONDS` (4) of every phase, into `<dir>/round<r>-<mode>-<cluster>.pprof`, and
//! appends to `<dir>/windows.tsv` how many creates ended in that window (round, mode, seconds,
//! creates), so profiles of different modes compare per create.
//! seed-controller is emulated: a loop that moves reservations into `localUsage` with
//! compare-and-swap writes, as seed-controller does when it counts Machines (so the ledger stays
//! short and the webhook meets real conflicts).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use e2e::bench::{Buckets, add, growth, histogram_quantile, percentile};
use e2e::certs::WebhookCerts;
use e2e::procfs::{CpuTicks, Scheduling};
use e2e::{Fleet, FleetSpec, wait_for};
use futures::future::join_all;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kkp_quota_crds::machine::Machine;
use kkp_quota_crds::quota::{PROJECT_KIND, SUBJECT_KIND_LABEL, SUBJECT_NAME_LABEL};
use kkp_quota_crds::{LedgerSubject, QuotaLedger, QuotaLedgerSpec, Resource, ResourceDetails};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use machine_webhook::metrics::Metrics;
use machine_webhook::reserve::AllotmentConfig;
use machine_webhook::{Config, Webhook};
use prometheus::core::Metric as _;
use serde_json::json;

const DEFAULT_CLIENTS: usize = 16;
const USERS: [&str; 3] = ["alpha", "beta", "delta"];
const PROJECT: &str = "demo";
const NS: &str = "kube-system";
const VWC: &str = kkp_quota_runtime::webhook_config::NAME;

/// The cpu of every bench Machine.
const MACHINE_CPU: i64 = 2;

/// A bench Machine: [`MACHINE_CPU`] cpu.
fn machine(name: &str) -> Result<Machine> {
    sized_machine(name, MACHINE_CPU)
}

/// A vSphere Machine of `cpus` cpu and 4 GiB.
fn sized_machine(name: &str, cpus: i64) -> Result<Machine> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "cluster.k8s.io/v1alpha1",
        "kind": "Machine",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"providerSpec": {"value": {
            "cloudProvider": "vsphere",
            "cloudProviderSpec": {"templateVMName": "ubuntu", "cpus": cpus, "memoryMB": 4096, "diskSizeGB": 20},
            "operatingSystem": "ubuntu"
        }}}
    }))?)
}

/// Points `cluster` at the webhook at `base`, with the URL token seed-controller would write.
async fn register(
    seed: &Client,
    user: &Client,
    cluster: &str,
    instance: &Instance,
    certs: &WebhookCerts,
) -> Result<()> {
    let uid = Api::<kkp_quota_crds::kkp::Cluster>::all(seed.clone())
        .get(cluster)
        .await?
        .metadata
        .uid
        .context("Cluster without UID")?;
    let url = kkp_quota_runtime::webhook_auth::webhook_url(
        &instance.base,
        cluster,
        &instance.keys.sign(cluster, &uid),
    );
    // The configuration seed-controller writes, exactly (`kkp_quota_runtime::webhook_config`).
    let config = kkp_quota_runtime::webhook_config::desired(
        &url,
        Some(&certs.ca_bundle().0),
        kkp_quota_runtime::webhook_config::Operations::CreateAndUpdate,
    );
    Api::<ValidatingWebhookConfiguration>::all(user.clone())
        .patch(VWC, &PatchParams::apply("bench").force(), &Patch::Apply(&config))
        .await?;
    Ok(())
}

/// Emulated seed-controller: every 100 ms counts the reserved Machines into localUsage and drops
/// their reservations, in one compare-and-swap write, re-reading and retrying at once on a
/// conflict (the webhook writes back to back under load; waiting would starve this writer).
async fn drain_ledger(seed: Client) {
    let api: Api<QuotaLedger> = Api::all(seed);
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        for _ in 0..20 {
            let Ok(quota) = api.get("project-demo").await else {
                break;
            };
            let status = quota.status.clone().unwrap_or_default();
            if status.reservations.is_empty() {
                break;
            }
            let Ok(reserved) = kkp_quota_crds::ledger::reserved_total(&status.reservations) else {
                break;
            };
            let Ok(local) = status.local_usage.unwrap_or_default().checked_add(&reserved) else {
                break;
            };
            let patch = json!({
                "metadata": {"resourceVersion": quota.metadata.resource_version},
                "status": {"localUsage": local, "reservations": null},
            });
            match api
                .patch_status("project-demo", &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                _ => break,
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    NoWebhook,
    NoQuota,
    EveryAdmissionWritten,
    Allotments,
    Tight,
}

impl Mode {
    const ALL: [Mode; 5] = [
        Mode::NoWebhook,
        Mode::NoQuota,
        Mode::EveryAdmissionWritten,
        Mode::Allotments,
        Mode::Tight,
    ];

    fn label(self) -> &'static str {
        match self {
            Mode::NoWebhook => "no webhook",
            Mode::NoQuota => "webhook, project without quota",
            Mode::EveryAdmissionWritten => "webhook enforcing, allotments off",
            Mode::Allotments => "webhook enforcing, allotments on",
            Mode::Tight => "webhook enforcing, allotments on, tight (room for 5% of the creates)",
        }
    }

    /// For file names.
    fn short(self) -> &'static str {
        match self {
            Mode::NoWebhook => "no-webhook",
            Mode::NoQuota => "no-quota",
            Mode::EveryAdmissionWritten => "written",
            Mode::Allotments => "allotments",
            Mode::Tight => "tight",
        }
    }
}

/// CPU ms per create of one mode, by process group, and how busy all cores were meanwhile.
struct Cpu {
    apiservers: f64,
    etcds: f64,
    seed: f64,
    bench: f64,
    busy_percent: f64,
}

impl Cpu {
    fn total(&self) -> f64 {
        self.apiservers + self.etcds + self.seed + self.bench
    }
}

/// The user clusters' API servers and etcds, in a phase's [`CpuTicks`].
const USERS_CPU: usize = 0;
/// The seed's API server and etcd, in a phase's [`CpuTicks`].
const SEED_CPU: usize = 1;
/// The user clusters' etcds alone (part of [`USERS_CPU`]), in a phase's [`CpuTicks`].
const USER_ETCDS_CPU: usize = 2;

struct Phase {
    mode: Mode,
    creates: usize,
    failures: usize,
    admitted: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
    /// CPU ticks used during the phase, by the groups [`USERS_CPU`] and [`SEED_CPU`] and by
    /// this process.
    cpu: CpuTicks,
    writes: u64,
    /// How the scheduler treated the user clusters' API servers during the phase.
    sched: Scheduling,
    /// Requests both webhook instances answered during the phase: every create, or none for no
    /// webhook (a configuration change not yet in effect would show here).
    answers: u64,
}

/// Runs the clients; returns the failures, every create's latency and when each create ended.
async fn run_clients(
    users: &[Client],
    prefix: &str,
    clients: usize,
    per_client: usize,
) -> Result<(usize, Vec<Duration>, Vec<Instant>)> {
    let clients = (0..clients).map(|c| {
        let api: Api<Machine> = Api::namespaced(users[c % users.len()].clone(), NS);
        async move {
            let mut latencies = Vec::with_capacity(per_client);
            let mut ended = Vec::with_capacity(per_client);
            let mut failures = 0;
            for i in 0..per_client {
                let m = machine(&format!("{prefix}-{c}-{i}"))?;
                let t = Instant::now();
                if api.create(&PostParams::default(), &m).await.is_err() {
                    failures += 1;
                }
                latencies.push(t.elapsed());
                ended.push(Instant::now());
            }
            anyhow::Ok((latencies, ended, failures))
        }
    });
    let (mut all, mut all_ended) = (Vec::new(), Vec::new());
    let mut failures = 0;
    for result in join_all(clients).await {
        let (latencies, ended, failed) = result?;
        failures += failed;
        all.extend(latencies);
        all_ended.extend(ended);
    }
    Ok((failures, all, all_ended))
}

/// A histogram's cumulative buckets, `+Inf` (every observation) last.
fn buckets_of(histogram: &prometheus::proto::Histogram) -> Buckets {
    let mut buckets: Buckets = histogram
        .get_bucket()
        .iter()
        .map(|b| (b.upper_bound(), b.cumulative_count()))
        .collect();
    buckets.push((f64::INFINITY, histogram.get_sample_count()));
    buckets
}

/// The webhook's latency histograms at one moment: the whole decision, and the reserver's part
/// of it by path (from the allotment in memory, or queued for a ledger write).
#[derive(Clone, Default)]
struct Snapshot {
    decision: Buckets,
    allotment: Buckets,
    write: Buckets,
}

impl Snapshot {
    fn of(webhook: &Metrics) -> Snapshot {
        let path = |p: &str| {
            buckets_of(
                webhook
                    .reservation_wait
                    .with_label_values(&[p])
                    .metric()
                    .get_histogram(),
            )
        };
        Snapshot {
            decision: buckets_of(webhook.duration.metric().get_histogram()),
            allotment: path("allotment"),
            write: path("write"),
        }
    }

    /// What was observed since `before`.
    fn since(&self, before: &Snapshot) -> Snapshot {
        Snapshot {
            decision: growth(&before.decision, &self.decision),
            allotment: growth(&before.allotment, &self.allotment),
            write: growth(&before.write, &self.write),
        }
    }

    fn add(&mut self, more: &Snapshot) {
        add(&mut self.decision, &more.decision);
        add(&mut self.allotment, &more.allotment);
        add(&mut self.write, &more.write);
    }
}

/// What the webhook's histograms observed over every phase of `mode` (two modes share one
/// instance, so each phase's growth is summed rather than one difference over the run).
fn observed(histograms: &[(Mode, Snapshot)], mode: Mode) -> Snapshot {
    let mut sum = Snapshot::default();
    for (_, grown) in histograms.iter().filter(|(m, _)| *m == mode) {
        sum.add(grown);
    }
    sum
}

/// Per enforcing mode: how many growing requests took each reserver path, and its p50/p99
/// (the profile of the decision's tail: which requests wait, and for what).
fn write_paths(md: &mut String, histograms: &[(Mode, Snapshot)]) -> Result<()> {
    writeln!(
        md,
        "Where an enforced decision's time goes (`kkp_quota_reservation_wait_seconds{{path}}`: the part spent in the \
         reserver, admitted from the allotment in memory or queued for a batch's ledger write):\n"
    )?;
    writeln!(
        md,
        "| mode | from the allotment: requests / p50 / p99 | queued for a write: requests / p50 / p99 | whole decision p99 |"
    )?;
    writeln!(md, "| --- | ---: | ---: | ---: |")?;
    let ms = |b: &Buckets, q: f64| format!("{:.3} ms", histogram_quantile(b, q) * 1000.0);
    let count = |b: &Buckets| b.last().map_or(0, |(_, n)| *n);
    for mode in [Mode::EveryAdmissionWritten, Mode::Allotments, Mode::Tight] {
        let o = observed(histograms, mode);
        writeln!(
            md,
            "| {} | {} / {} / {} | {} / {} / {} | {} |",
            mode.label(),
            count(&o.allotment),
            ms(&o.allotment, 0.5),
            ms(&o.allotment, 0.99),
            count(&o.write),
            ms(&o.write, 0.5),
            ms(&o.write, 0.99),
            ms(&o.decision, 0.99),
        )?;
    }
    writeln!(md)?;
    Ok(())
}

/// A webhook instance served in-process.
struct Instance {
    base: String,
    metrics: Metrics,
    keys: kkp_quota_runtime::webhook_auth::SigningKeys,
}

async fn start_instance(
    seed: &Client,
    certs: &WebhookCerts,
    dir: &std::path::Path,
    allotments: Option<AllotmentConfig>,
) -> Result<Instance> {
    let paths = certs.write_to(dir)?;
    let mut config = Config::new("127.0.0.1:0".parse()?, paths.cert, paths.key);
    config.allotments = allotments;
    let key_file = dir.join("url-signing-keys");
    std::fs::write(&key_file, kkp_quota_runtime::webhook_auth::generate_key())?;
    let keys = kkp_quota_runtime::webhook_auth::SigningKeys::load(&key_file)?;
    config.auth = Some(machine_webhook::AuthConfig::UrlSigningKeys(key_file));
    let webhook = Webhook::start(config, seed.clone()).await?;
    let base = format!("https://{}", webhook.address);
    let metrics = webhook.metrics.clone();
    let readiness = webhook.readiness.clone();
    tokio::spawn(webhook.run());
    wait_for(Duration::from_secs(30), "the webhook to be ready", || {
        let ready = readiness.is_ready();
        async move { ready }
    })
    .await?;
    Ok(Instance { base, metrics, keys })
}

fn admissions(metrics: &Metrics, result: &str, reason: &str) -> u64 {
    metrics.admissions.with_label_values(&[result, reason]).get()
}

/// Waits until every user cluster's API server sends Machine creates where `mode` wants them:
/// nowhere (an unsizeable dry-run Machine is admitted), or to `instance`, which answers a probe
/// with `result`/`reason` (its own counter moves, so the other instance's configuration is gone).
async fn wait_switched(users: &[Client], mode: Mode, instance: Option<&Instance>) -> Result<()> {
    for user in users {
        let api: Api<Machine> = Api::namespaced(user.clone(), NS);
        wait_for(
            Duration::from_mins(1),
            "the webhook configuration to take effect",
            || {
                let api = api.clone();
                async move {
                    let mut probe = machine("probe")?;
                    let (result, reason) = if mode == Mode::NoQuota {
                        ("allowed", "no_quota")
                    } else {
                        probe.spec.provider_spec.value =
                            Some(json!({"cloudProvider": "vsphere", "cloudProviderSpec": {}}));
                        ("denied", "unsizeable")
                    };
                    let before = instance.map(|i| admissions(&i.metrics, result, reason));
                    let answer = api
                        .create(
                            &PostParams {
                                dry_run: true,
                                ..PostParams::default()
                            },
                            &probe,
                        )
                        .await;
                    anyhow::Ok(match (instance, before) {
                        (Some(i), Some(before)) => admissions(&i.metrics, result, reason) > before,
                        _ => answer.is_ok(),
                    })
                }
            },
        )
        .await?;
    }
    Ok(())
}

/// Labels the quota copy as the project's (or parks it under another name, so the project has
/// no quota as far as the webhook knows).
async fn label_quota(seed: &Client, project: &str) -> Result<()> {
    Api::<QuotaLedger>::all(seed.clone())
        .patch(
            "project-demo",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {SUBJECT_NAME_LABEL: project}}})),
        )
        .await?;
    Ok(())
}

/// The quota far from the limit.
const LOOSE_CPU: i64 = 1_000_000;

/// Sets the quota's cpu limit.
async fn set_cpu_limit(seed: &Client, cpu: i64) -> Result<()> {
    Api::<QuotaLedger>::all(seed.clone())
        .patch(
            "project-demo",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"quota": {"cpu": cpu.to_string()}}})),
        )
        .await?;
    Ok(())
}

/// Waits until the ledger holds nothing but counted usage (no reservation, no allotment: the
/// emulated seed-controller drained the last phase, and the webhook gave its allotment back
/// after its idle time), and returns that usage's cpu.
async fn settled_cpu(seed: &Client) -> Result<i64> {
    let api: Api<QuotaLedger> = Api::all(seed.clone());
    let cpu = wait_for(Duration::from_mins(1), "the ledger settled", || {
        let api = api.clone();
        async move {
            let status = api.get("project-demo").await.ok()?.status.unwrap_or_default();
            if !status.reservations.is_empty() || !status.allotments.is_empty() {
                return None;
            }
            let cpu = status.local_usage.unwrap_or_default().amount(Resource::Cpu);
            i64::try_from(cpu.ceil_units()).ok()
        }
    })
    .await?;
    Ok(cpu)
}

/// Waits until the webhook judges against a limit with exactly `room` cpu left: a dry-run
/// Machine of `room` cpu is admitted (unless `room` is 0) and one a size above is refused (dry
/// runs take no room).
async fn wait_limit_seen(user: &Client, room: i64) -> Result<()> {
    let api: Api<Machine> = Api::namespaced(user.clone(), NS);
    wait_for(Duration::from_mins(1), "the webhook to see the new limit", || {
        let api = api.clone();
        async move {
            let dry = PostParams {
                dry_run: true,
                ..PostParams::default()
            };
            let fits = room == 0
                || api
                    .create(&dry, &sized_machine("limit-probe", room)?)
                    .await
                    .is_ok();
            let over = api
                .create(&dry, &sized_machine("limit-probe", room + 1)?)
                .await
                .is_err();
            anyhow::Ok(fits && over)
        }
    })
    .await?;
    Ok(())
}

/// `BENCH_PPROF_DIR`: CPU profiles of the user clusters' API servers over each phase's first
/// `BENCH_PPROF_SECONDS`, and how many creates ended in that window.
struct Profiles {
    dir: std::path::PathBuf,
    seconds: Duration,
}

impl Profiles {
    fn from_env() -> Result<Option<Profiles>> {
        let Ok(dir) = std::env::var("BENCH_PPROF_DIR") else {
            return Ok(None);
        };
        let seconds = std::env::var("BENCH_PPROF_SECONDS").map_or(Ok(4), |s| s.parse())?;
        std::fs::create_dir_all(&dir)?;
        Ok(Some(Profiles {
            dir: dir.into(),
            seconds: Duration::from_secs(seconds),
        }))
    }

    /// Profiles every user cluster's API server, from now on, into `round<r>-<mode>-<cluster>.pprof`.
    async fn profile(&self, users: &[Client], round: usize, mode: Mode) -> Result<()> {
        let profiles = users.iter().zip(USERS).map(|(user, name)| {
            let file = self
                .dir
                .join(format!("round{round}-{}-{name}.pprof", mode.short()));
            async move { e2e::pprof::cpu_profile(user, self.seconds, &file).await }
        });
        futures::future::try_join_all(profiles).await.map(drop)
    }

    /// Appends to `windows.tsv` how many of the phase's creates (`ended`: when each ended) ended
    /// within the profiled window from `started`.
    fn count_window(
        &self,
        round: usize,
        mode: Mode,
        started: Instant,
        elapsed: Duration,
        ended: &[Instant],
    ) -> Result<()> {
        anyhow::ensure!(
            elapsed >= self.seconds,
            "the phase ({elapsed:.1?}) was shorter than its profile ({:?}): more creates per client",
            self.seconds
        );
        let window = started..started + self.seconds;
        let in_window = ended.iter().filter(|t| window.contains(*t)).count();
        let mut index = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("windows.tsv"))?;
        std::io::Write::write_all(
            &mut index,
            format!(
                "{round}\t{}\t{}\t{in_window}\n",
                mode.short(),
                self.seconds.as_secs()
            )
            .as_bytes(),
        )?;
        Ok(())
    }
}

/// Creates per client of a phase's unmeasured warm-up: a quarter of its measured ones.
fn warm_up(per_client: usize) -> usize {
    per_client.div_ceil(4)
}

#[tokio::main(flavor = "multi_thread")]
#[allow(clippy::too_many_lines, clippy::cast_precision_loss)]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let per_client: usize = args.get(1).map_or(Ok(40), |a| a.parse())?;
    let rounds: usize = args.get(2).map_or(Ok(3), |a| a.parse())?;
    let clients: usize = args.get(3).map_or(Ok(DEFAULT_CLIENTS), |a| a.parse())?;
    let record_after = args
        .get(4)
        .map_or(Ok(AllotmentConfig::default().record_after), |a| {
            a.parse().map(Duration::from_millis)
        })?;
    let tick_hz = e2e::procfs::ticks_per_second();
    let mut spec = FleetSpec::empty().with_seed("seed-a").with_project(PROJECT);
    for user in USERS {
        spec = spec.with_user_cluster(user, "seed-a", PROJECT);
    }
    eprintln!("starting the fleet ...");
    let fleet = Fleet::start(spec).await?;
    let seed = fleet.seed("seed-a").client();
    let users: Vec<Client> = USERS.iter().map(|u| fleet.user_cluster(u).client()).collect();
    // CPU groups: the user clusters' API servers and etcds, the seed's, and the user clusters'
    // etcds alone ([USERS_CPU], [SEED_CPU], [USER_ETCDS_CPU]); this process (clients, webhooks,
    // emulated seed-controller) is counted apart.
    let cpu_groups = [
        USERS.iter().flat_map(|u| fleet.user_cluster(u).pids()).collect(),
        fleet.seed("seed-a").pids(),
        USERS.iter().map(|u| fleet.user_cluster(u).etcd_pid()).collect(),
    ];
    let user_apiservers: Vec<u32> = USERS
        .iter()
        .filter_map(|u| fleet.user_cluster(u).apiserver_pid())
        .collect();
    // For profiling: the fleet's kubeconfigs, e.g. for
    // `kubectl --kubeconfig <dir>/seed-a.kubeconfig get --raw '/debug/pprof/profile?seconds=15'`.
    if let Ok(dir) = std::env::var("BENCH_FLEET_DIR") {
        fleet.write_dir(std::path::Path::new(&dir))?;
    }
    let only = std::env::var("BENCH_ONLY").ok();
    let pprof = Profiles::from_env()?;

    // A quota that is never reached: the webhook still decides and reserves every Machine.
    let quotas: Api<QuotaLedger> = Api::all(seed.clone());
    let mut quota = QuotaLedger::new(
        "project-demo",
        QuotaLedgerSpec {
            rollout_allowance: None,
            subject: LedgerSubject::project(PROJECT),
            quota: serde_json::from_value::<ResourceDetails>(
                json!({"cpu": LOOSE_CPU.to_string(), "memory": "1Ei"}),
            )?,
            shares: None,
            reserved_counts: false,
        },
    );
    quota.metadata.labels = Some(
        [
            (SUBJECT_NAME_LABEL.to_owned(), PROJECT.to_owned()),
            (SUBJECT_KIND_LABEL.to_owned(), PROJECT_KIND.to_owned()),
        ]
        .into(),
    );
    quotas.create(&PostParams::default(), &quota).await?;
    quotas
        .patch_status(
            "project-demo",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"localUsage": {"cpu": "0"}}})),
        )
        .await?;

    let certs = WebhookCerts::generate()?;
    let (dir_a, dir_b) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let written = start_instance(&seed, &certs, dir_a.path(), None).await?;
    let allotted = start_instance(
        &seed,
        &certs,
        dir_b.path(),
        Some(AllotmentConfig {
            record_after,
            ..AllotmentConfig::default()
        }),
    )
    .await?;
    let drainer = tokio::spawn(drain_ledger(seed.clone()));

    let mut phases = Vec::new();
    let mut histograms: Vec<(Mode, Snapshot)> = Vec::new();
    for round in 0..rounds {
        for (m, mode) in e2e::bench::round_order(&Mode::ALL, round).enumerate() {
            if only.as_deref().is_some_and(|o| !mode.label().contains(o)) {
                continue;
            }
            let instance = match mode {
                Mode::NoWebhook => None,
                Mode::EveryAdmissionWritten => Some(&written),
                Mode::NoQuota | Mode::Allotments | Mode::Tight => Some(&allotted),
            };
            // Tight: room for 5% of the phase's creates over what is counted now.
            let room_machines = (clients * per_client).div_ceil(20);
            // The project's quota first: the webhook gives an allotment back only to the quota
            // it holds it for, and settling waits for that.
            label_quota(&seed, if mode == Mode::NoQuota { "parked" } else { PROJECT }).await?;
            let room = i64::try_from(room_machines)? * MACHINE_CPU;
            // Tight: no room at all during the warm-up, so it admits nothing.
            let tight = if mode == Mode::Tight {
                let used = settled_cpu(&seed).await?;
                set_cpu_limit(&seed, used).await?;
                Some(used)
            } else {
                None
            };
            for (user, name) in users.iter().zip(USERS) {
                match instance {
                    Some(i) => register(&seed, user, name, i, &certs).await?,
                    None => {
                        let _ = Api::<ValidatingWebhookConfiguration>::all(user.clone())
                            .delete(VWC, &DeleteParams::default())
                            .await;
                    }
                }
            }
            wait_switched(&users, mode, instance)
                .await
                .with_context(|| format!("switching to {}", mode.label()))?;
            if tight.is_some() {
                wait_limit_seen(&users[0], 0).await?;
            }
            // The warm-up: the same mode, unmeasured, so that the phase starts in the mode's
            // steady state. A phase can pay for its predecessor: profiles showed the API
            // servers' garbage collector making the first seconds of phases that always followed
            // a slower one assist it (0.08 ms per create). Against that, this and the changing
            // order together (with the warm-up alone, under the old order, assists remained).
            let phase = round * Mode::ALL.len() + m;
            run_clients(&users, &format!("warm-{phase}"), clients, warm_up(per_client)).await?;
            if let Some(used) = tight {
                set_cpu_limit(&seed, used + room).await?;
                wait_limit_seen(&users[0], room).await?;
            }
            let histogram_before = instance.map(|i| Snapshot::of(&i.metrics));
            let writes_before = instance.map_or(0, |i| i.metrics.writes.get());
            let answered = || written.metrics.answered(None) + allotted.metrics.answered(None);
            let answers_before = answered();
            let cpu_before = CpuTicks::now(&cpu_groups);
            let sched_before = Scheduling::now(&user_apiservers);
            let started = Instant::now();
            // Profiles (if asked for) over the phase's first seconds, alongside the clients.
            let profiling = async {
                match &pprof {
                    Some(p) => p.profile(&users, round, mode).await,
                    None => Ok(()),
                }
            };
            let clients_done = async {
                let result = run_clients(&users, &format!("bench-{phase}"), clients, per_client).await;
                (result, started.elapsed())
            };
            let (profiled, (result, elapsed)) = tokio::join!(profiling, clients_done);
            let (failures, latencies, ended) = result?;
            profiled?;
            if let Some(p) = &pprof {
                p.count_window(round, mode, started, elapsed, &ended)?;
            }
            let cpu = CpuTicks::now(&cpu_groups).since(&cpu_before);
            let sched = Scheduling::now(&user_apiservers).since(&sched_before);
            let admitted = latencies.len() - failures;
            if let Some(used) = tight {
                // The side condition: exactly the room, checked against the API servers' count
                // once the phase is drained (the ledger's usage grew by what was admitted).
                let counted = settled_cpu(&seed).await?;
                set_cpu_limit(&seed, LOOSE_CPU).await?;
                let admitted_cpu = i64::try_from(admitted)? * MACHINE_CPU;
                anyhow::ensure!(
                    counted - used == admitted_cpu,
                    "tight phase: {admitted} Machines created but the ledger counted {} cpu more",
                    counted - used
                );
                anyhow::ensure!(
                    admitted <= room_machines,
                    "tight phase: {admitted} admitted with room for {room_machines}: the quota was overrun"
                );
            }
            if let (Some(i), Some(before)) = (instance, histogram_before) {
                histograms.push((mode, Snapshot::of(&i.metrics).since(&before)));
            }
            let phase = Phase {
                mode,
                creates: latencies.len(),
                failures,
                admitted,
                elapsed,
                latencies,
                cpu,
                writes: instance.map_or(0, |i| i.metrics.writes.get()) - writes_before,
                sched,
                answers: answered() - answers_before,
            };
            eprintln!(
                "round {round} {}: {} creates in {:.2?} ({:.1}/s), {} failed",
                mode.label(),
                phase.creates,
                phase.elapsed,
                phase.creates as f64 / phase.elapsed.as_secs_f64(),
                phase.failures
            );
            phases.push(phase);
        }
    }

    let of = |mode: Mode| phases.iter().filter(move |p| p.mode == mode);
    // Creates of all of `mode`'s phases, at least 1 (a divisor).
    let creates_of = |mode: Mode| of(mode).map(|p| p.creates).sum::<usize>().max(1);
    let rate = |mode: Mode| {
        let (creates, secs) = of(mode).fold((0usize, 0f64), |(c, s), p| {
            (c + p.creates, s + p.elapsed.as_secs_f64())
        });
        creates as f64 / secs
    };
    if only.is_some() {
        eprintln!("partial run (BENCH_ONLY): no results file written");
        drainer.abort();
        return Ok(());
    }
    let base = rate(Mode::NoWebhook);
    // CPU ms per create of one mode, by group.
    let cpu_of = |mode: Mode| {
        let cpu = of(mode).fold(CpuTicks::default(), |mut sum, p| {
            sum.add(&p.cpu);
            sum
        });
        let ms = |ticks: u64| ticks as f64 / tick_hz * 1000.0 / creates_of(mode) as f64;
        Cpu {
            apiservers: ms(cpu.group(USERS_CPU) - cpu.group(USER_ETCDS_CPU)),
            etcds: ms(cpu.group(USER_ETCDS_CPU)),
            seed: ms(cpu.group(SEED_CPU)),
            bench: ms(cpu.this_process),
            busy_percent: cpu.machine_busy as f64 * 100.0 / cpu.machine_total.max(1) as f64,
        }
    };
    // Denials are the point of the tight phases; anywhere else a failed create is a failure.
    let failures: usize = phases
        .iter()
        .filter(|p| p.mode != Mode::Tight)
        .map(|p| p.failures)
        .sum();
    let tight_admitted: Vec<String> = of(Mode::Tight).map(|p| p.admitted.to_string()).collect();
    let room_machines = (clients * per_client).div_ceil(20);
    let warm = warm_up(per_client);

    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let mut md = String::new();
    writeln!(md, "# machine-webhook: admission throughput and latency\n")?;
    writeln!(
        md,
        "Measured by `cargo run --release -p machine-webhook --example admission_bench -- {per_client} {rounds} {clients} {}` \
         on a {cores}-core machine (this run's), with everything on it: one seed and {} user clusters (each a real etcd + \
         kube-apiserver, plus the fleet's master), the webhook in-process, and an emulated seed-controller draining \
         the ledger every 100 ms with compare-and-swap writes. {clients} concurrent clients, spread over the user \
         clusters, each creating {per_client} Machines one after another. Five modes, phases interleaved ({rounds} \
         rounds of each, same run, in an order that changes every round: each mode at another position, after another \
         mode; each phase after an unmeasured warm-up of {warm} creates per client in its mode, none admitted when \
         tight). Far from the limit the quota is never reached, so every enforced create is decided and reserved. Tight, the quota leaves room for {room_machines} Machines (5% of the phase's \
         creates) over what is counted when the phase starts, so every create is contested; admitted per tight \
         phase: {} (checked: never more than the room, and the ledger's count grew by exactly what the API servers \
         created). With allotments on, admissions from the allotment are recorded as reservations {} ms after the \
         first unrecorded one.\n",
        record_after.as_millis(),
        USERS.len(),
        tight_admitted.join(", "),
        record_after.as_millis(),
    )?;
    writeln!(
        md,
        "| mode | creates decided/s | ratio to no webhook | ratio to a webhook deciding nothing | create p50 | create p99 | decision p50 | decision p99 | ledger writes per 100 creates | CPU ms per create: user clusters' API servers / their etcds / seed / bench process | all cores busy |"
    )?;
    writeln!(
        md,
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )?;
    let mut ratios = Vec::new();
    for mode in Mode::ALL {
        let mut latencies: Vec<Duration> = of(mode).flat_map(|p| p.latencies.clone()).collect();
        latencies.sort();
        let creates = creates_of(mode);
        let writes: u64 = of(mode).map(|p| p.writes).sum();
        let cpu = cpu_of(mode);
        let grown = observed(&histograms, mode);
        let decision = |q: f64| {
            if grown.decision.is_empty() {
                "-".to_owned()
            } else {
                format!("{:.2} ms", histogram_quantile(&grown.decision, q) * 1000.0)
            }
        };
        let ratio = rate(mode) / base;
        ratios.push((mode, ratio));
        writeln!(
            md,
            "| {} | {:.1} | {:.2} | {} | {:.1?} | {:.1?} | {} | {} | {} | {:.2} / {:.2} / {:.2} / {:.2} | {:.0} % |",
            mode.label(),
            rate(mode),
            ratio,
            if mode == Mode::NoWebhook {
                "-".to_owned()
            } else {
                format!("{:.2}", rate(mode) / rate(Mode::NoQuota))
            },
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.99),
            decision(0.5),
            decision(0.99),
            if mode == Mode::NoWebhook || mode == Mode::NoQuota {
                "-".to_owned()
            } else {
                format!("{:.1}", writes as f64 * 100.0 / creates as f64)
            },
            cpu.apiservers,
            cpu.etcds,
            cpu.seed,
            cpu.bench,
            cpu.busy_percent,
        )?;
    }
    let ratio_of = |mode: Mode| ratios.iter().find(|(m, _)| *m == mode).map_or(0.0, |(_, r)| *r);
    // Each round's phase of `mode` against that round's webhook deciding nothing.
    let per_round = |mode: Mode| {
        let rates = |mode: Mode| -> Vec<f64> {
            of(mode)
                .map(|p| p.creates as f64 / p.elapsed.as_secs_f64())
                .collect()
        };
        e2e::bench::per_round_ratios(&rates(mode), &rates(Mode::NoQuota))
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    writeln!(
        md,
        "\n**Enforcing (allotments on, recorded after {} ms) / a webhook deciding nothing: {:.2} far from the limit \
         (target >= 0.97; per round {}), {:.2} tight (target >= 0.80; per round {}).** Against no webhook: {:.2} and \
         {:.2}; a webhook that decides nothing and writes nothing reaches {:.2} of no webhook here; allotments off, {:.2}.\n",
        record_after.as_millis(),
        rate(Mode::Allotments) / rate(Mode::NoQuota),
        per_round(Mode::Allotments),
        rate(Mode::Tight) / rate(Mode::NoQuota),
        per_round(Mode::Tight),
        ratio_of(Mode::Allotments),
        ratio_of(Mode::Tight),
        ratio_of(Mode::NoQuota),
        ratio_of(Mode::EveryAdmissionWritten),
    )?;
    writeln!(
        md,
        "Admitted from the allotment without waiting for a write: {} of the enforced creates with allotments on; \
         conflicts: {} (allotments off) and {} (on); failed creates: {failures}. Decision latency is request \
         received to answer sent inside the webhook (`kkp_quota_admission_duration_seconds`, interpolated within \
         buckets). CPU is user + system time of the user clusters' kube-apiservers and etcds, the seed's, and this \
         benchmark process (clients, both webhook instances, the emulated seed-controller), divided by the creates \
         of the mode.\n",
        allotted.metrics.allotment_admissions.get(),
        written.metrics.conflicts.get(),
        allotted.metrics.conflicts.get(),
    )?;
    write_paths(&mut md, &histograms)?;
    let (base, free, on) = (
        cpu_of(Mode::NoWebhook),
        cpu_of(Mode::NoQuota),
        cpu_of(Mode::Allotments),
    );
    // Per create: how often the user clusters' API servers' threads were preempted, and how
    // long they waited for a CPU (ms).
    let sched_of = |mode: Mode| {
        let sum = of(mode).fold(Scheduling::default(), |mut sum, p| {
            sum.add(&p.sched);
            sum
        });
        let per = creates_of(mode) as f64;
        (sum.preempted as f64 / per, sum.run_delay_ns as f64 / 1e6 / per)
    };
    writeln!(
        md,
        "Where the throughput goes: every process shares the same {cores} cores, so creates/s follows the CPU \
         each create costs in all processes together ({:.2} ms without a webhook). Calling a webhook that \
         decides nothing adds {:.2} ms (user clusters' API servers {:+.2}, their etcds {:+.2}, this process \
         {:+.2}, seed {:+.2}); that is the cost of any validating webhook here. Enforcing with allotments adds \
         {:.2} ms more over that (user clusters' API servers {:+.2}, their etcds {:+.2}; seed {:+.2}: the \
         ledger writes, the emulated seed-controller's reads and writes of the growing status, and the watch \
         events they cause; this process {:+.2}). With allotments off, each create also waits for its batch's \
         serial compare-and-swap write, which is why that mode is far slower than its CPU alone explains.\n",
        base.total(),
        free.total() - base.total(),
        free.apiservers - base.apiservers,
        free.etcds - base.etcds,
        free.bench - base.bench,
        free.seed - base.seed,
        on.total() - free.total(),
        on.apiservers - free.apiservers,
        on.etcds - free.etcds,
        on.seed - free.seed,
        on.bench - free.bench,
    )?;
    let sched = [Mode::NoWebhook, Mode::NoQuota, Mode::Allotments].map(sched_of);
    writeln!(
        md,
        "How the scheduler treated the user clusters' API servers (their threads' `nonvoluntary_ctxt_switches` \
         and `schedstat` run delay, per create; no webhook / a webhook deciding nothing / enforcing): preempted \
         {:.2} / {:.2} / {:.2} times, waited for a CPU {:.3} / {:.3} / {:.3} ms.\n",
        sched[0].0, sched[1].0, sched[2].0, sched[0].1, sched[1].1, sched[2].1,
    )?;
    writeln!(md, "Per phase:\n")?;
    writeln!(
        md,
        "| phase | mode | creates | webhook answers | admitted | seconds | creates/s | ledger writes |"
    )?;
    writeln!(md, "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")?;
    for (i, p) in phases.iter().enumerate() {
        writeln!(
            md,
            "| {i} | {} | {} | {} | {} | {:.2} | {:.1} | {} |",
            p.mode.label(),
            p.creates,
            p.answers,
            p.admitted,
            p.elapsed.as_secs_f64(),
            p.creates as f64 / p.elapsed.as_secs_f64(),
            p.writes
        )?;
    }
    let file = match (clients, record_after == AllotmentConfig::default().record_after) {
        (DEFAULT_CLIENTS, true) => "admission.md".to_owned(),
        (_, true) => format!("admission-{clients}-clients.md"),
        (_, false) => format!(
            "admission-{clients}-clients-record-{}ms.md",
            record_after.as_millis()
        ),
    };
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("results")
        .join(file);
    std::fs::create_dir_all(out.parent().context("results dir")?)?;
    std::fs::write(&out, &md)?;
    print!("{md}");
    drainer.abort();
    Ok(())
}
