//! YAML at the edges: reading files of several `---` documents into JSON values (JSON files
//! read the same way), and writing a value as YAML for `-o yaml` and the config file.

use serde_json::Value;

use crate::error::{Error, Result};

/// The documents of a YAML (or JSON) text, in order; empty documents are left out. `source`
/// names the text in errors (a file name, or `-` for standard input).
pub fn parse_documents(text: &str, source: &str) -> Result<Vec<Value>> {
    let documents: Vec<Value> = serde_saphyr::from_multiple(text)
        .map_err(|e| Error::input(format!("{source}: not valid YAML: {e}")))?;
    Ok(documents.into_iter().filter(|d| !d.is_null()).collect())
}

/// A value as a YAML document (ending with a newline). When the YAML writer's text would not
/// read back as the same value (it writes the string "\n" as a block that reads as ""), the
/// value is written as JSON, which is YAML too, so that what `-o yaml` prints applies back
/// unchanged.
pub fn to_yaml(value: &Value) -> Result<String> {
    let mut text = serde_saphyr::to_string(value)
        .map_err(|e| Error::input(format!("cannot write YAML: {e}")))?;
    let reads_back = serde_saphyr::from_multiple::<Value>(&text).is_ok_and(|back| {
        back.into_iter()
            .filter(|d| !d.is_null())
            .eq(Some(value.clone()).filter(|v| !v.is_null()))
    });
    if !reads_back {
        text = json_as_yaml(
            &serde_json::to_string_pretty(value)
                .map_err(|e| Error::input(format!("cannot write YAML: {e}")))?,
        );
    }
    if !text.ends_with('\n') {
        text.push('\n');
    }
    Ok(text)
}

/// JSON text that YAML reads as the same value: the characters JSON leaves raw in its strings
/// but YAML does not allow there (DEL, the C1 controls, U+FFFE/U+FFFF) or reads as line breaks
/// or marks (NEL, U+2028, U+2029, the byte-order mark) are written as `\u` escapes, which both
/// read the same. JSON's own syntax is ASCII, so only string contents change.
fn json_as_yaml(json: &str) -> String {
    let mut text = String::with_capacity(json.len());
    for c in json.chars() {
        let escaped = matches!(
            c,
            '\u{7f}'..='\u{9f}' | '\u{2028}' | '\u{2029}' | '\u{feff}' | '\u{fffe}' | '\u{ffff}'
        );
        if escaped {
            text.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            text.push(c);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const RUNS: &str = r#"# runs.yaml
apiVersion: nodus.dev/v1
kind: AgentRun
metadata:
  name: parallel-agents-a
spec:
  agent: parallel-agents-worker
  group: parallel-agents
  taskKey: a
  input: "What is the capital of France?"
---
---
apiVersion: nodus.dev/v1
kind: AgentRun
spec:
  dependsOn: [a, b]       # c waits until a and b have succeeded
  input: "Run `echo hello` and tell me what it printed"
"#;

    #[test]
    fn splits_documents_and_skips_empty_ones() {
        let documents = parse_documents(RUNS, "runs.yaml").expect("valid YAML");
        assert_eq!(documents.len(), 2);
        assert_eq!(documents[0]["spec"]["taskKey"], "a");
        assert_eq!(documents[1]["spec"]["dependsOn"], json!(["a", "b"]));
        assert_eq!(
            documents[1]["spec"]["input"],
            "Run `echo hello` and tell me what it printed"
        );
    }

    #[test]
    fn reads_the_spec_agent_with_block_text_quoted_money_and_numbers() {
        let text = "kind: Agent\nspec:\n  system: |\n    You are careful.\n    Answer briefly.\n  perRunMaxCostUSD: \"0.50\"\n  maxTokens: 1024\n  model:\n    families: [haiku]\n";
        let documents = parse_documents(text, "agent.yaml").expect("valid YAML");
        assert_eq!(
            documents[0]["spec"],
            json!({"system": "You are careful.\nAnswer briefly.\n", "perRunMaxCostUSD": "0.50", "maxTokens": 1024, "model": {"families": ["haiku"]}})
        );
    }

    #[test]
    fn a_lone_newline_is_written_so_that_it_reads_back() {
        // Found by fuzz_values_written_as_yaml_read_back_the_same: ["\n"] was written as a
        // literal block that reads back as [""].
        for value in [json!(["\n"]), json!({"system": "\n"}), json!("\n")] {
            let text = to_yaml(&value).expect("written");
            let back = parse_documents(&text, "out.yaml").expect("read back");
            assert_eq!(back, vec![value.clone()], "{text}");
        }
    }

    #[test]
    fn characters_yaml_does_not_allow_raw_are_escaped_so_that_they_read_back() {
        // Found by the fuzz test: a key of DEL alone, in a value written as JSON.
        for value in [
            json!({"": "\n", " ": {"\u{7f}": null}}),
            json!(["\n", "a\u{85}b\u{2028}c\u{9f}\u{feff}\u{ffff}"]),
        ] {
            let text = to_yaml(&value).unwrap();
            assert_eq!(
                parse_documents(&text, "out.yaml").unwrap(),
                vec![value],
                "{text}"
            );
        }
    }

    #[test]
    fn json_files_read_as_yaml() {
        let documents = parse_documents(r#"{"kind": "Agent", "spec": {"n": [1, 2]}}"#, "a.json")
            .expect("JSON is YAML");
        assert_eq!(
            documents,
            vec![json!({"kind": "Agent", "spec": {"n": [1, 2]}})]
        );
    }

    #[test]
    fn malformed_yaml_names_its_source() {
        let error = parse_documents("a: [\n", "bad.yaml").expect_err("unclosed");
        assert!(
            error.to_string().starts_with("bad.yaml: not valid YAML"),
            "{error}"
        );
        assert!(parse_documents("", "empty.yaml").expect("empty").is_empty());
    }

    #[test]
    fn emitted_yaml_reads_back_as_the_same_value() {
        let value = json!({
            "apiVersion": "nodus.dev/v1",
            "kind": "AgentRun",
            "metadata": {"name": "hello", "labels": {}},
            "spec": {"input": "Run `echo hello`: then tell me", "keepAlive": true},
            "status": {
                "phase": "Succeeded",
                "cost": {"totalUSD": "0.50"},
                "answer": {"preview": "hello\nworld\n", "bytes": 12},
                "turns": [{"model": "claude-haiku", "commands": 1}, {"model": "x", "costUSD": "1.00"}],
                "odd": ["true", "null", "", " lead", "#x", "- y", "yes", "1e3", "a\tb"],
                "empty": [],
                "none": null
            }
        });
        let text = to_yaml(&value).expect("writes");
        assert!(
            text.contains("totalUSD: \"0.50\""),
            "money stays a string: {text}"
        );
        let back = parse_documents(&text, "out").expect("reads back");
        assert_eq!(back, vec![value]);
    }
}

/// Property-based fuzzing of YAML at the edges: any text reads as documents or says why,
/// never panics; any JSON value written with `-o yaml` reads back as the same value (what
/// `get -o yaml` prints, `apply -f` takes back unchanged).
#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;
    use serde_json::Value;

    use super::*;

    /// Strings YAML could read as something else when written plainly.
    fn scalar_text() -> impl Strategy<Value = String> {
        prop_oneof![
            prop::sample::select(vec![
                "",
                " ",
                "0.50",
                "1e3",
                "0x1f",
                "0o17",
                "+1",
                "-0",
                ".5",
                "1_000",
                "yes",
                "no",
                "on",
                "off",
                "y",
                "n",
                "true",
                "False",
                "null",
                "Null",
                "~",
                ".inf",
                "-.inf",
                ".nan",
                "2026-12-01",
                "12:30",
                "- a",
                "a: b",
                "#x",
                "x #y",
                "&a",
                "*a",
                "!t",
                "|",
                ">",
                "'",
                "\"",
                "%",
                "@",
                "`",
                "---",
                "...",
                "{a}",
                "[a]",
                "?",
                ": ",
                "\t",
                "a\nb",
                "a\n",
                "\n",
                " a ",
                "\u{feff}x",
                "\u{85}",
                "\u{2028}",
                "é",
            ])
            .prop_map(str::to_string),
            "\\PC{0,12}",
            ".{0,12}",
        ]
    }

    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            scalar_text().prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 40, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
                prop::collection::btree_map(scalar_text(), inner, 0..5)
                    .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn fuzz_any_text_reads_as_documents_or_says_why(
            text in prop_oneof![
                "\\PC{0,80}",
                ".{0,80}",
                prop::collection::vec(
                    prop_oneof![
                        Just("---\n".to_string()), Just("- ".to_string()), Just(": ".to_string()),
                        Just("\n  ".to_string()), Just("&a ".to_string()), Just("*a".to_string()),
                        Just("<<: *a\n".to_string()), Just("{".to_string()), Just("[".to_string()),
                        Just("!!binary ".to_string()), Just("? ".to_string()), Just("|\n".to_string()),
                        scalar_text(),
                    ],
                    0..20,
                ).prop_map(|p| p.concat()),
            ],
        ) {
            if let Err(error) = parse_documents(&text, "fuzz.yaml") {
                prop_assert!(error.to_string().starts_with("fuzz.yaml:"), "{}", error);
            }
        }

        #[test]
        fn fuzz_values_written_as_yaml_read_back_the_same(value in any_json()) {
            let text = to_yaml(&value)
                .map_err(|e| TestCaseError::fail(format!("{value} cannot be written: {e}")))?;
            let back = parse_documents(&text, "out.yaml")
                .map_err(|e| TestCaseError::fail(format!("{value} as\n{text}does not read back: {e}")))?;
            let expected: Vec<Value> = if value.is_null() { vec![] } else { vec![value.clone()] };
            prop_assert_eq!(back, expected, "written as\n{}", text);
        }
    }
}
