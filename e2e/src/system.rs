//! The whole quota system beside a fleet: master-controller on the master, and a seed-controller
//! and a machine-webhook per seed, each a real child process built from this workspace, with its
//! ops endpoint on a free loopback port. Used by `make demo` and by the end-to-end tests.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::bench::{Buckets, add, growth, histogram_buckets, histogram_buckets_with};
use crate::certs::WebhookCerts;
use crate::components::{ComponentSpec, RunningComponent, spawn};
use crate::{Fleet, Role};

/// The binaries the system consists of.
pub const COMPONENT_CRATES: [&str; 3] = ["master-controller", "seed-controller", "machine-webhook"];

/// One running component and where its `/metrics`, `/healthz` and `/readyz` are served.
#[derive(Debug)]
pub struct Component {
    pub name: String,
    /// `master-controller`, `seed-controller` or `machine-webhook`.
    pub kind: &'static str,
    /// The seed it serves; `None` for master-controller.
    pub seed: Option<String>,
    pub metrics_address: SocketAddr,
    pub log: PathBuf,
    spec: ComponentSpec,
    /// `None` while killed ([`Component::kill`]).
    process: Option<RunningComponent>,
}

impl Component {
    /// The process id (0 while killed).
    pub fn pid(&self) -> u32 {
        self.process.as_ref().map_or(0, RunningComponent::pid)
    }

    /// How it ended, if it has.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.process.as_mut().and_then(RunningComponent::exit_status)
    }

    /// Kills it (SIGKILL, no clean stop: what a crash or a node loss does).
    pub fn kill(&mut self) {
        self.process = None;
    }

    /// The text of its `/metrics`.
    pub async fn scrape(&self) -> Result<String> {
        scrape_metrics(self.metrics_address).await
    }

    /// Whether it answers `/readyz` with 200 (a master-controller only once it leads and its
    /// caches are synced).
    pub async fn is_ready(&self) -> bool {
        readyz(self.metrics_address).await.is_ok()
    }

    /// The value of its flag `name` (`--listen-address` gives what follows `--listen-address=`).
    pub fn flag(&self, name: &str) -> Option<&str> {
        let prefix = format!("{name}=");
        self.spec
            .args
            .iter()
            .find_map(|arg| arg.strip_prefix(prefix.as_str()))
    }

    /// Starts it again without the flags that start with `prefix` (a fault injected by a flag,
    /// healed); its log is appended to.
    pub fn restart_without(&mut self, prefix: &str) -> Result<()> {
        self.spec.args.retain(|arg| !arg.starts_with(prefix));
        self.restart()
    }

    /// Starts it again with `flag` added (a setting an admin changes by a restart, such as
    /// master-controller's `--gone-seeds`); its log is appended to.
    pub fn restart_with(&mut self, flag: &str) -> Result<()> {
        self.spec.args.push(flag.to_owned());
        self.restart()
    }

    /// Starts it again with the same flags (after [`Component::kill`]); its log is appended to.
    pub fn restart(&mut self) -> Result<()> {
        self.process = None;
        let logs = self.log.parent().context("component log without a directory")?;
        self.process = Some(spawn(&self.spec, logs)?);
        Ok(())
    }
}

/// A fleet with the whole system beside it, as the end-to-end tests use it: the components built
/// (see [`build_components`]), the fleet started, its files written to a temporary directory,
/// every component ready, and every user cluster's webhook configuration written. Dropping it stops the components, then the fleet, then removes the
/// directory.
pub struct FleetWithSystem {
    pub system: System,
    pub fleet: Fleet,
    pub dir: tempfile::TempDir,
}

impl FleetWithSystem {
    pub async fn start(spec: crate::FleetSpec) -> Result<FleetWithSystem> {
        FleetWithSystem::start_with(spec, &[]).await
    }

    /// [`FleetWithSystem::start`], with `extra` flags appended to every component of a kind:
    /// `(kind, flag)`.
    pub async fn start_with(spec: crate::FleetSpec, extra: &[(&str, &str)]) -> Result<FleetWithSystem> {
        FleetWithSystem::start_as(spec, extra, false).await
    }

    /// [`FleetWithSystem::start_with`], every component running as its service account from the
    /// Helm chart (only the chart's RBAC, installed by [`crate::chart::install_identities`]).
    pub async fn start_under_chart(
        spec: crate::FleetSpec,
        extra: &[(&str, &str)],
    ) -> Result<FleetWithSystem> {
        FleetWithSystem::start_as(spec, extra, true).await
    }

    async fn start_as(
        spec: crate::FleetSpec,
        extra: &[(&str, &str)],
        chart: bool,
    ) -> Result<FleetWithSystem> {
        tokio::task::spawn_blocking(build_components)
            .await
            .context("building the components")??;
        let fleet = Fleet::start(spec).await?;
        let dir = tempfile::tempdir().context("a directory for the fleet's files")?;
        fleet.write_dir(dir.path())?;
        let credentials = Credentials::for_fleet(&fleet, dir.path(), chart).await?;
        let system = match System::start_as(&fleet, dir.path(), extra, &credentials).await {
            Ok(system) => system,
            Err(e) => {
                // The directory goes with this error: a start that failed keeps its logs.
                keep_logs(dir.path());
                return Err(e);
            }
        };
        // The system is in force once seed-controller has pointed every user cluster at the
        // webhook; before that, Machines are created unchecked.
        for cluster in &fleet.spec().user_clusters {
            let configs = kube::Api::<
                k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration,
            >::all(fleet.user_cluster(&cluster.name).client());
            crate::wait_for_object(&configs, "kkp-quota-machines", Duration::from_mins(2)).await?;
        }
        Ok(FleetWithSystem { system, fleet, dir })
    }
}

/// The text of the `/metrics` served at `address` (any component's ops endpoint).
pub async fn scrape_metrics(address: SocketAddr) -> Result<String> {
    let url = format!("http://{address}/metrics");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    Ok(http.get(&url).send().await?.error_for_status()?.text().await?)
}

/// The value of `series` (a metric name with its labels as exposed, e.g.
/// `kkp_quota_master_leader` or `x_total{seed="a"}`) in Prometheus text `metrics`.
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Set to keep the components' logs of every run, not only of failed ones.
pub const KEEP_LOGS_ENV: &str = "KKP_QUOTA_KEEP_LOGS";

impl Drop for FleetWithSystem {
    /// A failed test (or one run with [`KEEP_LOGS_ENV`]) keeps the components' logs under
    /// `target/e2e-logs/`, since the temporary directory goes with the fleet.
    fn drop(&mut self) {
        if !std::thread::panicking() && std::env::var_os(KEEP_LOGS_ENV).is_none() {
            return;
        }
        keep_logs(self.dir.path());
    }
}

/// Copies the components' logs of the run in `dir` to `target/e2e-logs/<dir's name>/`.
fn keep_logs(dir: &Path) {
    let kept = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/e2e-logs")).join(
        dir.file_name()
            .map_or_else(|| "run".into(), |n| n.to_string_lossy().into_owned()),
    );
    let copied = std::fs::create_dir_all(&kept).and_then(|()| {
        for entry in std::fs::read_dir(dir.join("logs"))? {
            let entry = entry?;
            std::fs::copy(entry.path(), kept.join(entry.file_name()))?;
        }
        Ok(())
    });
    match copied {
        Ok(()) => eprintln!("components' logs kept in {}", kept.display()),
        Err(e) => eprintln!("could not keep the components' logs in {}: {e}", kept.display()),
    }
}

/// Whether the ops server at `address` answers `/readyz` with 200.
async fn readyz(address: SocketAddr) -> Result<()> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?;
    let status = http
        .get(format!("http://{address}/readyz"))
        .send()
        .await?
        .status();
    anyhow::ensure!(status.is_success(), "/readyz answered {status}");
    Ok(())
}

/// Whose credentials the components run with.
#[derive(Clone, Debug, Default)]
pub enum Credentials {
    /// The fleet's admin kubeconfigs (`system:masters`).
    #[default]
    Admin,
    /// The Helm chart's service accounts; master-controller reads each seed's credentials from the
    /// Secrets the install docs name ([`crate::chart::SEED_KUBECONFIG_SECRET`]).
    Chart(crate::chart::ChartKubeconfigs),
}

impl Credentials {
    /// The fleet's admin, or with `chart` the chart's service accounts: its RBAC installed on
    /// the master and seeds, tokens minted, kubeconfigs written to `<dir>/identities`.
    pub async fn for_fleet(fleet: &Fleet, dir: &Path, chart: bool) -> Result<Credentials> {
        if !chart {
            return Ok(Credentials::Admin);
        }
        let identities = crate::chart::install_identities(fleet, &dir.join("identities"))
            .await
            .context("installing the chart's RBAC and minting its tokens")?;
        tracing::info!(
            "components run as the chart's service accounts (kubeconfigs in {}/identities)",
            dir.display()
        );
        Ok(Credentials::Chart(identities))
    }

    /// The kubeconfig file `component` uses for `cluster` (fleet files in `dir`).
    fn kubeconfig(&self, dir: &Path, component: &str, cluster: &str) -> Result<String> {
        let path = match self {
            Credentials::Admin => dir.join(format!("{cluster}.kubeconfig")),
            Credentials::Chart(files) => files
                .get(component, cluster)
                .with_context(|| format!("no chart identity for {component} on {cluster}"))?
                .to_path_buf(),
        };
        Ok(path.display().to_string())
    }
}

/// master-controller's flags in the fleet: its kubeconfig, metrics address, and the allocation
/// webhook served with the machine webhooks' certificate.
fn master_controller_args(
    kubeconfig: &str,
    metrics: SocketAddr,
    allocation_webhook: SocketAddr,
    certs: &crate::certs::WebhookCertPaths,
    credentials: &Credentials,
) -> Vec<String> {
    let mut args = vec![
        format!("--kubeconfig={kubeconfig}"),
        format!("--metrics-address={metrics}"),
        "--resync-period=30s".to_owned(),
        format!("--webhook-address={allocation_webhook}"),
        format!("--tls-cert-file={}", certs.cert.display()),
        format!("--tls-key-file={}", certs.key.display()),
        format!("--webhook-namespace={}", crate::fleet::KUBERMATIC_NAMESPACE),
    ];
    if let Credentials::Chart(_) = credentials {
        args.push(format!(
            "--seed-kubeconfig-secret={}",
            crate::chart::SEED_KUBECONFIG_SECRET
        ));
    }
    args
}

/// The running system; dropping it kills every component.
#[derive(Debug)]
pub struct System {
    pub components: Vec<Component>,
    /// The CA that signs the webhooks' serving certificate.
    pub webhook_ca: PathBuf,
    /// The URL-signing key file every seed-controller and machine-webhook is given (one base64
    /// key per line, the first signs). Rewrite it to rotate: both re-read it on change.
    pub url_signing_keys: PathBuf,
    /// Where master-controller serves the allocation webhook (same serving certificate as the
    /// machine webhooks); registered on the master only by the demo (`demo::write_demo_group`).
    pub allocation_webhook: SocketAddr,
}

/// A fresh URL-signing key: 32 random bytes, base64 (one line of a key file).
pub fn generate_url_signing_key() -> Result<String> {
    use base64::Engine as _;
    use std::io::Read as _;
    let mut raw = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut raw))
        .context("reading /dev/urandom")?;
    Ok(base64::engine::general_purpose::STANDARD.encode(raw))
}

/// Writes a key file atomically (a reader never sees it half written).
pub fn write_url_signing_keys(path: &Path, keys: &[&str]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, keys.join("\n") + "\n").with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

pub use crate::ports::free_port;

/// Builds the component binaries (a no-op when they are fresh), so tests run the current code
/// even under `cargo test -p e2e`. Set `KKP_QUOTA_SKIP_BUILD=1` to use what is there.
pub fn build_components() -> Result<()> {
    if std::env::var_os("KKP_QUOTA_SKIP_BUILD").is_some() || crate::components::binaries_overridden() {
        return Ok(());
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = std::process::Command::new(cargo);
    command.args(["build", "--locked", "--bins"]);
    // The same profile as the running executable (a `--release` benchmark runs release builds).
    if crate::components::profile_dir()?.file_name() == Some(std::ffi::OsStr::new("release")) {
        command.arg("--release");
    }
    for krate in COMPONENT_CRATES {
        command.args(["-p", krate]);
    }
    // The kubectl plugin, which the fleet tests run as users would.
    command.args(["-p", "kubectl-kkp-quota"]);
    command.current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let status = command
        .status()
        .context("running cargo build for the components")?;
    if !status.success() {
        bail!("cargo build of the components failed ({status})");
    }
    Ok(())
}

impl System {
    /// Starts every component for `fleet`, whose kubeconfigs were written to `dir` by
    /// [`Fleet::write_dir`], and waits until each answers `/readyz`.
    pub async fn start(fleet: &Fleet, dir: &Path) -> Result<System> {
        System::start_with(fleet, dir, &[]).await
    }

    /// [`System::start`], with `extra` flags appended to every component of a kind:
    /// `(kind, flag)`.
    pub async fn start_with(fleet: &Fleet, dir: &Path, extra: &[(&str, &str)]) -> Result<System> {
        System::start_as(fleet, dir, extra, &Credentials::Admin).await
    }

    /// [`System::start_with`], with `credentials` choosing whose identity each component uses.
    pub async fn start_as(
        fleet: &Fleet,
        dir: &Path,
        extra: &[(&str, &str)],
        credentials: &Credentials,
    ) -> Result<System> {
        System::start_except(fleet, dir, extra, credentials, &[]).await
    }

    /// [`System::start_as`], without the components of the seeds in `elsewhere` (whose
    /// seed-controller and machine-webhook run as pods on a node, from the chart).
    pub async fn start_except(
        fleet: &Fleet,
        dir: &Path,
        extra: &[(&str, &str)],
        credentials: &Credentials,
        elsewhere: &[&str],
    ) -> Result<System> {
        let logs = dir.join("logs");
        let certs = WebhookCerts::generate()?.write_to(&dir.join("webhook"))?;
        let url_signing_keys = dir.join("webhook").join("url-signing-keys");
        write_url_signing_keys(&url_signing_keys, &[&generate_url_signing_key()?])?;
        let mut specs = Vec::new();
        let kubeconfig = |component: &str, cluster: &str| credentials.kubeconfig(dir, component, cluster);

        let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let allocation_webhook = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let master_args = master_controller_args(
            &kubeconfig("master-controller", crate::fleet::MASTER)?,
            metrics,
            allocation_webhook,
            &certs,
            credentials,
        );
        specs.push((
            "master-controller",
            None,
            metrics,
            ComponentSpec::workspace_bin("master-controller", master_args)?,
        ));
        let seeds = fleet.members().into_iter().filter(|m| m.role == Role::Seed);
        for member in seeds.filter(|m| !elsewhere.contains(&m.name.as_str())) {
            let seed = member.name;
            let webhook_port = free_port()?;
            let webhook_metrics = SocketAddr::from(([127, 0, 0, 1], free_port()?));
            let mut webhook = ComponentSpec::workspace_bin(
                "machine-webhook",
                vec![
                    format!("--kubeconfig={}", kubeconfig("machine-webhook", &seed)?),
                    format!("--listen-address=127.0.0.1:{webhook_port}"),
                    format!("--tls-cert-file={}", certs.cert.display()),
                    format!("--tls-key-file={}", certs.key.display()),
                    format!("--metrics-address={webhook_metrics}"),
                    format!("--url-signing-keys={}", url_signing_keys.display()),
                    format!("--seed-name={seed}"),
                ],
            )?;
            webhook.name = format!("machine-webhook-{seed}");
            specs.push(("machine-webhook", Some(seed.clone()), webhook_metrics, webhook));

            let seed_metrics = SocketAddr::from(([127, 0, 0, 1], free_port()?));
            let mut controller = ComponentSpec::workspace_bin(
                "seed-controller",
                vec![
                    format!("--kubeconfig={}", kubeconfig("seed-controller", &seed)?),
                    format!("--seed-name={seed}"),
                    format!("--metrics-address={seed_metrics}"),
                    format!("--webhook-url=https://127.0.0.1:{webhook_port}"),
                    format!("--webhook-ca-file={}", certs.ca.display()),
                    format!("--url-signing-keys={}", url_signing_keys.display()),
                    "--resync-period=1m".to_owned(),
                ],
            )?;
            controller.name = format!("seed-controller-{seed}");
            specs.push(("seed-controller", Some(seed), seed_metrics, controller));
        }

        let mut components = Vec::new();
        for (kind, seed, metrics_address, mut spec) in specs {
            spec.args.extend(
                extra
                    .iter()
                    .filter(|(k, _)| *k == kind)
                    .map(|(_, flag)| (*flag).to_owned()),
            );
            if !spec.program.exists() {
                bail!(
                    "{} is not built; run `cargo build -p {kind}` (make demo does)",
                    spec.program.display()
                );
            }
            let process = spawn(&spec, &logs)?;
            components.push(Component {
                name: spec.name.clone(),
                kind,
                seed,
                metrics_address,
                log: logs.join(format!("{}.log", spec.name)),
                spec,
                process: Some(process),
            });
        }
        let mut system = System {
            components,
            webhook_ca: certs.ca,
            allocation_webhook,
            url_signing_keys,
        };
        system.wait_ready(Duration::from_mins(2)).await?;
        Ok(system)
    }

    /// Waits until every component answers `/readyz` with 200; fails at once, with the reason
    /// its log gives, if one exits first.
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        for component in &mut self.components {
            let address = component.metrics_address;
            let what = format!("{} ready at http://{address}/readyz", component.name);
            let Some(process) = component.process.as_mut() else {
                bail!("{} is not running", component.name);
            };
            process.wait_until(timeout, &what, || readyz(address)).await?;
        }
        Ok(())
    }

    /// The component named `name`.
    pub fn component_mut(&mut self, name: &str) -> Option<&mut Component> {
        self.components.iter_mut().find(|c| c.name == name)
    }

    /// The components of one kind.
    pub fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Component> + 'a {
        self.components.iter().filter(move |c| c.kind == kind)
    }

    /// The last `lines` lines of every component's log (what a failure report on CI needs: the
    /// logs kept under `target/e2e-logs/` do not leave the machine).
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for component in &self.components {
            let text = std::fs::read_to_string(&component.log).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            let _ = writeln!(
                out,
                "--- {} (last {} lines)",
                component.name,
                lines.min(all.len())
            );
            for line in &all[all.len().saturating_sub(lines)..] {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }

    /// The text of every component's `/metrics`, concatenated.
    pub async fn scrape_all(&self) -> Result<String> {
        let mut text = String::new();
        for component in &self.components {
            text.push_str(&component.scrape().await?);
        }
        Ok(text)
    }
}

/// Every machine-webhook's histograms, summed (for benchmarks): the whole decision, the reserver's part of it by
/// path, the waits for share by how they ended, and the demands written.
#[derive(Clone, Default)]
pub struct Webhooks {
    pub decision: Buckets,
    pub allotment: Buckets,
    pub write: Buckets,
    pub share_allowed: Buckets,
    pub share_denied: Buckets,
    pub demands: f64,
}

impl Webhooks {
    pub async fn scrape(system: &System) -> Result<Webhooks> {
        let mut text = String::new();
        for webhook in system.of_kind("machine-webhook") {
            text.push_str(&webhook.scrape().await?);
        }
        let wait = |label: &str| histogram_buckets_with(&text, "kkp_quota_reservation_wait_seconds", label);
        let share = |label: &str| histogram_buckets_with(&text, "kkp_quota_share_wait_seconds", label);
        Ok(Webhooks {
            decision: histogram_buckets(&text, "kkp_quota_admission_duration_seconds"),
            allotment: wait("path=\"allotment\""),
            write: wait("path=\"write\""),
            share_allowed: share("result=\"allowed\""),
            share_denied: share("result=\"denied\""),
            demands: text
                .lines()
                .filter_map(|l| l.strip_prefix("kkp_quota_share_demands_total "))
                .filter_map(|v| v.trim().parse::<f64>().ok())
                .sum(),
        })
    }

    #[must_use]
    pub fn since(&self, before: &Webhooks) -> Webhooks {
        Webhooks {
            decision: growth(&before.decision, &self.decision),
            allotment: growth(&before.allotment, &self.allotment),
            write: growth(&before.write, &self.write),
            share_allowed: growth(&before.share_allowed, &self.share_allowed),
            share_denied: growth(&before.share_denied, &self.share_denied),
            demands: self.demands - before.demands,
        }
    }

    pub fn add(&mut self, more: &Webhooks) {
        add(&mut self.decision, &more.decision);
        add(&mut self.allotment, &more.allotment);
        add(&mut self.write, &more.write);
        add(&mut self.share_allowed, &more.share_allowed);
        add(&mut self.share_denied, &more.share_denied);
        self.demands += more.demands;
    }
}
