//! A denial is told where the user looks: one Event on the owning `MachineDeployment` in the user
//! cluster, its count increased on every retry (and, when it is rolling out, that its rollout is
//! blocked); without an owner, on the Cluster on the seed.

mod common;

use std::time::Duration;

use anyhow::{Context as _, Result};
use common::owners::{owner_ref, resource};
use common::*;
use e2e::wait_for;
use k8s_openapi::api::core::v1::Event;
use kube::api::{DynamicObject, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

async fn events_about(client: &Client, namespace: &str, kind: &str, name: &str) -> Result<Vec<Event>> {
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object.kind.as_deref() == Some(kind) && e.involved_object.name.as_deref() == Some(name)
        })
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines)]
async fn denial_events_land_on_the_machine_deployment_once() -> Result<()> {
    let fleet = fleet().await?;
    let seed = fleet.seed(SEED).client();
    let alpha = fleet.user_cluster("alpha").client();
    let certs = certs()?;
    // Full: 16 of 16 cpu.
    write_quota(seed.clone(), PROJECT, "16", "16").await?;
    let webhook = start_webhook(seed.clone(), &certs, "127.0.0.1:0".parse()?).await?;
    register(&seed, alpha.clone(), "alpha", webhook.address, &certs).await?;

    let deployments: Api<DynamicObject> =
        Api::namespaced_with(alpha.clone(), NS, &resource("machinedeployments"));
    let sets: Api<DynamicObject> = Api::namespaced_with(alpha.clone(), NS, &resource("machinesets"));
    let mut deployment = DynamicObject::new("workers", &resource("machinedeployments"));
    deployment.data = json!({"spec": {"replicas": 3}});
    let deployment = deployments.create(&PostParams::default(), &deployment).await?;
    let mut set = DynamicObject::new("workers-5d8f", &resource("machinesets"));
    set.metadata.owner_references = Some(vec![owner_ref(&deployment, "MachineDeployment")]);
    set.data = json!({"spec": {"replicas": 3}});
    let set = sets.create(&PostParams::default(), &set).await?;

    // The MachineSet controller retries: a new generated name every time.
    let api = machines(alpha.clone());
    for _ in 0..3 {
        let mut m = machine("", 2);
        m.metadata.name = None;
        m.metadata.generate_name = Some("workers-5d8f-".into());
        m.metadata.owner_references = Some(vec![owner_ref(&set, "MachineSet")]);
        let message = denial(api.create(&PostParams::default(), &m).await);
        assert!(
            message.contains(r#"needs 2 cpu, project "demo" uses 16 of 16 cpu"#),
            "{message}"
        );
    }
    let events = wait_for(
        Duration::from_secs(30),
        "one Event with count 3 on the MachineDeployment",
        || async {
            let events = events_about(&alpha, NS, "MachineDeployment", "workers").await?;
            anyhow::ensure!(
                events.iter().map(|e| e.count.unwrap_or(0)).sum::<i32>() == 3,
                "so far: {events:?}"
            );
            Ok(events)
        },
    )
    .await?;
    assert_eq!(events.len(), 1, "deduplicated: {events:?}");
    let event = &events[0];
    assert_eq!(event.count, Some(3));
    assert_eq!(event.reason.as_deref(), Some("QuotaExceeded"));
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(
        event.message.as_deref(),
        Some(r#"a Machine needs 2 cpu, project "demo" uses 16 of 16 cpu"#)
    );
    assert_eq!(event.involved_object.uid, deployment.metadata.uid);
    assert!(
        events_about(&alpha, NS, "MachineSet", "workers-5d8f")
            .await?
            .is_empty()
    );

    // A MachineDeployment rolling out (one of its 3 Machines replaced so far) at full quota: its
    // surge Machine is refused, the denial names both ways out, and the Event says the rollout
    // is blocked.
    let mut rolling = DynamicObject::new("rolling", &resource("machinedeployments"));
    rolling.data = json!({
        "spec": {"replicas": 3},
        "status": {"replicas": 4, "updatedReplicas": 1, "observedGeneration": 1},
    });
    let rolling = deployments.create(&PostParams::default(), &rolling).await?;
    let mut new_set = DynamicObject::new("rolling-7c9d", &resource("machinesets"));
    new_set.metadata.owner_references = Some(vec![owner_ref(&rolling, "MachineDeployment")]);
    new_set.data = json!({"spec": {"replicas": 2}});
    let new_set = sets.create(&PostParams::default(), &new_set).await?;
    let mut surge = machine("", 2);
    surge.metadata.name = None;
    surge.metadata.generate_name = Some("rolling-7c9d-".into());
    surge.metadata.owner_references = Some(vec![owner_ref(&new_set, "MachineSet")]);
    let message = denial(api.create(&PostParams::default(), &surge).await);
    assert!(
        message.ends_with(r#"needs 2 cpu, project "demo" uses 16 of 16 cpu; if this Machine is the surge of a MachineDeployment rollout (such as a Kubernetes upgrade), set its MachineDeployment's rollout strategy to maxSurge: 0 and maxUnavailable: 1 (Machines are then replaced one at a time, without an extra one), or raise the project's quota"#),
        "{message}"
    );
    let blocked = wait_for(
        Duration::from_secs(30),
        "an Event on the rolling MachineDeployment",
        || async {
            let events = events_about(&alpha, NS, "MachineDeployment", "rolling").await?;
            events.into_iter().next().context("none yet")
        },
    )
    .await?;
    assert_eq!(
        blocked.message.as_deref(),
        Some(
            r#"the rollout is blocked: its surge Machine needs 2 cpu, project "demo" uses 16 of 16 cpu; set its MachineDeployment's rollout strategy to maxSurge: 0 and maxUnavailable: 1 (Machines are then replaced one at a time, without an extra one), or raise the project's quota"#
        )
    );

    // No owner: the Event goes to the Cluster on the seed.
    denial(api.create(&PostParams::default(), &machine("lonely-1", 1)).await);
    let on_cluster = wait_for(
        Duration::from_secs(30),
        "an Event on the Cluster on the seed",
        || async {
            let events = events_about(&seed, "default", "Cluster", "alpha").await?;
            events.into_iter().next().context("none yet")
        },
    )
    .await?;
    assert_eq!(
        on_cluster.message.as_deref(),
        Some(r#"a Machine needs 1 cpu, project "demo" uses 16 of 16 cpu"#)
    );
    // The counter moves just after the API call returns: wait for it rather than race it.
    let events = webhook.metrics.events.clone();
    wait_for(Duration::from_secs(10), "3 Events created, 2 updated", || {
        let counts = (
            events.with_label_values(&["created"]).get(),
            events.with_label_values(&["updated"]).get(),
        );
        async move { counts == (3, 2) }
    })
    .await?;
    webhook.kill().await;
    Ok(())
}
