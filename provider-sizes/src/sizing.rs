//! Machine -> requested resources, per provider.

use kkp_quota_crds::machine::Machine;
use kkp_quota_crds::{Quantity, Resource, ResourceDetails};
use serde_json::Value;

use crate::catalog::{Flavour, SizeCatalog};
use crate::error::{SizingError, SizingErrorKind};
use crate::gce;
use crate::provider::Provider;
use crate::spec::{Spec, ValueResolver};

const MIB: i64 = 1 << 20;
const GIB: i64 = 1 << 30;

/// The admin catalog key that sizes every Machine of a provider whose Machines carry no size
/// (baremetal, edge, external, fake).
pub const ANY_MACHINE: &str = "*";

/// What one Machine asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Size {
    cpu: Quantity,
    memory: Quantity,
    storage: Quantity,
    gpu: Quantity,
}

impl Size {
    fn details(self) -> ResourceDetails {
        let mut details = ResourceDetails::zero();
        details.set(Resource::Cpu, Some(self.cpu));
        details.set(Resource::Memory, Some(self.memory));
        details.set(Resource::Storage, Some(self.storage));
        details.set(Resource::Gpu, Some(self.gpu));
        details.set(Resource::Machines, Some(Quantity::from_units(1)));
        details
    }

    fn of_flavour(flavour: &Flavour, storage: Quantity) -> Size {
        Size {
            cpu: flavour.cpu,
            memory: flavour.memory,
            storage,
            gpu: flavour.gpu,
        }
    }
}

/// Sizes a Machine: `machines` = 1, and cpu, memory, storage and gpu always set (zero when none).
pub fn size_machine(
    machine: &Machine,
    catalog: &SizeCatalog,
    resolver: Option<&dyn ValueResolver>,
) -> Result<ResourceDetails, SizingError> {
    match machine.provider_spec() {
        Some(value) => size_provider_spec(value, catalog, resolver),
        None => Err(SizingError::new("", SizingErrorKind::NoProviderSpec)),
    }
}

/// Sizes a Machine's `spec.providerSpec.value`.
pub fn size_provider_spec(
    provider_spec_value: &Value,
    catalog: &SizeCatalog,
    resolver: Option<&dyn ValueResolver>,
) -> Result<ResourceDetails, SizingError> {
    let Value::Object(top) = provider_spec_value else {
        return Err(SizingError::new("", SizingErrorKind::NoProviderSpec));
    };
    let name = match top.get("cloudProvider") {
        Some(Value::String(name)) if !name.is_empty() => name.as_str(),
        _ => return Err(SizingError::new("", SizingErrorKind::NoCloudProvider)),
    };
    let provider =
        Provider::from_name(name).ok_or_else(|| SizingError::new(name, SizingErrorKind::UnknownProvider))?;
    let empty = serde_json::Map::new();
    let object = match top.get("cloudProviderSpec") {
        Some(Value::Object(object)) => object,
        None | Some(Value::Null) => &empty,
        Some(other) => {
            return Err(SizingError::new(
                name,
                SizingErrorKind::InvalidField {
                    field: "(cloudProviderSpec itself)".into(),
                    expected: "an object",
                    found: crate::spec::json_kind(other),
                },
            ));
        }
    };
    let spec = Spec {
        provider,
        name,
        object,
        resolver,
    };
    let sizer = Sizer { spec: &spec, catalog };
    sizer.size().map(Size::details)
}

struct Sizer<'s, 'a> {
    spec: &'s Spec<'a>,
    catalog: &'s SizeCatalog,
}

impl Sizer<'_, '_> {
    fn size(&self) -> Result<Size, SizingError> {
        let s = self.spec;
        match s.provider {
            Provider::Aws => self.aws(),
            Provider::Azure => self.azure(),
            Provider::Gce => self.gce(),
            Provider::Openstack => self.openstack(),
            Provider::Alibaba => self.alibaba(),
            Provider::Hetzner => self.flavour_only("serverType"),
            Provider::Digitalocean => self.flavour_only("size"),
            Provider::Linode => self.flavour_only("type"),
            Provider::Vultr => self.flavour_only("plan"),
            Provider::Scaleway => self.flavour_only("commercialType"),
            Provider::EquinixMetal => self.flavour_only("instanceType"),
            Provider::Kubevirt => self.kubevirt(),
            Provider::Vsphere => self.vsphere(),
            Provider::Nutanix => self.nutanix(),
            Provider::VmwareCloudDirector => self.vcd(),
            Provider::Anexia => self.anexia(),
            Provider::Opennebula => self.opennebula(),
            Provider::Baremetal => self.baremetal(),
            Provider::Edge | Provider::External | Provider::Fake => self.any_machine(),
        }
    }

    /// Looks the flavour named at `field` up; errors carry the flavour.
    fn flavour(&self, field: &'static str, hint: &'static str) -> Result<(String, Flavour), SizingError> {
        let s = self.spec;
        let name = s.required_text(field, hint)?;
        match self.catalog.flavour(s.provider, &name) {
            Some(flavour) => Ok((name.into_owned(), *flavour)),
            None => Err(s
                .error(SizingErrorKind::UnknownFlavour { field })
                .with_flavour(&name)),
        }
    }

    /// The root disk when the spec does not give it: the flavour's disk, else the admin default.
    fn default_root_disk(
        &self,
        flavour_disk: Option<Quantity>,
        field: &'static str,
        why: &'static str,
    ) -> Result<Quantity, SizingError> {
        flavour_disk
            .filter(|d| !d.is_zero())
            .or_else(|| self.catalog.root_disk_default(self.spec.provider))
            .ok_or_else(|| self.spec.error(SizingErrorKind::UnknownRootDisk { field, why }))
    }

    fn gib(&self, field: &str, value: i64) -> Result<Quantity, SizingError> {
        self.spec.scaled(field, value, GIB)
    }

    fn aws(&self) -> Result<Size, SizingError> {
        let s = self.spec;
        let (name, flavour) =
            self.flavour("instanceType", "set it to an EC2 instance type such as m5.large")?;
        let disk = s
            .required_positive(
                "diskSize",
                "machine-controller requires the root volume size in GiB (diskSize > 0)",
            )
            .map_err(|e| e.with_flavour(&name))?;
        Ok(Size::of_flavour(&flavour, self.gib("diskSize", disk)?))
    }

    fn azure(&self) -> Result<Size, SizingError> {
        let s = self.spec;
        let (name, flavour) = self.flavour("vmSize", "set it to an Azure VM size such as Standard_D4s_v5")?;
        let with = |e: SizingError| e.with_flavour(&name);
        let os_disk = match s.int("osDiskSize").map_err(with)? {
            Some(gib) if gib > 0 => self.gib("osDiskSize", gib)?,
            // Unset: the image's own OS disk size, 30 GiB for the Linux marketplace images
            // machine-controller uses, unless the admin says otherwise.
            _ => self
                .catalog
                .root_disk_default(s.provider)
                .unwrap_or(Quantity::from_units(30 * GIB)),
        };
        let data_disk = match s.int("dataDiskSize").map_err(with)? {
            Some(gib) => self.gib("dataDiskSize", gib)?,
            None => Quantity::ZERO,
        };
        Ok(Size::of_flavour(
            &flavour,
            s.add("dataDiskSize", os_disk, data_disk)?,
        ))
    }

    fn gce(&self) -> Result<Size, SizingError> {
        let s = self.spec;
        let full = s.required_text(
            "machineType",
            "set it to a GCE machine type such as n2-standard-8",
        )?;
        // A machine type URL (`zones/<zone>/machineTypes/<name>`) names the type last.
        let name = full.rsplit('/').next().unwrap_or(&full);
        let flavour = if let Some(flavour) = self.catalog.flavour(s.provider, name) {
            *flavour
        } else if let Some(custom) = gce::parse_custom(name) {
            let custom = custom.map_err(|why| {
                s.error(SizingErrorKind::InvalidField {
                    field: "machineType".into(),
                    expected: "a valid custom machine type [FAMILY-]custom-CPUS-MEMORY_MIB[-ext]",
                    found: format!("{name:?} ({why})"),
                })
                .with_flavour(name)
            })?;
            Flavour {
                cpu: Quantity::from_units(custom.cpus),
                memory: s
                    .scaled("machineType", custom.memory_mib, MIB)
                    .map_err(|e| e.with_flavour(name))?,
                gpu: Quantity::ZERO,
                disk: None,
            }
        } else {
            return Err(s
                .error(SizingErrorKind::UnknownFlavour { field: "machineType" })
                .with_flavour(name));
        };
        // machine-controller uses 25 GB (GCE's GB are GiB) when diskSize is 0 or unset.
        let disk = match s.int("diskSize").map_err(|e| e.with_flavour(name))? {
            Some(gib) if gib > 0 => gib,
            _ => 25,
        };
        Ok(Size::of_flavour(&flavour, self.gib("diskSize", disk)?))
    }

    fn openstack(&self) -> Result<Size, SizingError> {
        let s = self.spec;
        let (name, flavour) = self.flavour("flavor", "set it to the name of an OpenStack flavor")?;
        let with = |e: SizingError| e.with_flavour(&name);
        let storage = match s.int("rootDiskSizeGB").map_err(with)? {
            Some(gib) if gib > 0 => self.gib("rootDiskSizeGB", gib)?,
            _ => self
                .default_root_disk(
                    flavour.disk,
                    "rootDiskSizeGB",
                    "the flavor's disk is not in the admin catalog or is 0",
                )
                .map_err(with)?,
        };
        Ok(Size::of_flavour(&flavour, storage))
    }

    fn alibaba(&self) -> Result<Size, SizingError> {
        let s = self.spec;
        let (name, flavour) = self.flavour(
            "instanceType",
            "set it to an ECS instance type such as ecs.g6.large",
        )?;
        let disk = s
            .required_positive(
                "diskSize",
                "machine-controller requires the system disk size in GiB",
            )
            .map_err(|e| e.with_flavour(&name))?;
        Ok(Size::of_flavour(&flavour, self.gib("diskSize", disk)?))
    }

    /// Providers whose root disk is the flavour's own disk (Hetzner, `DigitalOcean`, Linode,
    /// Vultr, Scaleway, Equinix Metal): storage is that disk.
    fn flavour_only(&self, field: &'static str) -> Result<Size, SizingError> {
        let (name, flavour) = self.flavour(field, "set it to the provider's size name")?;
        let storage = self
            .default_root_disk(
                flavour.disk,
                "",
                "the flavour's local disk is unknown or it has block storage only",
            )
            .map_err(|e| e.with_flavour(&name))?;
        Ok(Size::of_flavour(&flavour, storage))
    }

    fn kubevirt(&self) -> Result<Size, SizingError> {
        let s = self.spec;
        let Some(mut storage) = s.quantity("virtualMachine.template.primaryDisk.size")? else {
            return Err(s.missing(
                "virtualMachine.template.primaryDisk.size",
                "machine-controller needs the primary disk size (e.g. 10Gi)",
            ));
        };
        if let Some(disks) = s.lookup("virtualMachine.template.secondaryDisks")? {
            let Value::Array(disks) = disks else {
                return Err(s.invalid("virtualMachine.template.secondaryDisks", "a list", disks));
            };
            for (i, disk) in disks.iter().enumerate() {
                let field = format!("virtualMachine.template.secondaryDisks[{i}].size");
                let size = match disk {
                    Value::Object(d) => match d.get("size") {
                        Some(v) => s.quantity_of(&field, v)?,
                        None => None,
                    },
                    other => {
                        return Err(s.invalid(
                            &format!("virtualMachine.template.secondaryDisks[{i}]"),
                            "an object",
                            other,
                        ));
                    }
                };
                let size = size.ok_or_else(|| s.missing(&field, "every secondary disk needs a size"))?;
                storage = s.add(&field, storage, size)?;
            }
        }
        // A named instancetype (or the older flavor) fixes cpu and memory.
        for (path, field) in [
            (
                "virtualMachine.instancetype.name",
                "virtualMachine.instancetype.name",
            ),
            ("virtualMachine.flavor.name", "virtualMachine.flavor.name"),
        ] {
            if let Some(name) = s.text(path)? {
                let flavour = self.catalog.flavour(s.provider, &name).ok_or_else(|| {
                    s.error(SizingErrorKind::UnknownFlavour { field })
                        .with_flavour(&name)
                })?;
                return Ok(Size::of_flavour(flavour, storage));
            }
        }
        let cpu = match s.quantity("virtualMachine.template.cpus")? {
            Some(cpu) if !cpu.is_zero() => cpu,
            _ => match s.int("virtualMachine.template.vcpus.cores")? {
                Some(cores) if cores > 0 => Quantity::from_units(cores),
                _ => {
                    return Err(s.missing(
                        "virtualMachine.template.cpus",
                        "set template.cpus or template.vcpus.cores, or name an instancetype",
                    ));
                }
            },
        };
        let memory = s.quantity("virtualMachine.template.memory")?.ok_or_else(|| {
            s.missing(
                "virtualMachine.template.memory",
                "set template.memory (e.g. 8Gi) or name an instancetype",
            )
        })?;
        Ok(Size {
            cpu,
            memory,
            storage,
            gpu: Quantity::ZERO,
        })
    }

    fn vm(
        &self,
        cpu_field: &str,
        cpus: i64,
        memory_field: &str,
        memory_mib: i64,
        disk: Quantity,
    ) -> Result<Size, SizingError> {
        let s = self.spec;
        Ok(Size {
            cpu: s.scaled(cpu_field, cpus, 1)?,
            memory: s.scaled(memory_field, memory_mib, MIB)?,
            storage: disk,
            gpu: Quantity::ZERO,
        })
    }

    fn optional_disk(&self, field: &'static str, why: &'static str) -> Result<Quantity, SizingError> {
        match self.spec.int(field)? {
            Some(gib) if gib > 0 => self.gib(field, gib),
            _ => self.default_root_disk(None, field, why),
        }
    }

    fn vsphere(&self) -> Result<Size, SizingError> {
        let s = self.spec;
        let cpus = s.required_positive("cpus", "set the number of vCPUs")?;
        let memory = s.required_positive("memoryMB", "set the memory in MiB")?;
        let disk = self.optional_disk(
            "diskSizeGB",
            "diskSizeGB is unset, so the template VM's disk size is used",
        )?;
        self.vm("cpus", cpus, "memoryMB", memory, disk)
    }

    fn nutanix(&self) -> Result<Size, SizingError> {
        let s = self.spec;
        let sockets = s.required_positive("cpus", "set the number of CPU sockets")?;
        let cores = match s.int("cpuCores")? {
            Some(c) if c > 0 => c,
            _ => 1,
        };
        let vcpus = sockets.checked_mul(cores).ok_or_else(|| s.overflow("cpuCores"))?;
        let memory = s.required_positive("memoryMB", "set the memory in MiB")?;
        let disk = self.optional_disk("diskSize", "diskSize is unset, so the image's size is used")?;
        self.vm("cpus", vcpus, "memoryMB", memory, disk)
    }

    fn vcd(&self) -> Result<Size, SizingError> {
        let s = self.spec;
        let cpus = s.required_positive("cpus", "set the number of vCPUs")?;
        let memory = s.required_positive("memoryMB", "set the memory in MiB")?;
        let disk = self.optional_disk(
            "diskSizeGB",
            "diskSizeGB is unset, so the template's disk size is used",
        )?;
        self.vm("cpus", cpus, "memoryMB", memory, disk)
    }

    fn anexia(&self) -> Result<Size, SizingError> {
        let s = self.spec;
        let cpus = s.required_positive("cpus", "set the number of vCPUs")?;
        let memory = s.required_positive("memory", "set the memory in MiB")?;
        let mut storage = Quantity::ZERO;
        let mut any_disk = false;
        if let Some(disks) = s.lookup("disks")? {
            let Value::Array(disks) = disks else {
                return Err(s.invalid("disks", "a list of {size, performanceType}", disks));
            };
            for (i, disk) in disks.iter().enumerate() {
                let field = format!("disks[{i}].size");
                let size = match disk {
                    Value::Object(d) => match d.get("size") {
                        Some(v) => s.int_of(&field, v)?,
                        None => None,
                    },
                    other => return Err(s.invalid(&format!("disks[{i}]"), "an object", other)),
                };
                let size = size
                    .filter(|g| *g > 0)
                    .ok_or_else(|| s.missing(&field, "every disk needs a size in GiB"))?;
                storage = s.add(&field, storage, self.gib(&field, size)?)?;
                any_disk = true;
            }
        }
        if !any_disk {
            // The deprecated single-disk field, still honoured by machine-controller.
            let size = s.required_positive(
                "diskSize",
                "machine-controller needs at least one disk: set disks[].size (GiB)",
            )?;
            storage = self.gib("diskSize", size)?;
        }
        self.vm("cpus", cpus, "memory", memory, storage)
    }

    fn opennebula(&self) -> Result<Size, SizingError> {
        let s = self.spec;
        let vcpus = s.required_positive("vcpu", "machine-controller requires vcpu")?;
        let memory = s.required_positive("memory", "machine-controller requires memory in MiB")?;
        let disk_mib = s.required_positive("diskSize", "machine-controller requires diskSize in MiB")?;
        let disk = s.scaled("diskSize", disk_mib, MIB)?;
        self.vm("vcpu", vcpus, "memory", memory, disk)
    }

    fn baremetal(&self) -> Result<Size, SizingError> {
        let s = self.spec;
        let name = s.text("driverSpec.hardwareRef.name")?;
        let namespace = s.text("driverSpec.hardwareRef.namespace")?;
        if let Some(name) = name {
            let key = match namespace {
                Some(ns) => format!("{ns}/{name}"),
                None => name.into_owned(),
            };
            if let Some(flavour) = self.catalog.flavour(s.provider, &key) {
                return Ok(Size::of_flavour(flavour, flavour.disk.unwrap_or_default()));
            }
            if let Some(flavour) = self.catalog.flavour(s.provider, ANY_MACHINE) {
                return Ok(Size::of_flavour(flavour, flavour.disk.unwrap_or_default()));
            }
            return Err(s
                .error(SizingErrorKind::UnknownFlavour {
                    field: "driverSpec.hardwareRef",
                })
                .with_flavour(&key));
        }
        self.any_machine()
    }

    fn any_machine(&self) -> Result<Size, SizingError> {
        let s = self.spec;
        match self.catalog.flavour(s.provider, ANY_MACHINE) {
            Some(flavour) => Ok(Size::of_flavour(flavour, flavour.disk.unwrap_or_default())),
            None => Err(s.error(SizingErrorKind::NotSizable {
                what: if s.provider == Provider::Baremetal {
                    " (no driverSpec.hardwareRef)".to_owned()
                } else {
                    String::new()
                },
            })),
        }
    }
}
