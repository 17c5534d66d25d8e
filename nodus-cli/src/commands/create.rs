//! `nodus create agentrun|agentgroup`: the document a flag line describes, created with POST.

use std::collections::BTreeMap;

use jiff::Timestamp;
use nodus_core::resource::Kind;
use serde_json::{Map, Value, json};

use super::{outln, text_or_stdin};
use crate::cli::{CreateCommand, CreateGroupArgs, CreateRunArgs};
use crate::client::Client;
use crate::duration;
use crate::error::{Error, Result};
use crate::kinds::qualified;

pub async fn run(client: &Client, command: CreateCommand) -> Result<()> {
    let (kind, document) = match command {
        CreateCommand::Agentrun(args) => {
            let prompt = args.prompt.as_deref().map(text_or_stdin).transpose()?;
            (
                Kind::AgentRun,
                run_document(&args, prompt, Timestamp::now())?,
            )
        }
        CreateCommand::Agentgroup(args) => (Kind::AgentGroup, group_document(&args)?),
        CreateCommand::Project(args) => return super::access::create_project(client, args).await,
        CreateCommand::Token(args) => return super::access::create_token(client, args).await,
    };
    let created = client.post(&[kind.plural()], document).await?;
    let name = created
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    outln(&format!("{} created", qualified(kind, name)));
    Ok(())
}

fn labels(pairs: &[String]) -> Result<BTreeMap<String, String>> {
    pairs
        .iter()
        .map(|pair| {
            pair.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| Error::usage(format!("a label is key=value, not {pair:?}")))
        })
        .collect()
}

fn metadata(name: Option<&str>, pairs: &[String]) -> Result<Value> {
    let mut metadata = Map::new();
    if let Some(name) = name {
        metadata.insert("name".into(), json!(name));
    }
    let labels = labels(pairs)?;
    if !labels.is_empty() {
        metadata.insert("labels".into(), json!(labels));
    }
    Ok(Value::Object(metadata))
}

/// `--deadline`: an RFC 3339 time, or a duration from `now`.
fn deadline(text: &str, now: Timestamp) -> Result<Timestamp> {
    if let Ok(time) = text.parse::<Timestamp>() {
        return Ok(time);
    }
    let after = duration::parse(text).map_err(|_| {
        Error::usage(format!(
            "--deadline takes a time (2026-05-01T12:00:00Z) or a duration from now (30m), not {text:?}"
        ))
    })?;
    let span = jiff::SignedDuration::try_from(after)
        .map_err(|_| Error::usage(format!("--deadline {text:?} is too far away")))?;
    now.checked_add(span)
        .map_err(|_| Error::usage(format!("--deadline {text:?} is too far away")))
}

/// The AgentRun that `create agentrun` describes.
fn run_document(args: &CreateRunArgs, prompt: Option<String>, now: Timestamp) -> Result<Value> {
    let name = match (&args.name, &args.group, &args.task_key) {
        (Some(name), _, _) => Some(name.as_str()),
        (None, Some(_), Some(_)) => None,
        (None, _, _) => {
            return Err(Error::usage(
                "name the run (nodus create agentrun NAME --agent A --prompt P), or give --group and --task-key",
            ));
        }
    };
    let mut spec = Map::new();
    spec.insert("agent".into(), json!(args.agent));
    if let Some(prompt) = prompt {
        spec.insert("input".into(), json!(prompt));
    }
    if args.keep_alive {
        spec.insert("keepAlive".into(), json!(true));
    }
    if let Some(text) = &args.deadline {
        spec.insert("deadline".into(), json!(deadline(text, now)?.to_string()));
    }
    if let Some(group) = &args.group {
        spec.insert("group".into(), json!(group));
    }
    if let Some(task) = &args.task_key {
        spec.insert("taskKey".into(), json!(task));
    }
    if !args.depends_on.is_empty() {
        spec.insert("dependsOn".into(), json!(args.depends_on));
    }
    if let Some(environment) = &args.environment {
        spec.insert("environment".into(), json!(environment));
    }
    if !args.auto_telemetry {
        spec.insert("autoTelemetry".into(), json!(false));
    }
    Ok(json!({
        "apiVersion": "nodus.dev/v1",
        "kind": "AgentRun",
        "metadata": metadata(name, &args.labels)?,
        "spec": spec,
    }))
}

/// The AgentGroup that `create agentgroup` describes.
fn group_document(args: &CreateGroupArgs) -> Result<Value> {
    let mut spec = Map::new();
    spec.insert("agent".into(), json!(args.agent));
    let mut limits = Map::new();
    if let Some(n) = args.max_active {
        limits.insert("maxActive".into(), json!(n));
    }
    if let Some(n) = args.max_pending {
        limits.insert("maxPending".into(), json!(n));
    }
    if !limits.is_empty() {
        spec.insert("limits".into(), Value::Object(limits));
    }
    if let Some(cost) = &args.max_cost {
        spec.insert("maxCostUSD".into(), json!(cost.trim_start_matches('$')));
    }
    if args.sealed {
        spec.insert("sealed".into(), json!(true));
    }
    Ok(json!({
        "apiVersion": "nodus.dev/v1",
        "kind": "AgentGroup",
        "metadata": metadata(Some(&args.name), &args.labels)?,
        "spec": spec,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::Parser as _;

    fn create(line: &str) -> CreateCommand {
        match Cli::try_parse_from(line.split(' '))
            .expect("parses")
            .command
        {
            crate::cli::Command::Create(command) => command,
            other => panic!("{other:?}"),
        }
    }

    fn now() -> Timestamp {
        "2026-05-01T12:00:00Z".parse().expect("valid")
    }

    #[test]
    fn create_agentrun_builds_the_spec_run() {
        let CreateCommand::Agentrun(args) = create(
            "nodus create agentrun triage --agent hello-agent --prompt x --keep-alive --deadline 30m -l team=a",
        ) else {
            panic!("a run");
        };
        let document =
            run_document(&args, Some("Summarize the logs".into()), now()).expect("valid");
        assert_eq!(
            document,
            json!({
                "apiVersion": "nodus.dev/v1",
                "kind": "AgentRun",
                "metadata": {"name": "triage", "labels": {"team": "a"}},
                "spec": {"agent": "hello-agent", "input": "Summarize the logs", "keepAlive": true, "deadline": "2026-05-01T12:30:00Z"}
            })
        );
        // The result must be a valid run for the server.
        nodus_core::validate::parse::<nodus_core::resource::AgentRunSpec>(document)
            .expect("the server reads it");
    }

    #[test]
    fn auto_telemetry_false_is_written_and_true_is_the_default() {
        let CreateCommand::Agentrun(args) =
            create("nodus create agentrun r --agent w --auto-telemetry=false")
        else {
            panic!("a run");
        };
        let document = run_document(&args, None, now()).expect("valid");
        assert_eq!(document["spec"]["autoTelemetry"], json!(false));
        let spec = nodus_core::validate::parse::<nodus_core::resource::AgentRunSpec>(document)
            .expect("the server reads it");
        assert!(!spec.spec.auto_telemetry);
        for line in [
            "nodus create agentrun r --agent w",
            "nodus create agentrun r --agent w --auto-telemetry=true",
        ] {
            let CreateCommand::Agentrun(args) = create(line) else {
                panic!("a run");
            };
            let document = run_document(&args, None, now()).expect("valid");
            assert!(document["spec"].get("autoTelemetry").is_none(), "{line}");
            let spec = nodus_core::validate::parse::<nodus_core::resource::AgentRunSpec>(document)
                .expect("the server reads it");
            assert!(spec.spec.auto_telemetry, "{line}");
        }
    }

    #[test]
    fn group_tasks_may_leave_the_name_out_and_others_may_not() {
        let CreateCommand::Agentrun(args) =
            create("nodus create agentrun --agent w --group g --task-key c --depends-on a,b")
        else {
            panic!("a run");
        };
        let document = run_document(&args, None, now()).expect("valid");
        assert_eq!(document["metadata"], json!({}));
        assert_eq!(document["spec"]["dependsOn"], json!(["a", "b"]));
        let CreateCommand::Agentrun(args) = create("nodus create agentrun --agent w") else {
            panic!("a run");
        };
        assert!(run_document(&args, None, now()).is_err());
        let CreateCommand::Agentrun(args) =
            create("nodus create agentrun r --agent w --deadline soon")
        else {
            panic!("a run");
        };
        assert!(
            run_document(&args, None, now())
                .expect_err("bad")
                .to_string()
                .contains("--deadline")
        );
    }

    #[test]
    fn create_agentgroup_builds_the_spec_group() {
        let CreateCommand::Agentgroup(args) = create(
            "nodus create agentgroup parallel-agents --agent parallel-agents-worker --max-active 2 --max-cost 0.60",
        ) else {
            panic!("a group");
        };
        let document = group_document(&args).expect("valid");
        assert_eq!(
            document["spec"],
            json!({"agent": "parallel-agents-worker", "limits": {"maxActive": 2}, "maxCostUSD": "0.60"})
        );
        nodus_core::validate::parse::<nodus_core::resource::AgentGroupSpec>(document)
            .expect("the server reads it");
    }
}
