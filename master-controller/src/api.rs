//! Small helpers around the controller's API calls: a deadline for calls to seeds, this
//! controller's field manager, 404 as "nothing to do", deletes that report whether the object
//! is gone, and `managedFields` dropped from cached objects.

use std::time::Duration;

use kube::Api;
use kube::api::{DeleteParams, PatchParams};

use crate::fanout::FIELD_MANAGER;

/// Longest wait for one call to a seed: a seed that hangs must not hold up a reconcile (and so
/// the other seeds' view of that quota) for the client's much longer default timeouts.
const SEED_CALL_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) async fn bounded<T>(
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    match tokio::time::timeout(SEED_CALL_TIMEOUT, call).await {
        Ok(result) => result,
        Err(_) => Err(kube::Error::Service(Box::new(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer from the seed within {SEED_CALL_TIMEOUT:?}"),
        )))),
    }
}

/// Patch parameters naming this controller as the field manager, so that another writer of the
/// same fields shows in `managedFields` ([`status::foreign_usage_writers`]).
pub(crate) fn ours() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    }
}

/// A 404 is success: the object is gone, so there is nothing to write.
pub(crate) fn ignore_missing<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Deletes `name` through `api`: `Ok(true)` when it is gone, `Ok(false)` while it is still there
/// (someone else's finalizer).
pub(crate) async fn delete_gone<K>(api: &Api<K>, name: &str, dp: &DeleteParams) -> Result<bool, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match bounded(api.delete(name, dp)).await {
        Ok(either) => Ok(either.is_right()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(true),
        Err(e) => Err(e),
    }
}

/// Drops `managedFields` from a cached object: server-side apply's bookkeeping is often most of
/// an object's size, and with 10,000 quotas the caches hold tens of thousands of objects. Not for
/// the master's KKP quotas, whose `managedFields` tell who else writes their usage (trimmed to
/// that: [`status::keep_usage_writers`]).
pub(crate) fn forget_managed_fields<K: kube::Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}
