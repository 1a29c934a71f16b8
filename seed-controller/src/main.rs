//! The seed-controller binary: flags, logging, then [`seed_controller::run`].

use clap::Parser;
use seed_controller::Config;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    kkp_quota_runtime::telemetry::init_tracing(config.log_json);
    let shutdown = async {
        let signal = kkp_quota_runtime::shutdown_signal().await;
        tracing::info!(signal, "stopping");
    };
    seed_controller::run_until(config, shutdown).await?;
    Ok(())
}
