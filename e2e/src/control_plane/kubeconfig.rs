//! A control plane's credentials on disk and as kubeconfig text: the PKI files kube-apiserver
//! reads, and kubeconfigs for the admin, another user or a token.

use std::path::Path;

use anyhow::{Context, Result};
use base64::Engine as _;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::certs::{CertPem, ClusterCerts};

pub(super) fn write_pki(dir: &Path, certs: &ClusterCerts) -> Result<()> {
    let pki = dir.join("pki");
    std::fs::create_dir_all(&pki)?;
    for (file, text) in [
        ("ca.crt", certs.ca.cert_pem()),
        ("apiserver.crt", &certs.serving.cert),
        ("apiserver.key", &certs.serving.key),
        ("sa.key", &certs.service_account_key),
        ("sa.pub", &certs.service_account_pub),
    ] {
        std::fs::write(pki.join(file), text).with_context(|| format!("writing {file}"))?;
    }
    Ok(())
}

/// The admin's kubeconfig (client certificate in `system:masters`) for the API server at `server`.
pub(super) fn admin_kubeconfig(name: &str, server: &str, certs: &ClusterCerts) -> Result<String> {
    let credentials = client_cert_credentials(&certs.admin);
    kubeconfig_yaml(
        name,
        server,
        certs.ca.cert_pem(),
        &format!("{name}-admin"),
        &credentials,
    )
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// A kubeconfig user entry that presents a client certificate.
pub(super) fn client_cert_credentials(client: &CertPem) -> serde_json::Value {
    serde_json::json!({
        "client-certificate-data": b64(&client.cert),
        "client-key-data": b64(&client.key),
    })
}

/// A kubeconfig for the API server at `server`, trusting `ca_pem`, as the user entry `user` with
/// `credentials` (a client certificate, or a token).
pub(super) fn kubeconfig_yaml(
    name: &str,
    server: &str,
    ca_pem: &str,
    user: &str,
    credentials: &serde_json::Value,
) -> Result<String> {
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {
            "server": server,
            "certificate-authority-data": b64(ca_pem),
        }}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": user}}],
        "current-context": name,
    });
    Ok(serde_saphyr::to_string(&doc)?)
}

/// A `kube::Config` from kubeconfig text.
pub async fn kube_config(kubeconfig_yaml: &str) -> Result<kube::Config> {
    let kubeconfig = Kubeconfig::from_yaml(kubeconfig_yaml).context("parsing kubeconfig")?;
    Ok(kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?)
}

/// A `kube::Client` from kubeconfig text (for example a kubeconfig read from a Secret).
pub async fn client_from_kubeconfig(kubeconfig_yaml: &str) -> Result<kube::Client> {
    Ok(kube::Client::try_from(kube_config(kubeconfig_yaml).await?)?)
}
