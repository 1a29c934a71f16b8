//! The machine-webhook binary: flags, then [`machine_webhook::Webhook`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use kkp_quota_runtime::kubeconfig::own_client;
use kkp_quota_runtime::telemetry::init_tracing;
use machine_webhook::reserve::AllotmentConfig;
use machine_webhook::server::Limits;
use machine_webhook::waiting::WakeConfig;
use machine_webhook::{AuthConfig, Config, Webhook};

/// Validating admission webhook that keeps every project within its resource quota.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Kubeconfig of the seed cluster (default: KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long, env = "MACHINE_WEBHOOK_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// HTTPS address for admission requests.
    #[arg(long, env = "MACHINE_WEBHOOK_LISTEN_ADDRESS", default_value = "0.0.0.0:9443")]
    listen_address: SocketAddr,
    /// PEM certificate chain; re-read when it changes.
    #[arg(long, env = "MACHINE_WEBHOOK_TLS_CERT_FILE")]
    tls_cert_file: PathBuf,
    /// PEM private key; re-read when it changes.
    #[arg(long, env = "MACHINE_WEBHOOK_TLS_KEY_FILE")]
    tls_key_file: PathBuf,
    /// Plain HTTP address for /metrics, /healthz and /readyz.
    #[arg(long, env = "MACHINE_WEBHOOK_METRICS_ADDRESS", default_value = "0.0.0.0:8080")]
    metrics_address: SocketAddr,
    /// The seed's KKP namespace (holds the admin size catalog, config map `kkp-quota-size-catalog`).
    #[arg(
        long,
        env = "MACHINE_WEBHOOK_KUBERMATIC_NAMESPACE",
        default_value = "kubermatic"
    )]
    kubermatic_namespace: String,
    /// Most requests of one project decided together and written in one patch.
    #[arg(long, env = "MACHINE_WEBHOOK_MAX_BATCH", default_value_t = 256)]
    max_batch: usize,
    /// Reservation writes tried per batch before denying with reason "error".
    #[arg(long, env = "MACHINE_WEBHOOK_MAX_WRITE_ATTEMPTS", default_value_t = 10)]
    max_write_attempts: u32,
    /// Window (seconds) in which the same denial on the same object is one Event.
    #[arg(long, env = "MACHINE_WEBHOOK_EVENT_DEDUP_SECONDS", default_value_t = 600)]
    event_dedup_seconds: u64,
    /// Lifetime (seconds) of this process's allotments: headroom it holds per project so that
    /// Machines that fit are admitted without waiting for a ledger write. Renewed while in use;
    /// after a crash the headroom stays held this long. 0 turns allotments off (every admission
    /// waits for its own compare-and-swap write).
    #[arg(long, env = "MACHINE_WEBHOOK_ALLOTMENT_TTL_SECONDS", default_value_t = 120)]
    allotment_ttl_seconds: u64,
    /// How soon (milliseconds) Machines admitted from an allotment are written as reservations:
    /// longer means fewer, larger ledger writes on the seed, and Machines that take longer to show
    /// in usage (seed-controller holds them back until then).
    #[arg(long, env = "MACHINE_WEBHOOK_ALLOTMENT_RECORD_MS", default_value_t = 500)]
    allotment_record_ms: u64,
    /// How long (milliseconds) a request that fits the project's quota waits for share to move to
    /// this seed (or for the seed's other webhook processes to give their allotments back) before
    /// it is denied as `share_in_transit`. Must stay below the webhook's 5 s timeout, with room
    /// for a write.
    #[arg(long, env = "MACHINE_WEBHOOK_SHARE_WAIT_MS", default_value_t = 3000)]
    share_wait_ms: u64,
    /// How long (seconds) a demand for share stays after its last waiting request, so that a
    /// retry after a `share_in_transit` denial finds the share moved. While it stays, the seed's
    /// idle share is not asked back for other seeds.
    #[arg(
        long,
        env = "MACHINE_WEBHOOK_SHARE_DEMAND_TTL_SECONDS",
        default_value_t = 30,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    share_demand_ttl_seconds: u64,
    /// File of URL-signing keys (base64, one per line, at least 32 bytes each): the first signs,
    /// every one verifies; re-read when it changes. The same file is given to seed-controller,
    /// which writes each user cluster's token into its webhook URL. Required unless
    /// --insecure-no-auth.
    #[arg(
        long,
        env = "MACHINE_WEBHOOK_URL_SIGNING_KEYS",
        required_unless_present = "insecure_no_auth"
    )]
    url_signing_keys: Option<PathBuf>,
    /// Serve admission calls without authentication: anyone who can reach the port can spend or
    /// block any project's quota. For experiments only.
    #[arg(
        long,
        env = "MACHINE_WEBHOOK_INSECURE_NO_AUTH",
        conflicts_with = "url_signing_keys"
    )]
    insecure_no_auth: bool,
    /// Largest admission request body accepted, in bytes (413 above).
    #[arg(long, env = "MACHINE_WEBHOOK_MAX_BODY_BYTES", default_value_t = 3 * 1024 * 1024)]
    max_body_bytes: usize,
    /// Seconds allowed for a request's headers, and for its body.
    #[arg(long, env = "MACHINE_WEBHOOK_READ_TIMEOUT_SECONDS", default_value_t = 10)]
    read_timeout_seconds: u64,
    /// On SIGTERM, seconds to keep serving while /readyz says not ready, before closing
    /// connections: longer than the cluster takes to drop a stopping pod from its Service's
    /// endpoints (kube-proxy's rules), or API servers still send it requests that then fail.
    #[arg(long, env = "MACHINE_WEBHOOK_SHUTDOWN_DELAY_SECONDS", default_value_t = 0)]
    shutdown_delay_seconds: u64,
    /// When room appears for a project, the `MachineSet`s whose Machines this process refused for
    /// room in the last hour get the annotation `kkp-quota.dev/room-available-at`, so that
    /// machine-controller tries again at once instead of after its back-off; at most once per
    /// `MachineSet` per this many seconds. 0: never write to users' objects.
    #[arg(long, env = "MACHINE_WEBHOOK_WAKE_GAP_SECONDS", default_value_t = 10)]
    wake_gap_seconds: u64,
    /// Log JSON lines instead of text.
    #[arg(long, env = "MACHINE_WEBHOOK_LOG_JSON")]
    log_json: bool,
    /// For tests only: seconds added to this process's clock where it dates ledger entries
    /// (demands, allotments, reservations), to test clock skew between components.
    #[arg(
        long,
        env = "MACHINE_WEBHOOK_TEST_CLOCK_OFFSET_SECONDS",
        default_value_t = 0,
        allow_negative_numbers = true,
        hide = true
    )]
    test_clock_offset_seconds: i64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    init_tracing(args.log_json);
    // A key file that does not load stops the process before anything else is done.
    if let Some(path) = &args.url_signing_keys {
        kkp_quota_runtime::webhook_auth::SigningKeys::load(path)?;
    }
    let client = own_client(args.kubeconfig.as_deref())
        .await
        .context("connecting to the seed")?;
    let mut config = Config::new(args.listen_address, args.tls_cert_file, args.tls_key_file);
    config.metrics_address = Some(args.metrics_address);
    config.kubermatic_namespace = args.kubermatic_namespace;
    config.max_batch = args.max_batch;
    config.max_attempts = args.max_write_attempts;
    config.event_window = Duration::from_secs(args.event_dedup_seconds);
    config.allotments = (args.allotment_ttl_seconds > 0).then(|| AllotmentConfig {
        ttl: Duration::from_secs(args.allotment_ttl_seconds),
        record_after: Duration::from_millis(args.allotment_record_ms),
        ..AllotmentConfig::default()
    });
    config.share_wait = Duration::from_millis(args.share_wait_ms);
    config.share_demand_ttl = Duration::from_secs(args.share_demand_ttl_seconds);
    config.wake = (args.wake_gap_seconds > 0).then(|| WakeConfig {
        min_gap: Duration::from_secs(args.wake_gap_seconds),
        ..WakeConfig::default()
    });
    config.test_clock_offset = jiff::SignedDuration::from_secs(args.test_clock_offset_seconds);
    config.auth = match args.url_signing_keys {
        Some(path) => Some(AuthConfig::UrlSigningKeys(path)),
        None if args.insecure_no_auth => Some(AuthConfig::InsecureNoAuth),
        None => None,
    };
    config.limits = Limits {
        max_body_bytes: args.max_body_bytes,
        header_read_timeout: Duration::from_secs(args.read_timeout_seconds),
        body_read_timeout: Duration::from_secs(args.read_timeout_seconds),
    };
    let webhook = Webhook::start(config, client).await?;
    let reserver = webhook.reserver.clone();
    let shutdown = webhook.shutdown.clone();
    let serving = webhook.run();
    tokio::pin!(serving);
    let signal = tokio::select! {
        result = &mut serving => return Ok(result?),
        signal = kkp_quota_runtime::shutdown_signal() => signal,
    };
    // Each step keeps `serving` polled: the workers that record and give back run inside it.
    let delay = Duration::from_secs(args.shutdown_delay_seconds);
    tracing::info!(
        signal,
        ?delay,
        "stopping: not ready, still serving while endpoints drop this pod"
    );
    shutdown.unready();
    tokio::select! {
        () = tokio::time::sleep(delay) => {}
        result = &mut serving => return Ok(result?),
    }
    tracing::info!("stopping: closing connections once their requests are answered");
    shutdown.close();
    tokio::select! {
        () = shutdown.drained() => {}
        result = &mut serving => return Ok(result?),
    }
    tracing::info!("stopping: giving allotments back");
    tokio::select! {
        _ = reserver.release_all(Duration::from_secs(5)) => {}
        result = &mut serving => result?,
    }
    Ok(())
}
