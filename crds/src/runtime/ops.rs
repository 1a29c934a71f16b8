//! The operations endpoint every component serves: `/metrics`, `/healthz`, `/readyz`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus::{Encoder, Registry, TextEncoder};

use super::RuntimeError;

/// Whether the component is ready to do its job (caches synced, leader lease held, ...).
#[derive(Clone, Default, Debug)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }

    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Series a component writes into the `/metrics` text itself, after the registry's: for
/// families with too many series for the registry's per-series cost.
pub trait ExtraSeries: Send + Sync {
    /// Appends whole families (`# HELP`, `# TYPE`, samples) in Prometheus' text format.
    fn encode(&self, out: &mut String);
}

#[derive(Clone)]
struct OpsState {
    registry: Registry,
    extra: Option<Arc<dyn ExtraSeries>>,
    readiness: Readiness,
}

/// Binds the operations server and returns the bound address and the future that serves it (so
/// `--metrics-address 127.0.0.1:0` works in tests).
pub async fn bind(
    address: SocketAddr,
    registry: Registry,
    readiness: Readiness,
) -> Result<(SocketAddr, impl Future<Output = Result<(), RuntimeError>>), RuntimeError> {
    bind_with_series(address, registry, None, readiness).await
}

/// [`bind`], with `extra` written after the registry's series.
pub async fn bind_with_series(
    address: SocketAddr,
    registry: Registry,
    extra: Option<Arc<dyn ExtraSeries>>,
    readiness: Readiness,
) -> Result<(SocketAddr, impl Future<Output = Result<(), RuntimeError>>), RuntimeError> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(OpsState {
            registry,
            extra,
            readiness,
        });
    let listener = tokio::net::TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    Ok((bound, async move {
        axum::serve(listener, app).await.map_err(RuntimeError::Io)
    }))
}

async fn metrics(State(state): State<OpsState>) -> impl IntoResponse {
    let mut body = Vec::new();
    let encoder = TextEncoder::new();
    match encoder.encode(&state.registry.gather(), &mut body) {
        Ok(()) => {
            let body = match (&state.extra, String::from_utf8(body)) {
                (Some(extra), Ok(mut text)) => {
                    // Appended in place: the extra series can be most of the text.
                    extra.encode(&mut text);
                    text.into_bytes()
                }
                (_, Ok(text)) => text.into_bytes(),
                (_, Err(e)) => e.into_bytes(),
            };
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, encoder.format_type().to_owned())],
                body,
            )
        }
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain".to_owned())],
            e.to_string().into_bytes(),
        ),
    }
}

async fn readyz(State(state): State<OpsState>) -> impl IntoResponse {
    if state.readiness.is_ready() {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}
