//! Quotas the master does not fan out, on one fleet:
//! - values KKP's CRD accepts but this system cannot read exactly (`1e40`, `0.5n`): a
//!   master-controller started with them in the master still reconciles every other project,
//!   and each such quota gets a condition and an Event naming the field and the accepted form;
//! - a default quota in KKP's settings that cannot be read: default quotas are left as they are
//!   (never taken for "no default"), it is counted, and it applies once fixed;
//! - a project's second quota (issue #32, finding 9): the seeds enforce the first by name, so the
//!   master fans out only that one, deletes the other's ledgers, says so, and hands over when the
//!   first is deleted.

mod common;

use anyhow::{Context as _, Result, ensure};
use common::*;
use e2e::{Fleet, FleetSpec, wait_for};
use k8s_openapi::api::events::v1::Event;
use kkp_quota_crds::project_quota::QuotaCondition;
use kkp_quota_crds::{ProjectQuota, Quantity, QuotaLedger, Resource, ResourceQuota};
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

const SEEDS: [&str; 2] = ["seed-a", "seed-b"];
/// The condition types on the `ProjectQuota` (literals: what a user reads).
const QUOTA_INVALID: &str = QuotaCondition::QuotaInvalid.as_str();
const NOT_IN_FORCE: &str = QuotaCondition::NotInForce.as_str();

/// KKP's quotas as plain JSON: what KKP's CRD accepts, whether or not this system can read it.
fn raw_quotas(master: &Client) -> Api<DynamicObject> {
    Api::all_with(master.clone(), &ApiResource::erase::<ResourceQuota>(&()))
}

async fn create_raw(
    api: &Api<DynamicObject>,
    name: &str,
    project: &str,
    quota: serde_json::Value,
) -> Result<()> {
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kubermatic.k8c.io/v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name},
        "spec": {"subject": {"name": project, "kind": "project"}, "quota": quota},
    }))?;
    api.create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("creating {name}"))?;
    Ok(())
}

/// Every seed's ledger of `name` has `cpu` as its cpu limit.
async fn seeds_have_cpu(fleet: &Fleet, name: &str, cpu: i64, what: &str) -> Result<()> {
    wait_for(DEADLINE, what, || async {
        for seed in SEEDS {
            let ledger = Api::<QuotaLedger>::all(fleet.seed(seed).client())
                .get_opt(name)
                .await?
                .context(format!("no ledger on {seed}"))?;
            let got = ledger.spec.quota.amount(Resource::Cpu);
            ensure!(got == Quantity::from_units(cpu), "{seed}: cpu {got}, want {cpu}");
        }
        Ok(())
    })
    .await
}

/// The `QuotaInvalid` condition and a Warning Event on KKP's object, both naming `field`,
/// the value and the accepted form.
async fn reported(fleet: &Fleet, name: &str, field: &str, value: &str, form: &str) -> Result<()> {
    said(fleet, name, QUOTA_INVALID, &[field, value, form]).await
}

/// The condition `type_` and a Warning Event on KKP's object `name`, both saying every `text`.
async fn said(fleet: &Fleet, name: &str, type_: &str, texts: &[&str]) -> Result<()> {
    let master = fleet.master().client();
    let pq: Api<ProjectQuota> = Api::all(master.clone());
    // Events about cluster-scoped objects live in `default`.
    let events: Api<Event> = Api::namespaced(master, "default");
    wait_for(DEADLINE, &format!("{name}: {type_} said"), || async {
        let pq = pq.get_opt(name).await?.context("no ProjectQuota")?;
        let c = condition(&pq, type_).context(format!("no {type_} condition"))?;
        ensure!(c.status == "True", "{type_} is {}", c.status);
        for text in texts {
            ensure!(
                c.message.contains(text),
                "condition message {:?} lacks {text:?}",
                c.message
            );
        }
        let event = events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some(c.reason.as_str())
                    && e.regarding.as_ref().is_some_and(|r| {
                        r.name.as_deref() == Some(name) && r.kind.as_deref() == Some("ResourceQuota")
                    })
            })
            .context("no Event on the ResourceQuota")?;
        ensure!(
            event.type_.as_deref() == Some("Warning"),
            "Event type {:?}",
            event.type_
        );
        let note = event.note.unwrap_or_default();
        for text in texts {
            ensure!(note.contains(text), "Event note {note:?} lacks {text:?}");
        }
        Ok(())
    })
    .await
}

/// Waits until `kkp_quota_master_unreadable_quotas` shows `want`.
async fn unreadable_gauge(controller: &Running, want: f64) -> Result<()> {
    gauge(controller, "kkp_quota_master_unreadable_quotas", want).await
}

async fn gauge(controller: &Running, series: &str, want: f64) -> Result<()> {
    wait_for(DEADLINE, &format!("{series} at {want}"), || async {
        let got = sample(&controller.scrape().await?, series);
        ensure!(got.is_some_and(|g| (g - want).abs() < 0.5), "gauge {got:?}");
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_the_seeds_would_not_enforce_are_reported_and_the_others_go_on() -> Result<()> {
    let fleet = Fleet::start(
        FleetSpec::empty()
            .with_seed("seed-a")
            .with_seed("seed-b")
            .with_project("good")
            .with_project("huge")
            .with_project("tiny")
            .with_project("twice")
            .with_project("fresh"),
    )
    .await?;
    let master = fleet.master().client();
    let quotas: Api<ResourceQuota> = Api::all(master.clone());
    let raw = raw_quotas(&master);
    // Both pass KKP's quantity pattern; neither is a whole number of nano-units in range.
    create_raw(
        &raw,
        "project-huge",
        "huge",
        json!({"cpu": "1e40", "memory": "8Gi"}),
    )
    .await?;
    create_raw(
        &raw,
        "project-tiny",
        "tiny",
        json!({"cpu": "2", "memory": "0.5n"}),
    )
    .await?;
    create_quota(&quotas, "project-good", "good", cpu_mem(4, 8)).await?;

    // Started with them already there: its first listing holds the unreadable ones.
    let controller = Running::start(master.clone(), options()).await?;
    seeds_have_cpu(&fleet, "project-good", 4, "project-good fanned out").await?;
    set_quota(&quotas, "project-good", &cpu_mem(6, 8)).await?;
    seeds_have_cpu(&fleet, "project-good", 6, "project-good's edit on every seed").await?;

    reported(&fleet, "project-huge", "spec.quota.cpu", "1e40", "at most").await?;
    reported(&fleet, "project-tiny", "spec.quota.memory", "0.5n", "1n").await?;
    unreadable_gauge(&controller, 2.0).await?;
    for seed in SEEDS {
        let ledgers = Api::<QuotaLedger>::all(fleet.seed(seed).client());
        for name in ["project-huge", "project-tiny"] {
            ensure!(ledgers.get_opt(name).await?.is_none(), "{name} reached {seed}");
        }
    }

    // Fixed: it is fanned out, and the condition goes.
    raw.patch(
        "project-huge",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"quota": {"cpu": "40"}}})),
    )
    .await?;
    seeds_have_cpu(&fleet, "project-huge", 40, "the fixed quota fanned out").await?;
    let pq: Api<ProjectQuota> = Api::all(master.clone());
    wait_for(DEADLINE, "QuotaInvalid gone once fixed", || async {
        let pq = pq.get("project-huge").await?;
        ensure!(
            condition(&pq, QUOTA_INVALID).is_none(),
            "QuotaInvalid still there"
        );
        Ok(())
    })
    .await?;
    unreadable_gauge(&controller, 1.0).await?;

    several_quotas_for_one_project(&fleet, &controller, &quotas, &pq).await?;
    an_unreadable_default_quota(&fleet, &controller, &quotas, &master).await?;
    ensure!(!controller.is_finished(), "the controller stopped");
    Ok(())
}

/// A project with two quotas: "project-twice" is in force everywhere; "twice-extra", created
/// later and sorting after it, is not fanned out, and says which one is; deleting the first hands
/// over to the second.
async fn several_quotas_for_one_project(
    fleet: &Fleet,
    controller: &Running,
    quotas: &Api<ResourceQuota>,
    pq: &Api<ProjectQuota>,
) -> Result<()> {
    create_quota(quotas, "project-twice", "twice", cpu_mem(4, 8)).await?;
    seeds_have_cpu(fleet, "project-twice", 4, "the first quota fanned out").await?;
    create_quota(quotas, "twice-extra", "twice", cpu_mem(9, 8)).await?;
    said(fleet, "twice-extra", NOT_IN_FORCE, &["project-twice", "twice"]).await?;
    gauge(controller, "kkp_quota_master_quotas_not_in_force", 1.0).await?;
    for seed in SEEDS {
        let ledgers = Api::<QuotaLedger>::all(fleet.seed(seed).client());
        ensure!(
            ledgers.get_opt("twice-extra").await?.is_none(),
            "the second quota reached {seed}"
        );
    }
    // Edits of the one in force still reach the seeds.
    set_quota(quotas, "project-twice", &cpu_mem(5, 8)).await?;
    seeds_have_cpu(fleet, "project-twice", 5, "the first quota's edit").await?;
    // The first deleted: the second takes over, and its condition goes.
    quotas
        .delete("project-twice", &kube::api::DeleteParams::default())
        .await?;
    seeds_have_cpu(fleet, "twice-extra", 9, "the second quota in force").await?;
    wait_for(DEADLINE, "the first quota's ledgers gone", || async {
        for seed in SEEDS {
            let ledgers = Api::<QuotaLedger>::all(fleet.seed(seed).client());
            ensure!(
                ledgers.get_opt("project-twice").await?.is_none(),
                "still on {seed}"
            );
        }
        Ok(())
    })
    .await?;
    wait_for(DEADLINE, "NotInForce gone once in force", || async {
        let pq = pq.get("twice-extra").await?;
        ensure!(condition(&pq, NOT_IN_FORCE).is_none(), "NotInForce still there");
        Ok(())
    })
    .await?;
    gauge(controller, "kkp_quota_master_quotas_not_in_force", 0.0).await?;

    Ok(())
}

/// The default quota in KKP's settings unreadable: counted, nothing written; once fixed, the
/// project without a quota ("fresh") gets it.
async fn an_unreadable_default_quota(
    fleet: &Fleet,
    controller: &Running,
    quotas: &Api<ResourceQuota>,
    master: &Client,
) -> Result<()> {
    let settings = Api::<DynamicObject>::all_with(
        master.clone(),
        &ApiResource::erase::<kkp_quota_crds::kkp::KubermaticSetting>(&()),
    );
    let global: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kubermatic.k8c.io/v1",
        "kind": "KubermaticSetting",
        "metadata": {"name": "globalsettings"},
        "spec": {"defaultQuota": {"quota": {"cpu": "1e40"}}},
    }))?;
    settings.create(&PostParams::default(), &global).await?;
    unreadable_gauge(controller, 2.0).await?;
    ensure!(
        quotas.get_opt("project-fresh").await?.is_none(),
        "a default quota was written from an unreadable default"
    );
    settings
        .patch(
            "globalsettings",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"defaultQuota": {"quota": {"cpu": "3"}}}})),
        )
        .await?;
    seeds_have_cpu(fleet, "project-fresh", 3, "the fixed default applied").await?;
    unreadable_gauge(controller, 1.0).await?;
    Ok(())
}
