//! kube-runtime's watcher, restarted from a fresh list when the API server's data went back in
//! time (issue #32, finding 6: a seed's etcd restored from a snapshot without
//! `--bump-revision`). A watch resumes from the last resourceVersion it saw; after such a
//! restore that version is ahead of everything the API server has, so it answers "too large
//! resource version" until enough new writes catch up, and kube-runtime's watcher keeps asking
//! (it lists again only on 410 Gone). Every cache of the system would keep the pre-restore
//! objects meanwhile. This watcher drops its position and lists again instead.

use std::fmt::Debug;
use std::sync::Arc;

use futures::stream::{self, BoxStream};
use futures::{Stream, StreamExt as _};
use kube::runtime::watcher;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tracing::warn;

/// An object's `resourceVersion` as a number, to tell which of two copies is newer (a cache
/// lags its own process's writes). Kubernetes calls the value opaque; on an etcd-backed API
/// server it is the etcd revision of the object's last write. `None` when it is missing or not
/// a number.
pub fn resource_version<K: Resource>(object: &K) -> Option<u64> {
    object.meta().resource_version.as_deref()?.parse().ok()
}

/// Called when a watcher lists again because the API server went back in time.
pub type OnRestart = Arc<dyn Fn() + Send + Sync>;

/// Whether a watch error says the resourceVersion asked for is newer than anything the API
/// server holds.
pub fn went_back_in_time(error: &watcher::Error) -> bool {
    let (code, message) = match error {
        watcher::Error::WatchError(status)
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => (status.code, status.message.as_str()),
        _ => return false,
    };
    code == 504 && message.contains("Too large resource version")
        || message.contains("ResourceVersionTooLarge")
}

/// [`watcher::watcher`], listing again from scratch whenever the API server went back in time
/// ([`went_back_in_time`]); `on_restart` is told each time.
pub fn relisting_watcher<K>(
    api: Api<K>,
    config: watcher::Config,
    on_restart: Option<OnRestart>,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let start = move || watcher::watcher(api.clone(), config.clone()).boxed();
    stream::unfold(
        None::<BoxStream<'static, watcher::Result<watcher::Event<K>>>>,
        move |current| {
            let start = start.clone();
            let on_restart = on_restart.clone();
            async move {
                let mut current = current.unwrap_or_else(&start);
                let item = current.next().await?;
                if let Err(e) = &item
                    && went_back_in_time(e)
                {
                    warn!(kind = std::any::type_name::<K>(), error = %e, "the API server's data went back in time (a restore?): listing again");
                    if let Some(f) = &on_restart {
                        f();
                    }
                    return Some((item, None));
                }
                Some((item, Some(current)))
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, message: &str) -> kube::core::Status {
        kube::core::Status {
            code,
            message: message.to_owned(),
            ..kube::core::Status::default()
        }
    }

    #[test]
    fn only_a_resource_version_ahead_of_the_server_restarts_the_watch() {
        let ahead = status(504, "Too large resource version: 9120, current: 8877");
        assert!(went_back_in_time(&watcher::Error::WatchStartFailed(
            kube::Error::Api(Box::new(ahead.clone()))
        )));
        assert!(went_back_in_time(&watcher::Error::WatchError(Box::new(ahead))));
        // A timeout for another reason, and 410 Gone (kube-runtime lists again itself), do not.
        let timeout = status(
            504,
            "the server was unable to return a response in the time allotted",
        );
        assert!(!went_back_in_time(&watcher::Error::WatchError(Box::new(timeout))));
        let gone = status(410, "too old resource version: 1 (8877)");
        assert!(!went_back_in_time(&watcher::Error::WatchError(Box::new(gone))));
    }
}
