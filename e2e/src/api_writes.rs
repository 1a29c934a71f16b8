//! The writes an API server served, from its metrics: what a phase cost the master and the seed.

use anyhow::{Context as _, Result};
use kube::Client;

/// Writes an API server served, by resource and verb (from its `apiserver_request_total`):
/// `"quotaledgers/status PUT"` and so on.
#[derive(Clone, Default)]
pub(super) struct Writes(pub(super) std::collections::BTreeMap<String, f64>);

impl Writes {
    pub(super) async fn scrape(client: &Client) -> Result<Writes> {
        let text = client
            .request_text(http::Request::get("/metrics").body(Vec::new())?)
            .await
            .context("reading an API server's /metrics")?;
        let mut writes = std::collections::BTreeMap::new();
        for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
            let Some((labels, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let label = |name: &str| {
                labels
                    .split(&format!("{name}=\""))
                    .nth(1)
                    .and_then(|rest| rest.split('"').next())
                    .unwrap_or_default()
                    .to_owned()
            };
            let verb = label("verb");
            if !["POST", "PUT", "PATCH", "DELETE", "APPLY"].contains(&verb.as_str()) {
                continue;
            }
            let (resource, sub) = (label("resource"), label("subresource"));
            let key = if sub.is_empty() {
                format!("{resource} {verb}")
            } else {
                format!("{resource}/{sub} {verb}")
            };
            *writes.entry(key).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
        }
        Ok(Writes(writes))
    }

    pub(super) fn since(&self, before: &Writes) -> Writes {
        Writes(
            self.0
                .iter()
                .map(|(k, v)| (k.clone(), v - before.0.get(k).copied().unwrap_or(0.0)))
                .filter(|(_, v)| *v > 0.0)
                .collect(),
        )
    }

    pub(super) fn add(&mut self, more: &Writes) {
        for (k, v) in &more.0 {
            *self.0.entry(k.clone()).or_insert(0.0) += v;
        }
    }
}
