//! Leader election on a `coordination.k8s.io/v1` Lease, so that two replicas of a controller can
//! run and only one writes.
//!
//! The holder renews every `renew_every`; another candidate takes over only once the lease has not
//! been renewed for `lease_duration`. Every write is conditioned on `resourceVersion`, so two
//! candidates can never both believe they won the same round. A holder that cannot renew within
//! its lease duration stops its work (the caller exits, and is restarted by its supervisor). A
//! holder that is stopped ([`LeaderElector::run_until`]) gives the lease up after its work has
//! stopped, so a standby takes over at its next round instead of after a whole lease duration.

use std::future::Future;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tracing::{debug, info, warn};

use super::RuntimeError;
use super::ops::Readiness;

/// Conflicting writes retried (each after a fresh read) within one round.
const CONFLICT_RETRIES: usize = 3;

/// Where the lease lives and who we are.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// Unique per replica (pod name, or host name plus process id).
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_every: Duration,
}

impl LeaseConfig {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>, identity: impl Into<String>) -> Self {
        LeaseConfig {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
        }
    }

    /// The default identity: `$POD_NAME`, else host name and process id.
    pub fn default_identity() -> String {
        std::env::var("POD_NAME").unwrap_or_else(|_| {
            let host = std::fs::read_to_string("/etc/hostname").unwrap_or_else(|_| "localhost".into());
            format!("{}-{}", host.trim(), std::process::id())
        })
    }
}

/// One candidate for a lease.
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaseConfig,
}

impl LeaderElector {
    pub fn new(client: Client, config: LeaseConfig) -> Self {
        LeaderElector {
            api: Api::namespaced(client, &config.namespace),
            config,
        }
    }

    /// One round: take the lease if it is free or expired, renew it if we hold it. Returns whether
    /// we hold it afterwards. A conflicting write is not taken as a loss by itself: the lease is
    /// read again and the round retried, so only another live holder makes this `false` (a
    /// renewal whose answer was lost, or a slow API server, must not stop a healthy leader).
    pub async fn try_acquire_or_renew(&self) -> Result<bool, RuntimeError> {
        for _ in 0..CONFLICT_RETRIES {
            if let Some(held) = self.round().await? {
                return Ok(held);
            }
        }
        Ok(false)
    }

    /// One read and one write; `None` on a conflict.
    async fn round(&self) -> Result<Option<bool>, RuntimeError> {
        let now = Timestamp::now();
        let duration_secs = i32::try_from(self.config.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let Some(mut lease) = self.api.get_opt(&self.config.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.config.identity.clone()),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Some(true)),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(None),
                Err(e) => Err(e.into()),
            };
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let ours = holder == self.config.identity;
        if !ours && !holder.is_empty() && !expired(spec, now) {
            return Ok(Some(false));
        }
        if !ours {
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
            spec.holder_identity = Some(self.config.identity.clone());
        }
        spec.renew_time = Some(MicroTime(now));
        spec.lease_duration_seconds = Some(duration_secs);
        // `replace` carries the resourceVersion we read: a concurrent writer makes this a 409.
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                if !ours {
                    info!(lease = %self.config.name, identity = %self.config.identity, previous = %holder, "acquired leader lease");
                }
                Ok(Some(true))
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                debug!(lease = %self.config.name, "lease changed while renewing; reading it again");
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Waits until we hold the lease, then runs `work` while renewing. Returns `work`'s result,
    /// or [`RuntimeError::LostLease`] (after cancelling `work`) when renewal fails for a whole
    /// lease duration or another holder took over.
    ///
    /// `readiness` follows the rule every replicated component here keeps: a standby (another
    /// replica holds the lease) is ready, so rolling updates and node drains proceed; on taking
    /// the lease it turns not ready until `work` sets it (caches synced, first count done).
    pub async fn run<F, T>(&self, readiness: &Readiness, work: F) -> Result<T, RuntimeError>
    where
        F: Future<Output = T>,
    {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => break,
                Ok(false) => readiness.set(true),
                Err(e) => warn!(error = %e, lease = %self.config.name, "leader election round failed"),
            }
            tokio::time::sleep(self.config.renew_every).await;
        }
        readiness.set(false);
        tokio::pin!(work);
        let mut last_renewed = tokio::time::Instant::now();
        let mut ticker = tokio::time::interval(self.config.renew_every);
        ticker.tick().await;
        loop {
            tokio::select! {
                out = &mut work => return Ok(out),
                _ = ticker.tick() => match self.try_acquire_or_renew().await {
                    Ok(true) => last_renewed = tokio::time::Instant::now(),
                    Ok(false) => return Err(RuntimeError::LostLease(self.config.name.clone())),
                    Err(e) => {
                        warn!(error = %e, lease = %self.config.name, "could not renew leader lease");
                        if last_renewed.elapsed() >= self.config.lease_duration {
                            return Err(RuntimeError::LostLease(self.config.name.clone()));
                        }
                    }
                },
            }
        }
    }
}

impl LeaderElector {
    /// [`LeaderElector::run`] until `shutdown` resolves (`None` then). Whichever way it ends,
    /// `work` has stopped (it is dropped first) before the lease is released.
    pub async fn run_until<F, T, S>(
        &self,
        readiness: &Readiness,
        work: F,
        shutdown: S,
    ) -> Result<Option<T>, RuntimeError>
    where
        F: Future<Output = T>,
        S: Future<Output = ()>,
    {
        let out = tokio::select! {
            out = self.run(readiness, work) => out.map(Some),
            () = shutdown => Ok(None),
        };
        self.release().await;
        out
    }

    /// Gives the lease up if this candidate holds it: no holder, and a one-second duration for
    /// any reader that ignores an empty holder. Conditioned on the version read, so a lease
    /// someone else took meanwhile is left alone; a failure is logged (the lease then expires
    /// as it would have).
    pub async fn release(&self) {
        match self.try_release().await {
            Ok(true) => {
                info!(lease = %self.config.name, identity = %self.config.identity, "released leader lease");
            }
            Ok(false) => {}
            Err(e) => {
                warn!(error = %e, lease = %self.config.name, "could not release leader lease; it expires instead");
            }
        }
    }

    async fn try_release(&self) -> Result<bool, RuntimeError> {
        let Some(mut lease) = self.api.get_opt(&self.config.name).await? else {
            return Ok(false);
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(false);
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        self.api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await?;
        Ok(true)
    }
}

fn expired(spec: &LeaseSpec, now: Timestamp) -> bool {
    let Some(renewed) = spec.renew_time.as_ref().map(|t| t.0) else {
        return true;
    };
    let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(15)));
    renewed
        .saturating_add(duration)
        .is_ok_and(|deadline| deadline < now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_follows_renew_time_and_duration() {
        let now = Timestamp::now();
        let spec = |renewed_secs_ago: i64, duration: i32| LeaseSpec {
            renew_time: Some(MicroTime(now - SignedDuration::from_secs(renewed_secs_ago))),
            lease_duration_seconds: Some(duration),
            ..LeaseSpec::default()
        };
        assert!(!expired(&spec(5, 15), now));
        assert!(expired(&spec(16, 15), now));
        assert!(expired(&LeaseSpec::default(), now));
    }
}
