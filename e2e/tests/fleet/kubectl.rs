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
