//! `admission.k8s.io/v1` `AdmissionReview` on the wire (the parts this webhook reads), and the
//! [`Edit`] a request makes.

use kkp_quota_crds::{ProjectQuota, QuotaGroup, ResourceQuota};
use serde::Deserialize;
use serde_json::{Value, json};

use super::books::KkpEntry;
use super::decide::{Edit, Requester, Verdict};

/// The review the API server sends.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReview {
    pub request: Option<AdmissionRequest>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Kind {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub kind: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UserInfo {
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub groups: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    pub uid: String,
    #[serde(default)]
    pub kind: Kind,
    #[serde(default)]
    pub name: String,
    /// `CREATE`, `UPDATE`, `DELETE`.
    pub operation: String,
    #[serde(default)]
    pub object: Option<Value>,
    #[serde(default)]
    pub old_object: Option<Value>,
    #[serde(default)]
    pub user_info: UserInfo,
}

impl AdmissionRequest {
    pub fn requester(&self) -> Requester {
        Requester {
            username: self.user_info.username.clone(),
            groups: self.user_info.groups.clone(),
        }
    }

    /// The object's name: the request's, or on a create with `generateName` (which has none
    /// there yet) the object's own.
    fn object_name(&self) -> String {
        if !self.name.is_empty() {
            return self.name.clone();
        }
        self.object
            .as_ref()
            .and_then(|o| o.get("metadata")?.get("name")?.as_str())
            .unwrap_or_default()
            .to_owned()
    }

    /// The edit this request makes; `Err` says why it cannot be read (the request is refused).
    pub fn edit(&self) -> Result<Edit, String> {
        let new = if self.operation == "DELETE" {
            None
        } else {
            self.object.as_ref()
        };
        let old = self.old_object.as_ref();
        let read = |what: &str, e: serde_json::Error| format!("the {what} cannot be read: {e}");
        match (self.kind.group.as_str(), self.kind.kind.as_str()) {
            ("kubermatic.k8c.io", "ResourceQuota") => {
                let parse = |v: &Value| {
                    serde_json::from_value::<ResourceQuota>(v.clone()).map_err(|e| read("ResourceQuota", e))
                };
                let new = new.map(parse).transpose()?;
                let old = old.map(parse).transpose()?;
                Ok(Edit::Kkp {
                    name: self.object_name(),
                    old: old.as_ref().map(KkpEntry::of),
                    new: new.as_ref().map(KkpEntry::of),
                })
            }
            ("kkp-quota.dev", "ProjectQuota") => {
                let parse = |v: &Value| {
                    serde_json::from_value::<ProjectQuota>(v.clone()).map_err(|e| read("ProjectQuota", e))
                };
                let new = new.map(parse).transpose()?;
                let old = old.map(parse).transpose()?;
                let project = new
                    .as_ref()
                    .or(old.as_ref())
                    .map(|q| q.project().to_owned())
                    .ok_or("the request carries no ProjectQuota")?;
                Ok(Edit::Ours {
                    name: self.object_name(),
                    project,
                    old: old.map(|q| q.spec.quota),
                    new: new.map(|q| q.spec.quota),
                })
            }
            ("kkp-quota.dev", "QuotaGroup") => {
                let parse = |v: &Value| {
                    serde_json::from_value::<QuotaGroup>(v.clone()).map_err(|e| read("QuotaGroup", e))
                };
                let new = new.map(parse).transpose()?;
                let old = old.map(parse).transpose()?;
                Ok(Edit::Group {
                    name: self.object_name(),
                    old: old.map(|g| g.spec),
                    new: new.map(|g| g.spec),
                })
            }
            (group, kind) => Err(format!("this webhook does not check {kind}.{group}")),
        }
    }
}

/// The review sent back.
pub fn response(uid: &str, verdict: &Verdict) -> Value {
    let response = match verdict {
        Verdict::Allowed => json!({"uid": uid, "allowed": true}),
        Verdict::Denied(message) => json!({
            "uid": uid,
            "allowed": false,
            "status": {"code": 403, "reason": "Forbidden", "message": message},
        }),
    };
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
}
