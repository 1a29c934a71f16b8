//! The chart's seed role installed on a node's cluster, as an operator would: the images from
//! `make images` imported into the node, `helm install --set role=seed`, and the user clusters'
//! API servers (processes on the host, with no cluster DNS) calling the webhook through its
//! Service's `ClusterIP`, which kube-proxy routes on the host.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;

use super::Node;
use crate::ControlPlane;

/// The webhook Service's fixed `ClusterIP` (`machineWebhook.serviceClusterIP`), in the fleet's
/// Service range: the user clusters' API servers reach the webhook at `https://<it>:443`.
pub const WEBHOOK_CLUSTER_IP: &str = "10.0.0.100";
/// The chart's namespace.
pub const NAMESPACE: &str = crate::chart::NAMESPACE;
/// The seed role's Deployments (and images).
pub const SEED_COMPONENTS: [&str; 2] = ["seed-controller", "machine-webhook"];

/// Builds the seed role's images (`deploy/images/build.sh`, `make images`) and imports them into
/// the node under the names the chart gives them with an empty `image.registry`.
pub fn import_seed_images(node: &Node) -> Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let status = std::process::Command::new("bash")
        .arg(root.join("deploy/images/build.sh"))
        .args(SEED_COMPONENTS)
        .current_dir(&root)
        .stdout(std::process::Stdio::null())
        .status()
        .context("running deploy/images/build.sh")?;
    ensure!(status.success(), "deploy/images/build.sh failed ({status})");
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    for component in SEED_COMPONENTS {
        let archive = target.join(format!("images/kkp-quota-{component}.oci.tar"));
        // An image named without a registry is Docker Hub's library to containerd.
        node.import_image(&archive, &format!("docker.io/library/kkp-quota-{component}"))?;
    }
    Ok(())
}

/// `--set` values of the seed role on the node's cluster `seed`: images never pulled, the CRD
/// already there (the fleet installs it), and the webhook at its fixed `ClusterIP`. Machines
/// live in `kube-system` of each user cluster, as in KKP (the chart's default).
pub fn seed_values(seed: &str) -> Vec<String> {
    [
        "role=seed".to_owned(),
        "crds.install=false".to_owned(),
        "image.pullPolicy=Never".to_owned(),
        format!("seedController.seedName={seed}"),
        format!("seedController.webhookUrl=https://{WEBHOOK_CLUSTER_IP}:443"),
        format!("machineWebhook.serviceClusterIP={WEBHOOK_CLUSTER_IP}"),
    ]
    .into()
}

/// Runs helm against `cluster` in the chart's namespace; its output, or an error with it.
pub fn helm(cluster: &ControlPlane, args: &[&str], values: &[String]) -> Result<String> {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--namespace", NAMESPACE]);
    for value in values {
        all.extend(["--set", value.as_str()]);
    }
    crate::chart::run(&cluster.kubeconfig_path(), &all)
}

/// `helm install kkp-quota <chart> --set role=seed ...` on `cluster`.
pub fn install_seed(cluster: &ControlPlane, seed: &str, extra: &[String]) -> Result<String> {
    let mut values = seed_values(seed);
    values.extend_from_slice(extra);
    helm(cluster, &["install", "kkp-quota", crate::chart::CHART], &values)
}

/// Waits until Deployment `kkp-quota-<component>` has rolled out: its newest generation
/// observed, every replica updated and Ready, and no pod of an older template left.
pub async fn wait_rolled_out(client: &kube::Client, component: &str, timeout: Duration) -> Result<()> {
    let name = format!("kkp-quota-{component}");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let rolled_out = crate::wait_for(timeout, &format!("{name} rolled out"), || async {
        let d = deployments.get(&name).await.ok()?;
        let want = d.spec.as_ref()?.replicas.unwrap_or(1);
        let status = d.status.as_ref()?;
        let done = status.observed_generation >= d.metadata.generation
            && status.updated_replicas == Some(want)
            && status.ready_replicas == Some(want)
            && status.replicas == Some(want);
        // Terminating pods of the old template still count until they are gone.
        let listed = pods
            .list(&ListParams::default().labels(&format!("app.kubernetes.io/component={component}")))
            .await
            .ok()?;
        (done && listed.items.len() == usize::try_from(want).ok()?).then_some(())
    })
    .await;
    if rolled_out.is_err() {
        let report = pod_report(client, component).await;
        return rolled_out.with_context(|| format!("{name} did not roll out: {report}"));
    }
    Ok(())
}

/// One line on each pod of `component` and on the node, for a roll-out that did not finish: the
/// phase, every container's waiting or terminated reason, where the pod is scheduled, and the
/// node's pressure conditions and taints.
async fn pod_report(client: &kube::Client, component: &str) -> String {
    let mut lines = Vec::new();
    for pod in pods_of(client, component).await.unwrap_or_default() {
        let status = pod.status.clone().unwrap_or_default();
        let containers: Vec<String> = status
            .container_statuses
            .iter()
            .flatten()
            .filter_map(|c| {
                let state = c.state.as_ref()?;
                let (reason, message) = match (&state.waiting, &state.terminated) {
                    (Some(w), _) => (w.reason.clone(), w.message.clone()),
                    (_, Some(t)) => (t.reason.clone(), t.message.clone()),
                    _ => return None,
                };
                Some(format!(
                    "{} {} {}",
                    c.name,
                    reason.unwrap_or_default(),
                    message.unwrap_or_default()
                ))
            })
            .collect();
        let unscheduled: Vec<String> = status
            .conditions
            .iter()
            .flatten()
            .filter(|c| c.type_ == "PodScheduled" && c.status != "True")
            .map(|c| format!("unscheduled: {}", c.message.clone().unwrap_or_default()))
            .collect();
        lines.push(format!(
            "pod {} {} ready={} {}",
            pod.metadata.name.clone().unwrap_or_default(),
            status.phase.clone().unwrap_or_default(),
            is_ready(&pod),
            [containers, unscheduled].concat().join("; ")
        ));
    }
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    for node in nodes
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        let conditions: Vec<String> = node
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .filter(|c| (c.type_ == "Ready") != (c.status == "True"))
            .map(|c| format!("{}={}", c.type_, c.status))
            .collect();
        let taints: Vec<String> = node
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .into_iter()
            .map(|t| t.key)
            .collect();
        lines.push(format!(
            "node {} conditions off: {conditions:?}, taints: {taints:?}",
            node.metadata.name.unwrap_or_default()
        ));
    }
    lines.join(" | ")
}

/// The pods of `component`, by name.
pub async fn pods_of(client: &kube::Client, component: &str) -> Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    Ok(pods
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/component={component}")))
        .await?
        .items)
}

/// Whether a pod's Ready condition is True.
pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}
