//! Helpers for tests of one project quota over two seeds (`tests/shares.rs`,
//! `tests/clock_skew.rs`): bursts of one-cpu Machines, a ledger's figures, and the overrun
//! watcher that follows every version of both seeds' ledgers and of the master's `ProjectQuota`.

use futures::future::join_all;
use futures::{StreamExt, stream};
use kkp_quota_crds::shares::objects::{committed, seed_share};
use kkp_quota_crds::{ProjectQuota, Quantity, QuotaLedger, Resource};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::oneshot;

use crate::Fleet;
use crate::machines::is_quota_denial;

/// The two seeds every test here uses.
pub const SEEDS: [&str; 2] = ["seed-a", "seed-b"];

/// Creates one one-cpu Machine per entry of `users` (cluster names) at once; returns how many
/// were admitted, and panics on anything but an admission or a denial for `project`'s quota or
/// share.
pub async fn burst(fleet: &Fleet, project: &str, users: &[&str], prefix: &str) -> usize {
    let (admitted, missing) = burst_counting(fleet, project, users, prefix).await;
    assert_eq!(missing, 0, "{missing} refused for a missing or uncounted ledger");
    admitted
}

/// [`burst`], also counting the denials because a seed's ledger is missing or not counted yet
/// (`ledger_missing`): `(admitted, refused for the ledger)`.
pub async fn burst_counting(fleet: &Fleet, project: &str, users: &[&str], prefix: &str) -> (usize, usize) {
    let creates = users.iter().enumerate().map(|(i, user)| {
        let api = crate::machines::api(fleet, user);
        let name = format!("{prefix}-{i}");
        async move {
            let machine = crate::machines::vsphere(&name, 1);
            (name, api.create(&PostParams::default(), &machine).await)
        }
    });
    let (mut admitted, mut missing) = (0, 0);
    for (name, result) in join_all(creates).await {
        match result {
            Ok(_) => admitted += 1,
            Err(e) if is_quota_denial(&e, project) => {}
            Err(kube::Error::Api(e)) if e.message.contains("quota ledger") => missing += 1,
            Err(e) => panic!("{name}: {e}"),
        }
    }
    (admitted, missing)
}

/// Deletes every Machine of the user clusters `users`.
pub async fn delete_all(fleet: &Fleet, users: &[&str]) {
    for user in users {
        crate::machines::api(fleet, user)
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .expect("deleting the Machines");
    }
}

/// What a ledger says the seed committed (`localUsage + reservations + allotments`) and the
/// share it holds, of `resource`, exactly (allotments are fractions); `None` while it is not
/// under shares.
pub fn exact_figures(ledger: &QuotaLedger, resource: Resource) -> Option<(Quantity, Quantity)> {
    let status = ledger.status.clone().unwrap_or_default();
    let share = seed_share(&ledger.spec, Some(&status))?;
    Some((
        committed(&status).ok()?.amount(resource),
        share.share().amount(resource),
    ))
}

/// One version of an object the overrun watcher follows.
enum Seen {
    Ledger(usize, Box<QuotaLedger>),
    /// Seed `i`'s ledger was deleted: what it last said the seed committed (allotments
    /// included) went with it; the seed's real use shows again in its re-created ledger.
    LedgerGone(usize),
    Master(Box<ProjectQuota>),
}

/// Follows every version of both seeds' ledgers named `name` and of the master's `ProjectQuota`
/// until `stop` fires; panics (through the join) on an overrun of `limit` of `resource`: the
/// seeds' committed usage together above it (each seed's newest version; none for a seed whose
/// ledger was deleted, until its new one is under shares), or the master's global usage above it.
/// Returns how many versions it checked.
pub fn overrun_watcher(
    fleet: &Fleet,
    name: &str,
    resource: Resource,
    limit: Quantity,
    stop: oneshot::Receiver<()>,
) -> tokio::task::JoinHandle<usize> {
    let only_ours = || watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut streams = Vec::new();
    for (i, seed) in SEEDS.into_iter().enumerate() {
        let api = Api::<QuotaLedger>::all(fleet.seed(seed).client());
        streams.push(
            watcher::watcher(api, only_ours())
                .default_backoff()
                .filter_map(move |event| async move {
                    match event.ok()? {
                        watcher::Event::Apply(l) | watcher::Event::InitApply(l) => {
                            Some(Seen::Ledger(i, Box::new(l)))
                        }
                        watcher::Event::Delete(_) => Some(Seen::LedgerGone(i)),
                        watcher::Event::Init | watcher::Event::InitDone => None,
                    }
                })
                .boxed(),
        );
    }
    let master = Api::<ProjectQuota>::all(fleet.master().client());
    streams.push(
        watcher::watcher(master, only_ours())
            .default_backoff()
            .applied_objects()
            .filter_map(|p| async move { p.ok().map(|p| Seen::Master(Box::new(p))) })
            .boxed(),
    );
    let mut seen = stream::select_all(streams);
    tokio::spawn(async move {
        let mut committed: [Option<Quantity>; 2] = [None, None];
        let mut checked = 0;
        tokio::pin!(stop);
        loop {
            let next = tokio::select! {
                next = seen.next() => next,
                _ = &mut stop => return checked,
            };
            match next {
                Some(Seen::Ledger(i, ledger)) => {
                    // Exact: whole units rounded up would add up to more than was committed.
                    // A ledger seed-controller has not counted yet (just re-created) says
                    // nothing of the seed's use.
                    let counted = ledger.status.as_ref().is_some_and(|s| s.local_usage.is_some());
                    if !counted {
                        committed[i] = None;
                    } else if let Some((c, _)) = exact_figures(&ledger, resource) {
                        committed[i] = Some(c);
                    }
                    if let [Some(a), Some(b)] = committed {
                        assert!(
                            a.checked_add(b).is_ok_and(|sum| sum <= limit),
                            "the seeds committed {} + {} {resource}, over the limit {}",
                            resource.amount(a),
                            resource.amount(b),
                            resource.amount(limit)
                        );
                    }
                }
                Some(Seen::LedgerGone(i)) => committed[i] = None,
                Some(Seen::Master(pq)) => {
                    if let Some(global) = pq.status.and_then(|s| s.global_usage) {
                        assert!(
                            global.amount(resource) <= limit,
                            "the master's global usage {global} is over the limit"
                        );
                    }
                }
                None => return checked,
            }
            checked += 1;
        }
    })
}

/// [`overrun_watcher`] for a shared group over several quotas (`names`, one per member project):
/// follows every version of their ledgers on both seeds until `stop` fires, and panics when what
/// the seeds committed for all of them together (each ledger's newest version, as far as known)
/// is above the group's `limit` of `resource`. Returns how many versions it checked.
pub fn group_overrun_watcher(
    fleet: &Fleet,
    names: &[&str],
    resource: Resource,
    limit: Quantity,
    stop: oneshot::Receiver<()>,
) -> tokio::task::JoinHandle<usize> {
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let streams = SEEDS.into_iter().map(|seed| {
        let api = Api::<QuotaLedger>::all(fleet.seed(seed).client());
        watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .filter_map(move |event| async move {
                match event.ok()? {
                    watcher::Event::Apply(l) | watcher::Event::InitApply(l) => {
                        let counted = l.status.as_ref().is_some_and(|s| s.local_usage.is_some());
                        let committed = exact_figures(&l, resource).filter(|_| counted).map(|(c, _)| c);
                        Some(((seed, l.metadata.name.unwrap_or_default()), committed))
                    }
                    watcher::Event::Delete(l) => Some(((seed, l.metadata.name.unwrap_or_default()), None)),
                    watcher::Event::Init | watcher::Event::InitDone => None,
                }
            })
            .boxed()
    });
    let mut seen = stream::select_all(streams);
    tokio::spawn(async move {
        let mut committed = std::collections::BTreeMap::new();
        let mut checked = 0;
        tokio::pin!(stop);
        loop {
            let next = tokio::select! {
                next = seen.next() => next,
                _ = &mut stop => return checked,
            };
            let Some((key, figure)) = next else {
                return checked;
            };
            if !names.contains(&key.1) {
                continue;
            }
            committed.insert(key, figure);
            let known = committed.values().flatten();
            let sum = known.fold(Quantity::ZERO, |sum, c| {
                sum.checked_add(*c).expect("a sum of cpu")
            });
            assert!(
                sum <= limit,
                "the group's projects committed {} {resource} together, over its limit {}: {committed:?}",
                resource.amount(sum),
                resource.amount(limit)
            );
            checked += 1;
        }
    })
}
