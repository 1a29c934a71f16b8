//! What can go wrong, each with what to do about it.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading the kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("reading {what}: {source}")]
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
    #[error("reading {path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the manifest: {0}")]
    Manifest(String),
    #[error("the size catalog {path}: {message}")]
    Catalog { path: PathBuf, message: String },
    #[error("printing the answer: {0}")]
    Output(String),
}
