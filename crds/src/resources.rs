//! The set of resources a quota limits and a Machine requests.
//!
//! Every resource kind is declared once, in the `resources!` invocation below; the wire struct
//! ([`ResourceDetails`]), the [`Resource`] enum, names, units and notation all come from it.
//! Sizing, slack, catalog columns, alerts and docs still need a hand each: docs/architecture.md,
//! "Where to change what".

use std::fmt;

use schemars::JsonSchema;
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};

use crate::quantity::{Notation, Quantity, QuantityError};

macro_rules! resources {
    ($( $(#[doc = $doc:literal])* $field:ident => $variant:ident { json: $json:literal, unit: $unit:literal, notation: $notation:ident } )*) => {
        /// One kind of resource a quota can limit.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Resource {
            $( $(#[doc = $doc])* $variant, )*
        }

        impl Resource {
            /// Every resource kind, in the order they are reported.
            pub const ALL: &'static [Resource] = &[$(Resource::$variant),*];

            /// The JSON field name (`cpu`, `memory`, ...), also used as the metric label.
            pub const fn name(self) -> &'static str {
                match self { $(Resource::$variant => $json,)* }
            }

            /// The unit word written after a decimal amount in messages (`4 cpu`); empty for
            /// byte amounts, whose binary suffix already says it (`8Gi memory`).
            const fn unit(self) -> &'static str {
                match self { $(Resource::$variant => $unit,)* }
            }

            /// How amounts of this resource are written.
            pub const fn notation(self) -> Notation {
                match self { $(Resource::$variant => Notation::$notation,)* }
            }
        }

        /// Amounts per resource: KKP's `ResourceDetails {cpu, memory, storage}` plus this
        /// project's additive extensions. In a quota an absent field means unlimited; in a usage it
        /// means zero.
        #[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize, JsonSchema)]
        #[serde(rename_all = "camelCase")]
        pub struct ResourceDetails {
            $(
                $(#[doc = $doc])*
                #[serde(default, skip_serializing_if = "Option::is_none")]
                pub $field: Option<Quantity>,
            )*
        }

        impl ResourceDetails {
            pub fn get(&self, resource: Resource) -> Option<Quantity> {
                match resource { $(Resource::$variant => self.$field,)* }
            }

            pub fn set(&mut self, resource: Resource, amount: Option<Quantity>) {
                match resource { $(Resource::$variant => self.$field = amount,)* }
            }
        }
    };
}

resources! {
    /// Virtual CPUs.
    cpu => Cpu { json: "cpu", unit: "cpu", notation: Decimal }
    /// Memory (RAM), in bytes.
    memory => Memory { json: "memory", unit: "memory", notation: Binary }
    /// Node disk (root disk plus data disks), in bytes.
    storage => Storage { json: "storage", unit: "storage", notation: Binary }
    /// Whole GPUs attached to the machine.
    gpu => Gpu { json: "gpu", unit: "gpu", notation: Decimal }
    /// Number of Machines.
    machines => Machines { json: "machines", unit: "machines", notation: Decimal }
    /// Number of user clusters (KKP `Cluster` objects on the seeds).
    clusters => Clusters { json: "clusters", unit: "clusters", notation: Decimal }
}

impl Resource {
    /// An amount written for a person: `4 cpu`, `8Gi memory`, `1 gpu`, `3 machines`.
    pub fn describe(self, amount: Quantity) -> String {
        format!("{} {}", amount.format(self.notation()), self.unit())
    }

    /// Whether a Machine asks for this kind. Only a `Cluster`'s creation asks for `clusters`
    /// (docs/capacity.md): a project over its `clusters` limit refuses no Machine.
    pub const fn asked_by_machines(self) -> bool {
        !matches!(self, Resource::Clusters)
    }

    /// Only the amount, in this resource's notation: `4`, `8Gi`.
    pub fn amount(self, amount: Quantity) -> String {
        amount.format(self.notation())
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// By name (`cpu`), as in every object and metric.
impl Serialize for Resource {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

// Written by hand so that memory and storage come out in binary units and cpu in decimal.
impl Serialize for ResourceDetails {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let present = Resource::ALL.iter().filter(|r| self.get(**r).is_some()).count();
        let mut map = serializer.serialize_map(Some(present))?;
        for &resource in Resource::ALL {
            if let Some(amount) = self.get(resource) {
                map.serialize_entry(resource.name(), &resource.amount(amount))?;
            }
        }
        map.end()
    }
}

/// One resource that a request would take over its limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exceeded {
    pub resource: Resource,
    pub requested: Quantity,
    pub used: Quantity,
    pub limit: Quantity,
}

impl ResourceDetails {
    /// Every resource present, as zero: the usage of nothing.
    pub fn zero() -> ResourceDetails {
        let mut zero = ResourceDetails::default();
        for &resource in Resource::ALL {
            zero.set(resource, Some(Quantity::ZERO));
        }
        zero
    }

    /// What one KKP `Cluster` counts, and what its creation asks of a quota: one cluster.
    pub fn one_cluster() -> ResourceDetails {
        let mut one = ResourceDetails::default();
        one.set(Resource::Clusters, Some(Quantity::from_units(1)));
        one
    }

    /// The amounts that are present, in [`Resource::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (Resource, Quantity)> + '_ {
        Resource::ALL.iter().filter_map(|&r| self.get(r).map(|q| (r, q)))
    }

    /// The amount, absent counting as zero (the usage reading).
    pub fn amount(&self, resource: Resource) -> Quantity {
        self.get(resource).unwrap_or(Quantity::ZERO)
    }

    /// True when no resource has a non-zero amount.
    pub fn is_empty(&self) -> bool {
        self.iter().all(|(_, q)| q.is_zero())
    }

    /// The sum, absent counting as zero; a resource absent in both stays absent.
    pub fn checked_add(&self, other: &ResourceDetails) -> Result<ResourceDetails, QuantityError> {
        let mut sum = ResourceDetails::default();
        for &resource in Resource::ALL {
            let amount = match (self.get(resource), other.get(resource)) {
                (None, None) => None,
                (a, b) => Some(a.unwrap_or_default().checked_add(b.unwrap_or_default())?),
            };
            sum.set(resource, amount);
        }
        Ok(sum)
    }

    /// Sums many usages exactly.
    pub fn checked_sum<'a>(
        items: impl IntoIterator<Item = &'a ResourceDetails>,
    ) -> Result<ResourceDetails, QuantityError> {
        items
            .into_iter()
            .try_fold(ResourceDetails::zero(), |acc, item| acc.checked_add(item))
    }

    /// Every amount `factor` times over (the size of `factor` Machines of this size); a resource
    /// absent stays absent.
    pub fn checked_times(&self, factor: i64) -> Result<ResourceDetails, QuantityError> {
        let mut out = ResourceDetails::default();
        for (resource, amount) in self.iter() {
            out.set(resource, Some(amount.checked_mul(factor)?));
        }
        Ok(out)
    }

    /// The usage left after removing `other`: never below zero, absent counting as zero.
    #[must_use]
    pub fn saturating_sub(&self, other: &ResourceDetails) -> ResourceDetails {
        let mut rest = ResourceDetails::default();
        for &resource in Resource::ALL {
            let amount = match (self.get(resource), other.get(resource)) {
                (None, None) => None,
                (a, b) => Some(
                    a.unwrap_or_default()
                        .saturating_sub_to_zero(b.unwrap_or_default()),
                ),
            };
            rest.set(resource, amount);
        }
        rest
    }

    /// The growth from `self` to `new`, per resource and never negative: what an update asks for.
    #[must_use]
    pub fn growth_to(&self, new: &ResourceDetails) -> ResourceDetails {
        new.saturating_sub(self)
    }

    /// True when `new` asks for no more of any resource than `self` (deletes and shrinks).
    pub fn covers(&self, new: &ResourceDetails) -> bool {
        Resource::ALL.iter().all(|&r| new.amount(r) <= self.amount(r))
    }

    /// Treating `self` as a limit: every resource for which `used + requested` would exceed it.
    /// Absent limits are unlimited, and a resource the request does not ask for never fails,
    /// even when usage is already over (so reductions and unrelated requests always pass).
    pub fn exceeded_by(
        &self,
        used: &ResourceDetails,
        requested: &ResourceDetails,
    ) -> Result<Vec<Exceeded>, QuantityError> {
        let mut exceeded = Vec::new();
        for &resource in Resource::ALL {
            let (Some(limit), requested) = (self.get(resource), requested.amount(resource)) else {
                continue;
            };
            if requested <= Quantity::ZERO {
                continue;
            }
            let used = used.amount(resource);
            if used.checked_add(requested)? > limit {
                exceeded.push(Exceeded {
                    resource,
                    requested,
                    used,
                    limit,
                });
            }
        }
        Ok(exceeded)
    }

    /// Treating `self` as a limit: every resource whose usage is already above it.
    pub fn overrun_by(&self, used: &ResourceDetails) -> Vec<Resource> {
        Resource::ALL
            .iter()
            .copied()
            .filter(|&r| self.get(r).is_some_and(|limit| used.amount(r) > limit))
            .collect()
    }
}

impl fmt::Display for ResourceDetails {
    /// `cpu=4, memory=8Gi, storage=100Gi`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (resource, amount) in self.iter() {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{resource}={}", resource.amount(amount))?;
        }
        if first {
            f.write_str("none")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn details(pairs: &[(Resource, &str)]) -> ResourceDetails {
        let mut d = ResourceDetails::default();
        for (r, text) in pairs {
            d.set(*r, Some(text.parse().unwrap()));
        }
        d
    }

    #[test]
    fn wire_format_is_kkp_compatible() {
        let d: ResourceDetails =
            serde_json::from_str(r#"{"cpu":"4","memory":"8Gi","storage":"100G","unknown":1}"#).unwrap();
        assert_eq!(d.cpu, Some(Quantity::from_units(4)));
        assert_eq!(d.gpu, None);
        assert_eq!(
            serde_json::to_string(&d).unwrap(),
            r#"{"cpu":"4","memory":"8Gi","storage":"97656250Ki"}"#
        );
        let empty: ResourceDetails = serde_json::from_str("{}").unwrap();
        assert_eq!(serde_json::to_string(&empty).unwrap(), "{}");
    }

    #[test]
    fn add_and_subtract() {
        let a = details(&[(Resource::Cpu, "2"), (Resource::Memory, "4Gi")]);
        let b = details(&[(Resource::Cpu, "500m"), (Resource::Storage, "10Gi")]);
        let sum = a.checked_add(&b).unwrap();
        assert_eq!(
            sum,
            details(&[
                (Resource::Cpu, "2.5"),
                (Resource::Memory, "4Gi"),
                (Resource::Storage, "10Gi")
            ])
        );
        assert_eq!(
            sum.saturating_sub(&b).get(Resource::Cpu),
            Some("2".parse().unwrap())
        );
        assert_eq!(b.saturating_sub(&a).amount(Resource::Cpu), Quantity::ZERO);
        assert_eq!(
            b.saturating_sub(&a).amount(Resource::Storage),
            "10Gi".parse::<Quantity>().unwrap()
        );
        let total = ResourceDetails::checked_sum([&a, &b, &a]).unwrap();
        assert_eq!(total.amount(Resource::Cpu), "4.5".parse::<Quantity>().unwrap());
        assert_eq!(total.amount(Resource::Gpu), Quantity::ZERO);
        let huge = details(&[(Resource::Cpu, "1e28")]);
        assert!(ResourceDetails::checked_sum(std::iter::repeat_n(&huge, 100)).is_err());
    }

    #[test]
    fn exceeded_lists_every_failing_resource() {
        let limit = details(&[(Resource::Cpu, "16"), (Resource::Memory, "32Gi")]);
        let used = details(&[
            (Resource::Cpu, "14"),
            (Resource::Memory, "30Gi"),
            (Resource::Storage, "1Ti"),
        ]);
        let request = details(&[
            (Resource::Cpu, "4"),
            (Resource::Memory, "2Gi"),
            (Resource::Storage, "1Ti"),
        ]);
        let exceeded = limit.exceeded_by(&used, &request).unwrap();
        assert_eq!(
            exceeded,
            vec![Exceeded {
                resource: Resource::Cpu,
                requested: Quantity::from_units(4),
                used: Quantity::from_units(14),
                limit: Quantity::from_units(16),
            }]
        );
        // Exactly at the limit fits.
        let request = details(&[(Resource::Cpu, "2"), (Resource::Memory, "2Gi")]);
        assert!(limit.exceeded_by(&used, &request).unwrap().is_empty());
        // A request that asks nothing of an overrun resource passes.
        let over = details(&[(Resource::Cpu, "20")]);
        let request = details(&[(Resource::Memory, "1Gi")]);
        assert!(limit.exceeded_by(&over, &request).unwrap().is_empty());
        assert_eq!(limit.overrun_by(&over), vec![Resource::Cpu]);
    }

    #[test]
    fn covers_detects_reductions() {
        let old = details(&[(Resource::Cpu, "4"), (Resource::Memory, "8Gi")]);
        assert!(old.covers(&details(&[(Resource::Cpu, "2")])));
        assert!(old.covers(&old));
        assert!(!old.covers(&details(&[(Resource::Cpu, "4"), (Resource::Gpu, "1")])));
        assert_eq!(
            old.growth_to(&details(&[(Resource::Cpu, "6")]))
                .amount(Resource::Cpu),
            Quantity::from_units(2)
        );
    }

    #[test]
    fn describes_for_people() {
        assert_eq!(Resource::Cpu.describe("4".parse().unwrap()), "4 cpu");
        assert_eq!(Resource::Memory.describe("8Gi".parse().unwrap()), "8Gi memory");
        assert_eq!(
            details(&[(Resource::Cpu, "1.5"), (Resource::Memory, "1Gi")]).to_string(),
            "cpu=1500m, memory=1Gi"
        );
    }
}
