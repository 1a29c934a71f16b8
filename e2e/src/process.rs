//! Child processes of the fleet (etcd, kube-apiserver, the components): spawned with their output
//! appended to a log, killed (SIGKILL) and reaped when dropped, so a failing test leaves no
//! process behind; and waiting for one to become ready, with its log's tail on failure.

use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// Polls `check` until it succeeds; fails at once, with the log's tail, if the process exits,
/// and at the deadline with the last check error and the log's tail.
pub(crate) async fn wait_process<F, Fut>(
    proc: &mut Proc,
    timeout: Duration,
    what: &str,
    mut check: F,
) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let name = proc.name.clone();
    let log = proc.log.clone();
    let last = std::sync::Mutex::new(String::new());
    // Done when the check passes (`Some(Ok)`) or the process has exited (`Some(Err)`).
    let outcome = crate::wait_for(timeout, what, || {
        let exited = proc.exited();
        let attempt = check();
        let last = &last;
        let (name, log) = (&name, &log);
        async move {
            if let Some(status) = exited {
                return Some(Err(anyhow::anyhow!(
                    "{name} exited during startup ({status}); log {}:\n{}",
                    log.display(),
                    log_tail(log)
                )));
            }
            match attempt.await {
                Ok(()) => Some(Ok(())),
                Err(e) => {
                    *last.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = format!("{e:#}");
                    None
                }
            }
        }
    })
    .await;
    match outcome {
        Ok(result) => result,
        Err(_) => bail!(
            "{name} not ready ({what}) after {timeout:?}: {}; log {}:\n{}",
            last.lock().unwrap_or_else(std::sync::PoisonError::into_inner),
            log.display(),
            log_tail(&log)
        ),
    }
}

/// The last lines of a log file, for error messages.
pub(crate) fn log_tail(path: &Path) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => excerpt(&text),
        Err(e) => format!("    (cannot read: {e})"),
    }
}

/// The last lines of a log; when a process ended with an error or a panic whose backtrace fills
/// them, the first lines of that error too (they say why).
fn excerpt(text: &str) -> String {
    const LINES: usize = 30;
    const ERROR_LINES: usize = 6;
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines.len().saturating_sub(LINES);
    let mut out = String::new();
    let error = lines.iter().rposition(|l| {
        l.starts_with("Error: ") || l.contains("' panicked at ") || l.contains(") panicked at ")
    });
    if let Some(first) = error.filter(|&i| i < tail) {
        for line in &lines[first..(first + ERROR_LINES).min(tail)] {
            let _ = writeln!(out, "    {line}");
        }
        let _ = writeln!(out, "    [...]");
    }
    for line in &lines[tail..] {
        let _ = writeln!(out, "    {line}");
    }
    out
}

/// A child process killed (SIGKILL) and reaped when dropped.
pub(crate) struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    pub(crate) fn spawn(name: &'static str, program: &Path, args: &[String], log: &Path) -> Result<Proc> {
        Proc::spawn_named(name, program, args, log)
    }

    pub(crate) fn spawn_named(name: &str, program: &Path, args: &[String], log: &Path) -> Result<Proc> {
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let err = out.try_clone()?;
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .with_context(|| format!("spawning {}", program.display()))?;
        tracing::debug!(name, pid = child.id(), "spawned");
        Ok(Proc {
            name: name.to_owned(),
            child,
            log: log.to_owned(),
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGKILL, then reap. Idempotent.
    pub(crate) fn kill(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::excerpt;

    #[test]
    fn an_error_above_a_long_backtrace_is_kept_in_the_excerpt() {
        let mut log = vec!["starting".to_owned(), "Error: binding 127.0.0.1:4000".to_owned()];
        log.push("Caused by:".to_owned());
        log.extend((0..60).map(|i| format!("  {i}: frame")));
        let text = excerpt(&log.join("\n"));
        assert!(text.contains("Error: binding 127.0.0.1:4000"), "{text}");
        assert!(text.contains("[...]") && text.contains("59: frame"), "{text}");
        assert!(!text.contains("starting"), "{text}");
        // Short logs, and errors already in the tail, are shown once, as they are.
        let short = excerpt("a\nError: b\nc");
        assert_eq!(short, "    a\n    Error: b\n    c\n");
    }
}
