//! A real local fleet for tests, benchmarks and the demo: one kube-apiserver + etcd pair per
//! cluster, several clusters at once on loopback. No mocks.
//!
//! # Control planes
//!
//! ```text
//! let cp = e2e::ControlPlane::start("test").await?;   // etcd + kube-apiserver, CRDs installed
//! let client: kube::Client = cp.client();             // admin (system:masters)
//! let yaml: String = cp.kubeconfig_yaml();            // same credentials, certs embedded
//! cp.stop_apiserver().await;                          // "cluster unreachable" (etcd keeps data)
//! cp.start_apiserver().await?;                        // back, same URL and credentials
//! drop(cp);                                           // both processes killed, temp dir removed
//! ```
//!
//! - [`ControlPlane::start`]`(name) -> Result<ControlPlane>` — binaries from
//!   [`assets::control_plane_binaries`]; free loopback ports; certificates generated in-process
//!   ([`certs::ClusterCerts`]); etcd with `--unsafe-no-fsync` in a temp dir; kube-apiserver with
//!   RBAC; waits for `/readyz`, for namespaces `default` and `kube-system`, then installs every CRD
//!   of `kkp_quota_crds::crd::all()` and waits until each is established and served. Start several
//!   at once with `tokio::try_join!` or `futures::future::try_join_all`. Startup failures carry the
//!   tail of the process's log.
//! - [`ControlPlane`]: `client()`, `config()`, `kubeconfig_yaml()`, `kubeconfig_path()`, `url()`,
//!   `port()`, `ca_pem()`, `kubeconfig_for_user(user, groups)` (RBAC tests), `pids()`,
//!   `apiserver_log()`, `etcd_log()`, `stop_apiserver().await` (SIGKILL: connection refused),
//!   `start_apiserver().await` (same port, etcd and certificates), `pause_apiserver()` /
//!   `resume_apiserver()` (SIGSTOP/SIGCONT: requests hang, like a partition), `apiserver_running()`. Dropping it (also on panic) kills and reaps both processes and removes
//!   the temp dir.
//! - [`client_from_kubeconfig`]`(&str)`: a client from kubeconfig text (e.g. from a Secret).
//!
//! # Fleets
//!
//! [`Fleet::start`]`(`[`FleetSpec::default()`]`)` starts a master, seeds `seed-a` and `seed-b`,
//! user clusters `alpha` and `beta` (on `seed-a`) and `gamma` (on `seed-b`), all three in project
//! `demo`; project `other` has no cluster. All control planes start concurrently, then the KKP
//! objects are written (see [`fleet`]); every cluster of it runs kube-controller-manager's garbage
//! collector and namespace controller. Build other shapes with [`FleetSpec::empty`] (no
//! controller manager), `with_seed`, `with_project`, `with_user_cluster(name, seed, project)`,
//! `with_controller_managers()`.
//!
//! Accessors: `master()`, `seed(name)`, `user_cluster(name)` (panic on an unknown name),
//! `get(name)`, `spec()`, `user_cluster_spec(name)`, `members()`, `control_planes()`, `pids()`,
//! `rss_bytes()`, and `write_dir(dir)`, which writes `<cluster>.kubeconfig` per cluster and
//! `fleet.json` (`[{name, role: master|seed|user, seed, project, kubeconfig, url}]`).
//!
//! # Waiting
//!
//! Never sleep in a test: [`wait_for`]`(timeout, what, || async { ... })` polls every 25 ms until
//! the check answers `true`, `Some(v)` or `Ok(v)`, and fails with `what` (and the last error) at
//! the deadline. For one object, [`wait_for_object`] and [`wait_for_gone`] follow it with a watch
//! instead, and see each change as it happens.
//!
//! # Other helpers
//!
//! - [`certs::WebhookCerts::generate`]: CA + serving cert/key for `127.0.0.1`/`localhost`
//!   (`write_to(dir)`, `ca_bundle()`), for the machine-webhook's HTTPS server.
//! - [`procfs`]: `rss_bytes(pid)`, `is_running(pid)`.
//! - [`components`]: child processes beside a fleet, logged and killed on drop.
//! - [`system`]: the whole quota system (master-controller, a seed-controller and a
//!   machine-webhook per seed) as real processes beside a fleet, for the demo and end-to-end tests.
//!   [`system::Credentials::Chart`] runs each under the Helm chart's service account instead of the
//!   fleet's admin ([`chart`]).
//! - [`shares`]: bursts and the overrun watcher of the two-seed share tests.
//! - [`audit`]: the master's and seeds' audit logs ([`FleetSpec::with_audit_log`]) read back, and
//!   the chart's grants compared with what each identity used.

pub mod api_writes;
pub mod assets;
pub mod audit;
pub mod bench;
pub mod certs;
pub mod chart;
pub mod components;
pub mod control_plane;
pub mod demo;
pub mod fleet;
pub mod kubectl;
pub mod machines;
pub mod node;
pub mod ports;
pub mod pprof;
pub mod process;
pub mod procfs;
pub mod shares;
pub mod system;
pub mod wait;

pub use control_plane::{ControlPlane, client_from_kubeconfig};
pub use fleet::{Fleet, FleetSpec, Member, Role, UserClusterSpec};
pub use wait::{wait_for, wait_for_gone, wait_for_object};
