//! The binary's flags ([`Args`], clap, each with an environment variable) and the [`Config`]
//! they make ([`Args::config`]); `main.rs` only parses, logs and runs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::reserve::AllotmentConfig;
use crate::server::Limits;
use crate::waiting::WakeConfig;
use crate::{AuthConfig, Config};

/// Validating admission webhook that keeps every project within its resource quota.
#[derive(Debug, Parser)]
#[command(version)]
pub struct Args {
    /// Kubeconfig of the seed cluster (default: KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long, env = "MACHINE_WEBHOOK_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// HTTPS address for admission requests.
    #[arg(long, env = "MACHINE_WEBHOOK_LISTEN_ADDRESS", default_value = "0.0.0.0:9443")]
    pub listen_address: SocketAddr,
    /// PEM certificate chain; re-read when it changes.
    #[arg(long, env = "MACHINE_WEBHOOK_TLS_CERT_FILE")]
    pub tls_cert_file: PathBuf,
    /// PEM private key; re-read when it changes.
    #[arg(long, env = "MACHINE_WEBHOOK_TLS_KEY_FILE")]
    pub tls_key_file: PathBuf,
    /// Plain HTTP address for /metrics, /healthz and /readyz.
    #[arg(long, env = "MACHINE_WEBHOOK_METRICS_ADDRESS", default_value = "0.0.0.0:8080")]
    pub metrics_address: SocketAddr,
    /// The seed's KKP namespace (holds the admin size catalog, config map `kkp-quota-size-catalog`).
    #[arg(
        long,
        env = "MACHINE_WEBHOOK_KUBERMATIC_NAMESPACE",
        default_value = "kubermatic"
    )]
    pub kubermatic_namespace: String,
    /// Most requests of one project decided together and written in one patch.
    #[arg(long, env = "MACHINE_WEBHOOK_MAX_BATCH", default_value_t = 256)]
    pub max_batch: usize,
    /// Reservation writes tried per batch before denying with reason "error".
    #[arg(long, env = "MACHINE_WEBHOOK_MAX_WRITE_ATTEMPTS", default_value_t = 10)]
    pub max_write_attempts: u32,
    /// Window (seconds) in which the same denial on the same object is one Event.
    #[arg(long, env = "MACHINE_WEBHOOK_EVENT_DEDUP_SECONDS", default_value_t = 600)]
    pub event_dedup_seconds: u64,
    /// Lifetime (seconds) of this process's allotments: headroom it holds per project so that
    /// Machines that fit are admitted without waiting for a ledger write. Renewed while in use;
    /// after a crash the headroom stays held this long. 0 turns allotments off (every admission
    /// waits for its own compare-and-swap write).
    #[arg(long, env = "MACHINE_WEBHOOK_ALLOTMENT_TTL_SECONDS", default_value_t = 120)]
    pub allotment_ttl_seconds: u64,
    /// How soon (milliseconds) Machines admitted from an allotment are written as reservations:
    /// longer means fewer, larger ledger writes on the seed, and Machines that take longer to show
    /// in usage (seed-controller holds them back until then).
    #[arg(long, env = "MACHINE_WEBHOOK_ALLOTMENT_RECORD_MS", default_value_t = 500)]
    pub allotment_record_ms: u64,
    /// How long (milliseconds) a request that fits the project's quota waits for share to move to
    /// this seed (or for the seed's other webhook processes to give their allotments back) before
    /// it is denied as `share_in_transit`. Must stay below the webhook's 5 s timeout, with room
    /// for a write.
    #[arg(long, env = "MACHINE_WEBHOOK_SHARE_WAIT_MS", default_value_t = 3000)]
    pub share_wait_ms: u64,
    /// How long (seconds) a demand for share stays after its last waiting request, so that a
    /// retry after a `share_in_transit` denial finds the share moved. While it stays, the seed's
    /// idle share is not asked back for other seeds.
    #[arg(
        long,
        env = "MACHINE_WEBHOOK_SHARE_DEMAND_TTL_SECONDS",
        default_value_t = 30,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub share_demand_ttl_seconds: u64,
    /// File of URL-signing keys (base64, one per line, at least 32 bytes each): the first signs,
    /// every one verifies; re-read when it changes. The same file is given to seed-controller,
    /// which writes each user cluster's token into its webhook URL. Required unless
    /// --insecure-no-auth.
    #[arg(
        long,
        env = "MACHINE_WEBHOOK_URL_SIGNING_KEYS",
        required_unless_present = "insecure_no_auth"
    )]
    pub url_signing_keys: Option<PathBuf>,
    /// Serve admission calls without authentication: anyone who can reach the port can spend or
    /// block any project's quota. For experiments only.
    #[arg(
        long,
        env = "MACHINE_WEBHOOK_INSECURE_NO_AUTH",
        conflicts_with = "url_signing_keys"
    )]
    pub insecure_no_auth: bool,
    /// Largest admission request body accepted, in bytes (413 above).
    #[arg(long, env = "MACHINE_WEBHOOK_MAX_BODY_BYTES", default_value_t = 3 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Seconds allowed for a request's headers, and for its body.
    #[arg(long, env = "MACHINE_WEBHOOK_READ_TIMEOUT_SECONDS", default_value_t = 10)]
    pub read_timeout_seconds: u64,
    /// On SIGTERM, seconds to keep serving while /readyz says not ready, before closing
    /// connections: longer than the cluster takes to drop a stopping pod from its Service's
    /// endpoints (kube-proxy's rules), or API servers still send it requests that then fail.
    #[arg(long, env = "MACHINE_WEBHOOK_SHUTDOWN_DELAY_SECONDS", default_value_t = 0)]
    pub shutdown_delay_seconds: u64,
    /// When room appears for a project, the `MachineSet`s whose Machines this process refused for
    /// room in the last hour get the annotation `kkp-quota.dev/room-available-at`, so that
    /// machine-controller tries again at once instead of after its back-off; at most once per
    /// `MachineSet` per this many seconds. 0: never write to users' objects.
    #[arg(long, env = "MACHINE_WEBHOOK_WAKE_GAP_SECONDS", default_value_t = 10)]
    pub wake_gap_seconds: u64,
    /// Log JSON lines instead of text.
    #[arg(long, env = "MACHINE_WEBHOOK_LOG_JSON")]
    pub log_json: bool,
    /// For tests only: seconds added to this process's clock where it dates ledger entries
    /// (demands, allotments, reservations), to test clock skew between components.
    #[arg(
        long,
        env = "MACHINE_WEBHOOK_TEST_CLOCK_OFFSET_SECONDS",
        default_value_t = 0,
        allow_negative_numbers = true,
        hide = true
    )]
    pub test_clock_offset_seconds: i64,
}

impl Args {
    /// What the webhook runs with.
    pub fn config(&self) -> Config {
        let mut config = Config::new(
            self.listen_address,
            self.tls_cert_file.clone(),
            self.tls_key_file.clone(),
        );
        config.metrics_address = Some(self.metrics_address);
        config.kubermatic_namespace.clone_from(&self.kubermatic_namespace);
        config.max_batch = self.max_batch;
        config.max_attempts = self.max_write_attempts;
        config.event_window = Duration::from_secs(self.event_dedup_seconds);
        config.allotments = (self.allotment_ttl_seconds > 0).then(|| AllotmentConfig {
            ttl: Duration::from_secs(self.allotment_ttl_seconds),
            record_after: Duration::from_millis(self.allotment_record_ms),
            ..AllotmentConfig::default()
        });
        config.share_wait = Duration::from_millis(self.share_wait_ms);
        config.share_demand_ttl = Duration::from_secs(self.share_demand_ttl_seconds);
        config.wake = (self.wake_gap_seconds > 0).then(|| WakeConfig {
            min_gap: Duration::from_secs(self.wake_gap_seconds),
            ..WakeConfig::default()
        });
        config.test_clock_offset = jiff::SignedDuration::from_secs(self.test_clock_offset_seconds);
        config.auth = match &self.url_signing_keys {
            Some(path) => Some(AuthConfig::UrlSigningKeys(path.clone())),
            None if self.insecure_no_auth => Some(AuthConfig::InsecureNoAuth),
            None => None,
        };
        config.limits = Limits {
            max_body_bytes: self.max_body_bytes,
            header_read_timeout: Duration::from_secs(self.read_timeout_seconds),
            body_read_timeout: Duration::from_secs(self.read_timeout_seconds),
        };
        config
    }

    /// How long a stopping process keeps serving while endpoints drop it.
    pub fn shutdown_delay(&self) -> Duration {
        Duration::from_secs(self.shutdown_delay_seconds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_make_the_config() {
        let args = Args::try_parse_from([
            "machine-webhook",
            "--tls-cert-file",
            "c.pem",
            "--tls-key-file",
            "k.pem",
            "--allotment-ttl-seconds",
            "0",
            "--share-wait-ms",
            "250",
            "--insecure-no-auth",
        ])
        .unwrap();
        let config = args.config();
        assert!(config.allotments.is_none(), "0 turns allotments off");
        assert_eq!(config.share_wait, Duration::from_millis(250));
        assert!(matches!(config.auth, Some(AuthConfig::InsecureNoAuth)));
        assert_eq!(args.shutdown_delay(), Duration::ZERO);
    }
}
