//! Inspect-style samples, one JSON object a line, as one Environment with an `exact`,
//! `numeric` or `regex` grader. A sample's fields:
//!
//! - `input` (required): the prompt, as text; or a list of chat messages holding exactly one,
//!   `{"role": "user", "content": "…"}` (a run takes one prompt: a conversation of several
//!   messages, a system message included, is refused rather than flattened);
//! - `target` (required): the grader's `expected` (exact, numeric) or `pattern` (regex): text
//!   or a number, or a list holding one;
//! - `id` (optional): text or an integer; by default the sample's line number;
//! - `files` (optional): files the run's working directory starts with, path → contents
//!   (text, or a `data:…;base64,…` URL for bytes), kept in a FileSet of the sample's own;
//! - `metadata` and `sandbox` are not read; `choices` and `setup` are refused (they would
//!   change what the agent is asked or has).
//!
//! Blank lines are skipped. An error names the file, the line and the field.

use serde_json::{Map, Value};

use super::{Imported, Sourced, Target, file_entry, file_set, file_set_name, one_line};
use crate::resource::{FilesRef, GraderKind, GraderSpec, TaskSpec};
use crate::validate::{Invalid, Result};

/// The Environment of the samples in `text` (read from `path`, which errors name), graded by
/// `grader` (`exact`, `numeric` or `regex`).
pub fn import(path: &str, text: &str, target: &Target, grader: GraderKind) -> Result<Imported> {
    if grader == GraderKind::Command {
        return Err(Invalid::new(
            "--grader",
            "must be exact, numeric or regex",
            "\"command\"",
        ));
    }
    let mut tasks = Vec::new();
    let mut file_sets = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let number = index + 1;
        let at = |field: &str| {
            if field.is_empty() {
                format!("{path}:{number}")
            } else {
                format!("{path}:{number}: {field}")
            }
        };
        let sample: Map<String, Value> = match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(sample)) => sample,
            Ok(other) => {
                return Err(Invalid::new(
                    at(""),
                    "must be a JSON object (a sample)",
                    one_line(&other.to_string()),
                ));
            }
            Err(e) => {
                return Err(Invalid::new(
                    at(""),
                    format!("must be JSON ({e})"),
                    format!("{:?}", one_line(line)),
                ));
            }
        };
        for refused in ["choices", "setup"] {
            if sample.get(refused).is_some_and(|v| !v.is_null()) {
                return Err(Invalid::new(
                    at(refused),
                    "is not supported: it would change what the agent is asked or has",
                    "given",
                ));
            }
        }
        let prompt = prompt(sample.get("input"))
            .map_err(|(rule, value)| Invalid::new(at("input"), rule, value))?;
        let expected = target_of(sample.get("target"))
            .map_err(|(rule, value)| Invalid::new(at("target"), rule, value))?;
        let hidden = match grader {
            GraderKind::Regex => serde_json::json!({"pattern": expected}),
            _ => serde_json::json!({"expected": expected}),
        };
        let id = match sample.get("id") {
            None | Some(Value::Null) => number.to_string(),
            Some(Value::String(id)) => id.clone(),
            Some(Value::Number(id)) if id.is_i64() || id.is_u64() => id.to_string(),
            Some(other) => {
                return Err(Invalid::new(
                    at("id"),
                    "must be text or an integer",
                    one_line(&other.to_string()),
                ));
            }
        };
        let files = match sample.get("files") {
            None | Some(Value::Null) => None,
            Some(Value::Object(files)) => {
                let name = file_set_name(target, &format!("files-{number}"))?;
                let mut entries = Vec::with_capacity(files.len());
                for (file, contents) in files {
                    let bytes = file_bytes(contents).map_err(|rule| {
                        Invalid::new(
                            at(&format!("files.{file}")),
                            rule,
                            one_line(&contents.to_string()),
                        )
                    })?;
                    entries.push(file_entry(file.clone(), bytes, false));
                }
                let set = file_set(name, entries).map_err(|e| {
                    Invalid::new(at(&format!("files ({})", e.field)), e.rule, e.value)
                })?;
                let reference = FilesRef {
                    file_set: set.name().to_string(),
                };
                file_sets.push(set);
                Some(reference)
            }
            Some(other) => {
                return Err(Invalid::new(
                    at("files"),
                    "must be an object of path → contents",
                    one_line(&other.to_string()),
                ));
            }
        };
        tasks.push(Sourced {
            source: at(""),
            task: TaskSpec {
                id,
                prompt,
                hidden,
                files,
                timeout: None,
            },
        });
    }
    if tasks.is_empty() {
        return Err(Invalid::new(
            path,
            "must hold at least one sample (one JSON object a line)",
            "nothing",
        ));
    }
    let grader = GraderSpec {
        kind: grader,
        tolerance: None,
        command: None,
        files: None,
        timeout: None,
        verdict_from: Default::default(),
    };
    let environment = super::environment(target, String::new(), tasks, grader)?;
    Ok(Imported {
        file_sets,
        environment,
    })
}

/// The prompt of a sample's `input`; an error is the rule and the value shown.
fn prompt(input: Option<&Value>) -> std::result::Result<String, (String, String)> {
    const RULE: &str = "must be text, or a list of one chat message {\"role\": \"user\", \
                        \"content\": \"…\"} (a run takes one prompt)";
    match input {
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(messages)) => match messages.as_slice() {
            [message] if message.get("role").and_then(Value::as_str) == Some("user") => {
                match message.get("content") {
                    Some(Value::String(text)) => Ok(text.clone()),
                    _ => Err((
                        "must be a chat message whose content is text".to_string(),
                        one_line(&message.to_string()),
                    )),
                }
            }
            _ => Err((
                format!("{RULE}: a list of {} message(s) is not one", messages.len()),
                one_line(&Value::Array(messages.clone()).to_string()),
            )),
        },
        None | Some(Value::Null) => {
            Err((RULE.replace("must be", "is required:"), "nothing".into()))
        }
        Some(other) => Err((RULE.to_string(), one_line(&other.to_string()))),
    }
}

/// A sample's `target`: text or a number, or a list holding one.
fn target_of(target: Option<&Value>) -> std::result::Result<Value, (String, String)> {
    const RULE: &str = "must be text or a number (or a list holding one)";
    match target {
        Some(value @ (Value::String(_) | Value::Number(_))) => Ok(value.clone()),
        Some(Value::Array(values)) => match values.as_slice() {
            [value @ (Value::String(_) | Value::Number(_))] => Ok(value.clone()),
            _ => Err((
                format!("{RULE}: the grader compares with one target"),
                one_line(&Value::Array(values.clone()).to_string()),
            )),
        },
        None | Some(Value::Null) => Err((
            "is required: it is what the grader compares the answer with".to_string(),
            "nothing".to_string(),
        )),
        Some(other) => Err((RULE.to_string(), one_line(&other.to_string()))),
    }
}

/// A `files` entry's bytes: text as it is, or a `data:…;base64,…` URL decoded.
fn file_bytes(contents: &Value) -> std::result::Result<Vec<u8>, String> {
    use base64::Engine as _;
    let Value::String(text) = contents else {
        return Err("must be the file's contents as text".to_string());
    };
    match text.strip_prefix("data:") {
        Some(url) => {
            let (_, data) = url
                .split_once(";base64,")
                .ok_or("must be a base64 data URL (data:TYPE;base64,…) or plain text")?;
            base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .map_err(|e| format!("must be base64 after \";base64,\" ({e})"))
        }
        None => Ok(text.as_bytes().to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        Target {
            name: "qa".into(),
            version: "1.0.0".into(),
            split: "test".into(),
        }
    }

    #[test]
    fn samples_become_tasks_with_the_graders_hidden_data() {
        let text = concat!(
            "{\"input\": \"What is 2 + 2?\", \"target\": \"4\", \"id\": \"sum\"}\n",
            "\n",
            "{\"input\": [{\"role\": \"user\", \"content\": \"Say hi.\"}], \"target\": [\"hi\"], \"metadata\": {\"x\": 1}}\n",
            "{\"input\": \"Count.\", \"target\": 3, \"id\": 7, \"files\": {\"a.txt\": \"one\", \"b.bin\": \"data:application/octet-stream;base64,AP8=\"}}\n",
        );
        let imported = import("qa.jsonl", text, &target(), GraderKind::Exact).expect("imported");
        let tasks = &imported.environment.spec.splits["test"].tasks;
        let read: Vec<(&str, &str, &Value)> = tasks
            .iter()
            .map(|t| (t.id.as_str(), t.prompt.as_str(), &t.hidden))
            .collect();
        assert_eq!(
            read,
            vec![
                (
                    "sum",
                    "What is 2 + 2?",
                    &serde_json::json!({"expected": "4"})
                ),
                ("3", "Say hi.", &serde_json::json!({"expected": "hi"})),
                ("7", "Count.", &serde_json::json!({"expected": 3})),
            ]
        );
        assert_eq!(imported.file_sets.len(), 1);
        let set = &imported.file_sets[0];
        assert_eq!(set.name(), "qa-1-0-0-files-4");
        assert_eq!(
            tasks[2].files.as_ref().map(|f| f.file_set.as_str()),
            Some(set.name())
        );
        assert_eq!(set.spec.files[0].content, "one");
        assert_eq!(set.spec.files[1].bytes().expect("bytes"), vec![0, 255]);
        let regex = import(
            "qa.jsonl",
            "{\"input\": \"x\", \"target\": \"^x$\"}",
            &target(),
            GraderKind::Regex,
        )
        .expect("imported");
        assert_eq!(
            regex.environment.spec.splits["test"].tasks[0].hidden,
            serde_json::json!({"pattern": "^x$"})
        );
    }

    #[test]
    fn bad_samples_are_refused_naming_the_line_and_the_field() {
        for (text, grader, field, rule) in [
            (
                "{\"target\": \"4\"}",
                GraderKind::Exact,
                "qa.jsonl:1: input",
                "is required",
            ),
            (
                "\n{\"input\": \"x\"",
                GraderKind::Exact,
                "qa.jsonl:2",
                "must be JSON",
            ),
            ("[1]", GraderKind::Exact, "qa.jsonl:1", "JSON object"),
            (
                "{\"input\": \"x\"}",
                GraderKind::Exact,
                "qa.jsonl:1: target",
                "is required",
            ),
            (
                "{\"input\": \"x\", \"target\": [\"a\", \"b\"]}",
                GraderKind::Exact,
                "qa.jsonl:1: target",
                "one target",
            ),
            (
                "{\"input\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"u\"}], \"target\": \"a\"}",
                GraderKind::Exact,
                "qa.jsonl:1: input",
                "2 message(s)",
            ),
            (
                "{\"input\": \"x\", \"target\": \"a\", \"choices\": [\"a\", \"b\"]}",
                GraderKind::Exact,
                "qa.jsonl:1: choices",
                "not supported",
            ),
            (
                "{\"input\": \"x\", \"target\": \"four\"}",
                GraderKind::Numeric,
                "qa.jsonl:1: spec.splits.test.tasks[0].hidden.expected",
                "numeric",
            ),
            (
                "{\"input\": \"x\", \"target\": \"(\"}",
                GraderKind::Regex,
                "qa.jsonl:1: spec.splits.test.tasks[0].hidden.pattern",
                "regular expression",
            ),
            (
                "{\"input\": \"a\", \"target\": \"a\", \"id\": \"s\"}\n{\"input\": \"b\", \"target\": \"b\", \"id\": \"s\"}",
                GraderKind::Exact,
                "qa.jsonl:2: spec.splits.test.tasks[1].id",
                "unique",
            ),
            (
                "{\"input\": \"x\", \"target\": \"a\", \"files\": {\"../up\": \"x\"}}",
                GraderKind::Exact,
                "qa.jsonl:1: files",
                "",
            ),
            ("", GraderKind::Exact, "qa.jsonl", "at least one sample"),
        ] {
            let error = import("qa.jsonl", text, &target(), grader).expect_err(text);
            assert!(
                error.field.starts_with(field) && error.rule.contains(rule),
                "{text}: {error:?}"
            );
        }
    }
}
