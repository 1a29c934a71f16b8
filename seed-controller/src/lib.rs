//! seed-controller: counts every user cluster's Machines on one seed.
//!
//! - [`clusters`]: `Cluster` objects on the seed -> one Machine watch per user cluster (admin
//!   kubeconfig from the cluster's namespace), following additions, deletions and kubeconfig
//!   rotation; a dead cluster keeps its last usage and is reported.
//! - [`catalog`]: the admin size catalog `ConfigMap`, watched and reloaded.
//! - [`machine_set_watch`]: each user cluster's `MachineSet`s (which deployment a Machine is of,
//!   for the policy `reservedCounts`).
//! - [`usage`] and [`ledger`]: the pure arithmetic and the reservation upkeep decisions.
//! - [`shares`]: the pure share decisions (release, expired demands, quiet).
//! - [`state`]: the in-memory picture the watches update and the writer snapshots.
//! - [`writer`]: `Cluster.status.resourceUsage` and the seed quota copy's `localUsage` (with the
//!   dropped reservations, expired allotments and demands, and the share released, in one
//!   compare-and-swap write).
//! - [`webhook_config`]: the `ValidatingWebhookConfiguration` kept in every user cluster.
//! - [`view`]: the users' read-only `QuotaView` of their project's quota in every user cluster.
//!
//! [`Controller`] ties them together; [`run`] adds the ops server and leader election.

pub mod catalog;
pub mod clusters;
pub mod ledger;
pub mod machine_set_watch;
pub mod metrics;
pub mod shares;
pub mod state;
pub mod succession;
pub mod usage;
pub mod view;
pub mod webhook_cert;
pub mod webhook_config;
pub mod writer;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kkp_quota_runtime::RuntimeError;
use kkp_quota_runtime::kubeconfig::own_client;
use kkp_quota_runtime::leader::{LeaderElector, LeaseConfig};
use kkp_quota_runtime::ops::{Readiness, bind};
use provider_sizes::SizeCatalog;
use tokio::sync::Notify;
use tokio_util::task::AbortOnDropHandle;
use tracing::{info, warn};

pub use metrics::Metrics;
pub use state::{CONDITION_TYPE, REASON_COUNTED_AT_LAST_SIZE, REASON_UNADMITTED, REASON_UNSIZEABLE};

/// Why the controller failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("kubernetes API error: {0}")]
    Kube(#[from] kube::Error),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("usage arithmetic: {0}")]
    Quantity(#[from] kkp_quota_crds::QuantityError),
    #[error("reading {path}: {source}")]
    ReadFile { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("URL-signing keys: {0}")]
    Keys(#[from] kkp_quota_runtime::webhook_auth::KeyError),
    #[error("the quota ledger of project {project} kept changing during {attempts} write attempts")]
    LedgerKeptChanging { project: String, attempts: usize },
    /// One of the controller's loops ended (`returned`: without a panic).
    #[error("{task} stopped: {}", .panic.as_deref().unwrap_or("returned"))]
    Stopped {
        task: &'static str,
        panic: Option<String>,
    },
}

/// Flags that do not go together.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--webhook-certificate-secret needs --webhook-certificate-dns-names")]
    CertificateWithoutDnsNames,
    #[error("--webhook-certificate-overlap must be under half of --webhook-certificate-validity")]
    CertificateOverlapTooLong,
    #[error("--webhook-url {0:?} must be an https:// URL")]
    WebhookUrlNotHttps(String),
    #[error(
        "--webhook-url needs --url-signing-keys (the file machine-webhook verifies with), or --insecure-no-auth"
    )]
    WebhookUrlWithoutKeys,
}

use kkp_quota_runtime::duration::parse_duration;

/// The flags (each with an environment variable fallback).
// Flags: each bool is an independent switch on the command line.
#[allow(clippy::struct_excessive_bools)]
#[derive(clap::Parser, Debug, Clone)]
#[command(
    name = "seed-controller",
    version,
    about = "Counts user clusters' Machines into the seed's quota usage (QuotaLedger and KKP's ResourceQuota) on one seed"
)]
pub struct Config {
    /// Kubeconfig of the seed (default: KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long, env = "SEED_CONTROLLER_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Name of this seed (logs, lease identity).
    #[arg(long, env = "SEED_CONTROLLER_SEED_NAME", default_value = "seed")]
    pub seed_name: String,
    /// KKP's namespace on the seed (size catalog `ConfigMap`, leader `Lease`).
    #[arg(
        long,
        env = "SEED_CONTROLLER_KUBERMATIC_NAMESPACE",
        default_value = "kubermatic"
    )]
    pub kubermatic_namespace: String,
    /// Namespace of the Machines in every user cluster.
    #[arg(
        long,
        env = "SEED_CONTROLLER_MACHINE_NAMESPACE",
        default_value = "kube-system"
    )]
    pub machine_namespace: String,
    /// Take each user cluster's Machine namespace from its kubeconfig's context instead of
    /// --machine-namespace (for simulated fleets where many clusters share one apiserver).
    #[arg(long, env = "SEED_CONTROLLER_MACHINE_NAMESPACE_FROM_KUBECONFIG")]
    pub machine_namespace_from_kubeconfig: bool,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "SEED_CONTROLLER_METRICS_ADDRESS", default_value = "0.0.0.0:8085")]
    pub metrics_address: SocketAddr,
    /// How often every user cluster's Machines are listed again (safety-net recount) and every
    /// usage is rewritten if it differs.
    #[arg(long, env = "SEED_CONTROLLER_RESYNC_PERIOD", default_value = "5m", value_parser = parse_duration)]
    pub resync_period: Duration,
    /// Admission reservations whose Machine has not appeared after this long are dropped (never
    /// while the Machine's user cluster is unreachable).
    #[arg(long, env = "SEED_CONTROLLER_RESERVATION_TTL", default_value = "2m", value_parser = parse_duration)]
    pub reservation_ttl: Duration,
    /// While a project's quota copy has allotments (headroom held by webhook processes), a
    /// Machine that appears without a reservation is neither counted nor judged for bypass for
    /// this long: it may have been admitted from an allotment (which covers it) and be recorded
    /// as a reservation a moment later. Counted, and flagged as unadmitted, after it.
    #[arg(long, env = "SEED_CONTROLLER_ADMISSION_RECORD_GRACE", default_value = "5s", value_parser = parse_duration)]
    pub admission_record_grace: Duration,
    /// Per-seed shares (docs/shares.md): a ledger with no live demand and no sign of admissions
    /// (reservations, allotments, live demands, `localUsage` growing) for this long is quiet, and
    /// releases its share above `committed + slack`.
    #[arg(long, env = "SEED_CONTROLLER_SHARE_QUIET_PERIOD", default_value = "30s", value_parser = parse_duration)]
    pub share_quiet_period: Duration,
    /// The slack a quiet seed keeps above what it has committed: this percentage of each limited
    /// resource of the quota (rounded up to a millicore, a byte, a GPU, a Machine).
    #[arg(long, env = "SEED_CONTROLLER_SHARE_SLACK_PERCENT", default_value_t = 10, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub share_slack_percent: u32,
    /// Base URL of the machine-webhook (https://host:port). When set, every user cluster gets the
    /// `ValidatingWebhookConfiguration` `kkp-quota-machines` pointing at
    /// `<url>/validate/machines/<cluster>`.
    #[arg(long, env = "SEED_CONTROLLER_WEBHOOK_URL")]
    pub webhook_url: Option<String>,
    /// Which Machine operations reach the webhook: `create-and-update` (a spec-changing UPDATE
    /// is checked too) or `create` (CREATE only: no UPDATE costs the user clusters' API servers
    /// anything, but a Machine whose spec is edited in place is counted, never checked; only
    /// where Machine specs cannot change, as KKP's machine-controller enforces unless its bypass
    /// annotation is set).
    #[arg(
        long,
        env = "SEED_CONTROLLER_WEBHOOK_OPERATIONS",
        value_enum,
        default_value_t = webhook_config::Operations::CreateAndUpdate
    )]
    pub webhook_operations: webhook_config::Operations,
    /// With --webhook-url: register `kkp-quota-clusters` on the seed, which sends every KKP
    /// `Cluster` create to `<url>/validate/clusters/<seed-name>` to be checked against its
    /// project's `clusters` limit (docs/capacity.md). Like the Machine webhook it fails closed:
    /// while no webhook answers, no `Cluster` can be created on the seed.
    #[arg(long, env = "SEED_CONTROLLER_CLUSTER_WEBHOOK", default_value_t = true, action = clap::ArgAction::Set)]
    pub cluster_webhook: bool,
    /// PEM CA bundle the user clusters' apiservers use to verify the webhook.
    #[arg(long, env = "SEED_CONTROLLER_WEBHOOK_CA_FILE", requires = "webhook_url")]
    pub webhook_ca_file: Option<PathBuf>,
    /// File of URL-signing keys shared with machine-webhook (base64, one per line; the first
    /// signs). Each user cluster's webhook URL carries `<cluster>/<token>`, the token an HMAC of
    /// the cluster's name and UID; when the first key changes, every configuration is rewritten.
    /// Required with --webhook-url unless --insecure-no-auth.
    #[arg(long, env = "SEED_CONTROLLER_URL_SIGNING_KEYS")]
    pub url_signing_keys: Option<PathBuf>,
    /// Write webhook URLs without a token (for a machine-webhook run with --insecure-no-auth).
    #[arg(
        long,
        env = "SEED_CONTROLLER_INSECURE_NO_AUTH",
        conflicts_with = "url_signing_keys"
    )]
    pub insecure_no_auth: bool,
    /// Manage the webhook's serving certificate in this Secret (it must exist; the chart
    /// creates it empty): a CA and a certificate for --webhook-certificate-dns-names, rotated
    /// in two steps (see `webhook_cert`). Mount it into machine-webhook (`tls.crt`, `tls.key`)
    /// and into seed-controller (`ca.crt`, as --webhook-ca-file).
    #[arg(
        long,
        env = "SEED_CONTROLLER_WEBHOOK_CERTIFICATE_SECRET",
        requires = "webhook_certificate_dns_names"
    )]
    pub webhook_certificate_secret: Option<String>,
    /// Namespace of --webhook-certificate-secret (default: --kubermatic-namespace).
    #[arg(long, env = "SEED_CONTROLLER_WEBHOOK_CERTIFICATE_NAMESPACE")]
    pub webhook_certificate_namespace: Option<String>,
    /// The DNS names the webhook's certificate is for (comma-separated), e.g. its Service's
    /// `<name>.<namespace>.svc`.
    #[arg(
        long,
        env = "SEED_CONTROLLER_WEBHOOK_CERTIFICATE_DNS_NAMES",
        value_delimiter = ','
    )]
    pub webhook_certificate_dns_names: Vec<String>,
    /// Lifetime of each self-managed CA and certificate; the next is made after two thirds.
    #[arg(long, env = "SEED_CONTROLLER_WEBHOOK_CERTIFICATE_VALIDITY", default_value = "2160h", value_parser = parse_duration)]
    pub webhook_certificate_validity: Duration,
    /// How long a new certificate's CA is trusted before the certificate is served: longer than
    /// a mounted Secret takes to reach every pod (the kubelet syncs about every minute), plus
    /// the second seed-controller takes to notice the new CA in its file.
    #[arg(long, env = "SEED_CONTROLLER_WEBHOOK_CERTIFICATE_OVERLAP", default_value = "10m", value_parser = parse_duration)]
    pub webhook_certificate_overlap: Duration,
    /// Run only while holding the leader Lease (several replicas may run).
    #[arg(long, env = "SEED_CONTROLLER_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Namespace of the leader Lease (default: --kubermatic-namespace).
    #[arg(long, env = "SEED_CONTROLLER_LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,
    /// Name of the leader Lease.
    #[arg(
        long,
        env = "SEED_CONTROLLER_LEADER_ELECTION_ID",
        default_value = "kkp-quota-seed-controller"
    )]
    pub leader_election_id: String,
    /// How long a lease holder may go without renewing before another replica takes over.
    #[arg(long, env = "SEED_CONTROLLER_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,
    /// Timeout of one request to a user cluster (listings, Events, webhook configuration).
    #[arg(long, env = "SEED_CONTROLLER_USER_CLUSTER_TIMEOUT", default_value = "15s", value_parser = parse_duration)]
    pub user_cluster_timeout: Duration,
    /// Log JSON lines instead of text.
    #[arg(long, env = "SEED_CONTROLLER_LOG_JSON")]
    pub log_json: bool,
    /// Keep a read-only `QuotaView` of its project's quota in every user cluster (installs the
    /// CRD and a `ClusterRole` that lets every authenticated user read it).
    #[arg(long, env = "SEED_CONTROLLER_QUOTA_VIEW", default_value_t = true, action = clap::ArgAction::Set)]
    pub quota_view: bool,
}

impl Config {
    /// The share settings.
    pub fn shares(&self) -> shares::Settings {
        shares::Settings {
            quiet_period: jiff::SignedDuration::try_from(self.share_quiet_period)
                .unwrap_or(jiff::SignedDuration::MAX),
            slack_percent: self.share_slack_percent,
        }
    }

    /// Defaults for tests and embedding: no leader election, ops on a free loopback port.
    pub fn for_tests(seed_name: &str) -> Config {
        <Config as clap::Parser>::parse_from([
            "seed-controller",
            "--seed-name",
            seed_name,
            "--leader-elect=false",
            "--metrics-address",
            "127.0.0.1:0",
            // Tests that serve the seed's Cluster path turn it on.
            "--cluster-webhook=false",
        ])
    }
}

/// What every task of the controller shares.
pub struct Shared {
    pub config: Config,
    pub seed: kube::Client,
    pub metrics: Metrics,
    pub readiness: Readiness,
    state: Mutex<state::State>,
    /// Wakes the writer after a change.
    pub notify: Notify,
    /// Bumped whenever a user cluster's quota view may change (`crate::view`).
    pub views: tokio::sync::watch::Sender<u64>,
    /// The webhook CA bundle (PEM) as last read from --webhook-ca-file (re-read when it
    /// changes: a rotated CA); `None` without the flag, or while the file is empty.
    pub webhook_ca: tokio::sync::watch::Sender<Option<Arc<Vec<u8>>>>,
    /// The URL-signing keys as last read (`None`: no keys, URLs without a token); changes when
    /// the first key does.
    pub url_keys: tokio::sync::watch::Sender<Option<Arc<kkp_quota_runtime::webhook_auth::SigningKeys>>>,
    url_key_file: Option<Arc<kkp_quota_runtime::webhook_auth::ReloadingKeys>>,
}

impl Shared {
    /// The state, under a short lock (never held across an await).
    pub fn state(&self) -> MutexGuard<'_, state::State> {
        match self.state.lock() {
            Ok(guard) => guard,
            // A panicking holder left the data consistent enough to keep counting.
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    pub fn wake_writer(&self) {
        self.notify.notify_one();
        self.views_changed();
    }

    /// Wakes the users' views: what they show may have changed.
    pub fn views_changed(&self) {
        self.views.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// The controller: construct, keep [`Controller::shared`] for metrics and state, then
/// [`Controller::run`].
pub struct Controller {
    shared: Arc<Shared>,
}

impl Controller {
    pub async fn new(config: Config, seed: kube::Client) -> Result<Controller, Error> {
        let webhook_ca = match &config.webhook_ca_file {
            Some(path) => webhook_config::read_ca(path)
                .await
                .map_err(|source| Error::ReadFile {
                    path: path.clone(),
                    source,
                })?,
            None => None,
        };
        let (webhook_ca, _) = tokio::sync::watch::channel(webhook_ca);
        if config.webhook_certificate_secret.is_some() && config.webhook_certificate_dns_names.is_empty() {
            return Err(ConfigError::CertificateWithoutDnsNames.into());
        }
        if config.webhook_certificate_overlap * 2 >= config.webhook_certificate_validity {
            return Err(ConfigError::CertificateOverlapTooLong.into());
        }
        if let Some(url) = &config.webhook_url
            && !url.starts_with("https://")
        {
            return Err(ConfigError::WebhookUrlNotHttps(url.clone()).into());
        }
        if config.webhook_url.is_some() && config.url_signing_keys.is_none() && !config.insecure_no_auth {
            return Err(ConfigError::WebhookUrlWithoutKeys.into());
        }
        let url_key_file = match &config.url_signing_keys {
            Some(path) => Some(Arc::new(kkp_quota_runtime::webhook_auth::ReloadingKeys::new(
                path,
            )?)),
            None => None,
        };
        let (url_keys, _) = tokio::sync::watch::channel(url_key_file.as_ref().map(|keys| keys.current()));
        Ok(Controller {
            shared: Arc::new(Shared {
                url_keys,
                url_key_file,
                metrics: Metrics::new()?,
                readiness: Readiness::default(),
                state: Mutex::new(state::State::new(SizeCatalog::shipped()).on_seed(&config.seed_name)),
                notify: Notify::new(),
                views: tokio::sync::watch::channel(0).0,
                webhook_ca,
                seed,
                config,
            }),
        })
    }

    pub fn shared(&self) -> Arc<Shared> {
        Arc::clone(&self.shared)
    }

    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    pub fn readiness(&self) -> Readiness {
        self.shared.readiness.clone()
    }

    /// Runs until a watch loop ends (it does not, short of a panic) or the future is dropped;
    /// dropping it stops every task it started.
    pub async fn run(self) -> Result<(), Error> {
        let shared = self.shared;
        info!(seed = %shared.config.seed_name, "seed-controller starting");
        let mut catalog = AbortOnDropHandle::new(tokio::spawn(catalog::run(Arc::clone(&shared))));
        let mut quotas = AbortOnDropHandle::new(tokio::spawn(writer::watch_quotas(Arc::clone(&shared))));
        let mut writer = AbortOnDropHandle::new(tokio::spawn(writer::run(Arc::clone(&shared))));
        let _seed_probe = shared
            .config
            .quota_view
            .then(|| AbortOnDropHandle::new(tokio::spawn(view::probe_seed(Arc::clone(&shared)))));
        let mut resync = AbortOnDropHandle::new(tokio::spawn(resync(Arc::clone(&shared))));
        let _keys = shared.url_key_file.as_ref().map(|keys| {
            AbortOnDropHandle::new(tokio::spawn(webhook_config::follow_keys(
                Arc::clone(keys),
                Arc::clone(&shared),
            )))
        });
        let _seed_clusters_webhook = (shared.config.cluster_webhook && shared.config.webhook_url.is_some())
            .then(|| {
                AbortOnDropHandle::new(tokio::spawn(webhook_config::keep(
                    shared.seed.clone(),
                    Arc::clone(&shared),
                    webhook_config::Target::SeedClusters,
                )))
            });
        let _ca = shared.config.webhook_ca_file.clone().map(|path| {
            AbortOnDropHandle::new(tokio::spawn(webhook_config::follow_ca(path, Arc::clone(&shared))))
        });
        let _certificate = shared.config.webhook_certificate_secret.clone().map(|name| {
            let config = &shared.config;
            let namespace = config
                .webhook_certificate_namespace
                .clone()
                .unwrap_or_else(|| config.kubermatic_namespace.clone());
            let seconds = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            let settings = webhook_cert::Settings {
                dns_names: config.webhook_certificate_dns_names.clone(),
                validity: seconds(config.webhook_certificate_validity).max(1),
                overlap: seconds(config.webhook_certificate_overlap),
            };
            AbortOnDropHandle::new(tokio::spawn(webhook_cert::run(
                Arc::clone(&shared),
                namespace,
                name,
                settings,
            )))
        });
        // None of these loops ends on its own: if one does (a panic), stop everything so the
        // process is restarted rather than silently not counting.
        let stopped = |task: &'static str, r: Result<(), tokio::task::JoinError>| {
            Err(Error::Stopped {
                task,
                panic: r.err().map(|e| e.to_string()),
            })
        };
        tokio::select! {
            result = clusters::run(Arc::clone(&shared)) => result,
            r = &mut catalog => stopped("size catalog watch", r),
            r = &mut quotas => stopped("quota watch", r),
            r = &mut writer => stopped("writer", r),
            r = &mut resync => stopped("resync", r),
        }
    }
}

/// Every --resync-period, every usage is written again if it differs (the recount itself runs
/// in each user cluster's task).
async fn resync(shared: Arc<Shared>) {
    let mut ticker = tokio::time::interval(shared.config.resync_period);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        shared.state().mark_all();
        shared.wake_writer();
    }
}

/// The binary: seed client, ops server, leader election, controller.
pub async fn run(config: Config) -> Result<(), Error> {
    run_until(config, std::future::pending()).await
}

/// [`run`] until `shutdown` resolves; a leader then stops its work and releases its Lease, so
/// that the standby takes over within one renewal period (a rolling update or a deleted pod
/// does not leave the seed without a leader for a whole lease duration).
pub async fn run_until(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    let seed = own_client(config.kubeconfig.as_deref()).await?;
    let controller = Controller::new(config.clone(), seed.clone()).await?;
    let (address, serve) = bind(
        config.metrics_address,
        controller.metrics().registry.clone(),
        controller.readiness(),
    )
    .await?;
    info!(%address, "serving /metrics, /healthz, /readyz");
    let ops = AbortOnDropHandle::new(tokio::spawn(async move {
        if let Err(e) = serve.await {
            warn!(error = %e, "ops server stopped");
        }
    }));
    let result = if config.leader_elect {
        let lease = LeaseConfig {
            lease_duration: config.lease_duration,
            renew_every: config.lease_duration / 3,
            ..LeaseConfig::new(
                config
                    .leader_election_namespace
                    .clone()
                    .unwrap_or_else(|| config.kubermatic_namespace.clone()),
                config.leader_election_id.clone(),
                LeaseConfig::default_identity(),
            )
        };
        // Ready as a standby; as the leader, after the first complete count.
        let readiness = controller.readiness();
        LeaderElector::new(seed, lease)
            .run_until(&readiness, controller.run(), shutdown)
            .await?
            .unwrap_or(Ok(()))
    } else {
        tokio::select! {
            result = controller.run() => result,
            () = shutdown => Ok(()),
        }
    };
    drop(ops);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_have_the_documented_defaults() {
        let config = <Config as clap::Parser>::parse_from(["seed-controller"]);
        assert_eq!(config.kubermatic_namespace, "kubermatic");
        assert_eq!(config.machine_namespace, "kube-system");
        assert_eq!(config.reservation_ttl, Duration::from_mins(2));
        assert_eq!(config.admission_record_grace, Duration::from_secs(5));
        assert_eq!(config.resync_period, Duration::from_mins(5));
        assert!(config.leader_elect);
        assert!(config.webhook_url.is_none());
        assert_eq!(config.share_quiet_period, Duration::from_secs(30));
        assert_eq!(config.share_slack_percent, 10);
        let config = <Config as clap::Parser>::parse_from([
            "seed-controller",
            "--leader-elect=false",
            "--resync-period=1m",
            "--admission-record-grace=500ms",
            "--share-quiet-period=2m",
            "--share-slack-percent=25",
        ]);
        assert_eq!(config.share_quiet_period, Duration::from_mins(2));
        assert_eq!(config.share_slack_percent, 25);
        assert!(
            <Config as clap::Parser>::try_parse_from(["seed-controller", "--share-slack-percent=101"])
                .is_err()
        );
        assert_eq!(config.admission_record_grace, Duration::from_millis(500));
        assert!(!config.leader_elect);
        assert_eq!(config.resync_period, Duration::from_mins(1));
    }
}
