//! A project's `QuotaLedger` missing on its seed (issue #32), on real API servers with the whole
//! chain in-process: master-controller, seed-controller and machine-webhook.
//!
//! - Deleted by hand, the ledger stays (Terminating) thanks to master-controller's finalizer and
//!   keeps admitting.
//! - Gone for good (its finalizer removed too, as a CRD re-install would), growth is refused as
//!   `ledger_missing` while KKP's copy of the quota is still on the seed, and so it is once the
//!   master has re-created the ledger but seed-controller has not counted it yet. Once counted,
//!   creates are admitted again, up to the limit and not beyond.
//! - The re-created ledger's first count carries the deleted one's reservations and allotments
//!   (Machines admitted but not created yet, headroom a webhook process admits from).

#![allow(clippy::unwrap_used, clippy::too_many_lines)]

mod common;

use std::collections::BTreeMap;

use common::*;
use e2e::{Fleet, FleetSpec, wait_for, wait_for_gone};
use k8s_openapi::api::core::v1::Event as CoreEvent;
use kkp_quota_crds::machine::Machine;
use kkp_quota_crds::quota::{PROJECT_KIND, SUBJECT_KIND_LABEL, SUBJECT_NAME_LABEL};
use kkp_quota_crds::quota_ledger::LEDGER_FINALIZER;
use kkp_quota_crds::{
    KkpQuota, Quantity, QuotaLedger, Resource, ResourceDetails, ResourceQuota, ResourceQuotaSpec, Subject,
};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use seed_controller::Config;
use serde_json::json;
use tokio_util::task::AbortOnDropHandle;

const LEDGER: &str = "project-demo";

/// The fleet (seed-a with user cluster alpha of project demo), the master's quota, and the
/// three components. Fields drop in order: components before the fleet.
struct World {
    master_controller: Option<AbortOnDropHandle<Result<(), master_controller::Error>>>,
    seed_controller: Option<Running>,
    _webhook: AbortOnDropHandle<Result<(), machine_webhook::Error>>,
    webhook_metrics: machine_webhook::metrics::Metrics,
    seed_config: Config,
    _dir: tempfile::TempDir,
    fleet: Fleet,
}

impl World {
    async fn start(quota_cpu: &str) -> World {
        init_logs();
        let fleet = Fleet::start(
            FleetSpec::empty()
                .with_seed("seed-a")
                .with_project("demo")
                .with_user_cluster("alpha", "seed-a", "demo"),
        )
        .await
        .unwrap();
        let mut rq = ResourceQuota::new(
            LEDGER,
            ResourceQuotaSpec {
                subject: Subject::project("demo"),
                quota: KkpQuota::new(&serde_json::from_value(json!({"cpu": quota_cpu})).unwrap()),
            },
        );
        rq.metadata.labels = Some(BTreeMap::from([
            (SUBJECT_NAME_LABEL.to_owned(), "demo".to_owned()),
            (SUBJECT_KIND_LABEL.to_owned(), PROJECT_KIND.to_owned()),
        ]));
        Api::<ResourceQuota>::all(fleet.master().client())
            .create(&PostParams::default(), &rq)
            .await
            .unwrap();

        let seed = fleet.seed("seed-a").client();
        let dir = tempfile::tempdir().unwrap();
        let certs = e2e::certs::WebhookCerts::generate().unwrap();
        let paths = certs.write_to(dir.path()).unwrap();
        let keys = dir.path().join("url-signing-keys");
        e2e::system::write_url_signing_keys(&keys, &[&kkp_quota_runtime::webhook_auth::generate_key()])
            .unwrap();
        let mut webhook_config = machine_webhook::Config::new(
            "127.0.0.1:0".parse().unwrap(),
            paths.cert.clone(),
            paths.key.clone(),
        );
        webhook_config.auth = Some(machine_webhook::AuthConfig::UrlSigningKeys(keys.clone()));
        let webhook = machine_webhook::Webhook::start(webhook_config, seed.clone())
            .await
            .unwrap();
        let (address, webhook_metrics, ready) = (
            webhook.address,
            webhook.metrics.clone(),
            webhook.readiness.clone(),
        );
        let webhook = AbortOnDropHandle::new(tokio::spawn(webhook.run()));
        wait_for(WAIT, "webhook ready", || async { ready.is_ready() })
            .await
            .unwrap();

        let mut seed_config = Config::for_tests("seed-a");
        seed_config.webhook_url = Some(format!("https://{address}"));
        seed_config.webhook_ca_file = Some(paths.ca.clone());
        seed_config.url_signing_keys = Some(keys);
        let mut world = World {
            master_controller: None,
            seed_controller: None,
            _webhook: webhook,
            webhook_metrics,
            seed_config,
            _dir: dir,
            fleet,
        };
        world.start_master();
        world.start_seed_controller().await;
        // The ledger is there and counted (nothing runs yet: zero), and the webhook
        // configuration the seed-controller keeps is in effect.
        world.wait_counted(0).await;
        let machines = world.machines();
        wait_for(WAIT, "webhook configuration in effect", || async {
            let probe = common::machine(
                "probe",
                &json!({"cloudProvider": "aws", "cloudProviderSpec": {"instanceType": "t9.none"}}),
            );
            let dry = PostParams {
                dry_run: true,
                ..PostParams::default()
            };
            matches!(machines.create(&dry, &probe).await, Err(kube::Error::Api(e)) if e.message.contains("sized"))
        })
        .await
        .unwrap();
        world
    }

    fn seed(&self) -> Client {
        self.fleet.seed("seed-a").client()
    }

    fn ledgers(&self) -> Api<QuotaLedger> {
        Api::all(self.seed())
    }

    fn machines(&self) -> Api<Machine> {
        Api::namespaced(self.fleet.user_cluster("alpha").client(), "kube-system")
    }

    fn start_master(&mut self) {
        let master = self.fleet.master().client();
        self.master_controller = Some(AbortOnDropHandle::new(tokio::spawn(master_controller::run(
            master,
            master_controller::Options::new("kubermatic"),
            master_controller::Metrics::new(),
            kkp_quota_runtime::ops::Readiness::default(),
        ))));
    }

    async fn stop_master(&mut self) {
        if let Some(mut task) = self.master_controller.take() {
            task.abort();
            let _ = (&mut task).await;
        }
    }

    async fn start_seed_controller(&mut self) {
        let running = start_controller(self.fleet.seed("seed-a"), self.seed_config.clone()).await;
        running.wait_ready().await;
        self.seed_controller = Some(running);
    }

    async fn stop_seed_controller(&mut self) {
        if let Some(running) = self.seed_controller.take() {
            running.stop().await;
        }
    }

    /// Waits until the ledger's `localUsage` is `cpu` (seed-controller has counted it).
    async fn wait_counted(&self, cpu: i64) {
        let ledgers = self.ledgers();
        wait_for(WAIT, &format!("ledger counted at {cpu} cpu"), || async {
            let local = ledgers.get(LEDGER).await.ok()?.status?.local_usage?;
            (local.amount(Resource::Cpu) == Quantity::from_units(cpu)).then_some(())
        })
        .await
        .unwrap();
    }

    fn denied(&self, reason: &str) -> u64 {
        self.webhook_metrics
            .admissions
            .with_label_values(&["denied", reason])
            .get()
    }

    async fn create(&self, name: &str, instance_type: &str) -> Result<Machine, kube::Error> {
        self.machines()
            .create(
                &PostParams::default(),
                &common::machine(name, &aws(instance_type)),
            )
            .await
    }

    /// The cpu of every Machine in the user cluster.
    async fn machine_cpu(&self) -> Quantity {
        let mut sizes = Vec::new();
        for m in self.machines().list(&ListParams::default()).await.unwrap() {
            let spec = m.spec.provider_spec.value.clone().unwrap();
            sizes.push(size_of(&spec));
        }
        ResourceDetails::checked_sum(sizes.iter())
            .unwrap()
            .amount(Resource::Cpu)
    }
}

/// Deletes the ledger for good: its finalizer removed first (what a forced clean-up or a CRD
/// re-install does).
/// Deleted first, its finalizer stripped after: the API server lets no one add a finalizer to an
/// object being deleted, so master-controller's next apply cannot put it back in between (the
/// other order left the ledger Terminating for good in one CI run).
async fn force_delete(ledgers: &Api<QuotaLedger>) {
    ledgers.delete(LEDGER, &DeleteParams::default()).await.unwrap();
    let unprotect = json!({"metadata": {"finalizers": null}});
    match ledgers
        .patch(LEDGER, &PatchParams::default(), &Patch::Merge(&unprotect))
        .await
    {
        // Gone already: it had no finalizer when deleted.
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(e) => panic!("stripping the ledger's finalizer: {e}"),
    }
}

/// The message of a refused create.
fn refusal(result: Result<Machine, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(status)) => status.message,
        Ok(m) => panic!("expected a refusal, {:?} was admitted", m.name_any()),
        Err(e) => panic!("expected a refusal, got {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_deleted_by_hand_stays_and_keeps_admitting() {
    let world = World::start("8").await;
    world.create("m0", "t3.medium").await.unwrap();
    world.wait_counted(2).await;
    let ledgers = world.ledgers();
    let before = ledgers.get(LEDGER).await.unwrap();
    assert!(
        before.finalizers().iter().any(|f| f == LEDGER_FINALIZER),
        "master-controller applied the ledger without its finalizer: {:?}",
        before.finalizers()
    );

    ledgers.delete(LEDGER, &DeleteParams::default()).await.unwrap();
    let after = ledgers.get_opt(LEDGER).await.unwrap();
    let after = after.expect("the ledger deleted by hand is gone");
    assert!(after.metadata.deletion_timestamp.is_some(), "not Terminating");
    assert_eq!(after.uid(), before.uid(), "the same ledger, not a re-created one");

    // It keeps working: counted, reserved, admitted, and refused over the limit.
    world.create("m1", "t3.medium").await.unwrap();
    world.wait_counted(4).await;
    world.create("m2", "t3.xlarge").await.unwrap();
    world.wait_counted(8).await;
    let message = refusal(world.create("m3", "t3.medium").await);
    assert!(message.contains("uses 8 of 8 cpu"), "{message}");
    assert_eq!(world.machine_cpu().await, Quantity::from_units(8));
    let still = ledgers.get(LEDGER).await.unwrap();
    assert_eq!(still.uid(), before.uid());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn growth_is_refused_until_the_ledger_is_back_and_counted() {
    let mut world = World::start("8").await;
    world.create("m0", "t3.medium").await.unwrap();
    world.create("m1", "t3.medium").await.unwrap();
    world.wait_counted(4).await;

    // The master is down, and the ledger goes for good: its finalizer removed too (what a
    // forced clean-up or a CRD re-install does). KKP's copy of the quota stays on the seed.
    world.stop_master().await;
    let ledgers = world.ledgers();
    force_delete(&ledgers).await;
    wait_for_gone(&ledgers, LEDGER, WAIT).await.unwrap();
    assert!(
        Api::<ResourceQuota>::all(world.seed())
            .get_opt(LEDGER)
            .await
            .unwrap()
            .is_some(),
        "KKP's copy should still be on the seed"
    );

    let before = world.denied("ledger_missing");
    let message = refusal(world.create("m2", "t3.medium").await);
    assert!(
        message.contains("quota ledger of project \"demo\" is missing on this seed"),
        "{message}"
    );
    assert!(
        world.denied("ledger_missing") > before,
        "not counted as ledger_missing"
    );
    // An Event says so too (no owner: on the Cluster, on the seed).
    let events: Api<CoreEvent> = Api::namespaced(world.seed(), "default");
    wait_for(WAIT, "a QuotaLedgerMissing Event", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("QuotaLedgerMissing"))
    })
    .await
    .unwrap();
    // A change that grows nothing still passes (t3.small: same cpu, less memory).
    let shrink =
        json!({"spec": {"providerSpec": {"value": {"cloudProviderSpec": {"instanceType": "t3.small"}}}}});
    world
        .machines()
        .patch("m0", &PatchParams::default(), &Patch::Merge(&shrink))
        .await
        .unwrap();

    // The master re-creates the ledger; seed-controller is down, so nothing running is in it.
    world.stop_seed_controller().await;
    world.start_master();
    let recreated = wait_for(WAIT, "the ledger re-created", || async {
        ledgers.get_opt(LEDGER).await.ok().flatten()
    })
    .await
    .unwrap();
    assert!(
        recreated
            .status
            .as_ref()
            .and_then(|s| s.local_usage.as_ref())
            .is_none(),
        "counted while seed-controller is down?"
    );
    let message = refusal(world.create("m2", "t3.medium").await);
    assert!(message.contains("has not been counted yet"), "{message}");

    // Counted again (m0 and m1: 4 cpu): admitted up to the limit, never beyond.
    world.start_seed_controller().await;
    world.wait_counted(4).await;
    wait_for(WAIT, "m2 admitted", || async {
        world.create("m2", "t3.medium").await
    })
    .await
    .unwrap();
    world.create("m3", "t3.medium").await.unwrap();
    let message = refusal(world.create("m4", "t3.medium").await);
    assert!(message.contains("uses 8 of 8 cpu"), "{message}");
    assert_eq!(world.machine_cpu().await, Quantity::from_units(8));
}

/// A ledger forced away while it held a reservation for a Machine not created yet and another
/// process's allotment (an admission on its way to the API server, headroom a webhook process
/// admits from): the re-created ledger's first count carries both, so their room is not
/// admitted again (issue #32: without this, a burst over a deleted ledger overran the quota).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_ledger_carries_what_the_deleted_one_held() {
    use kkp_quota_crds::ledger::{Allotment, Reservation};

    let mut world = World::start("8").await;
    // The carried allotment lives the admission record grace: long enough for the checks below.
    world.stop_seed_controller().await;
    world.seed_config.admission_record_grace = std::time::Duration::from_mins(1);
    world.start_seed_controller().await;
    world.create("m0", "t3.medium").await.unwrap();
    world.wait_counted(2).await;
    let ledgers = world.ledgers();
    let two_cpu = || -> ResourceDetails { serde_json::from_value(json!({"cpu": "2"})).unwrap() };
    let now = jiff::Timestamp::now();
    let held = kkp_quota_crds::QuotaLedgerStatus {
        reservations: vec![Reservation {
            cluster: "alpha".into(),
            uid: "on-its-way".into(),
            size: two_cpu(),
            reserved: two_cpu(),
            created_at: now,
            deployment: None,
        }],
        allotments: vec![Allotment {
            holder: "another-webhook-process".into(),
            granted: two_cpu(),
            expires_at: now + jiff::SignedDuration::from_mins(2),
            ttl_seconds: Some(120),
        }],
        ..Default::default()
    };
    let wire = serde_json::to_value(&held).unwrap();
    // Written as the webhook writes: by compare-and-swap, again on a conflict.
    let current = wait_for(WAIT, "the held entries written", || async {
        let current = ledgers.get(LEDGER).await.ok()?;
        let patch = json!({
            "metadata": {"resourceVersion": current.resource_version()},
            "status": {"reservations": wire["reservations"], "allotments": wire["allotments"]},
        });
        ledgers
            .patch_status(LEDGER, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .ok()
    })
    .await
    .unwrap();
    // seed-controller has seen them (its watch keeps the ledger's last state).
    wait_for(WAIT, "the held entries seen", || async {
        let status = ledgers.get(LEDGER).await.ok()?.status?;
        (status.reservations.len() == 1 && status.allotments.len() == 1).then_some(())
    })
    .await
    .unwrap();

    // Forced away: finalizer stripped, deleted; the master re-creates it.
    force_delete(&ledgers).await;
    let old_uid = current.uid();
    let status = wait_for(WAIT, "the ledger re-created and counted", || async {
        let ledger = ledgers.get(LEDGER).await.map_err(|e| e.to_string())?;
        if ledger.uid() == old_uid {
            return Err("not re-created yet".to_owned());
        }
        match ledger.status {
            Some(status) if status.local_usage.is_some() => Ok(status),
            _ => Err("re-created, not counted yet".to_owned()),
        }
    })
    .await
    .unwrap();
    assert_eq!(
        status.local_usage.unwrap().amount(Resource::Cpu),
        Quantity::from_units(2)
    );
    let uids: Vec<&str> = status.reservations.iter().map(|r| r.uid.as_str()).collect();
    assert_eq!(uids, ["on-its-way"], "the reservation was not carried over");
    let carried: Vec<(&str, Option<u64>)> = status
        .allotments
        .iter()
        .map(|a| (a.holder.as_str(), a.ttl_seconds))
        .collect();
    // Carried for the grace only (no holder admits from it in the new ledger), under a name no
    // live process takes for its own.
    assert_eq!(
        carried,
        [("another-webhook-process/carried", Some(60))],
        "the allotment was not carried over"
    );

    // 2 running, 2 on their way, 2 held: room for one more t3.medium, not two.
    wait_for(WAIT, "m1 admitted", || async {
        world.create("m1", "t3.medium").await
    })
    .await
    .unwrap();
    let message = refusal(world.create("m2", "t3.medium").await);
    assert!(message.contains("8 cpu"), "{message}");
    assert_eq!(world.machine_cpu().await, Quantity::from_units(4));
}
