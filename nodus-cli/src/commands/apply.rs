//! `nodus apply -f`: create each document's object, or update it when it exists (GET, then a
//! merge patch of the document naming the version read, so that a field the document leaves
//! out stays as it is), printing `kind.nodus.dev/NAME created|configured|unchanged`.
//! Documents go in dependency order (see [`Kind::apply_rank`]), each kind in file
//! order; an error names the file and the document.

use reqwest::Method;
use serde_json::Value;

use nodus_core::resource::{
    AgentEnvironmentSpec, AgentGroupSpec, AgentRunSpec, AgentSpec, BudgetSpec, EnvironmentSpec,
    FileSetSpec, Kind,
};
use nodus_core::validate::{self, Validate};

use super::{outln, read_documents};
use crate::cli::ApplyArgs;
use crate::client::{Body, Client};
use crate::error::{Error, Result};
use crate::kinds::qualified;

/// What apply did with one document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Applied {
    Created,
    Configured,
    Unchanged,
}

pub async fn run(client: &Client, args: ApplyArgs) -> Result<()> {
    let documents = read_documents(&args.files)?;
    if documents.is_empty() {
        return Err(Error::input("no objects passed to apply"));
    }
    let mut failures = Vec::new();
    let mut targets = Vec::new();
    for (at, document) in documents {
        match target(&at, document) {
            Ok(target) => targets.push((at, target)),
            Err(error) => {
                eprintln!("{}", error.render());
                failures.push(error);
            }
        }
    }
    // A stable sort: within a kind the file order stays (a run after the runs it depends on).
    targets.sort_by_key(|(_, (kind, _, _))| kind.apply_rank());
    for (at, (kind, name, document)) in targets {
        match apply_one(client, kind, &name, document).await {
            Ok(applied) => {
                let word = match applied {
                    Applied::Created => "created",
                    Applied::Configured => "configured",
                    Applied::Unchanged => "unchanged",
                };
                outln(&format!("{} {word}", qualified(kind, &name)));
            }
            Err(error @ (Error::Unreachable { .. } | Error::NotLoggedIn(_))) => return Err(error),
            Err(error) if error.exit_code() == crate::error::exit::UNREACHABLE => {
                return Err(error);
            }
            Err(error) => {
                let error = located(&at, error);
                eprintln!("{}", error.render());
                failures.push(error);
            }
        }
    }
    super::reported(&failures)
}

/// `error` with where its document came from (`FILE: document N`) in front of its message.
pub(super) fn located(at: &str, error: Error) -> Error {
    match error {
        Error::Server {
            code,
            reason,
            message,
        } => Error::Server {
            code,
            reason,
            message: format!("{at}: {message}"),
        },
        Error::Usage(message) => Error::Usage(format!("{at}: {message}")),
        Error::Reported { .. } | Error::Unreachable { .. } | Error::NotLoggedIn(_) => error,
        other => Error::input(format!("{at}: {other}")),
    }
}

/// The kind and name of a document (`at` says where it came from: `FILE: document N`), with
/// the name filled in for a group task.
pub(super) fn target(at: &str, mut document: Value) -> Result<(Kind, String, Value)> {
    let at = || at.to_string();
    let kind_text = document
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let kind = Kind::from_name(kind_text).ok_or_else(|| {
        let kinds: Vec<&str> = Kind::WRITABLE
            .into_iter()
            .filter_map(|kind| kind.info())
            .map(|info| info.name)
            .collect();
        Error::input(format!(
            "{}: kind {kind_text:?} is not one of {}",
            at(),
            kinds.join(", ")
        ))
    })?;
    let name = match document.pointer("/metadata/name").and_then(Value::as_str) {
        Some(name) if !name.is_empty() => name.to_string(),
        _ => task_name(&document)
            .ok_or_else(|| Error::input(format!("{}: metadata.name is required", at())))?,
    };
    if !document.get("metadata").is_some_and(Value::is_object) {
        document["metadata"] = Value::Object(Default::default());
    }
    document["metadata"]["name"] = Value::String(name.clone());
    if kind == Kind::Environment {
        // An Environment is stored, and read back, as NAME@VERSION.
        let version = document
            .pointer("/spec/version")
            .and_then(Value::as_str)
            .ok_or_else(|| Error::input(format!("{}: spec.version is required", at())))?;
        return Ok((kind, format!("{name}@{version}"), document));
    }
    Ok((kind, name, document))
}

/// `<group>-<taskKey>`, the name of a group task written without one.
fn task_name(document: &Value) -> Option<String> {
    let group = document.pointer("/spec/group").and_then(Value::as_str)?;
    let task = document.pointer("/spec/taskKey").and_then(Value::as_str)?;
    Some(format!("{group}-{task}"))
}

pub(super) async fn apply_one(
    client: &Client,
    kind: Kind,
    name: &str,
    mut document: Value,
) -> Result<Applied> {
    let live = match client.get(&[kind.plural(), name]).await {
        Ok(live) => live,
        Err(error) if error.is_not_found() => {
            client.post(&[kind.plural()], document).await?;
            return Ok(Applied::Created);
        }
        Err(error) => return Err(error),
    };
    if unchanged(kind, &patched(&live, &document), &live) {
        return Ok(Applied::Unchanged);
    }
    // The document as a merge patch: what it leaves out (such as a group's spec.sealed) stays
    // as it is on the server, pinned to the version read.
    let version = live
        .pointer("/metadata/resourceVersion")
        .cloned()
        .unwrap_or(Value::Null);
    document["metadata"]["resourceVersion"] = version;
    client
        .call(
            Method::PATCH,
            &[kind.plural(), name],
            &[],
            Some(Body::MergePatch(document)),
        )
        .await?;
    Ok(Applied::Configured)
}

/// The object `document` would leave on the server as a merge patch of `live`.
fn patched(live: &Value, document: &Value) -> Value {
    let mut object = live.clone();
    if let Some(map) = object.as_object_mut() {
        map.remove("status");
    }
    nodus_core::patch::merge(&mut object, document);
    object
}

/// Whether applying `desired` would change nothing on `live`: the spec with the server's
/// defaults filled in (read the way the server reads it), the labels and the annotations.
/// A Secret's values cannot be compared (they are sealed), so a Secret is always written.
pub fn unchanged(kind: Kind, desired: &Value, live: &Value) -> bool {
    match kind {
        Kind::Agent => same_typed::<AgentSpec>(desired, live),
        Kind::AgentRun => same_typed::<AgentRunSpec>(desired, live),
        Kind::AgentGroup => same_typed::<AgentGroupSpec>(desired, live),
        Kind::Budget => same_typed::<BudgetSpec>(desired, live),
        Kind::FileSet => same_typed::<FileSetSpec>(desired, live),
        Kind::AgentEnvironment => same_typed::<AgentEnvironmentSpec>(desired, live),
        Kind::Environment => same_typed::<EnvironmentSpec>(desired, live),
        // A Secret, or a kind users do not write.
        _ => false,
    }
}

fn metadata_map<'v>(
    document: &'v Value,
    field: &str,
) -> Option<&'v serde_json::Map<String, Value>> {
    document
        .get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_object)
        .filter(|m| !m.is_empty())
}

fn same_typed<S: Validate>(desired: &Value, live: &Value) -> bool {
    let Ok(parsed) = validate::parse::<S>(desired.clone()) else {
        return false; // the server will say what is wrong
    };
    let Ok(normal) = serde_json::to_value(&parsed) else {
        return false;
    };
    normal.get("spec") == live.get("spec")
        && metadata_map(&normal, "labels") == metadata_map(live, "labels")
        && metadata_map(&normal, "annotations") == metadata_map(live, "annotations")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn agent(cap: &str) -> Value {
        json!({
            "apiVersion": "nodus.dev/v1",
            "kind": "Agent",
            "metadata": {"name": "hello-agent"},
            "spec": {"system": "You are careful.\n", "model": {"access": "Nodus"}, "perRunMaxCostUSD": cap}
        })
    }

    /// What the server keeps: the document read with its defaults, plus server fields.
    fn live(document: &Value) -> Value {
        let parsed = validate::parse::<AgentSpec>(document.clone()).expect("valid");
        let mut value = serde_json::to_value(parsed).expect("serializes");
        value["metadata"]["resourceVersion"] = json!("7");
        value["metadata"]["uid"] = json!("u-1");
        value["metadata"]["creationTimestamp"] = json!("2026-05-01T00:00:00Z");
        value
    }

    #[test]
    fn reapplying_the_same_document_is_unchanged_even_with_defaults_and_money_spelled_differently()
    {
        let server = live(&agent("0.50"));
        assert!(unchanged(Kind::Agent, &agent("0.50"), &server));
        assert!(unchanged(Kind::Agent, &agent("0.5"), &server));
        assert!(!unchanged(Kind::Agent, &agent("0.60"), &server));
        let mut labelled = agent("0.50");
        labelled["metadata"]["labels"] = json!({"team": "a"});
        assert!(!unchanged(Kind::Agent, &labelled, &server));
        let mut broken = agent("0.50");
        broken["spec"]["unknown"] = json!(1);
        assert!(
            !unchanged(Kind::Agent, &broken, &server),
            "the server reports it"
        );
    }

    #[test]
    fn secrets_are_always_written_and_budgets_compare_amounts() {
        let secret = json!({"kind": "Secret", "metadata": {"name": "k"}, "stringData": {"A": "b"}});
        assert!(!unchanged(Kind::Secret, &secret, &secret));
        let budget = json!({"apiVersion": "nodus.dev/v1", "kind": "Budget", "metadata": {"name": "b"}, "spec": {"maxSpendUSD": "20"}});
        let stored = json!({"apiVersion": "nodus.dev/v1", "kind": "Budget", "metadata": {"name": "b", "labels": {}, "resourceVersion": "2"}, "spec": {"maxSpendUSD": "20.00"}});
        assert!(unchanged(Kind::Budget, &budget, &stored));
        let more = json!({"apiVersion": "nodus.dev/v1", "kind": "Budget", "metadata": {"name": "b"}, "spec": {"maxSpendUSD": "25"}});
        assert!(!unchanged(Kind::Budget, &more, &stored));
    }

    #[test]
    fn group_tasks_without_a_name_are_named_group_dash_task_key() {
        let run = json!({"apiVersion": "nodus.dev/v1", "kind": "AgentRun", "spec": {"agent": "w", "group": "parallel-agents", "taskKey": "c", "input": "x"}});
        let (kind, name, document) = target("runs.yaml: document 3", run).expect("named");
        assert_eq!((kind, name.as_str()), (Kind::AgentRun, "parallel-agents-c"));
        assert_eq!(document["metadata"]["name"], "parallel-agents-c");
        let nameless = json!({"kind": "Agent", "spec": {}});
        let error = target("agent.yaml: document 1", nameless).expect_err("no name");
        assert_eq!(
            error.to_string(),
            "agent.yaml: document 1: metadata.name is required"
        );
        let odd = json!({"kind": "Pod", "metadata": {"name": "x"}});
        assert!(
            target("p.yaml: document 1", odd)
                .expect_err("kind")
                .to_string()
                .contains("\"Pod\"")
        );
    }

    #[test]
    fn a_document_that_leaves_a_field_out_leaves_it_as_it_is() {
        let manifest = json!({
            "apiVersion": "nodus.dev/v1", "kind": "AgentGroup",
            "metadata": {"name": "parallel-agents"},
            "spec": {"agent": "w", "limits": {"maxActive": 2}, "maxCostUSD": "0.60"}
        });
        let parsed = validate::parse::<AgentGroupSpec>(manifest.clone()).expect("valid");
        let mut sealed = serde_json::to_value(parsed).expect("serializes");
        sealed["spec"]["sealed"] = json!(true);
        sealed["metadata"]["resourceVersion"] = json!("4");
        sealed["status"] = json!({"phase": "Running"});
        let effective = patched(&sealed, &manifest);
        assert_eq!(effective["spec"]["sealed"], json!(true));
        assert!(effective.get("status").is_none());
        assert!(
            unchanged(Kind::AgentGroup, &effective, &sealed),
            "re-applying the manifest to the sealed group changes nothing"
        );
        let mut wider = manifest.clone();
        wider["spec"]["limits"]["maxActive"] = json!(4);
        assert!(!unchanged(
            Kind::AgentGroup,
            &patched(&sealed, &wider),
            &sealed
        ));
    }

    #[test]
    fn server_errors_name_the_file_and_document() {
        let error = located(
            "examples/group.yaml: document 1",
            Error::Server {
                code: 404,
                reason: nodus_core::engine::Reason::NotFound,
                message: "agent \"w\" not found".into(),
            },
        );
        assert_eq!(
            error.render(),
            "Error from server (NotFound): examples/group.yaml: document 1: agent \"w\" not found"
        );
        assert_eq!(error.exit_code(), crate::error::exit::REFUSED);
    }
}
