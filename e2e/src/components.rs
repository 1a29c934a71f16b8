//! Child processes beside a fleet: a [`ComponentSpec`] names a workspace binary and its flags,
//! [`spawn`] runs it with its output in `<log_dir>/<name>.log` and kills it on drop.
//! [`crate::system`] uses this to run the whole quota system. Binaries are looked up beside the
//! running executable, in the same target directory.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::process::Proc;

/// A process to run beside the fleet.
#[derive(Clone, Debug)]
pub struct ComponentSpec {
    /// Also the log file's name.
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
}

impl ComponentSpec {
    /// A binary of this workspace, in the target directory the running executable is in (or in
    /// the directory given to [`use_binaries_from`]).
    pub fn workspace_bin(name: &str, args: Vec<String>) -> Result<ComponentSpec> {
        let dir = match BINARY_DIR.get() {
            Some(dir) => dir.clone(),
            None => profile_dir()?,
        };
        Ok(ComponentSpec {
            name: name.to_owned(),
            program: dir.join(name),
            args,
        })
    }
}

static BINARY_DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// From now on, this process runs the components from `dir` (`<dir>/<name>`; e.g. links into
/// unpacked images) instead of the workspace's target directory, and builds nothing. Once per
/// process: the first directory given stays.
pub fn use_binaries_from(dir: PathBuf) {
    let _ = BINARY_DIR.set(dir);
}

/// Whether [`use_binaries_from`] was called.
pub fn binaries_overridden() -> bool {
    BINARY_DIR.get().is_some()
}

/// The running executable's `target/<profile>` directory (test binaries and examples live one
/// level deeper, in `deps` and `examples`).
pub fn profile_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the running executable")?;
    let dir = exe.parent().context("executable without a directory")?;
    let dir = if dir.ends_with("deps") || dir.ends_with("examples") {
        dir.parent().unwrap_or(dir)
    } else {
        dir
    };
    Ok(dir.to_path_buf())
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
    /// How it ended, if it has (reaps it).
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.proc.exited()
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// Polls `check` until it passes; fails at once, with what its log says, if the process
    /// exits first (a component that cannot start says why at the top of a long backtrace).
    pub async fn wait_until<F, Fut>(
        &mut self,
        timeout: std::time::Duration,
        what: &str,
        check: F,
    ) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<()>>,
    {
        crate::process::wait_process(&mut self.proc, timeout, what, check).await
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
