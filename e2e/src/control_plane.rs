//! One cluster's control plane: a real etcd and a real kube-apiserver on loopback.
//!
//! Processes are `std::process::Child`ren wrapped in a private `Proc`, whose `Drop` sends SIGKILL and
//! reaps the child synchronously, so a test that fails or panics leaves no process and no zombie
//! behind (unwinding drops the [`ControlPlane`]); the temporary directory (etcd data, certificates,
//! logs, kubeconfig) is removed after the processes are gone.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use futures::future::try_join_all;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, ListParams, PostParams};

use crate::assets::control_plane_binaries;
use crate::certs::ClusterCerts;
use crate::ports::free_port;
use crate::process::{Proc, wait_process};

mod controller_manager;
mod etcd;
mod kubeconfig;

use etcd::start_etcd;
use kubeconfig::{admin_kubeconfig, client_cert_credentials, kubeconfig_yaml, write_pki};
pub use kubeconfig::{client_from_kubeconfig, kube_config};

/// How long `start` waits for etcd, then for kube-apiserver, each. Generous: several control
/// planes start at once on a small, shared machine.
pub const STARTUP_TIMEOUT: Duration = Duration::from_mins(2);
/// How long `start` waits for the CRDs to be established and served. As generous as the
/// start-up: `make test` starts several fleets at once on 2 cores, and one API server once took
/// over a minute to establish them.
pub const CRD_TIMEOUT: Duration = Duration::from_mins(2);
/// Attempts when a freshly picked port turns out to be taken by someone else.
const PORT_ATTEMPTS: usize = 4;

/// A running etcd + kube-apiserver pair with every CRD of `kkp_quota_crds::crd::all()` installed.
pub struct ControlPlane {
    name: String,
    port: u16,
    etcd_url: String,
    kubeconfig: String,
    /// [`ControlPlane::in_cluster_kubeconfig_yaml`].
    in_cluster_kubeconfig: String,
    config: kube::Config,
    certs: ClusterCerts,
    binaries: PathBuf,
    /// Whether kube-apiserver writes an audit log ([`ControlPlane::audit_log`]).
    audit: bool,
    /// Where pods of a fleet node reach this API server ([`StartOptions::pod_address`]).
    pod_address: Option<Ipv4Addr>,
    /// kube-controller-manager, when started ([`ControlPlane::start_controller_manager`]).
    /// Declared first of the processes: fields drop in order, so it dies before its API server.
    controller_manager: Mutex<Option<Proc>>,
    /// Declared before `etcd` and `dir`: fields drop in order, so kube-apiserver dies first,
    /// then etcd, then the directory goes.
    apiserver: Mutex<Option<Proc>>,
    /// `None` only for a moment while [`ControlPlane::restore_etcd`] swaps its data.
    etcd: Mutex<Option<Proc>>,
    /// etcd's client and peer ports, kept across a restore.
    etcd_ports: (u16, u16),
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("name", &self.name)
            .field("url", &self.url())
            .finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver on free loopback ports, waits until `/readyz` answers,
    /// installs every CRD and waits until each is established and served. `name` labels the
    /// temp dir, the logs and the kubeconfig's context.
    pub async fn start(name: &str) -> Result<ControlPlane> {
        ControlPlane::start_with(name, false).await
    }

    /// [`ControlPlane::start`], with kube-apiserver recording every request (metadata level:
    /// who, verb, resource, namespace, name, response code) in [`ControlPlane::audit_log`] when
    /// `audit` is set. The RBAC test reads it to see which permissions each component used.
    pub async fn start_with(name: &str, audit: bool) -> Result<ControlPlane> {
        ControlPlane::start_opts(
            name,
            StartOptions {
                audit,
                pod_address: None,
            },
        )
        .await
    }

    /// [`ControlPlane::start`] with every option.
    pub async fn start_opts(name: &str, options: StartOptions) -> Result<ControlPlane> {
        let StartOptions { audit, pod_address } = options;
        let started = Instant::now();
        let _ = rustls::crypto::ring::default_provider().install_default();
        let binaries = control_plane_binaries()?;
        let mut dir = tempfile::Builder::new()
            .prefix(&format!("kkp-quota-{name}-"))
            .tempdir()
            .context("creating the control plane's temp dir")?;
        // Pods reach the API server at the pod address, or as the `kubernetes` Service
        // (in-cluster clients connect to its ClusterIP and check the certificate for it).
        let extra_sans: Vec<String> = pod_address
            .iter()
            .flat_map(|ip| [ip.to_string(), KUBERNETES_SERVICE_IP.to_owned()])
            .collect();
        let mut certs = ClusterCerts::generate_with(name, &extra_sans)?;
        write_pki(dir.path(), &certs)?;

        let (etcd, etcd_ports) = start_etcd(&binaries, dir.path())
            .await
            .with_context(|| format!("{name}: etcd"))?;
        let etcd_url = format!("http://127.0.0.1:{}", etcd_ports.0);
        let mut etcd = Mutex::new(Some(etcd));
        tracing::debug!(cluster = name, elapsed = ?started.elapsed(), "etcd ready");

        let mut last_err = None;
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port()?;
            let kubeconfig = admin_kubeconfig(name, &loopback_url(port), &certs)?;
            let in_cluster_kubeconfig = match pod_address {
                Some(ip) => admin_kubeconfig(name, &format!("https://{ip}:{port}"), &certs)?,
                None => kubeconfig.clone(),
            };
            let config = kube_config(&kubeconfig).await?;
            let cp = ControlPlane {
                name: name.to_owned(),
                port,
                etcd_url: etcd_url.clone(),
                kubeconfig,
                in_cluster_kubeconfig,
                config,
                certs,
                binaries: binaries.clone(),
                audit,
                pod_address,
                controller_manager: Mutex::new(None),
                apiserver: Mutex::new(None),
                etcd,
                etcd_ports,
                dir,
            };
            match cp.spawn_apiserver().await {
                Ok(()) => {
                    tracing::debug!(cluster = name, elapsed = ?started.elapsed(), "kube-apiserver ready");
                    std::fs::write(cp.kubeconfig_path(), &cp.kubeconfig).context("writing kubeconfig")?;
                    cp.wait_for_namespaces().await?;
                    cp.install_crds()
                        .await
                        .with_context(|| format!("{name}: installing CRDs"))?;
                    tracing::info!(cluster = name, url = %cp.url(), elapsed = ?started.elapsed(), "control plane ready");
                    return Ok(cp);
                }
                Err(StartError::PortTaken(e)) => {
                    tracing::debug!(cluster = name, port, "apiserver port taken, retrying: {e:#}");
                    last_err = Some(e);
                    // Take the pieces back for the next attempt.
                    let ControlPlane {
                        certs: c,
                        etcd: e2,
                        dir: d,
                        ..
                    } = cp;
                    (certs, etcd, dir) = (c, e2, d);
                }
                Err(StartError::Other(e)) => return Err(e.context(format!("{name}: kube-apiserver"))),
            }
        }
        Err(last_err
            .unwrap_or_else(|| anyhow!("no attempt made"))
            .context(format!("{name}: no free port")))
    }

    /// The name given to [`ControlPlane::start`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `https://127.0.0.1:<port>`; the same across [`stop_apiserver`](Self::stop_apiserver) and
    /// [`start_apiserver`](Self::start_apiserver).
    pub fn url(&self) -> String {
        loopback_url(self.port)
    }

    /// kube-apiserver's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// etcd's client URL (`http://127.0.0.1:<port>`).
    pub fn etcd_url(&self) -> &str {
        &self.etcd_url
    }

    /// An admin kubeconfig (user in `system:masters`) with every certificate embedded.
    pub fn kubeconfig_yaml(&self) -> String {
        self.kubeconfig.clone()
    }

    /// The admin kubeconfig for a reader inside the fleet's clusters: the one a Secret on a seed
    /// or on the master holds. It names [`StartOptions::pod_address`] when the control plane has
    /// one (a pod's 127.0.0.1 is the pod itself), else it is [`ControlPlane::kubeconfig_yaml`].
    pub fn in_cluster_kubeconfig_yaml(&self) -> String {
        self.in_cluster_kubeconfig.clone()
    }

    /// [`ControlPlane::in_cluster_kubeconfig_yaml`] with its context's default namespace set to
    /// `namespace`: a simulated user cluster's, whose Machines live in that namespace (with
    /// seed-controller's `--machine-namespace-from-kubeconfig`).
    pub fn in_cluster_kubeconfig_with_namespace(&self, namespace: &str) -> anyhow::Result<String> {
        let mut doc: serde_json::Value = serde_saphyr::from_str(&self.in_cluster_kubeconfig)?;
        let contexts = doc
            .get_mut("contexts")
            .and_then(|c| c.as_array_mut())
            .ok_or_else(|| anyhow::anyhow!("a kubeconfig without contexts"))?;
        for context in contexts {
            if let Some(ctx) = context.get_mut("context").and_then(|c| c.as_object_mut()) {
                ctx.insert("namespace".into(), namespace.into());
            }
        }
        Ok(serde_saphyr::to_string(&doc)?)
    }

    /// [`StartOptions::pod_address`].
    pub fn pod_address(&self) -> Option<Ipv4Addr> {
        self.pod_address
    }

    /// The admin kubeconfig as a file inside the control plane's temp dir (for child processes).
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.dir.path().join("admin.kubeconfig")
    }

    /// A fresh admin client.
    pub fn client(&self) -> kube::Client {
        // The same config already built working clients in `start`; only TLS set-up can fail.
        kube::Client::try_from(self.config.clone()).expect("admin kube config was valid at start")
    }

    /// The admin `kube::Config`, to adjust timeouts and build clients yourself.
    pub fn config(&self) -> kube::Config {
        self.config.clone()
    }

    /// A kubeconfig for another user, signed by this cluster's client CA (for RBAC tests):
    /// the user is `user`, its groups are `groups`.
    pub fn kubeconfig_for_user(&self, user: &str, groups: &[&str]) -> Result<String> {
        let cert = self.certs.ca.client_cert(user, groups)?;
        kubeconfig_yaml(
            &self.name,
            &self.url(),
            self.certs.ca.cert_pem(),
            &format!("{}-{user}", self.name),
            &client_cert_credentials(&cert),
        )
    }

    /// A kubeconfig that authenticates with a bearer `token` (a service account's, for running a
    /// component as that account); `user` names the kubeconfig's user entry.
    pub fn kubeconfig_for_token(&self, user: &str, token: &str) -> Result<String> {
        let credentials = serde_json::json!({ "token": token });
        kubeconfig_yaml(
            &self.name,
            &self.url(),
            self.certs.ca.cert_pem(),
            user,
            &credentials,
        )
    }

    /// The cluster's CA certificate (PEM): it signed the serving certificate and client certs.
    pub fn ca_pem(&self) -> &str {
        self.certs.ca.cert_pem()
    }

    /// The temp dir holding etcd's data, the certificates and the logs (gone on drop).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Log file of kube-apiserver (stdout and stderr; appended across restarts).
    pub fn apiserver_log(&self) -> PathBuf {
        self.dir.path().join("kube-apiserver.log")
    }

    /// The audit log (JSON lines, one `audit.k8s.io/v1` Event each) when started with `audit`.
    pub fn audit_log(&self) -> PathBuf {
        self.dir.path().join("audit.log")
    }

    /// Log file of etcd.
    pub fn etcd_log(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    /// Process ids: etcd, then kube-apiserver if it is running, then kube-controller-manager
    /// if it was started.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids = vec![self.etcd_pid()];
        pids.extend(self.apiserver_pid());
        pids.extend(self.controller_manager_pid());
        pids
    }

    /// Process id of etcd.
    pub fn etcd_pid(&self) -> u32 {
        self.etcd
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map_or(0, Proc::pid)
    }

    /// Process id of kube-apiserver, `None` while it is stopped.
    pub fn apiserver_pid(&self) -> Option<u32> {
        self.apiserver().as_ref().map(Proc::pid)
    }

    /// Whether kube-apiserver is running (not stopped by [`stop_apiserver`](Self::stop_apiserver)).
    pub fn apiserver_running(&self) -> bool {
        self.apiserver().is_some()
    }

    /// Freezes kube-apiserver (SIGSTOP): connections are still accepted by the kernel but nothing
    /// answers, as behind a network partition that drops packets. Requests hang until the
    /// caller's own timeout, which is what timeout handling must be tested against ("connection
    /// refused" from [`stop_apiserver`](Self::stop_apiserver) is the easy case). Undo with
    /// [`resume_apiserver`](Self::resume_apiserver); dropping a paused control plane is fine.
    /// Returns once every thread of it is stopped: the kernel stops each thread as it next
    /// handles the signal, after `kill` has returned.
    pub fn pause_apiserver(&self) -> Result<()> {
        let pid = self.signal_apiserver("STOP")?;
        crate::wait::wait_until_blocking(
            Duration::from_secs(10),
            &format!("{}: kube-apiserver {pid} stopped after SIGSTOP", self.name),
            || crate::procfs::is_stopped(pid),
        )
    }

    /// Continues a kube-apiserver frozen by [`pause_apiserver`](Self::pause_apiserver) (SIGCONT).
    pub fn resume_apiserver(&self) -> Result<()> {
        self.signal_apiserver("CONT").map(drop)
    }

    /// Sends `signal` to kube-apiserver; returns its pid.
    fn signal_apiserver(&self, signal: &str) -> Result<u32> {
        let pid = self
            .apiserver_pid()
            .with_context(|| format!("{}: kube-apiserver is stopped", self.name))?;
        // `kill(1)`: sending a signal from Rust needs `unsafe` or another crate.
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .context("running kill")?;
        ensure!(status.success(), "kill -{signal} {pid}: {status}");
        tracing::info!(cluster = self.name, signal, "kube-apiserver signalled");
        Ok(pid)
    }

    /// Kills kube-apiserver (SIGKILL, like a crash or a network cut) and waits until it is gone;
    /// etcd keeps running and keeps the data. Clients get "connection refused" until
    /// [`start_apiserver`](Self::start_apiserver). Stopping a stopped apiserver does nothing.
    pub async fn stop_apiserver(&self) {
        let proc = self.apiserver().take();
        if let Some(mut proc) = proc {
            // SIGKILL and reap off the async threads.
            let _ = tokio::task::spawn_blocking(move || proc.kill()).await;
            tracing::info!(cluster = self.name, "kube-apiserver stopped");
        }
    }

    /// Starts kube-apiserver again on the same port, with the same etcd and certificates, so
    /// existing clients and kubeconfigs keep working; returns once `/readyz` answers and every CRD
    /// is served again. Fails if it is already running.
    pub async fn start_apiserver(&self) -> Result<()> {
        if self.apiserver_running() {
            bail!("{}: kube-apiserver is already running", self.name);
        }
        // The port was free while the apiserver was down: an outgoing connection may hold it as
        // its local port for a moment. Retry for a while before giving up.
        // Done when it started (`Some(Ok)`) or failed otherwise (`Some(Err)`); retried while the
        // port is taken (`None`).
        crate::wait_for(
            Duration::from_secs(30),
            "the apiserver's port to be free",
            || async {
                match self.spawn_apiserver().await {
                    Ok(()) => Some(Ok(())),
                    Err(StartError::PortTaken(e)) => {
                        tracing::warn!(
                            cluster = self.name,
                            port = self.port,
                            "port busy, retrying: {e:#}"
                        );
                        None
                    }
                    Err(StartError::Other(e)) => Some(Err(e)),
                }
            },
        )
        .await
        .and_then(|started| started)
        .map_err(|e| e.context(format!("{}: restarting kube-apiserver", self.name)))?;
        wait_served(&self.client(), &fleet_crds()).await?;
        warm_up(&self.client()).await?;
        tracing::info!(cluster = self.name, "kube-apiserver started again");
        Ok(())
    }

    fn apiserver(&self) -> MutexGuard<'_, Option<Proc>> {
        self.apiserver.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn spawn_apiserver(&self) -> Result<(), StartError> {
        let pki = self.dir.path().join("pki");
        let p = |f: &str| pki.join(f).display().to_string();
        // Reachable from pods when a node is to run them: on every address, advertised (the
        // `kubernetes` Service's endpoint) at the pod-reachable one, and with the ServiceAccount
        // admission plugin that gives pods their tokens. Otherwise loopback only, and no pod
        // ever needs a token.
        let (bind, advertise) = match self.pod_address {
            Some(ip) => ("0.0.0.0".to_owned(), ip.to_string()),
            None => ("127.0.0.1".to_owned(), "127.0.0.1".to_owned()),
        };
        let mut args = vec![
            format!("--etcd-servers={}", self.etcd_url),
            format!("--cert-dir={}", self.dir.path().join("apiserver-certs").display()),
            format!("--tls-cert-file={}", p("apiserver.crt")),
            format!("--tls-private-key-file={}", p("apiserver.key")),
            format!("--client-ca-file={}", p("ca.crt")),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            format!("--service-account-issuer={}/", self.url()),
            format!("--secure-port={}", self.port),
            format!("--bind-address={bind}"),
            format!("--advertise-address={advertise}"),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            "--allow-privileged=true".to_owned(),
            "--authorization-mode=RBAC".to_owned(),
        ];
        if self.pod_address.is_none() {
            args.push("--disable-admission-plugins=ServiceAccount".to_owned());
        }
        if self.audit {
            let policy = self.dir.path().join("audit-policy.yaml");
            std::fs::write(&policy, AUDIT_POLICY).map_err(|e| StartError::Other(e.into()))?;
            args.extend([
                format!("--audit-policy-file={}", policy.display()),
                format!("--audit-log-path={}", self.audit_log().display()),
                "--audit-log-format=json".to_owned(),
                // Written before the response is sent, so a reader after the fact misses nothing.
                "--audit-log-mode=blocking".to_owned(),
            ]);
        }
        let mut proc = Proc::spawn(
            "kube-apiserver",
            &self.binaries.join("kube-apiserver"),
            &args,
            &self.apiserver_log(),
        )
        .map_err(StartError::Other)?;
        let mut ready = self.config.clone();
        ready.connect_timeout = Some(Duration::from_secs(2));
        ready.read_timeout = Some(Duration::from_secs(5));
        let client = kube::Client::try_from(ready).map_err(|e| StartError::Other(e.into()))?;
        let port = self.port;
        let result = wait_process(&mut proc, STARTUP_TIMEOUT, "/readyz", || {
            let client = client.clone();
            async move {
                // Connect first: kube's client logs every refused connection at ERROR level.
                tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
                let request = http::Request::get("/readyz").body(Vec::new())?;
                client
                    .request_text(request)
                    .await
                    .map(|_| ())
                    .map_err(anyhow::Error::from)
            }
        })
        .await;
        match result {
            Ok(()) => {
                *self.apiserver() = Some(proc);
                Ok(())
            }
            Err(e) => Err(classify(e)),
        }
    }

    async fn wait_for_namespaces(&self) -> Result<()> {
        let api: Api<Namespace> = Api::all(self.client());
        for ns in ["default", "kube-system"] {
            crate::wait_for(
                STARTUP_TIMEOUT,
                &format!("{}: namespace {ns}", self.name),
                || async { api.get_opt(ns).await.is_ok_and(|n| n.is_some()) },
            )
            .await?;
        }
        Ok(())
    }

    async fn install_crds(&self) -> Result<()> {
        let client = self.client();
        let api: Api<CustomResourceDefinition> = Api::all(client.clone());
        let crds = fleet_crds();
        try_join_all(crds.iter().map(|crd| {
            let api = api.clone();
            async move {
                let name = crd.metadata.name.clone().unwrap_or_default();
                api.create(&PostParams::default(), crd)
                    .await
                    .with_context(|| format!("creating CRD {name}"))?;
                crate::wait_for(CRD_TIMEOUT, &format!("CRD {name} established"), || async {
                    let crd = api.get(&name).await.ok()?;
                    let conditions = crd.status?.conditions?;
                    conditions
                        .iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                        .then_some(())
                })
                .await
            }
        }))
        .await?;
        wait_served(&client, &crds).await?;
        warm_up(&client).await
    }
}

/// Every CRD manifest of `kkp_quota_crds::crd::all()` (which already carries the API-approval
/// annotation that machine-controller's protected `cluster.k8s.io` group needs).
pub fn fleet_crds() -> Vec<CustomResourceDefinition> {
    kkp_quota_crds::crd::all()
        .into_iter()
        .map(|file| file.crd)
        .collect()
}

/// kube-apiserver 1.36 answers its first custom-resource write (of any CRD) about 2 s late, a
/// one-time lazy initialisation; later writes take milliseconds. A dry-run create takes that hit
/// here, so that tests' first writes and latency measurements do not.
async fn warm_up(client: &kube::Client) -> Result<()> {
    use kkp_quota_crds::kkp::{Project, ProjectSpec};
    let api: Api<Project> = Api::all(client.clone());
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    api.create(
        &dry_run,
        &Project::new("kkp-quota-e2e-warm-up", ProjectSpec::default()),
    )
    .await
    .context("warm-up: dry-run create of a Project")?;
    Ok(())
}

/// Waits until a list of every CRD's resource succeeds (the API is served, not only stored).
async fn wait_served(client: &kube::Client, crds: &[CustomResourceDefinition]) -> Result<()> {
    try_join_all(crds.iter().map(|crd| async move {
        let version = crd
            .spec
            .versions
            .iter()
            .find(|v| v.served)
            .context("CRD without a served version")?;
        let group = &crd.spec.group;
        let resource = ApiResource {
            group: group.clone(),
            version: version.name.clone(),
            api_version: format!("{group}/{}", version.name),
            kind: crd.spec.names.kind.clone(),
            plural: crd.spec.names.plural.clone(),
        };
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        crate::wait_for(
            CRD_TIMEOUT,
            &format!("{}.{group} served", resource.plural),
            || async { api.list(&ListParams::default().limit(1)).await.map(|_| ()) },
        )
        .await
    }))
    .await?;
    Ok(())
}

enum StartError {
    /// The process could not bind its port: pick another one and try again.
    PortTaken(anyhow::Error),
    Other(anyhow::Error),
}

fn classify(e: anyhow::Error) -> StartError {
    if format!("{e:#}").contains("address already in use") {
        StartError::PortTaken(e)
    } else {
        StartError::Other(e)
    }
}

/// The Service IP range of every fleet cluster (the `kubernetes` Service is its first address).
pub const SERVICE_CIDR: &str = "10.0.0.0/24";

/// The `kubernetes` Service's `ClusterIP`: the first address of [`SERVICE_CIDR`].
pub const KUBERNETES_SERVICE_IP: &str = "10.0.0.1";

/// How a control plane starts ([`ControlPlane::start_opts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StartOptions {
    /// kube-apiserver writes an audit log ([`ControlPlane::audit_log`]).
    pub audit: bool,
    /// A host address that pods of a fleet node reach (e2e's node puts it on `lo`): the API
    /// server listens on every address, advertises this one, has it in its certificate, and
    /// [`ControlPlane::in_cluster_kubeconfig_yaml`] names it.
    pub pod_address: Option<Ipv4Addr>,
}

/// Every request at metadata level, once when its response is complete (a watch also when it
/// starts, so a watch still open at the end is recorded).
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
";

fn loopback_url(port: u16) -> String {
    format!("https://127.0.0.1:{port}")
}
