//! The objects of the KKP quota system, and exact quantity arithmetic.
//!
//! - [`quantity`]: exact Kubernetes quantities.
//! - [`resources`]: the resource set (cpu, memory, storage, gpu, machines) and its arithmetic.
//! - [`quota`]: KKP's `ResourceQuota`, exactly in KKP's shape.
//! - [`project_quota`], [`quota_ledger`], [`quota_view`]: this project's own objects
//!   (`kkp-quota.dev/v1alpha1`): the master's view of a project quota, each seed's ledger of it,
//!   and the users' read-only view of it in each user cluster.
//! - [`ledger`]: admission reservations and allotments kept in a `QuotaLedger`'s status.
//! - [`reserved`]: capacity reserved for cluster autoscalers (a `MachineDeployment`'s bounds).
//! - [`autoscaled`]: the policy `reservedCounts`: that capacity counted, and admitted from.
//! - [`rollout`]: the opt-in rollout allowance (surge Machines over the limit) and its rules.
//! - [`kkp`], [`machine`]: the parts of KKP's and machine-controller's objects this project uses.
//! - [`kkp_shape`]: KKP's CRDs in KKP's shape, for the local fleet only.
//! - [`crd`]: the CRD manifests `crdgen` writes.
//! - `fixtures` (feature `test-support`): test data every crate's tests share.

pub mod autoscaled;
pub mod crd;
pub mod fit;
#[cfg(any(test, feature = "test-support"))]
pub mod fixtures;
pub mod kkp;
pub mod kkp_shape;
pub mod ledger;
pub mod machine;
pub mod project_quota;
pub mod quantity;
pub mod quota;
pub mod quota_group;
pub mod quota_ledger;
pub mod quota_view;
pub mod reserved;
pub mod resources;
pub mod rollout;
pub mod shares;

pub use project_quota::{ProjectQuota, ProjectQuotaSpec, ProjectQuotaStatus};
pub use quantity::{Notation, Quantity, QuantityError};
pub use quota::{KkpQuota, ResourceQuota, ResourceQuotaSpec, ResourceQuotaStatus, Subject};
pub use quota_group::{GroupMode, GroupOwner, NamedUsage, QuotaGroup, QuotaGroupSpec, QuotaGroupStatus};
pub use quota_ledger::{
    LastKnownSize, LedgerGroup, LedgerShares, LedgerSubject, QuotaLedger, QuotaLedgerSpec, QuotaLedgerStatus,
    ShareDemand,
};
pub use quota_view::{ClusterUse, QuotaView, QuotaViewSpec, QuotaViewStatus, ViewState};
pub use resources::{Exceeded, Resource, ResourceDetails};
