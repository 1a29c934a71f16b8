//! The README's install section, followed with the real helm against the fleet's real API
//! servers (as far as clusters without kubelets allow: nothing runs the pods): install on the
//! master and a seed, upgrade with the master's per-seed credential, uninstall, reinstall; and
//! what the docs promise survives an uninstall does.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

use std::path::Path;

use e2e::chart::{self, CHART, NAMESPACE};
use e2e::{Fleet, FleetSpec};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kkp_quota_crds::QuotaLedger;
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, PostParams};

/// The README's install command for a seed named `seed-a`.
const SEED_INSTALL: [&str; 9] = [
    "install",
    "kkp-quota",
    CHART,
    "-n",
    NAMESPACE,
    "--set",
    "role=seed",
    "--set",
    "seedController.seedName=seed-a",
];

/// Runs helm against the cluster of `kubeconfig`; panics with helm's output when it fails.
fn helm(kubeconfig: &Path, args: &[&str]) -> String {
    chart::run(kubeconfig, args).unwrap_or_else(|e| panic!("{e:#}"))
}

fn args_of(deployment: &Deployment) -> Vec<String> {
    deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .args
        .clone()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_install_section_installs_upgrades_and_uninstalls_keeping_quotas() {
    let fleet = Fleet::start(FleetSpec::empty().with_seed("seed-a"))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    fleet.write_dir(dir.path()).unwrap();
    let kubeconfig = |name: &str| dir.path().join(format!("{name}.kubeconfig"));
    // The fleet installs this project's CRDs for its tests; a KKP cluster does not have them
    // before the chart does.
    for plane in [fleet.master(), fleet.seed("seed-a")] {
        let crds = Api::<CustomResourceDefinition>::all(plane.client());
        for name in [
            "projectquotas.kkp-quota.dev",
            "quotaledgers.kkp-quota.dev",
            "quotagroups.kkp-quota.dev",
        ] {
            crds.delete(name, &DeleteParams::default()).await.unwrap();
            e2e::wait_for_gone(&crds, name, std::time::Duration::from_mins(1))
                .await
                .unwrap();
        }
    }

    // Install: the master role on the master, the seed role on the seed.
    helm(
        &kubeconfig("master"),
        &[
            "install",
            "kkp-quota",
            CHART,
            "-n",
            NAMESPACE,
            "--set",
            "role=master",
        ],
    );
    helm(&kubeconfig("seed-a"), &SEED_INSTALL);
    let master_deployments = Api::<Deployment>::namespaced(fleet.master().client(), NAMESPACE);
    let seed_deployments = Api::<Deployment>::namespaced(fleet.seed("seed-a").client(), NAMESPACE);
    master_deployments
        .get("kkp-quota-master-controller")
        .await
        .unwrap();
    let seed_controller = seed_deployments.get("kkp-quota-seed-controller").await.unwrap();
    assert!(
        args_of(&seed_controller)
            .iter()
            .any(|a| a == "--seed-name=seed-a"),
        "{:?}",
        args_of(&seed_controller)
    );
    seed_deployments.get("kkp-quota-machine-webhook").await.unwrap();

    // The CRDs came with the chart: a ledger can be written on the seed.
    let ledgers = Api::<QuotaLedger>::all(fleet.seed("seed-a").client());
    let ledger = QuotaLedger {
        metadata: ObjectMeta {
            name: Some("project-demo".into()),
            ..ObjectMeta::default()
        },
        spec: serde_json::from_value(
            serde_json::json!({"subject": {"name": "demo", "kind": "project"}, "quota": {"cpu": "8"}}),
        )
        .unwrap(),
        status: None,
    };
    ledgers.create(&PostParams::default(), &ledger).await.unwrap();

    // Upgrade: the master reads each seed's credential from kkp-quota-seed-<seed>.
    helm(
        &kubeconfig("master"),
        &[
            "upgrade",
            "kkp-quota",
            CHART,
            "-n",
            NAMESPACE,
            "--set",
            "role=master",
            "--set",
            "masterController.seedKubeconfigSecret=kkp-quota-seed-{seed}",
        ],
    );
    let master_controller = master_deployments
        .get("kkp-quota-master-controller")
        .await
        .unwrap();
    let flag = "--seed-kubeconfig-secret=kkp-quota-seed-{seed}";
    assert!(
        args_of(&master_controller).iter().any(|a| a == flag),
        "{:?}",
        args_of(&master_controller)
    );

    // Uninstall the seed role: the workloads go; the CRDs, the ledger and the two Secrets stay.
    let secrets = Api::<Secret>::namespaced(fleet.seed("seed-a").client(), NAMESPACE);
    let keys_before = secrets.get("kkp-quota-url-signing-keys").await.unwrap().data;
    helm(
        &kubeconfig("seed-a"),
        &["uninstall", "kkp-quota", "-n", NAMESPACE],
    );
    assert!(
        seed_deployments
            .get_opt("kkp-quota-seed-controller")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        ledgers.get_opt("project-demo").await.unwrap().is_some(),
        "the ledger survives"
    );
    for name in ["kkp-quota-url-signing-keys", "kkp-quota-webhook-tls"] {
        assert!(secrets.get_opt(name).await.unwrap().is_some(), "{name} is kept");
    }

    // Reinstall: the kept URL-signing keys are used again (user clusters' URLs stay valid).
    helm(&kubeconfig("seed-a"), &SEED_INSTALL);
    assert_eq!(
        secrets.get("kkp-quota-url-signing-keys").await.unwrap().data,
        keys_before
    );
    assert!(ledgers.get_opt("project-demo").await.unwrap().is_some());
    helm(
        &kubeconfig("master"),
        &["uninstall", "kkp-quota", "-n", NAMESPACE],
    );
    assert!(
        master_deployments
            .get_opt("kkp-quota-master-controller")
            .await
            .unwrap()
            .is_none()
    );
}
