//! Dry runs (`kubectl create --dry-run=server`): decided on the newest copy of the ledger this
//! process knows and never queued for a write, so a dry run reserves, allots and asks for share
//! nothing. Its answer says how many Machines of its size the quota has room for
//! ([`crate::decision::dry_run_answer`]).

use super::*;
use crate::decision::decide_without_ledger;

impl Reserver {
    /// The verdict a create or change would get now, without writing anything: for dry runs, and
    /// for Machines that cannot be sized (refused under any quota, and where the ledger cannot
    /// be read). A ledger the cache shows missing or not usable is read afresh first, as for a
    /// real create (the cache may be behind a ledger re-created or counted meanwhile).
    pub async fn decide_without_writing(&self, project: &str, request: &Request) -> Verdict {
        let mut object = self.known_copy(project);
        let gap = match &object {
            None => self
                .inner
                .cache
                .kkp_quota_for(project)
                .map(|kkp| (LedgerGap::Missing, kkp)),
            Some(ledger) => self
                .inner
                .cache
                .ledger_gap(ledger)
                .map(|gap| (gap, ledger.name_any())),
        };
        if let Some((gap, name)) = gap {
            match self.fresh_copy(&name).await {
                Ok(Some(fresh)) => match self.inner.cache.ledger_gap(&fresh) {
                    Some(gap) => return decide_without_ledger(project, &name, gap, request),
                    None => object = Some(Arc::new(fresh)),
                },
                Ok(None) => return decide_without_ledger(project, &name, LedgerGap::Missing, request),
                Err(_) => return decide_without_ledger(project, &name, gap, request),
            }
        }
        let Some(object) = object else {
            return decide(project, None, request);
        };
        // Everything in the ledger counts, every process's allotment included: ours covers what
        // we admitted from it and have not recorded yet.
        match QuotaCopy::from_dynamic(&object).and_then(|copy| copy.state()) {
            Ok(state) => decide(project, Some(&state), request),
            Err(e) => Verdict::deny(
                Reason::Error,
                &request.machine,
                &format!("cannot be checked against the resource quota of project {project:?}: {e}"),
            ),
        }
    }
}
