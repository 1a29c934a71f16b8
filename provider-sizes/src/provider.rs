//! The machine-controller providers.

/// Every `cloudProvider` value machine-controller accepts (`packet` is an alias of
/// `equinixmetal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provider {
    Aws,
    Azure,
    Gce,
    Openstack,
    Hetzner,
    Digitalocean,
    Alibaba,
    EquinixMetal,
    Linode,
    Vultr,
    Scaleway,
    Kubevirt,
    Vsphere,
    Nutanix,
    VmwareCloudDirector,
    Anexia,
    Opennebula,
    Baremetal,
    Edge,
    External,
    Fake,
}

impl Provider {
    /// Number of providers; catalogs index arrays with [`Provider::index`].
    pub const COUNT: usize = 21;

    pub const ALL: [Provider; Provider::COUNT] = [
        Provider::Aws,
        Provider::Azure,
        Provider::Gce,
        Provider::Openstack,
        Provider::Hetzner,
        Provider::Digitalocean,
        Provider::Alibaba,
        Provider::EquinixMetal,
        Provider::Linode,
        Provider::Vultr,
        Provider::Scaleway,
        Provider::Kubevirt,
        Provider::Vsphere,
        Provider::Nutanix,
        Provider::VmwareCloudDirector,
        Provider::Anexia,
        Provider::Opennebula,
        Provider::Baremetal,
        Provider::Edge,
        Provider::External,
        Provider::Fake,
    ];

    /// The names accepted, for messages.
    pub const NAMES: [&'static str; Provider::COUNT + 1] = [
        "aws",
        "azure",
        "gce",
        "openstack",
        "hetzner",
        "digitalocean",
        "alibaba",
        "equinixmetal",
        "packet",
        "linode",
        "vultr",
        "scaleway",
        "kubevirt",
        "vsphere",
        "nutanix",
        "vmware-cloud-director",
        "anexia",
        "opennebula",
        "baremetal",
        "edge",
        "external",
        "fake",
    ];

    /// Parses a `cloudProvider` value (exact, as machine-controller does).
    pub fn from_name(name: &str) -> Option<Provider> {
        Some(match name {
            "aws" => Provider::Aws,
            "azure" => Provider::Azure,
            "gce" => Provider::Gce,
            "openstack" => Provider::Openstack,
            "hetzner" => Provider::Hetzner,
            "digitalocean" => Provider::Digitalocean,
            "alibaba" => Provider::Alibaba,
            "equinixmetal" | "packet" => Provider::EquinixMetal,
            "linode" => Provider::Linode,
            "vultr" => Provider::Vultr,
            "scaleway" => Provider::Scaleway,
            "kubevirt" => Provider::Kubevirt,
            "vsphere" => Provider::Vsphere,
            "nutanix" => Provider::Nutanix,
            "vmware-cloud-director" => Provider::VmwareCloudDirector,
            "anexia" => Provider::Anexia,
            "opennebula" => Provider::Opennebula,
            "baremetal" => Provider::Baremetal,
            "edge" => Provider::Edge,
            "external" => Provider::External,
            "fake" => Provider::Fake,
            _ => return None,
        })
    }

    /// The canonical name (the admin catalog's key).
    pub const fn name(self) -> &'static str {
        match self {
            Provider::Aws => "aws",
            Provider::Azure => "azure",
            Provider::Gce => "gce",
            Provider::Openstack => "openstack",
            Provider::Hetzner => "hetzner",
            Provider::Digitalocean => "digitalocean",
            Provider::Alibaba => "alibaba",
            Provider::EquinixMetal => "equinixmetal",
            Provider::Linode => "linode",
            Provider::Vultr => "vultr",
            Provider::Scaleway => "scaleway",
            Provider::Kubevirt => "kubevirt",
            Provider::Vsphere => "vsphere",
            Provider::Nutanix => "nutanix",
            Provider::VmwareCloudDirector => "vmware-cloud-director",
            Provider::Anexia => "anexia",
            Provider::Opennebula => "opennebula",
            Provider::Baremetal => "baremetal",
            Provider::Edge => "edge",
            Provider::External => "external",
            Provider::Fake => "fake",
        }
    }

    pub(crate) const fn index(self) -> usize {
        self as usize
    }

    /// Flavour names compare case-insensitively on Azure (its API does); exactly elsewhere.
    pub(crate) fn normalise_key(self, flavour: &str) -> std::borrow::Cow<'_, str> {
        if self == Provider::Azure && flavour.bytes().any(|b| b.is_ascii_uppercase()) {
            std::borrow::Cow::Owned(flavour.to_ascii_lowercase())
        } else {
            std::borrow::Cow::Borrowed(flavour)
        }
    }
}
