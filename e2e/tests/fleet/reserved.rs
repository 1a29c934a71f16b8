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

/// `kubectl get pquota project-demo -o wide` on the master: each column's header and value (the
/// value cut from the row where its header starts: an empty cell is blank).
fn wide_row(fleet_dir: &std::path::Path) -> Vec<(String, String)> {
    let master = fleet_dir.join("master.kubeconfig");
    let out = e2e::kubectl::run(&master, &["get", "pquota", "project-demo", "-o", "wide"], "")
        .expect("kubectl runs");
    assert!(out.success, "{out:?}");
    let mut lines = out.stdout.lines();
    let (header, row) = (lines.next().unwrap_or_default(), lines.next().unwrap_or_default());
    // A column starts where a header word follows two or more spaces (or the line's start).
    let starts: Vec<usize> = header
        .char_indices()
        .filter(|&(i, c)| c != ' ' && (i == 0 || header[..i].ends_with("  ")))
        .map(|(i, _)| i)
        .collect();
    let cut = |line: &str, from: usize, to: Option<usize>| {
        let end = to.unwrap_or(line.len()).min(line.len());
        line.get(from.min(end)..end).unwrap_or_default().trim().to_owned()
    };
    starts
        .iter()
        .enumerate()
        .map(|(k, &from)| {
            let to = starts.get(k + 1).copied();
            (cut(header, from, to), cut(row, from, to))
        })
        .collect()
}

#[allow(clippy::unwrap_used, reason = "a test helper: a panic is the failure report")]
pub async fn autoscaler_room_is_shown_reserved(
    fleet_dir: &std::path::Path,
    alpha: kube::Client,
    master: kube::Client,
) {
    let quotas = Api::<ProjectQuota>::all(master);
    let views = Api::<QuotaView>::all(alpha.clone());
    let deployments = Api::<MachineDeployment>::namespaced(alpha, "kube-system");
    let committed = wait_for(WAIT, "the project's figures before the deployment", || {
        figures(&quotas, &views)
    })
    .await
    .unwrap()
    .3;
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
    assert_eq!(shown, committed, "reserved capacity is not counted as usage");
    // What an admin reads: used, free (the limit minus the use, reserved not taken off) and
    // reserved, resource by resource.
    let status = quotas.get("project-demo").await.unwrap().status.unwrap();
    let limit = status.limits.unwrap().amount(Resource::Cpu);
    let free = status.free.unwrap().amount(Resource::Cpu);
    assert_eq!(free, limit.saturating_sub_to_zero(shown));
    let wide = wide_row(fleet_dir);
    let cell = |name: &str| {
        wide.iter()
            .find(|(h, _)| h == name)
            .map_or_else(|| panic!("no {name} in {wide:?}"), |(_, v)| v.clone())
    };
    assert_eq!(cell("CPU RESERVED"), "8", "{wide:?}");
    assert_eq!(cell("CPU FREE").parse::<Quantity>().unwrap(), free, "{wide:?}");
    assert_eq!(cell("CPU USED").parse::<Quantity>().unwrap(), shown, "{wide:?}");

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
