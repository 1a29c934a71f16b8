//! The objects of the KKP quota system, and exact quantity arithmetic.
//!
//! - [`quantity`]: exact Kubernetes quantities.
//! - [`resources`]: the resource set (cpu, memory, storage, gpu, machines) and its arithmetic.
//! - [`quota`]: `ResourceQuota`, the product's CRD.
//! - [`ledger`]: admission reservations kept in a seed quota copy's status.
//! - [`kkp`], [`machine`]: the parts of KKP's and machine-controller's objects this project uses.
//! - [`crd`]: the CRD manifests `crdgen` writes.
//! - `runtime` (feature `runtime`): clients from kubeconfigs, the ops server, leader election.

pub mod crd;
pub mod kkp;
pub mod ledger;
pub mod machine;
pub mod quantity;
pub mod quota;
pub mod resources;
#[cfg(feature = "runtime")]
pub mod runtime;
pub mod shares;

pub use quantity::{Notation, Quantity, QuantityError};
pub use quota::{ResourceQuota, ResourceQuotaSpec, ResourceQuotaStatus, Subject};
pub use resources::{Exceeded, Resource, ResourceDetails};
