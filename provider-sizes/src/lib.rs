//! Machine -> requested resources for every machine-controller provider, offline and exactly.
//!
//! One entry point, [`size_machine`] (or [`size_provider_spec`] for a bare provider spec): cpu,
//! memory, storage and gpu (zero when none) and `machines = 1`, or a [`SizingError`] whose
//! message says why and how to fix it. Sizes come from the shipped catalogs (data files generated
//! by `catalog/generate.py`), the admin catalog ([`AdminCatalog`]), or the Machine's own spec.
//! No network, no kube client: referenced values go through the caller's [`ValueResolver`].

mod admin;
mod catalog;
mod error;
mod field;
mod gce;
mod provider;
mod sizing;
mod spec;

pub use admin::{AdminCatalog, AdminSize, CatalogError};
pub use catalog::{Flavour, SizeCatalog};
pub use error::{ADMIN_CATALOG, SizingError, SizingErrorKind};
pub use gce::{Custom as GceCustomType, parse_custom as parse_gce_custom_type};
pub use provider::Provider;
pub use sizing::{ANY_MACHINE, size_machine, size_provider_spec};
pub use spec::{ResolveError, ValueRef, ValueResolver};
