//! The policy `reservedCounts` on the real fleet (issue #38 step 4): with it on, an autoscaled
//! `MachineDeployment` is admitted only if its max size fits, its room then counts as usage, the
//! autoscaler's Machines are admitted from that room one after another at a full quota while a
//! Machine of no deployment is refused, and lowering the max frees the room.

use std::time::Duration;

use e2e::wait_for;
use kkp_quota_crds::machine::{Machine, MachineDeployment, MachineSet, MachineSetSpec};
use kkp_quota_crds::reserved::MAX_SIZE_ANNOTATION;
use kkp_quota_crds::{ProjectQuota, Quantity, QuotaLedger, Resource};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::{Api, Resource as _, ResourceExt as _};

const WAIT: Duration = Duration::from_mins(1);

fn cpus(n: i64) -> Quantity {
    Quantity::from_units(n)
}

/// The example's deployment (t3.medium, 2 cpu each) named `name`, with max size `max` and no
/// replicas yet.
fn deployment(name: &str, max: u32) -> MachineDeployment {
    let path = format!(
        "{}/../deploy/examples/machinedeployment-autoscaled.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut d: MachineDeployment =
        serde_saphyr::from_str(&std::fs::read_to_string(path).expect("example")).expect("example");
    d.metadata.name = Some(name.to_owned());
    d.metadata
        .annotations
        .get_or_insert_default()
        .insert(MAX_SIZE_ANNOTATION.to_owned(), max.to_string());
    d.spec.replicas = Some(0);
    d
}

/// A t3.medium Machine named `name`, controlled by `set` (none: a Machine of no deployment).
fn machine(name: &str, set: Option<&MachineSet>) -> Machine {
    let path = format!(
        "{}/../deploy/examples/machine-small.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut m: Machine =
        serde_saphyr::from_str(&std::fs::read_to_string(path).expect("example")).expect("example");
    m.metadata.name = Some(name.to_owned());
    m.metadata.owner_references = set.and_then(|s| s.controller_owner_ref(&()).map(|o| vec![o]));
    m
}

#[allow(
    clippy::unwrap_used,
    clippy::too_many_lines,
    reason = "a test helper: a panic is the failure report"
)]
pub async fn the_autoscalers_room_is_held_under_reserved_counts(
    alpha: kube::Client,
    master: kube::Client,
    seed_a: kube::Client,
) {
    let quotas = Api::<ProjectQuota>::all(master);
    let ledgers = Api::<QuotaLedger>::all(seed_a);
    let machines = Api::<Machine>::namespaced(alpha.clone(), "kube-system");
    let deployments = Api::<MachineDeployment>::namespaced(alpha.clone(), "kube-system");
    let sets = Api::<MachineSet>::namespaced(alpha, "kube-system");
    let background = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..DeleteParams::default()
    };

    // Room to work in: nothing of the earlier steps left in alpha.
    for d in deployments.list(&ListParams::default()).await.unwrap() {
        deployments.delete(&d.name_any(), &background).await.unwrap();
    }
    machines
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap();
    let local_cpu = |ledger: QuotaLedger| ledger.status?.local_usage.map(|u| u.amount(Resource::Cpu));
    wait_for(WAIT, "seed-a's usage back to nothing", || async {
        (local_cpu(ledgers.get("project-demo").await.ok()?)? == Quantity::ZERO).then_some(())
    })
    .await
    .unwrap();

    quotas
        .patch(
            "project-demo",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"reservedCounts": true}})),
        )
        .await
        .unwrap();
    wait_for(WAIT, "the policy on seed-a's ledger", || async {
        ledgers
            .get("project-demo")
            .await
            .ok()?
            .spec
            .reserved_counts
            .then_some(())
    })
    .await
    .unwrap();
    // What is free, in t3.medium Machines of 2 cpu, once the master has folded seed-a's nothing.
    let free = wait_for(WAIT, "the project's free cpu", || async {
        let status = quotas.get("project-demo").await.ok()?.status?;
        let seed_a = status.seeds.iter().find(|s| s.name == "seed-a")?;
        (seed_a.usage.as_ref()?.amount(Resource::Cpu) == Quantity::ZERO).then_some(())?;
        status.free.map(|f| f.amount(Resource::Cpu))
    })
    .await
    .unwrap();
    let fit = (1..=32).take_while(|n| cpus(2 * n) <= free).last().unwrap_or(0);
    assert!(
        fit >= 3,
        "the demo project should have room for 3 t3.medium, has {free} cpu free"
    );
    let fit_u32 = u32::try_from(fit).unwrap();

    // A deployment whose max does not fit is refused, saying what to do.
    let refused = deployments
        .create(&PostParams::default(), &deployment("workers-held", fit_u32 + 1))
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("cannot grow to its max size"), "{refused}");
    assert!(refused.contains("lower its max size"), "{refused}");
    // One whose max fits is admitted, and its room counts once seed-controller counts it.
    let held = deployments
        .create(&PostParams::default(), &deployment("workers-held", fit_u32))
        .await
        .unwrap();
    let uid = held.uid().unwrap();
    wait_for(WAIT, "the deployment counted in seed-a's ledger", || async {
        let status = ledgers.get("project-demo").await.ok()?.status?;
        status
            .autoscaled
            .iter()
            .any(|a| a.uid == uid && a.max == fit_u32)
            .then_some(())
    })
    .await
    .unwrap();
    let other = machines
        .create(&PostParams::default(), &machine("loose-1", None))
        .await
        .unwrap_err()
        .to_string();
    assert!(other.contains("needs 2 cpu"), "the room is held: {other}");

    // The autoscaler's way: its MachineSet's Machines one after another, all from the room.
    let mut set = MachineSet::new("workers-held-7c9d", MachineSetSpec {});
    set.metadata.owner_references = held.controller_owner_ref(&()).map(|o| vec![o]);
    let set = sets.create(&PostParams::default(), &set).await.unwrap();
    for k in 1..fit {
        machines
            .create(
                &PostParams::default(),
                &machine(&format!("workers-held-{k}"), Some(&set)),
            )
            .await
            .unwrap_or_else(|e| panic!("Machine {k} of {} from the room: {e}", fit - 1));
    }
    let still = machines
        .create(&PostParams::default(), &machine("loose-2", None))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        still.contains("needs 2 cpu"),
        "one Machine's room is left, held: {still}"
    );

    // Lowering max to the Machines it has frees the room left.
    deployments
        .patch(
            "workers-held",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {MAX_SIZE_ANNOTATION: (fit - 1).to_string()}}})),
        )
        .await
        .unwrap();
    wait_for(
        WAIT,
        "a Machine of no deployment admitted once max is lowered",
        || async {
            machines
                .create(&PostParams::default(), &machine("loose-3", None))
                .await
                .ok()
                .map(|_| ())
        },
    )
    .await
    .unwrap();
    let beyond = machines
        .create(&PostParams::default(), &machine("workers-held-extra", Some(&set)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        beyond.contains("needs 2 cpu"),
        "past its max and the quota: {beyond}"
    );

    deployments.delete("workers-held", &background).await.unwrap();
    quotas
        .patch(
            "project-demo",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"reservedCounts": null}})),
        )
        .await
        .unwrap();
}
