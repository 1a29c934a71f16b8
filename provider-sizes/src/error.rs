//! Why a Machine could not be sized, written for the person who has to fix it.

use std::fmt;

use crate::provider::Provider;

/// Where the admin size catalog lives; every "add it to the catalog" message names it.
pub const ADMIN_CATALOG: &str = "ConfigMap kubermatic/kkp-quota-size-catalog, key catalog.yaml";

/// A Machine that could not be sized. [`fmt::Display`] is a complete, actionable sentence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct SizingError {
    provider: String,
    flavour: Option<String>,
    kind: SizingErrorKind,
}

/// What went wrong. Every variant maps to one [`SizingError::reason`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SizingErrorKind {
    /// The Machine has no `spec.providerSpec.value`, or it is not a JSON object.
    NoProviderSpec,
    /// `cloudProvider` is missing or empty.
    NoCloudProvider,
    /// `cloudProvider` names a provider machine-controller does not have.
    UnknownProvider,
    /// The flavour is not in the shipped catalog nor in the admin catalog.
    UnknownFlavour { field: &'static str },
    /// A field the size depends on is missing.
    MissingField { field: String, hint: &'static str },
    /// A field has the wrong JSON type or an unusable value.
    InvalidField {
        field: String,
        expected: &'static str,
        found: String,
    },
    /// A field is given by reference and the caller supplied no resolver.
    NoResolver { field: String },
    /// The resolver could not read a referenced value.
    ResolveFailed {
        field: String,
        /// Boxed: it names the object and key, and would make every sizing result large.
        cause: Box<crate::spec::ResolveError>,
    },
    /// The root disk size is neither in the spec nor known for the flavour, and the admin catalog
    /// has no `rootDiskDefaults` entry for the provider.
    UnknownRootDisk { field: &'static str, why: &'static str },
    /// The Machine carries no size at all (edge, external, fake, bare metal without hardware
    /// reference) and the admin catalog has no `"*"` entry for the provider. `what` is an
    /// optional detail, starting with `" ("` when not empty.
    NotSizable { what: String },
    /// The numbers do not fit (absurdly large values).
    Overflow { field: String },
}

impl SizingError {
    pub(crate) fn new(provider: &str, kind: SizingErrorKind) -> SizingError {
        SizingError {
            provider: provider.to_owned(),
            flavour: None,
            kind,
        }
    }

    #[must_use]
    pub(crate) fn with_flavour(mut self, flavour: &str) -> SizingError {
        self.flavour = Some(flavour.to_owned());
        self
    }

    /// The `cloudProvider` of the Machine (empty when it has none).
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// The flavour (instance type, VM size, ...) when the Machine names one.
    pub fn flavour(&self) -> Option<&str> {
        self.flavour.as_deref()
    }

    pub fn kind(&self) -> &SizingErrorKind {
        &self.kind
    }

    /// A short CamelCase word from a fixed set, for metric labels.
    pub fn reason(&self) -> &'static str {
        match self.kind {
            SizingErrorKind::NoProviderSpec => "NoProviderSpec",
            SizingErrorKind::NoCloudProvider => "NoCloudProvider",
            SizingErrorKind::UnknownProvider => "UnknownProvider",
            SizingErrorKind::UnknownFlavour { .. } => "UnknownFlavour",
            SizingErrorKind::MissingField { .. } => "MissingField",
            SizingErrorKind::InvalidField { .. } => "InvalidField",
            SizingErrorKind::NoResolver { .. } => "NoResolver",
            SizingErrorKind::ResolveFailed { .. } => "ResolveFailed",
            SizingErrorKind::UnknownRootDisk { .. } => "UnknownRootDisk",
            SizingErrorKind::NotSizable { .. } => "NotSizable",
            SizingErrorKind::Overflow { .. } => "Overflow",
        }
    }

    /// Every value [`SizingError::reason`] can return.
    pub const REASONS: &'static [&'static str] = &[
        "NoProviderSpec",
        "NoCloudProvider",
        "UnknownProvider",
        "UnknownFlavour",
        "MissingField",
        "InvalidField",
        "NoResolver",
        "ResolveFailed",
        "UnknownRootDisk",
        "NotSizable",
        "Overflow",
    ];
}

/// How people call the flavour on each provider (by the name the Machine gave; one this crate
/// does not know is a "flavour"). Exhaustive, so that a new provider asks for its word.
fn flavour_word(provider: &str) -> &'static str {
    let Some(provider) = Provider::from_name(provider) else {
        return "flavour";
    };
    match provider {
        Provider::Aws | Provider::Alibaba | Provider::EquinixMetal => "instance type",
        Provider::Azure => "VM size",
        Provider::Gce => "machine type",
        Provider::Openstack => "flavor",
        Provider::Hetzner => "server type",
        Provider::Digitalocean => "droplet size",
        Provider::Linode => "Linode type",
        Provider::Vultr => "plan",
        Provider::Scaleway => "commercial type",
        Provider::Kubevirt => "instancetype",
        Provider::Baremetal => "hardware",
        Provider::Vsphere
        | Provider::Nutanix
        | Provider::VmwareCloudDirector
        | Provider::Anexia
        | Provider::Opennebula
        | Provider::Edge
        | Provider::External
        | Provider::Fake => "flavour",
    }
}

impl fmt::Display for SizingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self.provider.as_str();
        match &self.kind {
            SizingErrorKind::NoProviderSpec => write!(
                f,
                "the Machine has no spec.providerSpec.value object, so its size cannot be known; \
                 set spec.providerSpec.value with cloudProvider and cloudProviderSpec. A legacy \
                 spec.providerConfig is not read: machine-controller moves it to spec.providerSpec \
                 only in a one-time migration when it starts and builds no node from a Machine that \
                 still has it, so move its value to spec.providerSpec.value"
            ),
            SizingErrorKind::NoCloudProvider => write!(
                f,
                "spec.providerSpec.value.cloudProvider is missing or empty; set it to the \
                 machine-controller provider of this Machine (aws, azure, gce, ...)"
            ),
            SizingErrorKind::UnknownProvider => write!(
                f,
                "cloud provider {p:?} is not a machine-controller provider this quota system \
                 knows; use one of {}",
                crate::provider::Provider::NAMES.join(", ")
            ),
            SizingErrorKind::UnknownFlavour { field } => {
                let flavour = self.flavour.as_deref().unwrap_or("");
                write!(
                    f,
                    "{p} {} {flavour:?} (cloudProviderSpec.{field}) is not in the size catalog; \
                     add it to the admin size catalog ({ADMIN_CATALOG}) under providers.{p} or \
                     use a known {}",
                    flavour_word(p),
                    flavour_word(p)
                )
            }
            SizingErrorKind::MissingField { field, hint } => {
                write!(f, "{p} Machine: cloudProviderSpec.{field} is missing; {hint}")
            }
            SizingErrorKind::InvalidField {
                field,
                expected,
                found,
            } => write!(
                f,
                "{p} Machine: cloudProviderSpec.{field} must be {expected}, found {found}; \
                 correct the Machine's provider spec"
            ),
            SizingErrorKind::NoResolver { field } => write!(
                f,
                "{p} Machine: cloudProviderSpec.{field} is given by secretKeyRef/configMapKeyRef \
                 and no resolver for referenced values is available here; put the value inline \
                 in the Machine or run the sizing where referenced Secrets/ConfigMaps are cached"
            ),
            SizingErrorKind::ResolveFailed { field, cause } => write!(
                f,
                "{p} Machine: cloudProviderSpec.{field} refers to a value that cannot be read \
                 ({cause}); check that the referenced Secret/ConfigMap and key exist"
            ),
            SizingErrorKind::UnknownRootDisk { field: "", why } => write!(
                f,
                "{p} {} {:?}: the root disk size is unknown ({why}); set storage for it under \
                 providers.{p} or set rootDiskDefaults.{p} in the admin size catalog \
                 ({ADMIN_CATALOG})",
                flavour_word(p),
                self.flavour.as_deref().unwrap_or("")
            ),
            SizingErrorKind::UnknownRootDisk { field, why } => {
                write!(
                    f,
                    "{p} Machine: the root disk size is unknown ({why}); set cloudProviderSpec.{field} \
                     in the Machine, or set rootDiskDefaults.{p}"
                )?;
                if let Some(flavour) = &self.flavour {
                    write!(f, " or storage for {flavour:?} under providers.{p}")?;
                }
                write!(f, " in the admin size catalog ({ADMIN_CATALOG})")
            }
            SizingErrorKind::NotSizable { what } => write!(
                f,
                "{p} Machines carry no size of their own{what}; add an entry \"{any}\" under \
                 providers.{p} in the admin size catalog ({ADMIN_CATALOG}) to size every such Machine",
                any = crate::sizing::ANY_MACHINE
            ),
            SizingErrorKind::Overflow { field } => write!(
                f,
                "{p} Machine: the size computed from cloudProviderSpec.{field} is too large to \
                 represent; correct the Machine's provider spec"
            ),
        }
    }
}
