//! A real Prometheus scrapes the running system and evaluates the shipped alert rules: lowering a
//! quota below usage makes `KkpQuotaProjectOverQuota` go pending and then fire. Also checks that
//! every metric the components export is documented, and that the rules' and dashboard's core
//! metrics are really exported.
#![allow(clippy::unwrap_used, reason = "test code: a panic is the failure report")]

use std::fmt::Write as _;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use e2e::components::{ComponentSpec, spawn};
use e2e::system::{FleetWithSystem, System, free_port};
use e2e::{Fleet, FleetSpec, wait_for, wait_for_object};
use kkp_quota_crds::ResourceQuota;
use kkp_quota_crds::machine::Machine;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::Value;

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

fn prometheus_config(system: &System, rules: &Path) -> String {
    let mut jobs = String::new();
    for component in &system.components {
        let _ = write!(
            jobs,
            "  - job_name: {name}\n    static_configs:\n      - targets: ['{address}']\n",
            name = component.name,
            address = component.metrics_address
        );
    }
    format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {rules}\nscrape_configs:\n{jobs}",
        rules = rules.display()
    )
}

async fn query(http: &reqwest::Client, base: &str, path: &str) -> Option<Value> {
    let body: Value = http
        .get(format!("{base}{path}"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    (body["status"] == "success").then(|| body["data"].clone())
}

/// The state (`pending`/`firing`) of the over-quota alert for project `demo` and `cpu`, if active.
async fn over_quota_state(http: &reqwest::Client, base: &str) -> Option<String> {
    let data = query(http, base, "/api/v1/alerts").await?;
    data["alerts"].as_array()?.iter().find_map(|alert| {
        let labels = &alert["labels"];
        (labels["alertname"] == "KkpQuotaProjectOverQuota"
            && labels["project"] == "demo"
            && labels["resource"] == "cpu")
            .then(|| alert["state"].as_str().unwrap_or_default().to_owned())
    })
}

fn documented_metrics() -> BTreeSet<String> {
    let readme = std::fs::read_to_string(format!("{REPO}/docs/metrics.md")).unwrap();
    let table = readme
        .split("## Metrics")
        .nth(1)
        .unwrap()
        .split("\n## ")
        .next()
        .unwrap();
    table
        .lines()
        .filter_map(|line| line.strip_prefix("| `kkp_quota_"))
        .map(|rest| format!("kkp_quota_{}", rest.split('`').next().unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn lowering_a_quota_below_usage_fires_the_over_quota_alert() {
    let spec = FleetSpec::empty()
        .with_seed("seed-a")
        .with_project("demo")
        .with_user_cluster("alpha", "seed-a", "demo");
    let running = FleetWithSystem::start(spec).await.unwrap();
    let (fleet, system, dir) = (&running.fleet, &running.system, &running.dir);
    let master = Api::<ResourceQuota>::all(fleet.master().client());

    use_four_cpus_of_eight(fleet, &master).await;
    let (_prometheus, base) = start_prometheus(system, dir.path()).await;
    alert_fires_when_quota_is_lowered(&master, &base).await;
    exported_metrics_are_documented(system).await;
    every_dashboard_query_returns_data(&base).await;
}

/// Every query of the shipped Grafana dashboard returns data from the live Prometheus that
/// scrapes the running system, with the dashboard's variables as a user picks them (every
/// project, resource `cpu`): a panel that shows nothing on a working system tells its reader
/// nothing (issue #37).
async fn every_dashboard_query_returns_data(base: &str) {
    let path = format!("{REPO}/deploy/grafana/kkp-quota-dashboard.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let http = reqwest::Client::new();
    let mut empty = Vec::new();
    let mut checked = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$project", ".+")
                .replace("$resource", "cpu");
            let url = reqwest::Url::parse_with_params(&format!("{base}/api/v1/query"), &[("query", &expr)])
                .unwrap();
            let found = wait_for(Duration::from_secs(30), &format!("data for {expr}"), || {
                let (http, url) = (http.clone(), url.clone());
                async move {
                    let body: Value = http.get(url).send().await.ok()?.json().await.ok()?;
                    let results = body["data"]["result"].as_array()?.len();
                    (results > 0).then_some(results)
                }
            })
            .await;
            checked += 1;
            if found.is_err() {
                empty.push(format!("{}: {expr}", panel["title"].as_str().unwrap_or_default()));
            }
        }
    }
    assert!(checked >= 10, "only {checked} dashboard queries found");
    assert!(
        empty.is_empty(),
        "dashboard queries without data on a running system: {empty:#?}"
    );
}

fn quota(cpu: &str) -> ResourceQuota {
    e2e::demo::cpu_quota("demo", cpu)
}

/// Project demo: an 8-cpu quota and two t3.medium Machines (2 cpu each) admitted through the
/// webhook and counted up to the master.
async fn use_four_cpus_of_eight(fleet: &Fleet, master: &Api<ResourceQuota>) {
    let quota = |cpu: &str| {
        let mut quota = e2e::demo::cpu_quota("demo", cpu);
        quota.metadata.managed_fields = None;
        quota
    };
    master
        .patch(
            "project-demo",
            &PatchParams::apply("alerting-test").force(),
            &Patch::Apply(&quota("8")),
        )
        .await
        .unwrap();
    let seed_quotas = Api::<kkp_quota_crds::QuotaLedger>::all(fleet.seed("seed-a").client());
    wait_for_object(&seed_quotas, "project-demo", Duration::from_mins(1))
        .await
        .unwrap();
    let webhooks = Api::<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration>::all(
        fleet.user_cluster("alpha").client(),
    );
    wait_for_object(&webhooks, "kkp-quota-machines", Duration::from_mins(1))
        .await
        .unwrap();
    let machines = Api::<Machine>::namespaced(fleet.user_cluster("alpha").client(), "kube-system");
    for name in ["worker-1", "worker-2"] {
        let machine = e2e::machines::aws(name, "t3.medium");
        machines.create(&PostParams::default(), &machine).await.unwrap();
    }
    wait_for(
        Duration::from_mins(1),
        "4 cpu in the master's globalUsage",
        || {
            let master = master.clone();
            async move {
                let usage = master.get("project-demo").await.ok()?.status?.global_usage?;
                (usage.cpu == Some("4".parse().unwrap())).then_some(())
            }
        },
    )
    .await
    .unwrap();
}

/// A real Prometheus scraping every component with the shipped rules; returns it and its URL
/// once every target is up and the usage is visible through it.
async fn start_prometheus(system: &System, dir: &Path) -> (e2e::components::RunningComponent, String) {
    let prom_dir = dir.join("prometheus");
    std::fs::create_dir_all(&prom_dir).unwrap();
    let rules = Path::new(REPO).join("deploy/prometheus/kkp-quota.rules.yaml");
    std::fs::write(prom_dir.join("prometheus.yml"), prometheus_config(system, &rules)).unwrap();
    let port = free_port().unwrap();
    let prometheus = spawn(
        &ComponentSpec {
            name: "prometheus".to_owned(),
            program: "prometheus".into(),
            args: vec![
                format!("--config.file={}", prom_dir.join("prometheus.yml").display()),
                format!("--storage.tsdb.path={}", prom_dir.join("data").display()),
                format!("--web.listen-address=127.0.0.1:{port}"),
            ],
        },
        &prom_dir,
    )
    .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();

    // Every target up, and the usage metric through Prometheus.
    wait_for(Duration::from_mins(1), "every scrape target up", || {
        let (http, base) = (http.clone(), base.clone());
        let expected = system.components.len();
        async move {
            let data = query(&http, &base, "/api/v1/targets").await?;
            let targets = data["activeTargets"].as_array()?;
            (targets.len() == expected && targets.iter().all(|t| t["health"] == "up")).then_some(())
        }
    })
    .await
    .unwrap();
    wait_for(Duration::from_mins(1), "usage 4 cpu in Prometheus", || {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let data = query(
                &http,
                &base,
                "/api/v1/query?query=kkp_quota_usage%7Bscope%3D%22global%22%2Cproject%3D%22demo%22%2Cresource%3D%22cpu%22%7D",
            )
            .await?;
            (data["result"][0]["value"][1] == "4").then_some(())
        }
    })
    .await
    .unwrap();
    (prometheus, base)
}

/// Within the quota the alert is not active; lowered below usage (allowed), it goes pending, then
/// fires after its `for: 1m`.
async fn alert_fires_when_quota_is_lowered(master: &Api<ResourceQuota>, base: &str) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let base = base.to_owned();
    // Within the quota: the alert is not active (give the rules a few evaluations).
    let evaluations_before = std::time::Instant::now();
    wait_for(Duration::from_secs(30), "three rule evaluations", || async {
        evaluations_before.elapsed() > Duration::from_secs(3)
    })
    .await
    .unwrap();
    assert_eq!(
        over_quota_state(&http, &base).await,
        None,
        "no over-quota alert while within quota"
    );

    master
        .patch(
            "project-demo",
            &PatchParams::apply("alerting-test").force(),
            &Patch::Apply(&quota("2")),
        )
        .await
        .unwrap();
    wait_for(
        Duration::from_mins(1),
        "over-quota alert pending or firing",
        || {
            let (http, base) = (http.clone(), base.clone());
            async move {
                over_quota_state(&http, &base)
                    .await
                    .filter(|s| s == "pending" || s == "firing")
            }
        },
    )
    .await
    .unwrap();
    wait_for(Duration::from_secs(150), "over-quota alert firing", || {
        let (http, base) = (http.clone(), base.clone());
        async move { over_quota_state(&http, &base).await.filter(|s| s == "firing") }
    })
    .await
    .unwrap();
}

/// What the components export is documented, and the core metrics of the rules and the dashboard
/// are really there.
async fn exported_metrics_are_documented(system: &System) {
    let documented = documented_metrics();
    let exported: BTreeSet<String> = system
        .scrape_all()
        .await
        .unwrap()
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter(|name| name.starts_with("kkp_quota_"))
        .map(str::to_owned)
        .collect();
    let undocumented: Vec<_> = exported.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "exported but not in docs/metrics.md's Metrics table: {undocumented:?}"
    );
    for core in [
        "kkp_quota_limit",
        "kkp_quota_usage",
        "kkp_quota_over_limit",
        "kkp_quota_seed_stale",
        "kkp_quota_seed_last_sync_timestamp_seconds",
        "kkp_quota_cluster_usage",
        "kkp_quota_local_usage",
        "kkp_quota_user_cluster_unreachable",
        "kkp_quota_admissions_total",
        "kkp_quota_admission_duration_seconds",
    ] {
        assert!(
            exported.contains(core),
            "{core} is not exported; exported: {exported:?}"
        );
    }
}
