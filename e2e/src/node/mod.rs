//! A real node for one fleet cluster, so that the chart runs as pods: containerd (Debian's), the
//! CNI bridge, kubelet, kube-proxy and kube-scheduler (built by `e2e/control-plane/build.sh`).
//!
//! kubelet and containerd write machine-wide state, so there is one node per machine at a time
//! (a file lock), the state is read before the node starts ([`HostSnapshot`]) and put back when
//! it stops ([`Node::teardown`], or on drop), and teardown reports anything left different.
//!
//! ```text
//! let prepared = NodeHost::prepare()?;                     // lock, snapshot, node address on lo
//! let fleet = Fleet::start(spec.with_pod_address(NODE_ADDRESS)).await?;
//! let node = prepared.start(fleet.seed("seed-a")).await?;  // Ready, pods schedule onto it
//! node.import_image(&archive, "docker.io/library/kkp-quota-seed-controller")?;
//! let left = node.teardown()?;                              // empty: the machine is as it was
//! ```
//!
//! Pods reach the cluster's API server through the `kubernetes` Service (kube-proxy's iptables
//! rules on the host send 10.0.0.1:443 to the node address, where the API server listens), and
//! processes on the host reach pods through any `ClusterIP` the same way.

pub mod chart;
pub mod config;
pub mod host;

use std::fs::File;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::Api;

pub use host::HostSnapshot;

use crate::ControlPlane;
use crate::process::{Proc, wait_process};

/// The node's address, on `lo` while the node runs. kubelet refuses a loopback node IP and this
/// machine has no dummy link type, so a /32 outside 127/8 on `lo` it is: the host owns it, pods
/// reach it through their gateway, and the fleet's API servers listen on it.
pub const NODE_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
/// The node's name in the cluster.
pub const NODE_NAME: &str = "node-a";
/// The pods' addresses.
pub const POD_CIDR: &str = "10.244.0.0/24";
/// The sandbox image containerd runs as each pod's first container.
pub const PAUSE_IMAGE: &str = "kkp-quota.local/pause:1";
/// One node per machine: kubelet's and containerd's machine-wide paths are shared.
const LOCK_FILE: &str = "/tmp/kkp-quota-node.lock";
/// The machine's state before the running node and the node's directory, removed once the
/// machine is put back. Found at the next start, it means a test process was killed before its
/// teardown: that node's leftovers are cleaned up first.
const STATE_FILE: &str = "/tmp/kkp-quota-node.state.json";

#[derive(serde::Serialize, serde::Deserialize)]
struct State {
    before: HostSnapshot,
    dir: PathBuf,
}
/// How long the node has to register and become Ready.
const READY_TIMEOUT: Duration = Duration::from_mins(2);

/// The machine prepared for a node: the lock held, its state read, the node address on `lo`.
/// Dropping it puts the machine back.
pub struct NodeHost {
    before: HostSnapshot,
    dir: tempfile::TempDir,
    restored: bool,
    /// Held while the node exists; `None` only after [`Node::abandon`].
    lock: Option<File>,
}

impl NodeHost {
    /// Takes the machine's node lock (waiting for another node to finish), checks that what a
    /// node needs is installed, reads the machine's state and adds [`NODE_ADDRESS`] to `lo`.
    pub fn prepare() -> Result<NodeHost> {
        ensure!(
            std::fs::read_to_string("/proc/self/status")
                .unwrap_or_default()
                .lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")),
            "a node needs root: kubelet and containerd manage cgroups, mounts and iptables"
        );
        for tool in ["containerd", "ctr", "runc", "iptables", "ip", "umount"] {
            ensure!(
                which(tool).is_some(),
                "{tool} is missing: .ci/system-deps.sh installs the node's Debian packages"
            );
        }
        for plugin in ["bridge", "host-local", "portmap"] {
            ensure!(
                Path::new("/usr/lib/cni").join(plugin).is_file(),
                "CNI plugin {plugin} is missing from /usr/lib/cni: .ci/system-deps.sh installs \
                 containernetworking-plugins"
            );
        }
        let lock = File::create(LOCK_FILE).with_context(|| format!("creating {LOCK_FILE}"))?;
        lock.lock().with_context(|| format!("locking {LOCK_FILE}"))?;
        clean_up_after_a_killed_node()?;
        let before = HostSnapshot::take().context("reading the machine's state")?;
        let dir = tempfile::Builder::new()
            .prefix("kkp-quota-node-")
            .tempdir()
            .context("creating the node's directory")?;
        let state = State {
            before: before.clone(),
            dir: dir.path().to_owned(),
        };
        std::fs::write(STATE_FILE, serde_json::to_vec(&state)?)
            .with_context(|| format!("writing {STATE_FILE}"))?;
        let host = NodeHost {
            before,
            dir,
            restored: false,
            lock: Some(lock),
        };
        host::run("ip", &["addr", "add", &format!("{NODE_ADDRESS}/32"), "dev", "lo"])
            .context("adding the node address to lo")?;
        Ok(host)
    }

    /// The machine as `prepare` found it, after cleaning up after a killed node if there was one
    /// (what teardown puts back).
    pub fn machine_before(&self) -> &HostSnapshot {
        &self.before
    }

    /// Starts containerd, kubelet, kube-proxy and kube-scheduler against `cluster` (which must
    /// have been started with [`NODE_ADDRESS`] as its pod address) and waits until the node is
    /// Ready and untainted.
    pub async fn start(self, cluster: &ControlPlane) -> Result<Node> {
        ensure!(
            cluster.pod_address() == Some(NODE_ADDRESS),
            "{}: a node's cluster must be started with pod address {NODE_ADDRESS} \
             (FleetSpec::with_pod_address)",
            cluster.name()
        );
        let binaries = crate::assets::control_plane_binaries()?;
        for bin in ["kubelet", "kube-proxy", "kube-scheduler"] {
            ensure!(
                binaries.join(bin).is_file(),
                "{} is missing: e2e/control-plane/build.sh builds it (an envtest directory in \
                 KUBEBUILDER_ASSETS has none)",
                binaries.join(bin).display()
            );
        }
        let mut node = Node {
            scheduler: None,
            proxy: None,
            kubelet: None,
            containerd: None,
            host: self,
        };
        let dir = node.host.dir.path().to_owned();
        node.containerd = Some(start_containerd(&dir).await?);
        node.import_image(&pause_image()?, "kkp-quota.local/pause")?;
        // A copy in the node's directory: every node process's command line names the directory,
        // which is how a killed test's leftovers are found (`clean_up_after_a_killed_node`).
        let kubeconfig = dir.join("admin.kubeconfig");
        std::fs::copy(cluster.kubeconfig_path(), &kubeconfig)?;
        let kubelet_config = dir.join("kubelet.yaml");
        let ca = dir.join("ca.crt");
        std::fs::write(&ca, cluster.ca_pem())?;
        std::fs::write(&kubelet_config, config::kubelet(&dir, &ca))?;
        // The admin kubeconfig: this API server authorizes with RBAC alone (no Node
        // authorizer), and the node is the test's own.
        node.kubelet = Some(Proc::spawn(
            "kubelet",
            &binaries.join("kubelet"),
            &[
                format!("--config={}", kubelet_config.display()),
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--root-dir={}", dir.join("kubelet").display()),
                format!("--node-ip={NODE_ADDRESS}"),
                format!("--hostname-override={NODE_NAME}"),
                "--v=1".to_owned(),
            ],
            &dir.join("kubelet.log"),
        )?);
        node.proxy = Some(Proc::spawn(
            "kube-proxy",
            &binaries.join("kube-proxy"),
            &config::kube_proxy_args(&kubeconfig),
            &dir.join("kube-proxy.log"),
        )?);
        node.scheduler = Some(Proc::spawn(
            "kube-scheduler",
            &binaries.join("kube-scheduler"),
            &[
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--authentication-kubeconfig={}", kubeconfig.display()),
                format!("--authorization-kubeconfig={}", kubeconfig.display()),
                "--leader-elect=false".to_owned(),
                "--bind-address=127.0.0.1".to_owned(),
                "--secure-port=10259".to_owned(),
            ],
            &dir.join("kube-scheduler.log"),
        )?);
        node.wait_ready(cluster).await?;
        tracing::info!(cluster = cluster.name(), node = NODE_NAME, "node Ready");
        Ok(node)
    }

    /// Puts the machine back; what is still different afterwards, one line each.
    fn restore(&mut self) -> Result<Vec<String>> {
        self.restored = true;
        let restored = self.before.restore(self.dir.path());
        let after = HostSnapshot::take()?;
        let left = self.before.differences(&after);
        restored?;
        if left.is_empty() {
            std::fs::remove_file(STATE_FILE).with_context(|| format!("removing {STATE_FILE}"))?;
        }
        Ok(left)
    }
}

impl Drop for NodeHost {
    fn drop(&mut self) {
        if !self.restored {
            match self.restore() {
                Ok(left) if left.is_empty() => {}
                Ok(left) => tracing::error!(?left, "node teardown left the machine changed"),
                Err(e) => tracing::error!("node teardown: {e:#}"),
            }
        }
    }
}

/// A running node. Fields drop in order: the scheduler, kube-proxy and kubelet die first (so
/// nothing restarts a container), then containerd, then the machine is put back.
pub struct Node {
    scheduler: Option<Proc>,
    proxy: Option<Proc>,
    kubelet: Option<Proc>,
    containerd: Option<Proc>,
    host: NodeHost,
}

impl Node {
    /// Imports an OCI archive into the node's image store as `<base_name>:<its tag>`; pods then
    /// run it with `imagePullPolicy: Never`. (umoci archives name only a tag, so the repository
    /// comes from here; a chart image `kkp-quota-x:1.0` is `docker.io/library/kkp-quota-x:1.0`.)
    pub fn import_image(&self, archive: &Path, base_name: &str) -> Result<()> {
        let socket = self.host.dir.path().join("containerd.sock");
        host::run(
            "ctr",
            &[
                "--address",
                &socket.display().to_string(),
                "--namespace",
                "k8s.io",
                "images",
                "import",
                "--base-name",
                base_name,
                &archive.display().to_string(),
            ],
        )
        .with_context(|| format!("importing {} as {base_name}", archive.display()))?;
        Ok(())
    }

    /// The node's directory (logs: `kubelet.log`, `containerd.log`, `kube-proxy.log`,
    /// `kube-scheduler.log`; pod logs under `pod-logs/`).
    pub fn dir(&self) -> &Path {
        self.host.dir.path()
    }

    /// Leaves the node running and the machine changed, as a test process killed before its
    /// teardown does (the kernel releases its lock; nothing else happens): for the test that the
    /// next [`NodeHost::prepare`] cleans up after it.
    pub fn abandon(mut self) {
        drop(self.host.lock.take());
        std::mem::forget(self);
    }

    /// Stops everything, puts the machine back and returns what is still different from before
    /// the node (empty when teardown was complete).
    pub fn teardown(mut self) -> Result<Vec<String>> {
        for proc in [
            self.scheduler.take(),
            self.proxy.take(),
            self.kubelet.take(),
            self.containerd.take(),
        ]
        .into_iter()
        .flatten()
        {
            drop(proc);
        }
        self.host.restore()
    }

    async fn wait_ready(&mut self, cluster: &ControlPlane) -> Result<()> {
        let nodes: Api<KubeNode> = Api::all(cluster.client());
        let kubelet = self.kubelet.as_mut().context("kubelet not started")?;
        wait_process(kubelet, READY_TIMEOUT, "node Ready and untainted", || {
            let nodes = nodes.clone();
            async move {
                let node = nodes.get_opt(NODE_NAME).await?.context("not registered yet")?;
                let ready = node
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                ensure!(ready, "not Ready yet");
                let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
                if !taints.is_empty() {
                    bail!("tainted: {:?}", taints.iter().map(|t| &t.key).collect::<Vec<_>>());
                }
                Ok(())
            }
        })
        .await
    }
}

/// Puts the machine back after a node whose test process was killed before its teardown (its
/// state file is still there), so that this node starts from the machine as it was.
fn clean_up_after_a_killed_node() -> Result<()> {
    let Ok(text) = std::fs::read(STATE_FILE) else {
        return Ok(());
    };
    let state: State = serde_json::from_slice(&text).with_context(|| format!("parsing {STATE_FILE}"))?;
    tracing::warn!(dir = %state.dir.display(), "a node was left running by a killed test; cleaning up after it");
    state
        .before
        .restore(&state.dir)
        .context("cleaning up after a killed node")?;
    let left = state.before.differences(&HostSnapshot::take()?);
    ensure!(
        left.is_empty(),
        "a killed node's leftovers could not all be removed: {left:?}"
    );
    let _ = std::fs::remove_dir_all(&state.dir);
    std::fs::remove_file(STATE_FILE).with_context(|| format!("removing {STATE_FILE}"))?;
    Ok(())
}

async fn start_containerd(dir: &Path) -> Result<Proc> {
    std::fs::create_dir_all(dir.join("cni"))?;
    std::fs::write(dir.join("cni/10-kkp-quota.conflist"), config::cni(dir))?;
    let config = dir.join("containerd.toml");
    std::fs::write(&config, config::containerd(dir))?;
    let mut proc = Proc::spawn(
        "containerd",
        &which("containerd").context("containerd is missing")?,
        &[format!("--config={}", config.display())],
        &dir.join("containerd.log"),
    )?;
    let socket = dir.join("containerd.sock");
    wait_process(&mut proc, Duration::from_secs(30), "its socket", || {
        let socket = socket.clone();
        async move {
            tokio::net::UnixStream::connect(&socket).await?;
            Ok(())
        }
    })
    .await?;
    Ok(proc)
}

/// The sandbox image's archive (`e2e/node/pause-image.sh` builds and caches it).
fn pause_image() -> Result<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("node/pause-image.sh");
    let out = host::run("bash", &[&script.display().to_string()])?;
    let path = PathBuf::from(out.trim());
    ensure!(path.is_file(), "{} printed no archive", script.display());
    Ok(path)
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}
