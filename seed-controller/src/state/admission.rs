//! Bypass detection: Machines that appeared while their cluster was watched are checked for an
//! admission reservation; a write may hold one back (not counted, not judged) while an allotment
//! may cover it, and those judged unadmitted get an Event.

use std::time::{Duration, Instant};

use tracing::warn;

use super::State;
use super::machines::{MachineEvent, REASON_UNADMITTED};

/// When a Machine appeared while watched, and whether a write has held it back since.
#[derive(Debug, Clone, Copy)]
pub(super) struct Appearance {
    pub(super) at: Instant,
    pub(super) held: bool,
}

impl Appearance {
    pub(super) fn now() -> Appearance {
        Appearance {
            at: Instant::now(),
            held: false,
        }
    }
}

impl State {
    /// Machines a write held back (not counted, not judged yet): if they are judged unadmitted
    /// later, the Event says they got no reservation within the grace.
    pub fn held_back(&mut self, held: &[(String, String)]) {
        for (cluster_name, uid) in held {
            if let Some(a) = self
                .clusters
                .get_mut(cluster_name)
                .and_then(|c| c.appeared.get_mut(uid))
            {
                a.held = true;
            }
        }
    }

    /// Bypass candidates were checked: forget them, and queue Events for the unadmitted ones.
    /// `allotments`: the quota copy had allotments, so an unadmitted Machine was given `grace` to
    /// be recorded (as was any Machine held back earlier).
    pub fn appeared_checked(
        &mut self,
        checked: &[(String, String)],
        unadmitted: &[(String, String)],
        allotments: bool,
        grace: Duration,
    ) {
        for (cluster_name, uid) in checked {
            let Some(cluster) = self.clusters.get_mut(cluster_name) else {
                continue;
            };
            let appearance = cluster.appeared.remove(uid);
            if !unadmitted.contains(&(cluster_name.clone(), uid.clone())) {
                continue;
            }
            let after_grace = allotments || appearance.is_some_and(|a| a.held);
            let key = (uid.clone(), REASON_UNADMITTED);
            if cluster.reported.contains(&key) {
                continue;
            }
            let Some(info) = cluster.machines.get(uid) else {
                continue;
            };
            let message = if after_grace {
                warn!(cluster = %cluster_name, project = ?cluster.project, machine = %info.name, grace = ?grace,
                    "machine got no admission reservation within the grace: admitted by no webhook (bypassed or removed), \
                     or by a webhook process that stopped before recording it; it is counted");
                format!(
                    "This Machine got no resource quota admission reservation within {grace:?} of appearing: it was \
                     admitted by no webhook (webhook removed or bypassed), or by a webhook process that stopped \
                     before recording it. It is counted in the project's usage."
                )
            } else {
                warn!(cluster = %cluster_name, project = ?cluster.project, machine = %info.name, %uid, "machine exists without admission: the quota webhook was bypassed or removed; it is counted");
                "This Machine was created without passing the resource quota admission webhook \
                 (webhook removed or bypassed). It is counted in the project's usage."
                    .to_owned()
            };
            if let Some(sender) = &cluster.events {
                let _ = sender.send(MachineEvent {
                    namespace: info.namespace.clone(),
                    name: info.name.clone(),
                    uid: uid.clone(),
                    reason: REASON_UNADMITTED,
                    message,
                });
            }
            cluster.reported.insert(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::ledger::Appeared;
    use crate::state::fixtures::{appeared_keys, machine, state_with};

    #[test]
    fn only_machines_appearing_while_watched_are_bypass_candidates() {
        let mut state = state_with(&[("a", "p")]);
        state.machine_applied("a", machine("0", "t3.medium"), true);
        assert!(
            state.project_plan("p").unwrap().appeared.is_empty(),
            "before the first listing"
        );
        state.cluster_listed("a", vec![machine("1", "t3.medium")]);
        assert!(
            state.project_plan("p").unwrap().appeared.is_empty(),
            "first listing"
        );
        state.machine_applied("a", machine("2", "t3.medium"), true);
        state.machine_applied("a", machine("1", "t3.medium"), true);
        let appeared = appeared_keys(&state, "p");
        assert_eq!(appeared, vec![("a".to_owned(), "2".to_owned())]);
        state.appeared_checked(&appeared, &[], false, Duration::from_secs(5));
        assert!(state.project_plan("p").unwrap().appeared.is_empty());
        // A re-listing that finds a known Machine resized (its event missed) and a new one: only
        // the new one appeared. The resized one was counted all along; holding it back would
        // take it out of the count.
        state.cluster_listed(
            "a",
            vec![
                machine("1", "t3.medium"),
                machine("2", "m5.large"),
                machine("3", "t3.medium"),
            ],
        );
        let appeared = appeared_keys(&state, "p");
        assert_eq!(appeared, vec![("a".to_owned(), "3".to_owned())]);
    }

    #[test]
    fn held_back_machines_keep_their_time_and_are_told_they_had_a_grace() {
        let mut state = state_with(&[("a", "p"), ("b", "q")]);
        let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
        state.set_events_sender("a", Some(sender));
        assert!(
            state.project_plan("p").unwrap().project_unsettled,
            "a not listed yet"
        );
        state.cluster_listed("a", vec![]);
        let plan = state.project_plan("p").unwrap();
        assert!(!plan.project_unsettled, "b (unsettled) is another project's");
        assert!(plan.counted.unsettled.contains("b"));
        state.machine_applied("a", machine("1", "t3.medium"), true);
        let first = state.project_plan("p").unwrap().appeared[0].at;
        state.machine_applied("a", machine("2", "t3.medium"), true);
        // Seen again by a re-listing: still appeared at the first sight.
        state.cluster_listed("a", vec![machine("1", "t3.medium"), machine("2", "t3.medium")]);
        let appeared = state.project_plan("p").unwrap().appeared;
        assert_eq!(appeared.len(), 2);
        assert_eq!(appeared[0].at, first);
        let keys: Vec<(String, String)> = appeared.iter().map(Appeared::key).collect();
        state.held_back(&keys[..1]);
        state.appeared_checked(&keys, &keys, false, Duration::from_secs(5));
        let mut messages: Vec<(String, String)> = std::iter::from_fn(|| receiver.try_recv().ok())
            .map(|e| (e.uid, e.message))
            .collect();
        messages.sort();
        assert_eq!(messages.len(), 2);
        assert!(
            messages[0]
                .1
                .contains("no resource quota admission reservation within 5s"),
            "{}",
            messages[0].1
        );
        assert!(
            messages[0].1.contains("stopped before recording it"),
            "{}",
            messages[0].1
        );
        assert!(messages[1].1.contains("without passing"), "{}", messages[1].1);
        assert!(state.project_plan("p").unwrap().appeared.is_empty());
    }
}
