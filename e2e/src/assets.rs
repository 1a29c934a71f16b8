//! Where the kube-apiserver, kube-controller-manager and etcd binaries come from.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};

/// The envtest convention: a directory holding `kube-apiserver` and `etcd`.
pub const ASSETS_ENV: &str = "KUBEBUILDER_ASSETS";

/// The directory holding `kube-apiserver` and `etcd`: `$KUBEBUILDER_ASSETS` when set, else
/// whatever `e2e/control-plane/build.sh` prints (it builds them from their Go modules on a cold
/// cache, which takes minutes, and answers at once when cached). The answer is remembered for the
/// life of the process.
pub fn control_plane_binaries() -> Result<PathBuf> {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    if let Some(dir) = DIR.get() {
        return Ok(dir.clone());
    }
    let dir = find()?;
    Ok(DIR.get_or_init(|| dir).clone())
}

fn find() -> Result<PathBuf> {
    let dir = match std::env::var_os(ASSETS_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => {
            let script = build_script();
            let out = Command::new("bash")
                .arg(&script)
                .stdin(Stdio::null())
                .stderr(Stdio::inherit())
                .output()
                .with_context(|| format!("running {}", script.display()))?;
            if !out.status.success() {
                bail!("{} failed ({})", script.display(), out.status);
            }
            let text = String::from_utf8(out.stdout).context("build.sh printed non-UTF-8")?;
            PathBuf::from(text.trim())
        }
    };
    for bin in ["kube-apiserver", "etcd"] {
        let path = dir.join(bin);
        if !path.is_file() {
            bail!("{} is missing (from {ASSETS_ENV} or build.sh)", path.display());
        }
    }
    Ok(dir)
}

/// `<repo>/e2e/control-plane/build.sh`.
pub fn build_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("control-plane")
        .join("build.sh")
}

/// `kubectl`, which `e2e/control-plane/build.sh` builds beside kube-apiserver (an envtest
/// directory in `KUBEBUILDER_ASSETS` may have none).
pub fn kubectl() -> Result<PathBuf> {
    let path = control_plane_binaries()?.join("kubectl");
    if !path.is_file() {
        bail!(
            "{} is missing: e2e/control-plane/build.sh builds it beside kube-apiserver",
            path.display()
        );
    }
    Ok(path)
}
