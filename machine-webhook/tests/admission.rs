//! Single admissions through real API servers: fits, does not fit, deletes and shrinks, no
//! quota, quota below usage, unsizeable Machines, unknown clusters, certificate rotation.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Result;
use common::*;
use e2e::wait_for;
use kkp_quota_crds::kkp::{Cluster, ClusterSpec, PROJECT_ID_LABEL};
use kkp_quota_crds::quota::{PROJECT_KIND, SUBJECT_KIND_LABEL, SUBJECT_NAME_LABEL};
use kkp_quota_crds::{
    KkpQuota, LedgerSubject, QuotaLedger, QuotaLedgerSpec, Resource, ResourceQuota, ResourceQuotaSpec,
    Subject,
};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

/// Posts an `AdmissionReview` straight to the webhook, trusting `ca_pem`, at `cluster`'s URL
/// with the token seed-controller would write (from the key file in `certs`).
async fn review(
    seed: &Client,
    address: SocketAddr,
    certs: &Certs,
    ca_pem: &str,
    cluster: &str,
    operation: &str,
    object: Value,
) -> Result<Value> {
    let http = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes())?)
        .build()?;
    let body = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "7b1d0f6c-0000-4000-8000-000000000001",
            "kind": {"group": "cluster.k8s.io", "version": "v1alpha1", "kind": "Machine"},
            "resource": {"group": "cluster.k8s.io", "version": "v1alpha1", "resource": "machines"},
            "name": object["metadata"]["name"],
            "namespace": NS,
            "operation": operation,
            "userInfo": {"username": "test"},
            "object": object,
            "dryRun": false
        }
    });
    let response = http
        .post(admission_url(seed, address, cluster, certs).await?)
        .json(&body)
        .send()
        .await?
        .error_for_status()?;
    let review: Value = response.json().await?;
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(review["response"]["uid"], "7b1d0f6c-0000-4000-8000-000000000001");
    Ok(review["response"].clone())
}

fn machine_json(name: &str, cpus: i64) -> Value {
    let mut value = serde_json::to_value(machine(name, cpus)).expect("serialisable");
    value["metadata"]["uid"] = json!(format!("uid-{name}"));
    value
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_admissions_on_a_real_fleet() -> Result<()> {
    let fleet = fleet().await?;
    let seed = fleet.seed(SEED).client();
    let alpha = fleet.user_cluster("alpha").client();
    let certs = certs()?;
    // 16 cpu, 12 in use: room for 4.
    write_quota(seed.clone(), PROJECT, "16", "12").await?;
    let webhook = start_webhook(seed.clone(), &certs, "127.0.0.1:0".parse()?).await?;
    register(&seed, alpha.clone(), "alpha", webhook.address, &certs).await?;
    let api = machines(alpha.clone());

    fits_is_admitted_and_reserved(&seed, &api).await?;
    does_not_fit_is_denied_with_the_exact_message(&seed, &api).await?;
    shrinking_and_deleting_always_pass(&seed, &api).await?;
    unsizeable_is_denied_with_the_sizing_message(&api).await?;
    quota_below_usage_denies_with_a_warning(&seed, &api, webhook.address, &certs).await?;
    no_quota_and_unknown_cluster(&seed, webhook.address, &certs).await?;
    a_ledger_the_cache_has_not_seen_records_what_it_admits(&seed, webhook.address, &certs).await?;
    admin_size_catalog_is_watched(&seed, &api).await?;
    certificate_is_reloaded_when_the_files_change(&seed, webhook.address, &certs).await?;

    let metrics = &webhook.metrics;
    assert!(metrics.admissions.with_label_values(&["allowed", "fits"]).get() >= 1);
    assert!(
        metrics
            .admissions
            .with_label_values(&["denied", "quota_exceeded"])
            .get()
            >= 1
    );
    assert!(metrics.writes.get() >= 1);
    webhook.kill().await;
    Ok(())
}

async fn fits_is_admitted_and_reserved(
    seed: &Client,
    api: &Api<kkp_quota_crds::machine::Machine>,
) -> Result<()> {
    let created = api.create(&PostParams::default(), &machine("fits-1", 4)).await?;
    let uid = created.metadata.uid.clone().expect("uid");
    let ledger = reservations(seed.clone(), PROJECT).await?;
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    let r = &ledger[0];
    assert_eq!(r.cluster, "alpha");
    assert_eq!(
        r.uid, uid,
        "the reservation carries the UID the API server stored"
    );
    assert_eq!(r.reserved.amount(Resource::Cpu), 4);
    assert_eq!(
        r.size.amount(Resource::Memory),
        "1Gi".parse::<kkp_quota_crds::Quantity>()?
    );
    assert_eq!(r.size.amount(Resource::Machines), 1);
    Ok(())
}

async fn does_not_fit_is_denied_with_the_exact_message(
    seed: &Client,
    api: &Api<kkp_quota_crds::machine::Machine>,
) -> Result<()> {
    // 12 counted + 4 reserved = 16 of 16.
    let message = denial(api.create(&PostParams::default(), &machine("worker-7f", 4)).await);
    assert!(
        message.ends_with(
            r#"denied the request: machine "worker-7f" needs 4 cpu, project "demo" uses 16 of 16 cpu"#
        ),
        "{message}"
    );
    assert!(api.get_opt("worker-7f").await?.is_none());
    assert_eq!(
        reservations(seed.clone(), PROJECT).await?.len(),
        1,
        "a denial reserves nothing"
    );
    // Several resources: limit memory too, and ask for more of both.
    let quotas: Api<kkp_quota_crds::QuotaLedger> = Api::all(seed.clone());
    quotas
        .patch(
            "project-demo",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"quota": {"cpu": "16", "memory": "4Gi"}}})),
        )
        .await?;
    quotas
        .patch_status(
            "project-demo",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"localUsage": {"cpu": "12", "memory": "2560Mi"}}})),
        )
        .await?;
    let message = denial(api.create(&PostParams::default(), &machine("worker-8a", 2)).await);
    assert!(
        message.ends_with(r#"machine "worker-8a" needs 2 cpu and 1Gi memory, project "demo" uses 16 of 16 cpu and 3584Mi of 4Gi memory"#),
        "{message}"
    );
    quotas
        .patch(
            "project-demo",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"quota": {"cpu": "16", "memory": null}}})),
        )
        .await?;
    Ok(())
}

async fn shrinking_and_deleting_always_pass(
    seed: &Client,
    api: &Api<kkp_quota_crds::machine::Machine>,
) -> Result<()> {
    // Far over quota now (the quota was lowered below usage).
    reset_usage(seed.clone(), PROJECT, "40").await?;
    let shrink = json!({"spec": {"providerSpec": {"value": {"cloudProviderSpec": {"cpus": 2}}}}});
    let after_shrink = api
        .patch("fits-1", &PatchParams::default(), &Patch::Merge(&shrink))
        .await?;
    assert_eq!(
        after_shrink.spec.provider_spec.value.as_ref().expect("spec")["cloudProviderSpec"]["cpus"],
        2
    );
    // A metadata-only change passes too.
    api.patch(
        "fits-1",
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"labels": {"touched": "yes"}}})),
    )
    .await?;
    // Growing it back is denied, naming the growth.
    let grow = json!({"spec": {"providerSpec": {"value": {"cloudProviderSpec": {"cpus": 3}}}}});
    let message = match api
        .patch("fits-1", &PatchParams::default(), &Patch::Merge(&grow))
        .await
    {
        Err(kube::Error::Api(s)) => s.message,
        other => panic!("growth over quota admitted: {other:?}"),
    };
    assert!(
        message.contains(r#"machine "fits-1" needs 1 more cpu, project "demo" uses 40 of 16 cpu"#),
        "{message}"
    );
    api.delete("fits-1", &DeleteParams::default()).await?;
    wait_for(Duration::from_secs(20), "fits-1 to be deleted", || {
        let api = api.clone();
        async move { matches!(api.get_opt("fits-1").await, Ok(None)) }
    })
    .await?;
    reset_usage(seed.clone(), PROJECT, "12").await?;
    Ok(())
}

async fn unsizeable_is_denied_with_the_sizing_message(
    api: &Api<kkp_quota_crds::machine::Machine>,
) -> Result<()> {
    let message = denial(
        api.create(&PostParams::default(), &unsizeable_machine("odd-1"))
            .await,
    );
    assert!(
        message.contains(r#"machine "odd-1" cannot be sized, so it cannot be checked against the resource quota of project "demo": "#),
        "{message}"
    );
    assert!(
        message.contains("cpus"),
        "provider-sizes' message names the field: {message}"
    );
    Ok(())
}

async fn quota_below_usage_denies_with_a_warning(
    seed: &Client,
    api: &Api<kkp_quota_crds::machine::Machine>,
    address: SocketAddr,
    certs: &Certs,
) -> Result<()> {
    reset_usage(seed.clone(), PROJECT, "20").await?;
    let message = denial(api.create(&PostParams::default(), &machine("late-1", 1)).await);
    assert!(
        message.contains(r#"project "demo" uses 20 of 16 cpu"#),
        "{message}"
    );
    // The warning is in the webhook's answer (the API server passes it on as a Warning header).
    wait_for(Duration::from_secs(20), "the webhook to see usage 20", || async {
        let response = review(
            seed,
            address,
            certs,
            &certs.webhook.ca_pem,
            "alpha",
            "CREATE",
            machine_json("late-2", 1),
        )
        .await?;
        anyhow::ensure!(response["allowed"] == false, "allowed: {response}");
        let warnings = response["warnings"].as_array().cloned().unwrap_or_default();
        anyhow::ensure!(
            warnings.iter().any(|w| w.as_str().is_some_and(
                |w| w.contains(r#"project "demo" is over its resource quota: it uses 20 of 16 cpu"#)
            )),
            "no warning in {response}"
        );
        anyhow::ensure!(response["status"]["code"] == 403, "{response}");
        Ok(())
    })
    .await?;
    reset_usage(seed.clone(), PROJECT, "12").await?;
    Ok(())
}

async fn no_quota_and_unknown_cluster(seed: &Client, address: SocketAddr, certs: &Certs) -> Result<()> {
    // A Cluster of project "other", which has no quota.
    let clusters: Api<Cluster> = Api::all(seed.clone());
    let mut cluster = Cluster::new("nq", ClusterSpec::default());
    cluster.metadata.labels = Some(BTreeMap::from([(
        PROJECT_ID_LABEL.to_owned(),
        "other".to_owned(),
    )]));
    clusters.create(&PostParams::default(), &cluster).await?;
    wait_for(
        Duration::from_secs(20),
        "a project without quota to be allowed",
        || async {
            let response = review(
                seed,
                address,
                certs,
                &certs.webhook.ca_pem,
                "nq",
                "CREATE",
                machine_json("free-1", 64),
            )
            .await?;
            anyhow::ensure!(response["allowed"] == true, "{response}");
            Ok(())
        },
    )
    .await?;
    // Even a Machine that cannot be sized: without a quota there is nothing to check.
    let response = review(
        seed,
        address,
        certs,
        &certs.webhook.ca_pem,
        "nq",
        "CREATE",
        serde_json::to_value(unsizeable_machine("free-2"))?,
    )
    .await?;
    assert_eq!(response["allowed"], true, "{response}");
    assert!(reservations(seed.clone(), PROJECT).await?.is_empty());

    // A Cluster without a project label: authenticated, but its project is unknown.
    let mut unlabelled = Cluster::new("nolabel", ClusterSpec::default());
    unlabelled.metadata.labels = None;
    clusters.create(&PostParams::default(), &unlabelled).await?;
    let response = wait_for(
        Duration::from_secs(20),
        "the webhook to see Cluster nolabel",
        || async {
            review(
                seed,
                address,
                certs,
                &certs.webhook.ca_pem,
                "nolabel",
                "CREATE",
                machine_json("lost-1", 1),
            )
            .await
        },
    )
    .await?;
    assert_eq!(response["allowed"], false);
    let message = response["status"]["message"].as_str().unwrap_or_default();
    assert_eq!(
        message,
        r#"machine "lost-1" cannot be checked against a quota: the Cluster "nolabel" has no project-id label, so its project is unknown"#
    );
    // Deletes pass even there.
    let response = review(
        seed,
        address,
        certs,
        &certs.webhook.ca_pem,
        "nolabel",
        "DELETE",
        machine_json("lost-1", 1),
    )
    .await?;
    assert_eq!(response["allowed"], true);
    Ok(())
}

async fn certificate_is_reloaded_when_the_files_change(
    seed: &Client,
    address: SocketAddr,
    certs: &Certs,
) -> Result<()> {
    let rotated = e2e::certs::WebhookCerts::generate()?;
    // Key first, then certificate: a half-rotated pair is ignored until it matches.
    std::fs::write(&certs.paths.key, &rotated.key_pem)?;
    std::fs::write(&certs.paths.cert, &rotated.cert_pem)?;
    wait_for(
        Duration::from_secs(20),
        "the rotated certificate to be served",
        || async {
            review(
                seed,
                address,
                certs,
                &rotated.ca_pem,
                "nq",
                "CREATE",
                machine_json("rotated-1", 1),
            )
            .await
        },
    )
    .await?;
    assert!(
        review(
            seed,
            address,
            certs,
            &certs.webhook.ca_pem,
            "nq",
            "CREATE",
            machine_json("rotated-2", 1)
        )
        .await
        .is_err(),
        "the old certificate is no longer served"
    );
    Ok(())
}

async fn admin_size_catalog_is_watched(
    seed: &Client,
    api: &Api<kkp_quota_crds::machine::Machine>,
) -> Result<()> {
    // A vSphere Machine without diskSizeGB: its root disk is the template's, unknown offline ...
    let mut no_disk = machine("nodisk-1", 1);
    if let Some(value) = no_disk.spec.provider_spec.value.as_mut() {
        value["cloudProviderSpec"]
            .as_object_mut()
            .expect("object")
            .remove("diskSizeGB");
    }
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let message = denial(api.create(&dry_run, &no_disk).await);
    assert!(message.contains("cannot be sized"), "{message}");
    // ... until the admin says how big vSphere root disks are.
    let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(seed.clone(), "kubermatic");
    let mut catalog = k8s_openapi::api::core::v1::ConfigMap::default();
    catalog.metadata.name = Some("kkp-quota-size-catalog".into());
    catalog.data = Some(BTreeMap::from([(
        "catalog.yaml".to_owned(),
        "rootDiskDefaults:\n  vsphere: 40Gi\n".to_owned(),
    )]));
    configmaps.create(&PostParams::default(), &catalog).await?;
    wait_for(
        Duration::from_secs(20),
        "the admin catalog to size the Machine",
        || {
            let (api, no_disk, dry_run) = (api.clone(), no_disk.clone(), dry_run.clone());
            async move { api.create(&dry_run, &no_disk).await.is_ok() }
        },
    )
    .await?;
    assert!(
        reservations(seed.clone(), PROJECT).await?.is_empty(),
        "a dry run reserves nothing"
    );
    Ok(())
}

/// The ledger read afresh while the cache has none (issue #32): a ledger deleted and re-created
/// is in the API server before the webhook's cache sees it. A request that reaches the webhook
/// in that moment finds KKP's copy of the quota without a ledger, reads the ledger afresh, and
/// is decided on it; an admission then must be recorded there, like any other, or it is a
/// Machine no ledger counts until seed-controller does (the deleted-ledger burst overran by one
/// so). Made lasting here: the ledger of project "late" lacks the labels the cache finds
/// ledgers by, so only the fresh read by name sees it.
async fn a_ledger_the_cache_has_not_seen_records_what_it_admits(
    seed: &Client,
    address: SocketAddr,
    certs: &Certs,
) -> Result<()> {
    let clusters: Api<Cluster> = Api::all(seed.clone());
    let mut cluster = Cluster::new("unseen", ClusterSpec::default());
    cluster.metadata.labels = Some(BTreeMap::from([(PROJECT_ID_LABEL.to_owned(), "late".to_owned())]));
    clusters.create(&PostParams::default(), &cluster).await?;
    let name = "project-late";
    let ledgers: Api<QuotaLedger> = Api::all(seed.clone());
    let ledger = QuotaLedger::new(
        name,
        QuotaLedgerSpec {
            rollout_allowance: None,
            subject: LedgerSubject::project("late"),
            quota: details("16"),
            shares: None,
            reserved_counts: false,
        },
    );
    ledgers.create(&PostParams::default(), &ledger).await?;
    ledgers
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {
                "localUsage": {"cpu": "0"}, "otherSeedsUsage": {"cpu": "0"}, "globalUsage": {"cpu": "0"},
            }})),
        )
        .await?;
    let mut kkp = ResourceQuota::new(
        name,
        ResourceQuotaSpec {
            subject: Subject::project("late"),
            quota: KkpQuota::new(&details("16")),
        },
    );
    kkp.metadata.labels = Some(BTreeMap::from([
        (SUBJECT_NAME_LABEL.to_owned(), "late".to_owned()),
        (SUBJECT_KIND_LABEL.to_owned(), PROJECT_KIND.to_owned()),
    ]));
    Api::<ResourceQuota>::all(seed.clone())
        .create(&PostParams::default(), &kkp)
        .await?;
    // Until the webhook's cache has the Cluster and KKP's copy, the project has no quota there
    // (passed, nothing to record); from then on, every admission must be in the ledger.
    let ledgers = &ledgers;
    let mut attempt = 0;
    let recorded = wait_for(
        Duration::from_secs(20),
        "an admission decided on the unseen ledger, and recorded in it",
        || {
            attempt += 1;
            let machine = format!("late-{attempt}");
            async move {
                let response = review(
                    seed,
                    address,
                    certs,
                    &certs.webhook.ca_pem,
                    "unseen",
                    "CREATE",
                    machine_json(&machine, 2),
                )
                .await?;
                anyhow::ensure!(response["allowed"] == true, "{response}");
                let ledger = ledgers.get(name).await?;
                let uids: Vec<String> = ledger
                    .status
                    .unwrap_or_default()
                    .reservations
                    .into_iter()
                    .map(|r| r.uid)
                    .collect();
                anyhow::ensure!(
                    uids.contains(&format!("uid-{machine}")),
                    "{machine} admitted ({}), not recorded: {uids:?}",
                    response["warnings"]
                );
                Ok(machine)
            }
        },
    )
    .await?;
    eprintln!("{recorded} admitted and recorded on a ledger the cache had not seen");
    Ok(())
}
