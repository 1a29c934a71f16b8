//! What a user cluster needs before it can hold a `QuotaView`: the CRD, and a `ClusterRole`
//! bound to every authenticated user that lets them get, list and watch views and nothing else.
//! Applied with server-side apply (the same field manager as the webhook configuration), again
//! at every start of the cluster's task.

use std::time::Duration;

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kkp_quota_crds::QuotaView;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams};
use kube::{Api, Client, CustomResourceExt as _};
use tracing::{info, warn};

use crate::webhook_config::FIELD_MANAGER;

/// The `ClusterRole` (and its binding) that lets every authenticated user read the views.
pub const READER: &str = "kkp-quota-view-reader";

/// Installs the CRD and the reader role, retrying until both are there and views are served.
pub async fn install(client: &Client, cluster: &str) {
    let mut delay = Duration::from_millis(200);
    loop {
        match try_install(client).await {
            Ok(()) => {
                info!(cluster, "quota view CRD and reader role in place");
                return;
            }
            Err(e) => {
                warn!(cluster, error = %e, "could not install the quota view CRD; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    }
}

async fn try_install(client: &Client) -> Result<(), kube::Error> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let crd = QuotaView::crd();
    let crd_name = crd.metadata.name.clone().unwrap_or_default();
    Api::<CustomResourceDefinition>::all(client.clone())
        .patch(&crd_name, &params, &Patch::Apply(&crd))
        .await?;
    let role = ClusterRole {
        metadata: ObjectMeta {
            name: Some(READER.to_owned()),
            ..ObjectMeta::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["kkp-quota.dev".to_owned()]),
            resources: Some(vec!["quotaviews".to_owned()]),
            verbs: vec!["get".to_owned(), "list".to_owned(), "watch".to_owned()],
            ..PolicyRule::default()
        }]),
        ..ClusterRole::default()
    };
    Api::<ClusterRole>::all(client.clone())
        .patch(READER, &params, &Patch::Apply(&role))
        .await?;
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(READER.to_owned()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "ClusterRole".to_owned(),
            name: READER.to_owned(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "Group".to_owned(),
            name: "system:authenticated".to_owned(),
            ..Subject::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch(READER, &params, &Patch::Apply(&binding))
        .await?;
    // A new CRD is served a moment after it is created.
    let views: Api<QuotaView> = Api::all(client.clone());
    let mut served = views.list(&ListParams::default().limit(1)).await;
    for _ in 0..50 {
        if served.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        served = views.list(&ListParams::default().limit(1)).await;
    }
    served.map(drop)
}
