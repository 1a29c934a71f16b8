//! What can go wrong, each with what to do about it. A variant names the step that failed; its
//! cause, if any, is its `source` (main prints the chain, each cause once).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading the kubeconfig {path}")]
    KubeconfigFile {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("loading the kubeconfig")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    #[error("making a client from the kubeconfig")]
    Client(#[source] kube::Error),
    #[error("reading {what}")]
    Kube {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error(
        "this cluster has no quota objects of kkp-quota: neither a QuotaView (a user cluster whose seed runs seed-controller with --quota-view) nor a ProjectQuota (the master)"
    )]
    NoQuotaHere,
    #[error("{0}")]
    NeedsProject(String),
    #[error("no quota of project {0:?} here")]
    NoSuchProject(String),
    #[error(
        "`top` reads every project's quota on the master; this user cluster holds only its own project's view (try `status`)"
    )]
    TopNeedsMaster,
    #[error("reading {path}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the manifest is not YAML or JSON")]
    ManifestSyntax(#[source] serde_saphyr::Error),
    #[error("the manifest holds no Machine, MachineSet or MachineDeployment")]
    NothingAsked,
    #[error("the manifest: {kind} without items")]
    ListWithoutItems { kind: String },
    #[error("the manifest: {name}: a document without a kind")]
    NoKind { name: String },
    #[error(
        "the manifest: {object}: a {kind} asks nothing of the quota; give Machines, MachineSets or MachineDeployments"
    )]
    AsksNothing { object: String, kind: String },
    #[error("the manifest: {object}: spec.replicas is not a count: {found}")]
    NotACount { object: String, found: String },
    #[error("the manifest: {object}{part} is not what machine-controller reads")]
    NotAMachine {
        object: String,
        /// `""` for a Machine, `": spec.template"` for a set or deployment.
        part: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("the size catalog {path}")]
    Catalog {
        path: PathBuf,
        #[source]
        source: provider_sizes::CatalogError,
    },
    #[error("printing the answer as JSON")]
    OutputJson(#[source] serde_json::Error),
    #[error("printing the answer as YAML")]
    OutputYaml(#[source] serde_saphyr::SerializeError),
}

impl Error {
    /// The message and every cause after it: `reading the kubeconfig x: ...: ...`.
    pub fn chain(&self) -> String {
        chain(self)
    }
}

/// `error`'s message and each cause's, once: a cause whose words its error already printed
/// (kube's errors print their source in their own message too) is not repeated.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let words = e.to_string();
        if !text.contains(&words) {
            text.push_str(": ");
            text.push_str(&words);
        }
        cause = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("no such file")]
    struct Io;

    #[derive(Debug, thiserror::Error)]
    #[error("failed to read kubeconfig from x: {0}")]
    struct Repeats(#[source] Io);

    #[derive(Debug, thiserror::Error)]
    #[error("reading the kubeconfig x")]
    struct Step(#[source] Repeats);

    #[test]
    fn each_cause_is_printed_once() {
        assert_eq!(
            super::chain(&Step(Repeats(Io))),
            "reading the kubeconfig x: failed to read kubeconfig from x: no such file"
        );
    }
}
