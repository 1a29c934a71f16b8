//! A KKP-shaped fleet: a master, seeds and user clusters, each a real [`ControlPlane`], with the
//! objects KKP would have put there.
//!
//! On the **master**: a `Project` per project; namespace `kubermatic` with, per seed, a Secret
//! `kubeconfig-<seed>` (key `kubeconfig`: the seed's admin kubeconfig) and a `Seed` `<seed>`
//! whose `spec.kubeconfig` references it.
//!
//! On each **seed**: namespace `kubermatic`; per user cluster on that seed a `Cluster` `<name>`
//! labelled `project-id=<project>` with `status.namespaceName = cluster-<name>` (written through
//! the status subresource), and namespace `cluster-<name>` holding Secret `admin-kubeconfig`
//! (key `kubeconfig`: the user cluster's admin kubeconfig).
//!
//! On each **user cluster**: the Machine CRD (every control plane has every CRD) and the
//! namespace `kube-system`, where Machines live.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use futures::future::try_join_all;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, ObjectReference, Secret};
use kkp_quota_crds::kkp::{
    ADMIN_KUBECONFIG_SECRET, Cluster, ClusterSpec, KUBECONFIG_KEY, PROJECT_ID_LABEL, Project, ProjectSpec,
    Seed, SeedSpec,
};
use kube::Api;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use serde::Serialize;

use crate::ControlPlane;
use crate::control_plane::StartOptions;

/// Name of the master control plane.
pub const MASTER: &str = "master";
/// KKP's namespace on the master (Seeds and their kubeconfig Secrets) and on every seed.
pub const KUBERMATIC_NAMESPACE: &str = "kubermatic";

/// Name of the Secret on the master (namespace `kubermatic`) with a seed's kubeconfig.
pub fn seed_kubeconfig_secret(seed: &str) -> String {
    format!("kubeconfig-{seed}")
}

/// Namespace on the seed of a user cluster's control plane (KKP's `cluster-<id>`).
pub fn cluster_namespace(cluster: &str) -> String {
    format!("cluster-{cluster}")
}

/// A user cluster: its name, the seed it runs on and the project it belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserClusterSpec {
    pub name: String,
    pub seed: String,
    pub project: String,
}

/// The shape of a fleet. The default (see [`Default`]) is
///
/// | cluster | role | seed | project |
/// | --- | --- | --- | --- |
/// | `master` | master | | |
/// | `seed-a`, `seed-b` | seed | | |
/// | `alpha`, `beta` | user | `seed-a` | `demo` |
/// | `gamma` | user | `seed-b` | `demo` |
///
/// with projects `demo` (three clusters over two seeds: two on one seed for in-seed races, one on
/// the other for cross-seed sums) and `other` (no cluster; add one with
/// [`FleetSpec::with_user_cluster`] for "projects do not mix" tests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetSpec {
    pub seeds: Vec<String>,
    pub projects: Vec<String>,
    pub user_clusters: Vec<UserClusterSpec>,
    /// The master's and the seeds' API servers write an audit log
    /// ([`ControlPlane::audit_log`]); user clusters never (only the platform's roles are audited).
    pub audit: bool,
    /// Every cluster runs kube-controller-manager's garbage collector and namespace controller
    /// ([`ControlPlane::start_controller_manager`]), so owner references cascade and deleted
    /// namespaces empty as in a real cluster. On in [`FleetSpec::default`] (the demo fleet), off
    /// in [`FleetSpec::empty`] (benchmarks measure without it).
    pub controller_managers: bool,
    /// Every control plane is reachable from pods at this host address
    /// ([`crate::control_plane::StartOptions::pod_address`]), and the kubeconfigs the fleet puts
    /// into Secrets name it: for a seed whose components run as pods on a node
    /// ([`crate::node`]).
    pub pod_address: Option<std::net::Ipv4Addr>,
}

impl Default for FleetSpec {
    fn default() -> Self {
        FleetSpec::empty()
            .with_seed("seed-a")
            .with_seed("seed-b")
            .with_project("demo")
            .with_project("other")
            .with_user_cluster("alpha", "seed-a", "demo")
            .with_user_cluster("beta", "seed-a", "demo")
            .with_user_cluster("gamma", "seed-b", "demo")
            .with_controller_managers()
    }
}

impl FleetSpec {
    /// A master alone.
    pub fn empty() -> FleetSpec {
        FleetSpec {
            seeds: Vec::new(),
            projects: Vec::new(),
            user_clusters: Vec::new(),
            audit: false,
            controller_managers: false,
            pod_address: None,
        }
    }

    /// Every control plane reachable from pods at `ip` (see [`FleetSpec::pod_address`]).
    #[must_use]
    pub fn with_pod_address(mut self, ip: std::net::Ipv4Addr) -> FleetSpec {
        self.pod_address = Some(ip);
        self
    }

    /// The master's and seeds' API servers record every request (see [`FleetSpec::audit`]).
    #[must_use]
    pub fn with_audit_log(mut self) -> FleetSpec {
        self.audit = true;
        self
    }

    /// Every cluster runs a garbage collector and namespace controller (see
    /// [`FleetSpec::controller_managers`]).
    #[must_use]
    pub fn with_controller_managers(mut self) -> FleetSpec {
        self.controller_managers = true;
        self
    }

    #[must_use]
    pub fn with_seed(mut self, name: &str) -> FleetSpec {
        self.seeds.push(name.to_owned());
        self
    }

    #[must_use]
    pub fn with_project(mut self, name: &str) -> FleetSpec {
        self.projects.push(name.to_owned());
        self
    }

    /// Adds a user cluster; its seed and project must be in the spec too.
    #[must_use]
    pub fn with_user_cluster(mut self, name: &str, seed: &str, project: &str) -> FleetSpec {
        self.user_clusters.push(UserClusterSpec {
            name: name.to_owned(),
            seed: seed.to_owned(),
            project: project.to_owned(),
        });
        self
    }

    /// Names are unique across all clusters, and every user cluster's seed and project exist.
    pub fn validate(&self) -> Result<()> {
        let mut names = BTreeSet::from([MASTER]);
        for name in self
            .seeds
            .iter()
            .chain(self.user_clusters.iter().map(|u| &u.name))
        {
            ensure!(names.insert(name), "cluster name {name:?} is used twice");
        }
        let projects: BTreeSet<_> = self.projects.iter().collect();
        ensure!(projects.len() == self.projects.len(), "a project is listed twice");
        for user in &self.user_clusters {
            ensure!(
                self.seeds.contains(&user.seed),
                "user cluster {}: unknown seed {}",
                user.name,
                user.seed
            );
            ensure!(
                projects.contains(&user.project),
                "user cluster {}: unknown project {}",
                user.name,
                user.project
            );
        }
        Ok(())
    }

    /// The user clusters on `seed`.
    pub fn user_clusters_on<'a>(&'a self, seed: &'a str) -> impl Iterator<Item = &'a UserClusterSpec> + 'a {
        self.user_clusters.iter().filter(move |u| u.seed == seed)
    }
}

/// What a cluster is in the fleet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Master,
    Seed,
    User,
}

/// One cluster of the fleet, as written to `fleet.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Member {
    pub name: String,
    pub role: Role,
    /// The parent seed of a user cluster.
    pub seed: Option<String>,
    /// The project of a user cluster.
    pub project: Option<String>,
    /// Absolute path of the kubeconfig ([`Fleet::write_dir`]); empty before that.
    pub kubeconfig: PathBuf,
    pub url: String,
}

/// A running fleet. Dropping it stops every process and removes every temp dir.
pub struct Fleet {
    spec: FleetSpec,
    master: ControlPlane,
    seeds: BTreeMap<String, ControlPlane>,
    users: BTreeMap<String, ControlPlane>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

impl Fleet {
    /// Starts every control plane concurrently, then writes the KKP objects (see the module
    /// docs). If anything fails, whatever had started is stopped again.
    pub async fn start(spec: FleetSpec) -> Result<Fleet> {
        spec.validate()?;
        let names: Vec<&str> = std::iter::once(MASTER)
            .chain(spec.seeds.iter().map(String::as_str))
            .chain(spec.user_clusters.iter().map(|u| u.name.as_str()))
            .collect();
        let audited = 1 + spec.seeds.len();
        let mut planes = try_join_all(names.iter().enumerate().map(|(i, name)| {
            ControlPlane::start_opts(
                name,
                StartOptions {
                    audit: spec.audit && i < audited,
                    pod_address: spec.pod_address,
                },
            )
        }))
        .await?
        .into_iter();
        let master = planes.next().context("master missing")?;
        let seeds = spec.seeds.iter().cloned().zip(planes.by_ref()).collect();
        let users = spec
            .user_clusters
            .iter()
            .map(|u| u.name.clone())
            .zip(planes)
            .collect();
        let fleet = Fleet {
            spec,
            master,
            seeds,
            users,
        };
        if fleet.spec.controller_managers {
            try_join_all(
                fleet
                    .control_planes()
                    .map(|(_, cp)| cp.start_controller_manager()),
            )
            .await?;
        }
        let populating = std::time::Instant::now();
        fleet
            .populate()
            .await
            .context("writing the fleet's KKP objects")?;
        tracing::debug!(elapsed = ?populating.elapsed(), "fleet objects written");
        Ok(fleet)
    }

    pub fn spec(&self) -> &FleetSpec {
        &self.spec
    }

    pub fn master(&self) -> &ControlPlane {
        &self.master
    }

    /// The seed `name`; panics if the fleet has none of that name.
    pub fn seed(&self, name: &str) -> &ControlPlane {
        self.seeds
            .get(name)
            .unwrap_or_else(|| panic!("the fleet has no seed {name:?}"))
    }

    /// The user cluster `name`; panics if the fleet has none of that name.
    pub fn user_cluster(&self, name: &str) -> &ControlPlane {
        self.users
            .get(name)
            .unwrap_or_else(|| panic!("the fleet has no user cluster {name:?}"))
    }

    /// Any cluster by name (`master`, a seed or a user cluster).
    pub fn get(&self, name: &str) -> Option<&ControlPlane> {
        if name == MASTER {
            Some(&self.master)
        } else {
            self.seeds.get(name).or_else(|| self.users.get(name))
        }
    }

    /// The spec of user cluster `name` (its seed and project).
    pub fn user_cluster_spec(&self, name: &str) -> Option<&UserClusterSpec> {
        self.spec.user_clusters.iter().find(|u| u.name == name)
    }

    /// Every cluster: master, seeds, user clusters (kubeconfig paths empty; see
    /// [`Fleet::write_dir`]).
    pub fn members(&self) -> Vec<Member> {
        let member =
            |name: &str, role, seed: Option<&str>, project: Option<&str>, cp: &ControlPlane| Member {
                name: name.to_owned(),
                role,
                seed: seed.map(str::to_owned),
                project: project.map(str::to_owned),
                kubeconfig: PathBuf::new(),
                url: cp.url(),
            };
        let mut members = vec![member(MASTER, Role::Master, None, None, &self.master)];
        for (name, cp) in &self.seeds {
            members.push(member(name, Role::Seed, None, None, cp));
        }
        for user in &self.spec.user_clusters {
            members.push(member(
                &user.name,
                Role::User,
                Some(&user.seed),
                Some(&user.project),
                &self.users[&user.name],
            ));
        }
        members
    }

    /// Every control plane with its name, master first.
    pub fn control_planes(&self) -> impl Iterator<Item = (&str, &ControlPlane)> {
        std::iter::once((MASTER, &self.master))
            .chain(self.seeds.iter().map(|(n, cp)| (n.as_str(), cp)))
            .chain(self.users.iter().map(|(n, cp)| (n.as_str(), cp)))
    }

    /// Every process id (etcd, kube-apiserver and kube-controller-manager of every cluster).
    pub fn pids(&self) -> Vec<u32> {
        self.control_planes().flat_map(|(_, cp)| cp.pids()).collect()
    }

    /// Sum of the resident memory of every process, in bytes.
    pub fn rss_bytes(&self) -> u64 {
        self.pids().into_iter().filter_map(crate::procfs::rss_bytes).sum()
    }

    /// Writes `<cluster>.kubeconfig` (mode 0600) for every cluster and `fleet.json` (the
    /// [`Member`]s with absolute kubeconfig paths) into `dir`, creating it; returns the members.
    pub fn write_dir(&self, dir: &Path) -> Result<Vec<Member>> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let dir = dir.canonicalize()?;
        let mut members = self.members();
        for member in &mut members {
            let path = dir.join(format!("{}.kubeconfig", member.name));
            let cp = self.get(&member.name).context("member without control plane")?;
            write_private(&path, cp.kubeconfig_yaml().as_bytes())?;
            member.kubeconfig = path;
        }
        let json = serde_json::to_string_pretty(&members)?;
        write_private(&dir.join("fleet.json"), format!("{json}\n").as_bytes())?;
        Ok(members)
    }

    /// The files [`Fleet::write_dir`] writes into `dir`.
    pub fn dir_files(&self, dir: &Path) -> Vec<PathBuf> {
        let mut files: Vec<_> = self
            .control_planes()
            .map(|(name, _)| dir.join(format!("{name}.kubeconfig")))
            .collect();
        files.push(dir.join("fleet.json"));
        files
    }

    async fn populate(&self) -> Result<()> {
        let master = self.populate_master();
        let seeds = try_join_all(self.seeds.keys().map(|seed| self.populate_seed(seed)));
        tokio::try_join!(master, seeds)?;
        Ok(())
    }

    async fn populate_master(&self) -> Result<()> {
        let client = self.master.client();
        let projects: Api<Project> = Api::all(client.clone());
        let create_projects = try_join_all(self.spec.projects.iter().map(|project| {
            let projects = projects.clone();
            async move {
                let object = Project::new(
                    project,
                    ProjectSpec {
                        name: project.clone(),
                    },
                );
                projects
                    .create(&PostParams::default(), &object)
                    .await
                    .with_context(|| format!("master: Project {project}"))
            }
        }));
        let create_seeds = async {
            create_namespace(&client, KUBERMATIC_NAMESPACE).await?;
            try_join_all(
                self.seeds
                    .iter()
                    .map(|(name, seed_cp)| self.create_seed(&client, name, seed_cp)),
            )
            .await
        };
        tokio::try_join!(create_projects, create_seeds)?;
        Ok(())
    }

    /// Secret `kubeconfig-<seed>` and `Seed` `<seed>` in `kubermatic` on the master.
    async fn create_seed(&self, client: &kube::Client, name: &str, seed_cp: &ControlPlane) -> Result<()> {
        let pp = PostParams::default();
        let secret_name = seed_kubeconfig_secret(name);
        Api::<Secret>::namespaced(client.clone(), KUBERMATIC_NAMESPACE)
            .create(
                &pp,
                &kubeconfig_secret(&secret_name, KUBERMATIC_NAMESPACE, seed_cp),
            )
            .await
            .with_context(|| format!("master: Secret {secret_name}"))?;
        let reference = ObjectReference {
            name: Some(secret_name),
            namespace: Some(KUBERMATIC_NAMESPACE.to_owned()),
            ..ObjectReference::default()
        };
        let mut seed = Seed::new(
            name,
            SeedSpec {
                kubeconfig: reference,
            },
        );
        seed.metadata.namespace = Some(KUBERMATIC_NAMESPACE.to_owned());
        Api::<Seed>::namespaced(client.clone(), KUBERMATIC_NAMESPACE)
            .create(&pp, &seed)
            .await
            .with_context(|| format!("master: Seed {name}"))?;
        Ok(())
    }

    async fn populate_seed(&self, seed: &str) -> Result<()> {
        let client = self.seeds[seed].client();
        let kubermatic = create_namespace(&client, KUBERMATIC_NAMESPACE);
        let users = try_join_all(
            self.spec
                .user_clusters_on(seed)
                .map(|user| self.create_cluster(&client, seed, user)),
        );
        tokio::try_join!(kubermatic, users)?;
        Ok(())
    }

    /// On the seed: `Cluster` `<name>` (label, status) and Secret `admin-kubeconfig` in its namespace.
    async fn create_cluster(&self, client: &kube::Client, seed: &str, user: &UserClusterSpec) -> Result<()> {
        let pp = PostParams::default();
        let namespace = cluster_namespace(&user.name);
        let clusters: Api<Cluster> = Api::all(client.clone());
        let cluster_object = async {
            let cluster = project_cluster(&user.name, &user.project);
            clusters
                .create(&pp, &cluster)
                .await
                .with_context(|| format!("{seed}: Cluster {}", user.name))?;
            let status = serde_json::json!({"status": {"namespaceName": namespace}});
            clusters
                .patch_status(&user.name, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .with_context(|| format!("{seed}: Cluster {} status", user.name))?;
            anyhow::Ok(())
        };
        let secret = async {
            create_namespace(client, &namespace).await?;
            let secret = kubeconfig_secret(ADMIN_KUBECONFIG_SECRET, &namespace, &self.users[&user.name]);
            Api::<Secret>::namespaced(client.clone(), &namespace)
                .create(&pp, &secret)
                .await
                .with_context(|| format!("{seed}: Secret {namespace}/{ADMIN_KUBECONFIG_SECRET}"))?;
            anyhow::Ok(())
        };
        tokio::try_join!(cluster_object, secret)?;
        Ok(())
    }
}

/// A KKP `Cluster` of `project` (its `project-id` label), as KKP creates one on a seed.
pub fn project_cluster(name: &str, project: &str) -> Cluster {
    let mut cluster = Cluster::new(
        name,
        ClusterSpec {
            human_readable_name: name.to_owned(),
        },
    );
    cluster.metadata.labels = Some(BTreeMap::from([(
        PROJECT_ID_LABEL.to_owned(),
        project.to_owned(),
    )]));
    cluster
}

/// Creates namespace `name` (one that exists already is fine).
pub async fn create_namespace(client: &kube::Client, name: &str) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => bail!("creating namespace {name}: {e}"),
    }
}

fn kubeconfig_secret(name: &str, namespace: &str, cp: &ControlPlane) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            KUBECONFIG_KEY.to_owned(),
            ByteString(cp.in_cluster_kubeconfig_yaml().into_bytes()),
        )])),
        ..Secret::default()
    }
}

pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(bytes)?;
    Ok(())
}
