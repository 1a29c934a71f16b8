//! The API servers' audit logs ([`crate::FleetSpec::with_audit_log`]) read back, and the RBAC
//! a chart grants compared with what each identity actually did: least privilege, checked
//! against the real API server's record rather than against a reading of the code.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

/// What one request did, as RBAC sees it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Access {
    pub verb: String,
    /// API group; empty for the core group.
    pub group: String,
    /// `resource`, or `resource/subresource`.
    pub resource: String,
    /// `None`: a cluster-scoped resource, or a namespaced one across all namespaces.
    pub namespace: Option<String>,
}

/// One request from an audit log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub user: String,
    pub access: Access,
    /// The object's name, when the request names one.
    pub name: Option<String>,
    /// The HTTP status of the response (absent for a watch still open).
    pub code: Option<u16>,
}

/// The resource requests of an audit log (JSON lines). Requests without an object (`/version`,
/// discovery) are left out: every authenticated user may make them, no chart grants them.
pub fn read(path: &Path) -> Result<Vec<Request>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| serde_json::from_str::<Value>(line).context("an audit line that is not JSON"))
        .filter_map(|event| event.map(|e| parse(&e)).transpose())
        .collect()
}

fn parse(event: &Value) -> Option<Request> {
    let object = event.get("objectRef")?;
    let text = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(str::to_owned);
    let mut resource = text(&object["resource"])?;
    if let Some(sub) = text(&object["subresource"]) {
        resource = format!("{resource}/{sub}");
    }
    Some(Request {
        user: text(&event["user"]["username"])?,
        access: Access {
            verb: text(&event["verb"])?,
            group: text(&object["apiGroup"]).unwrap_or_default(),
            resource,
            namespace: text(&object["namespace"]),
        },
        name: text(&object["name"]),
        code: event["responseStatus"]["code"]
            .as_u64()
            .and_then(|c| u16::try_from(c).ok()),
    })
}

/// One permission a chart grants: a verb on a resource, in one namespace or cluster-wide,
/// perhaps only for some names.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Grant {
    pub verb: String,
    pub group: String,
    pub resource: String,
    /// `None`: cluster-wide (a `ClusterRoleBinding`).
    pub namespace: Option<String>,
    /// Empty: every name.
    pub resource_names: Vec<String>,
    /// The role that grants it, e.g. `ClusterRole/kkp-quota-seed-controller`.
    pub from: String,
}

impl std::fmt::Display for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(f, "{} {group}/{}", self.verb, self.resource)?;
        match &self.namespace {
            Some(ns) => write!(f, " in {ns}")?,
            None => write!(f, " cluster-wide")?,
        }
        if !self.resource_names.is_empty() {
            write!(f, " named {}", self.resource_names.join(","))?;
        }
        write!(f, " ({})", self.from)
    }
}

/// Everything the RBAC objects in `docs` grant `user` (`system:serviceaccount:<ns>:<name>`, or
/// a `User` subject's name).
/// Namespaced objects without a namespace are in `default_namespace` (as `helm template`
/// leaves them).
pub fn grants(docs: &[Value], user: &str, default_namespace: &str) -> Vec<Grant> {
    let roles: BTreeMap<(String, String, String), &Value> = docs
        .iter()
        .filter(|d| matches!(d["kind"].as_str(), Some("Role" | "ClusterRole")))
        .map(|d| {
            let kind = d["kind"].as_str().unwrap_or_default().to_owned();
            let ns = if kind == "Role" {
                namespace_of(d, default_namespace)
            } else {
                String::new()
            };
            let name = d["metadata"]["name"].as_str().unwrap_or_default().to_owned();
            ((kind, ns, name), d)
        })
        .collect();
    let mut out = Vec::new();
    for binding in docs
        .iter()
        .filter(|d| matches!(d["kind"].as_str(), Some("RoleBinding" | "ClusterRoleBinding")))
    {
        let binding_ns = namespace_of(binding, default_namespace);
        let binds_user = binding["subjects"].as_array().into_iter().flatten().any(|s| {
            (s["kind"] == "ServiceAccount"
                && format!(
                    "system:serviceaccount:{}:{}",
                    s["namespace"].as_str().unwrap_or(&binding_ns),
                    s["name"].as_str().unwrap_or_default()
                ) == user)
                || (s["kind"] == "User" && s["name"] == user)
        });
        if !binds_user {
            continue;
        }
        let cluster_wide = binding["kind"] == "ClusterRoleBinding";
        let role_kind = binding["roleRef"]["kind"].as_str().unwrap_or_default().to_owned();
        let role_ns = if role_kind == "Role" {
            binding_ns.clone()
        } else {
            String::new()
        };
        let role_name = binding["roleRef"]["name"].as_str().unwrap_or_default().to_owned();
        let from = format!("{role_kind}/{role_name}");
        let Some(role) = roles.get(&(role_kind, role_ns, role_name)) else {
            continue; // a role the chart does not define grants nothing we can see
        };
        let scope = (!cluster_wide).then(|| binding_ns.clone());
        for rule in role["rules"].as_array().into_iter().flatten() {
            let list = |key: &str| -> Vec<String> {
                rule[key]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            };
            let names = list("resourceNames");
            for group in list("apiGroups") {
                for resource in list("resources") {
                    for verb in list("verbs") {
                        out.push(Grant {
                            verb,
                            group: group.clone(),
                            resource: resource.clone(),
                            namespace: scope.clone(),
                            resource_names: names.clone(),
                            from: from.clone(),
                        });
                    }
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

fn namespace_of(doc: &Value, default_namespace: &str) -> String {
    doc["metadata"]["namespace"]
        .as_str()
        .unwrap_or(default_namespace)
        .to_owned()
}

/// Whether `request` is one `grant` allows. A patch or update that answered 201 created the
/// object (server-side apply does): the API server authorized it as a `create` as well.
pub fn allows(grant: &Grant, request: &Request) -> bool {
    let a = &request.access;
    let created = request.code == Some(201) && matches!(a.verb.as_str(), "patch" | "update");
    (grant.verb == a.verb || (created && grant.verb == "create"))
        && grant.group == a.group
        && grant.resource == a.resource
        && (grant.namespace.is_none() || grant.namespace == a.namespace)
        && (grant.resource_names.is_empty()
            || request
                .name
                .as_ref()
                .is_some_and(|n| grant.resource_names.contains(n)))
}

/// Why a grant is more than its identity needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Excess {
    /// A wildcard (`*`) grants what no one can audit.
    Wildcard(Grant),
    /// Nothing the identity did needed it.
    Unused(Grant),
    /// Granted cluster-wide, but every use was in this one namespace: a Role there would do.
    OneNamespace(Grant, String),
}

impl std::fmt::Display for Excess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Excess::Wildcard(g) => write!(f, "wildcard: {g}"),
            Excess::Unused(g) => write!(f, "never used: {g}"),
            Excess::OneNamespace(g, ns) => write!(f, "cluster-wide but only used in {ns}: {g}"),
        }
    }
}

/// The grants beyond what `requests` (this identity's, from every cluster it ran on) used.
/// `allowed_unused` holds `(verb, group, resource)` triples granted on purpose without a use in
/// the run (each with its reason where it is defined).
pub fn excess(grants: &[Grant], requests: &[&Request], allowed_unused: &[(&str, &str, &str)]) -> Vec<Excess> {
    let mut out = Vec::new();
    for grant in grants {
        if [&grant.verb, &grant.group, &grant.resource]
            .iter()
            .any(|s| s.contains('*'))
        {
            out.push(Excess::Wildcard(grant.clone()));
            continue;
        }
        let uses: Vec<&&Request> = requests.iter().filter(|r| allows(grant, r)).collect();
        if uses.is_empty() {
            let allowed = allowed_unused
                .iter()
                .any(|&(v, g, r)| (v, g, r) == (&grant.verb, &grant.group, &grant.resource));
            if !allowed {
                out.push(Excess::Unused(grant.clone()));
            }
            continue;
        }
        if grant.namespace.is_none() {
            let namespaces: BTreeSet<Option<&String>> =
                uses.iter().map(|r| r.access.namespace.as_ref()).collect();
            if let [Some(only)] = namespaces.into_iter().collect::<Vec<_>>()[..] {
                out.push(Excess::OneNamespace(grant.clone(), only.clone()));
            }
        }
    }
    out
}

/// The distinct accesses of `requests`, for a report.
pub fn accesses<'a>(requests: impl IntoIterator<Item = &'a Request>) -> BTreeSet<Access> {
    requests.into_iter().map(|r| r.access.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(verb: &str, resource: &str, namespace: Option<&str>, name: Option<&str>) -> Request {
        Request {
            user: "system:serviceaccount:kubermatic:sa".into(),
            access: Access {
                verb: verb.into(),
                group: String::new(),
                resource: resource.into(),
                namespace: namespace.map(str::to_owned),
            },
            name: name.map(str::to_owned),
            code: Some(200),
        }
    }

    fn rbac() -> Vec<Value> {
        vec![
            json!({"kind": "ClusterRole", "metadata": {"name": "wide"}, "rules": [
                {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"], "resourceNames": ["admin-kubeconfig"]},
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
            ]}),
            json!({"kind": "ClusterRoleBinding", "metadata": {"name": "wide"},
                "roleRef": {"kind": "ClusterRole", "name": "wide"},
                "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "kubermatic"}]}),
            json!({"kind": "Role", "metadata": {"name": "local"}, "rules": [
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]},
            ]}),
            json!({"kind": "RoleBinding", "metadata": {"name": "local"},
                "roleRef": {"kind": "Role", "name": "local"},
                "subjects": [{"kind": "ServiceAccount", "name": "sa"}]}),
            json!({"kind": "RoleBinding", "metadata": {"name": "someone-else"},
                "roleRef": {"kind": "ClusterRole", "name": "wide"},
                "subjects": [{"kind": "ServiceAccount", "name": "other"}]}),
        ]
    }

    #[test]
    fn grants_follow_bindings_to_their_roles_and_scopes() {
        let granted = grants(&rbac(), "system:serviceaccount:kubermatic:sa", "kubermatic");
        let shown: Vec<String> = granted.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "* coordination.k8s.io/leases in kubermatic (Role/local)",
                "get core/configmaps cluster-wide (ClusterRole/wide)",
                "get core/secrets cluster-wide named admin-kubeconfig (ClusterRole/wide)",
                "list core/secrets cluster-wide named admin-kubeconfig (ClusterRole/wide)",
            ]
        );
        assert!(grants(&rbac(), "system:serviceaccount:kubermatic:nobody", "kubermatic").is_empty());
    }

    #[test]
    fn excess_finds_wildcards_unused_grants_and_needlessly_wide_ones() {
        let grants = grants(&rbac(), "system:serviceaccount:kubermatic:sa", "kubermatic");
        let requests = [
            request("get", "secrets", Some("cluster-a"), Some("admin-kubeconfig")),
            request("get", "secrets", Some("cluster-b"), Some("admin-kubeconfig")),
            request("get", "configmaps", Some("kubermatic"), Some("catalog")),
        ];
        let refs: Vec<&Request> = requests.iter().collect();
        let found: Vec<String> = excess(&grants, &refs, &[])
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            found,
            [
                "wildcard: * coordination.k8s.io/leases in kubermatic (Role/local)",
                "cluster-wide but only used in kubermatic: get core/configmaps cluster-wide (ClusterRole/wide)",
                "never used: list core/secrets cluster-wide named admin-kubeconfig (ClusterRole/wide)",
            ]
        );
        // An allowance covers an unused grant, and a list across all namespaces is a use.
        let all = request("list", "secrets", None, Some("admin-kubeconfig"));
        let mut with_list = refs.clone();
        with_list.push(&all);
        let found = excess(&grants, &with_list, &[("get", "", "configmaps")]);
        assert_eq!(found.len(), 2, "{found:?}"); // the wildcard, and configmaps in one namespace
    }

    #[test]
    fn an_apply_that_created_its_object_uses_create() {
        let docs = vec![
            json!({"kind": "ClusterRole", "metadata": {"name": "r"}, "rules": [
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "patch"]},
            ]}),
            json!({"kind": "ClusterRoleBinding", "metadata": {"name": "r"},
                "roleRef": {"kind": "ClusterRole", "name": "r"},
                "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "kubermatic"}]}),
        ];
        let granted = grants(&docs, "system:serviceaccount:kubermatic:sa", "kubermatic");
        let mut apply = request("patch", "configmaps", None, Some("c"));
        let refs = [&apply];
        assert_eq!(
            excess(&granted, &refs, &[]).len(),
            1,
            "a patch of an existing object is no create"
        );
        apply.code = Some(201);
        let refs = [&apply];
        assert!(excess(&granted, &refs, &[]).is_empty());
    }

    #[test]
    fn a_name_outside_resource_names_is_not_a_use() {
        let grants = grants(&rbac(), "system:serviceaccount:kubermatic:sa", "kubermatic");
        let other = request("get", "secrets", Some("cluster-a"), Some("someone-elses"));
        let secret_get = grants
            .iter()
            .find(|g| g.resource == "secrets" && g.verb == "get")
            .unwrap();
        assert!(!allows(secret_get, &other));
    }

    #[test]
    fn audit_lines_parse_into_requests() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("audit.log");
        let lines = [
            json!({"stage": "ResponseComplete", "verb": "patch", "user": {"username": "u"},
                "objectRef": {"resource": "quotaledgers", "subresource": "status", "apiGroup": "kkp-quota.dev", "name": "p"},
                "responseStatus": {"code": 200}}),
            json!({"stage": "ResponseComplete", "verb": "get", "user": {"username": "u"}, "requestURI": "/version"}),
            json!({"stage": "ResponseStarted", "verb": "watch", "user": {"username": "u"},
                "objectRef": {"resource": "secrets", "apiVersion": "v1"}}),
        ];
        let text = lines
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(&log, text).unwrap();
        let requests = read(&log).unwrap();
        assert_eq!(requests.len(), 2);
        assert_eq!(requests[0].access.resource, "quotaledgers/status");
        assert_eq!(requests[0].access.group, "kkp-quota.dev");
        assert_eq!(requests[0].code, Some(200));
        assert_eq!(requests[1].access.namespace, None);
        assert_eq!(requests[1].code, None);
    }
}
