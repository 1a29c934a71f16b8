//! The self-managed webhook certificate rotates while the webhook pods serve: seed-controller
//! stages a new CA in every user cluster's webhook configuration, serves the new certificate
//! once that CA is trusted, the kubelet updates the mounted Secret, the webhook re-reads it, and
//! no Machine create fails on the way.

use std::path::Path;
use std::time::{Duration, Instant};

use e2e::node::chart::WEBHOOK_CLUSTER_IP;
use e2e::wait_for;

use super::{Burst, secret_certificate};

/// `--set` values: each certificate lives 2 minutes, the next is staged after 80 s and served
/// 20 s after that.
pub const SHORT_CERTIFICATES: [&str; 2] = [
    "machineWebhook.certificate.selfManaged.validity=2m",
    "machineWebhook.certificate.selfManaged.overlap=20s",
];

#[allow(clippy::unwrap_used, reason = "a test helper: a panic is the failure report")]
pub async fn the_certificate_rotates_while_the_pods_serve(
    fleet: &e2e::Fleet,
    client: &kube::Client,
    node_dir: &Path,
) {
    let burst = Burst::start(fleet, "rotation");
    let before = secret_certificate(client).await.unwrap();
    let started = Instant::now();
    let rotated = wait_for(
        Duration::from_mins(3),
        "a new certificate in the Secret",
        || async { secret_certificate(client).await.filter(|c| *c != before) },
    )
    .await
    .unwrap();
    println!(
        "rotation: a new certificate in the Secret after {:?}",
        started.elapsed()
    );
    let want = fingerprint(&rotated);
    wait_for(
        Duration::from_mins(2),
        "the webhook Service serving it",
        || async {
            (served_certificate().await.map(|pem| fingerprint(&pem)) == Some(want.clone())).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#} (kubelet log: {})", node_dir.join("kubelet.log").display()));
    println!(
        "rotation: served through the Service after {:?}",
        started.elapsed()
    );
    burst.stop_expecting_no_failure().await;
}

/// SHA-256 fingerprint of the first certificate in `pem`, as openssl prints it.
fn fingerprint(pem: &str) -> String {
    x509(pem, &["-fingerprint", "-sha256"])
}

/// `openssl x509 -noout <args>` of the first certificate in `pem`.
pub fn x509(pem: &str, args: &[&str]) -> String {
    let mut child = std::process::Command::new("openssl")
        .args(["x509", "-noout"])
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("openssl");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), pem.as_bytes()).unwrap();
    String::from_utf8_lossy(&child.wait_with_output().unwrap().stdout)
        .trim()
        .to_owned()
}

/// The certificate served at the webhook Service's `ClusterIP` (PEM).
pub async fn served_certificate() -> Option<String> {
    let out = tokio::process::Command::new("openssl")
        .args(["s_client", "-connect", &format!("{WEBHOOK_CLUSTER_IP}:443")])
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let start = text.find("-----BEGIN CERTIFICATE-----")?;
    let end = text[start..].find("-----END CERTIFICATE-----")? + start + "-----END CERTIFICATE-----".len();
    Some(text[start..end].to_owned())
}
