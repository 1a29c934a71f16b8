//! The seed-controller binary: flags, logging, then [`seed_controller::run`].

use clap::Parser;
use seed_controller::Config;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    kkp_quota_crds::runtime::telemetry::init_tracing(config.log_json);
    tokio::select! {
        result = seed_controller::run(config) => result?,
        signal = kkp_quota_crds::runtime::shutdown_signal() => tracing::info!(signal, "stopping"),
    }
    Ok(())
}
