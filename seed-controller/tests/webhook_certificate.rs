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
use serde_json::json;
use tokio_util::task::AbortOnDropHandle;

const DNS_NAME: &str = "kkp-quota-machine-webhook.kubermatic.svc";
const OVERLAP: Duration = Duration::from_secs(3);

fn pems(bytes: &[u8]) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(bytes)
        .map(Result::unwrap)
        .collect()
}

/// The Secret `kkp-quota-webhook-tls` in `kubermatic`, created empty (as the chart does).
async fn empty_certificate_secret(seed: &kube::Client) -> Api<Secret> {
    let secrets: Api<Secret> = Api::namespaced(seed.clone(), "kubermatic");
    let empty = Secret {
        metadata: ObjectMeta {
            name: Some("kkp-quota-webhook-tls".into()),
            ..ObjectMeta::default()
        },
        ..Secret::default()
    };
    secrets.create(&PostParams::default(), &empty).await.unwrap();
    secrets
}

/// Whether `cert` (PEM) is valid for [`DNS_NAME`] under the CAs in `bundle` (PEM).
fn trusted(bundle: &[u8], cert: &[u8]) -> Result<(), String> {
    trusted_by(pems(bundle), cert)
}

/// Whether `cert` (PEM) is valid for [`DNS_NAME`] under the CAs `cas`.
fn trusted_by(cas: Vec<CertificateDer<'static>>, cert: &[u8]) -> Result<(), String> {
    trusted_for(cas, cert, DNS_NAME)
}

/// Whether `cert` (PEM) is valid for `name` under the CAs `cas`.
fn trusted_for(cas: Vec<CertificateDer<'static>>, cert: &[u8], name: &str) -> Result<(), String> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in cas {
        roots.add(ca).map_err(|e| e.to_string())?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| e.to_string())?;
    let leaf = pems(cert).into_iter().next().ok_or("no certificate")?;
    let name = ServerName::try_from(name).map_err(|e| e.to_string())?;
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
    let secrets = empty_certificate_secret(&seed).await;

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

/// A TLS handshake with the server on 127.0.0.1:`port`, as a client that trusts the CAs in
/// `bundle` does it (a fresh connection, so the certificate served now is the one checked).
fn handshake(port: u16, bundle: &[u8]) -> Result<(), String> {
    handshake_under(port, pems(bundle))
}

/// [`handshake`] as a client that trusts only the CAs `cas`.
fn handshake_under(port: u16, cas: Vec<CertificateDer<'static>>) -> Result<(), String> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in cas {
        roots.add(ca).map_err(|e| e.to_string())?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let mut connection = rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| e.to_string())?;
    let mut socket = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    while connection.is_handshaking() {
        connection.complete_io(&mut socket).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// A kubelet's part, played by the test: every version of the Secret reaches the files, each
/// file replaced whole, as the kubelet's atomic writer does. With `after_webhook_on` (the
/// webhook's port), a version reaches them only once the webhook there serves its certificate:
/// this pod's kubelet syncs after the webhook pod's, the order in which a certificate whose CA
/// the user clusters do not trust yet would be served (without the overlap).
fn sync_secret_to_files(
    secrets: Api<Secret>,
    dir: std::path::PathBuf,
    after_webhook_on: Option<u16>,
) -> AbortOnDropHandle<()> {
    AbortOnDropHandle::new(tokio::spawn(async move {
        let config = watcher::Config::default().fields("metadata.name=kkp-quota-webhook-tls");
        let mut versions = watcher::watcher(secrets, config).applied_objects().boxed();
        while let Some(Ok(secret)) = versions.next().await {
            let data = secret.data.unwrap_or_default();
            if let (Some(port), Some(cert), Some(bundle)) =
                (after_webhook_on, data.get(CERT_KEY), data.get(CA_KEY))
            {
                // The CA that signed this version's certificate: a handshake trusting it alone
                // succeeds once the webhook serves that certificate.
                let signer = pems(&bundle.0)
                    .into_iter()
                    .find(|ca| trusted_for(vec![ca.clone()], &cert.0, "127.0.0.1").is_ok());
                if let Some(signer) = signer {
                    // The handshake blocks: off the runtime's two workers, which also run the
                    // webhook that must answer it.
                    e2e::wait_for(WAIT, "the webhook serving the new certificate", || {
                        let signer = signer.clone();
                        async move {
                            tokio::task::spawn_blocking(move || handshake_under(port, vec![signer]))
                                .await
                                .map_err(|e| e.to_string())
                                .flatten()
                        }
                    })
                    .await
                    .unwrap();
                }
            }
            for (key, value) in data {
                let tmp = dir.join(format!(".{key}.tmp"));
                std::fs::write(&tmp, &value.0).unwrap();
                std::fs::rename(&tmp, dir.join(&key)).unwrap();
            }
        }
    }))
}

/// The whole path of a rotation: seed-controller rotates the certificate in the Secret, a
/// stand-in kubelet brings it to each pod's files (to the webhook's at once, to
/// seed-controller's once the webhook serves it: kubelets sync pods at different times, and
/// this is the order that needs the overlap), machine-webhook serves
/// the new certificate from its files and seed-controller writes the new CA into the user
/// cluster's webhook configuration. The user cluster's API server calls the webhook for every
/// Machine throughout two rotations, and not one call fails. The API server keeps its
/// connections, so the test also opens a new one each round and checks the certificate served
/// then against the CA bundle the user cluster has then. (With no overlap, that fails: the
/// webhook would serve a certificate whose CA the user cluster does not trust yet.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_goes_on_through_rotations_of_the_self_managed_certificate() {
    init_logs();
    let (seed_cp, alpha_cp) = seed_with_alpha("1000").await;
    let seed = seed_cp.client();
    let secrets = empty_certificate_secret(&seed).await;
    let (files, controller_files) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let port = e2e::system::free_port().unwrap();
    let _webhook_pod = sync_secret_to_files(secrets.clone(), files.path().to_path_buf(), None);
    // The overlap has to cover the slower pod's sync, seed-controller's 1 s look at the CA file
    // and the write to the user clusters; the chart's default is 10 minutes against a kubelet's
    // minute or so.
    let overlap = Duration::from_secs(4);
    let _controller_pod =
        sync_secret_to_files(secrets.clone(), controller_files.path().to_path_buf(), Some(port));
    let keys = files.path().join("url-signing-keys");
    e2e::system::write_url_signing_keys(&keys, &[&kkp_quota_runtime::webhook_auth::generate_key()]).unwrap();

    let mut config = seed_controller::Config::for_tests("seed");
    config.webhook_url = Some(format!("https://127.0.0.1:{port}"));
    config.webhook_ca_file = Some(controller_files.path().join(CA_KEY));
    config.url_signing_keys = Some(keys.clone());
    config.webhook_certificate_secret = Some("kkp-quota-webhook-tls".into());
    config.webhook_certificate_dns_names = vec!["127.0.0.1".into()];
    config.webhook_certificate_validity = Duration::from_secs(16);
    config.webhook_certificate_overlap = overlap;
    let _controller = start_controller(&seed_cp, config).await;

    // The webhook starts once its files exist (a pod would restart until then).
    let (cert, key) = (files.path().join(CERT_KEY), files.path().join("tls.key"));
    e2e::wait_for(WAIT, "the first certificate in the files", || async {
        cert.exists() && key.exists()
    })
    .await
    .unwrap();
    let mut webhook_config =
        machine_webhook::Config::new(format!("127.0.0.1:{port}").parse().unwrap(), cert, key);
    webhook_config.auth = Some(machine_webhook::AuthConfig::UrlSigningKeys(keys));
    let webhook = machine_webhook::Webhook::start(webhook_config, seed.clone())
        .await
        .unwrap();
    let _webhook = AbortOnDropHandle::new(tokio::spawn(webhook.run()));

    // Machines are created one after another until the Secret has served three certificates;
    // each is decided by the webhook (a Machine it cannot size is refused by it, by name).
    let machines: Api<kkp_quota_crds::machine::Machine> = Api::namespaced(alpha_cp.client(), "kube-system");
    let unsizeable = json!({"cloudProvider": "aws", "cloudProviderSpec": {"instanceType": "t9.none"}});
    e2e::wait_for(WAIT, "the webhook configuration in effect", || async {
        let dry = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        let probe = common::machine("probe", &unsizeable);
        matches!(machines.create(&dry, &probe).await, Err(kube::Error::Api(e)) if e.message.contains("sized"))
    })
    .await
    .unwrap();
    let configurations =
        Api::<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration>::all(
            alpha_cp.client(),
        );
    let mut served = Vec::new();
    let deadline = Instant::now() + Duration::from_mins(1);
    let mut calls = 0;
    while served.len() < 3 {
        assert!(Instant::now() < deadline, "two rotations within a minute");
        let dry = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        let refused = machines
            .create(&dry, &common::machine("probe", &unsizeable))
            .await
            .unwrap_err();
        assert!(
            matches!(&refused, kube::Error::Api(e) if e.message.contains("sized")),
            "call {calls} did not reach the webhook: {refused}"
        );
        calls += 1;
        let configuration = configurations.get("kkp-quota-machines").await.unwrap();
        let bundle = configuration.webhooks.unwrap()[0]
            .client_config
            .ca_bundle
            .clone()
            .unwrap();
        handshake(port, &bundle.0).unwrap_or_else(|e| panic!("a new connection after {calls} calls: {e}"));
        let current = std::fs::read(files.path().join(CERT_KEY)).unwrap();
        if served.last() != Some(&current) {
            served.push(current);
        }
    }
    tracing::info!(calls, "admission calls through two rotations");
}
