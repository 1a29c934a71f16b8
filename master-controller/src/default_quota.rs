//! The default project quota: KKP's `KubermaticSetting` `globalsettings`,
//! `spec.defaultQuota.quota`, becomes a quota named `project-<id>` labelled
//! `kkp-default-resource-quota=true` for every project that has no quota.
//!
//! Rules ([`plan`], pure):
//! - a project with no quota gets a default one;
//! - changing the default updates the default quotas, and only those;
//! - clearing the default (no `defaultQuota`, or no `globalsettings`) deletes the default quotas,
//!   and only those;
//! - a custom quota (one without the label `kkp-default-resource-quota=true`) is never written;
//!   when a project has a custom quota, its default quota is deleted.
//!
//! Replacing a default quota by a custom one (documented in docs/how-it-works.md): either remove the label
//! from the default quota and edit its spec (`kubectl label resourcequota project-<id>
//! kkp-default-resource-quota-`; the object is then custom and never touched again), or create a
//! custom quota under another name for that project (the default one is then deleted).
//!
//! Every write is conditioned: creates fail when the name exists, updates and deletes carry the
//! `resourceVersion` the plan was made from, so a quota an admin just made custom is never
//! overwritten or deleted by a plan made before the admin's edit.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kkp_quota_crds::kkp::{KubermaticSetting, Project};
use kkp_quota_crds::quota::{
    DEFAULT_QUOTA_LABEL, KKP_RESOURCES, PROJECT_KIND, SUBJECT_KIND_LABEL, SUBJECT_NAME_LABEL,
};
use kkp_quota_crds::{ResourceDetails, ResourceQuota};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tracing::{Instrument as _, error, info, info_span, warn};

use crate::Error;
use crate::fanout::project_owner_reference;
use crate::metrics::Metrics;

/// The name a default quota gets.
pub fn default_quota_name(project: &str) -> String {
    format!("project-{project}")
}

/// True when the quota carries the default-quota label.
pub fn is_default(quota: &ResourceQuota) -> bool {
    quota
        .labels()
        .get(DEFAULT_QUOTA_LABEL)
        .is_some_and(|v| v == "true")
}

/// What the plan needs to know about one existing quota.
#[derive(Clone, Debug, PartialEq)]
pub struct QuotaView {
    pub name: String,
    /// The project it applies to (`spec.subject.name` when the kind is `project`).
    pub project: Option<String>,
    pub is_default: bool,
    pub quota: ResourceDetails,
    pub resource_version: Option<String>,
    pub deleting: bool,
}

impl QuotaView {
    pub fn of(quota: &ResourceQuota) -> QuotaView {
        QuotaView {
            name: quota.name_any(),
            project: (quota.spec.subject.kind == PROJECT_KIND).then(|| quota.spec.subject.name.clone()),
            is_default: is_default(quota),
            quota: quota.spec.quota.limits.kkp_subset(),
            resource_version: quota.resource_version(),
            deleting: quota.metadata.deletion_timestamp.is_some(),
        }
    }
}

/// One write.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    Create {
        name: String,
        project: String,
        quota: ResourceDetails,
    },
    Update {
        name: String,
        project: String,
        quota: ResourceDetails,
        resource_version: Option<String>,
    },
    Delete {
        name: String,
        project: Option<String>,
        resource_version: Option<String>,
    },
}

/// The writes that make the default quotas match `default` for `projects`.
pub fn plan(default: Option<&ResourceDetails>, projects: &[String], quotas: &[QuotaView]) -> Vec<Action> {
    let live: Vec<&QuotaView> = quotas.iter().filter(|q| !q.deleting).collect();
    let delete = |q: &QuotaView| Action::Delete {
        name: q.name.clone(),
        project: q.project.clone(),
        resource_version: q.resource_version.clone(),
    };
    let Some(default) = default else {
        return live.iter().filter(|q| q.is_default).map(|q| delete(q)).collect();
    };
    // Indexed once: looked up per project below (10,000 projects over 10,000 quotas scanned
    // the quotas once per project, every pass).
    let names: std::collections::HashSet<&str> = quotas.iter().map(|q| q.name.as_str()).collect();
    let mut by_project: BTreeMap<&str, Vec<&QuotaView>> = BTreeMap::new();
    for q in &live {
        if let Some(p) = &q.project {
            by_project.entry(p.as_str()).or_default().push(q);
        }
    }
    let mut actions = Vec::new();
    for project in projects {
        let mine = by_project.get(project.as_str()).cloned().unwrap_or_default();
        let has_custom = mine.iter().any(|q| !q.is_default);
        let defaults: Vec<&&QuotaView> = mine.iter().filter(|q| q.is_default).collect();
        if has_custom {
            actions.extend(defaults.iter().map(|q| delete(q)));
        } else if defaults.is_empty() {
            let name = default_quota_name(project);
            // A quota of that name for another subject, or one still being deleted: wait.
            if !names.contains(name.as_str()) {
                actions.push(Action::Create {
                    name,
                    project: project.clone(),
                    quota: default.clone(),
                });
            }
        } else {
            for q in defaults {
                if &q.quota != default {
                    actions.push(Action::Update {
                        name: q.name.clone(),
                        project: project.clone(),
                        quota: default.clone(),
                        resource_version: q.resource_version.clone(),
                    });
                }
            }
        }
    }
    actions
}

/// `spec.quota` as a merge-patch value: every KKP resource present, absent ones as `null` (so a
/// resource dropped from the default is dropped from the quota). KKP's object has no others.
fn quota_patch_value(quota: &ResourceDetails) -> Value {
    let mut map = serde_json::Map::new();
    for &r in KKP_RESOURCES {
        map.insert(
            r.name().to_owned(),
            quota.get(r).map_or(Value::Null, |q| Value::String(r.amount(q))),
        );
    }
    Value::Object(map)
}

/// The default from `globalsettings`, if any; `Err`: what cannot be read in it (one problem per
/// field). Then nothing is planned at all: an unreadable default is neither "no default" (which
/// would delete every default quota) nor a default.
pub fn default_from_settings(
    settings: Option<&KubermaticSetting>,
) -> Result<Option<ResourceDetails>, String> {
    let Some(default) = settings.and_then(|s| s.spec.default_quota.as_ref()) else {
        return Ok(None);
    };
    if !default.quota.unreadable.is_empty() {
        let problems: Vec<String> = default
            .quota
            .unreadable
            .iter()
            .map(|u| u.problem().replacen("spec.quota.", "spec.defaultQuota.quota.", 1))
            .collect();
        return Err(problems.join("; "));
    }
    Ok(Some(default.quota.limits.kkp_subset()))
}

/// Plans and applies the default quotas once.
pub async fn reconcile(
    api: &Api<ResourceQuota>,
    settings: &Store<KubermaticSetting>,
    projects: &Store<Project>,
    quotas: &Store<ResourceQuota>,
) -> Result<usize, Error> {
    let global = settings
        .state()
        .into_iter()
        .find(|s| s.name_any() == kkp_quota_crds::kkp::GLOBAL_SETTINGS_NAME);
    let default = default_from_settings(global.as_deref()).map_err(Error::DefaultQuotaUnreadable)?;
    let project_objects: BTreeMap<String, std::sync::Arc<Project>> = projects
        .state()
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| (p.name_any(), p))
        .collect();
    let names: Vec<String> = project_objects.keys().cloned().collect();
    let views: Vec<QuotaView> = quotas.state().iter().map(|q| QuotaView::of(q)).collect();
    let actions = plan(default.as_ref(), &names, &views);
    let count = actions.len();
    for action in actions {
        let result = match &action {
            Action::Create { name, project, quota } => {
                let mut rq = ResourceQuota::new(
                    name,
                    kkp_quota_crds::ResourceQuotaSpec {
                        subject: kkp_quota_crds::Subject::project(project),
                        quota: kkp_quota_crds::KkpQuota::new(quota),
                    },
                );
                rq.metadata.labels = Some(BTreeMap::from([
                    (SUBJECT_NAME_LABEL.to_owned(), project.clone()),
                    (SUBJECT_KIND_LABEL.to_owned(), PROJECT_KIND.to_owned()),
                    (DEFAULT_QUOTA_LABEL.to_owned(), "true".to_owned()),
                ]));
                if let Some(p) = project_objects.get(project) {
                    rq.metadata.owner_references = project_owner_reference(p).map(|o| vec![o]);
                }
                match api.create(&PostParams::default(), &rq).await {
                    Ok(_) => {
                        info!(quota = %name, project = %project, "created default quota");
                        Ok(())
                    }
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                    Err(e) => Err(e),
                }
            }
            Action::Update {
                name,
                project,
                quota,
                resource_version,
            } => {
                let patch = json!({
                    "metadata": {"resourceVersion": resource_version},
                    "spec": {"quota": quota_patch_value(quota)},
                });
                match api
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => {
                        info!(quota = %name, project = %project, "updated default quota");
                        Ok(())
                    }
                    Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(()),
                    Err(e) => Err(e),
                }
            }
            Action::Delete {
                name,
                project,
                resource_version,
            } => {
                let dp = DeleteParams {
                    preconditions: Some(Preconditions {
                        resource_version: resource_version.clone(),
                        uid: None,
                    }),
                    ..DeleteParams::default()
                };
                match api.delete(name, &dp).await {
                    Ok(_) => {
                        info!(quota = %name, project = ?project, "deleted default quota");
                        Ok(())
                    }
                    Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(()),
                    Err(e) => Err(e),
                }
            }
        };
        match result {
            Ok(()) => {}
            // Refused by an admission webhook (the allocation webhook: the write would take a
            // quota group past its allocation): said, and the other projects still get theirs.
            Err(kube::Error::Api(e)) if e.code == 403 => {
                warn!(reason = %e.message, action = ?action, "default quota write refused; left as it is");
            }
            Err(e) => {
                warn!(error = %e, action = ?action, "default quota write failed");
                return Err(Error::Kube(e));
            }
        }
    }
    Ok(count)
}

/// Writes default quotas whenever `wake` is notified (settings, projects or quotas changed),
/// once the caches have listed; a failed pass is retried after a second.
pub(crate) async fn run(
    api: Api<ResourceQuota>,
    settings: Store<KubermaticSetting>,
    projects: Store<Project>,
    quotas: Store<ResourceQuota>,
    wake: Arc<Notify>,
    metrics: Metrics,
    unreadable: Arc<crate::unreadable::Unreadable>,
) {
    let _ = quotas.wait_until_ready().await;
    let _ = projects.wait_until_ready().await;
    let _ = settings.wait_until_ready().await;
    let mut said = None;
    loop {
        wake.notified().await;
        let start = Instant::now();
        let result = reconcile(&api, &settings, &projects, &quotas)
            .instrument(info_span!("default_quota"))
            .await;
        metrics
            .reconcile_duration
            .with_label_values(&["default_quota"])
            .observe(start.elapsed().as_secs_f64());
        let unreadable_default = match &result {
            Err(Error::DefaultQuotaUnreadable(problem)) => Some(problem.clone()),
            _ => None,
        };
        unreadable.track_named(SETTINGS_ENTRY, unreadable_default.is_some(), &metrics);
        match result {
            // Said once per problem; the settings watch wakes this loop when it is fixed.
            Err(Error::DefaultQuotaUnreadable(problem)) => {
                if said.as_ref() != Some(&problem) {
                    error!(%problem, "the default project quota cannot be read; default quotas are left as they are until it is fixed");
                }
                said = Some(problem);
            }
            Ok(0) => {}
            Ok(n) => {
                metrics
                    .writes
                    .with_label_values(&["master", "default_quota"])
                    .inc_by(n as u64);
            }
            Err(e) => {
                warn!(error = %e, "default quota reconcile failed; retrying");
                metrics
                    .reconcile_errors
                    .with_label_values(&["default_quota"])
                    .inc();
                tokio::time::sleep(Duration::from_secs(1)).await;
                wake.notify_one();
            }
        }
        // Every quota written (its status too) wakes this loop, and a round looks at every
        // project and quota: at most one round per pause, or a cold start over 10,000 quotas
        // spends its time here. A new project waits at most this long longer for its default.
        tokio::time::sleep(PAUSE).await;
    }
}

/// How the default quota counts among the unreadable quotas.
const SETTINGS_ENTRY: &str = "KubermaticSetting/globalsettings";

/// The shortest time between two rounds.
const PAUSE: Duration = Duration::from_millis(500);

#[cfg(test)]
mod tests {
    use super::*;

    use kkp_quota_crds::fixtures::cpu;

    fn view(name: &str, project: &str, is_default: bool, q: ResourceDetails) -> QuotaView {
        QuotaView {
            name: name.into(),
            project: Some(project.into()),
            is_default,
            quota: q,
            resource_version: Some("7".into()),
            deleting: false,
        }
    }

    fn projects(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn creates_for_projects_without_quota_only() {
        let quotas = [view("mine", "b", false, cpu(99))];
        let actions = plan(Some(&cpu(4)), &projects(&["a", "b"]), &quotas);
        assert_eq!(
            actions,
            vec![Action::Create {
                name: "project-a".into(),
                project: "a".into(),
                quota: cpu(4)
            }]
        );
    }

    #[test]
    fn updates_only_defaults_that_differ() {
        let quotas = [
            view("project-a", "a", true, cpu(4)),
            view("project-b", "b", true, cpu(2)),
            view("project-c", "c", false, cpu(2)),
        ];
        let actions = plan(Some(&cpu(4)), &projects(&["a", "b", "c"]), &quotas);
        assert_eq!(actions.len(), 1);
        assert!(matches!(&actions[0], Action::Update { name, .. } if name == "project-b"));
    }

    #[test]
    fn clearing_deletes_only_defaults() {
        let quotas = [
            view("project-a", "a", true, cpu(4)),
            view("project-c", "c", false, cpu(2)),
        ];
        let actions = plan(None, &projects(&["a", "c"]), &quotas);
        assert_eq!(actions.len(), 1);
        assert!(
            matches!(&actions[0], Action::Delete { name, resource_version, .. } if name == "project-a" && resource_version.as_deref() == Some("7"))
        );
    }

    #[test]
    fn a_custom_quota_replaces_the_default() {
        let quotas = [
            view("project-a", "a", true, cpu(4)),
            view("team-a", "a", false, cpu(8)),
        ];
        let actions = plan(Some(&cpu(4)), &projects(&["a"]), &quotas);
        assert_eq!(actions.len(), 1);
        assert!(matches!(&actions[0], Action::Delete { name, .. } if name == "project-a"));
    }

    #[test]
    fn waits_while_the_name_is_taken_or_being_deleted() {
        let mut going = view("project-a", "a", true, cpu(4));
        going.deleting = true;
        assert!(plan(Some(&cpu(4)), &projects(&["a"]), &[going]).is_empty());
        let other_subject = view("project-a", "zzz", false, cpu(4));
        assert!(plan(Some(&cpu(4)), &projects(&["a"]), &[other_subject]).is_empty());
    }

    #[test]
    fn patch_value_nulls_dropped_resources() {
        let v = quota_patch_value(&cpu(4));
        assert_eq!(v["cpu"], "4");
        assert!(v["memory"].is_null());
    }
}
