//! Dry runs (`kubectl create --dry-run=server`): decided on the newest copy of the ledger this
//! process knows and never queued for a write, so a dry run reserves, allots and asks for share
//! nothing. Its answer says how many Machines of its size the quota has room for
//! ([`crate::decision::dry_run_answer`]).

use super::*;
use crate::decision::decide_without_ledger;

impl Reserver {
    /// The verdict a create or change would get now, without writing anything: for dry runs, and
    /// for Machines that cannot be sized (refused under any quota, and where the ledger cannot
    /// be read).
    pub fn decide_without_writing(&self, project: &str, request: &Request) -> Verdict {
        let Some(object) = self.known_copy(project) else {
            return match self.inner.cache.kkp_quota_for(project) {
                Some(kkp) => decide_without_ledger(project, &kkp, LedgerGap::Missing, request),
                None => decide(project, None, request),
            };
        };
        if let Some(gap) = self.inner.cache.ledger_gap(&object) {
            return decide_without_ledger(project, &object.name_any(), gap, request);
        }
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
