//! The demo's quota group (`make demo`): `demo-co` in allocation mode over projects `demo`
//! (16 cpu) and `other` (8 cpu), 32 cpu in all. Enforced by master-controller's webhook, running
//! as the demo runs it: its status shows what is allocated, a raise of `other` past the
//! allocation is refused with the group's numbers, and one within it passes.

use std::time::Duration;

use e2e::wait_for;
use kkp_quota_crds::{Quantity, QuotaGroup, Resource, ResourceQuota};
use kube::Api;
use kube::api::{Patch, PatchParams};

const WAIT: Duration = Duration::from_mins(1);

#[allow(clippy::unwrap_used, reason = "a test helper: a panic is the failure report")]
pub async fn the_demo_group_caps_its_allocation(master: kube::Client) {
    let groups = Api::<QuotaGroup>::all(master.clone());
    wait_for(WAIT, "demo-co enforced, 24 cpu allocated", || async {
        let status = groups.get(e2e::demo::DEMO_GROUP).await.ok()?.status?;
        let enforced = status
            .conditions
            .iter()
            .any(|c| c.type_ == "Enforced" && c.status == "True");
        let allocated = status.allocated?.get(Resource::Cpu)?;
        (enforced && allocated == Quantity::from_units(24)).then_some(())
    })
    .await
    .unwrap();
    let quotas = Api::<ResourceQuota>::all(master);
    let set_cpu = |cpu: &str| {
        let patch = serde_json::json!({"spec": {"quota": {"cpu": cpu}}});
        let quotas = quotas.clone();
        async move {
            quotas
                .patch("project-other", &PatchParams::default(), &Patch::Merge(&patch))
                .await
        }
    };
    let refused = set_cpu("17").await.expect_err("other raised past the allocation");
    assert!(
        refused.to_string().contains(
            "quota group demo-co allocates at most 32 cpu to its projects; with this edit they would be allocated 33 cpu (demo 16, other 17)"
        ),
        "{refused}"
    );
    set_cpu("16").await.expect("other raised to the allocation");
    set_cpu("8").await.expect("other lowered");
}
