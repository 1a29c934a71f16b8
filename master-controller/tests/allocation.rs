//! Allocation mode on a real master (issue #36, step 4): the allocation webhook served over
//! HTTPS and registered with the master's API server (`allocation::registration`), the chart's
//! `kkp-quota-group-owner` `ClusterRole` bound to an owner, and master-controller keeping the
//! group's status. One master, one scenario after another:
//! - a raise within the allocation passes, one beyond it is refused with the group's numbers;
//! - a burst of concurrent raises over five projects admits exactly the allocation's room;
//! - an owner edits their projects' quotas within the allocation, and neither another project's
//!   quota (the webhook) nor their group (RBAC);
//! - a project labelled into the group takes it over its allocation: `AllocationExceeded`, and
//!   from then only reductions; the group cannot be lowered below what is allocated; deleting a
//!   member's only quota (unlimited) is refused.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

mod common;

use std::collections::BTreeMap;

use common::*;
use e2e::certs::WebhookCerts;
use e2e::{Fleet, FleetSpec, wait_for};
use kkp_quota_crds::kkp::{Project, ProjectSpec};
use kkp_quota_crds::{
    GroupMode, GroupOwner, Quantity, QuotaGroup, QuotaGroupSpec, Resource, ResourceDetails, ResourceQuota,
};
use kube::api::{
    DeleteParams, DynamicObject, ListParams, ObjectMeta, Patch, PatchParams, PostParams, WatchParams,
};
use kube::{Api, Client};
use master_controller::allocation::{registration, server};
use serde_json::json;

const CAP: i64 = 12;

fn cpu(n: i64) -> ResourceDetails {
    kkp_quota_crds::fixtures::cpu(n)
}

async fn project(api: &Api<Project>, name: &str, team: &str) {
    let project = Project {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([("team".to_owned(), team.to_owned())])),
            ..ObjectMeta::default()
        },
        spec: ProjectSpec {
            name: name.to_owned(),
        },
    };
    api.create(&PostParams::default(), &project).await.unwrap();
}

/// The message of a refused request, or `None` when it passed.
fn refusal<T>(result: kube::Result<T>) -> Option<String> {
    match result {
        Ok(_) => None,
        Err(kube::Error::Api(status)) => Some(status.message),
        Err(e) => panic!("not an API refusal: {e}"),
    }
}

async fn raise(api: &Api<ResourceQuota>, name: &str, limit: i64) -> Option<String> {
    let patch = json!({"spec": {"quota": cpu(limit)}});
    refusal(
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await,
    )
}

/// A client of `user` (a client certificate, so that the audit log names the user).
async fn owner_client(master: &e2e::ControlPlane, user: &str) -> Client {
    e2e::client_from_kubeconfig(&master.kubeconfig_for_user(user, &[]).unwrap())
        .await
        .unwrap()
}

async fn group_status(groups: &Api<QuotaGroup>, allocated: i64, exceeded: &str) {
    let want = Quantity::from_units(allocated);
    wait_for(
        DEADLINE,
        &format!("group red allocated {allocated}, AllocationExceeded {exceeded}"),
        || async {
            let status = groups.get("red").await.ok()?.status?;
            let got = status.allocated.as_ref()?.get(Resource::Cpu)?;
            let condition = status
                .conditions
                .iter()
                .find(|c| c.type_ == "AllocationExceeded")?;
            let enforced = status.conditions.iter().find(|c| c.type_ == "Enforced")?;
            (got == want && condition.status == exceeded && enforced.status == "True").then_some(())
        },
    )
    .await
    .unwrap();
}

/// Every verb the owner role grants, as an owner uses it: her groups and projects read, her
/// projects' quotas listed, watched, read, and edited by update and by patch (within the
/// allocation: reductions here).
async fn exercise_the_owner_role(alice: &Client) {
    let projects: Api<Project> = Api::all(alice.clone());
    let groups: Api<QuotaGroup> = Api::all(alice.clone());
    let kkp: Api<ResourceQuota> = Api::all(alice.clone());
    let ours: Api<kkp_quota_crds::ProjectQuota> = Api::all(alice.clone());
    projects.get("p1").await.unwrap();
    groups.get("red").await.unwrap();
    let list = ListParams::default();
    projects.list(&list).await.unwrap();
    groups.list(&list).await.unwrap();
    kkp.list(&list).await.unwrap();
    ours.list(&list).await.unwrap();
    let watch = WatchParams::default().timeout(1);
    drop(projects.watch(&watch, "0").await.unwrap());
    drop(groups.watch(&watch, "0").await.unwrap());
    drop(kkp.watch(&watch, "0").await.unwrap());
    drop(ours.watch(&watch, "0").await.unwrap());
    // The same limit written back by update: no raise.
    wait_for(DEADLINE, "p3's quota written back", || async {
        let quota = kkp.get("p3").await.ok()?;
        kkp.replace("p3", &PostParams::default(), &quota).await.ok()
    })
    .await
    .unwrap();
    // The project's own quota made stricter by patch, then written back by update.
    let stricter = json!({"spec": {"quota": {"memory": "1Ti"}}});
    ours.patch("p3", &PatchParams::default(), &Patch::Merge(&stricter))
        .await
        .unwrap();
    // master-controller writes its status meanwhile: read again on a conflict.
    wait_for(DEADLINE, "p3's ProjectQuota written back", || async {
        let own = ours.get("p3").await.ok()?;
        ours.replace("p3", &PostParams::default(), &own).await.ok()
    })
    .await
    .unwrap();
}

/// The audit log proves the owner role: every request the owner made that RBAC refused is the
/// one meant to be refused (her group patched), and every permission the role grants was used.
fn owner_rbac_is_proven_by_the_audit_log(master: &e2e::ControlPlane, rbac: &[serde_json::Value]) {
    let requests = e2e::audit::read(&master.audit_log()).unwrap();
    let alice: Vec<&e2e::audit::Request> = requests.iter().filter(|r| r.user == "alice").collect();
    let grants = e2e::audit::grants(rbac, "alice", "kubermatic");
    assert!(!grants.is_empty(), "the owner role grants alice nothing");
    let excess = e2e::audit::excess(&grants, &alice, &[]);
    assert!(
        excess.is_empty(),
        "the owner role grants more than an owner uses: {excess:?}"
    );
    let refused_by_rbac: Vec<&&e2e::audit::Request> = alice
        .iter()
        .filter(|r| r.code == Some(403) && !grants.iter().any(|g| e2e::audit::allows(g, r)))
        .collect();
    assert_eq!(refused_by_rbac.len(), 1, "{refused_by_rbac:#?}");
    assert_eq!(refused_by_rbac[0].access.resource, "quotagroups");
    assert_eq!(refused_by_rbac[0].access.verb, "patch");
}

#[tokio::test(flavor = "multi_thread")]
async fn allocation_groups_cap_their_projects_quotas() {
    let fleet = Fleet::start(FleetSpec::empty().with_audit_log()).await.unwrap();
    let master = fleet.master().client();
    let certs = WebhookCerts::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let paths = certs.write_to(dir.path()).unwrap();
    let (address, webhook) = server::serve(
        master.clone(),
        server::Serving {
            address: "127.0.0.1:0".parse().unwrap(),
            namespace: "default".to_owned(),
            cert: paths.cert,
            key: paths.key,
        },
        master_controller::Metrics::new(),
    )
    .await
    .unwrap();
    tokio::spawn(webhook);
    let configuration: DynamicObject = serde_json::from_value(registration::configuration(&json!({
        "url": format!("https://{address}{}", server::PATH),
        "caBundle": certs.ca_bundle(),
    })))
    .unwrap();
    let configurations: Api<DynamicObject> = Api::all_with(
        master.clone(),
        &kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingWebhookConfiguration",
        )),
    );
    configurations
        .create(&PostParams::default(), &configuration)
        .await
        .unwrap();
    let mut options = options();
    options.allocation_webhook = true;
    let _controller = Running::start(master.clone(), options).await.unwrap();

    let projects: Api<Project> = Api::all(master.clone());
    let quotas: Api<ResourceQuota> = Api::all(master.clone());
    let groups: Api<QuotaGroup> = Api::all(master.clone());
    let red: Vec<String> = (1..=6).map(|i| format!("p{i}")).collect();
    for name in &red {
        project(&projects, name, "red").await;
        create_quota(&quotas, name, name, cpu(1)).await.unwrap();
    }
    project(&projects, "blue", "blue").await;
    create_quota(&quotas, "blue", "blue", cpu(1)).await.unwrap();
    let spec = |cap: i64| QuotaGroupSpec {
        selector: serde_json::from_value(json!({"matchLabels": {"team": "red"}})).unwrap(),
        quota: cpu(cap),
        mode: GroupMode::Allocation,
        owners: vec![GroupOwner {
            kind: "User".to_owned(),
            name: "alice".to_owned(),
        }],
    };
    groups
        .create(&PostParams::default(), &QuotaGroup::new("red", spec(CAP)))
        .await
        .unwrap();
    group_status(&groups, 6, "False").await;

    // Within the allocation, then beyond it.
    assert_eq!(raise(&quotas, "p1", 3).await, None);
    let why = raise(&quotas, "p1", 8)
        .await
        .expect("a raise past the allocation");
    assert!(
        why.contains("quota group red allocates at most 12 cpu to its projects; with this edit they would be allocated 13 cpu (p1 8, p2 1, p3 1, p4 1, p5 1, p6 1)"),
        "{why}"
    );
    group_status(&groups, 8, "False").await;

    // A burst: five raises of 2 at once, room for 4: exactly two pass.
    let burst = futures::future::join_all(red[1..].iter().map(|name| raise(&quotas, name, 3))).await;
    let passed = burst.iter().filter(|r| r.is_none()).count();
    assert_eq!(passed, 2, "{burst:?}");
    for refused in burst.iter().flatten() {
        assert!(
            refused.contains("quota group red allocates at most 12 cpu"),
            "{refused}"
        );
    }
    group_status(&groups, CAP, "False").await;

    // The owner, under the chart's ClusterRole.
    let role = e2e::chart::render("master", &[])
        .unwrap()
        .into_iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "kkp-quota-group-owner")
        .expect("the chart renders ClusterRole kkp-quota-group-owner");
    e2e::chart::apply(&master, std::slice::from_ref(&role), false)
        .await
        .unwrap();
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "alice-owns-red"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kkp-quota-group-owner"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}],
    });
    e2e::chart::apply(&master, std::slice::from_ref(&binding), false)
        .await
        .unwrap();
    let alice = owner_client(fleet.master(), "alice").await;
    let alice_quotas: Api<ResourceQuota> = Api::all(alice.clone());
    // The API server's authorizer takes the binding from its own watch: until then alice is
    // refused by RBAC, not by the webhook.
    wait_for(DEADLINE, "alice's role in force", || async {
        alice_quotas.get("p1").await.is_ok()
    })
    .await
    .unwrap();
    // Room moved between her projects: p1 down by 2, then p2 up by 2.
    assert_eq!(raise(&alice_quotas, "p1", 1).await, None);
    group_status(&groups, CAP - 2, "False").await;
    let p2 = quotas
        .get("p2")
        .await
        .unwrap()
        .spec
        .quota
        .limits
        .get(Resource::Cpu)
        .unwrap();
    let p2 = i64::try_from(p2.ceil_units()).unwrap();
    let most = raise(&alice_quotas, "p2", p2 + 3)
        .await
        .expect("past the allocation");
    assert!(
        most.contains("quota group red allocates at most 12 cpu"),
        "{most}"
    );
    assert_eq!(raise(&alice_quotas, "p2", p2 + 2).await, None);
    let outside = raise(&alice_quotas, "blue", 2)
        .await
        .expect("another project's quota");
    assert!(
        outside.contains("alice owns quota groups red and may edit only their projects' quotas: project blue is in none of them"),
        "{outside}"
    );
    let alice_groups: Api<QuotaGroup> = Api::all(alice.clone());
    exercise_the_owner_role(&alice).await;
    let patch = json!({"spec": {"quota": {"cpu": "100"}}});
    match alice_groups
        .patch("red", &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("an owner patched her group: {other:?}"),
    }
    owner_rbac_is_proven_by_the_audit_log(fleet.master(), &[role, binding]);

    // blue labelled into the group: 13 allocated of 12.
    let label = json!({"metadata": {"labels": {"team": "red"}}});
    projects
        .patch("blue", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap();
    group_status(&groups, CAP + 1, "True").await;
    assert_eq!(
        raise(&quotas, "p1", 0).await,
        None,
        "a reduction passes while over"
    );
    group_status(&groups, CAP, "False").await;
    // The webhook's own cache may see blue's label a moment later than master-controller's.
    let lower = wait_for(
        DEADLINE,
        "the cap lowered below what is allocated, refused",
        || async {
            let patch = json!({"spec": {"quota": {"cpu": "10"}}});
            let why = refusal(
                groups
                    .patch("red", &PatchParams::default(), &Patch::Merge(&patch))
                    .await,
            )?;
            why.contains("12 cpu already").then_some(why)
        },
    )
    .await
    .unwrap();
    assert!(
        lower.contains(
            "quota group red would allocate at most 10 cpu, but its projects are allocated 12 cpu already"
        ),
        "{lower}"
    );
    assert!(
        raise(&quotas, "p1", 1).await.is_some(),
        "a raise at the allocation is refused"
    );
    let unlimited = refusal(quotas.delete("p4", &DeleteParams::default()).await).expect("p4 without a quota");
    assert!(
        unlimited.contains("would be allocated unlimited cpu"),
        "{unlimited}"
    );
    // Raising the cap is always fine.
    groups
        .patch(
            "red",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"quota": {"cpu": "20"}}})),
        )
        .await
        .unwrap();
    group_status(&groups, CAP, "False").await;
}

/// The chart registers what the tests register: the same rules and match condition.
#[test]
fn the_chart_registers_the_webhook_as_the_code_does() {
    let rendered = e2e::chart::render("master", &[])
        .unwrap()
        .into_iter()
        .find(|d| {
            d["kind"] == "ValidatingWebhookConfiguration" && d["metadata"]["name"] == registration::NAME
        })
        .expect("the chart renders the allocation webhook's configuration");
    let ours = registration::configuration(&json!({}));
    for field in [
        "name",
        "rules",
        "matchConditions",
        "failurePolicy",
        "sideEffects",
        "admissionReviewVersions",
        "timeoutSeconds",
    ] {
        assert_eq!(
            rendered["webhooks"][0][field], ours["webhooks"][0][field],
            "{field}"
        );
    }
    assert_eq!(
        rendered["webhooks"][0]["clientConfig"]["service"]["path"],
        server::PATH
    );
}

/// Two replicas answering at once, each from its own caches: six raises of 2 cpu, sent
/// alternately to each, against room for 4: exactly two are allowed (the record's
/// compare-and-swap makes the loser decide again with the winner's raise counted), and the
/// record holds the two.
#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_allow_exactly_the_room() {
    let fleet = Fleet::start(FleetSpec::empty()).await.unwrap();
    let master = fleet.master().client();
    let projects: Api<Project> = Api::all(master.clone());
    let quotas: Api<ResourceQuota> = Api::all(master.clone());
    let names: Vec<String> = (1..=6).map(|i| format!("q{i}")).collect();
    for name in &names {
        project(&projects, name, "green").await;
        create_quota(&quotas, name, name, cpu(1)).await.unwrap();
    }
    let spec = QuotaGroupSpec {
        selector: serde_json::from_value(json!({"matchLabels": {"team": "green"}})).unwrap(),
        quota: cpu(10),
        mode: GroupMode::Allocation,
        owners: Vec::new(),
    };
    Api::<QuotaGroup>::all(master.clone())
        .create(&PostParams::default(), &QuotaGroup::new("green", spec))
        .await
        .unwrap();
    let metrics = [
        master_controller::Metrics::new(),
        master_controller::Metrics::new(),
    ];
    let replicas: Vec<server::Webhook> = metrics
        .iter()
        .map(|m| {
            let (webhook, caches) = server::Webhook::start(master.clone(), "default", m.clone());
            tokio::spawn(caches);
            webhook
        })
        .collect();
    let mut reviews = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let old = serde_json::to_value(quotas.get(name).await.unwrap()).unwrap();
        let mut new = old.clone();
        new["spec"]["quota"]["cpu"] = json!("3");
        let review = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": format!("request-{i}"),
                "kind": {"group": "kubermatic.k8c.io", "version": "v1", "kind": "ResourceQuota"},
                "resource": {"group": "kubermatic.k8c.io", "version": "v1", "resource": "resourcequotas"},
                "name": name,
                "operation": "UPDATE",
                "userInfo": {"username": "admin"},
                "object": new,
                "oldObject": old,
            },
        });
        reviews.push((i % 2, serde_json::to_vec(&review).unwrap()));
    }
    let answers = futures::future::join_all(
        reviews
            .iter()
            .map(|(replica, body)| replicas[*replica].review(body)),
    )
    .await;
    let allowed = answers
        .iter()
        .filter(|a| a["response"]["allowed"] == true)
        .count();
    assert_eq!(allowed, 2, "{answers:#?}");
    for refused in answers.iter().filter(|a| a["response"]["allowed"] == false) {
        let message = refused["response"]["status"]["message"].as_str().unwrap();
        assert!(
            message.contains("quota group green allocates at most 10 cpu"),
            "{message}"
        );
    }
    let counted = |verdict: &str| -> u64 {
        metrics
            .iter()
            .map(|m| m.allocation_decisions.with_label_values(&[verdict]).get())
            .sum()
    };
    assert_eq!((counted("allowed"), counted("refused")), (2, 4));
    let record = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(master, "default")
        .get(master_controller::allocation::record::NAME)
        .await
        .unwrap();
    let entries: Vec<serde_json::Value> = serde_json::from_str(&record.data.unwrap()["entries"]).unwrap();
    assert_eq!(entries.len(), 2, "{entries:#?}");
}
