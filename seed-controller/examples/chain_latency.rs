//! Latency of the counting chain on a real fleet: Machine created in a user cluster -> the seed
//! `QuotaLedger`'s `localUsage` (seed-controller) -> the master's `globalUsage` in the `ProjectQuota`
//! (master-controller).
//! Both controllers run in this process; Machines are created one after another.
//!
//! ```sh
//! cargo run -p seed-controller --example chain_latency -- --samples 100
//! ```

#![allow(
    clippy::unwrap_used,
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use futures::StreamExt;
use futures::stream::BoxStream;
use kkp_quota_crds::machine::Machine;
use kkp_quota_crds::quota::{PROJECT_KIND, SUBJECT_KIND_LABEL, SUBJECT_NAME_LABEL};
use kkp_quota_crds::{
    KkpQuota, ProjectQuota, QuotaLedger, ResourceDetails, ResourceQuota, ResourceQuotaSpec, Subject,
};
use kube::api::PostParams;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use provider_sizes::{SizeCatalog, size_machine};
use seed_controller::usage::same_usage;
use seed_controller::{Config, Controller};
use serde_json::{Value, json};
use tokio_util::task::AbortOnDropHandle;

#[derive(Parser, Debug)]
struct Args {
    #[arg(long, default_value_t = 100)]
    samples: usize,
    #[arg(long, default_value = "seed-controller/results/latency.md")]
    out: PathBuf,
}

fn machine(name: &str, spec: &Value) -> Machine {
    serde_json::from_value(json!({
        "apiVersion": "cluster.k8s.io/v1alpha1", "kind": "Machine",
        "metadata": {"name": name, "namespace": "kube-system"},
        "spec": {"providerSpec": {"value": spec}},
    }))
    .unwrap()
}

/// `project-demo` as it changes: the seed's `QuotaLedger` or the master's `ProjectQuota`.
fn quota_events<K>(client: Client) -> BoxStream<'static, Result<Event<K>, watcher::Error>>
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    watcher::watcher(
        Api::<K>::all(client),
        watcher::Config::default().fields("metadata.name=project-demo"),
    )
    .boxed()
}

/// Waits for a version of the quota whose usage (picked by `field`) is `want`.
async fn wait_usage<K>(
    events: &mut BoxStream<'static, Result<Event<K>, watcher::Error>>,
    want: &ResourceDetails,
    field: fn(&K) -> Option<&ResourceDetails>,
) -> Result<()> {
    loop {
        let event = tokio::time::timeout(Duration::from_mins(1), events.next())
            .await
            .context("no update within a minute")?
            .context("watch ended")?;
        if let Ok(Event::Apply(rq) | Event::InitApply(rq)) = event
            && field(&rq).is_some_and(|u| same_usage(u, want))
        {
            return Ok(());
        }
    }
}

fn local_usage(ledger: &QuotaLedger) -> Option<&ResourceDetails> {
    ledger.status.as_ref()?.local_usage.as_ref()
}

fn global_usage(pq: &ProjectQuota) -> Option<&ResourceDetails> {
    pq.status.as_ref()?.global_usage.as_ref()
}

fn stats(mut samples: Vec<Duration>) -> (f64, f64, f64) {
    samples.sort();
    let pct = |p: f64| {
        let idx = ((samples.len() as f64 - 1.0) * p).round() as usize;
        samples[idx.min(samples.len() - 1)].as_secs_f64() * 1000.0
    };
    (pct(0.5), pct(0.99), pct(1.0))
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
    let master = fleet.master().client();
    let seed = fleet.seed("seed-a").client();
    let mut rq = ResourceQuota::new(
        "project-demo",
        ResourceQuotaSpec {
            subject: Subject::project("demo"),
            quota: KkpQuota::new(&serde_json::from_value(json!({"cpu": "100000"}))?),
        },
    );
    rq.metadata.labels = Some(BTreeMap::from([
        (SUBJECT_NAME_LABEL.to_owned(), "demo".to_owned()),
        (SUBJECT_KIND_LABEL.to_owned(), PROJECT_KIND.to_owned()),
    ]));
    Api::<ResourceQuota>::all(master.clone())
        .create(&PostParams::default(), &rq)
        .await?;
    let _master_controller = AbortOnDropHandle::new(tokio::spawn(master_controller::run(
        master.clone(),
        master_controller::Options::new("kubermatic"),
        master_controller::Metrics::new(),
        kkp_quota_runtime::ops::Readiness::default(),
    )));
    let controller = Controller::new(Config::for_tests("seed-a"), seed.clone()).await?;
    let ready = controller.readiness();
    let _seed_controller = AbortOnDropHandle::new(tokio::spawn(controller.run()));
    e2e::wait_for(Duration::from_mins(1), "seed-controller ready", || async {
        ready.is_ready()
    })
    .await?;
    // The seed copy exists and carries localUsage before measuring: no Machine yet, and the
    // fleet's one user cluster, which counts as a cluster (docs/capacity.md).
    let empty = ResourceDetails::zero().checked_add(&ResourceDetails::one_cluster())?;
    let mut seed_events = quota_events::<QuotaLedger>(seed.clone());
    wait_usage(&mut seed_events, &empty, local_usage).await?;
    let mut master_events = quota_events::<ProjectQuota>(master.clone());
    wait_usage(&mut master_events, &empty, global_usage).await?;

    let machines: Api<Machine> = Api::namespaced(fleet.user_cluster("alpha").client(), "kube-system");
    let spec = json!({"cloudProvider": "hetzner", "cloudProviderSpec": {"serverType": "cx22"}});
    let size = size_machine(&machine("x", &spec), &SizeCatalog::shipped(), None)?;
    let mut want = empty.clone();
    let (mut to_seed, mut to_master) = (Vec::new(), Vec::new());
    for k in 0..args.samples {
        want = want.checked_add(&size)?;
        let t0 = Instant::now();
        machines
            .create(&PostParams::default(), &machine(&format!("lat-{k}"), &spec))
            .await?;
        wait_usage(&mut seed_events, &want, local_usage).await?;
        to_seed.push(t0.elapsed());
        wait_usage(&mut master_events, &want, global_usage).await?;
        to_master.push(t0.elapsed());
    }
    let n = to_seed.len();
    let (s50, s99, smax) = stats(to_seed);
    let (m50, m99, mmax) = stats(to_master);
    let report = format!(
        "# Counting-chain latency\n\n\
         Measured by `cargo run -p seed-controller --example chain_latency -- --samples {n}` on the shared 2-core \
         development machine, {}. Real fleet: master, \
         seed-a, user cluster alpha (one kube-apiserver + etcd each); master-controller and seed-controller in one \
         process. {n} Machines (hetzner cx22) created one after another; each is timed from just before its create \
         call to the watch event that shows it counted.\n\n\
         | Machine created -> | median | p99 | max |\n| --- | --- | --- | --- |\n\
         | seed `QuotaLedger` `localUsage` (seed-controller) | {s50:.1} ms | {s99:.1} ms | {smax:.1} ms |\n\
         | master `ProjectQuota` `globalUsage` (then master-controller) | {m50:.1} ms | {m99:.1} ms | {mmax:.1} ms |\n",
        e2e::bench::profile(),
    );
    if let Some(parent) = args.out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&args.out, &report)?;
    eprintln!("{report}");
    Ok(())
}
