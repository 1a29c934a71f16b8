//! The node's configuration files: containerd's, the CNI network's and kubelet's. Every path
//! points into the node's own directory where the program lets it; the comments say why each
//! setting differs from a stock node (most are quirks of the CI machine: cgroup v1, no
//! `CAP_SYS_RESOURCE`, no registry).

use std::path::Path;

use super::{NODE_ADDRESS, NODE_NAME, PAUSE_IMAGE, POD_CIDR};

/// The CNI bridge (named for this project, so teardown knows it is ours).
pub const BRIDGE: &str = "kkpq0";

/// containerd 1.6's config.
pub fn containerd(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"version = 2
root = "{d}/containerd/root"
state = "{d}/containerd/state"
# The "opt" plugin would create /opt/containerd; nothing here installs plugins.
disabled_plugins = ["io.containerd.internal.v1.opt"]

[grpc]
  address = "{d}/containerd.sock"

[plugins."io.containerd.grpc.v1.cri"]
  # The node reaches no registry: pause-image.sh builds the sandbox image, imported at start.
  sandbox_image = "{PAUSE_IMAGE}"
  # root here lacks CAP_SYS_RESOURCE, so runc cannot lower a container's oom_score_adj below
  # containerd's own; clamp instead of failing every pod.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # cgroupfs, as kubelet's cgroupDriver: no systemd runs here.
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d}/cni"
"#
    )
}

/// The pod network: one bridge, addresses from `POD_CIDR`, the bridge the pods' gateway.
/// Hairpin lets a pod reach itself through a Service.
pub fn cni(dir: &Path) -> String {
    serde_json::json!({
        "cniVersion": "0.4.0",
        "name": "kkp-quota-node",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": true,
                "ipMasq": true,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": dir.join("cni-ipam").display().to_string(),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    })
    .to_string()
}

/// kubelet's `KubeletConfiguration`.
pub fn kubelet(dir: &Path, ca_file: &Path) -> String {
    let d = dir.display();
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# The machine has cgroup v1 and no systemd.
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://{d}/containerd.sock
podLogsDir: {d}/pod-logs
address: {NODE_ADDRESS}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: AlwaysAllow}}
# No cluster DNS: pods reach the API server by the kubernetes Service's address.
resolvConf: ""
failSwapOn: false
# A shared CI disk must not evict the test's pods, nor collect their images (they cannot be
# pulled again): "0%" turns a disk threshold off (a nearly full CI disk would otherwise put the
# node under DiskPressure, tainted and evicting).
evictionHard: {{memory.available: 100Mi, nodefs.available: "0%", imagefs.available: "0%", nodefs.inodesFree: "0%", imagefs.inodesFree: "0%"}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# Status often enough that the node is Ready soon after start.
nodeStatusUpdateFrequency: 4s
# A changed Secret reaches the pods that mount it within this (1m by default): the webhook's
# rotated certificate is served sooner, so the test of it is shorter.
syncFrequency: 10s
"#,
        ca = ca_file.display()
    )
}

/// kube-proxy's flags: iptables mode on the host, nothing it would tune machine-wide that the
/// test does not need (conntrack limits and timeouts stay as they are; no `NodePorts` on
/// localhost, which would need `route_localnet`).
pub fn kube_proxy_args(kubeconfig: &Path) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--hostname-override={NODE_NAME}"),
        "--proxy-mode=iptables".to_owned(),
        format!("--cluster-cidr={POD_CIDR}"),
        "--conntrack-max-per-core=0".to_owned(),
        "--conntrack-tcp-timeout-established=0s".to_owned(),
        "--conntrack-tcp-timeout-close-wait=0s".to_owned(),
        "--iptables-localhost-nodeports=false".to_owned(),
        "--metrics-bind-address=127.0.0.1:10249".to_owned(),
        "--healthz-bind-address=127.0.0.1:10256".to_owned(),
    ]
}
