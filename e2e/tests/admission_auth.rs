//! Only a user cluster's own API server can spend its project's quota, on the whole system as
//! `make demo` runs it (real processes, the URL-signing key file the fleet generates):
//!
//! - forged calls to the webhook (no token, another cluster's token, beta's valid token with
//!   alpha's name, a made-up token, the old path-less URL; on the seed's path for `Cluster`
//!   creates: no token, a user cluster's token, and the other seed's valid token, which both seeds'
//!   shared keys verify but `--seed-name` refuses) are refused with 401/403, decide nothing and
//!   reserve nothing; creates through alpha's own API server keep working;
//! - the key rotates while creates keep arriving: none fails, and once the old key is dropped
//!   the old token is refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use e2e::system::{FleetWithSystem, System, generate_url_signing_key, write_url_signing_keys};
use e2e::{FleetSpec, wait_for, wait_for_object};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kkp_quota_crds::QuotaLedger;
use kkp_quota_crds::machine::Machine;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_mins(1);

fn machine(name: &str) -> Machine {
    e2e::machines::aws(name, "t3.medium")
}

/// The webhook URL seed-controller wrote into a user cluster (waits for it).
async fn webhook_url(user: &Client) -> String {
    let api = Api::<ValidatingWebhookConfiguration>::all(user.clone());
    let vwc = wait_for_object(&api, "kkp-quota-machines", WAIT)
        .await
        .expect("webhook configuration");
    vwc.webhooks.expect("webhooks")[0]
        .client_config
        .url
        .clone()
        .expect("url")
}

/// The URL seed-controller wrote for the seed's own `Cluster` creates (waits for it), split into
/// `(base, token)` of `https://host:port/validate/clusters/<seed>/<token>`.
async fn seed_clusters_url(seed: &Client, name: &str) -> (String, String) {
    let api = Api::<ValidatingWebhookConfiguration>::all(seed.clone());
    let url = wait_for(WAIT, "the seed's Cluster webhook URL", || async {
        api.get("kkp-quota-clusters")
            .await
            .ok()?
            .webhooks?
            .first()?
            .client_config
            .url
            .clone()
    })
    .await
    .expect("the seed's Cluster webhook URL");
    let (base, rest) = url.split_once("/validate/clusters/").expect("the clusters path");
    let token = rest
        .strip_prefix(&format!("{name}/"))
        .unwrap_or_else(|| panic!("{url} names seed {name}"));
    (base.to_owned(), token.to_owned())
}

/// Waits until the user cluster's webhook URL differs from `old`, and returns it.
async fn wait_url_change(user: &Client, old: &str) -> String {
    wait_for(WAIT, "the webhook URL to be rewritten", || async {
        let url = webhook_url(user).await;
        (url != old).then_some(url)
    })
    .await
    .expect("rewritten URL")
}

/// `(base, cluster, token)` of `https://host:port/validate/machines/<cluster>/<token>`.
fn split(url: &str) -> (String, String, String) {
    let (base, rest) = url.split_once("/validate/machines/").expect("admission path");
    let (cluster, token) = rest.split_once('/').expect("a token in the URL");
    (base.to_owned(), cluster.to_owned(), token.to_owned())
}

fn review(name: &str, dry_run: bool) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("forged-{name}"),
            "kind": {"group": "cluster.k8s.io", "version": "v1alpha1", "kind": "Machine"},
            "resource": {"group": "cluster.k8s.io", "version": "v1alpha1", "resource": "machines"},
            "name": name,
            "namespace": "kube-system",
            "operation": "CREATE",
            "userInfo": {"username": "mallory"},
            "object": serde_json::to_value(machine(name)).expect("json"),
            "dryRun": dry_run,
        }
    })
}

/// Posts a hand-written review (a t3.medium CREATE, not a dry run unless the name ends in
/// `-dry`) to `url`: status and body.
async fn forge(http: &reqwest::Client, url: &str, name: &str) -> (u16, String) {
    let response = http
        .post(url)
        .json(&review(name, name.ends_with("-dry")))
        .send()
        .await
        .expect("the webhook answers");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

/// Sum of every sample of `metric` whose labels contain `labels`, over every component.
async fn metric(system: &System, metric: &str, labels: &str) -> u64 {
    let text = system.scrape_all().await.expect("scrape");
    text.lines()
        .filter(|l| l.starts_with(metric) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let v = v as u64;
            v
        })
        .sum()
}

async fn ledger_size(seed: &Client) -> (usize, usize) {
    let quota = Api::<QuotaLedger>::all(seed.clone())
        .get("project-demo")
        .await
        .expect("quota copy");
    let status = quota.status.unwrap_or_default();
    (status.reservations.len(), status.allotments.len())
}

struct Running {
    running: FleetWithSystem,
    http: reqwest::Client,
}

async fn start() -> Running {
    let running = FleetWithSystem::start(FleetSpec::default())
        .await
        .expect("fleet and system");
    let (fleet, system) = (&running.fleet, &running.system);
    e2e::demo::write_demo_project(fleet).await.expect("demo quota");
    let ca = std::fs::read(&system.webhook_ca).expect("CA");
    let http = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).expect("CA PEM"))
        .timeout(Duration::from_secs(10))
        .build()
        .expect("http");
    e2e::demo::wait_in_force(fleet, "demo", WAIT)
        .await
        .expect("demo quota in force in every user cluster");
    Running { running, http }
}

#[tokio::test(flavor = "multi_thread")]
#[allow(clippy::too_many_lines)] // one scenario: the forged calls listed, sent twice, checked
async fn forged_admission_calls_are_refused_and_reserve_nothing() {
    let Running { running, http } = start().await;
    let (fleet, system) = (&running.fleet, &running.system);
    let alpha = fleet.user_cluster("alpha").client();
    let beta = fleet.user_cluster("beta").client();
    let seed_a = fleet.seed("seed-a").client();
    let alpha_url = webhook_url(&alpha).await;
    let beta_url = webhook_url(&beta).await;
    let (base, cluster, alpha_token) = split(&alpha_url);
    assert_eq!(cluster, "alpha");
    let (beta_base, _, beta_token) = split(&beta_url);
    assert_eq!(base, beta_base, "alpha and beta share seed-a's webhook");
    assert_ne!(alpha_token, beta_token);

    let (own_seed_base, own_seed_token) = seed_clusters_url(&seed_a, "seed-a").await;
    assert_eq!(
        own_seed_base, base,
        "seed-a's Cluster creates go to seed-a's webhook"
    );
    let (other_seed_base, other_seed_token) =
        seed_clusters_url(&fleet.seed("seed-b").client(), "seed-b").await;
    assert_ne!(other_seed_base, base);

    let before = ledger_size(&seed_a).await;
    let admissions_before = metric(system, "kkp_quota_admissions_total", "").await;
    let forged = [
        // curl from a shell on the machine, no credentials (the URL of before this change).
        (format!("{base}/validate/machines/alpha"), 401, "missing_token"),
        // beta's admin copies beta's valid token and puts alpha's name in the path.
        (
            format!("{base}/validate/machines/alpha/{beta_token}"),
            403,
            "invalid_token",
        ),
        // a made-up token, and an empty-looking one.
        (
            format!("{base}/validate/machines/alpha/{}", "A".repeat(43)),
            403,
            "invalid_token",
        ),
        (
            format!("{base}/validate/machines/alpha/%20"),
            403,
            "invalid_token",
        ),
        // alpha's own token for a cluster that does not exist.
        (
            format!("{base}/validate/machines/ghost/{alpha_token}"),
            403,
            "unknown_cluster",
        ),
        // The seed's path for Cluster creates: no token; a user cluster's token;
        (format!("{base}/validate/clusters/seed-a"), 401, "missing_token"),
        (
            format!("{base}/validate/clusters/seed-a/{alpha_token}"),
            403,
            "invalid_token",
        ),
        // and each seed's valid token sent to the other seed's webhook (the seeds share the
        // URL-signing keys, so only the webhook's --seed-name tells them apart).
        (
            format!("{base}/validate/clusters/seed-b/{other_seed_token}"),
            403,
            "invalid_token",
        ),
        (
            format!("{other_seed_base}/validate/clusters/seed-a/{own_seed_token}"),
            403,
            "invalid_token",
        ),
    ];
    for (round, (url, status, _)) in forged.iter().chain(forged.iter()).enumerate() {
        let (got, body) = forge(&http, url, &format!("forged-{round}")).await;
        assert_eq!(got, *status, "{url}: {body}");
        assert!(
            !body.contains("allowed"),
            "no decision in the answer to {url}: {body}"
        );
        assert!(!body.contains("demo"), "nothing about the project in {body}");
    }
    for reason in ["missing_token", "invalid_token", "unknown_cluster"] {
        let expected = 2 * forged.iter().filter(|f| f.2 == reason).count();
        let counted = metric(
            system,
            "kkp_quota_webhook_auth_failures_total",
            &format!("reason=\"{reason}\""),
        )
        .await;
        assert_eq!(counted, u64::try_from(expected).expect("small"), "{reason}");
    }
    assert_eq!(
        metric(system, "kkp_quota_admissions_total", "").await,
        admissions_before,
        "no forged call reached a decision"
    );
    assert_eq!(ledger_size(&seed_a).await, before, "nothing reserved");
    // No reservation before either; the dry-run probes of `start` may have taken an allotment.
    assert_eq!(before.0, 0);

    // Creates through alpha's own API server keep working, and are reserved.
    let machines = Api::<Machine>::namespaced(alpha.clone(), "kube-system");
    machines
        .create(&PostParams::default(), &machine("real-1"))
        .await
        .expect("a create through alpha's API server is admitted");
    // ... and a denial names the caller's own project only.
    let mut big = machine("too-big");
    big.spec.provider_spec.value = Some(json!({
        "cloudProvider": "aws",
        "cloudProviderSpec": {"instanceType": "m5.24xlarge", "diskSize": 50, "region": "eu-central-1"},
        "operatingSystem": "ubuntu"
    }));
    let denied = machines
        .create(&PostParams::default(), &big)
        .await
        .expect_err("96 cpu do not fit 16")
        .to_string();
    assert!(denied.contains(r#"project "demo" uses"#), "{denied}");
    assert!(!denied.contains("other"), "{denied}");
    // The admitted one is recorded (from the allotment, a moment later) and nothing forged is.
    wait_for(WAIT, "real-1 to be reserved or counted", || async {
        let quota = Api::<QuotaLedger>::all(seed_a.clone())
            .get("project-demo")
            .await
            .ok()?;
        let status = quota.status?;
        let counted = status.local_usage.and_then(|u| u.cpu) == Some("2".parse().ok()?);
        (counted || status.reservations.len() == 1).then_some(())
    })
    .await
    .expect("real-1 accounted");
}

/// Creates run continuously (dry runs through alpha, beta and gamma, plus real ones in alpha)
/// while the key rotates: added second, moved first, old one dropped. Every create must be
/// admitted, and after the overlap the old token is refused.
#[tokio::test(flavor = "multi_thread")]
#[allow(clippy::too_many_lines)] // one scenario: burst, three rotation steps, checks
async fn key_rotation_during_a_burst_fails_no_create_and_retires_the_old_token() {
    let Running { running, http } = start().await;
    let (fleet, system) = (&running.fleet, &running.system);
    let users: Vec<(String, Client)> = ["alpha", "beta", "gamma"]
        .iter()
        .map(|n| ((*n).to_owned(), fleet.user_cluster(n).client()))
        .collect();
    let keys_file = system.url_signing_keys.clone();
    let old_key = std::fs::read_to_string(&keys_file).expect("key file");
    let old_key = old_key.trim().to_owned();
    let new_key = generate_url_signing_key().expect("key");
    let mut old_urls = Vec::new();
    for (_, client) in &users {
        old_urls.push(webhook_url(client).await);
    }

    // The burst: four workers creating until told to stop; every failure is recorded.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut workers = Vec::new();
    for worker in 0..4 {
        let (name, client) = users[worker % users.len()].clone();
        let (stop, done, failures) = (Arc::clone(&stop), Arc::clone(&done), Arc::clone(&failures));
        workers.push(tokio::spawn(async move {
            let api = Api::<Machine>::namespaced(client, "kube-system");
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                // One real create in alpha (2 cpu of 16), the rest dry runs: decided and
                // authenticated like any create, without filling the quota.
                let real = worker == 0 && i == 0;
                let params = PostParams {
                    dry_run: !real,
                    ..PostParams::default()
                };
                let machine_name = format!("rot-{worker}-{i}");
                if let Err(e) = api.create(&params, &machine(&machine_name)).await {
                    failures
                        .lock()
                        .expect("lock")
                        .push(format!("{name}/{machine_name}: {e}"));
                }
                done.fetch_add(1, Ordering::SeqCst);
                i += 1;
            }
        }));
    }
    let progress = |what: &'static str| {
        let done = Arc::clone(&done);
        async move {
            let start = done.load(Ordering::SeqCst);
            wait_for(WAIT, what, || {
                let now = done.load(Ordering::SeqCst);
                async move { now >= start + 20 }
            })
            .await
            .expect("the burst keeps going");
        }
    };
    progress("creates before the rotation").await;

    // 1. The new key added second: both verify, the URLs stay.
    write_url_signing_keys(&keys_file, &[&old_key, &new_key]).expect("keys");
    progress("creates with two keys").await;
    // 2. Moved first: seed-controller rewrites every user cluster's URL.
    write_url_signing_keys(&keys_file, &[&new_key, &old_key]).expect("keys");
    let mut new_urls = Vec::new();
    for ((_, client), old) in users.iter().zip(&old_urls) {
        new_urls.push(wait_url_change(client, old).await);
    }
    // The overlap ends once every API server uses its new URL: a round of creates through each
    // user cluster during which no call was verified by the old key.
    wait_for(WAIT, "every API server to use its new URL", || async {
        let older = metric(system, "kkp_quota_webhook_authenticated_total", "key=\"older\"").await;
        for (_, client) in &users {
            let api = Api::<Machine>::namespaced(client.clone(), "kube-system");
            let dry = PostParams {
                dry_run: true,
                ..PostParams::default()
            };
            if api.create(&dry, &machine("probe")).await.is_err() {
                return false;
            }
        }
        metric(system, "kkp_quota_webhook_authenticated_total", "key=\"older\"").await == older
    })
    .await
    .expect("overlap over");
    progress("creates with the new URLs").await;
    // 3. The old key dropped.
    write_url_signing_keys(&keys_file, &[&new_key]).expect("keys");
    progress("creates after the old key is gone").await;
    stop.store(true, Ordering::SeqCst);
    for worker in workers {
        worker.await.expect("worker");
    }
    let failures = failures.lock().expect("lock").clone();
    assert!(failures.is_empty(), "legitimate creates failed: {failures:#?}");
    assert!(done.load(Ordering::SeqCst) >= 80);

    // The old token is refused now, the new one works.
    let (base, _, old_token) = split(&old_urls[0]);
    let (status, body) = forge(
        &http,
        &format!("{base}/validate/machines/alpha/{old_token}"),
        "old",
    )
    .await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = forge(&http, &new_urls[0], "new-dry").await;
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).expect("a review");
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
}
