//! What master-controller last wrote onto KKP's `ResourceQuota` copies on the seeds. Those copies
//! are written, not watched (the `QuotaLedger` is the seed side the controller reads), so this
//! memory is what keeps their writes to "only when changed".

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::fingerprint::Fingerprint;

/// What this process last wrote onto KKP's `ResourceQuota` copy on each seed, per (seed, quota),
/// as fingerprints: of the apply body, and of the copy's `globalUsage` as KKP reads it (what this
/// process wrote, or what the copy's status held in the answer to its apply). With
/// 10,000 quotas over 3 seeds the apply bodies themselves took 66 MB of the heap. KKP's copies
/// are not watched (the ledger is the seed side this controller reads); each is written once
/// per process and whenever it would change.
#[derive(Default)]
pub(crate) struct KkpCopies(Mutex<HashMap<(String, String), KkpCopy>>);

#[derive(Default, Clone)]
pub(crate) struct KkpCopy {
    pub applied: Option<Fingerprint>,
    pub status: Option<Fingerprint>,
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
