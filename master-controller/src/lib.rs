//! master-controller: fans every master `ResourceQuota` out to every seed, folds the seeds'
//! `localUsage` into `globalUsage` (on the master and back onto every seed copy), keeps the
//! default project quota, and reports stale seeds and over-limit quotas.
//!
//! - [`seeds`]: `Seed` objects → a client and a quota-copy watch per seed.
//! - [`fanout`]: what the master object and the seed copies should look like;
//!   [`status_patches`]: the status written onto them, where it changed.
//! - [`fold`]: seed usages → `globalUsage` and `otherSeedsUsage`; staleness bookkeeping (pure).
//! - [`shares`]: the master's round of per-seed shares (docs/shares.md): view, plan, the
//!   compare-and-swap write of the record; what each ledger's `spec.shares` carries.
//! - [`default_quota`]: `globalsettings` `spec.defaultQuota` → default project quotas.
//! - [`status`]: the master object's conditions (pure). `unreadable`: quotas with a limit this
//!   system cannot read, skipped alone and reported. [`not_in_force`]: a project's quotas beyond
//!   the first by name, which the seeds do not enforce: not fanned out, and reported.
//! - [`allocation`]: the webhook that keeps `allocation` groups' caps on quota edits.
//! - [`metrics`]: Prometheus metrics; [`project_series`]: the per-project ones, written
//!   straight into `/metrics` (too many for the registry at 10,000 projects).
//! - [`ledger_guard`]: the finalizer that keeps a seed's ledger until this controller deletes it.
//! - `finalize`: deleting a quota, seeds first. `sweep`: orphaned seed copies and `ProjectQuota`s are deleted; `kkp_copies`: what was last
//!   written onto KKP's seed copies, and when one is to be written again (deleted or changed by
//!   someone else, as `kkp_copy_watch` sees it).
//! - [`controller`]: the wiring and [`controller::run`]; `reconcile`: one quota's reconcile;
//!   `seed_writes`: its applies and status writes on the seeds; `api`: helpers around API calls.

pub mod allocation;
mod api;
pub mod args;
pub mod budgets;
pub mod by_subject;
pub mod controller;
mod ctx;
pub mod default_quota;
pub mod fanout;
mod finalize;
pub mod fingerprint;
pub mod fold;
pub mod group_book;
pub mod group_series;
pub mod groups;
mod kkp_copies;
mod kkp_copy_watch;
pub mod ledger_guard;
pub mod metrics;
pub mod not_in_force;
pub mod project_series;
mod reconcile;
pub mod resync;
pub mod seed_ledger;
mod seed_writes;
pub mod seeds;
pub mod shares;
pub mod status;
pub mod status_patches;
mod sweep;
mod unreadable;

pub use controller::{Options, run, run_until};
pub use metrics::Metrics;

/// Why a reconcile or the controller failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API error: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Runtime(#[from] kkp_quota_runtime::RuntimeError),
    #[error("usage arithmetic failed: {0}")]
    Quantity(#[from] kkp_quota_crds::QuantityError),
    #[error("share record: {0}")]
    ShareRecord(String),
    #[error("seed(s) not in sync yet: {0}")]
    Seeds(String),
    #[error("the default quota in KubermaticSetting globalsettings cannot be read: {0}")]
    DefaultQuotaUnreadable(String),
    #[error("{0} stopped")]
    Stopped(&'static str),
}
