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
        let mut text = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(e) = cause {
            text.push_str(": ");
            text.push_str(&e.to_string());
            cause = e.source();
        }
        text
    }
}
