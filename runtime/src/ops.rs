//! The operations endpoint every component serves: `/metrics`, `/healthz`, `/readyz`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::{StreamExt, future, stream};
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
/// families with too many series for the registry's per-series cost. They are written and sent
/// a part at a time, so a scrape never holds their whole text.
pub trait ExtraSeries: Send + Sync + 'static {
    /// Appends the next part of its families (`# HELP` and `# TYPE` before a family's first
    /// sample, then samples, in Prometheus' text format) from `at`, and moves `at` on. Returns
    /// true once everything is written.
    fn encode_part(&self, at: &mut Cursor, out: &mut String) -> bool;
}

/// Every part of `extra` at once (for tests, which read the text a scrape sends).
pub fn encode_all(extra: &dyn ExtraSeries, out: &mut String) {
    let mut at = Cursor::default();
    while !extra.encode_part(&mut at, out) {}
}

/// How far a scrape has come in the extra series: the family, and the last key written in it
/// (`None` at the family's start).
#[derive(Clone, Debug, Default)]
pub struct Cursor {
    pub family: usize,
    pub after: Option<String>,
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

async fn metrics(State(state): State<OpsState>) -> Response {
    let mut registry_text = Vec::new();
    let encoder = TextEncoder::new();
    if let Err(e) = encoder.encode(&state.registry.gather(), &mut registry_text) {
        return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response();
    }
    let content_type = [(header::CONTENT_TYPE, encoder.format_type().to_owned())];
    let Some(extra) = state.extra else {
        return (StatusCode::OK, content_type, registry_text).into_response();
    };
    // The registry's text first, then the extra series a part at a time, each written when the
    // client has taken the one before.
    let parts = stream::unfold(Some(Cursor::default()), move |at| {
        let extra = Arc::clone(&extra);
        async move {
            let mut at = at?;
            let mut out = String::new();
            let done = extra.encode_part(&mut at, &mut out);
            Some((Bytes::from(out), (!done).then_some(at)))
        }
    });
    let body = stream::once(async move { Bytes::from(registry_text) })
        .chain(parts)
        .filter(|part| future::ready(!part.is_empty()))
        .map(Ok::<_, Infallible>);
    (StatusCode::OK, content_type, Body::from_stream(body)).into_response()
}

async fn readyz(State(state): State<OpsState>) -> impl IntoResponse {
    if state.readiness.is_ready() {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}
