//! Measures propagation latency on a real fleet (master + seed-a + seed-b) with the controller
//! running in-process, and writes `master-controller/results/propagation.md`.
//!
//! - quota edit on the master → every seed copy has the new spec;
//! - a seed's `localUsage` change → the master's `globalUsage` is the new sum.
//!
//! Times are taken from watch events (not polling), so they include the watch delivery to the
//! observer. Run: `cargo run -p master-controller --example propagation -- [changes]`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use common::{DEADLINE, Running, cpu_mem, create_quota, options, set_local_usage, set_quota};
use e2e::bench::ms;
use e2e::{Fleet, FleetSpec, wait_for};
use futures::StreamExt;
use kkp_quota_crds::{Quantity, Resource, ResourceDetails, ResourceQuota};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::mpsc;

/// Forwards every version of `project-bench` seen on `client` as (cluster, time, object).
fn observe(
    cluster: &'static str,
    client: Client,
    tx: mpsc::UnboundedSender<(&'static str, Instant, ResourceQuota)>,
) {
    tokio::spawn(async move {
        let api: Api<ResourceQuota> = Api::all(client);
        let config = watcher::Config::default().fields("metadata.name=project-bench");
        let mut events = watcher::watcher(api, config)
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(event) = events.next().await {
            if let Ok(rq) = event
                && tx.send((cluster, Instant::now(), rq)).is_err()
            {
                return;
            }
        }
    });
}

/// Waits until `done` holds for every cluster in `clusters`; returns the time of the last
/// event needed.
async fn until(
    rx: &mut mpsc::UnboundedReceiver<(&'static str, Instant, ResourceQuota)>,
    clusters: &[&str],
    done: impl Fn(&ResourceQuota) -> bool,
) -> Result<Instant> {
    let mut pending: Vec<&str> = clusters.to_vec();
    let mut last = Instant::now();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !pending.is_empty() {
        let Ok(Some((cluster, at, rq))) = tokio::time::timeout_at(deadline, rx.recv()).await else {
            bail!("timed out; still waiting for {pending:?}");
        };
        if pending.contains(&cluster) && done(&rq) {
            pending.retain(|c| *c != cluster);
            last = at;
        }
    }
    Ok(last)
}

fn drain<T>(rx: &mut mpsc::UnboundedReceiver<T>) {
    while rx.try_recv().is_ok() {}
}

struct Stats {
    n: usize,
    median: Duration,
    p90: Duration,
    p99: Duration,
    max: Duration,
}

fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    let at = |q: f64| {
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let i = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
        samples[i]
    };
    Stats {
        n: samples.len(),
        median: at(0.5),
        p90: at(0.9),
        p99: at(0.99),
        max: samples[samples.len() - 1],
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines)] // one measurement run, top to bottom
async fn main() -> Result<()> {
    let changes: usize = std::env::args()
        .nth(1)
        .map_or(Ok(120), |a| a.parse())
        .context("changes")?;
    let fleet = Fleet::start(
        FleetSpec::empty()
            .with_seed("seed-a")
            .with_seed("seed-b")
            .with_project("bench"),
    )
    .await?;
    let controller = Running::start(fleet.master().client(), options()).await?;
    let master: Api<ResourceQuota> = Api::all(fleet.master().client());
    create_quota(&master, "project-bench", "bench", cpu_mem(1000, 1000)).await?;
    for seed in ["seed-a", "seed-b"] {
        let api: Api<ResourceQuota> = Api::all(fleet.seed(seed).client());
        wait_for(DEADLINE, "first copy", || async {
            api.get_opt("project-bench").await.ok().flatten()
        })
        .await?;
    }

    let (tx, mut rx) = mpsc::unbounded_channel();
    observe("master", fleet.master().client(), tx.clone());
    observe("seed-a", fleet.seed("seed-a").client(), tx.clone());
    observe("seed-b", fleet.seed("seed-b").client(), tx);

    // 1. Quota edits on the master → every seed copy.
    let mut edit = Vec::with_capacity(changes);
    for i in 0..changes {
        let cpu = Quantity::from_units(2000 + i64::try_from(i)?);
        drain(&mut rx);
        let quota = ResourceDetails {
            cpu: Some(cpu),
            memory: Some(Quantity::from_gibibytes(1000)),
            ..ResourceDetails::default()
        };
        let start = Instant::now();
        set_quota(&master, "project-bench", &quota).await?;
        let done = until(&mut rx, &["seed-a", "seed-b"], |rq| {
            rq.spec.quota.limits.amount(Resource::Cpu) == cpu
        })
        .await?;
        edit.push(done.duration_since(start));
    }

    // 2. localUsage on a seed → master globalUsage (alternating seeds).
    let mut usage = Vec::with_capacity(changes);
    let mut local = [0_i64, 0_i64];
    for i in 0..changes {
        let which = i % 2;
        local[which] = 100 + i64::try_from(i)?;
        let seed = ["seed-a", "seed-b"][which];
        let expected = Quantity::from_millis(local[0] + local[1]);
        drain(&mut rx);
        let start = Instant::now();
        set_local_usage(
            &fleet.seed(seed).client(),
            "project-bench",
            &ResourceDetails {
                cpu: Some(Quantity::from_millis(local[which])),
                ..ResourceDetails::default()
            },
        )
        .await?;
        let done = until(&mut rx, &["master"], |rq| {
            rq.status
                .as_ref()
                .and_then(|s| s.global_usage.as_ref())
                .is_some_and(|g| g.amount(Resource::Cpu) == expected)
        })
        .await?;
        usage.push(done.duration_since(start));
    }
    drop(controller);

    let (e, u) = (stats(edit), stats(usage));
    let mut out = String::new();
    writeln!(out, "# master-controller propagation latency\n")?;
    writeln!(
        out,
        "Measured by `cargo run -p master-controller --example propagation` on a real local fleet (master, seed-a, seed-b: \
         kube-apiserver + etcd each, loopback), controller in-process ({}), on a shared 2-core machine. Times come \
         from watch events on the observed cluster, one change at a time.\n",
        e2e::bench::profile(),
    )?;
    writeln!(out, "| path | changes | median | p90 | p99 | max |")?;
    writeln!(out, "| --- | --- | --- | --- | --- | --- |")?;
    for (name, s) in [
        ("quota edit on master → every seed copy (both seeds)", &e),
        ("seed localUsage change → master globalUsage", &u),
    ] {
        writeln!(
            out,
            "| {name} | {} | {} | {} | {} | {} |",
            s.n,
            ms(s.median),
            ms(s.p90),
            ms(s.p99),
            ms(s.max)
        )?;
    }
    writeln!(
        out,
        "\nTargets (DESIGN.md): quota edit → every seed p99 < 1 s; Machine → master globalUsage p99 < 2 s (this measures the master's part of that path)."
    )?;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("results/propagation.md");
    std::fs::create_dir_all(path.parent().context("no parent")?)?;
    std::fs::write(&path, &out)?;
    print!("{out}");
    drop(fleet);
    Ok(())
}
