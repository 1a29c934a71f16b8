//! Waiting on a condition with a deadline, instead of sleeping.

use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

/// How often [`wait_for`] checks at most: it checks again after 1 ms, then twice as long each
/// time up to this, so that a condition soon true is seen at once and a slow one costs few checks.
pub const POLL_INTERVAL: Duration = Duration::from_millis(25);

/// The pauses between checks: 1 ms, doubling up to [`POLL_INTERVAL`].
fn pauses() -> impl Iterator<Item = Duration> {
    std::iter::successors(Some(Duration::from_millis(1)), |d| {
        Some((*d * 2).min(POLL_INTERVAL))
    })
}

/// What a [`wait_for`] check may answer: `bool` (done when `true`), `Option<T>` (done with `T`
/// when `Some`) or `Result<T, E>` (done with `T` when `Ok`; the last error goes into the timeout
/// message, so "retry until this call succeeds" reads naturally).
pub trait WaitOutcome {
    type Value;
    /// `Ok(value)` when done, else `Err` with an optional description of why not yet.
    fn into_outcome(self) -> Result<Self::Value, Option<String>>;
}

impl WaitOutcome for bool {
    type Value = ();
    fn into_outcome(self) -> Result<(), Option<String>> {
        if self { Ok(()) } else { Err(None) }
    }
}

impl<T> WaitOutcome for Option<T> {
    type Value = T;
    fn into_outcome(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl<T, E: Display> WaitOutcome for Result<T, E> {
    type Value = T;
    fn into_outcome(self) -> Result<T, Option<String>> {
        self.map_err(|e| Some(format!("{e:#}")))
    }
}

/// Calls `check`, again after 1 ms and twice as long each time up to [`POLL_INTERVAL`], until it
/// reports done, and returns its value; fails
/// with a message naming `what` (and the last error, if the check returns `Result`) once
/// `timeout` has passed. A check still running at the deadline is abandoned.
///
/// ```text
/// let rq = e2e::wait_for(Duration::from_secs(10), "quota copy on seed-a", || async {
///     api.get_opt("project-demo").await.ok().flatten()
/// }).await?;
/// ```
pub async fn wait_for<F, Fut>(
    timeout: Duration,
    what: &str,
    mut check: F,
) -> Result<<Fut::Output as WaitOutcome>::Value>
where
    F: FnMut() -> Fut,
    Fut: Future,
    Fut::Output: WaitOutcome,
{
    let start = Instant::now();
    let deadline = start + timeout;
    let mut last: Option<String> = None;
    let mut pauses = pauses();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, check()).await {
            Ok(outcome) => match outcome.into_outcome() {
                Ok(value) => return Ok(value),
                Err(why) => last = why.or(last),
            },
            // The last attempt cut off at the deadline says nothing about the condition: keep
            // what the attempts before it said, if anything.
            Err(_) => {
                last = last.or_else(|| Some("the check itself was still running at the deadline".to_owned()));
            }
        }
        if Instant::now() >= deadline {
            match last {
                Some(why) => bail!("timed out after {timeout:?} waiting for {what}; last: {why}"),
                None => bail!("timed out after {timeout:?} waiting for {what}"),
            }
        }
        let pause = pauses.next().unwrap_or(POLL_INTERVAL);
        tokio::time::sleep(pause.min(deadline.saturating_duration_since(Instant::now()))).await;
    }
}

/// [`wait_for`] for a synchronous caller and a check that is cheap and soon true (a signal
/// taking effect): checks `done` over and over, yielding the thread in between, and fails naming
/// `what` once `timeout` has passed.
pub fn wait_until_blocking(timeout: Duration, what: &str, mut done: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !done() {
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::yield_now();
    }
    Ok(())
}

/// [`wait_until_blocking`] for a check that does real work (lists cgroups, reads `/proc`): checks
/// `done` as [`wait_for`] does (1 ms, doubling up to [`POLL_INTERVAL`]) until it holds or `timeout` has passed, and says whether it
/// held. For teardown in `Drop`, where a failure is reported by what is left, not by an error.
pub fn poll_blocking(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    let mut pauses = pauses();
    loop {
        if done() {
            return true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        std::thread::sleep(pauses.next().unwrap_or(POLL_INTERVAL).min(left));
    }
}

/// What a watch can follow: a kube resource with a default dynamic type.
pub trait Watched:
    kube::Resource<DynamicType: Default> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static
{
}

impl<K> Watched for K where
    K: kube::Resource<DynamicType: Default>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static
{
}

/// Waits until the object `name` exists behind `api` (e.g. a quota copy reaching a seed, or the
/// webhook configuration reaching a user cluster), and returns it.
pub async fn wait_for_object<K>(api: &kube::Api<K>, name: &str, timeout: Duration) -> Result<K>
where
    K: Watched,
{
    let what = format!("{} {name} to exist", K::kind(&K::DynamicType::default()));
    let found = wait_for_state(api, name, timeout, &what, Option::is_some).await?;
    found.ok_or_else(|| anyhow::anyhow!("{what}: the object went away again"))
}

/// Waits until the object `name` is gone from behind `api` (deleted, finalizers done).
pub async fn wait_for_gone<K>(api: &kube::Api<K>, name: &str, timeout: Duration) -> Result<()>
where
    K: Watched,
{
    let what = format!("{} {name} to be gone", K::kind(&K::DynamicType::default()));
    wait_for_state(api, name, timeout, &what, Option::is_none).await?;
    Ok(())
}

/// Follows the object `name` with a watch (no polling: every change is seen as it happens;
/// watch errors are retried with backoff) until `done` holds for what the API server has, and
/// returns that; fails naming `what` (and the last watch error) after `timeout`.
async fn wait_for_state<K>(
    api: &kube::Api<K>,
    name: &str,
    timeout: Duration,
    what: &str,
    done: impl Fn(&Option<K>) -> bool,
) -> Result<Option<K>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    use futures::StreamExt as _;
    use kube::runtime::WatchStreamExt as _;
    use kube::runtime::watcher::{self, Event};

    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher::watcher(api.clone(), config).default_backoff().boxed();
    let mut last_error: Option<String> = None;
    let follow = async {
        // The object as the API server has it, once the first listing is complete.
        let (mut current, mut listed) = (None, false);
        while let Some(event) = events.next().await {
            match event {
                Ok(Event::Init) => (current, listed) = (None, false),
                Ok(Event::InitApply(object) | Event::Apply(object)) => current = Some(object),
                Ok(Event::InitDone) => listed = true,
                Ok(Event::Delete(_)) => current = None,
                Err(e) => last_error = Some(e.to_string()),
            }
            if listed && done(&current) {
                return Some(current);
            }
        }
        None
    };
    match tokio::time::timeout(timeout, follow).await {
        Ok(Some(state)) => Ok(state),
        _ => match last_error {
            Some(why) => bail!("timed out after {timeout:?} waiting for {what}; last: {why}"),
            None => bail!("timed out after {timeout:?} waiting for {what}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_come_quickly_first_then_every_poll_interval() {
        let first: Vec<u64> = pauses()
            .take(7)
            .map(|d| d.as_millis().try_into().unwrap())
            .collect();
        assert_eq!(first, [1, 2, 4, 8, 16, 25, 25]);
    }

    #[test]
    fn poll_blocking_says_whether_the_check_held_by_the_deadline() {
        let mut calls = 0;
        assert!(poll_blocking(Duration::from_secs(10), || {
            calls += 1;
            calls == 3
        }));
        assert_eq!(calls, 3);
        let started = Instant::now();
        assert!(!poll_blocking(Duration::from_millis(60), || false));
        assert!(started.elapsed() >= Duration::from_millis(60));
    }

    #[test]
    fn wait_until_blocking_returns_once_done_or_fails_at_the_deadline() {
        let mut calls = 0;
        wait_until_blocking(Duration::from_secs(10), "the third call", || {
            calls += 1;
            calls == 3
        })
        .expect("done on the third call");
        assert_eq!(calls, 3);

        let started = Instant::now();
        let timeout = Duration::from_millis(50);
        let err =
            wait_until_blocking(timeout, "something that never happens", || false).expect_err("never done");
        assert!(started.elapsed() >= timeout);
        assert!(err.to_string().contains("something that never happens"), "{err}");
    }
}
