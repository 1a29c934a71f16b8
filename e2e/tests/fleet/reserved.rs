//! Capacity reserved for cluster autoscalers, shown (issue #38 step 3): a `MachineDeployment`
//! with the autoscaler's size annotations reserves `(max - replicas)` of its Machines; the
//! reservation reaches the seed's ledger, the master's `ProjectQuota` (overall and per seed) and
//! the user cluster's `QuotaView`, and follows replicas, the maximum and the deployment's delete.
//! It is shown apart from the usage, never counted in it.

use std::time::Duration;

use e2e::wait_for;
use kkp_quota_crds::machine::MachineDeployment;
use kkp_quota_crds::reserved::MAX_SIZE_ANNOTATION;
use kkp_quota_crds::{ProjectQuota, Quantity, QuotaView, Resource};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};

const WAIT: Duration = Duration::from_mins(1);

/// The project's reserved cpu as the master shows it (overall, and seed-a's), the user cluster's
/// view shows it, and its committed cpu.
async fn figures(
    quotas: &Api<ProjectQuota>,
    views: &Api<QuotaView>,
) -> Option<(Quantity, Quantity, Quantity, Quantity)> {
    let status = quotas.get("project-demo").await.ok()?.status?;
    let overall = status.reserved?.amount(Resource::Cpu);
    let seed_a = status
        .seeds
        .iter()
        .find(|s| s.name == "seed-a")?
        .reserved
        .as_ref()?
        .amount(Resource::Cpu);
    let committed = status.global_usage?.amount(Resource::Cpu);
    let view = views.get("project-demo").await.ok()?.status?;
    Some((
        overall,
        seed_a,
        view.autoscaler_reserved.amount(Resource::Cpu),
        committed,
    ))
}

#[allow(clippy::unwrap_used, reason = "a test helper: a panic is the failure report")]
pub async fn autoscaler_room_is_shown_reserved(alpha: kube::Client, master: kube::Client) {
    let quotas = Api::<ProjectQuota>::all(master);
    let views = Api::<QuotaView>::all(alpha.clone());
    let deployments = Api::<MachineDeployment>::namespaced(alpha, "kube-system");
    let committed = figures(&quotas, &views).await.map(|f| f.3);
    let expect = |cpus: i64, what: &'static str| {
        let (quotas, views) = (quotas.clone(), views.clone());
        async move {
            let want = Quantity::from_units(cpus);
            let seen = wait_for(WAIT, what, || {
                let (quotas, views) = (quotas.clone(), views.clone());
                async move {
                    figures(&quotas, &views)
                        .await
                        .filter(|(overall, seed_a, view, _)| [*overall, *seed_a, *view] == [want; 3])
                }
            })
            .await;
            match seen {
                Ok(seen) => seen.3,
                Err(e) => {
                    let last = figures(&quotas, &views).await;
                    panic!("{e}; now (overall, seed-a, view, committed): {last:?}")
                }
            }
        }
    };

    let path = format!(
        "{}/../deploy/examples/machinedeployment-autoscaled.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let example: MachineDeployment = serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    deployments
        .create(&PostParams::default(), &example)
        .await
        .unwrap();
    // Max 6, 2 replicas, t3.medium (2 cpu): 4 more may come, 8 cpu.
    let shown = expect(8, "8 cpu reserved (max 6, 2 replicas of 2 cpu)").await;
    if let Some(before) = committed {
        assert_eq!(shown, before, "reserved capacity is not counted as usage");
    }

    let edit = |value: serde_json::Value| {
        let deployments = deployments.clone();
        async move {
            deployments
                .patch(
                    "workers-autoscaled",
                    &PatchParams::default(),
                    &Patch::Merge(value),
                )
                .await
                .unwrap();
        }
    };
    edit(serde_json::json!({"spec": {"replicas": 5}})).await;
    expect(2, "2 cpu reserved once the autoscaler grew it to 5").await;
    edit(serde_json::json!({"metadata": {"annotations": {MAX_SIZE_ANNOTATION: "5"}}})).await;
    expect(0, "nothing reserved once max is lowered to its replicas").await;
    edit(serde_json::json!({"metadata": {"annotations": {MAX_SIZE_ANNOTATION: "9"}}})).await;
    expect(8, "8 cpu reserved again with max 9").await;
    deployments
        .delete("workers-autoscaled", &DeleteParams::default())
        .await
        .unwrap();
    expect(0, "nothing reserved once the deployment is gone").await;
}
