//! Dry runs (`kubectl create --dry-run=server`): decided on the newest copy of the ledger this
//! process knows and never queued for a write, so a dry run reserves, allots and asks for share
//! nothing. Its answer says how many Machines of its size the quota has room for
//! ([`crate::decision::dry_run_answer`]).

use super::*;

impl Reserver {
    /// The verdict a create or change would get now, without writing anything: for dry runs, and
    /// for Machines that cannot be sized (refused under any quota, and where the ledger cannot
    /// be read). The ledger is chosen as for a real create ([`Reserver::usable_ledger`]: a gap
    /// the cache shows is confirmed by a fresh read first).
    pub async fn decide_without_writing(&self, project: &str, request: &Request) -> Verdict {
        let mut snapshot = self.known_copy(project);
        let mut verified = false;
        let requests = std::slice::from_ref(request);
        let object = match self
            .usable_ledger(project, &mut snapshot, &mut verified, requests)
            .await
        {
            Ok(object) => object,
            Err(mut verdicts) => {
                return verdicts.pop().unwrap_or_else(|| decide(project, None, request));
            }
        };
        // Everything in the ledger counts, every process's allotment included: ours covers what
        // we admitted from it and have not recorded yet.
        match QuotaCopy::from_dynamic(&object).and_then(|copy| copy.state()) {
            Ok(state) => decide(project, Some(&state), request),
            Err(e) => request.deny(
                Reason::Error,
                &format!("cannot be checked against the resource quota of project {project:?}: {e}"),
            ),
        }
    }
}
