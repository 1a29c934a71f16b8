//! Bursts of concurrent Machine creates and the no-overrun check.

use std::collections::BTreeSet;

use anyhow::{Result, ensure};
use futures::future::join_all;
use kkp_quota_crds::machine::Machine;
use kkp_quota_crds::{Quantity, Resource, ResourceDetails};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};

use super::{PROJECT, machine, machines, reservations};

pub const LIMIT: i64 = 16;
pub const COUNTED: i64 = 6;
pub const HEADROOM: i64 = LIMIT - COUNTED;
pub const BURST: usize = 60;

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
            Err(kube::Error::Api(s)) if s.message.contains("needs 1 cpu, project \"demo\" uses") => {}
            Err(e) => other.push(format!("{name}: {e}")),
        }
    }
    Ok((admitted, other))
}

/// Every Machine that exists is in the ledger, and counted + reserved never exceeds the limit.
pub async fn check_no_overrun(seed: &Client, users: &[(&str, Client)]) -> Result<(usize, usize)> {
    let ledger = reservations(seed.clone(), PROJECT).await?;
    let reserved = ResourceDetails::checked_sum(ledger.iter().map(|r| &r.reserved))?;
    ensure!(
        reserved.amount(Resource::Cpu) <= Quantity::from_units(HEADROOM),
        "reservations hold {} cpu, headroom is {HEADROOM}",
        reserved.amount(Resource::Cpu)
    );
    let reserved_uids: BTreeSet<&str> = ledger.iter().map(|r| r.uid.as_str()).collect();
    let mut existing = 0;
    for (cluster, client) in users {
        for m in machines(client.clone()).list(&ListParams::default()).await? {
            existing += 1;
            let uid = m.metadata.uid.clone().unwrap_or_default();
            ensure!(
                reserved_uids.contains(uid.as_str()),
                "Machine {cluster}/{:?} exists without a reservation",
                m.metadata.name
            );
        }
    }
    // What seed-controller would count: every existing Machine, one cpu each.
    ensure!(
        COUNTED + i64::try_from(existing)? <= LIMIT,
        "{existing} Machines exist on top of {COUNTED} counted"
    );
    Ok((existing, ledger.len()))
}
