//! `nodus apply -f`: create each document's object, or update it when it exists (GET, then
//! PUT naming the version read), printing `kind.nodus.dev/NAME created|configured|unchanged`.

use reqwest::Method;
use serde_json::Value;

use nodus_core::resource::{AgentGroupSpec, AgentRunSpec, AgentSpec, FileSetSpec};
use nodus_core::validate::{self, Validate};

use super::{outln, read_documents};
use crate::cli::ApplyArgs;
use crate::client::{Body, Client};
use crate::error::{Error, Result};
use crate::kinds::ResourceKind;

/// What apply did with one document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Applied {
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
    for (index, (source, document)) in documents.into_iter().enumerate() {
        let (kind, name, document) = match target(&source, index, document) {
            Ok(target) => target,
            Err(error) => {
                eprintln!("{}", error.render());
                failures.push(error);
                continue;
            }
        };
        match apply_one(client, kind, &name, document).await {
            Ok(applied) => {
                let word = match applied {
                    Applied::Created => "created",
                    Applied::Configured => "configured",
                    Applied::Unchanged => "unchanged",
                };
                outln(&format!("{} {word}", kind.qualified(&name)));
            }
            Err(error @ (Error::Unreachable { .. } | Error::NotLoggedIn(_))) => return Err(error),
            Err(error) if error.exit_code() == crate::error::exit::UNREACHABLE => {
                return Err(error);
            }
            Err(error) => {
                eprintln!("{}", error.render());
                failures.push(error);
            }
        }
    }
    match failures.len() {
        0 => Ok(()),
        count => Err(Error::Reported {
            count,
            code: failures.iter().map(Error::exit_code).max().unwrap_or(1),
        }),
    }
}

/// The kind and name of a document, with the name filled in for a group task.
pub(super) fn target(
    source: &str,
    index: usize,
    mut document: Value,
) -> Result<(ResourceKind, String, Value)> {
    let at = || format!("{source}: document {}", index + 1);
    let kind_text = document
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let kind = ResourceKind::from_document_kind(kind_text).ok_or_else(|| {
        Error::input(format!(
            "{}: kind {kind_text:?} is not one of Agent, AgentRun, AgentGroup, Secret, Budget, \
             FileSet",
            at()
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
    Ok((kind, name, document))
}

/// `<group>-<taskKey>`, the name of a group task written without one.
fn task_name(document: &Value) -> Option<String> {
    let group = document.pointer("/spec/group").and_then(Value::as_str)?;
    let task = document.pointer("/spec/taskKey").and_then(Value::as_str)?;
    Some(format!("{group}-{task}"))
}

async fn apply_one(
    client: &Client,
    kind: ResourceKind,
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
    if unchanged(kind, &document, &live) {
        return Ok(Applied::Unchanged);
    }
    let version = live
        .pointer("/metadata/resourceVersion")
        .cloned()
        .unwrap_or(Value::Null);
    document["metadata"]["resourceVersion"] = version;
    client
        .call(
            Method::PUT,
            &[kind.plural(), name],
            &[],
            Some(Body::Json(document)),
        )
        .await?;
    Ok(Applied::Configured)
}

/// Whether applying `desired` would change nothing on `live`: the spec with the server's
/// defaults filled in (read the way the server reads it), the labels and the annotations.
/// A Secret's values cannot be compared (they are sealed), so a Secret is always written.
pub fn unchanged(kind: ResourceKind, desired: &Value, live: &Value) -> bool {
    match kind {
        ResourceKind::Agent => same_typed::<AgentSpec>(desired, live),
        ResourceKind::AgentRun => same_typed::<AgentRunSpec>(desired, live),
        ResourceKind::AgentGroup => same_typed::<AgentGroupSpec>(desired, live),
        ResourceKind::Budget => same_budget(desired, live),
        ResourceKind::FileSet => same_typed::<FileSetSpec>(desired, live),
        ResourceKind::Secret => false,
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

fn same_budget(desired: &Value, live: &Value) -> bool {
    let spec = |document: &Value| {
        serde_json::from_value::<nodus_server::app::BudgetSpec>(document.get("spec")?.clone()).ok()
    };
    match (spec(desired), spec(live)) {
        (Some(a), Some(b)) => {
            a == b && metadata_map(desired, "labels") == metadata_map(live, "labels")
        }
        _ => false,
    }
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
        assert!(unchanged(ResourceKind::Agent, &agent("0.50"), &server));
        assert!(unchanged(ResourceKind::Agent, &agent("0.5"), &server));
        assert!(!unchanged(ResourceKind::Agent, &agent("0.60"), &server));
        let mut labelled = agent("0.50");
        labelled["metadata"]["labels"] = json!({"team": "a"});
        assert!(!unchanged(ResourceKind::Agent, &labelled, &server));
        let mut broken = agent("0.50");
        broken["spec"]["unknown"] = json!(1);
        assert!(
            !unchanged(ResourceKind::Agent, &broken, &server),
            "the server reports it"
        );
    }

    #[test]
    fn secrets_are_always_written_and_budgets_compare_amounts() {
        let secret = json!({"kind": "Secret", "metadata": {"name": "k"}, "stringData": {"A": "b"}});
        assert!(!unchanged(ResourceKind::Secret, &secret, &secret));
        let budget =
            json!({"kind": "Budget", "metadata": {"name": "b"}, "spec": {"maxSpendUSD": "20"}});
        let stored = json!({"kind": "Budget", "metadata": {"name": "b", "labels": {}, "resourceVersion": "2"}, "spec": {"maxSpendUSD": "20.00"}});
        assert!(unchanged(ResourceKind::Budget, &budget, &stored));
        let more =
            json!({"kind": "Budget", "metadata": {"name": "b"}, "spec": {"maxSpendUSD": "25"}});
        assert!(!unchanged(ResourceKind::Budget, &more, &stored));
    }

    #[test]
    fn group_tasks_without_a_name_are_named_group_dash_task_key() {
        let run = json!({"apiVersion": "nodus.dev/v1", "kind": "AgentRun", "spec": {"agent": "w", "group": "parallel-agents", "taskKey": "c", "input": "x"}});
        let (kind, name, document) = target("runs.yaml", 2, run).expect("named");
        assert_eq!(
            (kind, name.as_str()),
            (ResourceKind::AgentRun, "parallel-agents-c")
        );
        assert_eq!(document["metadata"]["name"], "parallel-agents-c");
        let nameless = json!({"kind": "Agent", "spec": {}});
        let error = target("agent.yaml", 0, nameless).expect_err("no name");
        assert_eq!(
            error.to_string(),
            "agent.yaml: document 1: metadata.name is required"
        );
        let odd = json!({"kind": "Pod", "metadata": {"name": "x"}});
        assert!(
            target("p.yaml", 0, odd)
                .expect_err("kind")
                .to_string()
                .contains("\"Pod\"")
        );
    }
}
