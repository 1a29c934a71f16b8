//! Benchmark (run by hand, not a test): Machine create throughput through real API servers with
//! the webhook enforcing a quota versus no webhook at all, in the same run, 16 concurrent clients
//! over three user clusters of one project; and the webhook's decision latency.
//!
//! ```text
//! cargo run -p machine-webhook --example admission_bench [-- <creates per client> <rounds>]
//! ```
//!
//! Writes `machine-webhook/results/admission.md`. seed-controller is emulated: a loop that moves
//! reservations into `localUsage` with compare-and-swap writes, as seed-controller does when it
//! counts Machines (so the ledger stays short and the webhook meets real conflicts).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use e2e::certs::WebhookCerts;
use e2e::{Fleet, FleetSpec, wait_for};
use futures::future::join_all;
use k8s_openapi::api::admissionregistration::v1::{
    RuleWithOperations, ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use kkp_quota_crds::machine::Machine;
use kkp_quota_crds::quota::{PROJECT_KIND, SUBJECT_KIND_LABEL, SUBJECT_NAME_LABEL};
use kkp_quota_crds::{ResourceDetails, ResourceQuota, ResourceQuotaSpec, Subject};
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use machine_webhook::{Config, Webhook};
use prometheus::core::Metric as _;
use serde_json::json;

const DEFAULT_CLIENTS: usize = 16;
const USERS: [&str; 3] = ["alpha", "beta", "delta"];
const PROJECT: &str = "demo";
const NS: &str = "kube-system";
const VWC: &str = "kkp-quota-machines";

fn machine(name: &str) -> Result<Machine> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "cluster.k8s.io/v1alpha1",
        "kind": "Machine",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"providerSpec": {"value": {
            "cloudProvider": "vsphere",
            "cloudProviderSpec": {"templateVMName": "ubuntu", "cpus": 2, "memoryMB": 4096, "diskSizeGB": 20},
            "operatingSystem": "ubuntu"
        }}}
    }))?)
}

async fn register(user: &Client, cluster: &str, base: &str, certs: &WebhookCerts) -> Result<()> {
    let config = ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(VWC.into()),
            ..ObjectMeta::default()
        },
        webhooks: Some(vec![ValidatingWebhook {
            name: "machines.kkp-quota.k8c.io".into(),
            admission_review_versions: vec!["v1".into()],
            client_config: WebhookClientConfig {
                url: Some(format!("{base}/validate/machines/{cluster}")),
                ca_bundle: Some(certs.ca_bundle()),
                service: None,
            },
            failure_policy: Some("Fail".into()),
            side_effects: "NoneOnDryRun".into(),
            timeout_seconds: Some(5),
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec!["cluster.k8s.io".into()]),
                api_versions: Some(vec!["v1alpha1".into()]),
                operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
                resources: Some(vec!["machines".into()]),
                scope: Some("Namespaced".into()),
            }]),
            ..ValidatingWebhook::default()
        }]),
    };
    Api::<ValidatingWebhookConfiguration>::all(user.clone())
        .patch(VWC, &PatchParams::apply("bench").force(), &Patch::Apply(&config))
        .await?;
    Ok(())
}

/// Waits until the API server does (or does not) call the webhook: a dry-run create of a
/// Machine without size is refused exactly when it does.
async fn wait_enforced(user: &Client, enforced: bool) -> Result<()> {
    let api: Api<Machine> = Api::namespaced(user.clone(), NS);
    wait_for(
        Duration::from_mins(1),
        "the webhook configuration to (stop to) take effect",
        || {
            let api = api.clone();
            async move {
                let mut probe = machine("probe")?;
                probe.spec.provider_spec.value =
                    Some(json!({"cloudProvider": "vsphere", "cloudProviderSpec": {}}));
                let refused = api
                    .create(
                        &PostParams {
                            dry_run: true,
                            ..PostParams::default()
                        },
                        &probe,
                    )
                    .await
                    .is_err();
                anyhow::Ok(refused == enforced)
            }
        },
    )
    .await
    .map(|_| ())
}

/// Emulated seed-controller: every 100 ms counts the reserved Machines into localUsage and drops
/// their reservations, in one compare-and-swap write, re-reading and retrying at once on a
/// conflict (the webhook writes back to back under load; waiting would starve this writer).
async fn drain_ledger(seed: Client) {
    let api: Api<ResourceQuota> = Api::all(seed);
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

struct Phase {
    enforced: bool,
    creates: usize,
    failures: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

async fn run_phase(
    users: &[Client],
    enforced: bool,
    round: usize,
    clients: usize,
    per_client: usize,
) -> Result<Phase> {
    let started = Instant::now();
    let clients = (0..clients).map(|c| {
        let api: Api<Machine> = Api::namespaced(users[c % users.len()].clone(), NS);
        async move {
            let mut latencies = Vec::with_capacity(per_client);
            let mut failures = 0;
            for i in 0..per_client {
                let m = machine(&format!("bench-{round}-{c}-{i}"))?;
                let t = Instant::now();
                if api.create(&PostParams::default(), &m).await.is_err() {
                    failures += 1;
                }
                latencies.push(t.elapsed());
            }
            anyhow::Ok((latencies, failures))
        }
    });
    let mut phase = Phase {
        enforced,
        creates: 0,
        failures: 0,
        elapsed: Duration::ZERO,
        latencies: Vec::new(),
    };
    for result in join_all(clients).await {
        let (latencies, failures) = result?;
        phase.creates += latencies.len();
        phase.failures += failures;
        phase.latencies.extend(latencies);
    }
    phase.elapsed = started.elapsed();
    Ok(phase)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// Cumulative bucket counts of the decision-latency histogram.
fn buckets(webhook: &machine_webhook::metrics::Metrics) -> Vec<(f64, u64)> {
    webhook
        .duration
        .metric()
        .get_histogram()
        .get_bucket()
        .iter()
        .map(|b| (b.upper_bound(), b.cumulative_count()))
        .collect()
}

/// A quantile from histogram buckets (difference of two snapshots), interpolated linearly
/// within the bucket.
#[allow(clippy::cast_precision_loss)]
fn histogram_quantile(before: &[(f64, u64)], after: &[(f64, u64)], q: f64) -> f64 {
    let deltas: Vec<(f64, u64)> = after
        .iter()
        .zip(before)
        .map(|((b, a), (_, z))| (*b, a - z))
        .collect();
    let total = deltas.last().map_or(0, |d| d.1);
    if total == 0 {
        return 0.0;
    }
    let rank = q * total as f64;
    let mut lower = (0.0, 0u64);
    for &(bound, count) in &deltas {
        if count as f64 >= rank {
            let in_bucket = (count - lower.1) as f64;
            let fraction = if in_bucket > 0.0 {
                (rank - lower.1 as f64) / in_bucket
            } else {
                1.0
            };
            return lower.0 + (bound - lower.0) * fraction;
        }
        lower = (bound, count);
    }
    lower.0
}

#[tokio::main(flavor = "multi_thread")]
#[allow(clippy::too_many_lines, clippy::cast_precision_loss)]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let per_client: usize = args.get(1).map_or(Ok(40), |a| a.parse())?;
    let rounds: usize = args.get(2).map_or(Ok(3), |a| a.parse())?;
    let clients: usize = args.get(3).map_or(Ok(DEFAULT_CLIENTS), |a| a.parse())?;
    let mut spec = FleetSpec::empty().with_seed("seed-a").with_project(PROJECT);
    for user in USERS {
        spec = spec.with_user_cluster(user, "seed-a", PROJECT);
    }
    eprintln!("starting the fleet ...");
    let fleet = Fleet::start(spec).await?;
    let seed = fleet.seed("seed-a").client();
    let users: Vec<Client> = USERS.iter().map(|u| fleet.user_cluster(u).client()).collect();

    // A quota that is never reached: the webhook still decides and reserves every Machine.
    let quotas: Api<ResourceQuota> = Api::all(seed.clone());
    let mut quota = ResourceQuota::new(
        "project-demo",
        ResourceQuotaSpec {
            subject: Subject::project(PROJECT),
            quota: serde_json::from_value::<ResourceDetails>(json!({"cpu": "1000000", "memory": "100Ti"}))?,
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

    let dir = tempfile::tempdir()?;
    let certs = WebhookCerts::generate()?;
    let paths = certs.write_to(dir.path())?;
    let webhook = Webhook::start(
        Config::new("127.0.0.1:0".parse()?, paths.cert, paths.key),
        seed.clone(),
    )
    .await?;
    let base = format!("https://{}", webhook.address);
    let metrics = webhook.metrics.clone();
    let readiness = webhook.readiness.clone();
    let serving = tokio::spawn(webhook.run());
    wait_for(Duration::from_secs(30), "the webhook to be ready", || {
        let ready = readiness.is_ready();
        async move { ready }
    })
    .await?;
    let drainer = tokio::spawn(drain_ledger(seed.clone()));

    let mut phases = Vec::new();
    let mut before = Vec::new();
    let mut after = Vec::new();
    for round in 0..rounds {
        for enforced in [false, true] {
            for (user, name) in users.iter().zip(USERS) {
                if enforced {
                    register(user, name, &base, &certs).await?;
                } else {
                    let _ = Api::<ValidatingWebhookConfiguration>::all(user.clone())
                        .delete(VWC, &DeleteParams::default())
                        .await;
                }
            }
            for user in &users {
                wait_enforced(user, enforced)
                    .await
                    .context("switching enforcement")?;
            }
            let snapshot = buckets(&metrics);
            let phase = run_phase(
                &users,
                enforced,
                round * 2 + usize::from(enforced),
                clients,
                per_client,
            )
            .await?;
            if enforced {
                if before.is_empty() {
                    before = snapshot;
                }
                after = buckets(&metrics);
            }
            eprintln!(
                "round {round} webhook={enforced}: {} creates in {:.2?} ({:.1}/s), {} failed",
                phase.creates,
                phase.elapsed,
                phase.creates as f64 / phase.elapsed.as_secs_f64(),
                phase.failures
            );
            phases.push(phase);
        }
    }
    // Only the enforced phases add to the histogram, so the difference of the first and last
    // snapshot covers exactly them (plus the few probes, which are decided too).
    let rate = |enforced: bool| {
        let (creates, secs) = phases
            .iter()
            .filter(|p| p.enforced == enforced)
            .fold((0usize, 0f64), |(c, s), p| {
                (c + p.creates, s + p.elapsed.as_secs_f64())
            });
        creates as f64 / secs
    };
    let latencies = |enforced: bool| {
        let mut all: Vec<Duration> = phases
            .iter()
            .filter(|p| p.enforced == enforced)
            .flat_map(|p| p.latencies.clone())
            .collect();
        all.sort();
        (percentile(&all, 0.5), percentile(&all, 0.99))
    };
    let (off, on) = (rate(false), rate(true));
    let (off_p50, off_p99) = latencies(false);
    let (on_p50, on_p99) = latencies(true);
    let decision_p50 = histogram_quantile(&before, &after, 0.5);
    let decision_p99 = histogram_quantile(&before, &after, 0.99);
    let failures: usize = phases.iter().map(|p| p.failures).sum();

    let mut md = String::new();
    writeln!(md, "# machine-webhook: admission throughput and latency\n")?;
    writeln!(
        md,
        "Measured by `cargo run -p machine-webhook --example admission_bench -- {per_client} {rounds} {clients}` \
         (dev profile: dependencies at opt-level 2, this crate unoptimised) on the shared 2-core build machine, \
         with everything on it: one seed and {} user clusters (each a real etcd + kube-apiserver), the webhook \
         in-process, and an emulated seed-controller draining the ledger every 100 ms with compare-and-swap writes. \
         {clients} concurrent clients, spread over the user clusters, each creating {per_client} Machines one after \
         another; phases alternate without and with the webhook ({rounds} of each, same run). The quota is never \
         reached, so every create with the webhook is decided, reserved and written to the ledger.\n",
        USERS.len()
    )?;
    writeln!(md, "| | creates/s | create p50 | create p99 |")?;
    writeln!(md, "| --- | ---: | ---: | ---: |")?;
    writeln!(md, "| no webhook | {off:.1} | {off_p50:.1?} | {off_p99:.1?} |")?;
    writeln!(
        md,
        "| webhook enforcing | {on:.1} | {on_p50:.1?} | {on_p99:.1?} |"
    )?;
    writeln!(
        md,
        "\n**Ratio (with / without): {:.2}** (target >= 0.9).\n",
        on / off
    )?;
    writeln!(
        md,
        "Decision latency inside the webhook (request received to answer sent, including the batched \
         ledger write; from `kkp_quota_admission_duration_seconds`, interpolated within buckets): \
         **p50 {:.2} ms, p99 {:.2} ms**.\n",
        decision_p50 * 1000.0,
        decision_p99 * 1000.0
    )?;
    let batches = metrics.batch_size.get_sample_count();
    let mean_batch = if batches == 0 {
        0.0
    } else {
        metrics.batch_size.get_sample_sum() / batches as f64
    };
    let writes = metrics.write_duration.get_sample_count();
    let mean_write = if writes == 0 {
        0.0
    } else {
        metrics.write_duration.get_sample_sum() / writes as f64
    };
    writeln!(
        md,
        "TLS connections from the API servers: {}. Ledger writes: {}, conflicts: {}, failed creates: {failures}; {batches} batches of {mean_batch:.1} \
         requests on average; one compare-and-swap write took {:.1} ms on average (the writes of one \
         project are serial, so this bounds throughput at about batch / write time).\n",
        metrics.connections.get(),
        metrics.writes.get(),
        metrics.conflicts.get(),
        mean_write * 1000.0
    )?;
    writeln!(
        md,
        "Why the ratio is what it is: every admitted create waits for its batch's compare-and-swap \
         write on the seed (the answer waits for the write, so a crash can never admit an unreserved \
         Machine), and one project's writes are serial (each needs the resourceVersion the previous one \
         produced). A create therefore gains about 1.5 write times of latency (the rest of the write in \
         flight, then its own), and with a fixed number of closed-loop clients added latency is lost \
         throughput: ratio = base / (base + 1.5 x write). Here a status write takes tens of milliseconds \
         under the benchmark's own load (every API server, etcd, the clients and the webhook share 2 \
         cores; the same write takes about 3-9 ms on an idle API server) against a create of about \
         20 ms, so the ratio stays far below 0.9, which would need writes under about 1.5 ms. Batching \
         works (the mean batch grows with the number of waiting clients; a burst of 60 costs 2-4 \
         writes); the ceiling is the serial write chain. Ways up, not built: pipelining (send the next \
         batch's write before the previous one returns, conditioned by JSON-patch `test` operations on \
         the fields the decision read instead of by resourceVersion), or per-replica headroom \
         allotments (escrow) so that most admissions need no synchronous write.\n"
    )?;
    writeln!(md, "Per phase:\n")?;
    writeln!(md, "| phase | webhook | creates | seconds | creates/s |")?;
    writeln!(md, "| ---: | --- | ---: | ---: | ---: |")?;
    for (i, p) in phases.iter().enumerate() {
        writeln!(
            md,
            "| {i} | {} | {} | {:.2} | {:.1} |",
            if p.enforced { "yes" } else { "no" },
            p.creates,
            p.elapsed.as_secs_f64(),
            p.creates as f64 / p.elapsed.as_secs_f64()
        )?;
    }
    let file = if clients == DEFAULT_CLIENTS {
        "admission.md".to_owned()
    } else {
        format!("admission-{clients}-clients.md")
    };
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("results")
        .join(file);
    std::fs::create_dir_all(out.parent().context("results dir")?)?;
    std::fs::write(&out, &md)?;
    print!("{md}");
    drainer.abort();
    serving.abort();
    Ok(())
}
