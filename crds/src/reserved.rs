//! Capacity reserved for cluster autoscalers, pure (docs/capacity.md, "Committed and reserved").
//!
//! A `MachineDeployment` with the cluster autoscaler's size annotations may grow to its maximum
//! without anyone asking. What it may still grow into, `(max - replicas) x its Machines' size`, is
//! its reservation; the Machines it runs are committed (counted as usage) as any Machine is.

use std::collections::BTreeMap;

use crate::quantity::QuantityError;
use crate::resources::ResourceDetails;

/// The annotation holding the least size the autoscaler keeps a `MachineDeployment` at.
pub const MIN_SIZE_ANNOTATION: &str = "cluster.k8s.io/cluster-api-autoscaler-node-group-min-size";
/// The annotation holding the most it may grow the `MachineDeployment` to.
pub const MAX_SIZE_ANNOTATION: &str = "cluster.k8s.io/cluster-api-autoscaler-node-group-max-size";

/// A `MachineDeployment`'s autoscaling bounds, as the cluster autoscaler reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoscalingBounds {
    pub min: u32,
    pub max: u32,
}

/// Why a `MachineDeployment`'s autoscaling annotations are not bounds the autoscaler would use
/// (it then leaves the deployment alone, and so nothing is reserved for it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BoundsError {
    #[error("it has {present} but not {missing}")]
    OnlyOne {
        present: &'static str,
        missing: &'static str,
    },
    #[error("{annotation} is {value:?}, not a whole number of Machines")]
    NotANumber { annotation: &'static str, value: String },
    #[error("its maximum size {max} is below its minimum size {min}")]
    MaxBelowMin { min: u32, max: u32 },
}

impl AutoscalingBounds {
    /// The bounds its annotations give; `Ok(None)` when it has neither (the autoscaler does not
    /// manage it).
    pub fn of(annotations: &BTreeMap<String, String>) -> Result<Option<AutoscalingBounds>, BoundsError> {
        let min = annotations.get(MIN_SIZE_ANNOTATION);
        let max = annotations.get(MAX_SIZE_ANNOTATION);
        let (min, max) = match (min, max) {
            (None, None) => return Ok(None),
            (Some(min), Some(max)) => (min, max),
            (Some(_), None) => {
                return Err(BoundsError::OnlyOne {
                    present: MIN_SIZE_ANNOTATION,
                    missing: MAX_SIZE_ANNOTATION,
                });
            }
            (None, Some(_)) => {
                return Err(BoundsError::OnlyOne {
                    present: MAX_SIZE_ANNOTATION,
                    missing: MIN_SIZE_ANNOTATION,
                });
            }
        };
        let min = parse(MIN_SIZE_ANNOTATION, min)?;
        let max = parse(MAX_SIZE_ANNOTATION, max)?;
        if max < min {
            return Err(BoundsError::MaxBelowMin { min, max });
        }
        Ok(Some(AutoscalingBounds { min, max }))
    }

    /// How many more Machines the autoscaler may add to a deployment of `replicas` (none once it
    /// is at or above its maximum, e.g. scaled up by hand).
    pub fn room_above(self, replicas: u32) -> u32 {
        self.max.saturating_sub(replicas)
    }

    /// The deployment's reservation: [`room_above`](Self::room_above) `replicas`, each of `size`.
    pub fn reservation(
        self,
        replicas: u32,
        size: &ResourceDetails,
    ) -> Result<ResourceDetails, QuantityError> {
        size.checked_times(i64::from(self.room_above(replicas)))
    }
}

fn parse(annotation: &'static str, value: &str) -> Result<u32, BoundsError> {
    value.trim().parse().map_err(|_| BoundsError::NotANumber {
        annotation,
        value: value.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::{Quantity, Resource};

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn size(cpu: i64, mem_gib: i64) -> ResourceDetails {
        let mut d = ResourceDetails::default();
        d.set(Resource::Cpu, Some(Quantity::from_units(cpu)));
        d.set(Resource::Memory, Some(Quantity::from_gibibytes(mem_gib)));
        d.set(Resource::Machines, Some(Quantity::from_units(1)));
        d
    }

    #[test]
    fn bounds_need_both_annotations_as_whole_numbers_in_order() {
        assert_eq!(AutoscalingBounds::of(&annotations(&[("other", "1")])), Ok(None));
        assert_eq!(
            AutoscalingBounds::of(&annotations(&[
                (MIN_SIZE_ANNOTATION, "1"),
                (MAX_SIZE_ANNOTATION, " 6 ")
            ])),
            Ok(Some(AutoscalingBounds { min: 1, max: 6 }))
        );
        assert!(matches!(
            AutoscalingBounds::of(&annotations(&[(MAX_SIZE_ANNOTATION, "6")])),
            Err(BoundsError::OnlyOne {
                missing: MIN_SIZE_ANNOTATION,
                ..
            })
        ));
        let error = AutoscalingBounds::of(&annotations(&[
            (MIN_SIZE_ANNOTATION, "1"),
            (MAX_SIZE_ANNOTATION, "six"),
        ]))
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            format!("{MAX_SIZE_ANNOTATION} is \"six\", not a whole number of Machines")
        );
        assert_eq!(
            AutoscalingBounds::of(&annotations(&[
                (MIN_SIZE_ANNOTATION, "-1"),
                (MAX_SIZE_ANNOTATION, "3")
            ])),
            Err(BoundsError::NotANumber {
                annotation: MIN_SIZE_ANNOTATION,
                value: "-1".into()
            })
        );
        assert_eq!(
            AutoscalingBounds::of(&annotations(&[
                (MIN_SIZE_ANNOTATION, "4"),
                (MAX_SIZE_ANNOTATION, "3")
            ])),
            Err(BoundsError::MaxBelowMin { min: 4, max: 3 })
        );
    }

    #[test]
    fn a_deployment_reserves_what_it_may_still_grow_into() {
        let bounds = AutoscalingBounds { min: 1, max: 6 };
        let reserved = bounds.reservation(2, &size(2, 8)).unwrap();
        assert_eq!(reserved.amount(Resource::Cpu), Quantity::from_units(8));
        assert_eq!(reserved.amount(Resource::Memory), Quantity::from_gibibytes(32));
        assert_eq!(reserved.amount(Resource::Machines), Quantity::from_units(4));
        assert!(
            bounds.reservation(6, &size(2, 8)).unwrap().is_empty(),
            "at its maximum"
        );
        assert!(
            bounds.reservation(9, &size(2, 8)).unwrap().is_empty(),
            "scaled above it by hand"
        );
    }

    proptest! {
        /// Replicas plus the room reserved never exceed the maximum, and reach it from below.
        #[test]
        fn replicas_and_room_make_the_maximum(min in 0u32..50, extra in 0u32..50, replicas in 0u32..120) {
            let bounds = AutoscalingBounds { min, max: min + extra };
            let room = bounds.room_above(replicas);
            prop_assert_eq!(replicas.max(bounds.max), replicas + room);
            let reserved = bounds.reservation(replicas, &size(3, 1)).unwrap();
            prop_assert_eq!(reserved.amount(Resource::Cpu), Quantity::from_units(3 * i64::from(room)));
        }
    }
}
