//! The simulated user clusters (a namespace each on a shared host, see the crate's doc): how
//! they are made, registered with the webhook, and where their Machines are created.

use anyhow::{Context as _, Result};
use e2e::Fleet;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kkp_quota_crds::kkp::{ADMIN_KUBECONFIG_SECRET, Cluster, KUBECONFIG_KEY};
use kkp_quota_crds::machine::Machine;
use kkp_quota_runtime::webhook_auth::{SigningKeys, webhook_url};
use kkp_quota_runtime::webhook_config::{self, Operations};
use kube::Client;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

use super::{MANAGER, SEED};

pub(super) fn cluster_name(i: usize) -> String {
    format!("c{i:03}")
}

pub(super) fn project_name(i: usize) -> String {
    format!("p{i:03}")
}

/// The simulated user clusters: where each one's Machines are created.
pub(super) struct Simulated {
    /// One client per host, shared by the clusters on it.
    pub(super) hosts: Vec<Client>,
    pub(super) clusters: usize,
}

impl Simulated {
    pub(super) fn machines(&self, i: usize) -> Api<Machine> {
        Api::namespaced(self.hosts[i % self.hosts.len()].clone(), &cluster_name(i))
    }

    /// The Machines that exist in every simulated cluster, counted on their hosts.
    pub(super) async fn count(&self) -> Result<usize> {
        let mut count = 0;
        for host in &self.hosts {
            count += Api::<Machine>::all(host.clone())
                .list_metadata(&ListParams::default())
                .await?
                .items
                .len();
        }
        Ok(count)
    }
}

/// A Machine of `cpus` cpu, for any namespace (the API's namespace is the one it gets).
pub(super) fn machine(name: &str, cpus: i64) -> Machine {
    let mut m = e2e::machines::vsphere(name, cpus);
    m.metadata.namespace = None;
    m
}

/// Simulated cluster `i`: its namespace on its host; on the seed its `Cluster` of project `i`
/// (with `status.namespaceName`) and the admin kubeconfig naming that namespace.
pub(super) async fn create_simulated(fleet: &Fleet, hosts: &[String], i: usize) -> Result<()> {
    let name = cluster_name(i);
    let host = fleet.user_cluster(&hosts[i % hosts.len()]);
    e2e::fleet::create_namespace(&host.client(), &name).await?;
    let seed = fleet.seed(SEED).client();
    let namespace = e2e::fleet::cluster_namespace(&name);
    e2e::fleet::create_namespace(&seed, &namespace).await?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(ADMIN_KUBECONFIG_SECRET.to_owned()),
            namespace: Some(namespace.clone()),
            ..ObjectMeta::default()
        },
        data: Some(
            [(
                KUBECONFIG_KEY.to_owned(),
                ByteString(host.in_cluster_kubeconfig_with_namespace(&name)?.into_bytes()),
            )]
            .into(),
        ),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(seed.clone(), &namespace)
        .create(&PostParams::default(), &secret)
        .await
        .with_context(|| format!("the admin kubeconfig of {name}"))?;
    let clusters = Api::<Cluster>::all(seed);
    clusters
        .create(
            &PostParams::default(),
            &e2e::fleet::project_cluster(&name, &project_name(i)),
        )
        .await
        .with_context(|| format!("Cluster {name}"))?;
    clusters
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"namespaceName": namespace}})),
        )
        .await?;
    Ok(())
}

/// Points simulated cluster `i` at the webhook (base URL `base`): the configuration
/// seed-controller writes for a user cluster, named for the cluster and selecting its namespace.
pub(super) async fn register(
    fleet: &Fleet,
    sim: &Simulated,
    base: &str,
    keys: &SigningKeys,
    ca: &[u8],
    i: usize,
) -> Result<()> {
    let name = cluster_name(i);
    let uid = Api::<Cluster>::all(fleet.seed(SEED).client())
        .get(&name)
        .await?
        .metadata
        .uid
        .context("a Cluster without UID")?;
    let url = webhook_url(base, &name, &keys.sign(&name, &uid));
    let mut config = webhook_config::desired(&url, Some(ca), Operations::CreateAndUpdate);
    let config_name = format!("{}-{name}", webhook_config::NAME);
    config["metadata"]["name"] = json!(config_name);
    for webhook in config["webhooks"]
        .as_array_mut()
        .context("a configuration without webhooks")?
    {
        webhook["namespaceSelector"] = json!({"matchLabels": {"kubernetes.io/metadata.name": name}});
    }
    Api::<ValidatingWebhookConfiguration>::all(sim.hosts[i % sim.hosts.len()].clone())
        .patch(
            &config_name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&config),
        )
        .await
        .with_context(|| format!("registering {name}"))?;
    Ok(())
}
