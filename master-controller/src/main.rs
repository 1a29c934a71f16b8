//! The master-controller binary: flags ([`master_controller::args`]), logging, the ops server,
//! then [`master_controller::run_until`].

use anyhow::Context as _;
use clap::Parser;
use kkp_quota_runtime::kubeconfig::own_client;
use kkp_quota_runtime::ops::Readiness;
use master_controller::Metrics;
use master_controller::args::Args;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    kkp_quota_runtime::telemetry::init_tracing(args.log_json);
    let client = own_client(args.kubeconfig.as_deref())
        .await
        .context("building the master client")?;
    let (metrics, readiness) = (Metrics::new(), Readiness::default());
    let (address, serve) = metrics
        .bind_ops(args.metrics_address, readiness.clone())
        .await
        .context("binding the metrics address")?;
    tracing::info!(%address, "serving /metrics, /healthz, /readyz");
    tokio::spawn(serve);
    // Every replica answers the allocation webhook, leader or not.
    if let Some(serving) = args.allocation_webhook() {
        let (address, webhook) =
            master_controller::allocation::server::serve(client.clone(), serving, metrics.clone())
                .await
                .context("starting the allocation webhook")?;
        tracing::info!(%address, path = master_controller::allocation::server::PATH, "serving the allocation webhook");
        tokio::spawn(webhook);
    }
    let shutdown = async {
        let signal = kkp_quota_runtime::shutdown_signal().await;
        tracing::info!(signal, "stopping");
    };
    master_controller::run_until(client, args.options(), metrics, readiness, shutdown)
        .await
        .context("master-controller stopped")
}
