//! `fits`: how many Machines of each size in a manifest fit in the project's room now. Sized by
//! provider-sizes exactly as the webhook sizes a Machine it is asked to admit (the same catalog,
//! no provider value resolved by reference), and counted as the webhook counts its dry-run
//! answer ([`kkp_quota_crds::fit::machines_that_fit`]).

use std::fmt::Write as _;

use kkp_quota_crds::fit::machines_that_fit;
use kkp_quota_crds::machine::Machine;
use kkp_quota_crds::{Resource, ResourceDetails};
use provider_sizes::{SizeCatalog, SizingError, size_machine};
use serde::Serialize;
use serde_json::{Value, json};

use crate::Error;
use crate::read::Quotas;
use crate::status::{ResourceRow, describe, resource_rows, resource_table};
use crate::table;

/// One object of the manifest: what it asks for.
#[derive(Debug, Clone)]
pub struct Asked {
    /// `machinedeployment/workers`.
    pub object: String,
    /// 1 for a `Machine`, the replicas of a `MachineSet` or `MachineDeployment`.
    pub count: u64,
    /// The Machine (or the template's, for a set or deployment).
    pub machine: Machine,
}

/// The room the answer is counted in.
#[derive(Debug, Clone)]
pub struct Room {
    pub project: String,
    pub limits: ResourceDetails,
    pub used: ResourceDetails,
    /// Said beside the answer when the numbers may not be current (a stale view).
    pub caveat: Option<String>,
}

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct FitsReport {
    pub project: String,
    pub room: Vec<ResourceRow>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caveat: Option<String>,
    pub objects: Vec<FitAnswer>,
}

#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct FitAnswer {
    pub object: String,
    pub asked: u64,
    /// One Machine's size (absent when it cannot be sized).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<ResourceDetails>,
    /// How many of this size fit now; absent when no limit applies to what it needs, or it
    /// cannot be sized.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fit_now: Option<u64>,
    pub fits: bool,
    /// Why not all of them fit (or why it cannot be sized), in a sentence.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl FitsReport {
    pub fn all_fit(&self) -> bool {
        self.objects.iter().all(|o| o.fits)
    }
}

/// The `Machine`s, `MachineSet`s and `MachineDeployment`s of a manifest (YAML or JSON, several
/// documents, `List`s opened); other kinds are refused by name.
pub fn parse(text: &str) -> Result<Vec<Asked>, Error> {
    let documents: Vec<Value> = serde_saphyr::from_multiple(text).map_err(Error::ManifestSyntax)?;
    let mut asked = Vec::new();
    for document in documents.into_iter().filter(|d| !d.is_null()) {
        collect(document, &mut asked)?;
    }
    if asked.is_empty() {
        return Err(Error::NothingAsked);
    }
    Ok(asked)
}

fn collect(object: Value, asked: &mut Vec<Asked>) -> Result<(), Error> {
    let kind = object["kind"].as_str().unwrap_or_default().to_owned();
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or("(no name)")
        .to_owned();
    let object_name = format!("{}/{name}", kind.to_lowercase());
    match kind.as_str() {
        "List" | "MachineList" | "MachineSetList" | "MachineDeploymentList" => {
            let Value::Array(items) = object["items"].clone() else {
                return Err(Error::ListWithoutItems { kind });
            };
            items.into_iter().try_for_each(|item| collect(item, asked))
        }
        "Machine" => {
            let machine = serde_json::from_value(object).map_err(|source| Error::NotAMachine {
                object: object_name.clone(),
                part: "",
                source,
            })?;
            asked.push(Asked {
                object: object_name,
                count: 1,
                machine,
            });
            Ok(())
        }
        "MachineSet" | "MachineDeployment" => {
            let replicas = match &object["spec"]["replicas"] {
                Value::Null => 1,
                n => n.as_u64().ok_or_else(|| Error::NotACount {
                    object: object_name.clone(),
                    found: n.to_string(),
                })?,
            };
            // The Machines it makes: the template's spec, as machine-controller copies it.
            let machine = serde_json::from_value(json!({
                "apiVersion": "cluster.k8s.io/v1alpha1",
                "kind": "Machine",
                "metadata": {"name": name, "namespace": object["metadata"]["namespace"]},
                "spec": object["spec"]["template"]["spec"],
            }))
            .map_err(|source| Error::NotAMachine {
                object: object_name.clone(),
                part: ": spec.template",
                source,
            })?;
            asked.push(Asked {
                object: object_name,
                count: replicas,
                machine,
            });
            Ok(())
        }
        "" => Err(Error::NoKind { name }),
        other => Err(Error::AsksNothing {
            object: object_name,
            kind: other.to_owned(),
        }),
    }
}

/// One Machine's size, exactly as the webhook computes it for a create (`Ok`), or the refusal it
/// would answer for a Machine it cannot size (`Err`).
pub fn size(machine: &Machine, catalog: &SizeCatalog) -> Result<ResourceDetails, SizingError> {
    size_machine(machine, catalog, None)
}

/// The room of `project` (needed on the master; a user cluster's own otherwise).
pub fn room(quotas: &Quotas, project: Option<&str>) -> Result<Room, Error> {
    match quotas {
        Quotas::Views(views) => {
            let view = match (project, views.as_slice()) {
                (Some(p), _) => views
                    .iter()
                    .find(|v| v.spec.project == p)
                    .ok_or_else(|| Error::NoSuchProject(p.to_owned()))?,
                (None, [one]) => one,
                (None, []) => return Err(Error::NoQuotaHere),
                (None, _) => {
                    let names: Vec<&str> = views.iter().map(|v| v.spec.project.as_str()).collect();
                    return Err(Error::NeedsProject(format!(
                        "this cluster has views of several projects ({}): name one with --project",
                        names.join(", ")
                    )));
                }
            };
            let status = view.status.clone().unwrap_or_default();
            let caveat = match status.state {
                kkp_quota_crds::ViewState::Current | kkp_quota_crds::ViewState::NoQuota => None,
                state => Some(format!(
                    "the view is {state:?}{}: the webhook decides on newer numbers",
                    status.message.map(|m| format!(" ({m})")).unwrap_or_default()
                )),
            };
            Ok(Room {
                project: view.spec.project.clone(),
                limits: status.limits,
                used: status.used,
                caveat,
            })
        }
        Quotas::Master(quotas) => {
            let Some(project) = project else {
                return Err(Error::NeedsProject(
                    "on the master, name the project to check against with --project".to_owned(),
                ));
            };
            let quota = quotas
                .iter()
                .find(|q| q.project() == project)
                .ok_or_else(|| Error::NoSuchProject(project.to_owned()))?;
            let status = quota.status.clone().unwrap_or_default();
            Ok(Room {
                project: project.to_owned(),
                limits: status.limits.unwrap_or_default(),
                used: status.global_usage.unwrap_or_default(),
                caveat: None,
            })
        }
    }
}

/// Every object of the manifest against the room.
pub fn report(asked: &[Asked], room: &Room, catalog: &SizeCatalog) -> FitsReport {
    FitsReport {
        project: room.project.clone(),
        room: resource_rows(&room.limits, &room.used),
        caveat: room.caveat.clone(),
        objects: asked.iter().map(|a| answer(a, room, catalog)).collect(),
    }
}

fn answer(asked: &Asked, room: &Room, catalog: &SizeCatalog) -> FitAnswer {
    let size = match size(&asked.machine, catalog) {
        Ok(size) => size,
        Err(refusal) => {
            return FitAnswer {
                object: asked.object.clone(),
                asked: asked.count,
                size: None,
                fit_now: None,
                fits: false,
                reason: Some(format!("cannot be sized, so the webhook refuses it: {refusal}")),
            };
        }
    };
    let fit = machines_that_fit(&room.limits, &room.used, &size);
    let fits = fit.is_none_or(|f| f.count >= asked.count);
    let reason = fit.filter(|_| !fits).map(|f| {
        let r = f.tightest;
        format!(
            "each needs {}, and {} of {} is free",
            r.describe(size.amount(r)),
            r.amount(kkp_quota_crds::fit::room(&room.limits, &room.used).amount(r)),
            r.describe(room.limits.amount(r)),
        )
    });
    FitAnswer {
        object: asked.object.clone(),
        asked: asked.count,
        size: Some(size),
        fit_now: fit.map(|f| f.count),
        fits,
        reason,
    }
}

/// The table form: the room, then one line per object.
pub fn table(report: &FitsReport) -> String {
    let mut out = format!("project {}: room now\n", report.project);
    out += &resource_table(&report.room);
    if let Some(caveat) = &report.caveat {
        let _ = writeln!(out, "note: {caveat}");
    }
    let rows: Vec<Vec<String>> = report
        .objects
        .iter()
        .map(|o| {
            vec![
                o.object.clone(),
                o.size.as_ref().map_or_else(|| "-".to_owned(), size_text),
                o.asked.to_string(),
                o.fit_now.map_or_else(|| "any".to_owned(), |n| n.to_string()),
                if o.fits { "yes" } else { "no" }.to_owned(),
                o.reason.clone().unwrap_or_default(),
            ]
        })
        .collect();
    out += "\n";
    out += &table::draw(&["OBJECT", "EACH", "ASKED", "FIT NOW", "FITS", "WHY NOT"], &rows);
    out
}

/// One Machine's size without the count of Machines (1 goes without saying).
fn size_text(size: &ResourceDetails) -> String {
    let mut without_count = size.clone();
    without_count.set(Resource::Machines, None);
    describe(&without_count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::view;

    const DEPLOYMENT: &str = include_str!("../../deploy/examples/machinedeployment-small.yaml");
    const MACHINE: &str = include_str!("../../deploy/examples/machine-small.yaml");

    fn demo_room(used_cpu: &str) -> Room {
        let v = view(
            "demo",
            "Current",
            &json!({"cpu": "16", "memory": "64Gi"}),
            &json!({"cpu": used_cpu, "memory": "4Gi"}),
        );
        room(&Quotas::Views(vec![v]), None).expect("one view, one room")
    }

    #[test]
    fn a_deployment_asks_its_replicas_of_its_template() {
        let asked = parse(DEPLOYMENT).expect("parses");
        assert_eq!(asked.len(), 1);
        assert_eq!(asked[0].object, "machinedeployment/workers-small");
        assert_eq!(asked[0].count, 3);
        let size = size(&asked[0].machine, &SizeCatalog::shipped()).expect("t3.medium is shipped");
        assert_eq!(describe(&size), "2 cpu, 4Gi memory, 50Gi storage, 1 machines");
    }

    #[test]
    fn several_documents_and_lists_are_read_and_other_kinds_named() {
        let text = format!("{MACHINE}\n---\n{DEPLOYMENT}");
        assert_eq!(parse(&text).expect("two documents").len(), 2);
        let list =
            json!({"kind": "List", "items": [serde_saphyr::from_str::<Value>(MACHINE).expect("yaml")]});
        assert_eq!(parse(&list.to_string()).expect("a JSON list").len(), 1);
        let broken = parse("kind: [Machine").expect_err("not YAML");
        assert!(matches!(broken, Error::ManifestSyntax(_)), "{broken:?}");
        let chain = broken.chain();
        assert!(
            chain.starts_with("the manifest is not YAML or JSON: ") && chain.len() > 40,
            "the parser's own words follow: {chain}"
        );
        let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n";
        let refused = parse(pod).expect_err("a Pod asks nothing of the quota");
        assert!(
            refused.to_string().contains("pod/p: a Pod asks nothing"),
            "{refused}"
        );
        let replicas = DEPLOYMENT.replace("replicas: 3", "replicas: three");
        assert!(
            parse(&replicas)
                .expect_err("not a count")
                .to_string()
                .contains("spec.replicas")
        );
    }

    #[test]
    fn the_answer_counts_the_room_and_names_the_limit_that_stops_the_rest() {
        let catalog = SizeCatalog::shipped();
        let room = demo_room("2");
        let asked = parse(DEPLOYMENT).expect("parses");
        let report = report(&asked, &room, &catalog);
        assert!(report.all_fit(), "{report:?}");
        assert_eq!(report.objects[0].fit_now, Some(7));

        let ten = parse(&DEPLOYMENT.replace("replicas: 3", "replicas: 10")).expect("parses");
        let report = super::report(&ten, &room, &catalog);
        assert!(!report.all_fit());
        assert_eq!(
            report.objects[0].reason.as_deref(),
            Some("each needs 2 cpu, and 14 of 16 cpu is free")
        );
        let text = table(&report);
        assert!(
            text.contains(
                "machinedeployment/workers-small   2 cpu, 4Gi memory, 50Gi storage   10      7         no"
            ),
            "{text}"
        );
    }

    #[test]
    fn an_unsizeable_machine_does_not_fit_and_says_why() {
        let unknown = MACHINE.replace("t3.medium", "t9.nothing");
        let report = report(
            &parse(&unknown).expect("parses"),
            &demo_room("2"),
            &SizeCatalog::shipped(),
        );
        let answer = &report.objects[0];
        assert!(!answer.fits);
        let reason = answer.reason.as_deref().unwrap_or_default();
        assert!(
            reason.starts_with("cannot be sized") && reason.contains("t9.nothing"),
            "{reason}"
        );
    }

    #[test]
    fn a_stale_view_is_answered_with_a_caveat_and_the_master_needs_a_project() {
        let stale = view("demo", "Stale", &json!({"cpu": "16"}), &json!({"cpu": "2"}));
        let room = room(&Quotas::Views(vec![stale]), None).expect("a room");
        assert!(
            room.caveat
                .as_deref()
                .is_some_and(|c| c.starts_with("the view is Stale")),
            "{room:?}"
        );
        let master = Quotas::Master(Vec::new());
        assert!(matches!(super::room(&master, None), Err(Error::NeedsProject(_))));
        assert!(matches!(
            super::room(&master, Some("x")),
            Err(Error::NoSuchProject(_))
        ));
    }
}
