//! The `machine-webhook` binary itself: flags, start-up against a real seed, `/readyz` only once
//! synced, `/metrics` with the agreed names, HTTPS admission answers.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Result;
use common::*;
use e2e::wait_for;

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the binary against the seed of `kubeconfig`, admission on `https`, ops on `ops`.
fn spawn_webhook(kubeconfig: &std::path::Path, certs: &Certs, https: u16, ops: u16) -> Result<Killed> {
    Ok(Killed(
        Command::new(env!("CARGO_BIN_EXE_machine-webhook"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--listen-address", &format!("127.0.0.1:{https}")])
            .arg("--tls-cert-file")
            .arg(&certs.paths.cert)
            .arg("--tls-key-file")
            .arg(&certs.paths.key)
            .args(["--metrics-address", &format!("127.0.0.1:{ops}")])
            .arg("--url-signing-keys")
            .arg(&certs.keys)
            .env("MACHINE_WEBHOOK_LOG_JSON", "true")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_admission_metrics_and_readiness() -> Result<()> {
    let seed = e2e::ControlPlane::start("bin-seed").await?;
    let certs = certs()?;
    let (https, ops) = (e2e::ports::free_port()?, e2e::ports::free_port()?);
    let _child = spawn_webhook(&seed.kubeconfig_path(), &certs, https, ops)?;
    let http = reqwest::Client::new();
    wait_for(Duration::from_secs(30), "/readyz to answer 200", || {
        let http = http.clone();
        async move {
            http.get(format!("http://127.0.0.1:{ops}/readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        }
    })
    .await?;
    let metrics = http
        .get(format!("http://127.0.0.1:{ops}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    for name in [
        "kkp_quota_admissions_total",
        "kkp_quota_admission_duration_seconds",
        "kkp_quota_reservation_conflicts_total",
        "kkp_quota_reservation_writes_total",
        "kkp_quota_reservation_wait_seconds",
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics");
    }
    // Admission requests over HTTPS without valid credentials: refused before any decision.
    let https_client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(certs.webhook.ca_pem.as_bytes())?)
        .build()?;
    let body = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "resource": {"group": "cluster.k8s.io", "version": "v1alpha1", "resource": "machines"},
            "name": "m",
            "namespace": NS,
            "operation": "CREATE",
            "object": serde_json::to_value(machine("m", 1))?
        }
    });
    let keys = kkp_quota_runtime::webhook_auth::SigningKeys::load(&certs.keys)?;
    for (path, status) in [
        ("ghost".to_owned(), 401),
        (format!("ghost/{}", keys.sign("ghost", "any-uid")), 403),
    ] {
        let response = https_client
            .post(format!("https://127.0.0.1:{https}/validate/machines/{path}"))
            .json(&body)
            .send()
            .await?;
        assert_eq!(response.status().as_u16(), status, "{path}");
        assert!(
            !response.text().await?.contains("allowed"),
            "no decision for {path}"
        );
    }
    let metrics = http
        .get(format!("http://127.0.0.1:{ops}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    for line in [
        r#"kkp_quota_webhook_auth_failures_total{reason="missing_token"} 1"#,
        r#"kkp_quota_webhook_auth_failures_total{reason="unknown_cluster"} 1"#,
        r#"kkp_quota_admissions_total{reason="unknown_cluster",result="denied"} 0"#,
    ] {
        assert!(metrics.contains(line), "{line} not in /metrics:\n{metrics}");
    }
    Ok(())
}

/// Without URL-signing keys the binary does not start, unless told to run without
/// authentication; a key file that does not load stops it too.
#[test]
fn the_binary_refuses_to_start_without_keys() -> Result<()> {
    let certs = certs()?;
    let run = |extra: &[&str]| -> Result<(bool, String)> {
        let output = Command::new(env!("CARGO_BIN_EXE_machine-webhook"))
            .args(["--kubeconfig", "/nonexistent/kubeconfig"])
            .arg("--tls-cert-file")
            .arg(&certs.paths.cert)
            .arg("--tls-key-file")
            .arg(&certs.paths.key)
            .args(extra)
            .env_remove("MACHINE_WEBHOOK_URL_SIGNING_KEYS")
            .env_remove("MACHINE_WEBHOOK_INSECURE_NO_AUTH")
            .output()?;
        Ok((
            output.status.success(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        ))
    };
    let (ok, stderr) = run(&[])?;
    assert!(!ok);
    assert!(stderr.contains("--url-signing-keys"), "{stderr}");
    let short = certs.dir.path().join("short-key");
    std::fs::write(&short, "c2hvcnQ=\n")?;
    let (ok, stderr) = run(&["--url-signing-keys", short.to_str().unwrap_or_default()])?;
    assert!(!ok);
    assert!(stderr.contains("line 1: key is 5 bytes, at least 32"), "{stderr}");
    let (_, stderr) = run(&["--insecure-no-auth", "--url-signing-keys", "x"])?;
    assert!(stderr.contains("cannot be used with"), "{stderr}");
    Ok(())
}

/// Stopped with SIGTERM (as Kubernetes stops a Pod), the binary records what it admitted from
/// its allotment and gives the allotment back before it exits, so a rolling update does not
/// leave headroom held until the allotment expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_records_admissions_and_gives_the_allotment_back() -> Result<()> {
    let fleet = fleet().await?;
    let seed = fleet.seed(SEED);
    let alpha = fleet.user_cluster("alpha").client();
    let certs = certs()?;
    write_quota(seed.client(), PROJECT, "16", "6").await?;
    let (https, ops) = (e2e::ports::free_port()?, e2e::ports::free_port()?);
    let mut child = spawn_webhook(&seed.kubeconfig_path(), &certs, https, ops)?;
    register(
        &seed.client(),
        alpha.clone(),
        "alpha",
        format!("127.0.0.1:{https}").parse()?,
        &certs,
    )
    .await?;
    let api = machines(alpha.clone());
    // The first create waits for the write that reserves it and takes the allotment; the second
    // is admitted from the allotment and not recorded yet.
    let first = api
        .create(&kube::api::PostParams::default(), &machine("first", 1))
        .await?;
    let second = api
        .create(&kube::api::PostParams::default(), &machine("second", 1))
        .await?;
    let (_, allotments) = ledger(seed.client(), PROJECT).await?;
    assert_eq!(allotments.len(), 1, "{allotments:?}");
    let metrics = reqwest::get(format!("http://127.0.0.1:{ops}/metrics"))
        .await?
        .text()
        .await?;
    assert!(
        metrics.contains("kkp_quota_allotment_admissions_total 1"),
        "the second Machine was not admitted from the allotment"
    );
    let status = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()?;
    assert!(status.success());
    let exit = tokio::task::spawn_blocking(move || child.0.wait()).await??;
    assert!(exit.success(), "{exit}");
    let (reserved, allotments) = ledger(seed.client(), PROJECT).await?;
    assert!(allotments.is_empty(), "allotment left behind: {allotments:?}");
    let uids: Vec<&str> = reserved.iter().map(|r| r.uid.as_str()).collect();
    assert_eq!(
        uids,
        [first.metadata.uid.as_deref(), second.metadata.uid.as_deref()].map(Option::unwrap_or_default)
    );
    Ok(())
}
