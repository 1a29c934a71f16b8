//! The CRD manifests, as `crdgen` writes them under `deploy/crds/`.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::kkp_shape;
use crate::machine::{Machine, MachineDeployment, MachineSet};
use crate::project_quota::ProjectQuota;
use crate::quota_group::QuotaGroup;
use crate::quota_ledger::QuotaLedger;
use crate::quota_view::QuotaView;

/// Annotation that marks the minimal stand-in CRDs used by the local fleet and tests.
pub const PURPOSE_ANNOTATION: &str = "kkp-quota.dev/purpose";

/// One CRD and the file it is written to, relative to `deploy/crds/`.
pub struct CrdFile {
    pub path: &'static str,
    pub crd: CustomResourceDefinition,
}

/// The product's CRDs, all in this project's own group: `ProjectQuota` and `QuotaGroup` for the
/// master, `QuotaLedger` for every seed (installing them everywhere is harmless).
pub fn product() -> Vec<CrdFile> {
    vec![
        CrdFile {
            path: "projectquotas.kkp-quota.dev.yaml",
            crd: ProjectQuota::crd(),
        },
        CrdFile {
            path: "quotaledgers.kkp-quota.dev.yaml",
            crd: QuotaLedger::crd(),
        },
        CrdFile {
            path: "quotagroups.kkp-quota.dev.yaml",
            crd: QuotaGroup::crd(),
        },
    ]
}

/// Stand-ins for KKP's and machine-controller's own CRDs, for the local fleet and tests only:
/// a real KKP installation already has the real ones, and this project never installs those.
/// KKP's are in KKP's shape ([`kkp_shape`]), so the fleet prunes what KKP would prune.
pub fn fleet_only() -> Vec<CrdFile> {
    let mut files = vec![
        CrdFile {
            path: "fleet-only/resourcequotas.kubermatic.k8c.io.yaml",
            crd: kkp_shape::resource_quota(),
        },
        CrdFile {
            path: "fleet-only/projects.kubermatic.k8c.io.yaml",
            crd: kkp_shape::project(),
        },
        CrdFile {
            path: "fleet-only/seeds.kubermatic.k8c.io.yaml",
            crd: kkp_shape::seed(),
        },
        CrdFile {
            path: "fleet-only/clusters.kubermatic.k8c.io.yaml",
            crd: kkp_shape::cluster(),
        },
        CrdFile {
            path: "fleet-only/kubermaticsettings.kubermatic.k8c.io.yaml",
            crd: kkp_shape::kubermatic_setting(),
        },
        CrdFile {
            path: "fleet-only/machines.cluster.k8s.io.yaml",
            crd: machine_stand_in(),
        },
        CrdFile {
            path: "fleet-only/machinesets.cluster.k8s.io.yaml",
            crd: keeping_every_field(MachineSet::crd()),
        },
        CrdFile {
            path: "fleet-only/machinedeployments.cluster.k8s.io.yaml",
            crd: keeping_every_field(MachineDeployment::crd()),
        },
    ];
    for file in &mut files {
        let annotations = file.crd.metadata.annotations.get_or_insert_with(Default::default);
        annotations.insert(
            PURPOSE_ANNOTATION.to_owned(),
            "local fleet and tests only; KKP and machine-controller ship the real CRD (KKP's in KKP's shape)"
                .to_owned(),
        );
        // `cluster.k8s.io` is a protected group (*.k8s.io): the API server refuses a CRD in it
        // without this annotation.
        if file.crd.spec.group.ends_with(".k8s.io") {
            annotations.insert(
                "api-approved.kubernetes.io".to_owned(),
                "unapproved, stand-in for machine-controller's CRD in the local fleet".to_owned(),
            );
        }
    }
    files
}

/// machine-controller's `Machine` CRD keeps every field at every depth, `status` included, and
/// has no status subresource; the stand-in does the same, so a status write reaches the object
/// (and moves its generation) as it does in a real user cluster.
fn machine_stand_in() -> CustomResourceDefinition {
    keeping_every_field(Machine::crd())
}

/// The CRD with every field kept at the top level too (`status` included).
fn keeping_every_field(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    for version in &mut crd.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            schema.x_kubernetes_preserve_unknown_fields = Some(true);
        }
    }
    crd
}

/// Every CRD manifest, product first.
pub fn all() -> Vec<CrdFile> {
    let mut files = product();
    files.extend(user_cluster());
    files.extend(fleet_only());
    files
}

/// The CRD seed-controller installs in every user cluster itself (not the chart): the users'
/// read-only view of their project's quota.
pub fn user_cluster() -> Vec<CrdFile> {
    vec![CrdFile {
        path: "user-cluster/quotaviews.kkp-quota.dev.yaml",
        crd: QuotaView::crd(),
    }]
}

/// The YAML text of one CRD, with a header that says where it comes from.
pub fn to_yaml(file: &CrdFile) -> Result<String, serde_saphyr::ser_error::Error> {
    Ok(format!(
        "# Generated by `cargo run -p kkp-quota-crds --bin crdgen`; do not edit.\n{}",
        serde_saphyr::to_string(&file.crd)?
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `crdgen` writes reads back as exactly the CRD (the YAML writer folds long strings
    /// such as the quantity pattern; folding must not change them).
    #[test]
    fn the_yaml_reads_back_as_the_crd() {
        for file in all() {
            let yaml = to_yaml(&file).unwrap();
            let back: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
            assert_eq!(back, serde_json::to_value(&file.crd).unwrap(), "{}", file.path);
        }
    }
}
