//! The binary's flags ([`Args`], clap, each with an environment variable) and the [`Options`]
//! they make ([`Args::options`]); `main.rs` only parses, logs and runs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use kkp_quota_runtime::duration::parse_duration;
use kkp_quota_runtime::leader::LeaseConfig;

use crate::Options;

/// Fans project quotas out to every seed, folds seed usage into globalUsage, keeps the default
/// project quota.
#[derive(Parser, Debug)]
#[command(name = "master-controller", version)]
pub struct Args {
    /// Kubeconfig of the master cluster (default: KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long, env = "MASTER_CONTROLLER_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Namespace of the Seed objects (and their kubeconfig Secrets) on the master.
    #[arg(long, env = "MASTER_CONTROLLER_SEED_NAMESPACE", default_value = "kubermatic")]
    pub seed_namespace: String,
    /// Address of the /metrics, /healthz and /readyz server.
    #[arg(
        long,
        env = "MASTER_CONTROLLER_METRICS_ADDRESS",
        default_value = "0.0.0.0:8080"
    )]
    pub metrics_address: SocketAddr,
    /// Every quota is reconciled at least this often (a safety net; at least 1s).
    #[arg(long, env = "MASTER_CONTROLLER_RESYNC_PERIOD", default_value = "1m", value_parser = parse_duration)]
    pub resync_period: Duration,
    /// Namespace of the leader-election Lease.
    #[arg(
        long,
        env = "MASTER_CONTROLLER_LEADER_ELECTION_NAMESPACE",
        default_value = "kubermatic"
    )]
    pub leader_election_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(
        long,
        env = "MASTER_CONTROLLER_LEASE_NAME",
        default_value = "kkp-quota-master-controller"
    )]
    pub lease_name: String,
    /// This replica's identity in the Lease (default: `$POD_NAME`, else host name and pid).
    #[arg(long, env = "MASTER_CONTROLLER_IDENTITY")]
    pub identity: Option<String>,
    /// Run without leader election (only ever one replica).
    #[arg(long, env = "MASTER_CONTROLLER_NO_LEADER_ELECTION")]
    pub no_leader_election: bool,
    /// Quotas reconciled concurrently; the others wait their turn in the order they were asked
    /// for.
    #[arg(long, env = "MASTER_CONTROLLER_CONCURRENCY", default_value_t = 16)]
    pub concurrency: u16,
    /// Per limited resource, the percent of the limit a seed may keep idle above what it
    /// committed before the master asks for it back when another seed needs share.
    #[arg(
        long,
        env = "MASTER_CONTROLLER_SHARE_SLACK_PERCENT",
        default_value_t = 10,
        value_parser = clap::value_parser!(u32).range(0..=100)
    )]
    pub share_slack_percent: u32,
    /// Time without a watch event after which a seed's API server is asked whether it still
    /// answers, and how long it has to answer before the seed counts as unreachable (at least 1s).
    #[arg(
        long,
        env = "MASTER_CONTROLLER_SEED_PROBE",
        default_value = "10s",
        value_parser = parse_duration
    )]
    pub seed_probe: Duration,
    /// Read each seed's kubeconfig from the Secret of this name in --seed-namespace, `{seed}`
    /// replaced by the seed's name (e.g. `kkp-quota-seed-{seed}`), instead of from the `Seed`'s
    /// `spec.kubeconfig`: a least-privilege credential for the master on each seed.
    #[arg(long, env = "MASTER_CONTROLLER_SEED_KUBECONFIG_SECRET", value_parser = seed_secret_template)]
    pub seed_kubeconfig_secret: Option<String>,
    /// Seeds gone for good with every Machine of their user clusters (comma-separated names):
    /// once one is no longer among the `Seed`s, the share it held returns to every quota. Name a
    /// seed here only when its Machines are known to be gone; a listed seed is never forgotten.
    #[arg(long, env = "MASTER_CONTROLLER_GONE_SEEDS", value_delimiter = ',')]
    pub gone_seeds: Vec<String>,
    /// Seeds being drained before they leave the fleet (comma-separated names): they get no
    /// more share and hand back all they do not use; once one uses nothing, every quota's
    /// record forgets it, so it can then be removed without `--gone-seeds`. Its user clusters
    /// can create no Machines meanwhile.
    #[arg(long, env = "MASTER_CONTROLLER_DRAINING_SEEDS", value_delimiter = ',')]
    pub draining_seeds: Vec<String>,
    /// Serving certificate (PEM) of the allocation webhook (docs/groups.md, "Allocation
    /// mode"), re-read when the file changes; without it and --tls-key-file the webhook is not
    /// served.
    #[arg(long, env = "MASTER_CONTROLLER_TLS_CERT_FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, env = "MASTER_CONTROLLER_TLS_KEY_FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
    /// Address of the allocation webhook's HTTPS server.
    #[arg(
        long,
        env = "MASTER_CONTROLLER_WEBHOOK_ADDRESS",
        default_value = "0.0.0.0:8443"
    )]
    pub webhook_address: SocketAddr,
    /// Namespace of the allocation webhook's record of allowed raises (`ConfigMap`
    /// kkp-quota-allocation-record), shared by every replica.
    #[arg(
        long,
        env = "MASTER_CONTROLLER_WEBHOOK_NAMESPACE",
        default_value = "kubermatic"
    )]
    pub webhook_namespace: String,
    /// Log JSON lines instead of human-readable text.
    #[arg(long, env = "MASTER_CONTROLLER_LOG_JSON")]
    pub log_json: bool,
}

/// Seed names from a comma-separated flag, blanks dropped.
fn names(flag: &[String]) -> std::collections::BTreeSet<String> {
    flag.iter()
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

impl Args {
    /// Where the allocation webhook is served, when it is.
    pub fn allocation_webhook(&self) -> Option<crate::allocation::server::Serving> {
        Some(crate::allocation::server::Serving {
            address: self.webhook_address,
            namespace: self.webhook_namespace.clone(),
            cert: self.tls_cert_file.clone()?,
            key: self.tls_key_file.clone()?,
        })
    }

    /// What the controller runs with.
    pub fn options(&self) -> Options {
        let mut options = Options::new(self.seed_namespace.clone());
        options.resync_period = self.resync_period.max(Duration::from_secs(1));
        options.concurrency = self.concurrency.max(1);
        options.share_slack_percent = self.share_slack_percent;
        options.seed_probe_every = self.seed_probe.max(Duration::from_secs(1));
        options
            .seed_kubeconfig_secret
            .clone_from(&self.seed_kubeconfig_secret);
        options.gone_seeds = names(&self.gone_seeds);
        options.draining_seeds = names(&self.draining_seeds);
        options.allocation_webhook = self.allocation_webhook().is_some();
        if !self.no_leader_election {
            options.lease = Some(LeaseConfig::new(
                self.leader_election_namespace.clone(),
                self.lease_name.clone(),
                self.identity
                    .clone()
                    .unwrap_or_else(LeaseConfig::default_identity),
            ));
        }
        options
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_make_the_options() {
        let args = Args::try_parse_from([
            "master-controller",
            "--seed-namespace",
            "kkp",
            "--resync-period",
            "0s",
            "--seed-probe",
            "3s",
            "--gone-seeds",
            "a, ,b",
            "--no-leader-election",
        ])
        .unwrap();
        let options = args.options();
        assert_eq!(options.seed_namespace, "kkp");
        assert_eq!(options.resync_period, Duration::from_secs(1));
        assert_eq!(options.seed_probe_every, Duration::from_secs(3));
        assert_eq!(options.gone_seeds.len(), 2);
        assert!(options.lease.is_none());
        assert!(Args::try_parse_from(["master-controller", "--seed-kubeconfig-secret", "fixed"]).is_err());
        assert!(args.allocation_webhook().is_none());
        assert!(Args::try_parse_from(["master-controller", "--tls-cert-file", "c.pem"]).is_err());
        let serving = Args::try_parse_from([
            "master-controller",
            "--tls-cert-file",
            "c.pem",
            "--tls-key-file",
            "k.pem",
        ])
        .unwrap()
        .allocation_webhook()
        .unwrap();
        assert_eq!(serving.key, PathBuf::from("k.pem"));
    }
}
