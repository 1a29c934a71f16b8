//! Bad input over HTTPS never breaks the server: every case gets a clear 4xx or a denial, and the
//! server keeps answering afterwards. On a real seed, with a valid URL token (so the checks after
//! authentication are reached).

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use common::*;
use e2e::wait_for;
use kkp_quota_crds::kkp::{Cluster, ClusterSpec, PROJECT_ID_LABEL};
use kube::api::{Api, DeleteParams, PostParams};
use machine_webhook::server::Limits;
use machine_webhook::{AuthConfig, Config, Webhook};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const LIMITS: Limits = Limits {
    max_body_bytes: 3 * 1024 * 1024,
    header_read_timeout: Duration::from_secs(1),
    body_read_timeout: Duration::from_secs(1),
};

fn review(object: &Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "bad-input",
            "resource": {"group": "cluster.k8s.io", "version": "v1alpha1", "resource": "machines"},
            "name": object["metadata"]["name"],
            "namespace": NS,
            "operation": "CREATE",
            "object": object,
            "dryRun": true,
        }
    })
}

fn vsphere(name: &str, spec: &Value) -> Value {
    json!({"apiVersion": "cluster.k8s.io/v1alpha1", "kind": "Machine",
        "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}")},
        "spec": {"providerSpec": {"value": {"cloudProvider": "vsphere", "cloudProviderSpec": spec}}}})
}

async fn post(http: &reqwest::Client, url: &str, body: Vec<u8>) -> Result<(u16, String)> {
    let response = http
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await?;
    Ok((response.status().as_u16(), response.text().await?))
}

/// A TLS connection to the webhook, trusting the test CA.
async fn tls(
    address: SocketAddr,
    ca_pem: &str,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(address).await?;
    Ok(connector
        .connect(rustls::pki_types::ServerName::try_from("127.0.0.1")?, tcp)
        .await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// One server, many cases in sequence; each block is commented.
#[allow(clippy::too_many_lines)]
async fn bad_input_gets_a_clear_answer_and_never_breaks_the_server() -> Result<()> {
    let fleet = fleet().await?;
    let seed = fleet.seed(SEED).client();
    let certs = certs()?;
    write_quota(seed.clone(), PROJECT, "16", "0").await?;
    let mut config = Config::new(
        "127.0.0.1:0".parse()?,
        certs.paths.cert.clone(),
        certs.paths.key.clone(),
    );
    config.auth = Some(AuthConfig::UrlSigningKeys(certs.keys.clone()));
    config.limits = LIMITS;
    let webhook = Webhook::start(config, seed.clone()).await?;
    let (address, readiness, metrics) = (
        webhook.address,
        webhook.readiness.clone(),
        webhook.metrics.clone(),
    );
    let _task = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(webhook.run()));
    wait_for(Duration::from_secs(30), "the webhook to be ready", || {
        let ready = readiness.is_ready();
        async move { ready }
    })
    .await?;
    let url = admission_url(&seed, address, "alpha", &certs).await?;
    let http = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(certs.webhook.ca_pem.as_bytes())?)
        .build()?;
    let fits = serde_json::to_vec(&review(&vsphere(
        "ok",
        &json!({"cpus": 2, "memoryMB": 2048, "diskSizeGB": 10}),
    )))?;

    // Not JSON, the wrong kind or version, no request, nesting deeper than 128: 400.
    let deep = format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u","operation":"CREATE","object":{}{}}}}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    for (what, body, expect) in [
        (
            "not JSON",
            b"GET / HTTP/1.1 \x00\xff".to_vec(),
            "not an AdmissionReview",
        ),
        ("empty", Vec::new(), "not an AdmissionReview"),
        (
            "wrong version",
            serde_json::to_vec(
                &json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {"uid": "u", "operation": "CREATE"}}),
            )?,
            "expected apiVersion",
        ),
        (
            "wrong kind",
            serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "Machine"}))?,
            "expected apiVersion",
        ),
        (
            "no request",
            serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}))?,
            "no request",
        ),
        ("deep", deep.into_bytes(), "recursion limit"),
    ] {
        let (status, text) = post(&http, &url, body).await?;
        assert_eq!(status, 400, "{what}: {text}");
        assert!(text.contains(expect), "{what}: {text}");
    }

    // Too large: 413, whether announced by Content-Length or streamed without one.
    let (status, _) = post(&http, &url, vec![b' '; LIMITS.max_body_bytes + 1]).await?;
    assert_eq!(status, 413);
    let path = url.trim_start_matches(&format!("https://{address}")).to_owned();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    let chunk = format!("10000\r\n{}\r\n", " ".repeat(0x10000));
    let (answer, _) = raw(
        address,
        &certs.webhook.ca_pem,
        &head,
        &vec![chunk; 64],
        Duration::ZERO,
    )
    .await?;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    // Huge but within the limit (unknown fields ignored): decided normally.
    let mut huge = review(&vsphere(
        "huge",
        &json!({"cpus": 2, "memoryMB": 2048, "diskSizeGB": 10}),
    ));
    huge["request"]["object"]["metadata"]["annotations"] = json!({"padding": "x".repeat(2 * 1024 * 1024)});
    huge["request"]["unknownField"] = json!((0..50_000).collect::<Vec<u32>>());
    let (status, text) = post(&http, &url, serde_json::to_vec(&huge)?).await?;
    assert_eq!(status, 200, "{text}");
    let answer: Value = serde_json::from_str(&text)?;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");

    // Absurd quantities: a denial that says which field.
    for (spec, field) in [
        (json!({"cpus": 1e30, "memoryMB": 2048, "diskSizeGB": 10}), "cpus"),
        (
            json!({"cpus": 2, "memoryMB": 2048, "diskSizeGB": -10}),
            "diskSizeGB",
        ),
        (
            json!({"cpus": 2, "memoryMB": 1e300, "diskSizeGB": 10}),
            "memoryMB",
        ),
    ] {
        let (status, text) = post(
            &http,
            &url,
            serde_json::to_vec(&review(&vsphere("absurd", &spec)))?,
        )
        .await?;
        assert_eq!(status, 200, "{text}");
        let answer: Value = serde_json::from_str(&text)?;
        assert_eq!(answer["response"]["allowed"], false, "{answer}");
        let message = answer["response"]["status"]["message"]
            .as_str()
            .unwrap_or_default();
        assert!(message.contains(field), "{message}");
    }

    // A body that trickles in: 408 once the body read timeout passes.
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    );
    let (answer, took) = raw(
        address,
        &certs.webhook.ca_pem,
        &head,
        &vec![" ".to_owned(); 100],
        Duration::from_millis(300),
    )
    .await?;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(took < Duration::from_secs(10), "{took:?}");

    // Headers that never end (slowloris): the connection is closed after the header timeout.
    let mut stream = tls(address, &certs.webhook.ca_pem).await?;
    stream
        .write_all(
            format!(
                "POST {} HTTP/1.1\r\nHost: x\r\nX-Slow: ",
                url.trim_start_matches(&format!("https://{address}"))
            )
            .as_bytes(),
        )
        .await?;
    stream.flush().await?;
    let started = Instant::now();
    let mut buffer = [0u8; 1024];
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "the server kept a connection with unfinished headers open for 10 s"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );

    // A Machine of a cluster whose Cluster object is gone: 403, nothing decided.
    let clusters: Api<Cluster> = Api::all(seed.clone());
    let mut temporary = Cluster::new("temporary", ClusterSpec::default());
    temporary.metadata.labels = Some([(PROJECT_ID_LABEL.to_owned(), PROJECT.to_owned())].into());
    clusters.create(&PostParams::default(), &temporary).await?;
    let temporary_url = admission_url(&seed, address, "temporary", &certs).await?;
    wait_for(
        Duration::from_secs(20),
        "the webhook to know Cluster temporary",
        || async {
            post(&http, &temporary_url, fits.clone())
                .await
                .ok()
                .filter(|(s, _)| *s == 200)
        },
    )
    .await?;
    clusters.delete("temporary", &DeleteParams::default()).await?;
    let (status, text) = wait_for(
        Duration::from_secs(20),
        "the deleted Cluster to be refused",
        || async {
            post(&http, &temporary_url, fits.clone())
                .await
                .ok()
                .filter(|(s, _)| *s == 403)
        },
    )
    .await?;
    assert!(text.contains("not valid for this user cluster"), "{text}");

    // Still serving, and every refusal above was counted.
    let (status_after, text) = post(&http, &url, fits.clone()).await?;
    assert_eq!(status_after, 200, "{text}");
    assert_eq!(status, 403);
    let invalid = |reason: &str| metrics.invalid_requests.with_label_values(&[reason]).get();
    assert_eq!(invalid("malformed"), 6);
    assert!(invalid("too_large") >= 1);
    assert_eq!(invalid("read_timeout"), 1);
    assert!(
        metrics
            .auth_failures
            .with_label_values(&["unknown_cluster"])
            .get()
            >= 1
    );
    assert!(
        reservations(seed.clone(), PROJECT).await?.is_empty(),
        "dry runs reserve nothing"
    );
    Ok(())
}

/// Sends `head`, then `chunks` with `delay` before each (stopping when the server has closed),
/// and reads the answer: its text and how long it all took.
async fn raw(
    address: SocketAddr,
    ca_pem: &str,
    head: &str,
    chunks: &[String],
    delay: Duration,
) -> Result<(String, Duration)> {
    let started = Instant::now();
    let stream = tls(address, ca_pem).await?;
    let (mut reader, mut writer) = tokio::io::split(stream);
    let mut read = tokio::spawn(async move {
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(20), reader.read_to_end(&mut answer)).await;
        String::from_utf8_lossy(&answer).into_owned()
    });
    writer.write_all(head.as_bytes()).await?;
    // Before each chunk, wait up to `delay` for the server's answer: a slow client that stops
    // sending as soon as it is answered (and closed).
    for chunk in chunks {
        if let Ok(answer) = tokio::time::timeout(delay, &mut read).await {
            return Ok((answer?, started.elapsed()));
        }
        if writer.write_all(chunk.as_bytes()).await.is_err() {
            break;
        }
    }
    let answer = read.await?;
    Ok((answer, started.elapsed()))
}
