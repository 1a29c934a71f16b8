//! Logs fit for a cluster: every component writes JSON lines with `--log-json` (the chart's
//! `logFormat: json`), and never colour codes when its output is not a terminal (a pod's is not).
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use e2e::certs::WebhookCerts;
use e2e::components::{ComponentSpec, spawn};
use e2e::system::{
    COMPONENT_CRATES, build_components, free_port, generate_url_signing_key, write_url_signing_keys,
};
use e2e::{ControlPlane, wait_for};

/// The lines `component` logs in its first seconds against `plane`, with `extra` flags.
async fn first_lines(
    plane: &ControlPlane,
    dir: &std::path::Path,
    component: &str,
    json: bool,
) -> Vec<String> {
    let mut args = vec![
        format!("--kubeconfig={}", plane.kubeconfig_path().display()),
        format!("--metrics-address=127.0.0.1:{}", free_port().unwrap()),
    ];
    if component == "machine-webhook" {
        let certs = WebhookCerts::generate()
            .unwrap()
            .write_to(&dir.join("webhook"))
            .unwrap();
        let keys = dir.join("webhook").join("url-signing-keys");
        write_url_signing_keys(&keys, &[&generate_url_signing_key().unwrap()]).unwrap();
        args.extend([
            format!("--listen-address=127.0.0.1:{}", free_port().unwrap()),
            format!("--tls-cert-file={}", certs.cert.display()),
            format!("--tls-key-file={}", certs.key.display()),
            format!("--url-signing-keys={}", keys.display()),
        ]);
    }
    if json {
        args.push("--log-json".to_owned());
    }
    let mut spec = ComponentSpec::workspace_bin(component, args).unwrap();
    spec.name = format!("{component}-{}", if json { "json" } else { "text" });
    let log = dir.join(format!("{}.log", spec.name));
    let _running = spawn(&spec, dir).unwrap();
    wait_for(
        Duration::from_secs(30),
        &format!("{} logging", spec.name),
        || async {
            let text = std::fs::read_to_string(&log).ok()?;
            let lines: Vec<String> = text.lines().map(str::to_owned).collect();
            (!lines.is_empty()).then_some(lines)
        },
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_component_logs_json_on_request_and_never_colour_codes() {
    tokio::task::spawn_blocking(build_components)
        .await
        .unwrap()
        .unwrap();
    let plane = ControlPlane::start("logs").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    for component in COMPONENT_CRATES {
        for line in first_lines(&plane, dir.path(), component, true).await {
            let value: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| {
                panic!("{component} --log-json wrote a line that is not JSON ({e}): {line}")
            });
            assert!(
                value.get("level").is_some() && value.get("timestamp").is_some(),
                "{line}"
            );
        }
        for line in first_lines(&plane, dir.path(), component, false).await {
            assert!(
                !line.contains('\u{1b}'),
                "{component} wrote a colour code to a file: {line:?}"
            );
        }
    }
}
