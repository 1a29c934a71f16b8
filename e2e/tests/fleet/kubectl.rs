//! What a user of the demo project sees in kubectl's own output (issue #37): a dry-run create
//! answers how many Machines of its size fit and reserves nothing; an admission that leaves the
//! project above 80 % of a limit carries a warning that kubectl prints.

use std::path::Path;
use std::time::Duration;

use e2e::kubectl::{self, Output};
use e2e::wait_for;
use kkp_quota_crds::{QuotaLedger, ResourceQuota};
use kube::Api;

/// deploy/examples/`file` with its Machine renamed to `name`.
fn example_named(file: &str, name: &str) -> String {
    let path = format!("{}/../deploy/examples/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let original = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("name: "))
        .expect("the example names its Machine")
        .to_owned();
    text.replace(&format!("name: {original}"), &format!("name: {name}"))
}

fn kubectl(alpha: &Path, args: &[&str], stdin: &str) -> Output {
    kubectl::run(alpha, args, stdin).expect("kubectl runs")
}

/// From the demo project with only `worker-small` (2 of 16 cpu): dry runs, then six creates up
/// to 14 of 16 cpu, the last warned; ends with `worker-small` alone again.
#[allow(clippy::unwrap_used, reason = "a test helper: a panic is the failure report")]
pub async fn what_kubectl_shows_near_the_limit(
    fleet_dir: &Path,
    seed_a: kube::Client,
    master: Api<ResourceQuota>,
) {
    let alpha = fleet_dir.join("alpha.kubeconfig");
    let create_dry = ["create", "--dry-run=server", "-o", "json", "-f", "-"];

    // A dry run of a 2-cpu Machine: created (server dry run), with the answer as a warning.
    let dry = kubectl(
        &alpha,
        &create_dry,
        &example_named("machine-small.yaml", "dry-small"),
    );
    assert!(dry.success, "{dry:?}");
    let warnings = dry.warnings();
    assert_eq!(
        warnings.last().copied(),
        Some(
            r#"dry run, nothing was reserved: in project "demo", 7 Machines of this size (2 cpu, 4Gi memory and 50Gi storage) fit in its quota now"#
        ),
        "{dry:?}"
    );
    // Under shares the room may be on the other seed: the dry run says so and moves nothing.
    assert!(
        warnings[..warnings.len() - 1]
            .iter()
            .all(|w| w.starts_with("dry run: part of the room is held by another seed")),
        "{dry:?}"
    );
    // Nothing reserved: the ledger does not know the dry run's uid, and no such Machine exists.
    let object: serde_json::Value = serde_json::from_str(&dry.stdout).unwrap();
    let uid = object["metadata"]["uid"].as_str().unwrap().to_owned();
    let ledger = Api::<QuotaLedger>::all(seed_a.clone())
        .get("project-demo")
        .await
        .unwrap();
    let ledger_text = serde_json::to_string(&ledger).unwrap();
    assert!(
        !ledger_text.contains(&uid),
        "a dry run was reserved: {ledger_text}"
    );
    let get = kubectl(&alpha, &["get", "machine", "-n", "kube-system", "dry-small"], "");
    assert!(!get.success && get.stderr.contains("NotFound"), "{get:?}");

    // A dry run too big for the quota: refused as a create would be, and none fits.
    let big = kubectl(
        &alpha,
        &create_dry,
        &example_named("machine-too-big.yaml", "dry-big"),
    );
    assert!(!big.success, "{big:?}");
    assert!(big.stderr.contains("needs 32 cpu"), "{big:?}");
    assert_eq!(
        big.warnings(),
        [
            r#"dry run, nothing was reserved: in project "demo", 0 Machines of this size (32 cpu, 128Gi memory and 100Gi storage) fit in its quota now"#
        ],
        "{big:?}"
    );

    // Up to 12 of 16 cpu (75 %): no warning. The sixth Machine makes it 14 of 16.
    for n in 1..=6 {
        let name = format!("near-{n}");
        let created = kubectl(
            &alpha,
            &["create", "-f", "-"],
            &example_named("machine-small.yaml", &name),
        );
        assert!(created.success, "{name}: {created:?}");
        if n < 6 {
            assert!(
                created.warnings().is_empty(),
                "{name} at {} cpu: {created:?}",
                2 + 2 * n
            );
        } else {
            assert_eq!(
                created.warnings(),
                [r#"project "demo" now uses 14 of 16 cpu (above 80 % of its quota)"#],
                "{created:?}"
            );
            assert!(
                created.stdout.contains("machine.cluster.k8s.io/near-6 created"),
                "{created:?}"
            );
        }
    }
    let names: Vec<String> = (1..=6).map(|n| format!("near-{n}")).collect();
    let mut delete = vec!["delete", "machine", "-n", "kube-system", "--wait=false"];
    delete.extend(names.iter().map(String::as_str));
    let deleted = kubectl(&alpha, &delete, "");
    assert!(deleted.success, "{deleted:?}");
    wait_for(
        Duration::from_mins(1),
        "worker-small alone in globalUsage",
        || {
            let master = master.clone();
            async move {
                let usage = master.get("project-demo").await.ok()?.status?.global_usage?;
                (usage.cpu == Some("2".parse().unwrap())).then_some(())
            }
        },
    )
    .await
    .unwrap();
}

/// `kubectl kkp-quota` through the real kubectl, with the demo project at `worker-small` alone
/// (2 of 16 cpu): `status` in alpha (the view) and on the master, `fits` agreeing with the
/// webhook's own dry-run count, and `top`.
pub async fn the_plugin_answers(fleet_dir: &Path) {
    the_plugin_in_a_user_cluster(&fleet_dir.join("alpha.kubeconfig")).await;
    the_plugin_on_the_master(&fleet_dir.join("master.kubeconfig"));
}

fn plugin(kubeconfig: &Path, args: &[&str]) -> Output {
    kubectl::plugin(kubeconfig, args, "").expect("kubectl runs")
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

#[allow(clippy::unwrap_used, reason = "a test helper: a panic is the failure report")]
async fn the_plugin_in_a_user_cluster(alpha: &Path) {
    let alpha = alpha.to_path_buf();
    // In the user cluster: the project's view, at a glance and as JSON. The view follows the
    // deletes just made within a second or so.
    let started = std::time::Instant::now();
    let mut seen = String::new();
    let followed = wait_for(Duration::from_secs(30), "the view back at 2 cpu", || {
        let out = plugin(&alpha, &["status", "-o", "json"]);
        seen.clone_from(&out.stdout);
        let used = serde_json::from_str::<serde_json::Value>(&out.stdout)
            .map(|v| v["projects"][0]["resources"][0]["used"].clone())
            .unwrap_or_default();
        std::future::ready((used == "2").then_some(()))
    })
    .await;
    assert!(followed.is_ok(), "{followed:?}; last seen: {seen}");
    println!(
        "the plugin saw the view back at 2 cpu after {:?}",
        started.elapsed()
    );
    let status = plugin(&alpha, &["status"]);
    assert!(status.success, "{status:?}");
    assert!(
        status.stdout.starts_with("project demo: Current, confirmed "),
        "{status:?}"
    );
    assert!(
        status
            .stdout
            .contains("RESOURCE   USED   LIMIT   FREE\ncpu        2      16      14\n"),
        "{status:?}"
    );
    let status = json(&plugin(&alpha, &["status", "-o", "json"]));
    assert_eq!(status["source"], "userCluster", "{status}");
    let demo = &status["projects"][0];
    assert_eq!(
        (&demo["project"], &demo["state"]),
        (&"demo".into(), &"Current".into()),
        "{status}"
    );
    assert_eq!(
        demo["resources"][0],
        serde_json::json!({"resource": "cpu", "used": "2", "limit": "16", "free": "14"})
    );
    assert_eq!(demo["clusters"][0]["cluster"], "alpha", "{status}");

    // `fits` counts what the webhook counts: the dry-run create of the same Machine says how many
    // of its size fit, and the plugin says the same number.
    let machine = example_named("machine-small.yaml", "fits-small");
    let dry = kubectl(&alpha, &["create", "--dry-run=server", "-f", "-"], &machine);
    let webhook_count: u64 = dry
        .warnings()
        .iter()
        .find_map(|w| w.split("\"demo\", ").nth(1)?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no count in the dry-run answer: {dry:?}"));
    let fits = kubectl::plugin(&alpha, &["fits", "-f", "-", "-o", "json"], &machine).unwrap();
    assert_eq!(fits.code, Some(0), "{fits:?}");
    assert_eq!(json(&fits)["objects"][0]["fitNow"], webhook_count, "{fits:?}");
    assert_eq!(webhook_count, 7);

    // Ten replicas of the same size do not fit: exit 1, and the reason names the limit.
    let deployment = std::fs::read_to_string(format!(
        "{}/../deploy/examples/machinedeployment-small.yaml",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
    .replace("replicas: 3", "replicas: 10");
    let ten = kubectl::plugin(&alpha, &["fits", "-f", "-"], &deployment).unwrap();
    assert_eq!(ten.code, Some(1), "{ten:?}");
    assert!(
        ten.stdout.contains("machinedeployment/workers-small")
            && ten.stdout.contains("each needs 2 cpu, and 14 of 16 cpu is free"),
        "{ten:?}"
    );
    let top = plugin(&alpha, &["top"]);
    assert!(
        !top.success
            && top
                .stderr
                .contains("`top` reads every project's quota on the master"),
        "{top:?}"
    );
}

/// For admins: every project, the seeds, and the projects by use.
#[allow(clippy::unwrap_used, reason = "a test helper: a panic is the failure report")]
fn the_plugin_on_the_master(master: &Path) {
    let master = master.to_path_buf();
    // On the master, for admins: every project, the seeds, and the projects by use.
    let status = json(&plugin(&master, &["status", "-o", "json", "--project", "demo"]));
    assert_eq!(status["source"], "master", "{status}");
    let demo = &status["projects"][0];
    assert_eq!(demo["resources"][0]["used"], "2", "{status}");
    let seeds: Vec<&str> = demo["seeds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(seeds, ["seed-a", "seed-b"], "{status}");
    let top = json(&plugin(&master, &["top", "-o", "json"]));
    let rows = top["projects"].as_array().unwrap();
    let demo = rows
        .iter()
        .find(|p| p["project"] == "demo")
        .unwrap_or_else(|| panic!("{top}"));
    // 2 of 16 cpu is the demo project's fullest resource (4Gi of 64Gi, 50Gi of 1Ti).
    assert_eq!(
        (&demo["fullest"], &demo["percent"]),
        (&"cpu".into(), &12.5.into()),
        "{top}"
    );
    let percents: Vec<f64> = rows
        .iter()
        .map(|p| p["percent"].as_f64().unwrap_or(-1.0))
        .collect();
    assert!(
        percents.windows(2).all(|w| w[0] >= w[1]),
        "not fullest first: {top}"
    );
    let table = plugin(&master, &["top"]);
    assert!(table.success && table.stdout.starts_with("PROJECT"), "{table:?}");
}
