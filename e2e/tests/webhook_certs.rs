//! `WebhookCerts` are trusted by a real kube-apiserver calling a webhook on loopback.

use std::sync::Arc;
use std::time::Duration;

use e2e::certs::WebhookCerts;
use e2e::{ControlPlane, wait_for};
use k8s_openapi::api::admissionregistration::v1::{
    RuleWithOperations, ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

const DENIAL: &str = "names starting with deny- are refused by the test webhook";

/// A minimal validating webhook: HTTPS, HTTP/1.1, one request per connection.
async fn serve(listener: TcpListener, certs: WebhookCerts) {
    let cert = CertificateDer::from_pem_slice(certs.cert_pem.as_bytes()).expect("cert PEM");
    let key = PrivateKeyDer::from_pem_slice(certs.key_pem.as_bytes()).expect("key PEM");
    let config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            return;
        };
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let Ok(mut tls) = acceptor.accept(tcp).await else {
                return;
            };
            let mut buf = Vec::new();
            let mut chunk = [0u8; 8192];
            let body = loop {
                let Ok(n) = tls.read(&mut chunk).await else { return };
                if n == 0 {
                    return;
                }
                buf.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&buf);
                if let Some(end) = text.find("\r\n\r\n") {
                    let length = text[..end]
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().to_owned())
                        })
                        .and_then(|v| v.parse::<usize>().ok())
                        .unwrap_or(0);
                    if buf.len() >= end + 4 + length {
                        break buf[end + 4..end + 4 + length].to_vec();
                    }
                }
            };
            let review: Value = serde_json::from_slice(&body).expect("AdmissionReview");
            let request = &review["request"];
            let name = request["object"]["metadata"]["name"].as_str().unwrap_or_default();
            let allowed = !name.starts_with("deny-");
            let answer = json!({
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {"uid": request["uid"], "allowed": allowed, "status": {"code": 403, "message": DENIAL}},
            })
            .to_string();
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                answer.len()
            );
            let _ = tls.write_all(response.as_bytes()).await;
            let _ = tls.shutdown().await;
        });
    }
}

fn config_map(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_real_apiserver_calls_a_loopback_webhook_served_with_webhook_certs() {
    let certs = WebhookCerts::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let paths = certs.write_to(&dir.path().join("webhook")).unwrap();
    assert_eq!(std::fs::read_to_string(&paths.ca).unwrap(), certs.ca_pem);
    assert_eq!(std::fs::read_to_string(&paths.key).unwrap(), certs.key_pem);

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(serve(listener, certs.clone()));
    let cp = ControlPlane::start("webhook-certs").await.unwrap();

    let webhook = ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some("e2e-test".to_owned()),
            ..ObjectMeta::default()
        },
        webhooks: Some(vec![ValidatingWebhook {
            name: "configmaps.e2e.kkp-quota.k8c.io".to_owned(),
            client_config: WebhookClientConfig {
                url: Some(format!("https://127.0.0.1:{port}/validate")),
                ca_bundle: Some(certs.ca_bundle()),
                ..WebhookClientConfig::default()
            },
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec![String::new()]),
                api_versions: Some(vec!["v1".to_owned()]),
                operations: Some(vec!["CREATE".to_owned()]),
                resources: Some(vec!["configmaps".to_owned()]),
                scope: Some("Namespaced".to_owned()),
            }]),
            side_effects: "None".to_owned(),
            admission_review_versions: vec!["v1".to_owned()],
            failure_policy: Some("Fail".to_owned()),
            timeout_seconds: Some(5),
            ..ValidatingWebhook::default()
        }]),
    };
    let pp = PostParams::default();
    Api::<ValidatingWebhookConfiguration>::all(cp.client())
        .create(&pp, &webhook)
        .await
        .unwrap();

    // The configuration takes effect asynchronously: retry until a denial comes back from the
    // webhook (a TLS failure would surface as a different error, never as our message).
    let configmaps: Api<ConfigMap> = Api::namespaced(cp.client(), "default");
    let mut attempt = 0;
    let message = wait_for(Duration::from_secs(30), "the webhook to deny deny-*", || {
        attempt += 1;
        let (configmaps, pp) = (configmaps.clone(), pp.clone());
        async move {
            match configmaps
                .create(&pp, &config_map(&format!("deny-{attempt}")))
                .await
            {
                Err(kube::Error::Api(status)) if status.message.contains(DENIAL) => Some(Ok(status.message)),
                Err(kube::Error::Api(status)) if status.message.contains("failed calling webhook") => {
                    Some(Err(status.message))
                }
                _ => None,
            }
        }
    })
    .await
    .unwrap();
    let message = message.unwrap_or_else(|e| panic!("the apiserver could not call the webhook: {e}"));
    assert!(
        message.contains("e2e-test") || message.contains("configmaps.e2e"),
        "{message}"
    );
    configmaps.create(&pp, &config_map("allowed")).await.unwrap();
    server.abort();
}
