//! Machine -> requested resources, per provider.

use kkp_quota_crds::machine::Machine;
use kkp_quota_crds::{Quantity, Resource, ResourceDetails};
use serde_json::Value;

use crate::catalog::{Flavour, SizeCatalog};
use crate::error::{SizingError, SizingErrorKind};
use crate::field::{self, Found, Null};
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
    // The top level is machine-controller's providerconfig.Config, read by the same rule.
    let name = match field::get(top, "cloudProvider", Null::Keep) {
        Found::Value(Value::String(name)) if !name.is_empty() => name.as_str(),
        _ => return Err(SizingError::new("", SizingErrorKind::NoCloudProvider)),
    };
    let provider =
        Provider::from_name(name).ok_or_else(|| SizingError::new(name, SizingErrorKind::UnknownProvider))?;
    let empty = serde_json::Map::new();
    let object = match field::get(top, "cloudProviderSpec", Null::Reset) {
        Found::Value(Value::Object(object)) => object,
        Found::Absent | Found::Null => &empty,
        Found::Value(other) => {
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
    let operating_system = match field::get(top, "operatingSystem", Null::Keep) {
        Found::Value(Value::String(os)) => Some(os.as_str()),
        _ => None,
    };
    let spec = Spec {
        provider,
        name,
        object,
        resolver,
        operating_system,
        prefix: String::new(),
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

    /// The OS disk of an Azure VM whose spec leaves `osDiskSize` unset: the image's own size.
    /// Known for machine-controller's default marketplace image of each operating system;
    /// unknown for a custom image (`imageID`, `imageReference`, `imagePlan`).
    fn azure_os_disk_default(&self) -> Result<Quantity, SizingError> {
        let s = self.spec;
        if let Some(admin) = self.catalog.root_disk_default(s.provider) {
            return Ok(admin);
        }
        let custom =
            s.text("imageID")?.is_some() || s.is_set("imageReference?")? || s.is_set("imagePlan?")?;
        let why = if custom {
            "osDiskSize is unset and the Machine names its own image, whose OS disk size is not known here"
        } else {
            match s.operating_system {
                Some("ubuntu" | "flatcar") => return Ok(Quantity::from_units(30 * GIB)),
                Some("rhel") => return Ok(Quantity::from_units(64 * GIB)),
                _ => {
                    "osDiskSize is unset and the OS disk of this operating system's default image is \
                     not known here"
                }
            }
        };
        Err(s.error(SizingErrorKind::UnknownRootDisk {
            field: "osDiskSize",
            why,
        }))
    }

    fn azure(&self) -> Result<Size, SizingError> {
        let s = self.spec;
        let (name, flavour) = self.flavour("vmSize", "set it to an Azure VM size such as Standard_D4s_v5")?;
        let with = |e: SizingError| e.with_flavour(&name);
        // machine-controller sends an OS disk size only when osDiskSize is not 0.
        let os_disk = match s.int("osDiskSize", Null::Keep).map_err(with)? {
            Some(gib) if gib > 0 => self.gib("osDiskSize", gib)?,
            _ => self.azure_os_disk_default().map_err(with)?,
        };
        let data_disk = match s.int("dataDiskSize", Null::Keep).map_err(with)? {
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
        let disk = match s.int("diskSize", Null::Keep).map_err(|e| e.with_flavour(name))? {
            Some(gib) if gib > 0 => gib,
            _ => 25,
        };
        Ok(Size::of_flavour(&flavour, self.gib("diskSize", disk)?))
    }

    fn openstack(&self) -> Result<Size, SizingError> {
        let s = self.spec;
        let (name, flavour) = self.flavour("flavor", "set it to the name of an OpenStack flavor")?;
        let with = |e: SizingError| e.with_flavour(&name);
        // Set: machine-controller boots from a volume of that size; unset: the flavor's disk.
        let storage = match s.int("rootDiskSizeGB?", Null::Reset).map_err(with)? {
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
        // A provider value (a string such as "40" in machine-controller's examples).
        let disk = match s.int_text("diskSize").map_err(|e| e.with_flavour(&name))? {
            Some(gib) if gib > 0 => gib,
            _ => {
                return Err(s
                    .missing(
                        "diskSize",
                        "machine-controller requires the system disk size in GiB",
                    )
                    .with_flavour(&name));
            }
        };
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
        const TEMPLATE: &str = "virtualMachine.template";
        let s = self.spec;
        let Some(mut storage) = s.quantity("virtualMachine.template.primaryDisk.size")? else {
            return Err(s.missing(
                "virtualMachine.template.primaryDisk.size",
                "machine-controller needs the primary disk size (e.g. 10Gi)",
            ));
        };
        if let Some(disks) = s.list("virtualMachine.template.secondaryDisks")? {
            for (i, disk) in disks.iter().enumerate() {
                let prefix = format!("{TEMPLATE}.secondaryDisks[{i}].");
                let Value::Object(disk) = disk else {
                    return Err(s.invalid(&format!("{TEMPLATE}.secondaryDisks[{i}]"), "an object", disk));
                };
                let item = s.item(disk, prefix);
                let size = item
                    .quantity("size")?
                    .ok_or_else(|| item.missing("size", "every secondary disk needs a size"))?;
                storage = s.add(&format!("{TEMPLATE}.secondaryDisks[{i}].size"), storage, size)?;
            }
        }
        // An instancetype (a pointer: set at all, even without a name) fixes cpu and memory.
        if s.is_set("virtualMachine.instancetype?")? {
            let field = "virtualMachine.instancetype.name";
            let name = s.required_text(
                "virtualMachine.instancetype?.name",
                "machine-controller looks the instancetype up by name",
            )?;
            let flavour = self.catalog.flavour(s.provider, &name).ok_or_else(|| {
                s.error(SizingErrorKind::UnknownFlavour { field })
                    .with_flavour(&name)
            })?;
            return Ok(Size::of_flavour(flavour, storage));
        }
        let memory = s.quantity("virtualMachine.template.memory")?.ok_or_else(|| {
            s.missing(
                "virtualMachine.template.memory",
                "set template.memory (e.g. 8Gi) or name an instancetype",
            )
        })?;
        // machine-controller: vcpus.cores, when not 0, wins and cpus is not read at all.
        let cpu = match s.int("virtualMachine.template.vcpus.cores", Null::Keep)? {
            Some(cores) if cores > 0 => Quantity::from_units(cores),
            _ => match s.quantity("virtualMachine.template.cpus")? {
                Some(cpu) if !cpu.is_zero() => cpu,
                _ => {
                    let hint = if s.text("virtualMachine.flavor.name")?.is_some() {
                        "virtualMachine.flavor is no longer read by machine-controller: name an \
                         instancetype (virtualMachine.instancetype.name) or set template.cpus or \
                         template.vcpus.cores"
                    } else {
                        "set template.cpus or template.vcpus.cores, or name an instancetype"
                    };
                    return Err(s.missing("virtualMachine.template.cpus", hint));
                }
            },
        };
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

    /// A `*int64` disk field: set and positive, its GiB; else the admin default or a refusal.
    fn optional_disk(&self, field: &'static str, why: &'static str) -> Result<Quantity, SizingError> {
        match self.spec.int(&format!("{field}?"), Null::Reset)? {
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
        // cpuCores is vCPUs per socket; unset, Nutanix uses 1.
        let cores = match s.int("cpuCores?", Null::Reset)? {
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
        // cpus is the VM's total vCPU count (cpuCores only arranges them per socket).
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
        let disks = s.list("disks")?.filter(|d| !d.is_empty());
        let legacy = s.int("diskSize", Null::Keep)?.filter(|g| *g > 0);
        let storage = match (disks, legacy) {
            (Some(_), Some(_)) => {
                return Err(s.missing(
                    "disks",
                    "machine-controller refuses diskSize together with disks: move the size into disks[].size and remove diskSize",
                ));
            }
            (None, Some(gib)) => self.gib("diskSize", gib)?,
            (None, None) => {
                return Err(s.missing(
                    "disks",
                    "machine-controller needs at least one disk: set disks[].size (GiB)",
                ));
            }
            (Some(disks), None) => {
                let mut storage = Quantity::ZERO;
                for (i, disk) in disks.iter().enumerate() {
                    let Value::Object(disk) = disk else {
                        return Err(s.invalid(&format!("disks[{i}]"), "an object", disk));
                    };
                    let item = s.item(disk, format!("disks[{i}]."));
                    let size = item
                        .int("size", Null::Keep)?
                        .filter(|g| *g > 0)
                        .ok_or_else(|| item.missing("size", "every disk needs a size in GiB"))?;
                    let field = format!("disks[{i}].size");
                    storage = s.add(&field, storage, self.gib(&field, size)?)?;
                }
                storage
            }
        };
        self.vm("cpus", cpus, "memory", memory, storage)
    }

    fn opennebula(&self) -> Result<Size, SizingError> {
        let s = self.spec;
        // All three are Go pointers (*int) that machine-controller dereferences: required.
        let required = |path: &str, field: &str, hint: &'static str| match s.int(path, Null::Reset)? {
            Some(n) if n > 0 => Ok(n),
            _ => Err(s.missing(field, hint)),
        };
        let vcpus = required("vcpu?", "vcpu", "machine-controller requires vcpu")?;
        let memory = required("memory?", "memory", "machine-controller requires memory in MiB")?;
        let disk_mib = required(
            "diskSize?",
            "diskSize",
            "machine-controller requires diskSize in MiB",
        )?;
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
