//! What every long-running component of the quota system shares: clients from kubeconfigs, the
//! operations HTTP server, leader election, tracing set-up, watches that survive a restored
//! etcd, HTTPS serving certificates reloaded from disk ([`tls`]), and the contract between
//! seed-controller and the webhook for signed webhook URLs ([`webhook_auth`]). Kept apart from
//! `kkp-quota-crds`, which holds types and pure domain logic only, so that seed-controller
//! depends on this and not on the webhook.

pub mod allocation_config;
pub mod chain;
pub mod duration;
pub mod kubeconfig;
pub mod leader;
pub mod ops;
pub mod telemetry;
pub mod tls;
pub mod watch;
pub mod webhook_auth;
pub mod webhook_config;
pub mod work_queue;

/// Why a runtime helper failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("the kubeconfig is not valid YAML of a kubeconfig")]
    KubeconfigYaml(#[source] kube::config::KubeconfigError),
    #[error("the kubeconfig's current context does not make a client configuration")]
    KubeconfigContext(#[source] kube::config::KubeconfigError),
    #[error("the kubeconfig in secret {namespace}/{name} is not UTF-8")]
    KubeconfigNotUtf8 { namespace: String, name: String },
    #[error("secret {namespace}/{name} has no key {key:?}")]
    MissingSecretKey {
        namespace: String,
        name: String,
        key: String,
    },
    #[error("kubernetes API error: {0}")]
    Kube(#[from] kube::Error),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("lost the leader lease {0}")]
    LostLease(String),
}

/// Resolves on SIGINT or SIGTERM (what Kubernetes sends a Pod that is being stopped), so that a
/// component can finish cleanly instead of being killed by the default signal action.
pub async fn shutdown_signal() -> &'static str {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => "SIGINT",
                _ = term.recv() => "SIGTERM",
            }
        } else {
            let _ = tokio::signal::ctrl_c().await;
            "SIGINT"
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        "interrupt"
    }
}
