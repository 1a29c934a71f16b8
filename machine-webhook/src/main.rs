//! The machine-webhook binary: flags ([`machine_webhook::args`]), logging, then
//! [`machine_webhook::Webhook`] until a signal ([`machine_webhook::Webhook::run_until_signal`]).

use anyhow::Context as _;
use clap::Parser;
use kkp_quota_runtime::kubeconfig::own_client;
use machine_webhook::Webhook;
use machine_webhook::args::Args;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    kkp_quota_runtime::telemetry::init_tracing(args.log_json);
    // A key file that does not load stops the process before anything else is done.
    if let Some(path) = &args.url_signing_keys {
        kkp_quota_runtime::webhook_auth::SigningKeys::load(path)?;
    }
    let client = own_client(args.kubeconfig.as_deref())
        .await
        .context("connecting to the seed")?;
    let webhook = Webhook::start(args.config(), client).await?;
    Ok(webhook.run_until_signal(args.shutdown_delay).await?)
}
