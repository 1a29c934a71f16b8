//! What master-controller last wrote onto KKP's `ResourceQuota` copies on the seeds. Those copies
//! are written, not watched (the `QuotaLedger` is the seed side the controller reads), so this
//! memory is what keeps their writes to "only when changed".

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use kkp_quota_crds::ResourceDetails;

/// What this process last wrote onto KKP's `ResourceQuota` copy on each seed, per (seed, quota):
/// the apply body (a fingerprint of it: with 10,000 quotas over 3 seeds, the bodies themselves
/// took 66 MB of the heap) and `globalUsage`. KKP's copies are not watched (the ledger is the seed side
/// this controller reads); each is applied once per process and whenever it would change.
#[derive(Default)]
pub(crate) struct KkpCopies(Mutex<HashMap<(String, String), KkpCopy>>);

#[derive(Default, Clone)]
pub(crate) struct KkpCopy {
    pub applied: Option<Fingerprint>,
    pub global: Option<ResourceDetails>,
}

/// A hash of an apply body, to tell whether a body differs from the last one applied.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Fingerprint(u64);

impl Fingerprint {
    pub fn of(body: &serde_json::Value) -> Fingerprint {
        use std::hash::{DefaultHasher, Hash, Hasher};
        // `DefaultHasher::new()` has fixed keys: the same body hashes the same in this process,
        // which is all this memory needs (it is never persisted).
        let mut hasher = DefaultHasher::new();
        body.to_string().hash(&mut hasher);
        Fingerprint(hasher.finish())
    }
}

impl KkpCopies {
    pub fn get(&self, seed: &str, name: &str) -> KkpCopy {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(seed.to_owned(), name.to_owned()))
            .cloned()
            .unwrap_or_default()
    }

    pub fn update(&self, seed: &str, name: &str, f: impl FnOnce(&mut KkpCopy)) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        f(map.entry((seed.to_owned(), name.to_owned())).or_default());
    }

    pub fn forget(&self, name: &str) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(_, n), _| n != name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fingerprints_tell_bodies_apart() {
        let body = json!({"spec": {"quota": {"cpu": "4"}}});
        assert_eq!(Fingerprint::of(&body), Fingerprint::of(&body.clone()));
        assert_ne!(
            Fingerprint::of(&body),
            Fingerprint::of(&json!({"spec": {"quota": {"cpu": "5"}}}))
        );
    }
}
