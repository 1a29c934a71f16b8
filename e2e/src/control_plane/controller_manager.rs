//! The control plane's kube-controller-manager, with the two controllers that make a fleet
//! cluster behave like a real one where this system is concerned: the garbage collector (owner
//! references cascade: a deleted Project takes its quota objects, a deleted `MachineDeployment` its
//! `MachineSet`s and Machines) and the namespace controller (a deleted namespace empties and goes).

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

use super::ControlPlane;
use crate::process::{Proc, wait_process};

/// The controllers of a cluster with a node: Deployments roll through `ReplicaSets`, Services get
/// `EndpointSlices` (kube-proxy routes by them), `PodDisruptionBudgets` are kept, every namespace
/// gets its `default` `ServiceAccount` and the `kube-root-ca.crt` `ConfigMap` that projected
/// service-account volumes read, pods of a gone node are collected, and a node's not-ready taint
/// goes once it is Ready.
const NODE_CONTROLLERS: &str = "garbagecollector,namespace,deployment,replicaset,endpointslice,\
                                disruption,serviceaccount,root-ca-cert-publisher,podgc,\
                                nodelifecycle";

/// How long to wait for it to lead (it then starts its controllers).
const LEAD_TIMEOUT: Duration = Duration::from_mins(1);

impl ControlPlane {
    /// Starts kube-controller-manager (garbage collector and namespace controller) against this
    /// API server as its admin, and waits until it holds its leader lease, after which its
    /// controllers start. It stops with the control plane. Starting it twice does nothing.
    pub async fn start_controller_manager(&self) -> Result<()> {
        if self.controller_manager().is_some() {
            return Ok(());
        }
        let mut args = vec![
            format!("--kubeconfig={}", self.kubeconfig_path().display()),
            // No HTTPS endpoint: nothing here reads its metrics or health.
            "--secure-port=0".to_owned(),
            "--leader-elect=true".to_owned(),
            "--leader-elect-lease-duration=15s".to_owned(),
        ];
        if self.pod_address.is_some() {
            // A cluster whose pods run on a node: also what a Deployment, a Service, a
            // PodDisruptionBudget and a pod's service-account token need.
            args.extend([
                format!("--controllers={NODE_CONTROLLERS}"),
                format!("--root-ca-file={}", self.dir.path().join("pki/ca.crt").display()),
            ]);
        } else {
            args.push("--controllers=garbagecollector,namespace".to_owned());
        }
        let binary = self.binaries.join("kube-controller-manager");
        anyhow::ensure!(
            binary.is_file(),
            "{} is missing: e2e/control-plane/build.sh builds it beside kube-apiserver (an envtest \
             directory in KUBEBUILDER_ASSETS has none)",
            binary.display()
        );
        let mut proc = Proc::spawn(
            "kube-controller-manager",
            &binary,
            &args,
            &self.controller_manager_log(),
        )?;
        let leases: Api<Lease> = Api::namespaced(self.client(), "kube-system");
        wait_process(&mut proc, LEAD_TIMEOUT, "its leader lease", || {
            let leases = leases.clone();
            async move {
                let lease = leases
                    .get_opt("kube-controller-manager")
                    .await?
                    .context("no lease yet")?;
                lease
                    .spec
                    .and_then(|s| s.holder_identity)
                    .filter(|h| !h.is_empty())
                    .map(drop)
                    .context("no holder yet")
            }
        })
        .await
        .with_context(|| format!("{}: kube-controller-manager", self.name))?;
        *self.controller_manager() = Some(proc);
        tracing::info!(cluster = self.name, "kube-controller-manager leading");
        Ok(())
    }

    /// Process id of kube-controller-manager, `None` unless started.
    pub fn controller_manager_pid(&self) -> Option<u32> {
        self.controller_manager().as_ref().map(Proc::pid)
    }

    /// kube-controller-manager's output.
    pub fn controller_manager_log(&self) -> std::path::PathBuf {
        self.dir.path().join("kube-controller-manager.log")
    }

    fn controller_manager(&self) -> std::sync::MutexGuard<'_, Option<Proc>> {
        self.controller_manager
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
