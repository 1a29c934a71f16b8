//! What every reconcile of a master quota works with ([`Ctx`]): the clients, the stores the
//! controller reflects, the seeds' state and what the reconciles remember between runs. Built
//! once by [`crate::controller`]; read by the reconcile and the modules it calls.

use std::collections::BTreeSet;
use std::sync::Arc;

use kkp_quota_crds::kkp::Project;
use kkp_quota_crds::{ProjectQuota, ResourceQuota};
use kube::Client;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::kkp_copies::KkpCopies;
use crate::ledger_guard::HandDeletes;
use crate::metrics::Metrics;
use crate::seeds::Seeds;
use crate::shares::ShareMemory;

/// See the module.
pub(crate) struct Ctx {
    pub master: Client,
    pub seeds: Seeds,
    pub projects: Store<Project>,
    pub project_quotas: Store<ProjectQuota>,
    pub metrics: Metrics,
    pub kkp_copies: KkpCopies,
    /// Ledgers of live quotas seen being deleted (warned about once each).
    pub hand_deletes: HandDeletes,
    /// What the share rounds remember between reconciles (the newest `ProjectQuota` written).
    pub memory: ShareMemory,
    pub share_slack_percent: u32,
    /// [`crate::controller::Options::gone_seeds`].
    pub gone_seeds: BTreeSet<String>,
    /// [`crate::controller::Options::draining_seeds`].
    pub draining_seeds: BTreeSet<String>,
    /// Quotas with a limit this system cannot read: counted, and reported by Event.
    pub unreadable: Arc<crate::unreadable::Unreadable>,
    /// Every master `ResourceQuota` (which of a project's several quotas is in force).
    pub quotas: Store<ResourceQuota>,
    /// The names of each subject's quotas in [`Ctx::quotas`].
    pub quotas_by_subject: crate::by_subject::QuotasBySubject,
    /// Quotas not in force (another quota of their project is): counted.
    pub not_in_force: crate::not_in_force::NotInForce,
    /// The newest `QuotaGroup`s, from the group loop: the budgets a project plans within.
    pub groups: crate::group_book::GroupBook,
}

impl Ctx {
    /// Remembers `written`, this process's write of quota `name`'s `ProjectQuota`, until the
    /// cache shows it ([`ShareMemory::wrote`]).
    pub fn wrote_project_quota(&self, name: &str, written: ProjectQuota) {
        self.memory
            .wrote(name, written, || self.project_quotas.get(&ObjectRef::new(name)));
    }
}
