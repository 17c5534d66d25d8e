//! The harness of nodus-core's engine tests: an engine over the in-memory store and one
//! valid document of every kind users write.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;

use nodus_core::engine::{Config, Deps, Engine};
use nodus_core::resource::Kind;
use nodus_core::secret::{SealError, SecretString, Secrets};
use nodus_core::store::{MemoryStore, ObjectKey, Store};
use nodus_llm::ScriptedModel;
use nodus_sandbox::UnisolatedSandbox;
use serde_json::{Value, json};

/// The project the tests write in.
pub const PROJECT: &str = "fuzz";

/// A secret source that keeps Secret resources in the store as the server's does, "sealed"
/// as plain JSON (a test's values are no secrets): what the engine does with a Secret is under
/// test, not the sealing.
pub struct PlainSealing(Arc<dyn Store>);

#[async_trait::async_trait]
impl Secrets for PlainSealing {
    async fn lookup(&self, project: &str, name: &str, key: &str) -> Option<SecretString> {
        let record = self
            .0
            .get(&ObjectKey::new(project, Kind::Secret, name))
            .await
            .ok()?;
        let values = self.open(record.document["sealedData"].as_str()?).ok()?;
        values.get(key).cloned()
    }

    fn seal(&self, values: &BTreeMap<String, SecretString>) -> Result<String, SealError> {
        let plain: BTreeMap<&str, &str> = values
            .iter()
            .map(|(k, v)| (k.as_str(), v.expose()))
            .collect();
        serde_json::to_string(&plain).map_err(|e| SealError(e.to_string()))
    }

    fn open(&self, sealed: &str) -> Result<BTreeMap<String, SecretString>, SealError> {
        let plain: BTreeMap<String, String> =
            serde_json::from_str(sealed).map_err(|e| SealError(e.to_string()))?;
        Ok(plain
            .into_iter()
            .map(|(k, v)| (k, SecretString::new(v)))
            .collect())
    }
}

/// An engine over the in-memory store, with nothing in it.
pub fn engine() -> Engine {
    let catalog = nodus_llm::offline_catalog(&nodus_llm::default_catalog().expect("catalog"));
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let deps = Deps::builder(
        Arc::new(UnisolatedSandbox::new(
            std::env::temp_dir().join(format!("nodus-fuzz-{}", std::process::id())),
        )),
        Arc::new(ScriptedModel::offline()),
        catalog,
    )
    .store(store.clone())
    .secrets(Arc::new(PlainSealing(store)))
    .build();
    Engine::new(deps, Config::default())
}

/// A runtime for a proptest case.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A document of `kind` named `name`, with `body`'s fields.
pub fn doc(kind: &str, name: &str, body: Value) -> Value {
    let mut document =
        json!({"apiVersion": "nodus.dev/v1", "kind": kind, "metadata": {"name": name}});
    if let (Value::Object(document), Value::Object(body)) = (&mut document, body) {
        document.extend(body);
    }
    document
}

/// One valid document of every kind users write, in the order they refer to each other.
pub fn valid_documents() -> Vec<(Kind, Value)> {
    vec![
        (
            Kind::Secret,
            doc(
                "Secret",
                "github",
                json!({"stringData": {"token": "t0ken"}}),
            ),
        ),
        (
            Kind::Secret,
            doc(
                "Secret",
                "anthropic-key",
                json!({"stringData": {"API_KEY": "sk-ant-x"}}),
            ),
        ),
        (
            Kind::Budget,
            doc("Budget", "it", json!({"spec": {"maxSpendUSD": "10.00"}})),
        ),
        (
            Kind::FileSet,
            doc(
                "FileSet",
                "project-source",
                json!({"spec": {"files": [
                    {"path": "app/config.yaml", "content": "retries: 3\n"},
                    {"path": "check.sh", "executable": true, "contentBase64": "IyEvYmluL3NoCg=="}
                ]}}),
            ),
        ),
        (
            Kind::AgentEnvironment,
            doc(
                "AgentEnvironment",
                "research",
                json!({"spec": {
                    "env": [
                        {"name": "LOG_LEVEL", "value": "debug"},
                        {"name": "GITHUB_TOKEN",
                         "valueFrom": {"secretKeyRef": {"name": "github", "key": "token"}}}
                    ],
                    "compute": {"cpu": "2", "memory": "2Gi", "nvidia.com/gpu": 0}
                }}),
            ),
        ),
        (
            Kind::Environment,
            doc(
                "Environment",
                "arith",
                json!({"spec": {
                    "version": "1.0.0",
                    "grader": {"kind": "numeric", "tolerance": 0.5},
                    "splits": {
                        "test": {"tasks": [
                            {"id": "t1", "prompt": "2+2?", "hidden": {"expected": 4}},
                            {"id": "t2", "prompt": "3+3?", "hidden": {"expected": 6},
                             "files": {"fileSet": "project-source"}}
                        ]},
                        "train": {"tasks": [{"id": "t", "prompt": "1+1?", "hidden": {"expected": 2}}]}
                    }
                }}),
            ),
        ),
        (
            Kind::Agent,
            doc(
                "Agent",
                "hello-agent",
                json!({
                    "metadata": {"name": "hello-agent", "labels": {"team": "a", "app.kubernetes.io/name": "x"}},
                    "spec": {
                        "system": "You are a careful assistant.\n",
                        "model": {"access": "Nodus", "families": ["haiku", "sonnet"]},
                        "perRunMaxCostUSD": "0.50",
                        "maxTokens": 1024,
                        "maxToolCalls": 8,
                        "environment": "research"
                    }
                }),
            ),
        ),
        (
            Kind::Agent,
            doc(
                "Agent",
                "my-key-agent",
                json!({"spec": {
                    "system": "You are a careful assistant.",
                    "model": {"access": "BYOK", "name": "claude-sonnet-5-5", "apiKeySecret": "anthropic-key"}
                }}),
            ),
        ),
        (
            Kind::AgentGroup,
            doc(
                "AgentGroup",
                "parallel-agents",
                json!({"spec": {
                    "agent": "hello-agent",
                    "limits": {"maxActive": 2},
                    "maxCostUSD": "0.60"
                }}),
            ),
        ),
        (
            Kind::AgentGroup,
            doc(
                "AgentGroup",
                "eval",
                json!({"spec": {
                    "agent": "hello-agent",
                    "limits": {"maxActive": 2},
                    "maxCostUSD": "0.20",
                    "evaluation": {"environment": "arith@1.0.0", "split": "test", "tasks": 2,
                                   "repetitions": 1, "seed": 42, "timeout": "10m"}
                }}),
            ),
        ),
        (
            Kind::AgentRun,
            doc(
                "AgentRun",
                "hello-agent-run",
                json!({"spec": {
                    "agent": "hello-agent",
                    "input": "Print the Python version.",
                    "timeout": "5m",
                    "environment": "research",
                    "workdir": {
                        "baseWorkdir": "project-source",
                        "artifactMounts": [{"ref": "project-source#app/config.yaml", "mountPath": "copy/config.yaml"}]
                    }
                }}),
            ),
        ),
        (
            Kind::AgentRun,
            doc(
                "AgentRun",
                "parallel-agents-a",
                json!({"spec": {"agent": "hello-agent", "group": "parallel-agents", "taskKey": "a",
                                "input": "What is 1+1?"}}),
            ),
        ),
        (
            Kind::AgentRun,
            doc(
                "AgentRun",
                "parallel-agents-b",
                json!({"spec": {"agent": "hello-agent", "group": "parallel-agents", "taskKey": "b",
                                "input": "What is 2+2?"}}),
            ),
        ),
        (
            Kind::AgentRun,
            doc(
                "AgentRun",
                "parallel-agents-c",
                json!({"spec": {
                    "agent": "hello-agent",
                    "group": "parallel-agents",
                    "taskKey": "c",
                    "dependsOn": ["a", "b"],
                    "input": "What is the capital of France?"
                }}),
            ),
        ),
    ]
}
