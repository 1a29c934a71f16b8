//! The cost of the webhook on Machine updates that cannot change a size: machine-controller
//! updates every Machine many times in its life (finalizers, annotations). With the webhook
//! configuration seed-controller writes (CEL `matchConditions`: only UPDATEs that change the
//! provider spec are sent), such updates should cost what they cost without any webhook.
//!
//! Six modes, interleaved round by round (an order that changes every round, each phase after an
//! unmeasured warm-up of a quarter of its updates in the same mode) in one run on one
//! fleet (seed-a + user cluster alpha, a webhook process in this process): no webhook; the
//! webhook registered for CREATE only (no UPDATE matches its rules: what a registration costs
//! before any condition is evaluated); the webhook with the cheapest condition that skips every
//! UPDATE (what the API server spends on any match condition, whatever it says); the webhook
//! whose condition compares the specs of every update (this project's condition before it tested
//! the generation first); the webhook as configured (match conditions); the same webhook without
//! match conditions (every UPDATE sent).
//! Also the CPU the user cluster's API server and etcd spend per update. Each round, `--clients`
//! concurrent clients each patch their own Machine `--updates` times, alternately adding and
//! removing a finalizer and changing an annotation.
//!
//! ```sh
//! cargo run --release -p seed-controller --example update_storm -- --clients 16 --updates 100 --rounds 3
//! ```

#![allow(
    clippy::unwrap_used,
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::too_many_lines // one benchmark, top to bottom
)]

use std::fmt::Write as _;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use clap::Parser;
use futures::future::try_join_all;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kkp_quota_crds::machine::Machine;
use kkp_quota_crds::quota::{PROJECT_KIND, SUBJECT_KIND_LABEL, SUBJECT_NAME_LABEL};
use kkp_quota_crds::{LedgerSubject, QuotaLedger, QuotaLedgerSpec};
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use seed_controller::webhook_config;
use serde_json::{Value, json};
use tokio_util::task::AbortOnDropHandle;

#[derive(Parser, Debug)]
struct Args {
    #[arg(long, default_value_t = 16)]
    clients: usize,
    #[arg(long, default_value_t = 100)]
    updates: usize,
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    #[arg(long, default_value = "seed-controller/results/update-storm.md")]
    out: PathBuf,
    /// Every patch carries the resourceVersion the client's previous patch returned (an
    /// optimistic lock, as a full-object update does). Without it, a patch the API server first
    /// applies to its watch cache's stale copy fails to commit and is applied again, and a
    /// webhook without conditions is called again for it.
    #[arg(long)]
    resource_version: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Mode {
    NoWebhook,
    CreatesOnly,
    CheapestCondition,
    SpecsCompared,
    MatchConditions,
    EveryUpdate,
}

/// The condition before the generation test: the specs compared on every update.
const SPECS_COMPARED: &str = "request.operation != 'UPDATE' || !has(object.spec) || !has(oldObject.spec) || object.spec != oldObject.spec";

impl Mode {
    fn describe(self) -> &'static str {
        match self {
            Mode::NoWebhook => "no webhook",
            Mode::CreatesOnly => {
                "webhook registered for CREATE only (`--webhook-operations=create`: updates match no rule)"
            }
            Mode::CheapestCondition => {
                "webhook with the cheapest condition that skips every update (`oldObject == null`)"
            }
            Mode::SpecsCompared => {
                "webhook whose condition compares the specs of every update (before the generation test)"
            }
            Mode::MatchConditions => "webhook as configured (matchConditions)",
            Mode::EveryUpdate => "webhook without matchConditions",
        }
    }
}

async fn configure(alpha: &Client, mode: Mode, url: &str, ca: &[u8]) -> Result<()> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(alpha.clone());
    let operations = if mode == Mode::CreatesOnly {
        webhook_config::Operations::Create
    } else {
        webhook_config::Operations::CreateAndUpdate
    };
    let mut body = webhook_config::desired(url, Some(ca), operations);
    match mode {
        Mode::NoWebhook => {
            let _ = api.delete(webhook_config::NAME, &DeleteParams::default()).await;
            return Ok(());
        }
        Mode::MatchConditions | Mode::CreatesOnly => {}
        Mode::CheapestCondition => {
            body["webhooks"][0]["matchConditions"][0]["expression"] = json!("oldObject == null");
        }
        Mode::SpecsCompared => {
            body["webhooks"][0]["matchConditions"][0]["expression"] = json!(SPECS_COMPARED);
        }
        Mode::EveryUpdate => {
            if let Some(w) = body["webhooks"][0].as_object_mut() {
                w.remove("matchConditions");
            }
        }
    }
    // Replaced whole (delete, then create), so no field of an earlier mode lingers.
    let _ = api.delete(webhook_config::NAME, &DeleteParams::default()).await;
    let object: ValidatingWebhookConfiguration = serde_json::from_value(body)?;
    api.create(&PostParams::default(), &object).await?;
    Ok(())
}

/// A Machine named `name` in `kube-system`, shaped as machine-controller's Machines are (an AWS
/// worker with its operating system, SSH keys, tags, kubelet version and node labels), so that
/// the API server and a match condition handle an object of a real Machine's size.
fn storm_machine(name: &str) -> DynamicObject {
    let resource = ApiResource::erase::<Machine>(&());
    let mut machine = DynamicObject::new(name, &resource).within("kube-system");
    machine.data = json!({"spec": {
        "metadata": {
            "name": name,
            "labels": {"kubermatic.io/machine-deployment": "storm-workers", "system/cluster": "alpha"},
        },
        "providerSpec": {"value": {
            "cloudProvider": "aws",
            "cloudProviderSpec": {
                "instanceType": "t3.medium",
                "diskSize": 50,
                "diskType": "gp3",
                "ami": "",
                "region": "eu-central-1",
                "availabilityZone": "eu-central-1a",
                "vpcId": "vpc-0a1b2c3d4e5f60718",
                "subnetId": "subnet-0f1e2d3c4b5a69788",
                "securityGroupIDs": ["sg-0123456789abcdef0"],
                "instanceProfile": "kubernetes-storm-workers",
                "assignPublicIP": true,
                "tags": {"kubernetes.io/cluster/storm": "", "system/cluster": "storm", "system/project": "demo"},
            },
            "operatingSystem": "ubuntu",
            "operatingSystemSpec": {"distUpgradeOnBoot": false, "disableAutoUpdate": true},
            "sshPublicKeys": [format!("ssh-ed25519 {} storm@example.com", "A".repeat(68))],
        }},
        "versions": {"kubelet": "1.33.4"},
    }});
    machine
}

/// One client's storm on its own Machine; returns the number of updates made. `tag` makes every
/// annotation value of this storm new (so no update repeats the previous one and is a no-op).
async fn storm(
    api: Api<DynamicObject>,
    name: String,
    updates: usize,
    tag: String,
    lock: bool,
) -> Result<usize> {
    let mut version: Option<String> = None;
    for i in 0..updates {
        let finalizers: Value = if i % 2 == 0 {
            json!(["example.com/storm"])
        } else {
            Value::Null
        };
        let mut patch = json!({"metadata": {
            "finalizers": finalizers,
            "annotations": {"storm": format!("{tag}-{i}")},
        }});
        if let Some(version) = version.as_ref().filter(|_| lock) {
            patch["metadata"]["resourceVersion"] = json!(version);
        }
        let patched = api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        version = patched.metadata.resource_version;
    }
    // No finalizer left behind.
    let clear = json!({"metadata": {"finalizers": null}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&clear))
        .await?;
    Ok(updates)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    kkp_quota_runtime::telemetry::init_tracing(false);
    let fleet = e2e::Fleet::start(
        e2e::FleetSpec::empty()
            .with_seed("seed-a")
            .with_project("demo")
            .with_user_cluster("alpha", "seed-a", "demo"),
    )
    .await?;
    let seed = fleet.seed("seed-a").client();
    let alpha = fleet.user_cluster("alpha").client();
    let alpha_pids = fleet.user_cluster("alpha").pids();
    // CPU ticks of alpha's kube-apiserver and etcd so far.
    let alpha_cpu = || e2e::procfs::total_cpu_ticks(&alpha_pids);

    let mut ledger = QuotaLedger::new(
        "project-demo",
        QuotaLedgerSpec {
            rollout_allowance: None,
            subject: LedgerSubject::project("demo"),
            quota: serde_json::from_value(json!({"cpu": "100000"}))?,
            shares: None,
            reserved_counts: false,
        },
    );
    ledger.metadata.labels = Some(BTreeMap::from([
        (SUBJECT_NAME_LABEL.to_owned(), "demo".to_owned()),
        (SUBJECT_KIND_LABEL.to_owned(), PROJECT_KIND.to_owned()),
    ]));
    Api::<QuotaLedger>::all(seed.clone())
        .create(&PostParams::default(), &ledger)
        .await?;

    let certs = e2e::certs::WebhookCerts::generate()?;
    let dir = tempfile::tempdir()?;
    let paths = certs.write_to(dir.path())?;
    let ca = std::fs::read(&paths.ca)?;
    let keys_path = dir.path().join("url-signing-keys");
    e2e::system::write_url_signing_keys(&keys_path, &[&kkp_quota_runtime::webhook_auth::generate_key()])?;
    let mut config =
        machine_webhook::Config::new("127.0.0.1:0".parse()?, paths.cert.clone(), paths.key.clone());
    config.auth = Some(machine_webhook::AuthConfig::UrlSigningKeys(keys_path.clone()));
    let webhook = machine_webhook::Webhook::start(config, seed.clone()).await?;
    let uid = Api::<kkp_quota_crds::kkp::Cluster>::all(seed.clone())
        .get("alpha")
        .await?
        .metadata
        .uid
        .unwrap_or_default();
    let keys = kkp_quota_runtime::webhook_auth::SigningKeys::load(&keys_path)?;
    let base_url = webhook_config::url(
        "alpha",
        &uid,
        &format!("https://{}", webhook.address),
        Some(&keys),
    );
    let metrics = webhook.metrics.clone();
    let ready = webhook.readiness.clone();
    let _webhook = AbortOnDropHandle::new(tokio::spawn(async move {
        let _ = webhook.run().await;
    }));
    e2e::wait_for(std::time::Duration::from_secs(30), "webhook ready", || async {
        ready.is_ready()
    })
    .await?;
    let calls = || metrics.answered(None) as f64;

    let machines: Api<DynamicObject> =
        Api::namespaced_with(alpha.clone(), "kube-system", &ApiResource::erase::<Machine>(&()));
    for c in 0..args.clients {
        machines
            .create(&PostParams::default(), &storm_machine(&format!("storm-{c}")))
            .await?;
    }

    let modes = [
        Mode::NoWebhook,
        Mode::CreatesOnly,
        Mode::CheapestCondition,
        Mode::SpecsCompared,
        Mode::MatchConditions,
        Mode::EveryUpdate,
    ];
    let mut rates: BTreeMap<Mode, Vec<f64>> = BTreeMap::new();
    // Per mode: updates made and alpha's CPU ticks spent on them.
    let mut cpu: BTreeMap<Mode, (usize, u64)> = BTreeMap::new();
    let mut webhook_calls: BTreeMap<Mode, f64> = BTreeMap::new();
    for round in 0..args.rounds {
        for mode in e2e::bench::round_order(&modes, round) {
            configure(&alpha, mode, &base_url, &ca).await?;
            // The API server picks up webhook configuration changes asynchronously: a probe
            // update shows when the mode is in effect.
            let probe_wanted = mode == Mode::EveryUpdate;
            e2e::wait_for(std::time::Duration::from_secs(30), "webhook mode in effect", || async {
                let before = calls();
                let patch = json!({"metadata": {"annotations": {"probe": Instant::now().elapsed().as_nanos().to_string()}}});
                let _ = machines.patch("storm-0", &PatchParams::default(), &Patch::Merge(&patch)).await;
                (calls() > before) == probe_wanted
            })
            .await?;
            // And a dry-run create reaches the webhook exactly when one is registered.
            let create_wanted = mode != Mode::NoWebhook;
            e2e::wait_for(
                std::time::Duration::from_secs(30),
                "webhook registration in effect",
                || async {
                    let before = calls();
                    let dry_run = PostParams {
                        dry_run: true,
                        ..PostParams::default()
                    };
                    let _ = machines.create(&dry_run, &storm_machine("storm-probe")).await;
                    (calls() > before) == create_wanted
                },
            )
            .await?;
            // An unmeasured warm-up in the same mode, so that the phase does not pay for its
            // predecessor's state (the API server's garbage collector paced for another rate).
            try_join_all((0..args.clients).map(|c| {
                storm(
                    machines.clone(),
                    format!("storm-{c}"),
                    args.updates.div_ceil(4),
                    format!("warm-{round}"),
                    args.resource_version,
                )
            }))
            .await?;
            let before = calls();
            let ticks_before = alpha_cpu();
            let started = Instant::now();
            let done: usize = try_join_all((0..args.clients).map(|c| {
                storm(
                    machines.clone(),
                    format!("storm-{c}"),
                    args.updates,
                    round.to_string(),
                    args.resource_version,
                )
            }))
            .await?
            .into_iter()
            .sum();
            let elapsed = started.elapsed().as_secs_f64();
            let spent = cpu.entry(mode).or_default();
            spent.0 += done;
            spent.1 += alpha_cpu() - ticks_before;
            rates.entry(mode).or_default().push(done as f64 / elapsed);
            *webhook_calls.entry(mode).or_default() += calls() - before;
            eprintln!(
                "round {round}: {}: {:.0} updates/s",
                mode.describe(),
                done as f64 / elapsed
            );
        }
    }

    let median = |v: &[f64]| e2e::bench::median(v.to_vec());
    let tick_hz = e2e::procfs::ticks_per_second();
    let cpu_ms = |mode: Mode| {
        let (updates, ticks) = cpu[&mode];
        ticks as f64 / tick_hz * 1000.0 / updates.max(1) as f64
    };
    let mut rows = String::new();
    for mode in modes {
        // Each round's rate against no webhook in the same round: the fleet slows as its
        // etcd grows over the run, and a round's modes see the same fleet.
        let ratios = e2e::bench::per_round_ratios(&rates[&mode], &rates[&Mode::NoWebhook]);
        let per_round: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        let _ = writeln!(
            rows,
            "| {} | {:.0} | {:.2} ({}) | {:.0} | {:.3} | {:.2} |",
            mode.describe(),
            median(&rates[&mode]),
            median(&ratios),
            per_round.join(", "),
            webhook_calls[&mode],
            cpu_ms(mode),
            cpu_ms(Mode::NoWebhook) / cpu_ms(mode),
        );
    }
    let report = format!(
        "# Update storm: metadata-only Machine updates with and without the webhook\n\n\
         Measured by `cargo run --release -p seed-controller --example update_storm -- --clients {} --updates {} --rounds {}{}` \
         on the shared 2-core machine: a real fleet (seed-a + user cluster alpha), the webhook in the benchmark's process. \
         Each round runs every mode in turn, in an order that changes every round (each mode at another position, after another mode), each after an unmeasured warm-up of a quarter of its updates; each client patches its own Machine (an AWS worker, as machine-controller makes them) {} times (finalizer added/removed, \
         annotation changed), as machine-controller does over a Machine's life. Rates are medians over the rounds; the \
         ratio is the median over the rounds of the mode's rate against no webhook in the same round (each \
         round's in brackets); webhook calls are summed over all rounds; CPU is user + system time of the user \
         cluster's kube-apiserver and etcd over all rounds, per update (clock ticks of 1/{tick_hz} s), and its ratio \
         is no webhook's CPU per update against the mode's: what the updates/s ratio would be if that API server's \
         CPU alone decided it.\n\n\
         | mode | updates/s | ratio (per round) | webhook calls | user cluster CPU ms per update | CPU ratio |\n\
         | --- | ---: | ---: | ---: | ---: | ---: |\n{rows}",
        args.clients,
        args.updates,
        args.rounds,
        if args.resource_version {
            " --resource-version"
        } else {
            ""
        },
        args.updates
    );
    if let Some(parent) = args.out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&args.out, &report)?;
    eprintln!("{report}");
    Ok(())
}
