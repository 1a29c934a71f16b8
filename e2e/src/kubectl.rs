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
    let kubectl = crate::assets::kubectl()?;
    let mut child = Command::new(&kubectl)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", kubectl.display()))?;
    child
        .stdin
        .take()
        .context("kubectl's stdin")?
        .write_all(stdin.as_bytes())
        .context("writing kubectl's input")?;
    let out = child.wait_with_output().context("waiting for kubectl")?;
    Ok(Output {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}
