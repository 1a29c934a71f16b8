//! The `ValidatingWebhookConfiguration` that sends the master's quota and group edits to this
//! webhook: defined in `kkp-quota-runtime` (`allocation_config`), which the demo fleet shares.

pub use kkp_quota_runtime::allocation_config::{NAME, PATH, SPEC_CHANGES_ONLY, configuration};
