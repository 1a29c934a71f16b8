//! The control plane's etcd: started on free ports, checked to be ours, and snapshot and
//! restored the way an operator backs up and restores a seed (issue #32, finding 6).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::{ControlPlane, PORT_ATTEMPTS, STARTUP_TIMEOUT, StartError, classify, free_port};
use crate::process::{Proc, wait_process};

impl ControlPlane {
    /// Takes a copy of etcd's data as it is now (a crash-consistent snapshot: etcd is frozen with
    /// SIGSTOP while its data directory is copied, then continued), for
    /// [`restore_etcd`](Self::restore_etcd). What an operator's backup of a seed is.
    pub fn snapshot_etcd(&self) -> Result<PathBuf> {
        let pid = self.etcd_pid();
        let taken = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let snapshot = self.dir.path().join(format!("etcd-snapshot-{taken}"));
        let signal = |sig: &str| -> Result<()> {
            let status = Command::new("kill")
                .arg(format!("-{sig}"))
                .arg(pid.to_string())
                .status()?;
            ensure!(status.success(), "kill -{sig} {pid}: {status}");
            Ok(())
        };
        signal("STOP")?;
        crate::wait::wait_until_blocking(Duration::from_secs(10), "etcd stopped for the snapshot", || {
            crate::procfs::is_stopped(pid)
        })?;
        let copied = Command::new("cp")
            .arg("-a")
            .arg(self.dir.path().join("etcd-data"))
            .arg(&snapshot)
            .status();
        signal("CONT")?;
        ensure!(copied?.success(), "copying etcd's data failed");
        tracing::info!(cluster = self.name, snapshot = %snapshot.display(), "etcd snapshot taken");
        Ok(snapshot)
    }

    /// Restores etcd from `snapshot` the way an operator restores a seed from a backup without
    /// `--bump-revision`: kube-apiserver and etcd stop, etcd's data is replaced by the snapshot,
    /// both start again on the same ports. Every object is as it was at the snapshot, and
    /// resourceVersions go back to what they were then.
    pub async fn restore_etcd(&self, snapshot: &Path) -> Result<()> {
        self.stop_apiserver().await;
        let old = self
            .etcd
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(mut old) = old {
            let _ = tokio::task::spawn_blocking(move || old.kill()).await;
        }
        let data = self.dir.path().join("etcd-data");
        std::fs::remove_dir_all(&data).context("removing etcd's data")?;
        let copied = Command::new("cp").arg("-a").arg(snapshot).arg(&data).status()?;
        ensure!(copied.success(), "restoring etcd's data failed");
        let etcd = crate::wait_for(Duration::from_secs(30), "etcd back on its ports", || async {
            match spawn_etcd(&self.binaries, self.dir.path(), self.etcd_ports).await {
                Ok(proc) => Some(Ok(proc)),
                Err(StartError::PortTaken(_)) => None,
                Err(StartError::Other(e)) => Some(Err(e)),
            }
        })
        .await??;
        *self
            .etcd
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(etcd);
        tracing::info!(cluster = self.name, "etcd restored from a snapshot");
        self.start_apiserver().await
    }
}

pub(super) async fn start_etcd(binaries: &Path, dir: &Path) -> Result<(Proc, (u16, u16))> {
    let mut last_err = None;
    for _ in 0..PORT_ATTEMPTS {
        let ports = (free_port()?, free_port()?);
        match spawn_etcd(binaries, dir, ports).await {
            Ok(proc) => return Ok((proc, ports)),
            Err(StartError::PortTaken(e)) => {
                let _ = std::fs::remove_dir_all(dir.join("etcd-data"));
                last_err = Some(e);
            }
            Err(StartError::Other(e)) => return Err(e),
        }
    }
    Err(last_err
        .unwrap_or_else(|| anyhow!("no attempt made"))
        .context("no free port"))
}

/// etcd on `(client, peer)` ports with its data in `dir/etcd-data`, once healthy.
async fn spawn_etcd(
    binaries: &Path,
    dir: &Path,
    (client_port, peer_port): (u16, u16),
) -> Result<Proc, StartError> {
    let client_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let data = dir.join("etcd-data");
    // Unique across processes (the temp dir's random name), so that readiness can tell our
    // etcd from another one on the same port.
    let member = dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("etcd")
        .to_owned();
    let args = vec![
        format!("--name={member}"),
        format!("--data-dir={}", data.display()),
        format!("--listen-client-urls={client_url}"),
        format!("--advertise-client-urls={client_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster={member}={peer_url}"),
        "--unsafe-no-fsync=true".to_owned(),
        "--log-level=warn".to_owned(),
    ];
    let mut proc = Proc::spawn("etcd", &binaries.join("etcd"), &args, &dir.join("etcd.log"))
        .map_err(StartError::Other)?;
    wait_process(&mut proc, STARTUP_TIMEOUT, "/health", || {
        etcd_ready(client_port, &member)
    })
    .await
    .map_err(classify)?;
    Ok(proc)
}

/// Healthy, and ours: `GET /health`, then the member list must name `member` (a port picked as
/// free may have been taken by another test's etcd, which would answer `/health` just as well).
async fn etcd_ready(port: u16, member: &str) -> Result<()> {
    let health = etcd_request(port, "GET /health", "").await?;
    ensure!(
        health.contains("\"health\":\"true\""),
        "etcd not healthy yet: {health}"
    );
    let members = etcd_request(port, "POST /v3/cluster/member/list", "{}").await?;
    ensure!(
        members.contains(&format!("\"name\":\"{member}\"")),
        "the etcd on port {port} is not ours (member {member}): {members}"
    );
    Ok(())
}

/// One plain HTTP/1.0 request to etcd's client port; the body of a 200 answer.
async fn etcd_request(port: u16, request_line: &str, body: &str) -> Result<String> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let request = format!(
        "{request_line} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    ensure!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{request_line}: {head}"
    );
    Ok(body.to_owned())
}
