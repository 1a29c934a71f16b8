//! machine-controller's owners of a Machine (`MachineSet`, `MachineDeployment`): finding one in
//! an owner list, and the API resource to read or patch it with. Used by the denial Events, the
//! rollout hint and the waking of refused owners.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ApiResource, DynamicObject};
use kube::{Api, Client};

use kkp_quota_crds::machine::GROUP;

/// The owner of `kind` in machine-controller's group, if the list has one.
pub fn owner<'a>(owners: &'a [OwnerReference], kind: &str) -> Option<&'a OwnerReference> {
    owners
        .iter()
        .find(|o| o.kind == kind && o.api_version.split_once('/').is_some_and(|(g, _)| g == GROUP))
}

/// The controller owner of `kind` in machine-controller's group: the one the Machine (or
/// `MachineSet`) belongs to, as seed-controller counts it (a non-controller reference names no
/// deployment whose room the Machine may take).
pub fn controller<'a>(owners: &'a [OwnerReference], kind: &str) -> Option<&'a OwnerReference> {
    kkp_quota_crds::machine::controller_ref(owners, kind)
}

/// The object that reconciles the Machine: its `MachineSet`, else a `MachineDeployment` owning it
/// directly.
pub fn reconciling_owner(owners: &[OwnerReference]) -> Option<&OwnerReference> {
    owner(owners, "MachineSet").or_else(|| owner(owners, "MachineDeployment"))
}

/// An owner of `kind` as `reference` names it, read from the user cluster (`None`: gone).
pub async fn read(
    client: &Client,
    namespace: &str,
    reference: &OwnerReference,
    kind: &str,
) -> Result<Option<DynamicObject>, kube::Error> {
    Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &resource(&reference.api_version, kind))
        .get_opt(&reference.name)
        .await
}

/// The `MachineDeployment` owning a `MachineSet` object, if one does.
pub fn deployment_of(set: &DynamicObject) -> Option<&OwnerReference> {
    set.metadata
        .owner_references
        .as_deref()
        .and_then(|o| owner(o, "MachineDeployment"))
}

/// The API resource of an owner (`MachineSet` -> `machinesets`), in its own group and version.
pub fn resource(api_version: &str, kind: &str) -> ApiResource {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    ApiResource {
        group: group.to_owned(),
        version: version.to_owned(),
        api_version: api_version.to_owned(),
        kind: kind.to_owned(),
        plural: format!("{}s", kind.to_lowercase()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(api_version: &str, kind: &str, name: &str) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            ..OwnerReference::default()
        }
    }

    #[test]
    fn only_machine_controller_owners_count_and_the_machine_set_comes_first() {
        let owners = [
            reference("apps/v1", "MachineSet", "elsewhere"),
            reference("cluster.k8s.io/v1alpha1", "MachineDeployment", "d"),
            reference("cluster.k8s.io/v1alpha1", "MachineSet", "s"),
        ];
        assert_eq!(reconciling_owner(&owners).map(|o| o.name.as_str()), Some("s"));
        assert_eq!(
            reconciling_owner(&owners[..2]).map(|o| o.name.as_str()),
            Some("d")
        );
        assert!(reconciling_owner(&owners[..1]).is_none());
        assert!(
            controller(&owners, "MachineSet").is_none(),
            "none is the controller"
        );
        let mut controlled = owners.clone();
        controlled[2].controller = Some(true);
        assert_eq!(
            controller(&controlled, "MachineSet").map(|o| o.name.as_str()),
            Some("s")
        );
        let r = resource("cluster.k8s.io/v1alpha1", "MachineDeployment");
        assert_eq!(
            (r.group.as_str(), r.version.as_str(), r.plural.as_str()),
            ("cluster.k8s.io", "v1alpha1", "machinedeployments")
        );
    }
}
