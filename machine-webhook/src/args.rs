//! The binary's flags ([`Args`], clap, each with an environment variable) and the [`Config`]
//! they make ([`Args::config`]); `main.rs` only parses, logs and runs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use kkp_quota_runtime::duration::{parse_duration, parse_signed_duration};

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
    /// Window in which the same denial on the same object is one Event.
    #[arg(long, env = "MACHINE_WEBHOOK_EVENT_DEDUP", default_value = "10m", value_parser = parse_duration)]
    pub event_dedup: Duration,
    /// Lifetime of this process's allotments: headroom it holds per project so that Machines
    /// that fit are admitted without waiting for a ledger write. Renewed while in use; after a
    /// crash the headroom stays held this long. 0s turns allotments off (every admission waits
    /// for its own compare-and-swap write).
    #[arg(long, env = "MACHINE_WEBHOOK_ALLOTMENT_TTL", default_value = "2m", value_parser = parse_duration)]
    pub allotment_ttl: Duration,
    /// How soon Machines admitted from an allotment are written as reservations: longer means
    /// fewer, larger ledger writes on the seed, and Machines that take longer to show in usage
    /// (seed-controller holds them back until then).
    #[arg(long, env = "MACHINE_WEBHOOK_ALLOTMENT_RECORD_AFTER", default_value = "500ms", value_parser = parse_duration)]
    pub allotment_record_after: Duration,
    /// How long a request that fits the project's quota waits for share to move to this seed
    /// (or for the seed's other webhook processes to give their allotments back) before it is
    /// denied as `share_in_transit` (or naming a shared group its ledger's figures leave no room
    /// in). Below the 4 s a decision may take (within the webhook's 5 s timeout), with room for
    /// a write.
    #[arg(long, env = "MACHINE_WEBHOOK_SHARE_WAIT", default_value = "3s", value_parser = below_the_deadline)]
    pub share_wait: Duration,
    /// How long a demand for share stays after its last waiting request, so that a retry after
    /// a `share_in_transit` denial finds the share moved (at least 1s). While it stays, the
    /// seed's idle share is not asked back for other seeds.
    #[arg(
        long,
        env = "MACHINE_WEBHOOK_SHARE_DEMAND_TTL",
        default_value = "30s",
        value_parser = at_least_a_second
    )]
    pub share_demand_ttl: Duration,
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
    /// This seed's name, as seed-controller's --seed-name: the seed's `Cluster` creates are
    /// served only under it, so a token signed for another seed that shares the URL-signing keys
    /// is refused here. Unset: any seed's name is taken (as before this flag existed).
    #[arg(long, env = "MACHINE_WEBHOOK_SEED_NAME")]
    pub seed_name: Option<String>,
    /// Largest admission request body accepted, in bytes (413 above).
    #[arg(long, env = "MACHINE_WEBHOOK_MAX_BODY_BYTES", default_value_t = 3 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Time allowed for a request's headers, and for its body.
    #[arg(long, env = "MACHINE_WEBHOOK_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub read_timeout: Duration,
    /// On SIGTERM, how long to keep serving while /readyz says not ready, before closing
    /// connections: longer than the cluster takes to drop a stopping pod from its Service's
    /// endpoints (kube-proxy's rules), or API servers still send it requests that then fail.
    #[arg(long, env = "MACHINE_WEBHOOK_SHUTDOWN_DELAY", default_value = "0s", value_parser = parse_duration)]
    pub shutdown_delay: Duration,
    /// When room appears for a project, the `MachineSet`s whose Machines this process refused for
    /// room in the last hour get the annotation `kkp-quota.dev/room-available-at`, so that
    /// machine-controller tries again at once instead of after its back-off; at most once per
    /// `MachineSet` per this long. 0s: never write to users' objects.
    #[arg(long, env = "MACHINE_WEBHOOK_WAKE_GAP", default_value = "10s", value_parser = parse_duration)]
    pub wake_gap: Duration,
    /// Log JSON lines instead of text.
    #[arg(long, env = "MACHINE_WEBHOOK_LOG_JSON")]
    pub log_json: bool,
    /// For tests only: added to this process's clock where it dates ledger entries (demands,
    /// allotments, reservations), to test clock skew between components (`-40s`).
    #[arg(
        long,
        env = "MACHINE_WEBHOOK_TEST_CLOCK_OFFSET",
        default_value = "0s",
        allow_hyphen_values = true,
        value_parser = parse_signed_duration,
        hide = true
    )]
    pub test_clock_offset: jiff::SignedDuration,
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
        config.event_window = self.event_dedup;
        config.allotments = (!self.allotment_ttl.is_zero()).then(|| AllotmentConfig {
            ttl: self.allotment_ttl,
            record_after: self.allotment_record_after,
            ..AllotmentConfig::default()
        });
        config.share_wait = self.share_wait;
        config.share_demand_ttl = self.share_demand_ttl;
        config.wake = (!self.wake_gap.is_zero()).then(|| WakeConfig {
            min_gap: self.wake_gap,
            ..WakeConfig::default()
        });
        config.test_clock_offset = self.test_clock_offset;
        config.seed_name = self.seed_name.clone().filter(|n| !n.is_empty());
        config.auth = match &self.url_signing_keys {
            Some(path) => Some(AuthConfig::UrlSigningKeys(path.clone())),
            None if self.insecure_no_auth => Some(AuthConfig::InsecureNoAuth),
            None => None,
        };
        config.limits = Limits {
            max_body_bytes: self.max_body_bytes,
            header_read_timeout: self.read_timeout,
            body_read_timeout: self.read_timeout,
        };
        config
    }
}

/// A share wait shorter than the time a decision may take ([`crate::reserve::ReserverConfig`]'s
/// `deadline`): a longer one would run into it, and the request would fail as an error instead
/// of being denied with its reason.
fn below_the_deadline(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    let deadline = crate::reserve::ReserverConfig::default().deadline;
    if d >= deadline {
        return Err(format!(
            "{text:?} is not below the {}s a decision may take",
            deadline.as_secs()
        ));
    }
    Ok(d)
}

/// A duration of at least a second.
fn at_least_a_second(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d < Duration::from_secs(1) {
        return Err(format!("{text:?} is shorter than 1s"));
    }
    Ok(d)
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
            "--allotment-ttl",
            "0s",
            "--share-wait",
            "250ms",
            "--test-clock-offset",
            "-40s",
            "--insecure-no-auth",
        ])
        .unwrap();
        let config = args.config();
        assert!(config.allotments.is_none(), "0 turns allotments off");
        assert_eq!(config.share_wait, Duration::from_millis(250));
        assert!(matches!(config.auth, Some(AuthConfig::InsecureNoAuth)));
        assert_eq!(args.shutdown_delay, Duration::ZERO);
        assert_eq!(config.test_clock_offset, jiff::SignedDuration::from_secs(-40));
        assert_eq!(config.event_window, Duration::from_mins(10));
        for bad in [
            ["--share-wait", "3000"],
            ["--share-wait", "4s"],
            ["--share-demand-ttl", "500ms"],
        ] {
            let mut command_line = vec![
                "machine-webhook",
                "--tls-cert-file",
                "c",
                "--tls-key-file",
                "k",
                "--insecure-no-auth",
            ];
            command_line.extend(bad);
            assert!(Args::try_parse_from(command_line).is_err(), "{bad:?}");
        }
    }
}
