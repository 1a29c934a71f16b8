//! Waking the waiting: when room appears for a project, the owners of Machines this process
//! refused for room ([`crate::waiting`]) are nudged so that their controllers try again at once.
//!
//! Room shows as a change of the project's ledger (a raised limit, a lower count after a delete
//! anywhere in the project, share granted to this seed), so every change of a ledger, and a tick
//! of [`WakeConfig::min_gap`], starts a pass. A pass decides the waiting sizes as one batch on the
//! ledger as cached, exactly as admission would (seed-wide: allotments of every process count as
//! committed), and nudges only the owners whose Machine now fits.
//!
//! The nudge is the one write this system makes to a user's objects: a merge patch of the
//! annotation [`ROOM_ANNOTATION`] (the time of the nudge) on the refused Machine's `MachineSet`
//! (its direct owner; a `MachineDeployment` where it owns the Machine itself), with the owner's
//! UID as precondition. Any update of a `MachineSet` makes machine-controller's `MachineSet`
//! controller reconcile it at once, out of the back-off it keeps after failed creates. Nothing in
//! the object's spec changes.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use jiff::Timestamp;
use kkp_quota_runtime::chain::Chain;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;
use tracing::{info, warn};

use crate::cache::{QuotaCopy, SeedCache};
use crate::decision::{Ask, QuotaState, Reason, Request, Subject, decide_batch};
use crate::metrics::Metrics;
use crate::owners::resource;
use crate::user_clients::UserClients;
use crate::waiting::{Owner, RoomNow, Waiting, WakeConfig};

/// The annotation a nudge writes on a waiting owner: when room appeared for it (RFC 3339).
pub const ROOM_ANNOTATION: &str = "kkp-quota.dev/room-available-at";
/// The field manager of the nudge.
pub const FIELD_MANAGER: &str = "kkp-quota-machine-webhook";

/// The owners waiting, shared by the admission path (which records refusals) and the waker.
#[derive(Debug, Clone, Default)]
pub struct SharedWaiting(Arc<Mutex<Waiting>>);

impl SharedWaiting {
    pub fn new(config: WakeConfig) -> SharedWaiting {
        SharedWaiting(Arc::new(Mutex::new(Waiting::new(config))))
    }

    /// The table; a panic while it was held leaves it usable (each step leaves it consistent).
    pub fn lock(&self) -> MutexGuard<'_, Waiting> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

pub struct Waker {
    pub cache: Arc<SeedCache>,
    pub waiting: SharedWaiting,
    pub clients: UserClients,
    pub metrics: Metrics,
    pub config: WakeConfig,
}

/// What a project's room is decided on.
enum Quota {
    /// It has no quota: everything fits.
    None,
    Limited(Box<QuotaState>),
}

impl Quota {
    fn state(&self) -> Option<&QuotaState> {
        match self {
            Quota::None => None,
            Quota::Limited(state) => Some(state.as_ref()),
        }
    }
}

/// The project's quota as admission would decide on it now; `None` when its ledger cannot be
/// used (missing, behind a restore, not counted yet: admission refuses then, so nobody is woken).
fn quota_now(cache: &SeedCache, project: &str) -> Option<Quota> {
    let Some(ledger) = cache.quota_for(project) else {
        return cache.kkp_quota_for(project).is_none().then_some(Quota::None);
    };
    if cache.ledger_gap(&ledger).is_some() {
        return None;
    }
    let state = QuotaCopy::from_dynamic(&ledger).ok()?.state().ok()?;
    Some(Quota::Limited(Box::new(state)))
}

impl Waker {
    /// Runs until dropped; with no waker (waking is off), never wakes anyone.
    pub async fn run(waker: Option<Waker>) {
        match waker {
            Some(waker) => waker.serve().await,
            None => std::future::pending().await,
        }
    }

    async fn serve(mut self) {
        let mut ledger_changes = self.cache.quota_changes();
        loop {
            tokio::select! {
                result = ledger_changes.changed() => if result.is_err() { std::future::pending::<()>().await },
                () = tokio::time::sleep(self.config.min_gap) => {}
            }
            self.pass().await;
        }
    }

    /// One pass over every project with an owner waiting.
    async fn pass(&mut self) {
        let projects = self.waiting.lock().projects();
        for project in projects {
            let Some(quota) = quota_now(&self.cache, &project) else {
                continue;
            };
            let now = Timestamp::now();
            let metrics = &self.metrics;
            let woken = self.waiting.lock().to_wake(&project, now, |sizes| {
                let requests: Vec<Request> = sizes
                    .iter()
                    .map(|size| Request {
                        machine: String::new(),
                        ask: Ask::Create(size.clone()),
                        dry_run: false,
                        subject: Subject::Machine,
                        autoscaled: None,
                    })
                    .collect();
                let room: Vec<RoomNow> = decide_batch(&project, quota.state(), &requests)
                    .iter()
                    .map(|v| match (v.allowed, v.reason) {
                        (true, _) => RoomNow::Fits,
                        (false, Reason::ShareInTransit) => RoomNow::ShareElsewhere,
                        (false, _) => RoomNow::NoRoom,
                    })
                    .collect();
                let no_room = room.iter().filter(|r| **r == RoomNow::NoRoom).count();
                metrics
                    .wake_checks
                    .with_label_values(&["fits"])
                    .inc_by((room.len() - no_room) as u64);
                metrics
                    .wake_checks
                    .with_label_values(&["no_room"])
                    .inc_by(no_room as u64);
                room
            });
            for owner in woken {
                let result = self.nudge(&owner, now).await;
                self.metrics.wakes.with_label_values(&[result]).inc();
            }
        }
        let waiting = self.waiting.lock().len();
        self.metrics
            .waiting_owners
            .set(i64::try_from(waiting).unwrap_or(i64::MAX));
    }

    /// Writes the annotation on the owner; the result label.
    async fn nudge(&mut self, owner: &Owner, now: Timestamp) -> &'static str {
        let Some(cluster) = self.cache.cluster(&owner.cluster) else {
            return "gone";
        };
        let client = match self.clients.get(&cluster).await {
            Ok(client) => client,
            Err(e) => {
                warn!(error = %Chain(&e), cluster = %owner.cluster, "cannot wake a refused Machine's owner");
                return "failed";
            }
        };
        match patch_owner(client, owner, now).await {
            Ok(()) => {
                info!(cluster = %owner.cluster, namespace = %owner.namespace, kind = %owner.kind, name = %owner.name,
                    "room appeared: woke the owner of a refused Machine");
                "sent"
            }
            // Deleted, or replaced by another object of the same name (the UID precondition).
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => "gone",
            Err(e) => {
                self.clients.forget(&owner.cluster);
                warn!(error = %Chain(&e), cluster = %owner.cluster, kind = %owner.kind, name = %owner.name,
                    "cannot wake a refused Machine's owner");
                "failed"
            }
        }
    }
}

async fn patch_owner(client: Client, owner: &Owner, now: Timestamp) -> Result<(), kube::Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(
        client,
        &owner.namespace,
        &resource(&owner.api_version, &owner.kind),
    );
    let patch = json!({"metadata": {
        "uid": owner.uid,
        "annotations": {ROOM_ANNOTATION: now.to_string()},
    }});
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    api.patch(&owner.name, &params, &Patch::Merge(&patch)).await?;
    Ok(())
}
