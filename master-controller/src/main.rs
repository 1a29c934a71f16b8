//! The master-controller binary: flags, logging, the ops server, then [`master_controller::run`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use kkp_quota_runtime::kubeconfig::own_client;
use kkp_quota_runtime::leader::LeaseConfig;
use kkp_quota_runtime::ops::Readiness;
use kkp_quota_runtime::telemetry::init_tracing;
use master_controller::{Metrics, Options};

/// Fans project quotas out to every seed, folds seed usage into globalUsage, keeps the default
/// project quota.
#[derive(Parser, Debug)]
#[command(name = "master-controller", version)]
struct Args {
    /// Kubeconfig of the master cluster (default: KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long, env = "MASTER_CONTROLLER_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Namespace of the Seed objects (and their kubeconfig Secrets) on the master.
    #[arg(long, env = "MASTER_CONTROLLER_SEED_NAMESPACE", default_value = "kubermatic")]
    seed_namespace: String,
    /// Address of the /metrics, /healthz and /readyz server.
    #[arg(
        long,
        env = "MASTER_CONTROLLER_METRICS_ADDRESS",
        default_value = "0.0.0.0:8080"
    )]
    metrics_address: SocketAddr,
    /// Every quota is reconciled at least this often, in seconds (a safety net).
    #[arg(long, env = "MASTER_CONTROLLER_RESYNC_PERIOD", default_value_t = 60)]
    resync_period: u64,
    /// Namespace of the leader-election Lease.
    #[arg(
        long,
        env = "MASTER_CONTROLLER_LEADER_ELECTION_NAMESPACE",
        default_value = "kubermatic"
    )]
    leader_election_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(
        long,
        env = "MASTER_CONTROLLER_LEASE_NAME",
        default_value = "kkp-quota-master-controller"
    )]
    lease_name: String,
    /// This replica's identity in the Lease (default: `$POD_NAME`, else host name and pid).
    #[arg(long, env = "MASTER_CONTROLLER_IDENTITY")]
    identity: Option<String>,
    /// Run without leader election (only ever one replica).
    #[arg(long, env = "MASTER_CONTROLLER_NO_LEADER_ELECTION")]
    no_leader_election: bool,
    /// Quotas reconciled concurrently.
    #[arg(long, env = "MASTER_CONTROLLER_CONCURRENCY", default_value_t = 16)]
    concurrency: u16,
    /// Per limited resource, the percent of the limit a seed may keep idle above what it
    /// committed before the master asks for it back when another seed needs share.
    #[arg(
        long,
        env = "MASTER_CONTROLLER_SHARE_SLACK_PERCENT",
        default_value_t = 10,
        value_parser = clap::value_parser!(u32).range(0..=100)
    )]
    share_slack_percent: u32,
    /// Seconds without a watch event after which a seed's API server is asked whether it still
    /// answers, and how long it has to answer before the seed counts as unreachable.
    #[arg(
        long,
        env = "MASTER_CONTROLLER_SEED_PROBE_SECONDS",
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    seed_probe_seconds: u64,
    /// Read each seed's kubeconfig from the Secret of this name in --seed-namespace, `{seed}`
    /// replaced by the seed's name (e.g. `kkp-quota-seed-{seed}`), instead of from the `Seed`'s
    /// `spec.kubeconfig`: a least-privilege credential for the master on each seed.
    #[arg(long, env = "MASTER_CONTROLLER_SEED_KUBECONFIG_SECRET", value_parser = seed_secret_template)]
    seed_kubeconfig_secret: Option<String>,
    /// Seeds gone for good with every Machine of their user clusters (comma-separated names):
    /// once one is no longer among the `Seed`s, the share it held returns to every quota. Name a
    /// seed here only when its Machines are known to be gone; a listed seed is never forgotten.
    #[arg(long, env = "MASTER_CONTROLLER_GONE_SEEDS", value_delimiter = ',')]
    gone_seeds: Vec<String>,
    /// Seeds being drained before they leave the fleet (comma-separated names): they get no
    /// more share and hand back all they do not use; once one uses nothing, every quota's
    /// record forgets it, so it can then be removed without `--gone-seeds`. Its user clusters
    /// can create no Machines meanwhile.
    #[arg(long, env = "MASTER_CONTROLLER_DRAINING_SEEDS", value_delimiter = ',')]
    draining_seeds: Vec<String>,
    /// Log JSON lines instead of human-readable text.
    #[arg(long, env = "MASTER_CONTROLLER_LOG_JSON")]
    log_json: bool,
}

/// Seed names from a comma-separated flag, blanks dropped.
fn names(flag: Vec<String>) -> std::collections::BTreeSet<String> {
    flag.into_iter()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

/// A Secret name template must name a different Secret per seed.
fn seed_secret_template(value: &str) -> Result<String, String> {
    if value.contains("{seed}") {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "{value:?} does not contain {{seed}}: every seed needs its own Secret"
        ))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    init_tracing(args.log_json);
    let client = own_client(args.kubeconfig.as_deref())
        .await
        .context("building the master client")?;
    let metrics = Metrics::new();
    let readiness = Readiness::default();
    let (address, serve) = metrics
        .bind_ops(args.metrics_address, readiness.clone())
        .await
        .context("binding the metrics address")?;
    tracing::info!(%address, "serving /metrics, /healthz, /readyz");
    tokio::spawn(serve);
    let mut options = Options::new(args.seed_namespace);
    options.resync_period = Duration::from_secs(args.resync_period.max(1));
    options.concurrency = args.concurrency.max(1);
    options.share_slack_percent = args.share_slack_percent;
    options.seed_probe_every = Duration::from_secs(args.seed_probe_seconds);
    options.seed_kubeconfig_secret = args.seed_kubeconfig_secret;
    options.gone_seeds = names(args.gone_seeds);
    options.draining_seeds = names(args.draining_seeds);
    if !args.no_leader_election {
        options.lease = Some(LeaseConfig::new(
            args.leader_election_namespace,
            args.lease_name,
            args.identity.unwrap_or_else(LeaseConfig::default_identity),
        ));
    }
    let shutdown = async {
        let signal = kkp_quota_runtime::shutdown_signal().await;
        tracing::info!(signal, "stopping");
    };
    master_controller::run_until(client, options, metrics, readiness, shutdown)
        .await
        .context("master-controller stopped")
}
