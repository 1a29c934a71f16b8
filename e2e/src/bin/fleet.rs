//! `make demo`: starts the default fleet, writes every kubeconfig and `fleet.json` into `--dir`,
//! prints `fleet ready: <dir>` on stdout, and runs until SIGINT or SIGTERM, then tears down.
//! Logs go to stderr (`RUST_LOG`, default `info`).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use clap::Parser;
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
}

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
    let fleet = tokio::select! {
        fleet = Fleet::start(FleetSpec::default()) => fleet?,
        signal = &mut shutdown => {
            tracing::info!(signal, "interrupted during startup; stopped");
            return Ok(());
        }
    };
    let elapsed = started.elapsed();
    fleet.write_dir(&args.dir)?;
    let credentials = Credentials::for_fleet(&fleet, &args.dir, args.chart_rbac).await?;
    let running = tokio::select! {
        system = System::start_as(&fleet, &args.dir, &[], &credentials) => system?,
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
    demo::write_demo_project(&fleet).await?;
    // Ready means a user's first create is decided against the quota, not refused while
    // seed-controller has yet to count the new ledgers.
    demo::wait_in_force(&fleet, "demo", std::time::Duration::from_mins(2)).await?;
    tracing::info!(
        "demo project `demo` has a quota of {} (kubectl --kubeconfig {dir}/master.kubeconfig get pquota); \
         try `kubectl --kubeconfig {dir}/alpha.kubeconfig apply -f deploy/examples/machine-small.yaml` (admitted) and \
         `... -f deploy/examples/machine-too-big.yaml` (refused with the reason)",
        demo::DEMO_QUOTA,
        dir = args.dir.display()
    );
    let rss_mib = e2e::bench::mib(fleet.rss_bytes());
    tracing::info!(
        clusters = fleet.members().len(),
        processes = fleet.pids().len(),
        startup = ?elapsed,
        rss_mib = format!("{rss_mib:.0}"),
        "fleet started"
    );
    println!("fleet ready: {}", args.dir.display());

    // Until stopped: a component that exits is reported at once, with the end of its log (nothing
    // restarts it here, unlike in a cluster).
    let mut running = running;
    let mut reported = std::collections::BTreeSet::new();
    let mut check = tokio::time::interval(std::time::Duration::from_secs(1));
    let signal = loop {
        tokio::select! {
            signal = &mut shutdown => break signal,
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
    };
    tracing::info!(signal, "tearing down");
    drop(running);
    for file in fleet.dir_files(&args.dir) {
        let _ = std::fs::remove_file(file);
    }
    drop(fleet);
    tracing::info!("fleet stopped");
    Ok(())
}
