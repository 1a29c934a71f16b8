//! A user cluster's `MachineSet`s, watched for the policy `reservedCounts`: which deployment a
//! Machine is of (`crate::state`'s `machine_sets`). A failure leaves the Machines' count alone:
//! a Machine whose `MachineSet` is not known is counted alone, and its deployment's room whole.

use futures::StreamExt;
use kkp_quota_crds::machine::MachineSet;
use kkp_quota_runtime::watch::relisting_watcher;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt};
use tracing::warn;

use crate::Shared;

pub(crate) struct MachineSetWatch {
    pub(crate) stream: futures::stream::BoxStream<'static, watcher::Result<Event<MachineSet>>>,
    buffer: Vec<MachineSet>,
    /// The last failure logged (each new one is logged once).
    failure: Option<String>,
}

impl MachineSetWatch {
    pub(crate) fn new(api: Api<MachineSet>) -> MachineSetWatch {
        MachineSetWatch {
            stream: relisting_watcher(api, watcher::Config::default(), None)
                .default_backoff()
                .boxed(),
            buffer: Vec::new(),
            failure: None,
        }
    }

    pub(crate) fn take(&mut self, shared: &Shared, cluster: &str, event: watcher::Result<Event<MachineSet>>) {
        let changed = match event {
            Ok(Event::Init) => {
                self.buffer.clear();
                false
            }
            Ok(Event::InitApply(set)) => {
                self.buffer.push(set);
                false
            }
            Ok(Event::InitDone) => {
                self.failure = None;
                shared
                    .state()
                    .machine_sets_listed(cluster, &std::mem::take(&mut self.buffer))
            }
            Ok(Event::Apply(set)) => shared.state().machine_set_applied(cluster, &set),
            Ok(Event::Delete(set)) => set
                .uid()
                .is_some_and(|uid| shared.state().machine_set_deleted(cluster, &uid)),
            Err(e) => {
                let error = e.to_string();
                if self.failure.as_ref() != Some(&error) {
                    warn!(%error, "MachineSets cannot be watched; Machines of unknown MachineSets count alone");
                    self.failure = Some(error);
                }
                false
            }
        };
        if changed {
            shared.wake_writer();
        }
    }
}
