//! Helpers shared by the integration tests (real kube-apiservers from the e2e crate).
#![allow(dead_code, clippy::missing_panics_doc)]

use std::time::Duration;

use anyhow::{Context as _, Result};
use kkp_quota_crds::{
    KkpQuota, ProjectQuota, Quantity, QuotaLedger, Resource, ResourceDetails, ResourceQuota,
    ResourceQuotaSpec, Subject,
};
use kkp_quota_runtime::ops::Readiness;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use master_controller::{Metrics, Options};
use serde_json::json;

pub const DEADLINE: Duration = Duration::from_secs(20);

/// A controller running in-process as a tokio task; aborted when dropped.
pub struct Running {
    pub metrics: Metrics,
    pub readiness: Readiness,
    pub metrics_url: String,
    master: Client,
    options: Options,
    task: std::sync::Mutex<tokio::task::JoinHandle<Result<(), master_controller::Error>>>,
}

impl Running {
    pub async fn start(master: Client, options: Options) -> Result<Running> {
        kkp_quota_runtime::telemetry::init_tracing(false);
        let metrics = Metrics::new();
        let readiness = Readiness::default();
        let (address, serve) = metrics
            .bind_ops("127.0.0.1:0".parse()?, readiness.clone())
            .await?;
        tokio::spawn(serve);
        let task = tokio::spawn(master_controller::run(
            master.clone(),
            options.clone(),
            metrics.clone(),
            readiness.clone(),
        ));
        Ok(Running {
            metrics,
            readiness,
            metrics_url: format!("http://{address}/metrics"),
            master,
            options,
            task: std::sync::Mutex::new(task),
        })
    }

    /// Stops the controller and starts a fresh one (empty caches), keeping the metrics.
    pub fn restart(&self) {
        let fresh = tokio::spawn(master_controller::run(
            self.master.clone(),
            self.options.clone(),
            self.metrics.clone(),
            self.readiness.clone(),
        ));
        let old = std::mem::replace(
            &mut *self
                .task
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
            fresh,
        );
        old.abort();
    }

    pub fn is_finished(&self) -> bool {
        self.task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_finished()
    }

    pub async fn scrape(&self) -> Result<String> {
        Ok(reqwest::get(&self.metrics_url)
            .await?
            .error_for_status()?
            .text()
            .await?)
    }

    /// Quota reconciles completed so far.
    pub fn reconciles(&self) -> u64 {
        self.metrics
            .reconcile_duration
            .with_label_values(&["quota"])
            .get_sample_count()
    }

    /// Every write this replica made.
    pub fn writes(&self) -> f64 {
        self.metrics
            .registry
            .gather()
            .iter()
            .filter(|f| f.name() == "kkp_quota_master_writes_total")
            .flat_map(|f| f.get_metric().iter().map(|m| m.get_counter().get_value()))
            .sum::<f64>()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .abort();
    }
}

pub fn options() -> Options {
    let mut options = Options::new("kubermatic");
    options.resync_period = Duration::from_secs(30);
    options.seed_max_backoff = Duration::from_millis(500);
    options
}

pub fn cpu_mem(cpu: i64, mem_gib: i64) -> ResourceDetails {
    ResourceDetails {
        cpu: Some(Quantity::from_units(cpu)),
        memory: Some(Quantity::from_gibibytes(mem_gib)),
        ..ResourceDetails::default()
    }
}

/// Same amounts, absent counting as zero.
pub fn same_usage(a: &ResourceDetails, b: &ResourceDetails) -> bool {
    Resource::ALL.iter().all(|&r| a.amount(r) == b.amount(r))
}

pub async fn create_quota(
    api: &Api<ResourceQuota>,
    name: &str,
    project: &str,
    quota: ResourceDetails,
) -> Result<ResourceQuota> {
    let rq = ResourceQuota::new(
        name,
        ResourceQuotaSpec {
            subject: Subject::project(project),
            quota: KkpQuota::new(&quota),
        },
    );
    api.create(&PostParams::default(), &rq)
        .await
        .with_context(|| format!("creating quota {name}"))
}

pub async fn set_quota(api: &Api<ResourceQuota>, name: &str, quota: &ResourceDetails) -> Result<()> {
    let patch = json!({"spec": {"quota": quota}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// What a seed-controller does: write the ledger's localUsage.
pub async fn set_local_usage(seed: &Client, name: &str, usage: &ResourceDetails) -> Result<()> {
    let api: Api<QuotaLedger> = Api::all(seed.clone());
    // Every resource named: absent ones as null, so the merge patch replaces the whole usage.
    let mut full = serde_json::Map::new();
    for &r in Resource::ALL {
        full.insert(
            r.name().to_owned(),
            usage
                .get(r)
                .map_or(serde_json::Value::Null, |q| r.amount(q).into()),
        );
    }
    let patch = json!({"status": {"localUsage": full}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("writing localUsage of {name}"))?;
    Ok(())
}

pub fn status_of(rq: &ResourceQuota) -> kkp_quota_crds::ResourceQuotaStatus {
    rq.status.clone().unwrap_or_default()
}

pub fn ledger_status_of(ledger: &QuotaLedger) -> kkp_quota_crds::QuotaLedgerStatus {
    ledger.status.clone().unwrap_or_default()
}

/// A condition of the `ProjectQuota` beside a KKP quota (conditions live there: KKP's object
/// has none).
pub fn condition(
    rq: &ProjectQuota,
    type_: &str,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    rq.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .cloned()
}

/// The value of one sample line (`name{labels}`) in a Prometheus text exposition.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
}

/// What machine-webhook writes into seed `seed`'s ledger `quota` when a request does not fit its
/// share: a demand for `amount` cpu (absolute), or none.
pub async fn write_demand(seed: &Client, quota: &str, amount: Option<i64>) -> Result<()> {
    let demands = match amount {
        Some(n) => {
            let expires = jiff::Timestamp::now()
                .checked_add(jiff::SignedDuration::from_secs(300))?
                .to_string();
            json!([{"holder": "test", "amount": kkp_quota_crds::fixtures::cpu(n), "expiresAt": expires}])
        }
        None => json!(null),
    };
    Api::<QuotaLedger>::all(seed.clone())
        .patch_status(
            quota,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"demands": demands}})),
        )
        .await
        .with_context(|| format!("writing a demand into {quota}"))?;
    Ok(())
}

/// What seed-controller writes into seed `seed`'s ledger `quota` when it gives share back.
pub async fn write_release(seed: &Client, quota: &str, released: &ResourceDetails) -> Result<()> {
    Api::<QuotaLedger>::all(seed.clone())
        .patch_status(
            quota,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"released": released}})),
        )
        .await
        .with_context(|| format!("writing a release into {quota}"))?;
    Ok(())
}
