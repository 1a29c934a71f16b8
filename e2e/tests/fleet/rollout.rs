//! A rollout at full quota on the demo project: the surge Machine is refused while the project
//! has no rollout allowance (the denial says why and both ways out), and with the allowance on
//! while the demo's shared group bounds the project (a group's limit admits no surge); once the
//! group is deleted (it stays deleted for the scenarios after this one), the surge is admitted
//! once over the limit, recorded apart in the seed's ledger, and the record is gone once the
//! Machine it replaces is.

use std::time::Duration;

use e2e::demo::DEMO_SHARED_GROUP;
use e2e::wait_for;
use kkp_quota_crds::machine::{Machine, MachineDeployment, MachineSet, MachineSetSpec};
use kkp_quota_crds::rollout::RolloutSurge;
use kkp_quota_crds::{ProjectQuota, QuotaGroup, QuotaLedger, ResourceQuota};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Resource as _};
use serde_json::json;

/// `status.rolloutSurges` of the demo project's ledger on every seed, together.
async fn surges(seeds: &[kube::Client]) -> Option<Vec<RolloutSurge>> {
    let mut all = Vec::new();
    for seed in seeds {
        let ledger = Api::<QuotaLedger>::all(seed.clone())
            .get("project-demo")
            .await
            .ok()?;
        all.extend(ledger.status.map(|s| s.rollout_surges).unwrap_or_default());
    }
    Some(all)
}

/// From 14 of 16 cpu in use (what the scenario before leaves): a one-replica
/// `MachineDeployment` of 2-cpu Machines fills the quota, then rolls out.
#[allow(clippy::unwrap_used, reason = "a test helper: a panic is the failure report")]
pub async fn a_rollout_at_full_quota(
    alpha: kube::Client,
    master_client: kube::Client,
    seeds: [kube::Client; 2],
    master: Api<ResourceQuota>,
) {
    let machines = Api::<Machine>::namespaced(alpha.clone(), "kube-system");
    let deployments = Api::<MachineDeployment>::namespaced(alpha.clone(), "kube-system");
    let sets = Api::<MachineSet>::namespaced(alpha, "kube-system");
    let deployment: MachineDeployment = serde_json::from_value(json!({
        "apiVersion": "cluster.k8s.io/v1alpha1", "kind": "MachineDeployment",
        "metadata": {"name": "web"},
        "spec": {"replicas": 1, "strategy": {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}},
    }))
    .unwrap();
    let deployment = deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let new_set = |name: &str| {
        let mut set = MachineSet::new(name, MachineSetSpec {});
        set.metadata.owner_references = deployment.controller_owner_ref(&()).map(|o| vec![o]);
        set
    };
    let old = sets
        .create(&PostParams::default(), &new_set("web-1"))
        .await
        .unwrap();
    let new = sets
        .create(&PostParams::default(), &new_set("web-2"))
        .await
        .unwrap();
    let machine_of = |set: &MachineSet, name: &str| {
        let mut machine = super::example("machine-small.yaml");
        machine.metadata.name = Some(name.to_owned());
        machine.metadata.owner_references = set.controller_owner_ref(&()).map(|o| vec![o]);
        machine
    };
    machines
        .create(&PostParams::default(), &machine_of(&old, "web-1-a"))
        .await
        .unwrap();

    // Without the allowance: refused, saying that it is a rollout's surge and both ways out.
    let refused = machines
        .create(&PostParams::default(), &machine_of(&new, "web-2-a"))
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("needs 2 cpu"), "{refused}");
    assert!(refused.contains("uses 16 of 16 cpu"), "{refused}");
    assert!(refused.contains("maxSurge: 0 and maxUnavailable: 1"), "{refused}");
    assert!(!refused.contains("rollout allowance"), "{refused}");

    // The admin allows rollouts; it reaches both seeds' ledgers.
    allow_rollouts(master_client.clone(), &seeds).await;

    no_surge_under_the_shared_group(&machines, machine_of(&new, "web-2-a"), master_client, &seeds).await;

    // Now the surge is admitted, over the limit by its own size, and recorded apart.
    machines
        .create(&PostParams::default(), &machine_of(&new, "web-2-a"))
        .await
        .unwrap();
    let recorded = surges(&seeds).await.unwrap();
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!(recorded[0].machine, "kube-system/web-2-a");
    assert_eq!(recorded[0].replaces_machine, "kube-system/web-1-a");
    assert_eq!(recorded[0].deployment, "kube-system/web");
    assert_eq!(
        recorded[0].size.amount(kkp_quota_crds::Resource::Cpu).to_string(),
        "2"
    );
    // Only once: a second surge beside it is refused, saying why.
    let second = machines
        .create(&PostParams::default(), &machine_of(&new, "web-2-b"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        second.contains("the project's rollout allowance does not apply"),
        "{second}"
    );
    global_cpu(&master, "18").await;

    // The rollout ends: the replaced Machine goes, and with it the surge's record.
    machines
        .delete("web-1-a", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(Duration::from_mins(1), "the surge record gone", || async {
        surges(&seeds).await?.is_empty().then_some(())
    })
    .await
    .unwrap();
    global_cpu(&master, "16").await;
}

/// Under the demo's shared group, which limits cpu, the allowance does not apply (the group's
/// limit is its admins', who never opted in): `surge` is refused, naming the group. Then the
/// group is deleted, and this returns once no seed's ledger carries it.
#[allow(clippy::unwrap_used, reason = "a test helper: a panic is the failure report")]
async fn no_surge_under_the_shared_group(
    machines: &Api<Machine>,
    surge: Machine,
    master_client: kube::Client,
    seeds: &[kube::Client],
) {
    let carried = |want: bool| {
        let seeds = seeds.to_vec();
        async move {
            for seed in &seeds {
                let ledger = Api::<QuotaLedger>::all(seed.clone())
                    .get("project-demo")
                    .await
                    .ok()?;
                let groups = ledger.spec.shares.map(|s| s.groups).unwrap_or_default();
                let has = groups.iter().any(|g| g.name == DEMO_SHARED_GROUP);
                (has == want).then_some(())?;
            }
            Some(())
        }
    };
    wait_for(Duration::from_mins(1), "the shared group on both seeds", || {
        carried(true)
    })
    .await
    .unwrap();
    let grouped = machines
        .create(&PostParams::default(), &surge)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        grouped.contains(&format!(
            "the project's rollout allowance does not apply: the project is in quota group {DEMO_SHARED_GROUP}, which admits no Machine over its limit"
        )),
        "{grouped}"
    );
    // The group goes; once no seed's ledger carries it, the allowance applies again.
    Api::<QuotaGroup>::all(master_client)
        .delete(DEMO_SHARED_GROUP, &DeleteParams::default())
        .await
        .unwrap();
    wait_for(Duration::from_mins(1), "the shared group off both seeds", || {
        carried(false)
    })
    .await
    .unwrap();
}

/// Turns the demo project's rollout allowance on, and waits until both seeds' ledgers carry it.
#[allow(clippy::unwrap_used, reason = "a test helper: a panic is the failure report")]
async fn allow_rollouts(master_client: kube::Client, seeds: &[kube::Client]) {
    Api::<ProjectQuota>::all(master_client)
        .patch(
            "project-demo",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"rolloutAllowance": {"overdueAfterSeconds": 600}}})),
        )
        .await
        .unwrap();
    wait_for(Duration::from_mins(1), "the allowance on both seeds", || async {
        for seed in seeds {
            let ledger = Api::<QuotaLedger>::all(seed.clone())
                .get("project-demo")
                .await
                .ok()?;
            ledger.spec.rollout_allowance?;
        }
        Some(())
    })
    .await
    .unwrap();
}

/// Waits for the master's `globalUsage` of the demo project to reach `cpu`.
#[allow(clippy::unwrap_used, reason = "a test helper: a panic is the failure report")]
async fn global_cpu(master: &Api<ResourceQuota>, cpu: &str) {
    wait_for(
        Duration::from_mins(1),
        &format!("{cpu} cpu in globalUsage"),
        || async {
            let usage = master.get("project-demo").await.ok()?.status?.global_usage?;
            (usage.cpu == Some(cpu.parse().unwrap())).then_some(())
        },
    )
    .await
    .unwrap();
}
