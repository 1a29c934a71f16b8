//! `make demo`: starts the default fleet, writes every kubeconfig and `fleet.json` into `--dir`,
//! prints `fleet ready: <dir>` on stdout, and runs until SIGINT or SIGTERM, then tears down.
//! With `--node` (`make demo NODE=1`), seed-a gets a real node and its half of the system runs
//! there as pods from the Helm chart.
//! Logs go to stderr (`RUST_LOG`, default `info`).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use clap::Parser;
use e2e::node::{self, Node, NodeHost, chart};
use e2e::system::{Credentials, System};
use e2e::{Fleet, FleetSpec, demo};
use tokio::signal::unix::{SignalKind, signal};

#[derive(Parser)]
#[command(about = "A local KKP-shaped fleet of real kube-apiservers (master, seeds, user clusters)")]
struct Args {
    /// Where to write `<cluster>.kubeconfig` and `fleet.json`.
    #[arg(long, default_value = ".fleet")]
    dir: PathBuf,
    /// Run every component as its service account from the Helm chart (deploy/charts/kkp-quota),
    /// with only the chart's RBAC, instead of as the fleet's admin: what you try is what you
    /// install. Needs helm (built and cached by e2e/helm/build.sh).
    #[arg(long, env = "KKP_QUOTA_CHART_RBAC")]
    chart_rbac: bool,
    /// Give seed-a a real node (containerd, kubelet, kube-proxy; needs root and the packages of
    /// .ci/system-deps.sh) and run its seed-controller and machine-webhook there as pods:
    /// `make images`, imported into the node, then `helm install --set role=seed`. The other
    /// components run as processes. The machine is put back as it was on exit.
    #[arg(long, env = "KKP_QUOTA_NODE", conflicts_with = "chart_rbac")]
    node: bool,
}

/// The seed whose components run as pods with `--node`.
const NODE_SEED: &str = "seed-a";

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("info,kube_client::client::builder=off")
            }),
        )
        .init();
    let args = Args::parse();

    // Listen for signals before starting anything, so an interrupt during startup also tears down.
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut shutdown = Box::pin(async move {
        tokio::select! {
            _ = sigint.recv() => "SIGINT",
            _ = sigterm.recv() => "SIGTERM",
        }
    });

    let started = Instant::now();
    let (host, spec) = if args.node {
        let spec = demo_spec().with_pod_address(node::NODE_ADDRESS);
        (Some(node::NodeHost::prepare()?), spec)
    } else {
        (None, demo_spec())
    };
    let fleet = tokio::select! {
        fleet = Fleet::start(spec) => fleet?,
        signal = &mut shutdown => {
            tracing::info!(signal, "interrupted during startup; stopped");
            return Ok(());
        }
    };
    let elapsed = started.elapsed();
    fleet.write_dir(&args.dir)?;
    let credentials = Credentials::for_fleet(&fleet, &args.dir, args.chart_rbac).await?;
    let node = match host {
        Some(host) => tokio::select! {
            node = seed_on_a_node(host, &fleet) => Some(node?),
            signal = &mut shutdown => {
                tracing::info!(signal, "interrupted during startup; stopped");
                return Ok(());
            }
        },
        None => None,
    };
    let on_pods: &[&str] = if node.is_some() { &[NODE_SEED] } else { &[] };
    let running = tokio::select! {
        system = System::start_except(&fleet, &args.dir, &[], &credentials, on_pods) => system?,
        signal = &mut shutdown => {
            tracing::info!(signal, "interrupted during startup; stopped");
            return Ok(());
        }
    };
    for component in &running.components {
        tracing::info!(
            component = component.name,
            metrics = %component.metrics_address,
            log = %component.log.display(),
            "component ready"
        );
    }
    write_demo(&fleet, &running, &args.dir).await?;
    let rss_mib = e2e::bench::mib(fleet.rss_bytes());
    tracing::info!(
        clusters = fleet.members().len(),
        processes = fleet.pids().len(),
        startup = ?elapsed,
        rss_mib = format!("{rss_mib:.0}"),
        "fleet started"
    );
    println!("fleet ready: {}", args.dir.display());

    let mut running = running;
    let signal = report_exits_until(&mut running, &mut shutdown).await;
    tracing::info!(signal, "tearing down");
    drop(running);
    if let Some(node) = node {
        match node.teardown() {
            Ok(left) if left.is_empty() => tracing::info!("node stopped; the machine is as it was"),
            Ok(left) => tracing::error!(?left, "node stopped, but the machine is not as it was"),
            Err(e) => tracing::error!("node teardown: {e:#}"),
        }
    }
    for file in fleet.dir_files(&args.dir) {
        let _ = std::fs::remove_file(file);
    }
    drop(fleet);
    tracing::info!("fleet stopped");
    Ok(())
}

/// seed-a's node, with the seed role of the chart installed and rolled out on it.
async fn seed_on_a_node(host: NodeHost, fleet: &Fleet) -> Result<Node> {
    let seed = fleet.seed(NODE_SEED);
    let node = host.start(seed).await?;
    chart::import_seed_images(&node)?;
    chart::install_seed(seed, NODE_SEED, &[])?;
    for component in chart::SEED_COMPONENTS {
        chart::wait_rolled_out(&seed.client(), component, std::time::Duration::from_mins(3)).await?;
    }
    tracing::info!(
        node = node::NODE_NAME,
        dir = %node.dir().display(),
        "{NODE_SEED}'s seed-controller and machine-webhook run as pods (kubectl -n {} get pods)",
        chart::NAMESPACE
    );
    Ok(node)
}

/// Until `shutdown` resolves (its signal is returned): a component that exits is reported at
/// once, with the end of its log (nothing restarts it here, unlike in a cluster).
async fn report_exits_until(
    running: &mut System,
    shutdown: &mut (impl std::future::Future<Output = &'static str> + Unpin),
) -> &'static str {
    let mut reported = std::collections::BTreeSet::new();
    let mut check = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tokio::select! {
            signal = &mut *shutdown => return signal,
            _ = check.tick() => {
                for component in &mut running.components {
                    if reported.contains(&component.name) {
                        continue;
                    }
                    if let Some(status) = component.exit_status() {
                        reported.insert(component.name.clone());
                        let log = std::fs::read_to_string(&component.log).unwrap_or_default();
                        let tail: Vec<&str> = log.lines().rev().take(20).collect();
                        tracing::error!(
                            component = component.name,
                            %status,
                            log = %component.log.display(),
                            "component exited; the system is incomplete. Last lines of its log:\n{}",
                            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                        );
                    }
                }
            }
        }
    }
}

/// The fleet the demo runs: [`FleetSpec::default`], with a user cluster for project `other`
/// (`delta` on seed-b), so that the shared group over `demo` and `other` has both at work.
fn demo_spec() -> FleetSpec {
    FleetSpec::default().with_user_cluster("delta", "seed-b", "other")
}

/// The demo project's quota (in force before this returns) and the demo's quota groups, each
/// with a log line saying what to try.
async fn write_demo(fleet: &Fleet, running: &System, dir: &std::path::Path) -> Result<()> {
    demo::write_demo_project(fleet).await?;
    // Ready means a user's first create is decided against the quota, not refused while
    // seed-controller has yet to count the new ledgers.
    demo::wait_in_force(fleet, "demo", std::time::Duration::from_mins(2)).await?;
    let ca = std::fs::read_to_string(&running.webhook_ca)?;
    demo::write_demo_group(fleet, running.allocation_webhook, &ca).await?;
    tracing::info!(
        "quota group `{}` allocates 32 cpu and 128Gi to projects demo and other (kubectl --kubeconfig {dir}/master.kubeconfig get qgroup -o wide); \
         raising their quotas past it is refused",
        demo::DEMO_GROUP,
        dir = dir.display()
    );
    demo::write_demo_shared_group(fleet).await?;
    tracing::info!(
        "quota group `{}` lets demo and other run {} cpu together over every seed; other's user cluster is `delta` \
         (kubectl --kubeconfig {dir}/delta.kubeconfig apply -f deploy/examples/machine-small.yaml)",
        demo::DEMO_SHARED_GROUP,
        demo::DEMO_SHARED_CPU,
        dir = dir.display()
    );
    tracing::info!(
        "demo project `demo` has a quota of {} (kubectl --kubeconfig {dir}/master.kubeconfig get pquota); \
         try `kubectl --kubeconfig {dir}/alpha.kubeconfig apply -f deploy/examples/machine-small.yaml` (admitted) and \
         `... -f deploy/examples/machine-too-big.yaml` (refused with the reason)",
        demo::DEMO_QUOTA,
        dir = dir.display()
    );
    Ok(())
}
