//! Bursts of concurrent Machine creates and the no-overrun check.

use std::collections::BTreeSet;

use anyhow::{Result, ensure};
use futures::future::join_all;
use kkp_quota_crds::machine::Machine;
use kkp_quota_crds::{Quantity, Resource, ResourceDetails};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};

use super::{Certs, PROJECT, SEED, certs, fleet, machine, machines, write_quota};

pub const LIMIT: i64 = 16;
pub const COUNTED: i64 = 6;
pub const HEADROOM: i64 = LIMIT - COUNTED;
pub const BURST: usize = 60;

/// A fleet for bursts: seed-a with user clusters alpha and beta of the project, whose quota
/// allows `LIMIT` cpu with `COUNTED` already counted, and webhook certificates:
/// `(fleet, seed, alpha, beta, certs)` (keep the fleet alive for the test).
pub async fn burst_fleet() -> Result<(e2e::Fleet, Client, Client, Client, Certs)> {
    let fleet = fleet().await?;
    let seed = fleet.seed(SEED).client();
    let alpha = fleet.user_cluster("alpha").client();
    let beta = fleet.user_cluster("beta").client();
    write_quota(seed.clone(), PROJECT, &LIMIT.to_string(), &COUNTED.to_string()).await?;
    Ok((fleet, seed, alpha, beta, certs()?))
}

/// Creates `BURST` one-cpu Machines at once, half in each cluster; returns how many were
/// admitted, and fails on any answer other than admitted or denied for quota.
pub async fn burst(alpha: &Api<Machine>, beta: &Api<Machine>, round: usize) -> Result<(usize, Vec<String>)> {
    let creates = (0..BURST).map(|i| {
        let api = if i % 2 == 0 { alpha.clone() } else { beta.clone() };
        let name = format!("burst-{round}-{i}");
        async move {
            (
                name.clone(),
                api.create(&PostParams::default(), &machine(&name, 1)).await,
            )
        }
    });
    let mut admitted = 0;
    let mut other = Vec::new();
    for (name, result) in join_all(creates).await {
        match result {
            Ok(_) => admitted += 1,
            // Over the quota, or (with two webhook processes) waiting for headroom the other
            // process holds, or (under shares) for share to move here: all a denial for quota.
            Err(kube::Error::Api(s)) if s.message.contains("project \"demo\" uses") => {}
            Err(e) => other.push(format!("{name}: {e}")),
        }
    }
    Ok((admitted, other))
}

/// What the ledger and the user clusters hold after a burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    /// Machines that exist.
    pub existing: usize,
    /// Reservations in the ledger.
    pub reserved: usize,
    /// Existing Machines with no reservation yet (admitted from an allotment, not recorded).
    pub unrecorded: usize,
    /// Cpus held by allotments.
    pub allotted: i64,
}

/// Nothing over the limit: every existing Machine is reserved or covered by an allotment, and
/// counted + reserved + allotted never exceeds the limit.
pub async fn check_no_overrun(seed: &Client, users: &[(&str, Client)]) -> Result<Tally> {
    check_no_overrun_counting(seed, users, &BTreeSet::new()).await
}

/// [`check_no_overrun`] when the Machines `counted` (UIDs, one cpu each) are counted in
/// `localUsage` on top of `COUNTED`, as seed-controller would have done.
pub async fn check_no_overrun_counting(
    seed: &Client,
    users: &[(&str, Client)],
    counted: &BTreeSet<String>,
) -> Result<Tally> {
    let (ledger, allotments) = super::ledger(seed.clone(), PROJECT).await?;
    let reserved = ResourceDetails::checked_sum(ledger.iter().map(|r| &r.reserved))?;
    let allotted = kkp_quota_crds::ledger::allotted_total(&allotments)?.amount(Resource::Cpu);
    let claims = reserved
        .amount(Resource::Cpu)
        .checked_add(allotted)?
        .checked_add(Quantity::from_units(i64::try_from(counted.len())?))?;
    ensure!(
        claims <= Quantity::from_units(HEADROOM),
        "{} counted, reservations hold {} cpu and allotments {allotted} cpu, headroom is {HEADROOM}",
        counted.len(),
        reserved.amount(Resource::Cpu)
    );
    let reserved_uids: BTreeSet<&str> = ledger.iter().map(|r| r.uid.as_str()).collect();
    let mut existing = 0;
    let mut unrecorded = 0;
    for (_, client) in users {
        for m in machines(client.clone()).list(&ListParams::default()).await? {
            existing += 1;
            let uid = m.metadata.uid.clone().unwrap_or_default();
            if !reserved_uids.contains(uid.as_str()) && !counted.contains(&uid) {
                unrecorded += 1;
            }
        }
    }
    // Machines not recorded yet must be inside an allotment (one cpu each).
    ensure!(
        Quantity::from_units(i64::try_from(unrecorded)?) <= allotted,
        "{unrecorded} Machines exist without a reservation, allotments hold {allotted} cpu"
    );
    // What seed-controller would count: every existing Machine, one cpu each.
    ensure!(
        COUNTED + i64::try_from(existing)? <= LIMIT,
        "{existing} Machines exist on top of {COUNTED} counted"
    );
    Ok(Tally {
        existing,
        reserved: ledger.len(),
        unrecorded,
        allotted: i64::try_from(allotted.ceil_units())?,
    })
}

/// Waits until every existing Machine has a reservation (the webhook records admissions from
/// its allotment a moment after answering them), checking for overrun all along.
pub async fn wait_recorded(seed: &Client, users: &[(&str, Client)]) -> Result<Tally> {
    wait_recorded_counting(seed, users, &BTreeSet::new()).await
}

/// [`wait_recorded`], with [`check_no_overrun_counting`].
pub async fn wait_recorded_counting(
    seed: &Client,
    users: &[(&str, Client)],
    counted: &BTreeSet<String>,
) -> Result<Tally> {
    // An overrun ends the wait at once (`Some(Err)`); unrecorded Machines keep it going.
    e2e::wait_for(
        std::time::Duration::from_secs(30),
        "every admitted Machine to be recorded as a reservation",
        || async {
            match check_no_overrun_counting(seed, users, counted).await {
                Ok(tally) if tally.unrecorded > 0 => None,
                done => Some(done),
            }
        },
    )
    .await?
}
