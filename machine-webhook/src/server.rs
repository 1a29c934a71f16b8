//! The HTTPS server: `POST /validate/machines/{cluster}/{token}` answers a user cluster's
//! `AdmissionReview`s of Machines, `POST /validate/clusters/{seed}/{token}` the seed's of
//! `Cluster` creates ([`crate::clusters`]), plus `/healthz` and `/readyz`.
//!
//! Order of checks on an admission call, each answered without going further:
//! 1. the token in the path ([`kkp_quota_runtime::webhook_auth`]): 401 without one, 403 when it is not valid for that
//!    cluster (or the cluster is unknown), 503 before the `Cluster`s are listed. Nothing is read
//!    of the body, no quota is looked at, nothing is reserved;
//! 2. the body: at most [`Limits::max_body_bytes`] (413), read within
//!    [`Limits::body_read_timeout`] (408); headers within [`Limits::header_read_timeout`] (the
//!    connection is closed);
//! 3. an `admission.k8s.io/v1` `AdmissionReview` with a request (400 otherwise);
//! 4. the decision.
//!
//! The seed's path for `Cluster` creates checks the token against the seed's name alone (no
//! `Cluster` object to look up, so no 503 before the caches are synced and no unknown-cluster
//! refusal; a request before the sync is refused by the decision, as "still starting").

mod room;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http_body_util::BodyExt as _;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kkp_quota_crds::rollout::SurgeRefusal;
use kkp_quota_runtime::ops::Readiness;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, info, info_span, warn};

use crate::cache::{QuotaCopy, SeedCache};
use crate::clusters::{cluster_create, reservation_ref};
use crate::decision::autoscaled::{Autoscaled, Member};
use crate::decision::{Ask, Reason, Request as DecisionRequest, Subject, Verdict, decide, rollout_hint};
use crate::deployments::deployment_change;
use crate::events::{DenialEvent, Events};
use crate::metrics::Metrics;
use crate::owners::{owner, reconciling_owner};
use crate::reserve::{MachineRef, Reserver};
use crate::review::{AdmissionRequest, AdmissionResponse, decision_request, parse_review};
use crate::rollout::Rollouts;
use crate::waiting::{Owner, Refusal};
use crate::wake::SharedWaiting;
use kkp_quota_runtime::webhook_auth::{AuthFailure, RateLimitedLog, ReloadingKeys, SEED_CLUSTERS_UID};

/// Bounds on what one call may cost the server.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest body accepted (413 above). Kubernetes' own limit for a request is 3 MiB.
    pub max_body_bytes: usize,
    /// Time allowed for a request's headers on HTTP/1.1 (slowloris): the connection is closed.
    pub header_read_timeout: Duration,
    /// Time allowed for a whole body, from the end of the headers (408 after).
    pub body_read_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_body_bytes: 3 * 1024 * 1024,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(10),
        }
    }
}

/// How admission calls are authenticated.
#[derive(Debug, Clone)]
pub enum Authenticator {
    /// A token per user cluster in the URL, signed with these keys ([`kkp_quota_runtime::webhook_auth`]).
    UrlTokens(Arc<ReloadingKeys>),
    /// None (`--insecure-no-auth`): anyone who reaches the port can spend any project's quota.
    Disabled,
}

/// The client's address, put into every request of a connection.
#[derive(Debug, Clone, Copy)]
struct Peer(SocketAddr);

/// Everything a request handler needs.
#[derive(Clone)]
pub struct App {
    pub cache: Arc<SeedCache>,
    pub reserver: Reserver,
    pub events: Events,
    /// Owners of Machines refused for room, to wake when room appears (`None`: not woken).
    pub waiting: Option<SharedWaiting>,
    /// Reads user clusters for quotas with a rollout allowance.
    pub rollouts: Arc<Rollouts>,
    pub metrics: Metrics,
    pub readiness: Readiness,
    pub auth: Authenticator,
    pub auth_log: Arc<RateLimitedLog>,
    pub limits: Limits,
    /// This seed's name (`--seed-name`): the only one its `Cluster` creates are taken under.
    pub seed_name: Option<String>,
}

pub fn router(app: App) -> Router {
    Router::new()
        .route("/validate/machines/{cluster}", post(validate_without_token))
        .route("/validate/machines/{cluster}/{token}", post(validate))
        .route(
            "/validate/machinedeployments/{cluster}",
            post(validate_deployments_without_token),
        )
        .route(
            "/validate/machinedeployments/{cluster}/{token}",
            post(validate_deployments),
        )
        .route("/validate/clusters/{seed}", post(validate_clusters_without_token))
        .route("/validate/clusters/{seed}/{token}", post(validate_clusters))
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

fn peer_of(request: &Request) -> Option<SocketAddr> {
    request.extensions().get::<Peer>().map(|p| p.0)
}

/// The path-less URL of before: no credentials. Served only with authentication off.
async fn validate_without_token(
    State(app): State<App>,
    Path(cluster): Path<String>,
    request: Request,
) -> Response {
    app.call(Subject::Machine, cluster, None, request).await
}

async fn validate(
    State(app): State<App>,
    Path((cluster, token)): Path<(String, String)>,
    request: Request,
) -> Response {
    app.call(Subject::Machine, cluster, Some(&token), request).await
}

/// A user cluster's autoscaled `MachineDeployment`s without credentials. Served only with
/// authentication off.
async fn validate_deployments_without_token(
    State(app): State<App>,
    Path(cluster): Path<String>,
    request: Request,
) -> Response {
    app.call(Subject::Deployment, cluster, None, request).await
}

/// A user cluster's autoscaled `MachineDeployment` creates and changes (the policy
/// `reservedCounts`, [`crate::deployments`]): the same token as its Machines'.
async fn validate_deployments(
    State(app): State<App>,
    Path((cluster, token)): Path<(String, String)>,
    request: Request,
) -> Response {
    app.call(Subject::Deployment, cluster, Some(&token), request)
        .await
}

/// The seed's `Cluster` creates without credentials. Served only with authentication off.
async fn validate_clusters_without_token(
    State(app): State<App>,
    Path(seed): Path<String>,
    request: Request,
) -> Response {
    app.call(Subject::Cluster, seed, None, request).await
}

/// The seed's `Cluster` creates ([`crate::clusters`]): the token is signed over the seed's name.
async fn validate_clusters(
    State(app): State<App>,
    Path((seed, token)): Path<(String, String)>,
    request: Request,
) -> Response {
    app.call(Subject::Cluster, seed, Some(&token), request).await
}

fn plain(status: StatusCode, text: impl Into<String>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        text.into(),
    )
        .into_response()
}

/// Reads a body of at most `limit` bytes within `timeout`.
async fn read_body(body: Body, limits: Limits) -> Result<Bytes, (StatusCode, &'static str, String)> {
    let collect = async move {
        let mut body = body;
        let mut buffer: Vec<u8> = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                (
                    StatusCode::BAD_REQUEST,
                    "malformed",
                    format!("reading the body: {e}"),
                )
            })?;
            if let Ok(data) = frame.into_data() {
                if buffer.len().saturating_add(data.len()) > limits.max_body_bytes {
                    return Err(too_large(limits));
                }
                buffer.extend_from_slice(&data);
            }
        }
        Ok(Bytes::from(buffer))
    };
    match tokio::time::timeout(limits.body_read_timeout, collect).await {
        Ok(result) => result,
        Err(_) => Err((
            StatusCode::REQUEST_TIMEOUT,
            "read_timeout",
            format!("the body was not received within {:?}", limits.body_read_timeout),
        )),
    }
}

fn too_large(limits: Limits) -> (StatusCode, &'static str, String) {
    (
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        format!("the body is larger than {} bytes", limits.max_body_bytes),
    )
}

impl App {
    /// One admission call for `subject` under `name` (the user cluster of a Machine, the seed
    /// of a `Cluster`): authenticated by its token (none: only with authentication off), then
    /// decided.
    async fn call(&self, subject: Subject, name: String, token: Option<&str>, request: Request) -> Response {
        if let Err(failure) = self.authenticate(subject, &name, token.unwrap_or_default()) {
            return self.refuse(failure, &name, peer_of(&request));
        }
        self.validate_body(subject, name, request.into_body()).await
    }

    /// Checks the URL token of a call: for a Machine, against the `Cluster` object of `name` in
    /// the cache (its UID is signed); for a seed's `Cluster` create, against the seed's name,
    /// which must be this seed's (`--seed-name`, when set).
    pub fn authenticate(&self, subject: Subject, name: &str, token: &str) -> Result<(), AuthFailure> {
        // Another seed's path: its token may well verify (seeds may share the keys), but what it
        // would reserve here is keyed by a name this seed never counts.
        if subject == Subject::Cluster && self.seed_name.as_deref().is_some_and(|seed| seed != name) {
            return Err(AuthFailure::InvalidToken);
        }
        let Authenticator::UrlTokens(keys) = &self.auth else {
            return Ok(());
        };
        if token.is_empty() {
            return Err(AuthFailure::MissingToken);
        }
        let uid = match subject {
            Subject::Machine | Subject::Deployment => {
                if !self.cache.is_synced() {
                    return Err(AuthFailure::NotReady);
                }
                self.cache
                    .cluster(name)
                    .and_then(|c| c.metadata.uid.clone())
                    .ok_or(AuthFailure::UnknownCluster)?
            }
            Subject::Cluster => SEED_CLUSTERS_UID.to_owned(),
        };
        match keys.current().verify(name, &uid, token) {
            Some(index) => {
                let key = if index == 0 { "signing" } else { "older" };
                self.metrics.authenticated.with_label_values(&[key]).inc();
                Ok(())
            }
            None => Err(AuthFailure::InvalidToken),
        }
    }

    fn refuse(&self, failure: AuthFailure, cluster: &str, peer: Option<SocketAddr>) -> Response {
        self.metrics
            .auth_failures
            .with_label_values(&[failure.as_str()])
            .inc();
        if failure != AuthFailure::NotReady {
            self.auth_log.refused(failure, cluster, peer);
        }
        let status = StatusCode::from_u16(failure.status()).unwrap_or(StatusCode::FORBIDDEN);
        plain(status, failure.body())
    }

    fn invalid(&self, status: StatusCode, reason: &'static str, text: String) -> Response {
        self.metrics.invalid_requests.with_label_values(&[reason]).inc();
        plain(status, text)
    }

    /// An authenticated call: read and parse the body, then decide (`cluster`: the user cluster of
    /// a Machine, the seed of a `Cluster`).
    async fn validate_body(&self, subject: Subject, cluster: String, body: Body) -> Response {
        let started = Instant::now();
        let body = match read_body(body, self.limits).await {
            Ok(body) => body,
            Err((status, reason, text)) => return self.invalid(status, reason, text),
        };
        let request = match parse_review(&body) {
            Ok(request) => request,
            Err(e) => return self.invalid(StatusCode::BAD_REQUEST, "malformed", e.to_string()),
        };
        let span = info_span!("admission", cluster = %cluster, project = tracing::field::Empty, operation = %request.operation);
        let verdict = match subject {
            Subject::Machine => self.admit(&cluster, &request).instrument(span).await,
            Subject::Cluster => self.admit_cluster(&cluster, &request).instrument(span).await,
            Subject::Deployment => self.admit_deployment(&cluster, &request).instrument(span).await,
        };
        self.metrics.record(subject, &verdict);
        self.metrics.duration.observe(started.elapsed().as_secs_f64());
        axum::Json(AdmissionResponse::from_verdict(&request.uid, &verdict).into_review()).into_response()
    }
}

impl App {
    /// Decides one admission request (the whole path: sizing, lookup, decision, reservation).
    pub async fn admit(&self, cluster: &str, request: &AdmissionRequest) -> Verdict {
        let (object, decision_request) = match decision_request(request, &self.cache.catalog()) {
            Ok(parts) => parts,
            Err(answer) => return *answer,
        };
        let name = decision_request.machine.clone();
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
        let decision_request = self.with_room(decision_request, &machine, &owners).await;
        let mut verdict = self.admit_growing(machine.clone(), &decision_request).await;
        if verdict.reason == Reason::QuotaExceeded
            && matches!(decision_request.ask, Ask::Create(_))
            && owner(&owners, "MachineSet").is_some()
        {
            match self.try_surge(&machine, &owners, &decision_request).await {
                Some(Ok(surge)) => return surge,
                Some(Err(refusal)) => {
                    if let Some(message) = verdict.message.as_mut() {
                        message.push_str("; the project's rollout allowance does not apply: ");
                        message.push_str(&refusal.to_string());
                    }
                }
                None => {}
            }
            if let Some(message) = verdict.message.as_mut() {
                message.push_str(&rollout_hint());
            }
        }
        if !verdict.allowed
            && !decision_request.dry_run
            && matches!(
                verdict.reason,
                Reason::QuotaExceeded | Reason::ShareInTransit | Reason::Unsizeable | Reason::LedgerMissing
            )
            && let Some(message) = &verdict.event_message
        {
            self.remember_waiting(cluster, request, &owners, &verdict, &decision_request);
            self.events.emit(DenialEvent {
                cluster: cluster.to_owned(),
                machine_namespace: request.namespace.clone().unwrap_or_default(),
                owners,
                reason: verdict.reason.camel().to_owned(),
                message: message.clone(),
            });
        }
        debug!(machine = %name, uid = %machine.uid, allowed = verdict.allowed, reason = %verdict.reason, "admission decided");
        verdict
    }

    /// A new Machine of a `MachineSet` refused for room, under a quota with a rollout allowance:
    /// admitted over the limit if it is a rollout's surge that may be ([`crate::rollout`],
    /// [`Reserver::admit_surge`]). `None`: the quota has no allowance.
    async fn try_surge(
        &self,
        machine: &MachineRef,
        owners: &[OwnerReference],
        request: &DecisionRequest,
    ) -> Option<Result<Verdict, SurgeRefusal>> {
        let project = self.cache.cluster(&machine.cluster)?.project_id()?.to_owned();
        let copy = QuotaCopy::from_dynamic(&*self.cache.quota_for(&project)?).ok()?;
        copy.spec.rollout_allowance.as_ref()?;
        let growth = request.ask.growth()?;
        let groups = copy
            .spec
            .shares
            .as_ref()
            .map(|s| s.groups.as_slice())
            .unwrap_or_default();
        if let Some(refusal) = crate::decision::grouped(groups, &growth) {
            debug!(machine = %machine.name, %refusal, "no rollout surge");
            return Some(Err(refusal));
        }
        let taken: Vec<String> = copy
            .status
            .iter()
            .flat_map(|s| s.rollout_surges.iter().map(|r| r.replaces.clone()))
            .collect();
        let outcome = async {
            let replaced = self
                .rollouts
                .replaced(&machine.cluster, &machine.namespace, owners, &growth, &taken)
                .await?;
            self.reserver
                .admit_surge(&project, &copy.name, machine, request, &replaced)
                .await
        }
        .await;
        if let Err(refusal) = &outcome {
            debug!(machine = %machine.name, %refusal, "no rollout surge");
        }
        Some(outcome)
    }

    /// A new Machine refused until room appears (not one that cannot be sized, nor a grown
    /// Machine: machine-controller retries creates, never updates): its owner is remembered,
    /// to be woken when room appears ([`crate::wake`]).
    fn remember_waiting(
        &self,
        cluster: &str,
        request: &AdmissionRequest,
        owners: &[OwnerReference],
        verdict: &Verdict,
        decision_request: &DecisionRequest,
    ) {
        let (Some(waiting), Ask::Create(size)) = (&self.waiting, &decision_request.ask) else {
            return;
        };
        let refusal = match verdict.reason {
            Reason::QuotaExceeded => Refusal::NoRoom,
            Reason::ShareInTransit => Refusal::ShareElsewhere,
            Reason::LedgerMissing => Refusal::LedgerMissing,
            _ => return,
        };
        let Some(owner) = reconciling_owner(owners) else {
            return;
        };
        let Some(project) = self
            .cache
            .cluster(cluster)
            .and_then(|c| c.project_id().map(str::to_owned))
        else {
            return;
        };
        let owner = Owner {
            cluster: cluster.to_owned(),
            namespace: request.namespace.clone().unwrap_or_default(),
            api_version: owner.api_version.clone(),
            kind: owner.kind.clone(),
            name: owner.name.clone(),
            uid: owner.uid.clone(),
        };
        let mut table = waiting.lock();
        table.refused(owner, &project, size.clone(), refusal, jiff::Timestamp::now());
        self.metrics
            .waiting_owners
            .set(i64::try_from(table.len()).unwrap_or(i64::MAX));
    }

    /// A request that would grow the project's usage (or cannot be sized): needs the project,
    /// its quota and, when it fits, a reservation.
    async fn admit_growing(&self, machine: MachineRef, request: &DecisionRequest) -> Verdict {
        let name = &request.machine;
        let cluster = machine.cluster.clone();
        // The caches, not `/readyz`: a stopping webhook reports not ready while it still
        // answers (see [`Shutdown`]).
        if !self.cache.is_synced() {
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
        self.reserve_growth(&project, machine, request).await
    }

    /// A `Cluster` create on seed `seed` ([`crate::clusters`]): one cluster of its project,
    /// reserved like a Machine's growth under the seed's name.
    pub async fn admit_cluster(&self, seed: &str, request: &AdmissionRequest) -> Verdict {
        let create = match cluster_create(request) {
            Ok(create) => create,
            Err(answer) => return *answer,
        };
        let Some(project) = create.project.clone() else {
            return Verdict::allow(Reason::NoQuota);
        };
        if !self.cache.is_synced() {
            return create.request.deny(
                Reason::Error,
                "cannot be checked against its project's quota yet: the quota webhook is still starting; try again",
            );
        }
        tracing::Span::current().record("project", project.as_str());
        let reference = reservation_ref(seed, &create.name, &create.uid);
        let verdict = self.reserve_growth(&project, reference, &create.request).await;
        debug!(cluster = %create.name, uid = %create.uid, allowed = verdict.allowed, reason = %verdict.reason, "cluster admission decided");
        verdict
    }

    /// The decision on a request that grows `project`'s usage, and its reservation when admitted.
    async fn reserve_growth(&self, project: &str, machine: MachineRef, request: &DecisionRequest) -> Verdict {
        // Dry runs and Machines that cannot be sized write nothing.
        if matches!(request.ask, Ask::Unsizeable(_)) || request.dry_run {
            return self.reserver.decide_without_writing(project, request).await;
        }
        // Without a ledger in the cache there is nothing to write either (KKP's copy of the
        // quota alone is here: refused, since it cannot be checked; no quota at all: passed).
        // But the decision reads the ledger afresh, and one created since the cache looked (a
        // deleted ledger re-created) is found there: an admission it allows must be recorded,
        // so it goes the write path (issue #32: admitted unrecorded, it overran the quota).
        if self.cache.quota_for(project).is_none() {
            let verdict = self.reserver.decide_without_writing(project, request).await;
            if verdict.reserve.is_none() {
                return verdict;
            }
        }
        self.reserver.submit(project, machine, request.clone()).await
    }
}

/// How long a graceful close waits for the requests in flight.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `router` over TLS on `listener` until `token` is cancelled (or this future is
/// dropped, which also ends every open connection). When `shutdown` closes, it stops accepting
/// and closes every connection gracefully (requests in flight are answered; idle HTTP/1
/// connections close, HTTP/2 ones get GOAWAY, so the API server opens new ones elsewhere),
/// marks `shutdown` drained, and then waits for `token` without serving.
pub async fn serve_https(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    router: Router,
    metrics: Metrics,
    limits: Limits,
    token: CancellationToken,
    shutdown: Shutdown,
) {
    let mut connections = JoinSet::new();
    let graceful = GracefulShutdown::new();
    loop {
        tokio::select! {
            () = token.cancelled() => return,
            () = shutdown.close.cancelled() => break,
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
                // Every request of the connection carries the peer's address (for refusal logs).
                let router = router.clone().layer(axum::Extension(Peer(peer)));
                let watcher = graceful.watcher();
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
                    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    builder
                        .http1()
                        .timer(TokioTimer::new())
                        .header_read_timeout(limits.header_read_timeout)
                        .max_buf_size(64 * 1024);
                    builder
                        .http2()
                        .timer(TokioTimer::new())
                        .max_header_list_size(64 * 1024)
                        .max_concurrent_streams(256)
                        .keep_alive_interval(Some(Duration::from_secs(30)))
                        .keep_alive_timeout(Duration::from_secs(20));
                    let connection = builder.serve_connection(TokioIo::new(tls), service).into_owned();
                    if let Err(e) = watcher.watch(connection).await {
                        debug!(error = %e, %peer, "connection ended with an error");
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    info!(connections = graceful.count(), "closing connections gracefully");
    if tokio::time::timeout(CLOSE_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        warn!(timeout = ?CLOSE_TIMEOUT, "requests still in flight after the close timeout; dropping them");
    }
    shutdown.drained.cancel();
    token.cancelled().await;
}

/// A webhook's stop, in the steps a pod being stopped needs (the binary runs them on SIGTERM):
/// [`Shutdown::unready`] turns `/readyz` false while the webhook still serves, so the pod
/// leaves its Service's endpoints before it stops answering; [`Shutdown::close`] then stops
/// accepting and closes the connections gracefully; [`Shutdown::drained`] resolves when that
/// is done.
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    unready: CancellationToken,
    close: CancellationToken,
    drained: CancellationToken,
}

impl Shutdown {
    pub fn unready(&self) {
        self.unready.cancel();
    }

    pub fn is_unready(&self) -> bool {
        self.unready.is_cancelled()
    }

    pub fn close(&self) {
        self.unready.cancel();
        self.close.cancel();
    }

    pub async fn drained(&self) {
        self.drained.cancelled().await;
    }
}
