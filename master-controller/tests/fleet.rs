//! master-controller against a real fleet (master + seed-a + seed-b, real kube-apiservers).
//!
//! One fleet and one controller serve every scenario, in order: fan-out create/edit, the fold,
//! quota lowered below usage, orphan copies, default quotas, a seed going down and coming back
//! (with a deletion held by the down seed), and deletion.

#![allow(clippy::too_many_lines)] // scenarios read top to bottom

mod common;

use std::collections::BTreeMap;

use anyhow::{Context as _, Result, ensure};
use common::*;
use e2e::{Fleet, FleetSpec, wait_for};
use k8s_openapi::api::core::v1::Secret;
use kkp_quota_crds::kkp::{
    DefaultProjectResourceQuota, KubermaticSetting, KubermaticSettingSpec, Project, Seed,
};
use kkp_quota_crds::quota::{
    DEFAULT_QUOTA_LABEL, SEED_CLEANUP_FINALIZER, SUBJECT_KIND_LABEL, SUBJECT_NAME_LABEL,
};
use kkp_quota_crds::{ProjectQuota, Quantity, QuotaLedger, Resource, ResourceQuota};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use master_controller::status::{
    FOREIGN_QUOTA_CONTROLLER, QUOTA_EXCEEDED, SEED_CLEANUP_PENDING, SEEDS_STALE,
};
use serde_json::json;

const SEEDS: [&str; 2] = ["seed-a", "seed-b"];

// Fields drop in order: the controller stops before the fleet does.
struct World {
    controller: Running,
    master: Api<ResourceQuota>,
    pq: Api<ProjectQuota>,
    fleet: Fleet,
}

impl World {
    fn seed(&self, name: &str) -> Client {
        self.fleet.seed(name).client()
    }

    /// The seed's ledgers (the seed side of every quota).
    fn seed_api(&self, name: &str) -> Api<QuotaLedger> {
        Api::all(self.seed(name))
    }

    /// KKP's own quota copies on the seed.
    fn kkp_seed_api(&self, name: &str) -> Api<ResourceQuota> {
        Api::all(self.seed(name))
    }

    async fn pq_of(&self, master: &ResourceQuota) -> Result<ProjectQuota> {
        Ok(self.pq.get(&master.name_any()).await?)
    }

    /// Waits until every seed has a ledger of `name` with the master's subject, limits and
    /// labels, and KKP's copy with the master's spec and labels.
    async fn converged(&self, name: &str, what: &str) -> Result<()> {
        wait_for(DEADLINE, what, || async {
            let master = self.master.get(name).await?;
            for seed in SEEDS {
                let ledger = self
                    .seed_api(seed)
                    .get_opt(name)
                    .await?
                    .context(format!("no ledger on {seed}"))?;
                ensure!(
                    ledger.spec.subject.name == master.spec.subject.name,
                    "{seed}: subject differs"
                );
                ensure!(
                    ledger.spec.quota == master.spec.quota.limits.kkp_subset(),
                    "{seed}: limits differ"
                );
                let copy = self
                    .kkp_seed_api(seed)
                    .get_opt(name)
                    .await?
                    .context(format!("no KKP copy on {seed}"))?;
                ensure!(copy.spec == master.spec, "{seed}: KKP spec differs");
                for (k, v) in master.labels() {
                    ensure!(ledger.labels().get(k) == Some(v), "{seed}: label {k} differs");
                    ensure!(copy.labels().get(k) == Some(v), "{seed}: KKP label {k} differs");
                }
            }
            Ok(())
        })
        .await
    }

    async fn gone_everywhere(&self, name: &str, what: &str) -> Result<()> {
        wait_for(DEADLINE, what, || async {
            ensure!(self.master.get_opt(name).await?.is_none(), "still on the master");
            ensure!(self.pq.get_opt(name).await?.is_none(), "ProjectQuota still there");
            for seed in SEEDS {
                ensure!(
                    self.seed_api(seed).get_opt(name).await?.is_none(),
                    "still on {seed}"
                );
                ensure!(
                    self.kkp_seed_api(seed).get_opt(name).await?.is_none(),
                    "KKP copy still on {seed}"
                );
            }
            Ok(())
        })
        .await
    }

    /// Annotates master quota `name` (`touched: value`) and waits until a reconcile has
    /// finished after it.
    async fn touched(&self, name: &str, value: &str) -> Result<()> {
        let reconciles = self.controller.reconciles();
        self.master
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"metadata": {"annotations": {"touched": value}}})),
            )
            .await?;
        wait_for(DEADLINE, "a reconcile after the annotation", || async {
            self.controller.reconciles() > reconciles
        })
        .await
    }

    /// Waits until the master's globalUsage, every ledger's otherSeedsUsage (absent: none) and
    /// every KKP copy's globalUsage (absent: none) are the exact fold of `locals` (a ledger carries no
    /// globalUsage: its readers add their own seed's usage to the others').
    async fn folded(&self, name: &str, locals: &BTreeMap<&str, ResourceDetails>, what: &str) -> Result<()> {
        let global = ResourceDetails::checked_sum(locals.values())?;
        wait_for(DEADLINE, what, || async {
            let master = self.master.get(name).await?;
            let g = status_of(&master)
                .global_usage
                .context("master has no globalUsage")?;
            ensure!(same_usage(&g, &global), "master globalUsage {g}, want {global}");
            for seed in SEEDS {
                let copy = self.seed_api(seed).get(name).await?;
                let s = ledger_status_of(&copy);
                ensure!(s.global_usage.is_none(), "{seed}: the ledger has a globalUsage");
                let others =
                    ResourceDetails::checked_sum(locals.iter().filter(|(k, _)| **k != seed).map(|(_, v)| v))?;
                // Absent: none (the master writes none while the others use nothing).
                let o = s.other_seeds_usage.unwrap_or_default();
                ensure!(
                    same_usage(&o, &others),
                    "{seed}: otherSeedsUsage {o}, want {others}"
                );
                // Absent: none used, as KKP reads it (a new copy is not given a zero).
                let kkp = self.kkp_seed_api(seed).get(name).await?;
                let k = status_of(&kkp).global_usage.unwrap_or_default();
                ensure!(
                    same_usage(&k.kkp_subset(), &global.kkp_subset()),
                    "{seed}: KKP copy's globalUsage {k}, want {}",
                    global.kkp_subset()
                );
            }
            Ok(())
        })
        .await
    }
}

use kkp_quota_crds::ResourceDetails;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_controller_on_a_real_fleet() -> Result<()> {
    let fleet = Fleet::start(
        FleetSpec::empty()
            .with_seed("seed-a")
            .with_seed("seed-b")
            .with_project("demo")
            .with_project("other")
            .with_project("third")
            .with_controller_managers(),
    )
    .await?;
    let master = Api::all(fleet.master().client());
    let controller = Running::start(fleet.master().client(), options()).await?;
    let world = World {
        controller,
        master,
        pq: Api::all(fleet.master().client()),
        fleet,
    };
    fan_out_create_and_edit(&world).await.context("fan-out")?;
    fold_two_seeds(&world).await.context("fold")?;
    kkp_copies_written_again(&world)
        .await
        .context("KKP's copies deleted or edited by hand")?;
    lowered_below_usage(&world)
        .await
        .context("quota lowered below usage")?;
    orphan_copies_removed(&world).await.context("orphan copies")?;
    default_quota(&world).await.context("default quota")?;
    project_deleted_takes_its_quota(&world)
        .await
        .context("project deleted")?;
    seed_down_and_back(&world).await.context("stale seed")?;
    seed_set_changes(&world).await.context("seed set changes")?;
    foreign_usage_writer_reported(&world)
        .await
        .context("another writer of KKP's usage")?;
    delete_converges(&world).await.context("deletion")?;
    ensure!(!world.controller.is_finished(), "the controller stopped");
    Ok(())
}

async fn fan_out_create_and_edit(w: &World) -> Result<()> {
    create_quota(&w.master, "project-demo", "demo", cpu_mem(4, 8)).await?;
    w.converged("project-demo", "project-demo copied to every seed")
        .await?;
    // The master object got the subject labels, the finalizer and an owner reference to its project.
    let project = Api::<Project>::all(w.fleet.master().client()).get("demo").await?;
    wait_for(DEADLINE, "master metadata", || async {
        let m = w.master.get("project-demo").await?;
        ensure!(
            m.labels().get(SUBJECT_NAME_LABEL).map(String::as_str) == Some("demo"),
            "no subject-name label"
        );
        ensure!(
            m.labels().get(SUBJECT_KIND_LABEL).map(String::as_str) == Some("project"),
            "no subject-kind label"
        );
        ensure!(
            m.finalizers().iter().any(|f| f == SEED_CLEANUP_FINALIZER),
            "no finalizer"
        );
        ensure!(
            m.owner_references()
                .iter()
                .any(|o| Some(&o.uid) == project.metadata.uid.as_ref() && o.kind == "Project"),
            "no owner reference to the project"
        );
        Ok(())
    })
    .await?;
    let copy = w.seed_api("seed-a").get("project-demo").await?;
    ensure!(
        copy.owner_references().is_empty(),
        "seed copies carry no owner reference"
    );
    ensure!(
        copy.metadata
            .managed_fields
            .iter()
            .flatten()
            .any(|m| m.manager.as_deref() == Some("kkp-quota-master")
                && m.operation.as_deref() == Some("Apply")),
        "the copy is server-side applied by kkp-quota-master"
    );

    // Edit: every seed follows.
    set_quota(&w.master, "project-demo", &cpu_mem(6, 8)).await?;
    w.converged("project-demo", "edited spec on every seed").await?;
    let copy = w.seed_api("seed-b").get("project-demo").await?;
    ensure!(
        copy.spec.quota.amount(Resource::Cpu) == Quantity::from_units(6),
        "seed-b has the edited spec"
    );

    // No write when nothing changed: an annotation on the master triggers a reconcile that
    // leaves the seed copy's resourceVersion as it was.
    let before = w.seed_api("seed-a").get("project-demo").await?.resource_version();
    w.touched("project-demo", "1").await?;
    let after = w.seed_api("seed-a").get("project-demo").await?.resource_version();
    ensure!(
        before == after,
        "a no-op edit rewrote the seed copy ({before:?} -> {after:?})"
    );
    Ok(())
}

async fn fold_two_seeds(w: &World) -> Result<()> {
    // Nothing used anywhere: the master says so, and KKP's copies on the seeds are left without
    // a `globalUsage`, which KKP reads as nothing used (no write per copy at a cold start).
    let none = ResourceDetails::default();
    set_local_usage(&w.seed("seed-a"), "project-demo", &none).await?;
    set_local_usage(&w.seed("seed-b"), "project-demo", &none).await?;
    w.folded(
        "project-demo",
        &BTreeMap::from([("seed-a", none.clone()), ("seed-b", none)]),
        "nothing used, everywhere",
    )
    .await?;
    // A reconcile begun after the fold's has finished that one's writes (one at a time per quota).
    w.touched("project-demo", "2").await?;
    for seed in SEEDS {
        let kkp = w.kkp_seed_api(seed).get("project-demo").await?;
        ensure!(
            status_of(&kkp).global_usage.is_none(),
            "{seed}: a zero globalUsage was written onto KKP's new copy"
        );
    }

    let a = ResourceDetails {
        cpu: Some(Quantity::from_millis(1500)),
        memory: Some(Quantity::from_mebibytes(2560)),
        ..ResourceDetails::default()
    };
    let b = ResourceDetails {
        cpu: Some(Quantity::from_units(2)),
        memory: Some(Quantity::from_gibibytes(1)),
        storage: Some(Quantity::from_gibibytes(50)),
        ..ResourceDetails::default()
    };
    set_local_usage(&w.seed("seed-a"), "project-demo", &a).await?;
    set_local_usage(&w.seed("seed-b"), "project-demo", &b).await?;
    let locals = BTreeMap::from([("seed-a", a), ("seed-b", b)]);
    w.folded(
        "project-demo",
        &locals,
        "globalUsage = seed-a + seed-b everywhere",
    )
    .await?;
    let global = status_of(&w.master.get("project-demo").await?)
        .global_usage
        .context("no globalUsage")?;
    ensure!(
        global.amount(Resource::Cpu) == Quantity::from_millis(3500),
        "exact cpu sum, got {global}"
    );
    ensure!(
        global.amount(Resource::Memory) == Quantity::from_mebibytes(3584),
        "exact memory sum, got {global}"
    );
    ensure!(
        global.amount(Resource::Storage) == Quantity::from_gibibytes(50),
        "exact storage sum, got {global}"
    );
    // Metrics carry the global and per-seed usage and the limit.
    let text = wait_for(DEADLINE, "usage metrics", || async {
        let text = w.controller.scrape().await?;
        ensure!(
            sample(
                &text,
                "kkp_quota_usage{project=\"demo\",resource=\"cpu\",scope=\"global\"}"
            ) == Some(3.5),
            "global cpu usage metric"
        );
        Ok(text)
    })
    .await?;
    ensure!(
        sample(
            &text,
            "kkp_quota_usage{project=\"demo\",resource=\"cpu\",scope=\"seed-a\"}"
        ) == Some(1.5)
    );
    ensure!(sample(&text, "kkp_quota_limit{project=\"demo\",resource=\"cpu\"}") == Some(6.0));
    ensure!(sample(&text, "kkp_quota_over_limit{project=\"demo\",resource=\"cpu\"}") == Some(0.0));

    // A ledger as an older master left it, with a globalUsage beside otherSeedsUsage: its
    // stale figure goes at the next fold, though the other seeds' usage did not change.
    w.seed_api("seed-b")
        .patch_status(
            "project-demo",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"globalUsage": {"cpu": "99"}}})),
        )
        .await?;
    w.folded(
        "project-demo",
        &locals,
        "an older master's globalUsage removed from seed-b's ledger",
    )
    .await?;
    Ok(())
}

/// KKP's copy of a quota on a seed, deleted or edited by hand, is written again (its spec and its
/// `globalUsage`) without a change on the master: the master watches the copies' metadata.
async fn kkp_copies_written_again(w: &World) -> Result<()> {
    let mut locals = BTreeMap::new();
    for seed in SEEDS {
        let ledger = w.seed_api(seed).get("project-demo").await?;
        locals.insert(seed, ledger_status_of(&ledger).local_usage.unwrap_or_default());
    }
    let deleted = w.kkp_seed_api("seed-a").get("project-demo").await?;
    w.kkp_seed_api("seed-a")
        .delete("project-demo", &DeleteParams::default())
        .await?;
    wait_for(DEADLINE, "KKP's copy on seed-a written again", || async {
        let copy = w.kkp_seed_api("seed-a").get("project-demo").await?;
        ensure!(copy.uid() != deleted.uid(), "still the deleted copy");
        Ok(())
    })
    .await?;
    w.converged("project-demo", "the re-created copy has the master's spec")
        .await?;
    w.folded(
        "project-demo",
        &locals,
        "the re-created copy has the global usage",
    )
    .await?;

    // Its spec edited, then (which moves no generation) a label the webhook's fail-closed check
    // knows the quota by: both come back.
    let edits = [
        (json!({"spec": {"quota": {"cpu": "99"}}}), "its spec"),
        (
            json!({"metadata": {"labels": {SUBJECT_NAME_LABEL: "someone-else"}}}),
            "its labels",
        ),
    ];
    for (edit, what) in edits {
        w.kkp_seed_api("seed-b")
            .patch("project-demo", &PatchParams::default(), &Patch::Merge(&edit))
            .await?;
        w.converged(
            "project-demo",
            &format!("seed-b's copy edited by hand has {what} again"),
        )
        .await?;
    }
    Ok(())
}

async fn lowered_below_usage(w: &World) -> Result<()> {
    // Usage is 3.5 cpu; a limit of 2 is accepted, and status + metric say it is exceeded.
    set_quota(&w.master, "project-demo", &cpu_mem(2, 8)).await?;
    wait_for(DEADLINE, "QuotaExceeded=True", || async {
        let m = w.master.get("project-demo").await?;
        let c = condition(&w.pq_of(&m).await?, QUOTA_EXCEEDED).context("no QuotaExceeded condition")?;
        ensure!(c.status == "True", "QuotaExceeded is {}", c.status);
        ensure!(
            c.message.contains("3500m cpu used of 2 cpu"),
            "message: {}",
            c.message
        );
        let text = w.controller.scrape().await?;
        ensure!(
            sample(&text, "kkp_quota_over_limit{project=\"demo\",resource=\"cpu\"}") == Some(1.0),
            "over-limit metric"
        );
        Ok(())
    })
    .await?;
    w.converged("project-demo", "lowered quota on every seed").await?;
    set_quota(&w.master, "project-demo", &cpu_mem(6, 8)).await?;
    wait_for(DEADLINE, "QuotaExceeded=False", || async {
        let m = w.master.get("project-demo").await?;
        ensure!(
            condition(&w.pq_of(&m).await?, QUOTA_EXCEEDED).is_some_and(|c| c.status == "False"),
            "still True"
        );
        Ok(())
    })
    .await?;
    Ok(())
}

async fn orphan_copies_removed(w: &World) -> Result<()> {
    let stray = w.seed_api("seed-a");
    let stray_kkp = w.kkp_seed_api("seed-a");
    create_quota(&stray_kkp, "stray", "other", cpu_mem(1, 1)).await?;
    let ledger: QuotaLedger = serde_json::from_value(json!({
        "apiVersion": "kkp-quota.dev/v1alpha1",
        "kind": "QuotaLedger",
        "metadata": {"name": "stray"},
        "spec": {"subject": {"name": "other", "kind": "project"}, "quota": {"cpu": "1"}},
    }))?;
    stray.create(&PostParams::default(), &ledger).await?;
    wait_for(
        DEADLINE,
        "orphan ledger and KKP copy deleted from seed-a",
        || async {
            ensure!(stray.get_opt("stray").await?.is_none(), "ledger still there");
            ensure!(
                stray_kkp.get_opt("stray").await?.is_none(),
                "KKP copy still there"
            );
            Ok(())
        },
    )
    .await?;
    Ok(())
}

async fn default_quota(w: &World) -> Result<()> {
    let settings: Api<KubermaticSetting> = Api::all(w.fleet.master().client());
    let global = KubermaticSetting::new(
        "globalsettings",
        KubermaticSettingSpec {
            default_quota: Some(DefaultProjectResourceQuota {
                quota: kkp_quota_crds::KkpQuota::new(&cpu_mem(10, 20)),
            }),
        },
    );
    settings.create(&PostParams::default(), &global).await?;
    let demo_before = w.master.get("project-demo").await?;

    // Created for the projects without a quota, labelled as default, and fanned out.
    for project in ["other", "third"] {
        let name = format!("project-{project}");
        wait_for(DEADLINE, &format!("default quota {name}"), || async {
            let q = w.master.get_opt(&name).await?.context("missing")?;
            ensure!(
                q.labels().get(DEFAULT_QUOTA_LABEL).map(String::as_str) == Some("true"),
                "not labelled default"
            );
            ensure!(q.spec.subject.name == project, "wrong subject");
            ensure!(
                q.spec.quota.limits.amount(Resource::Cpu) == Quantity::from_units(10),
                "wrong cpu"
            );
            Ok(())
        })
        .await?;
        w.converged(&name, "default quota on every seed").await?;
    }

    // Changing the default updates the default quotas only.
    settings
        .patch(
            "globalsettings",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"defaultQuota": {"quota": {"cpu": "12", "memory": "20Gi"}}}})),
        )
        .await?;
    for name in ["project-other", "project-third"] {
        wait_for(DEADLINE, &format!("{name} updated"), || async {
            let q = w.master.get(name).await?;
            ensure!(
                q.spec.quota.limits.amount(Resource::Cpu) == Quantity::from_units(12),
                "not updated"
            );
            Ok(())
        })
        .await?;
        w.converged(name, "updated default on every seed").await?;
    }

    // Replace the default for "third" by a custom one: drop the label and edit the spec.
    w.master
        .patch(
            "project-third",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {DEFAULT_QUOTA_LABEL: null}}, "spec": {"quota": {"cpu": "3"}}})),
        )
        .await?;
    settings
        .patch(
            "globalsettings",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"defaultQuota": {"quota": {"cpu": "14"}}}})),
        )
        .await?;
    wait_for(DEADLINE, "project-other follows the default (14 cpu)", || async {
        let q = w.master.get("project-other").await?;
        ensure!(
            q.spec.quota.limits.amount(Resource::Cpu) == Quantity::from_units(14),
            "not updated"
        );
        Ok(())
    })
    .await?;
    let third = w.master.get("project-third").await?;
    ensure!(
        third.spec.quota.limits.amount(Resource::Cpu) == Quantity::from_units(3),
        "the now-custom quota was overwritten: {third:?}"
    );
    ensure!(
        !third.labels().contains_key(DEFAULT_QUOTA_LABEL),
        "the default label came back"
    );

    // Clearing the default deletes the default quotas only.
    settings
        .patch(
            "globalsettings",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"defaultQuota": null}})),
        )
        .await?;
    w.gone_everywhere("project-other", "default quota deleted everywhere")
        .await?;
    let third = w.master.get("project-third").await?;
    ensure!(
        third.spec.quota.limits.amount(Resource::Cpu) == Quantity::from_units(3),
        "custom quota untouched"
    );
    let demo = w.master.get("project-demo").await?;
    ensure!(
        demo.spec == demo_before.spec && demo.labels() == demo_before.labels(),
        "custom quota project-demo was touched"
    );
    ensure!(!demo.labels().contains_key(DEFAULT_QUOTA_LABEL));
    Ok(())
}

async fn seed_down_and_back(w: &World) -> Result<()> {
    let a1 = cpu_mem(1, 1);
    let b = cpu_mem(2, 2);
    set_local_usage(&w.seed("seed-a"), "project-demo", &a1).await?;
    set_local_usage(&w.seed("seed-b"), "project-demo", &b).await?;
    w.folded(
        "project-demo",
        &BTreeMap::from([("seed-a", a1), ("seed-b", b.clone())]),
        "before the outage",
    )
    .await?;
    w.converged("project-third", "project-third on every seed")
        .await?;

    w.fleet.seed("seed-b").stop_apiserver().await;
    wait_for(
        DEADLINE,
        "SeedsStale=True naming seed-b, and the stale metric",
        || async {
            let m = w.master.get("project-demo").await?;
            let c = condition(&w.pq_of(&m).await?, SEEDS_STALE).context("no SeedsStale condition")?;
            ensure!(c.status == "True", "SeedsStale is {}", c.status);
            ensure!(
                c.message.contains("seed-b unreachable since"),
                "message: {}",
                c.message
            );
            let text = w.controller.scrape().await?;
            ensure!(
                sample(&text, "kkp_quota_seed_stale{seed=\"seed-b\"}") == Some(1.0),
                "stale metric"
            );
            ensure!(
                sample(&text, "kkp_quota_seed_stale{seed=\"seed-a\"}") == Some(0.0),
                "seed-a is not stale"
            );
            Ok(())
        },
    )
    .await?;
    // seed-b's last usage is still counted while seed-a's changes.
    let a2 = cpu_mem(5, 1);
    set_local_usage(&w.seed("seed-a"), "project-demo", &a2).await?;
    wait_for(
        DEADLINE,
        "globalUsage = new seed-a + last known seed-b",
        || async {
            let g = status_of(&w.master.get("project-demo").await?)
                .global_usage
                .context("none")?;
            ensure!(same_usage(&g, &cpu_mem(7, 3)), "globalUsage {g}");
            Ok(())
        },
    )
    .await?;
    // A controller restarted while seed-b is down has no last known usage for it: it says so,
    // and leaves globalUsage as it was rather than writing a sum without seed-b.
    w.controller.restart();
    wait_for(
        DEADLINE,
        "restarted controller: seed-b's usage reported unknown",
        || async {
            let m = w.master.get("project-demo").await?;
            let c = condition(&w.pq_of(&m).await?, SEEDS_STALE).context("no SeedsStale condition")?;
            ensure!(
                c.status == "True" && c.message.contains("usage is not known yet"),
                "message: {}",
                c.message
            );
            Ok(())
        },
    )
    .await?;
    let kept = status_of(&w.master.get("project-demo").await?)
        .global_usage
        .context("none")?;
    ensure!(
        same_usage(&kept, &cpu_mem(7, 3)),
        "globalUsage rewritten without seed-b: {kept}"
    );

    // A deletion is held by the down seed, and says so.
    w.master.delete("project-third", &DeleteParams::default()).await?;
    wait_for(
        DEADLINE,
        "SeedCleanupPending naming seed-b; seed-a's copy gone",
        || async {
            let m = w
                .master
                .get_opt("project-third")
                .await?
                .context("master object gone while seed-b is down")?;
            let c = condition(&w.pq_of(&m).await?, SEED_CLEANUP_PENDING).context("no SeedCleanupPending")?;
            ensure!(c.message.contains("seed-b"), "message: {}", c.message);
            ensure!(
                w.seed_api("seed-a").get_opt("project-third").await?.is_none(),
                "seed-a copy still there"
            );
            Ok(())
        },
    )
    .await?;

    w.fleet.seed("seed-b").start_apiserver().await?;
    wait_for(
        DEADLINE,
        "SeedsStale=False and metric 0 after the restart",
        || async {
            let m = w.master.get("project-demo").await?;
            let c = condition(&w.pq_of(&m).await?, SEEDS_STALE).context("no SeedsStale condition")?;
            ensure!(c.status == "False", "SeedsStale is {}: {}", c.status, c.message);
            let text = w.controller.scrape().await?;
            ensure!(
                sample(&text, "kkp_quota_seed_stale{seed=\"seed-b\"}") == Some(0.0),
                "stale metric"
            );
            Ok(())
        },
    )
    .await?;
    // seed-b catches up on what it missed (seed-a's new usage).
    w.folded(
        "project-demo",
        &BTreeMap::from([("seed-a", a2), ("seed-b", b)]),
        "seed-b caught up",
    )
    .await?;
    w.gone_everywhere("project-third", "held deletion completes once seed-b is back")
        .await?;
    let text = w.controller.scrape().await?;
    ensure!(
        sample(
            &text,
            "kkp_quota_sync_errors_total{operation=\"watch\",seed=\"seed-b\"}"
        )
        .is_some_and(|v| v >= 1.0),
        "sync errors were counted for seed-b"
    );
    Ok(())
}

/// Seeds removed, re-added and with a rotated kubeconfig are followed without a restart.
async fn seed_set_changes(w: &World) -> Result<()> {
    let a = cpu_mem(5, 1);
    let b = cpu_mem(2, 2);
    let seeds: Api<Seed> = Api::namespaced(w.fleet.master().client(), "kubermatic");
    let secrets: Api<Secret> = Api::namespaced(w.fleet.master().client(), "kubermatic");
    let global_is = |want: ResourceDetails, what: &'static str| async move {
        wait_for(DEADLINE, what, || async {
            let g = status_of(&w.master.get("project-demo").await?)
                .global_usage
                .context("none")?;
            ensure!(same_usage(&g, &want), "globalUsage {g}, want {want}");
            Ok(())
        })
        .await
    };

    // Removed from the fleet: its usage no longer counts, its series go.
    let seed_b = seeds.get("seed-b").await?;
    seeds.delete("seed-b", &DeleteParams::default()).await?;
    global_is(a.clone(), "globalUsage without seed-b").await?;
    wait_for(DEADLINE, "seed-b's stale series removed", || async {
        let text = w.controller.scrape().await?;
        ensure!(
            sample(&text, "kkp_quota_seed_stale{seed=\"seed-b\"}").is_none(),
            "still exported"
        );
        Ok(())
    })
    .await?;

    // Back in the fleet.
    let mut again = Seed::new("seed-b", seed_b.spec.clone());
    again.metadata.namespace = Some("kubermatic".into());
    seeds.create(&PostParams::default(), &again).await?;
    global_is(a.checked_add(&b)?, "globalUsage with seed-b again").await?;

    // Kubeconfig rotated to point at seed-a's apiserver: "seed-b" now reads seed-a's copy.
    let secret = e2e::fleet::seed_kubeconfig_secret("seed-b");
    let rotate = |text: String| {
        let secrets = secrets.clone();
        let secret = secret.clone();
        async move {
            secrets
                .patch(
                    &secret,
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"stringData": {"kubeconfig": text}})),
                )
                .await
        }
    };
    rotate(w.fleet.seed("seed-a").kubeconfig_yaml()).await?;
    global_is(
        a.checked_add(&a)?,
        "globalUsage after rotating seed-b's kubeconfig to seed-a",
    )
    .await?;
    rotate(w.fleet.seed("seed-b").kubeconfig_yaml()).await?;
    global_is(a.checked_add(&b)?, "globalUsage after rotating back").await?;
    Ok(())
}

/// KKP Enterprise's own quota controllers write KKP's `status.globalUsage` too. When another
/// field manager has written it, the master says so in the `ProjectQuota` and stops writing
/// there rather than fight over the field.
async fn foreign_usage_writer_reported(w: &World) -> Result<()> {
    let foreign = PatchParams {
        field_manager: Some("kubermatic-master-controller-manager".to_owned()),
        ..PatchParams::default()
    };
    let patch = json!({"status": {"globalUsage": {"cpu": "999"}}});
    w.master
        .patch_status("project-demo", &foreign, &Patch::Merge(&patch))
        .await?;
    wait_for(DEADLINE, "ForeignQuotaController reported", || async {
        let m = w.master.get("project-demo").await?;
        let c = condition(&w.pq_of(&m).await?, FOREIGN_QUOTA_CONTROLLER).context("no condition")?;
        ensure!(c.status == "True", "ForeignQuotaController is {}", c.status);
        ensure!(
            c.message.contains("kubermatic-master-controller-manager"),
            "message: {}",
            c.message
        );
        Ok(())
    })
    .await?;
    let m = w.master.get("project-demo").await?;
    ensure!(
        status_of(&m).global_usage.and_then(|g| g.cpu) == Some(Quantity::from_units(999)),
        "the other writer's figure is left alone"
    );
    Ok(())
}

/// Deleting a Project takes its quota with it, as in KKP: the master's garbage collector follows
/// the quota's owner reference to its Project (kube-controller-manager runs in this fleet;
/// nothing in master-controller deletes a quota whose project is gone: without it this step
/// fails), and the finalizer then takes the seed copies and the `ProjectQuota`.
async fn project_deleted_takes_its_quota(w: &World) -> Result<()> {
    create_quota(&w.master, "project-other", "other", cpu_mem(2, 2)).await?;
    w.converged("project-other", "project-other on every seed")
        .await?;
    wait_for(DEADLINE, "project-other owned by its Project", || async {
        let q = w.master.get("project-other").await?;
        ensure!(
            q.owner_references()
                .iter()
                .any(|o| o.kind == "Project" && o.name == "other"),
            "no owner reference yet"
        );
        Ok(())
    })
    .await?;
    Api::<Project>::all(w.fleet.master().client())
        .delete("other", &DeleteParams::default())
        .await?;
    w.gone_everywhere(
        "project-other",
        "project-other garbage-collected with its Project",
    )
    .await
}

async fn delete_converges(w: &World) -> Result<()> {
    w.master.delete("project-demo", &DeleteParams::default()).await?;
    w.gone_everywhere(
        "project-demo",
        "project-demo deleted from the master and every seed",
    )
    .await?;
    Ok(())
}
