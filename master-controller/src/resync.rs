//! The periodic resync (`--resync-period`), spread over its period: every quota is reconciled
//! once per period, a slice at a time, instead of all at once. With 10,000 quotas a pass of all
//! of them at once queued every edit that came during it behind 10,000 reconciles (issue #34:
//! one edit's p99 was the resync's, 200 ms, where its p50 was 45 ms); spread, an edit waits
//! behind one slice at most.

use std::collections::VecDeque;
use std::time::Duration;

use kkp_quota_crds::ResourceQuota;
use kube::ResourceExt as _;
use kube::runtime::reflector::Store;
use tokio::sync::mpsc;

/// How often a slice is sent: a period is cut into slices of this length (at least one).
const SLICE_EVERY: Duration = Duration::from_millis(100);

/// One pass over every quota, cut into `slices` slices of at most `ceil(n / slices)` names:
/// a pass started while the previous one is unfinished waits for it (so every quota is
/// reconciled at least once per pass, however the list changes meanwhile).
#[derive(Debug)]
pub struct ResyncPass {
    slices: usize,
    pending: VecDeque<String>,
    per_slice: usize,
}

impl ResyncPass {
    pub fn new(slices: usize) -> ResyncPass {
        ResyncPass {
            slices: slices.max(1),
            pending: VecDeque::new(),
            per_slice: 0,
        }
    }

    /// The names to reconcile at this slice; `names` lists every quota when a pass begins.
    pub fn next_slice(&mut self, names: impl FnOnce() -> Vec<String>) -> Vec<String> {
        if self.pending.is_empty() {
            self.pending = names().into();
            self.per_slice = self.pending.len().div_ceil(self.slices);
        }
        let take = self.per_slice.min(self.pending.len());
        self.pending.drain(..take).collect()
    }
}

/// The slices a period is cut into.
pub fn slices_of(period: Duration) -> usize {
    let slices = period.as_millis() / SLICE_EVERY.as_millis();
    usize::try_from(slices).unwrap_or(usize::MAX).max(1)
}

/// Sends every quota in `quotas` to the controller (`reconcile`) once per `period`, a slice
/// every `period / slices` (the controller merges a name already queued).
pub async fn run(quotas: Store<ResourceQuota>, reconcile: mpsc::UnboundedSender<String>, period: Duration) {
    let slices = slices_of(period);
    let every = period / u32::try_from(slices).unwrap_or(u32::MAX);
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pass = ResyncPass::new(slices);
    // The first pass starts one period after the start, as the watches' first listing already
    // reconciles every quota.
    tokio::time::sleep(period).await;
    loop {
        ticker.tick().await;
        let slice = pass.next_slice(|| quotas.state().iter().map(|q| q.name_any()).collect());
        for name in slice {
            if reconcile.send(name).is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("q{i}")).collect()
    }

    #[test]
    fn a_pass_sends_every_quota_once_in_slices_of_equal_size() {
        let mut pass = ResyncPass::new(4);
        let mut sent = Vec::new();
        let mut sizes = Vec::new();
        for _ in 0..4 {
            let slice = pass.next_slice(|| names(10));
            sizes.push(slice.len());
            sent.extend(slice);
        }
        assert_eq!(sizes, [3, 3, 3, 1]);
        assert_eq!(sent, names(10));
        // The next pass lists the quotas again: one added meanwhile is in it.
        let mut next = Vec::new();
        for _ in 0..4 {
            next.extend(pass.next_slice(|| names(11)));
        }
        assert_eq!(next, names(11));
    }

    #[test]
    fn a_pass_is_finished_before_the_next_lists_again() {
        let mut pass = ResyncPass::new(2);
        assert_eq!(pass.next_slice(|| names(4)), names(2));
        // Listing again mid-pass would lose q2 and q3: the list is not read.
        assert_eq!(
            pass.next_slice(|| panic!("listed mid-pass")),
            ["q2".to_owned(), "q3".to_owned()]
        );
        // No quota at all: empty slices, listed again each time.
        let mut empty = ResyncPass::new(3);
        assert!(empty.next_slice(Vec::new).is_empty());
        assert_eq!(empty.next_slice(|| names(1)), names(1));
    }

    #[test]
    fn a_period_is_cut_into_slices_of_a_tenth_of_a_second() {
        assert_eq!(slices_of(Duration::from_mins(1)), 600);
        assert_eq!(slices_of(Duration::from_secs(1)), 10);
        assert_eq!(slices_of(Duration::from_millis(50)), 1);
    }
}
