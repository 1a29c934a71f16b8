//! What one write of the master's seed objects costs a seed's API server and etcd, by kind of
//! write (issue #34: "measure the API servers' CPU per write for apply versus create versus merge
//! patch on this project's objects, and pick by the figure").
//!
//! One real kube-apiserver + etcd with this project's CRDs and KKP's. Each phase writes `--writes`
//! objects, `--concurrency` at a time, with the bodies master-controller writes (its
//! `fanout::ledger_apply_body` and `fanout::copy_apply_body`), and takes the CPU time the API
//! server and etcd used in it from `/proc`. Phases on new objects each write new names; phases on
//! existing objects write the ones the first phase created. Every phase runs `--rounds` times, in
//! an order that changes every round, and the table gives the median.
//!
//! ```sh
//! cargo run --release -p master-controller --example write_costs -- --out master-controller/results/write-costs.md
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context as _, Result};
use clap::Parser;
use e2e::procfs::CpuTicks;
use e2e::{Fleet, FleetSpec};
use futures::{StreamExt, TryStreamExt, stream};
use kkp_quota_crds::{
    KkpQuota, Quantity, QuotaLedger, ResourceDetails, ResourceQuota, ResourceQuotaSpec, Subject,
};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use master_controller::fanout::{self, FIELD_MANAGER, Policies};
use serde_json::{Value, json};

#[derive(Parser, Debug)]
struct Args {
    /// Writes per phase.
    #[arg(long, default_value_t = 2000)]
    writes: usize,
    /// Writes in flight at once (the master's `--concurrency` is 16 by default).
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Every phase this many times; the table gives the median.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Object {
    Ledger,
    KkpCopy,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Write {
    /// `POST` of a new object.
    Create,
    /// Server-side apply of a new object.
    ApplyNew,
    /// Server-side apply of the body the object already has (a restarted master's first write).
    ApplyUnchanged,
    /// Server-side apply of a changed limit.
    ApplyChanged,
    /// JSON merge patch of a changed limit.
    MergeChanged,
    /// JSON merge patch of the status (`otherSeedsUsage`, or KKP's `globalUsage`).
    MergeStatus,
}

impl Write {
    const ALL: [Write; 6] = [
        Write::Create,
        Write::ApplyNew,
        Write::ApplyUnchanged,
        Write::ApplyChanged,
        Write::MergeChanged,
        Write::MergeStatus,
    ];

    fn describe(self) -> &'static str {
        match self {
            Write::Create => "create (`POST`) of a new object",
            Write::ApplyNew => "server-side apply of a new object",
            Write::ApplyUnchanged => "server-side apply, the body unchanged",
            Write::ApplyChanged => "server-side apply, a limit changed",
            Write::MergeChanged => "merge patch, a limit changed",
            Write::MergeStatus => "merge patch of `/status`",
        }
    }

    fn on_new_objects(self) -> bool {
        matches!(self, Write::Create | Write::ApplyNew)
    }
}

/// The master's quota for object `i`, its cpu limit `cpu`.
fn quota(i: usize, cpu: i64) -> ResourceQuota {
    ResourceQuota::new(
        &format!("project-p{i:05}"),
        ResourceQuotaSpec {
            subject: Subject::project(format!("p{i:05}")),
            quota: KkpQuota::new(&limits(cpu)),
        },
    )
}

fn limits(cpu: i64) -> ResourceDetails {
    ResourceDetails {
        cpu: Some(Quantity::from_units(cpu)),
        memory: Some(Quantity::from_gibibytes(64)),
        storage: Some(Quantity::from_gibibytes(500)),
        ..ResourceDetails::default()
    }
}

/// The body master-controller writes for `object`, named for `i`, its cpu limit `cpu`.
fn body(object: Object, i: usize, cpu: i64) -> Value {
    let rq = quota(i, cpu);
    match object {
        Object::Ledger => fanout::ledger_apply_body(&rq, &limits(cpu), None, Policies::default()),
        Object::KkpCopy => fanout::copy_apply_body(&rq),
    }
}

fn status_body(object: Object, cpu: i64) -> Value {
    let usage = json!({"cpu": cpu.to_string(), "memory": "1Gi", "storage": "10Gi"});
    match object {
        Object::Ledger => json!({"status": {"otherSeedsUsage": usage}}),
        Object::KkpCopy => json!({"status": {"globalUsage": usage}}),
    }
}

async fn write_one(client: &Client, object: Object, write: Write, i: usize, cpu: i64) -> Result<()> {
    let name = format!("project-p{i:05}");
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    let body = body(object, i, cpu);
    macro_rules! with_api {
        ($api:expr) => {{
            let api = $api;
            match write {
                Write::Create => {
                    let params = PostParams {
                        field_manager: Some(FIELD_MANAGER.to_owned()),
                        ..PostParams::default()
                    };
                    api.create(&params, &serde_json::from_value(body)?).await?;
                }
                Write::ApplyNew | Write::ApplyUnchanged | Write::ApplyChanged => {
                    api.patch(&name, &apply, &Patch::Apply(&body)).await?;
                }
                Write::MergeChanged => {
                    let spec = json!({"spec": body["spec"]});
                    api.patch(&name, &PatchParams::default(), &Patch::Merge(&spec))
                        .await?;
                }
                Write::MergeStatus => {
                    let status = status_body(object, cpu);
                    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                        .await?;
                }
            }
        }};
    }
    match object {
        Object::Ledger => with_api!(Api::<QuotaLedger>::all(client.clone())),
        Object::KkpCopy => with_api!(Api::<ResourceQuota>::all(client.clone())),
    }
    Ok(())
}

/// One phase: `names` written `concurrency` at a time; the API server's and etcd's CPU seconds
/// and the wall time.
async fn phase(
    client: &Client,
    pids: &[u32],
    object: Object,
    write: Write,
    names: std::ops::Range<usize>,
    cpu: i64,
    concurrency: usize,
) -> Result<(f64, f64)> {
    let before = CpuTicks::now(&[pids.to_vec()]);
    let began = Instant::now();
    stream::iter(names)
        .map(|i| write_one(client, object, write, i, cpu))
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await
        .with_context(|| format!("{object:?} {write:?}"))?;
    let wall = began.elapsed().as_secs_f64();
    #[allow(clippy::cast_precision_loss)]
    let cpu_seconds =
        CpuTicks::now(&[pids.to_vec()]).since(&before).group(0) as f64 / e2e::procfs::ticks_per_second();
    Ok((cpu_seconds, wall))
}

/// Deletes objects `names` (new objects' phases leave them), not measured.
async fn delete(client: &Client, object: Object, names: std::ops::Range<usize>) -> Result<()> {
    let dp = DeleteParams::default();
    stream::iter(names)
        .map(|i| {
            let name = format!("project-p{i:05}");
            let client = client.clone();
            let dp = dp.clone();
            async move {
                match object {
                    Object::Ledger => {
                        let api = Api::<QuotaLedger>::all(client);
                        // The ledger's finalizer would hold it: removed first.
                        api.patch(
                            &name,
                            &PatchParams::default(),
                            &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
                        )
                        .await?;
                        api.delete(&name, &dp).await?;
                    }
                    Object::KkpCopy => {
                        Api::<ResourceQuota>::all(client).delete(&name, &dp).await?;
                    }
                }
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

#[tokio::main]
#[allow(clippy::cast_precision_loss)]
async fn main() -> Result<()> {
    let args = Args::parse();
    let fleet = Fleet::start(FleetSpec::empty().with_seed("seed")).await?;
    let seed = fleet.seed("seed");
    let client = seed.client();
    let pids = seed.pids();
    let n = args.writes;
    let objects = [Object::Ledger, Object::KkpCopy];

    // The objects the phases on existing objects write: names 0..n.
    for object in objects {
        let (_, _) = phase(&client, &pids, object, Write::Create, 0..n, 10, args.concurrency).await?;
    }
    let mut results: BTreeMap<(Object, Write), Vec<(f64, f64)>> = BTreeMap::new();
    let mut cpu = 10;
    for round in 0..args.rounds {
        let mut order: Vec<(Object, Write)> = objects
            .iter()
            .flat_map(|&o| Write::ALL.iter().map(move |&w| (o, w)))
            .collect();
        let len = order.len();
        order.rotate_left((round * 5) % len);
        if round % 2 == 1 {
            order.reverse();
        }
        for (object, write) in order {
            cpu += 1;
            // Unchanged: the body the objects were created with (cpu 10), applied back first.
            let at = match write {
                Write::ApplyUnchanged => {
                    phase(
                        &client,
                        &pids,
                        object,
                        Write::ApplyChanged,
                        0..n,
                        10,
                        args.concurrency,
                    )
                    .await?;
                    10
                }
                _ => cpu,
            };
            let names = if write.on_new_objects() { n..2 * n } else { 0..n };
            let measured = phase(&client, &pids, object, write, names.clone(), at, args.concurrency).await?;
            eprintln!(
                "round {round}: {object:?} {write:?}: {:.3} CPU ms per write, {:.0} writes/s",
                measured.0 * 1000.0 / n as f64,
                n as f64 / measured.1
            );
            results.entry((object, write)).or_default().push(measured);
            if write.on_new_objects() {
                delete(&client, object, names).await?;
            }
        }
    }

    let mut out = String::new();
    writeln!(
        out,
        "# What one write of a seed object costs the seed's API server and etcd\n"
    )?;
    writeln!(
        out,
        "Measured by `cargo run --release -p master-controller --example write_costs -- --writes {} --concurrency {} --rounds {}` on {} (shared), {}. One real kube-apiserver + etcd (`--unsafe-no-fsync`, as every cluster in these benchmarks) with this project's CRDs and KKP's; the bodies are master-controller's own (`fanout::ledger_apply_body`, `fanout::copy_apply_body`). Each phase writes {} objects, {} at a time; CPU is the API server's and etcd's from `/proc`; the median of {} rounds, in an order that changes every round.\n",
        args.writes,
        args.concurrency,
        args.rounds,
        e2e::bench::host(),
        jiff::Timestamp::now().strftime("%Y-%m-%d %H:%M UTC"),
        args.writes,
        args.concurrency,
        args.rounds,
    )?;
    writeln!(
        out,
        "| object | write | CPU ms per write | writes per second |\n| --- | --- | ---: | ---: |"
    )?;
    for ((object, write), runs) in &results {
        let median = |f: fn(&(f64, f64)) -> f64| {
            let mut v: Vec<f64> = runs.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        #[allow(clippy::cast_precision_loss)]
        let (cpu_ms, rate) = (median(|r| r.0) * 1000.0 / n as f64, n as f64 / median(|r| r.1));
        let object = match object {
            Object::Ledger => "`QuotaLedger`",
            Object::KkpCopy => "KKP's `ResourceQuota` copy",
        };
        writeln!(
            out,
            "| {object} | {} | {cpu_ms:.3} | {rate:.0} |",
            write.describe()
        )?;
    }
    print!("{out}");
    if let Some(path) = args.out {
        std::fs::write(&path, &out).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
