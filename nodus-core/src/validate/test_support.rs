//! Documents and checks shared by the validation tests of every kind.

use serde_json::{Value, json};

use super::{Validate, parse};
use crate::resource::Object;

/// `document` with `value` written at the JSON pointer `at`, creating objects on the way.
pub(super) fn with(mut document: Value, at: &str, value: Value) -> Value {
    let (parent, key) = at.rsplit_once('/').expect("a pointer");
    let mut target = &mut document;
    for part in parent.split('/').skip(1) {
        let object = target.as_object_mut().expect("an object on the way");
        target = object.entry(part).or_insert_with(|| json!({}));
    }
    target
        .as_object_mut()
        .expect("an object")
        .insert(key.to_owned(), value);
    document
}

/// `document` without the field at the JSON pointer `at`.
pub(super) fn without(mut document: Value, at: &str) -> Value {
    let (parent, key) = at.rsplit_once('/').expect("a pointer");
    document
        .pointer_mut(parent)
        .and_then(Value::as_object_mut)
        .expect("the parent")
        .remove(key);
    document
}

/// Each document is refused naming `field`, and the message contains `shows`.
pub(super) fn check<S: Validate>(cases: Vec<(Value, &str, &str)>) {
    for (document, field, shows) in cases {
        let error = match parse::<S>(document.clone()) {
            Ok(_) => panic!("accepted, expected an error on {field}: {document}"),
            Err(error) => error,
        };
        let message = error.to_string();
        assert_eq!(error.field, field, "{message}");
        assert!(message.contains(shows), "{message:?} lacks {shows:?}");
        assert!(message.len() < 600, "too long: {message}");
    }
}

pub(super) fn accept<S: Validate>(document: Value) -> Object<S> {
    match parse::<S>(document.clone()) {
        Ok(object) => object,
        Err(error) => panic!("refused: {error}\n{document}"),
    }
}

pub(super) fn agent() -> Value {
    json!({
        "apiVersion": "nodus.dev/v1",
        "kind": "Agent",
        "metadata": { "name": "hello-agent" },
        "spec": {
            "system": "You are a careful assistant.\n",
            "model": { "access": "Nodus" },
            "perRunMaxCostUSD": "0.50"
        }
    })
}

pub(super) fn byok_agent() -> Value {
    with(
        agent(),
        "/spec/model",
        json!({
            "access": "BYOK",
            "name": "claude-sonnet-5-5",
            "apiKeySecret": "anthropic-key"
        }),
    )
}

pub(super) fn run() -> Value {
    json!({
        "apiVersion": "nodus.dev/v1",
        "kind": "AgentRun",
        "metadata": { "name": "hello-agent-run" },
        "spec": {
            "agent": "hello-agent",
            "input": "Use the shell to print the Python version, then tell me which one it is."
        }
    })
}

pub(super) fn task(key: &str, depends_on: Value) -> Value {
    json!({
        "apiVersion": "nodus.dev/v1",
        "kind": "AgentRun",
        "metadata": { "name": format!("parallel-agents-{key}") },
        "spec": {
            "agent": "parallel-agents-worker",
            "group": "parallel-agents",
            "taskKey": key,
            "dependsOn": depends_on,
            "input": "What is the capital of France?"
        }
    })
}

pub(super) fn group() -> Value {
    json!({
        "apiVersion": "nodus.dev/v1",
        "kind": "AgentGroup",
        "metadata": { "name": "parallel-agents" },
        "spec": {
            "agent": "parallel-agents-worker",
            "limits": { "maxActive": 2 },
            "maxCostUSD": "0.60"
        }
    })
}

pub(super) fn evaluation_group() -> Value {
    json!({
        "apiVersion": "nodus.dev/v1",
        "kind": "AgentGroup",
        "metadata": { "name": "parallel-agents-eval" },
        "spec": {
            "agent": "parallel-agents-worker",
            "limits": { "maxActive": 2 },
            "maxCostUSD": "0.20",
            "evaluation": {
                "environment": "nodus/arithmetic-v2@2.0.0",
                "split": "test",
                "tasks": 2,
                "repetitions": 1,
                "seed": 42,
                "timeout": "10m"
            }
        }
    })
}

pub(super) fn long(bytes: usize) -> String {
    "a".repeat(bytes)
}
