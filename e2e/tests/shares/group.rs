//! A shared quota group over `demo` (issue #36, docs/groups.md "Shared mode"), on the shares
//! fleet: the group's 6 cpu below the project's own 10, so the group's budget decides. Bursts over
//! both seeds never let the seeds commit more than 6 together, the whole 6 is usable, and the
//! project has its own 10 again once the group is gone. A group over two projects:
//! `group_pair.rs`.

use kkp_quota_crds::kkp::Project;
use kkp_quota_crds::{ProjectQuota, Quantity, QuotaGroup, Resource};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use tokio::sync::oneshot;

use super::{NAME, WAIT, burst, describe, fill, overrun_watcher_of, restore_limit, settle};
use e2e::system::FleetWithSystem;
use e2e::wait_for;

const GROUP: &str = "acme";
const GROUP_CPU: usize = 6;

pub async fn a_shared_group_caps_the_project_across_seeds(setup: &FleetWithSystem) {
    let fleet = &setup.fleet;
    restore_limit(fleet).await;
    settle(fleet).await;
    let master = fleet.master().client();
    set_label(fleet, "demo", "customer", Some(GROUP)).await;
    create_group(fleet, GROUP, "customer", GROUP, GROUP_CPU).await;
    let groups = Api::<QuotaGroup>::all(master.clone());
    let quotas = Api::<ProjectQuota>::all(master.clone());
    wait_holding(fleet, NAME, GROUP).await;

    let (stop, stopped) = oneshot::channel();
    let limit = Quantity::from_units(i64::try_from(GROUP_CPU).unwrap());
    let watching = overrun_watcher_of(fleet, Resource::Cpu, limit, stopped);
    let spread: Vec<&str> = (0..30).map(|i| ["alpha", "gamma"][i % 2]).collect();
    let admitted = burst(fleet, &spread, "grp").await;
    eprintln!(
        "group of {GROUP_CPU} cpu over demo (10 cpu): a burst of 30 over both seeds admitted {admitted}"
    );
    assert!(
        admitted <= GROUP_CPU,
        "{admitted} admitted\n{}",
        describe(setup).await
    );
    // What the burst left (share still moving when its requests gave up) is usable.
    fill(setup, "gamma", admitted, GROUP_CPU, "grp-fill").await;
    let over = burst(fleet, &["alpha"; 3], "grp-over").await;
    assert_eq!(over, 0, "admitted past the group\n{}", describe(setup).await);
    // The refusal names the group, not the project's own quota (a refusal while the ledger does
    // not carry the group yet waits for share and says so; its demand brings the group).
    let alpha = e2e::machines::api(fleet, "alpha");
    let named = wait_for(WAIT, "a refusal naming the group", || async {
        let machine = e2e::machines::vsphere("grp-named", 1);
        match alpha.create(&PostParams::default(), &machine).await {
            Err(kube::Error::Api(e)) if e.message.contains(&format!("group {GROUP:?} uses 6 of 6 cpu")) => {
                Some(e.message)
            }
            Err(_) => None,
            Ok(_) => panic!("admitted past the group"),
        }
    })
    .await
    .unwrap();
    eprintln!("past the group: {named}");
    assert!(
        named.contains(r#"needs 1 cpu, project "demo" is within its own quota"#),
        "{named}"
    );
    let _ = stop.send(());
    let checked = watching.await.unwrap();
    assert!(checked > 3, "only {checked} versions checked");

    // The group gone: demo's own 10 again.
    settle(fleet).await;
    groups.delete(GROUP, &DeleteParams::default()).await.unwrap();
    set_label(fleet, "demo", "customer", None).await;
    wait_for(WAIT, "demo's copy of the group gone", || async {
        let shares = quotas.get(NAME).await.ok()?.status?.shares?;
        shares.groups.is_empty().then_some(())
    })
    .await
    .unwrap();
}

/// Creates shared group `name` of `cpu` over the projects labelled `key=value`.
pub async fn create_group(fleet: &e2e::Fleet, name: &str, key: &str, value: &str, cpu: usize) {
    let group: QuotaGroup = serde_json::from_value(serde_json::json!({
        "apiVersion": "kkp-quota.dev/v1alpha1",
        "kind": "QuotaGroup",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {key: value}},
            "quota": {"cpu": cpu.to_string()},
        },
    }))
    .unwrap();
    Api::<QuotaGroup>::all(fleet.master().client())
        .create(&PostParams::default(), &group)
        .await
        .unwrap();
}

/// Sets project `project`'s label `key` to `value` (`None` removes it), on the master.
pub async fn set_label(fleet: &e2e::Fleet, project: &str, key: &str, value: Option<&str>) {
    let patch = serde_json::json!({"metadata": {"labels": {key: value}}});
    Api::<Project>::all(fleet.master().client())
        .patch(project, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// Waits until quota `quota` holds a word of group `group`.
pub async fn wait_holding(fleet: &e2e::Fleet, quota: &str, group: &str) {
    let quotas = Api::<ProjectQuota>::all(fleet.master().client());
    wait_for(WAIT, &format!("{quota} holding a word of {group}"), || async {
        let shares = quotas.get(quota).await.ok()?.status?.shares?;
        shares
            .groups
            .iter()
            .any(|c| c.group == group && c.version >= 1)
            .then_some(())
    })
    .await
    .unwrap();
}
