//! The self-managed webhook certificate (`--webhook-certificate-secret`), as the binary keeps it
//! in a real API server: issued into the empty Secret the chart creates, then rotated in two
//! steps. At every version of the Secret the test sees (as a kubelet syncing it to pods would),
//! the served certificate is trusted by the CA bundle of that same version, and a new
//! certificate is served only after its CA has been in the bundle for the overlap.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use rustls::client::danger::ServerCertVerifier as _;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use seed_controller::webhook_cert::{CA_KEY, CERT_KEY, NEXT_CERT_KEY};

const DNS_NAME: &str = "kkp-quota-machine-webhook.kubermatic.svc";
const OVERLAP: Duration = Duration::from_secs(3);

fn pems(bytes: &[u8]) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(bytes)
        .map(Result::unwrap)
        .collect()
}

/// Whether `cert` (PEM) is valid for [`DNS_NAME`] under the CAs in `bundle` (PEM).
fn trusted(bundle: &[u8], cert: &[u8]) -> Result<(), String> {
    trusted_by(pems(bundle), cert)
}

/// Whether `cert` (PEM) is valid for [`DNS_NAME`] under the CAs `cas`.
fn trusted_by(cas: Vec<CertificateDer<'static>>, cert: &[u8]) -> Result<(), String> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in cas {
        roots.add(ca).map_err(|e| e.to_string())?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| e.to_string())?;
    let leaf = pems(cert).into_iter().next().ok_or("no certificate")?;
    let name = ServerName::try_from(DNS_NAME).unwrap();
    verifier
        .verify_server_cert(&leaf, &[], &name, &[], UnixTime::now())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_certificate_is_issued_and_rotated_without_a_distrusted_moment() {
    init_logs();
    let seed_cp = e2e::ControlPlane::start("seed").await.unwrap();
    let seed = seed_cp.client();
    ensure_namespace(&seed, "kubermatic").await;
    let secrets: Api<Secret> = Api::namespaced(seed.clone(), "kubermatic");
    let empty = Secret {
        metadata: ObjectMeta {
            name: Some("kkp-quota-webhook-tls".into()),
            ..ObjectMeta::default()
        },
        ..Secret::default()
    };
    secrets.create(&PostParams::default(), &empty).await.unwrap();

    let ca_file = tempfile::NamedTempFile::new().unwrap();
    let _child = tokio::process::Command::new(env!("CARGO_BIN_EXE_seed-controller"))
        .args([
            &format!("--kubeconfig={}", seed_cp.kubeconfig_path().display()),
            "--seed-name=seed",
            "--metrics-address=127.0.0.1:0",
            "--leader-elect=false",
            "--webhook-certificate-secret=kkp-quota-webhook-tls",
            &format!("--webhook-certificate-dns-names={DNS_NAME}"),
            // Stage 4 s after issuing (two thirds of 12 s), serve the new one 3 s later.
            "--webhook-certificate-validity=12s",
            &format!("--webhook-certificate-overlap={}s", OVERLAP.as_secs()),
            // The CA file may be empty at start (the Secret's key not synced yet).
            &format!("--webhook-ca-file={}", ca_file.path().display()),
            "--webhook-url=https://127.0.0.1:1",
            "--insecure-no-auth",
        ])
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    // Follow every version, as a kubelet would, until two promotions have been seen.
    let config = watcher::Config::default().fields("metadata.name=kkp-quota-webhook-tls");
    let mut versions = watcher::watcher(secrets, config).applied_objects().boxed();
    let deadline = Instant::now() + Duration::from_mins(1);
    let mut served: Vec<Vec<u8>> = Vec::new();
    // When each CA (by its PEM) was first seen in the bundle.
    let mut ca_seen: Vec<(Vec<u8>, Instant)> = Vec::new();
    while served.len() < 3 {
        let next = tokio::time::timeout_at(deadline.into(), versions.next()).await;
        let secret = next.expect("two rotations within a minute").unwrap().unwrap();
        let Some(data) = secret.data else { continue };
        let (Some(bundle), Some(cert)) = (data.get(CA_KEY), data.get(CERT_KEY)) else {
            continue;
        };
        trusted(&bundle.0, &cert.0)
            .unwrap_or_else(|e| panic!("served certificate not trusted by its bundle: {e}"));
        for ca in pems(&bundle.0) {
            if !ca_seen.iter().any(|(seen, _)| *seen == ca.as_ref()) {
                ca_seen.push((ca.as_ref().to_vec(), Instant::now()));
            }
        }
        if let Some(staged) = data.get(NEXT_CERT_KEY) {
            trusted(&bundle.0, &staged.0).expect("a staged certificate's CA is in the bundle");
        }
        if served.last() != Some(&cert.0) {
            if !served.is_empty() {
                // A promotion: the CA that signed it was published at least the overlap ago.
                let signer_seen = ca_seen
                    .iter()
                    .filter(|(ca, _)| trusted_by(vec![CertificateDer::from(ca.clone())], &cert.0).is_ok())
                    .map(|(_, at)| *at)
                    .next()
                    .expect("the new certificate's CA was seen in the bundle");
                let trusted_for = signer_seen.elapsed();
                // The watch may deliver the staging a little late; never by a whole second.
                assert!(
                    trusted_for + Duration::from_secs(1) >= OVERLAP,
                    "served {trusted_for:?} after its CA was published (overlap {OVERLAP:?})"
                );
            }
            served.push(cert.0.clone());
        }
    }
}
