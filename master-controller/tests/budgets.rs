//! A shared group's budgets against a real fleet (master + seed-a + seed-b, real
//! kube-apiservers), master-controller in-process; the test plays the seeds' part (demands,
//! releases) by writing the ledgers' status, as `tests/shares.rs` does for one project.
//!
//! Group `acme` (6 cpu) over `demo` and `other` (10 cpu each): every member takes its first
//! word; a demand in `demo` is met from the group's budget; a demand in `other` for the whole
//! group moves `demo`'s budget (asked back, released by its seed, given to `other`); what the
//! seeds are granted never exceeds the group's 6 cpu, though each project alone allows 10; the
//! group deleted, each project is bounded by its own quota alone again.

#![allow(clippy::too_many_lines)] // a scenario reads top to bottom

mod common;

use anyhow::{Context as _, Result, ensure};
use common::*;
use e2e::{Fleet, FleetSpec, wait_for};
use kkp_quota_crds::fixtures::cpu;
use kkp_quota_crds::kkp::Project;
use kkp_quota_crds::project_quota::ShareRecord;
use kkp_quota_crds::{
    ProjectQuota, Quantity, QuotaGroup, QuotaLedger, Resource, ResourceDetails, ResourceQuota,
};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

const GROUP: &str = "acme";
const PROJECTS: [(&str, &str); 2] = [("demo", "project-demo"), ("other", "project-other")];

struct World {
    controller: Running,
    fleet: Fleet,
}

fn cpu_of(d: &ResourceDetails) -> Quantity {
    d.amount(Resource::Cpu)
}

impl World {
    fn seed(&self, name: &str) -> Client {
        self.fleet.seed(name).client()
    }

    async fn record(&self, quota: &str) -> Result<ShareRecord> {
        let pq = Api::<ProjectQuota>::all(self.fleet.master().client())
            .get(quota)
            .await?;
        pq.status
            .and_then(|s| s.shares)
            .context(format!("no status.shares on {quota}"))
    }

    async fn group(&self) -> Result<QuotaGroup> {
        Ok(Api::<QuotaGroup>::all(self.fleet.master().client())
            .get(GROUP)
            .await?)
    }

    /// What the seeds of every project were granted, net of what they released (read from the
    /// ledgers): at least what they hold.
    async fn held_by_seeds(&self) -> Result<Quantity> {
        let mut sum = Quantity::ZERO;
        for seed in ["seed-a", "seed-b"] {
            for (_, quota) in PROJECTS {
                let Some(ledger) = Api::<QuotaLedger>::all(self.seed(seed)).get_opt(quota).await? else {
                    continue;
                };
                let granted = ledger.spec.shares.map(|s| cpu_of(&s.granted)).unwrap_or_default();
                let released = ledger
                    .status
                    .and_then(|s| s.released)
                    .map(|r| cpu_of(&r))
                    .unwrap_or_default();
                sum = sum.checked_add(granted.saturating_sub_to_zero(released))?;
            }
        }
        Ok(sum)
    }

    async fn demand(&self, seed: &str, quota: &str, amount: Option<i64>) -> Result<()> {
        write_demand(&self.seed(seed), quota, amount).await
    }

    async fn release(&self, seed: &str, quota: &str, released: Quantity) -> Result<()> {
        let released = ResourceDetails {
            cpu: Some(released),
            ..ResourceDetails::default()
        };
        write_release(&self.seed(seed), quota, &released).await
    }

    /// What the seeds hold together stays within the group's 6 cpu.
    async fn within_group(&self) -> Result<()> {
        let held = self.held_by_seeds().await?;
        ensure!(
            held <= Quantity::from_units(6),
            "the seeds hold {held:?} of the group's 6"
        );
        Ok(())
    }

    async fn ledger_granted(&self, seed: &str, quota: &str) -> Result<Quantity> {
        let ledger = Api::<QuotaLedger>::all(self.seed(seed))
            .get_opt(quota)
            .await?
            .context(format!("no ledger {quota} on {seed}"))?;
        Ok(ledger.spec.shares.map(|s| cpu_of(&s.granted)).unwrap_or_default())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_groups_budgets_on_a_real_fleet() -> Result<()> {
    let fleet = Fleet::start(
        FleetSpec::empty()
            .with_seed("seed-a")
            .with_seed("seed-b")
            .with_project("demo")
            .with_project("other"),
    )
    .await?;
    let controller = Running::start(fleet.master().client(), options()).await?;
    let w = World { controller, fleet };
    let master = w.fleet.master().client();
    let quotas: Api<ResourceQuota> = Api::all(master.clone());
    let projects: Api<Project> = Api::all(master.clone());
    for (project, quota) in PROJECTS {
        create_quota(&quotas, quota, project, cpu(10)).await?;
        let label = json!({"metadata": {"labels": {"customer": "acme"}}});
        projects
            .patch(project, &PatchParams::default(), &Patch::Merge(&label))
            .await?;
    }
    let group: QuotaGroup = serde_json::from_value(json!({
        "apiVersion": "kkp-quota.dev/v1alpha1",
        "kind": "QuotaGroup",
        "metadata": {"name": GROUP},
        "spec": {"selector": {"matchLabels": {"customer": "acme"}}, "quota": {"cpu": "6"}},
    }))?;
    Api::<QuotaGroup>::all(master.clone())
        .create(&PostParams::default(), &group)
        .await?;

    // Every member is in the group's record, and has taken a word of it.
    wait_for(DEADLINE, "each project's copy of its budget", || async {
        let group = w.group().await?;
        let record = group.status.and_then(|s| s.budgets).context("no budgets")?;
        let names: Vec<&str> = record.projects.iter().map(|p| p.name.as_str()).collect();
        ensure!(names == ["demo", "other"], "the record holds {names:?}");
        for (_, quota) in PROJECTS {
            let copies = w.record(quota).await?.groups;
            ensure!(
                copies.iter().any(|c| c.group == GROUP && c.version >= 1),
                "{quota} holds {copies:?}"
            );
        }
        let enforced = w
            .group()
            .await?
            .status
            .unwrap_or_default()
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Enforced")
            .context("no Enforced condition")?;
        ensure!(enforced.status == "True", "{enforced:?}");
        Ok(())
    })
    .await
    .context("first words")?;

    // demo asks for 4 on seed-a: the group's budget covers it, then demo's share.
    w.demand("seed-a", "project-demo", Some(4)).await?;
    wait_for(DEADLINE, "demo's seed-a granted 4 from the group", || async {
        let granted = w.ledger_granted("seed-a", "project-demo").await?;
        ensure!(
            granted >= Quantity::from_units(4),
            "seed-a holds {granted:?} of demo"
        );
        w.within_group().await
    })
    .await
    .context("a demand within the group")?;
    let demo_granted = w.ledger_granted("seed-a", "project-demo").await?;
    // Admitted: the demand goes; demo's seed commits nothing (its Machines went, say).
    w.demand("seed-a", "project-demo", None).await?;

    // other asks for the whole group on seed-b: demo's budget is asked back (through its
    // seed's target), its seed releases, and the group gives it to other.
    w.demand("seed-b", "project-other", Some(6)).await?;
    wait_for(DEADLINE, "demo's seed-a asked to release", || async {
        let ledger = Api::<QuotaLedger>::all(w.seed("seed-a"))
            .get("project-demo")
            .await?;
        let target = ledger
            .spec
            .shares
            .and_then(|s| s.target.get(Resource::Cpu))
            .context("no target")?;
        ensure!(target < demo_granted, "target {target:?} of {demo_granted:?}");
        w.within_group().await
    })
    .await
    .context("demo asked back")?;
    w.release("seed-a", "project-demo", demo_granted).await?;
    wait_for(DEADLINE, "other's seed-b granted the whole group", || async {
        let granted = w.ledger_granted("seed-b", "project-other").await?;
        ensure!(
            granted == Quantity::from_units(6),
            "seed-b holds {granted:?} of other"
        );
        w.within_group().await
    })
    .await
    .context("budget moved from demo to other")?;
    wait_for(DEADLINE, "the group's series", || async {
        let text = w.controller.scrape().await?;
        let limit = sample(&text, "kkp_quota_group_limit{group=\"acme\",resource=\"cpu\"}");
        ensure!(limit == Some(6.0), "limit series {limit:?}");
        let other = sample(
            &text,
            "kkp_quota_group_budget{group=\"acme\",project=\"other\",resource=\"cpu\"}",
        );
        ensure!(other == Some(6.0), "other's budget series {other:?}");
        Ok(())
    })
    .await
    .context("metrics")?;

    // The group deleted: every project is its own again at once (no copy left, and demo's seed
    // gets what its own 10 cpu allow beside other's 6: the group bounds nothing any more).
    Api::<QuotaGroup>::all(master.clone())
        .delete(GROUP, &kube::api::DeleteParams::default())
        .await?;
    w.demand("seed-a", "project-demo", Some(9)).await?;
    wait_for(DEADLINE, "demo free of the group", || async {
        for (_, quota) in PROJECTS {
            let copies = w.record(quota).await?.groups;
            ensure!(copies.is_empty(), "{quota} still holds {copies:?}");
        }
        let granted = w.ledger_granted("seed-a", "project-demo").await?;
        ensure!(
            granted >= demo_granted.checked_add(Quantity::from_units(9))?,
            "seed-a holds {granted:?} of demo (granted before: {demo_granted:?})"
        );
        let text = w.controller.scrape().await?;
        ensure!(!text.contains("kkp_quota_group_"), "the group's series stay");
        Ok(())
    })
    .await
    .context("the group deleted")?;
    ensure!(!w.controller.is_finished(), "the controller stopped");
    Ok(())
}
