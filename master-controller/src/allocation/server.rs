//! The allocation webhook over HTTPS: `POST /validate/allocation`, answered from watch caches of
//! the master's quotas, projects and groups, and the record of allowed raises
//! ([`super::pending`], [`super::record`]).
//!
//! A decision reads the record, decides over the caches with its entries counted, and, when it
//! allows an edit of a quota in an `allocation` group, appends the edit to the record before
//! answering; a lost compare-and-swap decides again. One process decides one request at a time
//! (fewer lost writes); several replicas are kept apart by the record.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use futures::FutureExt as _;
use futures::future::BoxFuture;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use k8s_openapi::api::core::v1::ConfigMap;
use kkp_quota_crds::kkp::Project;
use kkp_quota_crds::{GroupMode, ProjectQuota, QuotaGroup, QuotaGroupSpec, ResourceDetails, ResourceQuota};
use kkp_quota_runtime::tls::{ReloadingCert, TlsError, server_config};
use kube::{Api, Client, ResourceExt as _};
use tokio::net::TcpListener;
use tokio::sync::Mutex;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

use super::books::{Books, KkpEntry};
use super::cache::{self, Cache};
use super::decide::{Edit, Verdict, decide};
use super::pending::{Cached, Entry, Object, count, record_after};
use super::record;
use super::review::{AdmissionRequest, AdmissionReview, response};
use crate::metrics::Metrics;

/// The webhook's path.
pub use super::registration::PATH;

/// How long an entry of the record counts (each process timing it from its first sight): long
/// past the moment a watch cache shows its edit, and an edit never stored (another webhook
/// refused it, it lost a conflict, the API server crashed) holds its room no longer than this.
pub const PENDING_FOR: Duration = Duration::from_mins(1);

/// Where and with which certificate the webhook is served.
#[derive(Clone, Debug)]
pub struct Serving {
    pub address: SocketAddr,
    /// Namespace of the record of allowed raises.
    pub namespace: String,
    pub cert: PathBuf,
    pub key: PathBuf,
}

struct Checker {
    kkp: Arc<Cache<KkpEntry>>,
    ours: Arc<Cache<ResourceDetails>>,
    /// Projects not being deleted: their labels.
    projects: Arc<Cache<BTreeMap<String, String>>>,
    groups: Arc<Cache<QuotaGroupSpec>>,
    record: Api<ConfigMap>,
    /// When this process first saw each entry of the record (entries age out by it).
    first_seen: Mutex<HashMap<String, Instant>>,
    metrics: Metrics,
}

/// Why the webhook could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("binding {address}: {source}")]
    Bind {
        address: SocketAddr,
        source: std::io::Error,
    },
}

/// Binds, then serves until the future is dropped. The caches are filled before the first
/// answer: until then requests wait (and the API server's timeout refuses them).
pub async fn serve(
    master: Client,
    serving: Serving,
    metrics: Metrics,
) -> Result<(SocketAddr, BoxFuture<'static, ()>), ServeError> {
    let cert = Arc::new(ReloadingCert::new(&serving.cert, &serving.key)?);
    let acceptor = TlsAcceptor::from(Arc::new(server_config(cert)?));
    let listener = TcpListener::bind(serving.address)
        .await
        .map_err(|source| ServeError::Bind {
            address: serving.address,
            source,
        })?;
    let address = listener.local_addr().unwrap_or(serving.address);
    let (webhook, caches) = Webhook::start(master, &serving.namespace, metrics);
    let router = Router::new().route(PATH, post(review)).with_state(webhook);
    let run = async move {
        tokio::select! {
            () = caches => warn!("an allocation webhook cache stopped"),
            () = accept(listener, acceptor, router) => {}
        }
    };
    Ok((address, run.boxed()))
}

/// The webhook's decisions without the HTTPS server (what a replica answers).
#[derive(Clone)]
pub struct Webhook(Arc<Checker>);

impl Webhook {
    /// The webhook over `master`, its record in `namespace`, and the future that keeps its
    /// caches (requests wait until they are filled).
    pub fn start(master: Client, namespace: &str, metrics: Metrics) -> (Webhook, BoxFuture<'static, ()>) {
        for verdict in ["allowed", "refused"] {
            metrics.allocation_decisions.with_label_values(&[verdict]);
        }
        // Every replica holds these caches beside the leader's own: only what a decision reads.
        let (kkp, kkp_run) = cache::keep(Api::<ResourceQuota>::all(master.clone()), |q| {
            Some(KkpEntry::of(q))
        });
        let (ours, ours_run) = cache::keep(Api::<ProjectQuota>::all(master.clone()), |q| {
            Some(q.spec.quota.clone())
        });
        let (projects, projects_run) = cache::keep(Api::<Project>::all(master.clone()), |p| {
            p.metadata
                .deletion_timestamp
                .is_none()
                .then(|| p.labels().clone())
        });
        let (groups, groups_run) =
            cache::keep(Api::<QuotaGroup>::all(master.clone()), |g| Some(g.spec.clone()));
        let checker = Checker {
            kkp,
            ours,
            projects,
            groups,
            record: Api::namespaced(master, namespace),
            first_seen: Mutex::new(HashMap::new()),
            metrics,
        };
        let caches = async move {
            futures::future::join4(kkp_run, ours_run, projects_run, groups_run).await;
        }
        .boxed();
        (Webhook(Arc::new(checker)), caches)
    }

    /// The answer to an `AdmissionReview` (JSON).
    pub async fn review(&self, body: &[u8]) -> serde_json::Value {
        let Ok(Some(request)) = serde_json::from_slice::<AdmissionReview>(body).map(|r| r.request) else {
            return response("", &Verdict::Denied("not an AdmissionReview request".to_owned()));
        };
        let verdict = match request.edit() {
            Ok(edit) => self.0.decide(&request, &edit).await,
            Err(why) => Verdict::Denied(why),
        };
        let counted = if verdict == Verdict::Allowed {
            "allowed"
        } else {
            "refused"
        };
        self.0
            .metrics
            .allocation_decisions
            .with_label_values(&[counted])
            .inc();
        match &verdict {
            Verdict::Allowed => {
                debug!(kind = %request.kind.kind, name = %request.name, user = %request.user_info.username, "allowed");
            }
            Verdict::Denied(why) => {
                info!(kind = %request.kind.kind, name = %request.name, user = %request.user_info.username, %why, "refused");
            }
        }
        response(&request.uid, &verdict)
    }
}

async fn accept(listener: TcpListener, acceptor: TlsAcceptor, router: Router) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(pair) => pair,
            Err(e) => {
                warn!(error = %e, "accept failed");
                continue;
            }
        };
        let (acceptor, router) = (acceptor.clone(), router.clone());
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    debug!(error = %e, %peer, "TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            if let Err(e) = builder
                .serve_connection(TokioIo::new(tls), TowerToHyperService::new(router))
                .await
            {
                debug!(error = %e, %peer, "connection ended with an error");
            }
        });
    }
}

async fn review(State(webhook): State<Webhook>, body: axum::body::Bytes) -> axum::Json<serde_json::Value> {
    axum::Json(webhook.review(&body).await)
}

/// How many times one request decides again after losing the record's compare-and-swap.
const ATTEMPTS: usize = 8;

impl Checker {
    async fn decide(&self, request: &AdmissionRequest, edit: &Edit) -> Verdict {
        self.kkp.ready().await;
        self.ours.ready().await;
        self.projects.ready().await;
        self.groups.ready().await;
        let mut first_seen = self.first_seen.lock().await;
        for _ in 0..ATTEMPTS {
            let read = match record::read(&self.record).await {
                Ok(read) => read,
                Err(e) => {
                    return Verdict::Denied(format!("the allocation record cannot be read: {e}; try again"));
                }
            };
            let entries = fresh(&mut first_seen, read.entries);
            let (mut books, cached) = self.books();
            count(&mut books, &entries, &cached);
            let verdict = decide(&books, edit, &request.requester());
            if verdict != Verdict::Allowed {
                return verdict;
            }
            let new = match entries_for(request, edit, &books) {
                Ok(new) if new.is_empty() => return verdict,
                Ok(new) => new,
                Err(why) => return Verdict::Denied(why),
            };
            match record::write(&self.record, &record_after(&entries, new), read.version).await {
                Ok(()) => return Verdict::Allowed,
                Err(record::WriteError::Conflict) => self.metrics.allocation_record_conflicts.inc(),
                Err(e) => {
                    return Verdict::Denied(format!(
                        "the allowed edit could not be recorded: {e}; try again"
                    ));
                }
            }
        }
        Verdict::Denied("too many quota edits at once in allocation groups; try again".to_owned())
    }

    /// The books from the caches, and what they hold of each quota (UID and version).
    fn books(&self) -> (Books, BTreeMap<Object, Cached>) {
        let mut cached = BTreeMap::new();
        let books = Books {
            kkp: self.kkp.snapshot(Object::Kkp, &mut cached),
            ours: self.ours.snapshot(Object::Ours, &mut cached),
            projects: self.projects.values(),
            groups: self.groups.snapshot(Object::Group, &mut cached),
            pending_groups: Vec::new(),
        };
        (books, cached)
    }
}

/// The record's entries this process has seen for less than [`PENDING_FOR`] (timed from its
/// own first sight of each, so no two clocks are compared).
fn fresh(first_seen: &mut HashMap<String, Instant>, entries: Vec<Entry>) -> Vec<Entry> {
    let now = Instant::now();
    let keyed: Vec<(String, Entry)> = entries
        .into_iter()
        .map(|e| (serde_json::to_string(&e).unwrap_or_default(), e))
        .collect();
    first_seen.retain(|key, _| keyed.iter().any(|(k, _)| k == key));
    keyed
        .into_iter()
        .filter(|(key, _)| now.duration_since(*first_seen.entry(key.clone()).or_insert(now)) < PENDING_FOR)
        .map(|(_, e)| e)
        .collect()
}

/// The record entries for an allowed edit: one for each project whose allocation it raises
/// (a KKP quota moved to another project: both), and one for an `allocation` group created or
/// changed. An edit that raises nothing needs none: it cannot take a group over. `Err`: the
/// request does not say which object it is (it is refused rather than allowed unrecorded).
fn entries_for(request: &AdmissionRequest, edit: &Edit, books: &Books) -> Result<Vec<Entry>, String> {
    let meta = |v: &Option<serde_json::Value>, field: &str| {
        v.as_ref()?
            .get("metadata")?
            .get(field)?
            .as_str()
            .map(str::to_owned)
    };
    let uid = || {
        meta(&request.object, "uid")
            .or_else(|| meta(&request.old_object, "uid"))
            .ok_or_else(|| "the request carries no object UID to record the edit by".to_owned())
    };
    let base = meta(&request.old_object, "resourceVersion");
    let entry = |object: Object, uid: String, project: String, limits: ResourceDetails| Entry {
        object,
        uid,
        base: base.clone(),
        project,
        limits,
        group: None,
    };
    match edit {
        Edit::Group {
            name, new: Some(new), ..
        } if new.mode == GroupMode::Allocation => Ok(vec![Entry {
            group: Some(new.clone()),
            ..entry(
                Object::Group(name.clone()),
                uid()?,
                String::new(),
                ResourceDetails::default(),
            )
        }]),
        Edit::Group { .. } => Ok(Vec::new()),
        // A project's first quota loosens nothing (it was unlimited), but it is recorded: a
        // second create racing it (a cache without the first) is then no longer a first, even
        // if a group comes to select the project meanwhile.
        Edit::Kkp {
            name,
            old: None,
            new: Some(new),
        } if !super::decide::raises(books, edit) => Ok(vec![entry(
            Object::Kkp(name.clone()),
            uid()?,
            new.project.clone(),
            new.limits.clone(),
        )]),
        _ if !super::decide::raises(books, edit) => Ok(Vec::new()),
        Edit::Kkp { name, old, new } => {
            let uid = uid()?;
            let mut out = Vec::new();
            if let Some(new) = new {
                out.push(entry(
                    Object::Kkp(name.clone()),
                    uid.clone(),
                    new.project.clone(),
                    new.limits.clone(),
                ));
            }
            // The project it leaves, counted without it (unlimited) until the edit settles.
            if let Some(old) = old
                .as_ref()
                .filter(|o| new.as_ref().is_none_or(|n| n.project != o.project))
            {
                out.push(entry(
                    Object::Kkp(name.clone()),
                    uid,
                    old.project.clone(),
                    ResourceDetails::default(),
                ));
            }
            Ok(out)
        }
        Edit::Ours {
            name, project, new, ..
        } => {
            let project = books.kkp.get(name).map_or(project.clone(), |e| e.project.clone());
            let limits = new.clone().unwrap_or_default();
            Ok(vec![entry(Object::Ours(name.clone()), uid()?, project, limits)])
        }
    }
}
