//! The users' view of their quota (issue #37): the `QuotaView` seed-controller keeps in every user
//! cluster follows a create, a delete and a quota edit; a user with only `view` rights reads it
//! (also with kubectl) and cannot change it; a view whose seed cannot be read says it is stale.

use std::time::{Duration, Instant};

use e2e::machines::vsphere;
use e2e::{Fleet, wait_for};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use kkp_quota_crds::machine::Machine;
use kkp_quota_crds::{Quantity, QuotaView, ViewState};
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::{LIMIT, NAME, WAIT};

/// alpha's view once `check` holds, and how long that took.
async fn view_when(client: &Client, what: &str, check: impl Fn(&QuotaView) -> bool) -> (QuotaView, Duration) {
    let views: Api<QuotaView> = Api::all(client.clone());
    let started = Instant::now();
    let view = wait_for(WAIT, what, || async {
        views.get(NAME).await.ok().filter(|v| check(v))
    })
    .await
    .unwrap();
    (view, started.elapsed())
}

fn cpu(
    view: &QuotaView,
    field: fn(&kkp_quota_crds::QuotaViewStatus) -> &kkp_quota_crds::ResourceDetails,
) -> i64 {
    let status = view.status.as_ref().expect("a view has a status");
    let amount = field(status).amount(kkp_quota_crds::Resource::Cpu);
    i64::try_from(amount.as_nanos() / Quantity::from_units(1).as_nanos()).unwrap()
}

fn used_in(view: &QuotaView, cluster: &str) -> i64 {
    view.status
        .as_ref()
        .and_then(|s| s.clusters.iter().find(|c| c.cluster == cluster))
        .map_or(0, |c| {
            i64::try_from(c.usage.amount(kkp_quota_crds::Resource::Cpu).as_nanos() / 1_000_000_000).unwrap()
        })
}

fn state(view: &QuotaView) -> ViewState {
    view.status.as_ref().map(|s| s.state).unwrap_or_default()
}

/// From an idle project (nothing running): the view in alpha follows a create, a delete and a
/// quota edit, and is readable (not writable) by a user with only `view` rights.
pub async fn the_users_view_follows_the_project(fleet: &Fleet) {
    let alpha = fleet.user_cluster("alpha").client();
    let (view, _) = view_when(&alpha, "alpha's quota view, current", |v| {
        state(v) == ViewState::Current && cpu(v, |s| &s.used) == 0
    })
    .await;
    assert_eq!(view.spec.project, "demo");
    assert_eq!(
        (cpu(&view, |s| &s.limits), cpu(&view, |s| &s.free)),
        (LIMIT, LIMIT)
    );
    let clusters: Vec<&str> = view
        .status
        .as_ref()
        .unwrap()
        .clusters
        .iter()
        .map(|c| c.cluster.as_str())
        .collect();
    assert_eq!(clusters, ["alpha", "beta"], "the project's clusters on seed-a");

    // A create in beta shows in alpha's view: the project's usage, and beta's line.
    let machines: Api<Machine> = Api::namespaced(fleet.user_cluster("beta").client(), "kube-system");
    machines
        .create(&PostParams::default(), &vsphere("seen-1", 3))
        .await
        .unwrap();
    let (view, created) = view_when(&alpha, "the create in alpha's view", |v| {
        cpu(v, |s| &s.used) == 3 && used_in(v, "beta") == 3
    })
    .await;
    assert_eq!(cpu(&view, |s| &s.free), LIMIT - 3);
    machines.delete("seen-1", &DeleteParams::default()).await.unwrap();
    let (_, deleted) = view_when(&alpha, "the delete in alpha's view", |v| {
        cpu(v, |s| &s.used) == 0 && used_in(v, "beta") == 0
    })
    .await;

    // A quota edit on the master reaches the view through the seed's ledger.
    e2e::demo::apply_quota(
        fleet,
        &e2e::demo::cpu_quota("demo", &(LIMIT + 2).to_string()),
        "shares-test",
    )
    .await
    .unwrap();
    let (_, edited) = view_when(&alpha, "the raised limit in alpha's view", |v| {
        cpu(v, |s| &s.limits) == LIMIT + 2
    })
    .await;
    super::restore_limit(fleet).await;
    view_when(&alpha, "the limit back in alpha's view", |v| {
        cpu(v, |s| &s.limits) == LIMIT
    })
    .await;
    eprintln!("quota view followed: create in {created:?}, delete in {deleted:?}, quota edit in {edited:?}");

    a_viewer_reads_the_view_and_cannot_change_it(fleet, &alpha).await;
    a_moved_cluster_shows_only_its_new_project(fleet).await;
}

/// beta's `Cluster` relabelled to another project (no quota) and back: beta then holds that
/// project's view alone, then demo's alone again.
async fn a_moved_cluster_shows_only_its_new_project(fleet: &Fleet) {
    let clusters: Api<kkp_quota_crds::kkp::Cluster> = Api::all(fleet.seed("seed-a").client());
    let views: Api<QuotaView> = Api::all(fleet.user_cluster("beta").client());
    let relabel = |project: &'static str| {
        let clusters = clusters.clone();
        async move {
            let patch = json!({"metadata": {"labels": {kkp_quota_crds::kkp::PROJECT_ID_LABEL: project}}});
            clusters
                .patch("beta", &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
        }
    };
    let only = |project: &'static str| {
        let views = views.clone();
        async move {
            let names: Vec<String> = views
                .list(&kube::api::ListParams::default())
                .await
                .ok()?
                .items
                .iter()
                .filter_map(|v| v.metadata.name.clone())
                .collect();
            (names == [format!("project-{project}")]).then_some(())
        }
    };
    relabel("moved").await;
    let started = Instant::now();
    wait_for(WAIT, "beta with the view of project moved alone", || {
        only("moved")
    })
    .await
    .unwrap();
    let moved = started.elapsed();
    relabel("demo").await;
    wait_for(WAIT, "beta with demo's view alone again", || only("demo"))
        .await
        .unwrap();
    eprintln!("a moved cluster's views followed in {moved:?}");
}

/// User `jane`, bound only to the built-in `view` role: reads the view with kube-rs and kubectl,
/// and every write is forbidden.
async fn a_viewer_reads_the_view_and_cannot_change_it(fleet: &Fleet, alpha: &Client) {
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some("jane-view".to_owned()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "ClusterRole".to_owned(),
            name: "view".to_owned(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "User".to_owned(),
            name: "jane".to_owned(),
            ..Subject::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(alpha.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let kubeconfig = fleet
        .user_cluster("alpha")
        .kubeconfig_for_user("jane", &[])
        .unwrap();
    let jane = e2e::client_from_kubeconfig(&kubeconfig).await.unwrap();
    let views: Api<QuotaView> = Api::all(jane);
    let view = views.get(NAME).await.unwrap();
    assert_eq!(view.spec.project, "demo");
    let forbidden =
        |result: Result<QuotaView, kube::Error>| matches!(result, Err(kube::Error::Api(e)) if e.code == 403);
    let patch = Patch::Merge(json!({"spec": {"project": "other"}}));
    assert!(forbidden(
        views.patch(NAME, &PatchParams::default(), &patch).await
    ));
    let patch = Patch::Merge(json!({"status": {"limits": {"cpu": "1000"}}}));
    assert!(forbidden(
        views.patch_status(NAME, &PatchParams::default(), &patch).await
    ));
    let deleted = views.delete(NAME, &DeleteParams::default()).await;
    assert!(matches!(deleted, Err(kube::Error::Api(e)) if e.code == 403));

    // What kubectl prints for her: the numbers at a glance.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jane.kubeconfig");
    std::fs::write(&file, kubeconfig).unwrap();
    let out = e2e::kubectl::run(&file, &["get", "quotaviews"], "").unwrap();
    assert!(out.success, "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "PROJECT",
            "CPU",
            "USED",
            "CPU",
            "LIMIT",
            "MEMORY",
            "USED",
            "MEMORY",
            "LIMIT",
            "STATE",
            "CONFIRMED"
        ],
        "{out:?}"
    );
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    let limit = LIMIT.to_string();
    assert_eq!(&row[..4], [NAME, "demo", "0", limit.as_str()], "{out:?}");
    assert_eq!(row[row.len() - 2], "Current", "{out:?}");
}

/// gamma's view (seed-b) while seed-b's API server is down, and after.
pub async fn stale_while_its_seed_is_down(fleet: &Fleet) -> Duration {
    let gamma = fleet.user_cluster("gamma").client();
    let (view, took) = view_when(&gamma, "gamma's view stale", |v| state(v) == ViewState::Stale).await;
    let message = view.status.unwrap().message.unwrap_or_default();
    assert!(
        message.starts_with(r#"seed "seed-b" cannot be read since"#),
        "{message}"
    );
    took
}

/// gamma's view current again.
pub async fn current_again(fleet: &Fleet) {
    let gamma = fleet.user_cluster("gamma").client();
    view_when(&gamma, "gamma's view current again", |v| {
        state(v) == ViewState::Current
    })
    .await;
}
