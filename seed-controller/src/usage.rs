//! Usage arithmetic, pure: Machine sizes -> a cluster's usage, clusters -> a project's
//! `localUsage`.
//!
//! A cluster's total is kept incrementally (a Machine event adds or removes one size), and can be
//! recounted from scratch; [`ClusterUsage::replace`] swaps in a fresh listing and says what it
//! corrected, which is how the periodic safety-net recount reports drift.

use std::collections::HashMap;

use kkp_quota_crds::{Quantity, QuantityError, Resource, ResourceDetails};

/// The counted Machines of one user cluster (by UID) and their sum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterUsage {
    counted: HashMap<String, ResourceDetails>,
    total: ResourceDetails,
}

impl Default for ClusterUsage {
    fn default() -> Self {
        ClusterUsage {
            counted: HashMap::new(),
            total: ResourceDetails::zero(),
        }
    }
}

/// What a full recount changed compared with the incrementally kept state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Drift {
    /// Machines the listing has that the incremental state missed.
    pub added: usize,
    /// Machines the incremental state counted that no longer exist.
    pub removed: usize,
    /// Machines counted at a different size.
    pub resized: usize,
    /// The incrementally kept total differed from the sum of its own Machines.
    pub total_mismatch: bool,
}

impl Drift {
    pub fn is_empty(&self) -> bool {
        self.added == 0 && self.removed == 0 && self.resized == 0 && !self.total_mismatch
    }
}

impl ClusterUsage {
    /// The cluster's usage: the sum of every counted Machine.
    pub fn total(&self) -> &ResourceDetails {
        &self.total
    }

    /// The size a Machine is counted at, if it is counted.
    pub fn size_of(&self, uid: &str) -> Option<&ResourceDetails> {
        self.counted.get(uid)
    }

    pub fn len(&self) -> usize {
        self.counted.len()
    }

    pub fn is_empty(&self) -> bool {
        self.counted.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &ResourceDetails)> {
        self.counted.iter().map(|(uid, size)| (uid.as_str(), size))
    }

    /// Counts a Machine at `size` (`None`: not counted, e.g. it cannot be sized). Returns whether
    /// the total changed.
    pub fn set(&mut self, uid: &str, size: Option<&ResourceDetails>) -> Result<bool, QuantityError> {
        let old = match size {
            Some(new) => {
                if self.counted.get(uid).is_some_and(|old| same_usage(old, new)) {
                    return Ok(false);
                }
                self.counted.insert(uid.to_owned(), new.clone())
            }
            None => self.counted.remove(uid),
        };
        let mut total = self.total.clone();
        if let Some(old) = &old {
            total = total.saturating_sub(old);
        }
        if let Some(new) = size {
            total = total.checked_add(new)?;
        }
        let changed = !same_usage(&total, &self.total);
        self.total = total;
        Ok(changed)
    }

    /// Forgets a Machine (it is gone). Returns whether the total changed.
    pub fn remove(&mut self, uid: &str) -> Result<bool, QuantityError> {
        self.set(uid, None)
    }

    /// The total computed from scratch.
    pub fn recount(&self) -> Result<ResourceDetails, QuantityError> {
        ResourceDetails::checked_sum(self.counted.values())
    }

    /// Replaces the counted Machines with a complete listing, and reports what differed.
    pub fn replace(&mut self, listing: HashMap<String, ResourceDetails>) -> Result<Drift, QuantityError> {
        let mut drift = Drift {
            total_mismatch: !same_usage(&self.recount()?, &self.total),
            ..Drift::default()
        };
        for (uid, size) in &listing {
            match self.counted.get(uid) {
                None => drift.added += 1,
                Some(old) if !same_usage(old, size) => drift.resized += 1,
                Some(_) => {}
            }
        }
        drift.removed = self
            .counted
            .keys()
            .filter(|uid| !listing.contains_key(*uid))
            .count();
        let total = ResourceDetails::checked_sum(listing.values())?;
        self.counted = listing;
        self.total = total;
        Ok(drift)
    }
}

/// The usage of a project on this seed: the sum of its clusters' Machines, and the clusters
/// themselves (`clusters`, one each, whether their Machines can be counted or not).
pub fn project_usage<'a>(
    cluster_usages: impl IntoIterator<Item = &'a ResourceDetails>,
    clusters: usize,
) -> Result<ResourceDetails, QuantityError> {
    let mut usage = ResourceDetails::checked_sum(cluster_usages)?;
    let clusters = i64::try_from(clusters).map_err(|_| QuantityError::Overflow("cluster count"))?;
    usage.set(Resource::Clusters, Some(Quantity::from_units(clusters)));
    Ok(usage)
}

/// Equal as usage: an absent amount is zero.
pub fn same_usage(a: &ResourceDetails, b: &ResourceDetails) -> bool {
    Resource::ALL.iter().all(|&r| a.amount(r) == b.amount(r))
}

/// An amount in base units (cores, bytes, machines) for a metric.
#[allow(clippy::cast_precision_loss)]
pub fn as_f64(amount: kkp_quota_crds::Quantity) -> f64 {
    amount.as_nanos() as f64 / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn size(cpu: i64, mem_gib: i64) -> ResourceDetails {
        let mut d = ResourceDetails::zero();
        d.set(Resource::Cpu, Some(Quantity::from_units(cpu)));
        d.set(Resource::Memory, Some(Quantity::from_gibibytes(mem_gib)));
        d.set(Resource::Machines, Some(Quantity::from_units(1)));
        d
    }

    #[test]
    fn set_resize_and_remove_keep_the_sum() {
        let mut usage = ClusterUsage::default();
        assert!(usage.set("a", Some(&size(2, 4))).unwrap());
        assert!(usage.set("b", Some(&size(4, 16))).unwrap());
        assert!(
            !usage.set("b", Some(&size(4, 16))).unwrap(),
            "same size again is no change"
        );
        assert!(same_usage(usage.total(), &size(6, 20).with_machines(2)));
        assert!(usage.set("a", Some(&size(8, 32))).unwrap());
        assert_eq!(usage.total().amount(Resource::Cpu), Quantity::from_units(12));
        assert!(usage.remove("b").unwrap());
        assert!(same_usage(usage.total(), &size(8, 32)));
        assert!(!usage.remove("missing").unwrap());
        assert!(usage.set("a", None).unwrap(), "unsizeable now: no longer counted");
        assert!(same_usage(usage.total(), &ResourceDetails::zero()));
    }

    #[test]
    fn replace_reports_drift() {
        let mut usage = ClusterUsage::default();
        usage.set("a", Some(&size(2, 4))).unwrap();
        usage.set("b", Some(&size(2, 4))).unwrap();
        let listing = HashMap::from([("a".to_owned(), size(2, 4)), ("c".to_owned(), size(1, 1))]);
        let drift = usage.replace(listing.clone()).unwrap();
        assert_eq!(
            drift,
            Drift {
                added: 1,
                removed: 1,
                resized: 0,
                total_mismatch: false
            }
        );
        assert!(usage.replace(listing).unwrap().is_empty());
        assert_eq!(usage.total().amount(Resource::Cpu), Quantity::from_units(3));
    }

    trait WithMachines {
        fn with_machines(self, n: i64) -> Self;
    }
    impl WithMachines for ResourceDetails {
        fn with_machines(mut self, n: i64) -> Self {
            self.set(Resource::Machines, Some(Quantity::from_units(n)));
            self
        }
    }

    proptest! {
        /// Any sequence of events leaves the incremental total equal to a recount.
        #[test]
        fn incremental_equals_recount(ops in proptest::collection::vec((0u8..6, proptest::option::of((0i64..64, 0i64..256))), 0..200)) {
            let mut usage = ClusterUsage::default();
            let mut model: HashMap<String, ResourceDetails> = HashMap::new();
            for (uid, op) in ops {
                let uid = uid.to_string();
                let new = op.map(|(c, m)| size(c, m));
                usage.set(&uid, new.as_ref()).unwrap();
                match new { Some(s) => { model.insert(uid, s); } None => { model.remove(&uid); } }
            }
            prop_assert!(same_usage(usage.total(), &usage.recount().unwrap()));
            prop_assert!(same_usage(usage.total(), &ResourceDetails::checked_sum(model.values()).unwrap()));
            let mut fresh = usage.clone();
            prop_assert!(fresh.replace(model).unwrap().is_empty());
        }

        #[test]
        fn project_usage_is_the_sum_of_clusters(a in 0i64..1000, b in 0i64..1000) {
            let sum = project_usage([&size(a, 1), &size(b, 2)], 2).unwrap();
            prop_assert_eq!(sum.amount(Resource::Cpu), Quantity::from_units(a + b));
            prop_assert_eq!(sum.amount(Resource::Machines), Quantity::from_units(2));
            prop_assert_eq!(sum.amount(Resource::Clusters), Quantity::from_units(2));
        }
    }
}
