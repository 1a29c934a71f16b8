//! Clients from kubeconfigs: the seeds' (in Secrets on the master) and the user clusters' (in
//! Secrets on the seed).

use k8s_openapi::api::core::v1::Secret;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

use super::RuntimeError;

/// A client for the cluster a kubeconfig (YAML text) points at, using its current context.
pub async fn client_from_yaml(text: &str) -> Result<Client, RuntimeError> {
    let kubeconfig = Kubeconfig::from_yaml(text).map_err(RuntimeError::KubeconfigYaml)?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(RuntimeError::KubeconfigContext)?;
    Ok(Client::try_from(config)?)
}

/// A client for this process's own cluster: `--kubeconfig` when given, else the usual inference
/// (`KUBECONFIG`, `~/.kube/config`, in-cluster service account).
pub async fn own_client(kubeconfig: Option<&std::path::Path>) -> Result<Client, RuntimeError> {
    match kubeconfig {
        Some(path) => client_from_yaml(&tokio::fs::read_to_string(path).await?).await,
        None => Ok(Client::try_default().await?),
    }
}

/// The kubeconfig text stored under `key` in a Secret (KKP keeps seed and user-cluster
/// kubeconfigs this way, key `kubeconfig`). Returned as text so callers can notice rotation.
pub async fn kubeconfig_from_secret(
    client: &Client,
    namespace: &str,
    name: &str,
    key: &str,
) -> Result<String, RuntimeError> {
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get(name)
        .await?;
    let missing = || RuntimeError::MissingSecretKey {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        key: key.to_owned(),
    };
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .ok_or_else(missing)?;
    String::from_utf8(bytes.0.clone()).map_err(|_| RuntimeError::KubeconfigNotUtf8 {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    })
}
