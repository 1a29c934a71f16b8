//! Finding the Machine a surge replaces, in the user cluster: the rollout allowance's reads.
//! The rule itself is pure (`kkp_quota_crds::rollout`, [`crate::decision::decide_surge`]); the
//! choice of the replaced Machine is pure too ([`find_replaced`]); this module only reads.
//!
//! A new Machine is a surge when its `MachineSet` belongs to a `MachineDeployment` that already
//! has at least `spec.replicas` Machines not being deleted (so it is not a scale-up), and it
//! replaces one of them that belongs to another (older) `MachineSet` of the same
//! `MachineDeployment`, is at least as large in every resource, and is not already replaced by a
//! running surge.

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kkp_quota_crds::ResourceDetails;
use kkp_quota_crds::machine::Machine;
use kkp_quota_crds::rollout::SurgeRefusal;
use kkp_quota_runtime::chain::Chain;
use kube::api::{DynamicObject, ListParams};
use kube::{Api, Resource as _, ResourceExt as _};
use provider_sizes::size_machine;

use crate::cache::SeedCache;
use crate::decision::Replaced;
use crate::owners::{self, owner, resource};
use crate::user_clients::UserClients;

/// Reads user clusters for the rollout allowance, and for the policy `reservedCounts`.
pub struct Rollouts {
    cache: Arc<SeedCache>,
    clients: tokio::sync::Mutex<UserClients>,
}

impl Rollouts {
    pub fn new(cache: Arc<SeedCache>, seed: kube::Client) -> Rollouts {
        Rollouts {
            cache,
            clients: tokio::sync::Mutex::new(UserClients::new(seed)),
        }
    }

    /// The Machine the new Machine (of `cluster`, `namespace`, with `owners`) replaces, if it is
    /// a surge of a rollout. `taken`: UIDs already replaced by running surges.
    pub async fn replaced(
        &self,
        cluster: &str,
        namespace: &str,
        owners: &[OwnerReference],
        growth: &ResourceDetails,
        taken: &[String],
    ) -> Result<Replaced, SurgeRefusal> {
        let lookup = |what: &str, e: &(dyn std::error::Error + 'static)| {
            SurgeRefusal::Lookup(format!("{what} could not be read: {}", Chain(e)))
        };
        let not_a_surge = |why: &str| SurgeRefusal::NoReplacement(why.to_owned());
        let set_ref = owner(owners, "MachineSet").ok_or_else(|| not_a_surge("it has no MachineSet"))?;
        let cluster_object = self
            .cache
            .cluster(cluster)
            .ok_or_else(|| not_a_surge("its user cluster is not known on this seed"))?;
        let client = {
            let mut clients = self.clients.lock().await;
            match clients.get(&cluster_object).await {
                Ok(client) => client,
                Err(e) => {
                    clients.forget(cluster);
                    return Err(lookup("the user cluster", &e));
                }
            }
        };
        let gone = |what: &str| SurgeRefusal::NoReplacement(format!("{what} is gone"));
        let set = owners::read(&client, namespace, set_ref, "MachineSet")
            .await
            .map_err(|e| lookup("its MachineSet", &e))?
            .ok_or_else(|| gone("its MachineSet"))?;
        let deployment_ref = owners::deployment_of(&set)
            .ok_or_else(|| not_a_surge("its MachineSet has no MachineDeployment"))?;
        let deployment = owners::read(&client, namespace, deployment_ref, "MachineDeployment")
            .await
            .map_err(|e| lookup("its MachineDeployment", &e))?
            .ok_or_else(|| gone("its MachineDeployment"))?;
        let sets: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            namespace,
            &resource(&set_ref.api_version, "MachineSet"),
        );
        let all_sets = sets
            .list(&ListParams::default())
            .await
            .map_err(|e| lookup("the MachineSets", &e))?;
        let machines: Api<Machine> = Api::namespaced(client, namespace);
        let machines = machines
            .list(&ListParams::default())
            .await
            .map_err(|e| lookup("the Machines", &e))?;
        let catalog = self.cache.catalog();
        find_replaced(
            &deployment,
            &set_ref.uid,
            &all_sets.items,
            &machines.items,
            growth,
            taken,
            |m| size_machine(m, &catalog, None).ok(),
        )
    }
}

impl Rollouts {
    /// The `MachineDeployment` that controls the `MachineSet` controlling a new Machine (of
    /// `cluster`, `namespace`, with `owners`), read from the user cluster: `None` when it has
    /// none, or it cannot be read (the Machine is then decided as any Machine is).
    pub async fn deployment_of(
        &self,
        cluster: &str,
        namespace: &str,
        owners: &[OwnerReference],
    ) -> Option<kkp_quota_crds::machine::MachineDeployment> {
        let set_ref = owners::controller(owners, "MachineSet")?;
        let cluster_object = self.cache.cluster(cluster)?;
        let client = {
            let mut clients = self.clients.lock().await;
            let Ok(client) = clients.get(&cluster_object).await else {
                clients.forget(cluster);
                return None;
            };
            client
        };
        // By name, so the UIDs are checked: one re-created under the same name is another, and
        // seed-controller counts the Machine as a member of the one its owners name.
        let set = owners::read(&client, namespace, set_ref, "MachineSet")
            .await
            .ok()??;
        if set.metadata.uid.as_deref() != Some(set_ref.uid.as_str()) {
            return None;
        }
        let deployment_ref =
            owners::controller(set.metadata.owner_references.as_deref()?, "MachineDeployment")?;
        let deployment = owners::read(&client, namespace, deployment_ref, "MachineDeployment")
            .await
            .ok()??;
        if deployment.metadata.uid.as_deref() != Some(deployment_ref.uid.as_str()) {
            return None;
        }
        serde_json::to_value(deployment)
            .and_then(serde_json::from_value)
            .ok()
    }
}

/// The controller owner of `kind` among `owners`, by UID.
fn controller_uid<'a>(owners: Option<&'a [OwnerReference]>, kind: &str) -> Option<&'a str> {
    owners.and_then(|o| owner(o, kind)).map(|o| o.uid.as_str())
}

/// The Machine a new Machine of the `MachineSet` `new_set` replaces (see the module text), from
/// the `MachineDeployment`, every `MachineSet` and every Machine of the namespace.
pub fn find_replaced(
    deployment: &DynamicObject,
    new_set: &str,
    sets: &[DynamicObject],
    machines: &[Machine],
    growth: &ResourceDetails,
    taken: &[String],
    size_of: impl Fn(&Machine) -> Option<ResourceDetails>,
) -> Result<Replaced, SurgeRefusal> {
    let deployment_uid = deployment.uid().unwrap_or_default();
    let name = format!(
        "{}/{}",
        deployment.namespace().unwrap_or_default(),
        deployment.name_any()
    );
    let own_sets: HashSet<String> = sets
        .iter()
        .filter(|s| {
            controller_uid(s.meta().owner_references.as_deref(), "MachineDeployment") == Some(&deployment_uid)
        })
        .filter_map(kube::ResourceExt::uid)
        .collect();
    let live: Vec<(&Machine, &str)> = machines
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none())
        .filter_map(|m| {
            controller_uid(m.metadata.owner_references.as_deref(), "MachineSet")
                .filter(|set| own_sets.contains(*set))
                .map(|set| (m, set))
        })
        .collect();
    let replicas = deployment
        .data
        .pointer("/spec/replicas")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(1);
    if (live.len() as u64) < replicas {
        return Err(SurgeRefusal::NoReplacement(format!(
            "MachineDeployment {name:?} has {} of its {replicas} Machines, so this one adds a Machine rather than replacing one",
            live.len()
        )));
    }
    let mut candidates: Vec<(&Machine, ResourceDetails)> = live
        .iter()
        .filter(|(m, set)| *set != new_set && !taken.contains(&m.uid().unwrap_or_default()))
        .filter_map(|(m, _)| size_of(m).map(|size| (*m, size)))
        .filter(|(_, size)| size.covers(growth))
        .collect();
    candidates.sort_by_key(|(m, _)| (m.metadata.creation_timestamp.clone().map(|t| t.0), m.name_any()));
    let (machine, size) = candidates.into_iter().next().ok_or_else(|| {
        SurgeRefusal::NoReplacement(format!(
            "no Machine of an older MachineSet of MachineDeployment {name:?} at least this large is left to replace"
        ))
    })?;
    Ok(Replaced {
        deployment: name,
        uid: machine.uid().unwrap_or_default(),
        machine: format!(
            "{}/{}",
            machine.namespace().unwrap_or_default(),
            machine.name_any()
        ),
        size,
    })
}

#[cfg(test)]
mod tests;
