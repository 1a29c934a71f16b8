//! machine-webhook: race-free admission of machine-controller `Machine`s against project
//! quotas (each seed's `QuotaLedger`).
//!
//! - [`decision`]: the pure decision (quota + reservations + size -> allow / deny / warn).
//! - [`review`]: `AdmissionReview` on the wire; what a request asks of the quota.
//! - [`reserve`]: per-project batching, the compare-and-swap ledger writer, and admissions from
//!   this process's allotment.
//! - [`demand`]: this process's demand for share while requests wait for it (pure).
//! - [`cache`]: watches on the seed (quota copies, Clusters, admin size catalog).
//! - [`events`]: denial Events on the `MachineDeployment` / `MachineSet` / `Cluster`.
//! - [`waiting`] (pure) and [`wake`]: the owners of Machines refused for room, nudged when room
//!   appears so that machine-controller tries again at once.
//! - [`user_clients`]: clients for user clusters from their admin kubeconfigs on the seed.
//! - [`owners`]: a Machine's `MachineSet` / `MachineDeployment`.
//! - [`rollout`]: the Machine a rollout's surge replaces, for the opt-in rollout allowance; and
//!   the `MachineDeployment` a new Machine is of, for the policy `reservedCounts`.
//! - [`deployments`]: autoscaled `MachineDeployment` creates and changes under `reservedCounts`.
//! - `kkp_quota_runtime::webhook_auth`: the per-cluster token in the URL that authenticates each call
//!   (shared with seed-controller, which writes the URLs).
//! - [`server`], [`tls`]: HTTPS with certificates reloaded from disk, limits on bodies and time.
//! - [`metrics`]: Prometheus metrics.
//!
//! [`Webhook::start`] binds everything and returns the future that serves it; dropping that
//! future (or aborting its task) stops every part of it.

pub mod args;
pub mod cache;
pub mod clusters;
pub mod decision;
pub mod demand;
pub mod deployments;
pub mod events;
pub mod metrics;
pub mod owners;
pub mod reserve;
pub mod review;
pub mod rollout;
pub mod server;
pub use kkp_quota_runtime::tls;
pub mod user_clients;
pub mod waiting;
pub mod wake;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use kkp_quota_runtime::RuntimeError;
use kkp_quota_runtime::ops::{self, Readiness};
use kkp_quota_runtime::webhook_auth as auth;
use kube::Client;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::cache::SeedCache;
use crate::metrics::Metrics;
use crate::reserve::{AllotmentConfig, Reserver, ReserverConfig};
use crate::server::{App, Authenticator, Limits};

/// Everything the webhook is configured with.
#[derive(Debug, Clone)]
pub struct Config {
    /// HTTPS address for admission requests.
    pub listen_address: SocketAddr,
    pub tls_cert_file: PathBuf,
    pub tls_key_file: PathBuf,
    /// Plain HTTP address for `/metrics`, `/healthz`, `/readyz`; `None` serves none.
    pub metrics_address: Option<SocketAddr>,
    /// The seed's KKP namespace (holds the admin size catalog `ConfigMap`).
    pub kubermatic_namespace: String,
    /// Most requests of one project decided and written together.
    pub max_batch: usize,
    /// Reservation writes tried per batch before denying with reason `error`.
    pub max_attempts: u32,
    /// Same denial on the same object within this window: one Event, its count increased.
    pub event_window: Duration,
    /// Allotments (escrow); `None`: every admission waits for its own ledger write.
    pub allotments: Option<AllotmentConfig>,
    /// How calls are authenticated; `None` refuses to start (a webhook anyone can call lets
    /// anyone lock any project out).
    pub auth: Option<AuthConfig>,
    /// Body size and read timeouts.
    pub limits: Limits,
    /// How long a request that fits the quota waits for share to move to this seed (or for
    /// other processes to give their allotments back) before it is denied.
    pub share_wait: Duration,
    /// How long a demand for share stays after its last waiting request.
    pub share_demand_ttl: Duration,
    /// Added to the wall clock where ledger entries are dated: for tests of clock skew only.
    pub test_clock_offset: jiff::SignedDuration,
    /// Waking the owners of Machines refused for room when room appears; `None`: never.
    pub wake: Option<waiting::WakeConfig>,
    /// This seed's name: `Cluster` creates under another seed's name are refused (`None`: any).
    pub seed_name: Option<String>,
}

/// How admission calls are authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthConfig {
    /// The URL-signing key file (one base64 key per line; the first signs, all verify),
    /// reloaded when it changes. The same file is given to seed-controller.
    UrlSigningKeys(PathBuf),
    /// No authentication (`--insecure-no-auth`): for experiments only.
    InsecureNoAuth,
}

impl Config {
    pub fn new(listen_address: SocketAddr, tls_cert_file: PathBuf, tls_key_file: PathBuf) -> Config {
        Config {
            listen_address,
            tls_cert_file,
            tls_key_file,
            metrics_address: None,
            kubermatic_namespace: "kubermatic".into(),
            max_batch: 256,
            max_attempts: 10,
            event_window: Duration::from_mins(10),
            allotments: Some(AllotmentConfig::default()),
            auth: None,
            limits: Limits::default(),
            share_wait: ReserverConfig::default().share_wait,
            share_demand_ttl: ReserverConfig::default().demand_ttl,
            test_clock_offset: jiff::SignedDuration::ZERO,
            wake: Some(waiting::WakeConfig::default()),
            seed_name: None,
        }
    }
}

/// Why the webhook could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("serving certificate: {0}")]
    Tls(#[from] tls::TlsError),
    #[error("binding {address}: {source}")]
    Bind {
        address: SocketAddr,
        source: std::io::Error,
    },
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(
        "no URL-signing keys: give --url-signing-keys <file> (the same file seed-controller signs with), or --insecure-no-auth to let anyone who can reach the port spend any project's quota"
    )]
    NoAuth,
    #[error("URL-signing keys: {0}")]
    Keys(#[from] auth::KeyError),
}

/// How calls are authenticated; no configuration at all is an error.
fn authenticator(auth: Option<&AuthConfig>) -> Result<Authenticator, Error> {
    match auth {
        None => Err(Error::NoAuth),
        Some(AuthConfig::UrlSigningKeys(path)) => Ok(Authenticator::UrlTokens(Arc::new(
            auth::ReloadingKeys::new(path)?,
        ))),
        Some(AuthConfig::InsecureNoAuth) => {
            tracing::warn!(
                "--insecure-no-auth: admission calls are not authenticated; anyone who can reach the port can spend or block any project's quota"
            );
            Ok(Authenticator::Disabled)
        }
    }
}

/// The admission listener, and the address it got (port 0 picks one).
async fn bind(address: SocketAddr) -> Result<(tokio::net::TcpListener, SocketAddr), Error> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|source| Error::Bind { address, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| Error::Bind { address, source })?;
    Ok((listener, bound))
}

type Serving = Pin<Box<dyn Future<Output = Result<(), Error>> + Send>>;

/// A bound, not yet serving webhook.
pub struct Webhook {
    /// Where admission requests are served (HTTPS).
    pub address: SocketAddr,
    /// Where `/metrics` is served, if anywhere.
    pub metrics_address: Option<SocketAddr>,
    pub readiness: Readiness,
    pub metrics: Metrics,
    /// The ledger writer; [`Reserver::release_all`] gives allotments back on a clean stop.
    pub reserver: Reserver,
    /// Stops serving gracefully (the binary's SIGTERM handling).
    pub shutdown: server::Shutdown,
    serving: Serving,
}

/// `/readyz` follows the caches (synced: ready), and stays false once the webhook is stopping.
async fn follow_readiness(ready: &Readiness, cache: &SeedCache, stopping: &server::Shutdown) {
    loop {
        ready.set(cache.is_synced() && !stopping.is_unready());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook")
            .field("address", &self.address)
            .field("metrics_address", &self.metrics_address)
            .finish_non_exhaustive()
    }
}

/// The seed's name the webhook serves `Cluster` creates under, warning when there is none.
fn seed_name(config: &Config) -> Option<String> {
    if config.seed_name.is_none() {
        tracing::warn!(
            "--seed-name is not set: Cluster creates are taken under any seed's name, so a token of another seed that shares the URL-signing keys is valid here"
        );
    }
    config.seed_name.clone()
}

impl Webhook {
    /// Loads the certificate, binds the listeners and prepares the watches; `seed` is a client
    /// for the seed cluster this webhook serves.
    pub async fn start(config: Config, seed: Client) -> Result<Webhook, Error> {
        let authenticator = authenticator(config.auth.as_ref())?;
        let metrics = Metrics::new()?;
        let readiness = Readiness::default();
        let cache = Arc::new(SeedCache::new());
        let token = CancellationToken::new();
        let reserver = Reserver::new(
            seed.clone(),
            Arc::clone(&cache),
            metrics.clone(),
            ReserverConfig {
                max_batch: config.max_batch,
                max_attempts: config.max_attempts,
                allotments: config.allotments.clone(),
                share_wait: config.share_wait,
                demand_ttl: config.share_demand_ttl,
                clock_offset: config.test_clock_offset,
                ..ReserverConfig::default()
            },
            token.clone(),
        );
        let (events, events_future) = events::start(
            seed.clone(),
            Arc::clone(&cache),
            metrics.clone(),
            config.event_window,
        );
        let waiting = wake::SharedWaiting::new(config.wake.unwrap_or_default());
        let waker = config.wake.map(|wake_config| wake::Waker {
            cache: Arc::clone(&cache),
            waiting: waiting.clone(),
            clients: user_clients::UserClients::new(seed.clone()),
            metrics: metrics.clone(),
            config: wake_config,
        });
        let cert = Arc::new(tls::ReloadingCert::new(
            &config.tls_cert_file,
            &config.tls_key_file,
        )?);
        let acceptor = TlsAcceptor::from(Arc::new(tls::server_config(cert)?));
        let (listener, address) = bind(config.listen_address).await?;
        let ops = match config.metrics_address {
            Some(addr) => {
                let (bound, fut) = ops::bind(addr, metrics.registry.clone(), readiness.clone()).await?;
                Some((bound, fut))
            }
            None => None,
        };
        let metrics_address = ops.as_ref().map(|(a, _)| *a);
        let app = App {
            cache: Arc::clone(&cache),
            reserver: reserver.clone(),
            events,
            waiting: config.wake.is_some().then_some(waiting),
            rollouts: Arc::new(rollout::Rollouts::new(Arc::clone(&cache), seed.clone())),
            metrics: metrics.clone(),
            readiness: readiness.clone(),
            auth: authenticator,
            auth_log: Arc::new(auth::RateLimitedLog::new(Duration::from_secs(10))),
            limits: config.limits,
            seed_name: seed_name(&config),
        };
        let router = server::router(app);
        let shutdown = server::Shutdown::default();
        let stopping = shutdown.clone();
        let ready = readiness.clone();
        let server_metrics = metrics.clone();
        let namespace = config.kubermatic_namespace.clone();
        let limits = config.limits;
        let serving = Box::pin(async move {
            // Dropping this future cancels every task it started.
            let _guard = token.clone().drop_guard();
            let watch_ready = follow_readiness(&ready, &cache, &stopping);
            let ops_future = async move {
                match ops {
                    Some((_, fut)) => fut.await.map_err(Error::from),
                    None => std::future::pending().await,
                }
            };
            info!(%address, "machine-webhook serving");
            tokio::select! {
                () = Arc::clone(&cache).run(seed, namespace) => Ok(()),
                () = events_future => Ok(()),
                () = server::serve_https(listener, acceptor, router, server_metrics, limits, token.clone(), stopping.clone()) => Ok(()),
                () = watch_ready => Ok(()),
                () = wake::Waker::run(waker) => Ok(()),
                r = ops_future => r,
            }
        });
        Ok(Webhook {
            address,
            metrics_address,
            readiness,
            metrics,
            reserver,
            shutdown,
            serving,
        })
    }

    /// Serves until an unrecoverable error (or until dropped).
    pub async fn run(self) -> Result<(), Error> {
        self.serving.await
    }

    /// Serves until SIGTERM or SIGINT, then stops without failing an admission: not ready but
    /// still serving for `delay` (while endpoints drop the pod), connections closed once their
    /// requests are answered, allotments given back. Each step keeps serving polled: the
    /// workers that record and give back run inside it.
    pub async fn run_until_signal(self, delay: Duration) -> Result<(), Error> {
        let reserver = self.reserver.clone();
        let shutdown = self.shutdown.clone();
        let serving = self.run();
        tokio::pin!(serving);
        let signal = tokio::select! {
            result = &mut serving => return result,
            signal = kkp_quota_runtime::shutdown_signal() => signal,
        };
        info!(
            signal,
            ?delay,
            "stopping: not ready, still serving while endpoints drop this pod"
        );
        shutdown.unready();
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            result = &mut serving => return result,
        }
        info!("stopping: closing connections once their requests are answered");
        shutdown.close();
        tokio::select! {
            () = shutdown.drained() => {}
            result = &mut serving => return result,
        }
        info!("stopping: giving allotments back");
        tokio::select! {
            _ = reserver.release_all(Duration::from_secs(5)) => {}
            result = &mut serving => result?,
        }
        Ok(())
    }
}
