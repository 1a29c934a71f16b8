//! The Helm chart (`deploy/charts/kkp-quota`) as the tests use it: rendered by a real helm (built
//! from its Go module by `e2e/helm/build.sh`, cached), applied to the fleet's real API servers,
//! and tokens minted for its service accounts, so that the components run with exactly the
//! permissions the chart grants and nothing else.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kkp_quota_crds::kkp::KUBECONFIG_KEY;
use kube::api::{DynamicObject, GroupVersionKind, ObjectMeta, Patch, PatchParams, PostParams};
use kube::discovery::{Scope, pinned_kind};
use kube::{Api, Client};
use serde_json::Value;

use crate::fleet::KUBERMATIC_NAMESPACE;
use crate::{ControlPlane, Fleet};

/// The chart's directory.
pub const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/charts/kkp-quota");
/// The namespace the chart is installed into, on the master and on every seed.
pub const NAMESPACE: &str = KUBERMATIC_NAMESPACE;
/// The Secret (in [`NAMESPACE`] on the master) with the master's kubeconfig for a seed, as the
/// install docs name it; `{seed}` is the seed's name (master-controller's
/// `--seed-kubeconfig-secret`).
pub const SEED_KUBECONFIG_SECRET: &str = "kkp-quota-seed-{seed}";
/// Field manager of what the tests apply from the chart.
const MANAGER: &str = "kkp-quota-chart-test";
/// How long minted tokens live: longer than any test.
const TOKEN_SECONDS: i64 = 24 * 3600;

/// Who runs as which service account of the chart, and on which of the chart's roles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Identity {
    /// The chart label `app.kubernetes.io/component` of its RBAC objects.
    pub component: &'static str,
    /// The chart role (`master` or `seed`) that creates the service account.
    pub role: &'static str,
    pub service_account: &'static str,
}

/// Every identity the chart creates. `master-on-seed` is master-controller's identity on a seed:
/// the chart's seed role creates it, master-controller uses it through the Secret
/// [`SEED_KUBECONFIG_SECRET`] on the master.
pub const IDENTITIES: [Identity; 4] = [
    Identity {
        component: "master-controller",
        role: "master",
        service_account: "kkp-quota-master-controller",
    },
    Identity {
        component: "seed-controller",
        role: "seed",
        service_account: "kkp-quota-seed-controller",
    },
    Identity {
        component: "machine-webhook",
        role: "seed",
        service_account: "kkp-quota-machine-webhook",
    },
    Identity {
        component: "master-on-seed",
        role: "seed",
        service_account: "kkp-quota-master",
    },
];

impl Identity {
    /// The API server's user name for it.
    pub fn user(&self) -> String {
        format!("system:serviceaccount:{NAMESPACE}:{}", self.service_account)
    }

    /// The identity with this component label.
    pub fn of(component: &str) -> Result<Identity> {
        IDENTITIES
            .into_iter()
            .find(|i| i.component == component)
            .with_context(|| format!("no chart identity for {component}"))
    }
}

/// The helm binary: `e2e/helm/build.sh` builds it once (cached across runs).
pub fn helm() -> Result<PathBuf> {
    static HELM: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    HELM.get_or_init(|| {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/helm/build.sh");
        let out = std::process::Command::new("bash")
            .arg(script)
            .stderr(std::process::Stdio::inherit())
            .output()
            .map_err(|e| format!("running {script}: {e}"))?;
        if !out.status.success() {
            return Err(format!("{script} failed ({})", out.status));
        }
        Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

/// Runs helm with `args` against the cluster of `kubeconfig`: its output (stdout, then stderr),
/// or an error that carries it.
pub fn run(kubeconfig: &Path, args: &[&str]) -> Result<String> {
    let out = std::process::Command::new(helm()?)
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()
        .context("running helm")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        bail!("helm {args:?} failed ({}):\n{text}", out.status);
    }
    Ok(text)
}

/// `helm template` of the chart for `role` (`master` or `seed`) with `--set` `values`: every
/// object it renders, as JSON.
pub fn render(role: &str, values: &[(&str, &str)]) -> Result<Vec<Value>> {
    let mut command = std::process::Command::new(helm()?);
    command.args(["template", "kkp-quota", CHART, "--namespace", NAMESPACE, "--set"]);
    command.arg(format!("role={role}"));
    for (key, value) in values {
        command.arg("--set").arg(format!("{key}={value}"));
    }
    let out = command.output().context("running helm template")?;
    if !out.status.success() {
        bail!(
            "helm template --set role={role} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8(out.stdout).context("helm template printed non-UTF-8")?;
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).context("parsing helm template's output")?;
    Ok(docs.into_iter().filter(Value::is_object).collect())
}

/// The kind of a rendered object.
pub fn kind(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

/// Whether a rendered object is part of the chart's RBAC.
pub fn is_rbac(doc: &Value) -> bool {
    matches!(
        kind(doc),
        "ServiceAccount" | "Role" | "RoleBinding" | "ClusterRole" | "ClusterRoleBinding"
    )
}

/// Server-side applies `docs` to the cluster of `client` (as a dry run when `dry_run`: the API
/// server validates and admits everything, persists nothing). Namespaced objects without a
/// namespace go to [`NAMESPACE`].
pub async fn apply(client: &Client, docs: &[Value], dry_run: bool) -> Result<()> {
    let mut params = PatchParams::apply(MANAGER).force();
    params.dry_run = dry_run;
    for doc in docs {
        let (api_version, kind) = (doc["apiVersion"].as_str(), doc["kind"].as_str());
        let (Some(api_version), Some(kind)) = (api_version, kind) else {
            bail!("a rendered object without apiVersion or kind: {doc}");
        };
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, capabilities) = pinned_kind(client, &gvk)
            .await
            .with_context(|| format!("the API server does not serve {api_version} {kind}"))?;
        let object: DynamicObject = serde_json::from_value(doc.clone())?;
        let name = object
            .metadata
            .name
            .clone()
            .context("a rendered object without a name")?;
        let api: Api<DynamicObject> = match capabilities.scope {
            Scope::Cluster => Api::all_with(client.clone(), &resource),
            Scope::Namespaced => {
                let namespace = object.metadata.namespace.as_deref().unwrap_or(NAMESPACE);
                Api::namespaced_with(client.clone(), namespace, &resource)
            }
        };
        api.patch(&name, &params, &Patch::Apply(&object))
            .await
            .with_context(|| format!("applying {kind} {name} (dry run: {dry_run})"))?;
    }
    Ok(())
}

/// A token for service account `name` in [`NAMESPACE`] (the `TokenRequest` API, as a kubelet gets
/// one for a pod).
pub async fn mint_token(client: &Client, name: &str) -> Result<String> {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(TOKEN_SECONDS),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let response = Api::<ServiceAccount>::namespaced(client.clone(), NAMESPACE)
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .with_context(|| format!("minting a token for ServiceAccount {NAMESPACE}/{name}"))?;
    let token = response.status.and_then(|s| s.token).unwrap_or_default();
    ensure!(!token.is_empty(), "TokenRequest for {name} returned no token");
    Ok(token)
}

/// Where each component finds its credentials when it runs as the chart's identities: the
/// kubeconfig of its own service account on the cluster it runs against.
#[derive(Clone, Debug, Default)]
pub struct ChartKubeconfigs {
    /// `(component, cluster)` to the kubeconfig file.
    files: BTreeMap<(String, String), PathBuf>,
}

impl ChartKubeconfigs {
    /// The kubeconfig of `component` (`master-controller`, `seed-controller`, `machine-webhook`)
    /// on `cluster`.
    pub fn get(&self, component: &str, cluster: &str) -> Option<&Path> {
        self.files
            .get(&(component.to_owned(), cluster.to_owned()))
            .map(PathBuf::as_path)
    }
}

/// Installs the chart's RBAC (service accounts, Roles, Bindings; the master role on the master,
/// the seed role on every seed), mints a token per identity and cluster, writes a kubeconfig per
/// component into `dir`, and writes master-controller's seed credentials into the Secrets
/// [`SEED_KUBECONFIG_SECRET`] on the master, as the install docs tell an admin to.
pub async fn install_identities(fleet: &Fleet, dir: &Path) -> Result<ChartKubeconfigs> {
    // The RBAC, and the seed's empty webhook configuration for Cluster creates, which
    // seed-controller may patch but not create. Not the master's allocation webhook
    // configuration: it names a Service, and the fleet's master-controller is no pod behind one
    // (the demo registers it by URL).
    let rbac = |role| -> Result<Vec<Value>> {
        Ok(render(role, &[])?
            .into_iter()
            .filter(|doc| {
                is_rbac(doc)
                    || (kind(doc) == "ValidatingWebhookConfiguration"
                        && doc["metadata"]["name"] == "kkp-quota-clusters")
            })
            .collect())
    };
    let (master_rbac, seed_rbac) = (rbac("master")?, rbac("seed")?);
    ensure!(
        !master_rbac.is_empty() && !seed_rbac.is_empty(),
        "the chart renders no RBAC"
    );
    std::fs::create_dir_all(dir)?;
    let mut files = BTreeMap::new();

    let master = fleet.master();
    apply(&master.client(), &master_rbac, false).await?;
    let identity = Identity::of("master-controller")?;
    let path = write_kubeconfig(dir, master, identity).await?;
    files.insert(("master-controller".to_owned(), master.name().to_owned()), path);

    for seed in &fleet.spec().seeds {
        let plane = fleet.seed(seed);
        apply(&plane.client(), &seed_rbac, false).await?;
        for component in ["seed-controller", "machine-webhook"] {
            let path = write_kubeconfig(dir, plane, Identity::of(component)?).await?;
            files.insert((component.to_owned(), seed.clone()), path);
        }
        let token = mint_token(&plane.client(), Identity::of("master-on-seed")?.service_account).await?;
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(SEED_KUBECONFIG_SECRET.replace("{seed}", seed)),
                namespace: Some(NAMESPACE.to_owned()),
                ..ObjectMeta::default()
            },
            string_data: Some(
                [(
                    KUBECONFIG_KEY.to_owned(),
                    plane.kubeconfig_for_token("kkp-quota-master", &token)?,
                )]
                .into(),
            ),
            ..Secret::default()
        };
        Api::<Secret>::namespaced(master.client(), NAMESPACE)
            .create(&PostParams::default(), &secret)
            .await
            .with_context(|| format!("writing the master's kubeconfig Secret for {seed}"))?;
    }
    Ok(ChartKubeconfigs { files })
}

async fn write_kubeconfig(dir: &Path, plane: &ControlPlane, identity: Identity) -> Result<PathBuf> {
    let token = mint_token(&plane.client(), identity.service_account).await?;
    let path = dir.join(format!("{}@{}.kubeconfig", identity.component, plane.name()));
    let yaml = plane.kubeconfig_for_token(identity.service_account, &token)?;
    crate::fleet::write_private(&path, yaml.as_bytes())?;
    Ok(path)
}
