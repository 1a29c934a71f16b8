//! The HTTPS server: `POST /validate/machines/{cluster}` answers `AdmissionReview`s, plus
//! `/healthz` and `/readyz`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use kkp_quota_crds::runtime::ops::Readiness;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, info_span, warn};

use crate::cache::{QuotaCopy, SeedCache};
use crate::decision::{Ask, Reason, Request, Verdict, decide};
use crate::events::{DenialEvent, Events};
use crate::metrics::Metrics;
use crate::reserve::{MachineRef, Reserver};
use crate::review::{AdmissionRequest, AdmissionResponse, AdmissionReview, ask_for, machine_of};

/// Everything a request handler needs.
#[derive(Clone)]
pub struct App {
    pub cache: Arc<SeedCache>,
    pub reserver: Reserver,
    pub events: Events,
    pub metrics: Metrics,
    pub readiness: Readiness,
}

pub fn router(app: App) -> Router {
    Router::new()
        .route("/validate/machines/{cluster}", post(validate))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(app)
}

async fn readyz(State(app): State<App>) -> impl IntoResponse {
    if app.readiness.is_ready() {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

async fn validate(State(app): State<App>, Path(cluster): Path<String>, body: Bytes) -> Response {
    let started = Instant::now();
    let review: AdmissionReview = match serde_json::from_slice(&body) {
        Ok(review) => review,
        Err(e) => {
            return (StatusCode::BAD_REQUEST, format!("not an AdmissionReview: {e}")).into_response();
        }
    };
    let Some(request) = review.request else {
        return (StatusCode::BAD_REQUEST, "the AdmissionReview has no request").into_response();
    };
    let span = info_span!("admission", cluster = %cluster, project = tracing::field::Empty, operation = %request.operation);
    let verdict = app.admit(&cluster, &request).instrument(span).await;
    app.metrics.record(&verdict);
    app.metrics.duration.observe(started.elapsed().as_secs_f64());
    axum::Json(AdmissionResponse::from_verdict(&request.uid, &verdict).into_review()).into_response()
}

impl App {
    /// Decides one admission request (the whole path: sizing, lookup, decision, reservation).
    pub async fn admit(&self, cluster: &str, request: &AdmissionRequest) -> Verdict {
        if request.resource.resource != "machines" || request.sub_resource.is_some() {
            return Verdict::allow(Reason::Unchanged);
        }
        let object = match machine_of(request.object.as_ref()) {
            Ok(m) => m,
            Err(e) => {
                return Verdict::deny(
                    Reason::BadRequest,
                    &request.name,
                    &format!("is not a readable Machine: {e}"),
                );
            }
        };
        // A failed read of the old object only loses the "was it this big already" answer.
        let old = machine_of(request.old_object.as_ref()).ok().flatten();
        let name = object
            .as_ref()
            .and_then(|m| m.metadata.name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| request.name.clone());
        let ask = ask_for(
            &request.operation,
            object.as_ref(),
            old.as_ref(),
            &self.cache.catalog(),
        );
        let decision_request = Request {
            machine: name.clone(),
            ask,
            dry_run: request.dry_run.unwrap_or(false),
        };
        let grows =
            decision_request.ask.growth().is_some() || matches!(decision_request.ask, Ask::Unsizeable(_));
        if !grows {
            // Deletes, shrinks and unrelated updates pass whatever happens below; look the quota
            // up only for the over-quota warning.
            let project = self
                .cache
                .cluster(cluster)
                .and_then(|c| c.project_id().map(str::to_owned));
            let state = project.as_deref().and_then(|p| {
                self.cache
                    .quota_for(p)
                    .and_then(|q| QuotaCopy::from_dynamic(&q).ok())
                    .and_then(|c| c.state().ok())
            });
            return decide(
                project.as_deref().unwrap_or_default(),
                state.as_ref(),
                &decision_request,
            );
        }
        let owners = object
            .as_ref()
            .and_then(|m| m.metadata.owner_references.clone())
            .unwrap_or_default();
        let machine = MachineRef {
            cluster: cluster.to_owned(),
            namespace: request.namespace.clone().unwrap_or_default(),
            name: name.clone(),
            uid: object
                .as_ref()
                .and_then(|m| m.metadata.uid.clone())
                .unwrap_or_default(),
        };
        let verdict = self.admit_growing(machine, &decision_request).await;
        if !verdict.allowed
            && !decision_request.dry_run
            && matches!(verdict.reason, Reason::QuotaExceeded | Reason::Unsizeable)
            && let Some(message) = &verdict.event_message
        {
            self.events.emit(DenialEvent {
                cluster: cluster.to_owned(),
                machine_namespace: request.namespace.clone().unwrap_or_default(),
                owners,
                reason: verdict.reason.camel().to_owned(),
                message: message.clone(),
            });
        }
        debug!(machine = %name, allowed = verdict.allowed, reason = %verdict.reason, "admission decided");
        verdict
    }

    /// A request that would grow the project's usage (or cannot be sized): needs the project,
    /// its quota and, when it fits, a reservation.
    async fn admit_growing(&self, machine: MachineRef, request: &Request) -> Verdict {
        let name = &request.machine;
        let cluster = machine.cluster.clone();
        if !self.readiness.is_ready() {
            return Verdict::deny(
                Reason::Error,
                name,
                "cannot be checked against its project's quota yet: the quota webhook is still starting; try again",
            );
        }
        let Some(cluster_object) = self.cache.cluster(&cluster) else {
            return Verdict::deny(
                Reason::UnknownCluster,
                name,
                &format!(
                    "cannot be checked against a quota: user cluster {cluster:?} is not known on this seed (no Cluster object of that name), so its project is unknown"
                ),
            );
        };
        let Some(project) = cluster_object.project_id().map(str::to_owned) else {
            return Verdict::deny(
                Reason::UnknownCluster,
                name,
                &format!(
                    "cannot be checked against a quota: the Cluster {cluster:?} has no project-id label, so its project is unknown"
                ),
            );
        };
        tracing::Span::current().record("project", project.as_str());
        let Some(quota) = self.cache.quota_for(&project) else {
            return decide(&project, None, request);
        };
        if matches!(request.ask, Ask::Unsizeable(_)) {
            let state = QuotaCopy::from_dynamic(&quota).ok().and_then(|c| c.state().ok());
            return decide(&project, state.as_ref(), request);
        }
        self.reserver.submit(&project, machine, request.clone()).await
    }
}

/// Serves `router` over TLS on `listener` until `token` is cancelled (or this future is
/// dropped, which also ends every open connection).
pub async fn serve_https(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    router: Router,
    metrics: Metrics,
    token: CancellationToken,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = token.cancelled() => return,
            accepted = listener.accept() => {
                let (tcp, peer) = match accepted {
                    Ok(pair) => pair,
                    Err(e) => {
                        warn!(error = %e, "accept failed");
                        continue;
                    }
                };
                metrics.connections.inc();
                let acceptor = acceptor.clone();
                let router = router.clone();
                connections.spawn(async move {
                    let tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(e)) => {
                            debug!(error = %e, %peer, "TLS handshake failed");
                            return;
                        }
                        Err(_) => return,
                    };
                    let service = TowerToHyperService::new(router);
                    if let Err(e) = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await
                    {
                        debug!(error = %e, %peer, "connection ended with an error");
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}
