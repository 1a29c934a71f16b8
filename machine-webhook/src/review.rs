//! `admission.k8s.io/v1` `AdmissionReview` on the wire, and what a Machine request asks of the
//! quota.

use kkp_quota_crds::machine::Machine;
use provider_sizes::{SizeCatalog, size_machine};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::decision::{Ask, Reason, Request, Subject, Verdict};

pub const API_VERSION: &str = "admission.k8s.io/v1";
pub const KIND: &str = "AdmissionReview";

/// The review the API server sends.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReview {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<AdmissionRequest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<AdmissionResponse>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct GroupVersionResource {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub resource: String,
}

/// The parts of `AdmissionRequest` the webhook reads.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    pub uid: String,
    #[serde(default)]
    pub resource: GroupVersionResource,
    #[serde(default)]
    pub sub_resource: Option<String>,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
    /// `CREATE`, `UPDATE`, `DELETE`, `CONNECT`.
    pub operation: String,
    #[serde(default)]
    pub object: Option<Value>,
    #[serde(default)]
    pub old_object: Option<Value>,
    #[serde(default)]
    pub dry_run: Option<bool>,
}

/// `metav1.Status`, as far as a denial needs it.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct Status {
    pub code: u16,
    pub message: String,
    #[serde(default)]
    pub reason: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    pub uid: String,
    pub allowed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl AdmissionResponse {
    pub fn from_verdict(uid: &str, verdict: &Verdict) -> AdmissionResponse {
        AdmissionResponse {
            uid: uid.to_owned(),
            allowed: verdict.allowed,
            status: verdict
                .message
                .as_ref()
                .filter(|_| !verdict.allowed)
                .map(|m| Status {
                    code: 403,
                    message: m.clone(),
                    reason: verdict.reason.camel().to_owned(),
                }),
            warnings: verdict.warnings.clone(),
        }
    }

    pub fn into_review(self) -> AdmissionReview {
        AdmissionReview {
            api_version: API_VERSION.to_owned(),
            kind: KIND.to_owned(),
            request: None,
            response: Some(self),
        }
    }
}

/// A body that is not an `admission.k8s.io/v1` `AdmissionReview` with a request: answered 400.
#[derive(Debug, thiserror::Error)]
pub enum BadReview {
    #[error("not an AdmissionReview: {0}")]
    Json(#[from] serde_json::Error),
    #[error(
        "expected apiVersion {API_VERSION:?} and kind {KIND:?}, got apiVersion {api_version:?} and kind {kind:?}"
    )]
    WrongType { api_version: String, kind: String },
    #[error("the AdmissionReview has no request")]
    NoRequest,
}

/// Parses a request body. `serde_json` refuses nesting deeper than 128 levels (an error, not a
/// stack overflow) and unknown fields are ignored.
pub fn parse_review(body: &[u8]) -> Result<AdmissionRequest, BadReview> {
    let review: AdmissionReview = serde_json::from_slice(body)?;
    if review.api_version != API_VERSION || review.kind != KIND {
        return Err(BadReview::WrongType {
            api_version: review.api_version,
            kind: review.kind,
        });
    }
    review.request.ok_or(BadReview::NoRequest)
}

/// What a Machine admission request asks, ready for [`crate::decision::decide`]: the Machine's
/// name and what it asks of the quota. `Err` is the answer itself (not a Machine request: allowed
/// unchanged; an unreadable Machine: denied as a bad request). Pure: no cache, no I/O.
pub fn decision_request(
    request: &AdmissionRequest,
    catalog: &SizeCatalog,
) -> Result<(Option<Machine>, Request), Box<Verdict>> {
    if request.resource.resource != "machines" || request.sub_resource.is_some() {
        return Err(Box::new(Verdict::allow(Reason::Unchanged)));
    }
    let object = match machine_of(request.object.as_ref()) {
        Ok(m) => m,
        Err(e) => {
            return Err(Box::new(Verdict::deny(
                Reason::BadRequest,
                &request.name,
                &format!("is not a readable Machine: {e}"),
            )));
        }
    };
    // A failed read of the old object only loses the "was it this big already" answer.
    let old = machine_of(request.old_object.as_ref()).ok().flatten();
    let name = object
        .as_ref()
        .and_then(|m| m.metadata.name.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| request.name.clone());
    let ask = ask_for(&request.operation, object.as_ref(), old.as_ref(), catalog);
    let decision_request = Request {
        machine: name,
        ask,
        dry_run: request.dry_run.unwrap_or(false),
        subject: Subject::Machine,
        autoscaled: None,
    };
    Ok((object, decision_request))
}

/// The request's Machine (the new object; the old one for a delete).
pub fn machine_of(value: Option<&Value>) -> Result<Option<Machine>, serde_json::Error> {
    value
        .filter(|v| !v.is_null())
        .map(|v| serde_json::from_value::<Machine>(v.clone()))
        .transpose()
}

/// What a Machine request asks of the quota. Sizing is offline (the catalog); provider values
/// given by reference are not resolved (no call to another cluster while a request waits), so a
/// size given only by reference makes the Machine unsizeable with provider-sizes' message.
pub fn ask_for(
    operation: &str,
    object: Option<&Machine>,
    old: Option<&Machine>,
    catalog: &SizeCatalog,
) -> Ask {
    let size = |m: &Machine| size_machine(m, catalog, None);
    match (operation, object) {
        ("DELETE", _) => Ask::Delete,
        ("CREATE", Some(machine)) => match size(machine) {
            Ok(size) => Ask::Create(size),
            Err(e) => Ask::Unsizeable(e.to_string()),
        },
        ("UPDATE", Some(machine)) => {
            let Some(old) = old else {
                return Ask::Unchanged;
            };
            if old.spec.provider_spec == machine.spec.provider_spec
                || machine.metadata.deletion_timestamp.is_some()
            {
                return Ask::Unchanged;
            }
            match size(machine) {
                Ok(new) => Ask::Update {
                    old: size(old).ok(),
                    new,
                },
                Err(e) => Ask::Unsizeable(e.to_string()),
            }
        }
        ("CREATE" | "UPDATE", None) => Ask::Unsizeable("the request carries no Machine object".to_owned()),
        _ => Ask::Unchanged,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn machine(cpus: i64) -> Machine {
        serde_json::from_value(json!({
            "apiVersion": "cluster.k8s.io/v1alpha1",
            "kind": "Machine",
            "metadata": {"name": "m", "namespace": "kube-system", "uid": "u1"},
            "spec": {"providerSpec": {"value": {
                "cloudProvider": "vsphere",
                "cloudProviderSpec": {"cpus": cpus, "memoryMB": 2048, "diskSizeGB": 10}
            }}}
        }))
        .unwrap()
    }

    #[test]
    fn operations_map_to_asks() {
        let catalog = SizeCatalog::shipped();
        let create = ask_for("CREATE", Some(&machine(2)), None, &catalog);
        let Ask::Create(size) = &create else {
            panic!("{create:?}")
        };
        assert_eq!(size.amount(kkp_quota_crds::Resource::Cpu), 2);
        assert_eq!(
            ask_for("UPDATE", Some(&machine(2)), Some(&machine(2)), &catalog),
            Ask::Unchanged
        );
        assert!(matches!(
            ask_for("UPDATE", Some(&machine(4)), Some(&machine(2)), &catalog),
            Ask::Update { old: Some(_), .. }
        ));
        assert_eq!(ask_for("DELETE", None, Some(&machine(2)), &catalog), Ask::Delete);
        let mut bad = machine(2);
        bad.spec.provider_spec.value = Some(json!({"cloudProvider": "vsphere", "cloudProviderSpec": {}}));
        assert!(matches!(
            ask_for("CREATE", Some(&bad), None, &catalog),
            Ask::Unsizeable(_)
        ));
    }

    #[test]
    fn response_round_trips_the_uid_and_status() {
        let verdict = Verdict::deny(crate::decision::Reason::QuotaExceeded, "m", "needs 1 cpu");
        let review = AdmissionResponse::from_verdict("abc", &verdict).into_review();
        let json = serde_json::to_value(&review).unwrap();
        assert_eq!(json["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(json["response"]["uid"], "abc");
        assert_eq!(json["response"]["allowed"], false);
        assert_eq!(json["response"]["status"]["code"], 403);
        assert_eq!(
            json["response"]["status"]["message"],
            r#"machine "m" needs 1 cpu"#
        );
    }
}
