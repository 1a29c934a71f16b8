//! Scale and latency measurement of the seed-controller on real apiservers.
//!
//! One seed apiserver and a few "user" apiservers; each simulated user cluster is a namespace
//! `sim-<i>` on one of the user apiservers, and its `Cluster` on the seed has an admin kubeconfig
//! whose context namespace is `sim-<i>`. The controller runs as its own process (the workspace's
//! `seed-controller` binary, so its resident memory is its own) with
//! `--machine-namespace-from-kubeconfig`, which makes it watch the Machines of that namespace.
//!
//! Measured: time from process start until every project's seed `localUsage` is exact (cold
//! start over all Machines), the controller's resident memory, and the latency from a Machine
//! created to the seed `localUsage` counting it (median and p99).
//!
//! ```sh
//! cargo build -p seed-controller && cargo run -p seed-controller --example scale -- \
//!     --clusters 200 --machines-per-cluster 100
//! ```

#![allow(
    clippy::unwrap_used,
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::too_many_lines
)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use e2e::ControlPlane;
use e2e::bench::mib;
use e2e::fleet::create_namespace;
use futures::{StreamExt, stream};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kkp_quota_crds::kkp::{ADMIN_KUBECONFIG_SECRET, Cluster, ClusterSpec, KUBECONFIG_KEY, PROJECT_ID_LABEL};
use kkp_quota_crds::machine::Machine;
use kkp_quota_crds::quota::{PROJECT_KIND, SUBJECT_KIND_LABEL, SUBJECT_NAME_LABEL};
use kkp_quota_crds::{LedgerSubject, QuotaLedger, QuotaLedgerSpec, ResourceDetails};
use kube::Api;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use provider_sizes::{SizeCatalog, size_machine};
use seed_controller::usage::same_usage;
use serde_json::{Value, json};

#[derive(Parser, Debug)]
struct Args {
    #[arg(long, default_value_t = 200)]
    clusters: usize,
    #[arg(long, default_value_t = 100)]
    machines_per_cluster: usize,
    #[arg(long, default_value_t = 3)]
    apiservers: usize,
    #[arg(long, default_value_t = 20)]
    projects: usize,
    #[arg(long, default_value_t = 100)]
    latency_samples: usize,
    #[arg(long, default_value = "seed-controller/results/scale.md")]
    out: PathBuf,
}

fn specs() -> Vec<Value> {
    vec![
        json!({"cloudProvider": "aws", "cloudProviderSpec": {"instanceType": "t3.medium", "diskSize": 50}}),
        json!({"cloudProvider": "aws", "cloudProviderSpec": {"instanceType": "m5.large", "diskSize": 100}}),
        json!({"cloudProvider": "hetzner", "cloudProviderSpec": {"serverType": "cx22"}}),
        json!({"cloudProvider": "hetzner", "cloudProviderSpec": {"serverType": "cx32"}}),
        json!({"cloudProvider": "vsphere", "cloudProviderSpec": {"cpus": 2, "memoryMB": 4096, "diskSizeGB": 20}}),
    ]
}

fn machine(namespace: &str, name: &str, spec: &Value) -> Machine {
    serde_json::from_value(json!({
        "apiVersion": "cluster.k8s.io/v1alpha1", "kind": "Machine",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"providerSpec": {"value": spec}},
    }))
    .unwrap()
}

fn size(spec: &Value) -> ResourceDetails {
    size_machine(&machine("x", "x", spec), &SizeCatalog::shipped(), None).unwrap()
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    kkp_quota_runtime::telemetry::init_tracing(false);
    let started = Instant::now();
    let mut planes = futures::future::try_join_all(
        std::iter::once("seed".to_owned())
            .chain((0..args.apiservers).map(|i| format!("users-{i}")))
            .map(|name| async move { ControlPlane::start(&name).await }),
    )
    .await?;
    let users: Vec<ControlPlane> = planes.split_off(1);
    let seed_cp = planes.remove(0);
    let seed = seed_cp.client();
    create_namespace(&seed, "kubermatic").await?;
    eprintln!("control planes up in {:.1}s", started.elapsed().as_secs_f64());

    // Simulated user clusters, Cluster objects and kubeconfig Secrets, quota copies.
    let projects: Vec<String> = (0..args.projects).map(|p| format!("p{p}")).collect();
    let cluster_of = |i: usize| {
        (
            format!("sim-{i}"),
            &users[i % users.len()],
            projects[i % projects.len()].clone(),
        )
    };
    for project in &projects {
        let mut rq = QuotaLedger::new(
            &format!("project-{project}"),
            QuotaLedgerSpec {
                rollout_allowance: None,
                subject: LedgerSubject::project(project),
                quota: ResourceDetails::default(),
                shares: None,
                reserved_counts: false,
            },
        );
        rq.metadata.labels = Some(BTreeMap::from([
            (SUBJECT_NAME_LABEL.to_owned(), project.clone()),
            (SUBJECT_KIND_LABEL.to_owned(), PROJECT_KIND.to_owned()),
        ]));
        Api::<QuotaLedger>::all(seed.clone())
            .create(&PostParams::default(), &rq)
            .await?;
    }
    stream::iter(0..args.clusters)
        .map(|i| {
            let (name, cp, project) = cluster_of(i);
            let seed = seed.clone();
            async move {
                create_namespace(&cp.client(), &name).await?;
                let cp_ns = format!("cluster-{name}");
                create_namespace(&seed, &cp_ns).await?;
                let secret = Secret {
                    metadata: ObjectMeta {
                        name: Some(ADMIN_KUBECONFIG_SECRET.into()),
                        namespace: Some(cp_ns.clone()),
                        ..ObjectMeta::default()
                    },
                    data: Some(BTreeMap::from([(
                        KUBECONFIG_KEY.to_owned(),
                        ByteString(cp.in_cluster_kubeconfig_with_namespace(&name)?.into_bytes()),
                    )])),
                    ..Secret::default()
                };
                Api::<Secret>::namespaced(seed.clone(), &cp_ns)
                    .create(&PostParams::default(), &secret)
                    .await?;
                let mut cluster = Cluster::new(&name, ClusterSpec::default());
                cluster.metadata.labels = Some(BTreeMap::from([(PROJECT_ID_LABEL.to_owned(), project)]));
                let clusters: Api<Cluster> = Api::all(seed.clone());
                clusters.create(&PostParams::default(), &cluster).await?;
                clusters
                    .patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": {"namespaceName": cp_ns}})),
                    )
                    .await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<()>>>()?;

    // Machines, before the controller starts (cold start).
    let specs = specs();
    let mut expected: BTreeMap<String, ResourceDetails> = projects
        .iter()
        .map(|p| (p.clone(), ResourceDetails::zero()))
        .collect();
    let mut jobs = Vec::new();
    for i in 0..args.clusters {
        let (name, cp, project) = cluster_of(i);
        // Each `Cluster` counts as a cluster of its project (docs/capacity.md).
        let e = expected.get_mut(&project).context("project")?;
        *e = e.checked_add(&ResourceDetails::one_cluster())?;
        for j in 0..args.machines_per_cluster {
            let spec = &specs[(i + j) % specs.len()];
            let e = expected.get_mut(&project).context("project")?;
            *e = e.checked_add(&size(spec))?;
            jobs.push((cp.client(), machine(&name, &format!("m-{j}"), spec)));
        }
    }
    let creating = Instant::now();
    let total_machines = jobs.len();
    stream::iter(jobs)
        .map(|(client, m)| async move {
            let ns = m.metadata.namespace.clone().unwrap_or_default();
            Api::<Machine>::namespaced(client, &ns)
                .create(&PostParams::default(), &m)
                .await
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    eprintln!(
        "{total_machines} Machines in {} clusters created in {:.1}s",
        args.clusters,
        creating.elapsed().as_secs_f64()
    );

    // The controller, as its own process.
    let dir = tempfile::tempdir()?;
    let seed_kubeconfig = dir.path().join("seed.kubeconfig");
    std::fs::write(&seed_kubeconfig, seed_cp.kubeconfig_yaml())?;
    let exe = std::env::current_exe()?;
    let mut bin_dir = exe.parent().context("exe dir")?.to_path_buf();
    if bin_dir.ends_with("examples") || bin_dir.ends_with("deps") {
        bin_dir.pop();
    }
    let spec = e2e::components::ComponentSpec {
        name: "seed-controller".into(),
        program: bin_dir.join("seed-controller"),
        args: vec![
            format!("--kubeconfig={}", seed_kubeconfig.display()),
            "--seed-name=seed".into(),
            "--leader-elect=false".into(),
            "--machine-namespace-from-kubeconfig".into(),
            // The simulated clusters share a few API servers, so each one's quota view (a
            // cluster-scoped CRD and objects written into the user cluster) would be installed
            // by a thousand clusters on the same server at once: a contention no real fleet has
            // (each user cluster is its own API server), which timed the run out. This measures
            // counting; the view is tested on the real fleet (e2e/tests/shares/view.rs).
            "--quota-view=false".into(),
            "--metrics-address=127.0.0.1:0".into(),
        ],
    };
    let start = Instant::now();
    let controller = e2e::components::spawn(&spec, dir.path())?;
    let pid = controller.pid();
    let quotas: Api<QuotaLedger> = Api::all(seed.clone());
    let converged = loop {
        let list = quotas.list(&ListParams::default()).await?;
        let exact = list.items.iter().all(|rq| {
            let want = expected.get(rq.project());
            let have = rq.status.as_ref().and_then(|s| s.local_usage.as_ref());
            matches!((want, have), (Some(w), Some(h)) if same_usage(w, h))
        });
        if exact && list.items.len() == projects.len() {
            break start.elapsed();
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_mins(15),
            "no convergence in 15 minutes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let rss_converged = e2e::procfs::rss_bytes(pid).unwrap_or(0);
    let cpu_converged = e2e::procfs::cpu_seconds(pid).unwrap_or(0.0);
    eprintln!(
        "converged in {:.2}s, RSS {:.1} MiB, CPU {:.1}s",
        converged.as_secs_f64(),
        mib(rss_converged),
        cpu_converged
    );

    // Latency: Machine created -> seed localUsage counts it.
    let (name, cp, project) = cluster_of(0);
    let client = cp.client();
    let machines: Api<Machine> = Api::namespaced(client, &name);
    let mut events = watcher::watcher(
        Api::<QuotaLedger>::all(seed.clone()),
        watcher::Config::default().fields(&format!("metadata.name=project-{project}")),
    )
    .boxed();
    let mut want = expected[&project].clone();
    let mut samples = Vec::new();
    for k in 0..args.latency_samples {
        let spec = &specs[k % specs.len()];
        want = want.checked_add(&size(spec))?;
        let t0 = Instant::now();
        machines
            .create(&PostParams::default(), &machine(&name, &format!("lat-{k}"), spec))
            .await?;
        loop {
            let event = tokio::time::timeout(Duration::from_mins(1), events.next())
                .await
                .context("latency: no quota update within 60s")?
                .context("watch ended")?;
            if let Ok(Event::Apply(rq) | Event::InitApply(rq)) = event
                && rq
                    .status
                    .as_ref()
                    .and_then(|s| s.local_usage.as_ref())
                    .is_some_and(|u| same_usage(u, &want))
            {
                break;
            }
        }
        samples.push(t0.elapsed());
    }
    samples.sort();
    let pct = |p: f64| {
        let idx = ((samples.len() as f64 - 1.0) * p).round() as usize;
        samples[idx.min(samples.len() - 1)].as_secs_f64() * 1000.0
    };
    let (median, p99, max) = (pct(0.5), pct(0.99), pct(1.0));
    let rss_end = e2e::procfs::rss_bytes(pid).unwrap_or(0);
    let peak = e2e::procfs::peak_rss_bytes(pid).unwrap_or(0);
    eprintln!("latency median {median:.1} ms, p99 {p99:.1} ms, max {max:.1} ms");

    let profile = if bin_dir.ends_with("release") {
        "release"
    } else {
        "dev (dependencies at opt-level 2, this crate unoptimised)"
    };
    let report = format!(
        "# seed-controller: scale and latency\n\n\
         Measured by `cargo run -p seed-controller --example scale -- --clusters {clusters} --machines-per-cluster {mpc} --apiservers {apis} --projects {projects}` \
         on the shared 2-core development machine (other engineers' builds and tests running at the same time), \
         controller built with the {profile} profile.\n\n\
         ## Set-up\n\n\
         - 1 seed kube-apiserver + etcd, {apis} user kube-apiservers + etcd, all on loopback.\n\
         - {clusters} simulated user clusters: each is a namespace `sim-<i>` on user apiserver `i mod {apis}`; its `Cluster` on the \
         seed (label `project-id`, `status.namespaceName`) has Secret `admin-kubeconfig` whose context namespace is `sim-<i>`, and \
         the controller runs with `--machine-namespace-from-kubeconfig`, so it keeps one Machine watch per simulated cluster exactly \
         as for real ones ({clusters} clients, {clusters} watches).\n\
         - {projects} projects ({per_project} clusters each), one seed quota copy per project.\n\
         - {total} Machines ({mpc} per cluster; aws t3.medium/m5.large, hetzner cx22/cx32, vsphere 2 cpu/4 GiB), created before the controller starts.\n\
         - The controller runs as its own process (`seed-controller` binary), so memory figures are its own, with `--quota-view=false` (the simulated clusters share the user apiservers, so their quota views would all be installed on the same few servers at once).\n\n\
         ## Results\n\n\
         | measurement | value |\n| --- | --- |\n\
         | cold start -> every project's `localUsage` exact | {conv:.2} s |\n\
         | resident memory at convergence | {rss_c:.1} MiB |\n\
         | CPU time used until convergence | {cpu:.1} s |\n\
         | resident memory after the latency run | {rss_e:.1} MiB |\n\
         | peak resident memory (VmHWM) | {peak:.1} MiB |\n\
         | Machine created -> seed `localUsage` counts it, median ({n} Machines, one after another) | {median:.1} ms |\n\
         | same, p99 | {p99:.1} ms |\n\
         | same, max | {max:.1} ms |\n\n\
         Latency is measured from just before the Machine create call to the watch event of the seed quota copy whose \
         `localUsage` includes the Machine (user apiserver -> watch -> sizing -> compare-and-swap write on the seed -> watch).\n",
        clusters = args.clusters,
        mpc = args.machines_per_cluster,
        apis = args.apiservers,
        projects = args.projects,
        per_project = args.clusters.div_ceil(args.projects.max(1)),
        total = total_machines,
        conv = converged.as_secs_f64(),
        rss_c = mib(rss_converged),
        cpu = cpu_converged,
        rss_e = mib(rss_end),
        peak = mib(peak),
        n = samples.len(),
    );
    if let Some(parent) = args.out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&args.out, report)?;
    eprintln!("wrote {}", args.out.display());
    drop(controller);
    Ok(())
}
