//! The real `kubectl`, run as a user would run it, for tests that check what a person sees:
//! admission warnings (`Warning: ...` on stderr), dry-run answers, denials.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result};

/// What one `kubectl` command printed, and whether it succeeded.
#[derive(Debug)]
pub struct Output {
    pub success: bool,
    /// The exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// The admission warnings kubectl printed (`Warning: <text>` lines on stderr), without the
    /// prefix.
    pub fn warnings(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter_map(|l| l.strip_prefix("Warning: "))
            .collect()
    }
}

/// Runs `kubectl --kubeconfig <kubeconfig> <args>`, with `stdin` as its input (for `-f -`).
pub fn run(kubeconfig: &Path, args: &[&str], stdin: &str) -> Result<Output> {
    let mut command = Command::new(crate::assets::kubectl()?);
    command
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args);
    output(command, stdin)
}

/// Runs `kubectl kkp-quota <args>` as a user who installed the plugin would: the workspace's
/// `kubectl-kkp_quota` on `PATH`, and the kubeconfig in `KUBECONFIG` (kubectl hands a plugin
/// none of its own flags).
pub fn plugin(kubeconfig: &Path, args: &[&str], stdin: &str) -> Result<Output> {
    let dir = crate::components::profile_dir()?;
    anyhow::ensure!(
        dir.join("kubectl-kkp_quota").exists(),
        "{}/kubectl-kkp_quota is not built; run `cargo build -p kubectl-kkp-quota`",
        dir.display()
    );
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![dir];
    paths.extend(std::env::split_paths(&path));
    let mut command = Command::new(crate::assets::kubectl()?);
    command
        .env("PATH", std::env::join_paths(paths).context("joining PATH")?)
        .env("KUBECONFIG", kubeconfig)
        .arg("kkp-quota")
        .args(args);
    output(command, stdin)
}

fn output(mut command: Command, stdin: &str) -> Result<Output> {
    let program = command.get_program().to_owned();
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", program.display()))?;
    child
        .stdin
        .take()
        .context("kubectl's stdin")?
        .write_all(stdin.as_bytes())
        .context("writing kubectl's input")?;
    let out = child.wait_with_output().context("waiting for kubectl")?;
    Ok(Output {
        success: out.status.success(),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}
