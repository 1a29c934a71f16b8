//! The machine-controller providers, declared once in the `providers!` invocation below: the
//! enum, [`Provider::ALL`], the accepted names and the parser all come from it.

/// Declares [`Provider`]: each variant with its canonical name (the admin catalog's key) and
/// any aliases machine-controller also accepts.
macro_rules! providers {
    ($( $variant:ident => $name:literal $(| $alias:literal)* ),+ $(,)?) => {
        /// Every `cloudProvider` value machine-controller accepts (`packet` is an alias of
        /// `equinixmetal`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Provider {
            $($variant),+
        }

        impl Provider {
            /// Number of providers; catalogs index arrays with [`Provider::index`].
            pub const COUNT: usize = [$(Provider::$variant),+].len();

            pub const ALL: [Provider; Provider::COUNT] = [$(Provider::$variant),+];

            /// The names accepted, for messages.
            pub const NAMES: &'static [&'static str] = &[$($name $(, $alias)*),+];

            /// Parses a `cloudProvider` value (exact, as machine-controller does).
            pub fn from_name(name: &str) -> Option<Provider> {
                match name {
                    $($name $(| $alias)* => Some(Provider::$variant),)+
                    _ => None,
                }
            }

            /// The canonical name (the admin catalog's key).
            pub const fn name(self) -> &'static str {
                match self {
                    $(Provider::$variant => $name),+
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
    };
}

providers! {
    Aws => "aws",
    Azure => "azure",
    Gce => "gce",
    Openstack => "openstack",
    Hetzner => "hetzner",
    Digitalocean => "digitalocean",
    Alibaba => "alibaba",
    EquinixMetal => "equinixmetal" | "packet",
    Linode => "linode",
    Vultr => "vultr",
    Scaleway => "scaleway",
    Kubevirt => "kubevirt",
    Vsphere => "vsphere",
    Nutanix => "nutanix",
    VmwareCloudDirector => "vmware-cloud-director",
    Anexia => "anexia",
    Opennebula => "opennebula",
    Baremetal => "baremetal",
    Edge => "edge",
    External => "external",
    Fake => "fake",
}

#[cfg(test)]
mod tests {
    use super::Provider;

    #[test]
    fn every_provider_is_listed_once_parsed_back_and_indexed_in_order() {
        for (i, provider) in Provider::ALL.iter().enumerate() {
            assert_eq!(provider.index(), i, "{provider:?}");
            assert_eq!(Provider::from_name(provider.name()), Some(*provider));
            assert!(Provider::NAMES.contains(&provider.name()));
        }
        assert_eq!(Provider::from_name("packet"), Some(Provider::EquinixMetal));
        assert_eq!(Provider::NAMES.len(), Provider::COUNT + 1);
        assert_eq!(Provider::from_name("Aws"), None);
    }
}
