//! The writes an API server served, from its metrics: what a benchmark's phase cost each cluster
//! of the fleet beside the Machines themselves.

use anyhow::{Context as _, Result};
use kube::Client;

/// Writes an API server served, by resource and verb (from its `apiserver_request_total`):
/// `"quotaledgers/status PUT"` and so on.
#[derive(Clone, Default)]
pub struct Writes(pub std::collections::BTreeMap<String, f64>);

impl Writes {
    /// # Errors
    /// When the API server's metrics cannot be read.
    pub async fn scrape(client: &Client) -> Result<Writes> {
        Self::scrape_verbs(client, &["POST", "PUT", "PATCH", "DELETE", "APPLY"]).await
    }

    /// The reads it served the same way (`GET`, `LIST`, `WATCH`): what a benchmark's readers
    /// cost an API server beside the writes.
    ///
    /// # Errors
    /// When the API server's metrics cannot be read.
    pub async fn scrape_reads(client: &Client) -> Result<Writes> {
        Self::scrape_verbs(client, &["GET", "LIST", "WATCH"]).await
    }

    async fn scrape_verbs(client: &Client, verbs: &[&str]) -> Result<Writes> {
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
            if !verbs.contains(&verb.as_str()) {
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

    #[must_use]
    pub fn since(&self, before: &Writes) -> Writes {
        Writes(
            self.0
                .iter()
                .map(|(k, v)| (k.clone(), v - before.0.get(k).copied().unwrap_or(0.0)))
                .filter(|(_, v)| *v > 0.0)
                .collect(),
        )
    }

    pub fn add(&mut self, more: &Writes) {
        for (k, v) in &more.0 {
            *self.0.entry(k.clone()).or_insert(0.0) += v;
        }
    }

    /// Every write, most first, per 100 of `creates`: "quotaledgers/status PATCH: 12.5, ...",
    /// or "none".
    #[must_use]
    pub fn per_100(&self, creates: f64) -> String {
        let mut entries: Vec<(&String, &f64)> = self.0.iter().collect();
        entries.sort_by(|a, b| b.1.total_cmp(a.1));
        let shown: Vec<String> = entries
            .iter()
            .map(|(k, v)| format!("{k}: {:.1}", *v * 100.0 / creates.max(1.0)))
            .collect();
        if shown.is_empty() {
            "none".to_owned()
        } else {
            shown.join(", ")
        }
    }

    /// All writes, per 100 of `creates`.
    #[must_use]
    pub fn total_per_100(&self, creates: f64) -> f64 {
        self.0.values().sum::<f64>() * 100.0 / creates.max(1.0)
    }
}
