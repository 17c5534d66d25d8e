//! Table tests of the transcript: journals in, entries out.

use jiff::Timestamp;
use nodus_core::journal::Step;
use nodus_core::store::InboxMessage;
use serde_json::{Value, json};

use super::*;

/// A journal from `(intent, outcome)` pairs in JSON, one second apart; an outcome of null is
/// a step without one.
fn journal(steps: &[(Value, Value)]) -> Vec<Step> {
    steps
        .iter()
        .enumerate()
        .map(|(i, (intent, outcome))| {
            let mut step = json!({
                "seq": i,
                "startedAt": format!("2026-12-01T10:00:{:02}Z", i),
                "intent": intent,
            });
            if !outcome.is_null() {
                let mut completion = outcome.clone();
                completion["finishedAt"] = json!(format!("2026-12-01T10:00:{:02}.5Z", i));
                step["completion"] = completion;
            }
            serde_json::from_value(step).expect("a step")
        })
        .collect()
}

fn route(turn: u32) -> (Value, Value) {
    (
        json!({"kind": "route", "turn": turn}),
        json!({"result": "routed", "model": "claude-haiku", "chosenBy": "jev", "costUSD": "0.0001"}),
    )
}

fn call(turn: u32, text: &str, cost: &str, tool: Option<&str>) -> (Value, Value) {
    let mut content = Vec::new();
    if !text.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    if let Some(command) = tool {
        content.push(json!({"type": "tool_use", "id": "t1", "name": "shell",
            "input": {"command": command}}));
    }
    (
        json!({"kind": "callModel", "turn": turn, "model": "claude-haiku",
            "reservedUSD": "0.01", "tools": true}),
        json!({"result": "modelReplied", "costUSD": cost, "response": {
            "model": "claude-haiku", "content": content,
            "stopReason": if tool.is_some() { "tool_use" } else { "end_turn" },
            "usage": {"inputTokens": 10, "outputTokens": 5}}}),
    )
}

fn command(turn: u32, line: &str, outcome: Value) -> (Value, Value) {
    (
        json!({"kind": "command", "turn": turn, "toolUseId": "t1", "command": line}),
        outcome,
    )
}

fn ran(code: i32, stdout: &str) -> Value {
    json!({"result": "commandFinished", "output": {"exitCode": code,
        "stdout": {"bytes": stdout}, "stderr": {"bytes": ""}}})
}

fn answer(turn: u32) -> (Value, Value) {
    (
        json!({"kind": "answer", "turn": turn}),
        json!({"result": "answered"}),
    )
}

fn names(entries: &[Entry]) -> Vec<String> {
    entries
        .iter()
        .map(|entry| match entry {
            Entry::System(_) => "system".to_string(),
            Entry::Prompt { source, text, .. } => format!("prompt {source:?}: {text}"),
            Entry::Reply { text, cost, .. } => format!("reply ${cost}: {text}"),
            Entry::ToolCall { command, end, .. } => match end {
                CallEnd::Ran { exit, output, .. } => {
                    format!("call {command}: {exit}: {}", output.head)
                }
                other => format!("call {command}: {other:?}"),
            },
            Entry::Answer { text, .. } => format!("answer: {text}"),
            Entry::Failed { error, .. } => format!("failed: {error}"),
            Entry::Parked { kind, .. } => format!("parked: {kind:?}"),
        })
        .collect()
}

#[test]
fn a_run_with_two_commands_and_a_message_reads_in_journal_order() {
    let steps = journal(&[
        route(0),
        call(0, "Let me look.", "0.002", Some("ls")),
        command(0, "ls", ran(0, "a\nb\n")),
        call(0, "", "0.001", Some("cat a")),
        command(0, "cat a", ran(1, "no such file\n")),
        call(0, "It is done.", "0.003", None),
        answer(0),
        (
            json!({"kind": "readMessage", "turn": 1, "messageSeq": 1}),
            json!({"result": "messageRead"}),
        ),
        route(1),
        call(1, "Noted.", "0.001", None),
        answer(1),
    ]);
    let inbox = [InboxMessage {
        seq: 1,
        key: None,
        payload: "And now?".to_string(),
        received_at: Timestamp::UNIX_EPOCH,
    }];
    let entries = build(
        &steps,
        RunNow::Going,
        Some("Be careful."),
        "List it",
        &inbox,
    );
    assert_eq!(
        names(&entries),
        [
            "system",
            "prompt Input: List it",
            "reply $0.002: Let me look.",
            "call ls: exit 0: a\nb\n",
            "call cat a: exit 1: no such file\n",
            "reply $0.003: It is done.",
            "answer: It is done.",
            "prompt Message(1): And now?",
            "reply $0.001: Noted.",
            "answer: Noted.",
        ]
    );
    // The turn's facts are the replay's: routing and every call of the turn.
    let Entry::Prompt {
        facts: Some(facts), ..
    } = &entries[1]
    else {
        panic!("the input's turn has facts: {:?}", entries[1]);
    };
    assert_eq!(facts.model, "claude-haiku");
    assert_eq!(facts.chosen_by, "jev");
    assert_eq!(facts.cost.to_string(), "0.0061");
    assert_eq!((facts.input_tokens, facts.output_tokens), (30, 15));
}

#[test]
fn a_step_without_an_outcome_is_running_parked_or_unknown() {
    let steps = journal(&[
        route(0),
        call(0, "", "0.001", Some("sleep 9")),
        command(0, "sleep 9", Value::Null),
    ]);
    let running = build(&steps, RunNow::Going, None, "go", &[]);
    assert_eq!(names(&running).last().unwrap(), "call sleep 9: Running");
    let parked = build(&steps, RunNow::Parked, None, "go", &[]);
    assert_eq!(
        names(&parked)[1..],
        ["parked: Command", "call sleep 9: Unknown"]
    );
    let Entry::Parked { resolve, .. } = &parked[1] else {
        panic!("parked first");
    };
    assert!(resolve.contains("retry") && resolve.contains("recordFailed"));
    // A finished run's step is neither running nor to resolve: its end is unknown.
    let finished = build(&steps, RunNow::Finished, None, "go", &[]);
    assert_eq!(names(&finished)[1..], ["call sleep 9: Unknown"]);
}

#[test]
fn failures_and_a_missing_message_are_said() {
    let steps = journal(&[
        route(0),
        (
            json!({"kind": "callModel", "turn": 0, "model": "m", "reservedUSD": "0.01",
                "tools": true}),
            json!({"result": "failed", "error": "provider said 500"}),
        ),
        command(
            0,
            "x",
            json!({"result": "stopped", "reason": "run cancelled"}),
        ),
        (
            json!({"kind": "readMessage", "turn": 1, "messageSeq": 7}),
            json!({"result": "messageRead"}),
        ),
    ]);
    assert_eq!(
        names(&build(&steps, RunNow::Going, Some(""), "go", &[])),
        [
            "prompt Input: go",
            "failed: provider said 500",
            "call x: Failed(\"stopped: run cancelled\")",
            "prompt Message(7): [message no longer stored]",
        ]
    );
}

#[test]
fn long_output_is_folded_at_its_lines_or_characters() {
    let output = |text: &str, truncated: bool| -> ExecOutput {
        serde_json::from_value(json!({"exitCode": 0,
            "stdout": {"bytes": text, "truncated": truncated}, "stderr": {"bytes": "warn\n"}}))
        .expect("output")
    };
    let short = fold(&output("one\ntwo\n", false));
    assert_eq!(short.head, "one\ntwo\nwarn\n");
    assert!(!short.folded);
    let many: String = (0..50).map(|i| format!("line {i}\n")).collect();
    let long = fold(&output(&many, false));
    assert_eq!(long.head.lines().count(), SHOWN_LINES);
    assert!(long.folded);
    let wide = fold(&output(&"x".repeat(SHOWN_CHARS * 2), false));
    assert_eq!(wide.head.chars().count(), SHOWN_CHARS);
    assert!(wide.folded);
    assert!(
        fold(&output("cut", true)).folded,
        "cut by the sandbox's cap"
    );
}

#[test]
fn markup_in_a_command_or_its_output_is_text() {
    let xss = "<script>alert(1)</script>";
    let steps = journal(&[
        route(0),
        call(0, "", "0.001", Some(xss)),
        command(0, xss, ran(0, xss)),
    ]);
    let mut html = Html::new();
    let forks = BTreeSet::from([2]);
    let entries = build(&steps, RunNow::Going, None, xss, &[]);
    render(&mut html, &entries, "/console/p/d/runs/r", &forks, "tok");
    let html = html.into_string();
    assert!(!html.contains("<script>"), "{html}");
    assert!(html.contains("$ &lt;script&gt;alert(1)&lt;/script&gt;"));
    assert_eq!(html.matches("Fork from here").count(), 1);
}
