//! Shared helpers for the webhook's tests on a real fleet: a seed, user clusters of one project,
//! the webhook in-process, and the objects other components would write.
#![allow(dead_code, clippy::missing_panics_doc)]

pub mod bursts;
pub mod owners;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context as _, Result};
use e2e::certs::{WebhookCertPaths, WebhookCerts};
use e2e::{Fleet, FleetSpec, wait_for};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kkp_quota_crds::ledger::{Allotment, Reservation};
use kkp_quota_crds::machine::Machine;
use kkp_quota_crds::quota::{PROJECT_KIND, SUBJECT_KIND_LABEL, SUBJECT_NAME_LABEL};
use kkp_quota_crds::{LedgerSubject, QuotaLedger, QuotaLedgerSpec, ResourceDetails};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use machine_webhook::reserve::AllotmentConfig;
use machine_webhook::{Config, Webhook};
use serde_json::json;
use tokio::task::JoinHandle;

pub const SEED: &str = "seed-a";
pub const PROJECT: &str = "demo";
pub const NS: &str = "kube-system";
pub const WEBHOOK_CONFIG: &str = kkp_quota_runtime::webhook_config::NAME;

/// A seed with user clusters `alpha` and `beta` of project `demo` (plus the master the fleet
/// always has).
pub async fn fleet() -> Result<Fleet> {
    Fleet::start(
        FleetSpec::empty()
            .with_seed(SEED)
            .with_project(PROJECT)
            .with_project("other")
            .with_user_cluster("alpha", SEED, PROJECT)
            .with_user_cluster("beta", SEED, PROJECT),
    )
    .await
}

/// The webhook running in-process as a task.
pub struct RunningWebhook {
    pub address: SocketAddr,
    pub task: JoinHandle<()>,
    pub metrics: machine_webhook::metrics::Metrics,
}

impl RunningWebhook {
    /// Kills it: the task is aborted and every connection and worker it had ends with it.
    pub async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// The webhook's serving certificate and its URL-signing key file (one fresh key).
pub struct Certs {
    pub webhook: WebhookCerts,
    pub paths: WebhookCertPaths,
    /// The URL-signing key file the webhook verifies with.
    pub keys: std::path::PathBuf,
    pub dir: tempfile::TempDir,
}

pub fn certs() -> Result<Certs> {
    let dir = tempfile::tempdir()?;
    let certs = WebhookCerts::generate()?;
    let paths = certs.write_to(dir.path())?;
    let keys = dir.path().join("url-signing-keys");
    e2e::system::write_url_signing_keys(&keys, &[&kkp_quota_runtime::webhook_auth::generate_key()])?;
    Ok(Certs {
        webhook: certs,
        paths,
        keys,
        dir,
    })
}

/// The token seed-controller would put into `cluster`'s webhook URL (signed with the first key
/// of the file, over the Cluster's name and UID on the seed).
pub async fn token(seed: &Client, cluster: &str, certs: &Certs) -> Result<String> {
    let uid = Api::<kkp_quota_crds::kkp::Cluster>::all(seed.clone())
        .get(cluster)
        .await?
        .metadata
        .uid
        .context("Cluster without UID")?;
    let keys = kkp_quota_runtime::webhook_auth::SigningKeys::load(&certs.keys)?;
    Ok(keys.sign(cluster, &uid))
}

/// The authenticated admission URL of `cluster` on the webhook at `address`.
pub async fn admission_url(
    seed: &Client,
    address: SocketAddr,
    cluster: &str,
    certs: &Certs,
) -> Result<String> {
    Ok(kkp_quota_runtime::webhook_auth::webhook_url(
        &format!("https://{address}"),
        cluster,
        &token(seed, cluster, certs).await?,
    ))
}

/// Starts the webhook against `seed` on `address` (port 0: any) and waits until it is ready.
pub async fn start_webhook(seed: Client, certs: &Certs, address: SocketAddr) -> Result<RunningWebhook> {
    start_webhook_with(seed, certs, address, Some(AllotmentConfig::default())).await
}

/// [`start_webhook`] with the given allotments (`None`: off).
pub async fn start_webhook_with(
    seed: Client,
    certs: &Certs,
    address: SocketAddr,
    allotments: Option<AllotmentConfig>,
) -> Result<RunningWebhook> {
    start_webhook_configured(seed, certs, address, |config| config.allotments = allotments).await
}

/// [`start_webhook`] with the configuration changed by `adjust`.
pub async fn start_webhook_configured(
    seed: Client,
    certs: &Certs,
    address: SocketAddr,
    adjust: impl FnOnce(&mut Config),
) -> Result<RunningWebhook> {
    let mut config = Config::new(address, certs.paths.cert.clone(), certs.paths.key.clone());
    config.auth = Some(machine_webhook::AuthConfig::UrlSigningKeys(certs.keys.clone()));
    adjust(&mut config);
    let webhook = Webhook::start(config, seed).await?;
    let address = webhook.address;
    let readiness = webhook.readiness.clone();
    let metrics = webhook.metrics.clone();
    let task = tokio::spawn(async move {
        if let Err(e) = webhook.run().await {
            eprintln!("webhook stopped: {e}");
        }
    });
    wait_for(Duration::from_secs(30), "the webhook's caches to sync", || {
        let ready = readiness.is_ready();
        async move { ready }
    })
    .await?;
    Ok(RunningWebhook {
        address,
        task,
        metrics,
    })
}

/// What seed-controller keeps in every user cluster (written here so the tests do not depend on
/// it): `<base>/validate/machines/<cluster>/<token>`, failurePolicy Fail, 5 s.
pub async fn register(
    seed: &Client,
    user: Client,
    cluster: &str,
    address: SocketAddr,
    certs: &Certs,
) -> Result<()> {
    let url = admission_url(seed, address, cluster, certs).await?;
    // The configuration seed-controller writes, exactly (`kkp_quota_runtime::webhook_config`).
    let config = kkp_quota_runtime::webhook_config::desired(
        &url,
        Some(&certs.webhook.ca_bundle().0),
        kkp_quota_runtime::webhook_config::Operations::CreateAndUpdate,
    );
    let api: Api<ValidatingWebhookConfiguration> = Api::all(user.clone());
    api.patch(
        WEBHOOK_CONFIG,
        &PatchParams::apply("kkp-quota-test").force(),
        &Patch::Apply(&config),
    )
    .await?;
    // The API server picks configurations up asynchronously: wait until a Machine that cannot
    // be sized is refused (the project must have a quota by now).
    let machines: Api<Machine> = Api::namespaced(user, NS);
    wait_for(
        Duration::from_secs(30),
        "the webhook configuration to take effect",
        || {
            let machines = machines.clone();
            async move {
                let probe = unsizeable_machine("probe");
                matches!(
                    machines.create(&PostParams { dry_run: true, ..PostParams::default() }, &probe).await,
                    Err(kube::Error::Api(s)) if s.message.contains("cannot be sized")
                )
            }
        },
    )
    .await?;
    Ok(())
}

pub fn details(cpu: &str) -> ResourceDetails {
    serde_json::from_value(json!({"cpu": cpu})).expect("valid quantity")
}

/// Writes the project's quota copy on the seed as master-controller and seed-controller would:
/// `spec.quota` (cpu limit), `status.localUsage`, `status.otherSeedsUsage`, no reservations.
pub async fn write_quota(seed: Client, project: &str, limit_cpu: &str, local_cpu: &str) -> Result<()> {
    let api: Api<QuotaLedger> = Api::all(seed);
    let name = format!("project-{project}");
    let mut quota = QuotaLedger::new(
        &name,
        QuotaLedgerSpec {
            rollout_allowance: None,
            subject: LedgerSubject::project(project),
            quota: details(limit_cpu),
            shares: None,
            reserved_counts: false,
        },
    );
    quota.metadata.labels = Some(BTreeMap::from([
        (SUBJECT_NAME_LABEL.to_owned(), project.to_owned()),
        (SUBJECT_KIND_LABEL.to_owned(), PROJECT_KIND.to_owned()),
    ]));
    api.patch(
        &name,
        &PatchParams::apply("kkp-quota-master").force(),
        &Patch::Apply(&quota),
    )
    .await
    .context("writing the quota copy")?;
    set_usage(&api, &name, local_cpu).await
}

async fn set_usage(api: &Api<QuotaLedger>, name: &str, local_cpu: &str) -> Result<()> {
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {
            "localUsage": {"cpu": local_cpu},
            "otherSeedsUsage": {"cpu": "0"},
            "globalUsage": {"cpu": local_cpu},
            "reservations": null,
            "allotments": null,
        }})),
    )
    .await
    .context("writing the quota copy's status")?;
    Ok(())
}

/// Sets the seed's count and empties the ledger, allotments included (what seed-controller would
/// do after counting, and after the allotments expired).
pub async fn reset_usage(seed: Client, project: &str, local_cpu: &str) -> Result<()> {
    set_usage(&Api::all(seed), &format!("project-{project}"), local_cpu).await
}

pub async fn reservations(seed: Client, project: &str) -> Result<Vec<Reservation>> {
    Ok(ledger(seed, project).await?.0)
}

/// The project's reservations and allotments.
pub async fn ledger(seed: Client, project: &str) -> Result<(Vec<Reservation>, Vec<Allotment>)> {
    let api: Api<QuotaLedger> = Api::all(seed);
    let quota = api.get(&format!("project-{project}")).await?;
    let status = quota.status.unwrap_or_default();
    Ok((status.reservations, status.allotments))
}

/// Waits until the project's reservations number `count` (admissions from an allotment are
/// recorded a moment after they are answered).
pub async fn wait_reservations(seed: Client, project: &str, count: usize) -> Result<Vec<Reservation>> {
    wait_for(
        Duration::from_secs(30),
        &format!("{count} reservations in project {project}"),
        || {
            let seed = seed.clone();
            async move {
                reservations(seed, project)
                    .await
                    .ok()
                    .filter(|r| r.len() == count)
            }
        },
    )
    .await
}

/// A vSphere Machine of `cpus` vCPUs, 1 GiB and a 10 GiB disk.
pub fn machine(name: &str, cpus: i64) -> Machine {
    serde_json::from_value(json!({
        "apiVersion": "cluster.k8s.io/v1alpha1",
        "kind": "Machine",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"providerSpec": {"value": {
            "cloudProvider": "vsphere",
            "cloudProviderSpec": {"templateVMName": "ubuntu", "cpus": cpus, "memoryMB": 1024, "diskSizeGB": 10},
            "operatingSystem": "ubuntu"
        }}}
    }))
    .expect("valid Machine")
}

/// A Machine whose size cannot be known (no cpus).
pub fn unsizeable_machine(name: &str) -> Machine {
    serde_json::from_value(json!({
        "apiVersion": "cluster.k8s.io/v1alpha1",
        "kind": "Machine",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"providerSpec": {"value": {
            "cloudProvider": "vsphere",
            "cloudProviderSpec": {"memoryMB": 1024, "diskSizeGB": 10}
        }}}
    }))
    .expect("valid Machine")
}

pub fn machines(user: Client) -> Api<Machine> {
    Api::namespaced(user, NS)
}

pub async fn delete_all_machines(user: Client) -> Result<()> {
    let api = machines(user);
    api.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    wait_for(Duration::from_secs(30), "every Machine to be gone", || {
        let api = api.clone();
        async move {
            api.list(&ListParams::default())
                .await
                .is_ok_and(|l| l.items.is_empty())
        }
    })
    .await
}

/// The message of a refused request (the API server prefixes the webhook's own message).
pub fn denial(result: Result<Machine, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(status)) => status.message,
        Ok(m) => panic!(
            "expected a denial, the Machine {:?} was admitted",
            m.metadata.name
        ),
        Err(e) => panic!("expected a denial, got {e}"),
    }
}
