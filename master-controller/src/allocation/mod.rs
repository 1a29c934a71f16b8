//! Allocation mode (issue #36, step 4; docs/groups.md): a `QuotaGroup` with `spec.mode:
//! allocation` caps the sum of its projects' quota limits, and a validating webhook on the
//! master keeps it so.
//!
//! - [`books`]: what each project is allocated and what a group's projects are together (pure).
//! - [`decide`]: whether an edit keeps every group within its cap, and whether a group owner
//!   may make it (pure).
//! - [`review`]: the `AdmissionReview` wire format and the edit a request makes.
//! - [`pending`]: the record of raises allowed and perhaps not stored yet, shared by every
//!   replica (pure).
//! - [`record`]: that record in the API server, a `ConfigMap` written by compare-and-swap.
//! - [`registration`]: the `ValidatingWebhookConfiguration` that sends it the requests.
//! - [`server`]: the HTTPS server and one decision after another; `cache`: its caches, of only
//!   what a decision reads.

pub mod books;
mod cache;
pub mod decide;
pub mod pending;
pub mod record;
pub mod registration;
pub mod review;
pub mod server;

#[cfg(test)]
mod tests;
