//! Clients for user clusters, built from each `Cluster`'s admin kubeconfig Secret on the seed and
//! built again when that kubeconfig changes (KKP rotates it). Used to tell users about denials
//! ([`crate::events`]) and to wake the owners of refused Machines ([`crate::wake`]).

use std::collections::HashMap;

use kkp_quota_crds::kkp::{ADMIN_KUBECONFIG_SECRET, Cluster, KUBECONFIG_KEY};
use kkp_quota_runtime::RuntimeError;
use kkp_quota_runtime::kubeconfig::{client_from_yaml, kubeconfig_from_secret};
use kube::Client;

#[derive(Debug, thiserror::Error)]
pub enum UserClientError {
    #[error("reading the admin kubeconfig of user cluster {cluster:?} on the seed")]
    Kubeconfig {
        cluster: String,
        #[source]
        source: RuntimeError,
    },
    #[error("building a client for user cluster {cluster:?}")]
    Client {
        cluster: String,
        #[source]
        source: RuntimeError,
    },
}

/// One client per user cluster, with the kubeconfig text it was built from.
pub struct UserClients {
    seed: Client,
    clients: HashMap<String, (String, Client)>,
}

impl UserClients {
    pub fn new(seed: Client) -> UserClients {
        UserClients {
            seed,
            clients: HashMap::new(),
        }
    }

    /// The client for `cluster`: the Secret is read every time (the admin kubeconfig can change
    /// under the same name), the client built again only when its text changed.
    pub async fn get(&mut self, cluster: &Cluster) -> Result<Client, UserClientError> {
        let name = cluster.metadata.name.clone().unwrap_or_default();
        let namespace = cluster.control_plane_namespace();
        let text = kubeconfig_from_secret(&self.seed, &namespace, ADMIN_KUBECONFIG_SECRET, KUBECONFIG_KEY)
            .await
            .map_err(|source| UserClientError::Kubeconfig {
                cluster: name.clone(),
                source,
            })?;
        if let Some((known, client)) = self.clients.get(&name)
            && *known == text
        {
            return Ok(client.clone());
        }
        let client = client_from_yaml(&text)
            .await
            .map_err(|source| UserClientError::Client {
                cluster: name.clone(),
                source,
            })?;
        self.clients.insert(name, (text, client.clone()));
        Ok(client)
    }

    /// Forgets the cluster's client after a failed call, so the next one starts afresh.
    pub fn forget(&mut self, cluster: &str) {
        self.clients.remove(cluster);
    }
}
