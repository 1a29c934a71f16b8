//! CPU profiles of a fleet's kube-apiservers, for benchmarks that must say where an API
//! server's time goes: the API server serves Go's profiler at `/debug/pprof/profile` (on by
//! default), and the fleet's admin client may read it. `go tool pprof -top FILE` reads a profile;
//! it carries its own symbols, so the binary is not needed.

use std::path::Path;
use std::time::Duration;

use kube::Client;
use kube::client::Body;

/// Samples the API server behind `client` for `duration` (whole seconds, at least one) and
/// writes the profile to `file`.
pub async fn cpu_profile(client: &Client, duration: Duration, file: &Path) -> anyhow::Result<()> {
    let seconds = duration.as_secs().max(1);
    let request = http::Request::get(format!("/debug/pprof/profile?seconds={seconds}")).body(Body::empty())?;
    let response = client.send(request).await?;
    anyhow::ensure!(
        response.status().is_success(),
        "profile request answered {}",
        response.status()
    );
    let bytes = response.into_body().collect_bytes().await?;
    std::fs::write(file, &bytes)?;
    Ok(())
}
