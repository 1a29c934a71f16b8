//! The project's own components (master-controller, seed-controller, machine-webhook) run beside
//! a fleet, as child processes of the demo.
//!
//! To add one to `make demo`, push a [`ComponentSpec`] in [`demo_components`]: the demo spawns
//! each after the fleet is up and its directory written (so `<dir>/<cluster>.kubeconfig` exist),
//! logs it to `<dir>/logs/<name>.log`, and kills it before the fleet on shutdown. The binary must
//! have been built (`cargo build -p <crate>`; the Makefile's `demo` target is the place) and is
//! looked up beside the running `fleet` binary, in the same target directory.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::Fleet;
use crate::control_plane::Proc;

/// A process to run beside the fleet.
#[derive(Clone, Debug)]
pub struct ComponentSpec {
    /// Also the log file's name.
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
}

impl ComponentSpec {
    /// A binary of this workspace, in the target directory the running executable is in.
    pub fn workspace_bin(name: &str, args: Vec<String>) -> Result<ComponentSpec> {
        let exe = std::env::current_exe().context("locating the running executable")?;
        let dir = exe.parent().context("executable without a directory")?;
        // Test binaries live one level deeper, in target/<profile>/deps.
        let dir = if dir.ends_with("deps") {
            dir.parent().unwrap_or(dir)
        } else {
            dir
        };
        Ok(ComponentSpec {
            name: name.to_owned(),
            program: dir.join(name),
            args,
        })
    }
}

/// What `make demo` runs beside the fleet whose files are in `dir`. Empty until the components
/// exist; e.g. later:
///
/// ```text
/// ComponentSpec::workspace_bin("master-controller", vec![
///     format!("--kubeconfig={}", dir.join("master.kubeconfig").display()),
/// ])?
/// ```
pub fn demo_components(fleet: &Fleet, dir: &Path) -> Result<Vec<ComponentSpec>> {
    let _ = (fleet, dir);
    Ok(Vec::new())
}

/// A started component; dropping it kills (SIGKILL) and reaps the process.
pub struct RunningComponent {
    pub name: String,
    proc: Proc,
}

impl std::fmt::Debug for RunningComponent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningComponent")
            .field("name", &self.name)
            .field("pid", &self.proc.pid())
            .finish()
    }
}

impl RunningComponent {
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }
}

/// Spawns `spec`, stdout and stderr appended to `<log_dir>/<name>.log`.
pub fn spawn(spec: &ComponentSpec, log_dir: &Path) -> Result<RunningComponent> {
    std::fs::create_dir_all(log_dir)?;
    let log = log_dir.join(format!("{}.log", spec.name));
    let proc = Proc::spawn_named(&spec.name, &spec.program, &spec.args, &log)?;
    tracing::info!(component = spec.name, pid = proc.pid(), log = %log.display(), "component started");
    Ok(RunningComponent {
        name: spec.name.clone(),
        proc,
    })
}
