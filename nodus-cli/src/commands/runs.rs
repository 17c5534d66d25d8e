//! `nodus agentrun answer|steps|send|resolve`: the sub-resources of one run.

use nodus_core::resource::Kind;
use reqwest::Method;
use serde_json::{Value, json};

use super::{out, outln, text_or_stdin};
use crate::cli::{AgentRunCommand, Output};
use crate::client::Client;
use crate::duration;
use crate::error::{Error, Result};
use crate::jsonpath::scalar_text;
use crate::kinds::qualified;
use crate::table::Table;
use crate::terminal;
use crate::yaml;

const RUNS: &str = "agentruns";

/// Write `bytes` (`what` of run `name`) to `file`, or to standard output for `-`.
fn save(name: &str, what: &str, file: &std::path::Path, bytes: &[u8]) -> Result<()> {
    if file.as_os_str() == "-" {
        use std::io::Write;
        let mut stdout = std::io::stdout().lock();
        match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
            // A reader that stopped reading (`| head -c`) ends the command quietly.
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                return Err(Error::input(format!("writing the {what}: {e}")));
            }
            _ => {}
        }
    } else {
        std::fs::write(file, bytes)
            .map_err(|e| Error::input(format!("writing {}: {e}", file.display())))?;
        eprintln!(
            "agentrun/{name}: {what} saved to {} ({} bytes)",
            file.display(),
            bytes.len()
        );
    }
    Ok(())
}

pub async fn run(client: &Client, command: AgentRunCommand) -> Result<()> {
    match command {
        AgentRunCommand::Answer { name } => {
            let reply = client.get(&[RUNS, &name, "answer"]).await?;
            match reply.get("answer").and_then(Value::as_str) {
                Some(answer) => {
                    out(&answer_text(answer, terminal::stdout_is_terminal()));
                    Ok(())
                }
                None => {
                    let phase = reply
                        .get("phase")
                        .and_then(Value::as_str)
                        .unwrap_or("Pending");
                    Err(Error::input(format!(
                        "agentrun/{name} has no answer yet (phase {phase})"
                    )))
                }
            }
        }
        AgentRunCommand::Workdir { name, file } => {
            let tar = client.get_bytes(&[RUNS, &name, "workdir"]).await?;
            save(&name, "final working directory", &file, &tar)
        }
        AgentRunCommand::Logs {
            name,
            follow,
            tail,
            since,
        } => {
            let since = since
                .map(|text| match duration::parse(&text) {
                    Ok(since) if !since.is_zero() => Ok(since),
                    Ok(_) => Err(Error::usage("--since is a duration above 0, such as 5m")),
                    Err(error) => Err(Error::usage(error)),
                })
                .transpose()?;
            logs(client, &name, follow, LogWindow { tail, since }).await
        }
        AgentRunCommand::Results { name, result, file } => {
            let Some(result) = result else {
                let reply = client.get(&[RUNS, &name, "results"]).await?;
                let items = reply
                    .get("items")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                if items.is_empty() {
                    let phase = reply
                        .get("phase")
                        .and_then(Value::as_str)
                        .unwrap_or("Pending");
                    eprintln!("agentrun/{name} has no results yet: it is {phase}.");
                    return Ok(());
                }
                let mut table = Table::new(&["RESULT", "FILE", "BYTES"]);
                for item in &items {
                    table.rows.push(vec![
                        scalar_text(&item["name"]),
                        scalar_text(&item["fileName"]),
                        scalar_text(&item["bytes"]),
                    ]);
                }
                out(&table.render());
                return Ok(());
            };
            let bytes = client.get_bytes(&[RUNS, &name, "results", &result]).await?;
            let file = file.unwrap_or_else(|| {
                let extension = if result.ends_with("Workdir") || result == "artifacts" {
                    "tar.gz"
                } else if result == "egress" {
                    "jsonl"
                } else {
                    "json"
                };
                std::path::PathBuf::from(format!("{result}.{extension}"))
            });
            save(&name, &result, &file, &bytes)
        }
        AgentRunCommand::Egress { name, output } => {
            let bytes = client
                .get_bytes(&[RUNS, &name, "results", "egress"])
                .await?;
            out(&super::egress::render(&bytes, output.as_deref())?);
            Ok(())
        }
        AgentRunCommand::Steps {
            name,
            output,
            payload,
        } => {
            let query: &[(&str, &str)] = if payload { &[("payload", "true")] } else { &[] };
            let reply = client
                .call(Method::GET, &[RUNS, &name, "steps"], query, None)
                .await?;
            match output {
                None | Some(Output::Table) | Some(Output::Wide) => {
                    let items = reply
                        .get("items")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default();
                    if items.is_empty() {
                        eprintln!("agentrun/{name} has no steps yet.");
                    } else {
                        out(&steps_text(&items, terminal::stdout_is_terminal()));
                    }
                }
                Some(Output::Yaml) => out(&yaml::to_yaml(&reply)?),
                Some(Output::Json) => {
                    outln(&serde_json::to_string_pretty(&reply).unwrap_or_default())
                }
                Some(Output::JsonPath(template)) => {
                    let template =
                        crate::jsonpath::Template::parse(&template).map_err(Error::usage)?;
                    out(&template.render(&reply));
                }
                Some(Output::Name) => {
                    return Err(Error::usage(
                        "agentrun steps prints a table, yaml, json or jsonpath=…",
                    ));
                }
            }
            Ok(())
        }
        AgentRunCommand::Send { name, message, key } => {
            let mut body = json!({"payload": text_or_stdin(&message)?});
            if let Some(key) = &key {
                body["messageKey"] = json!(key);
            }
            let reply = client.post(&[RUNS, &name, "messages"], body).await?;
            let target = qualified(Kind::AgentRun, &name);
            if reply.get("duplicate").and_then(Value::as_bool) == Some(true) {
                outln(&format!(
                    "{target}: message with key {:?} was already delivered; not sent again",
                    key.unwrap_or_default()
                ));
            } else {
                let seq = reply.get("seq").map(scalar_text).unwrap_or_default();
                outln(&format!("{target}: message delivered (seq {seq})"));
            }
            Ok(())
        }
        AgentRunCommand::Fork {
            name,
            at_step,
            count,
            fork_name: new_name,
            input,
            agent,
            replace,
        } => {
            let at: Value = match at_step.parse::<u32>() {
                Ok(seq) => json!(seq),
                Err(_) => json!(at_step),
            };
            let mut body = json!({"atStep": at, "count": count, "replace": replace});
            for (field, value) in [("name", new_name), ("input", input), ("agent", agent)] {
                if let Some(value) = value {
                    body[field] = json!(value);
                }
            }
            let reply = client.post(&[RUNS, &name, "fork"], body).await?;
            for item in reply["items"].as_array().into_iter().flatten() {
                let fork = item.pointer("/metadata/name").map(scalar_text);
                outln(&format!(
                    "{} created",
                    qualified(Kind::AgentRun, &fork.unwrap_or_default())
                ));
            }
            Ok(())
        }
        AgentRunCommand::Close { name } => {
            client.post(&[RUNS, &name, "close"], json!({})).await?;
            outln(&format!(
                "{} closed: it succeeds after its current turn",
                qualified(Kind::AgentRun, &name)
            ));
            Ok(())
        }
        AgentRunCommand::Resolve { name, action } => {
            let reply = client
                .post(&[RUNS, &name, "resolve"], json!({"action": action.wire()}))
                .await?;
            let phase = reply
                .pointer("/status/phase")
                .and_then(Value::as_str)
                .unwrap_or("Pending");
            outln(&format!(
                "{} resolved ({}); now {phase}",
                qualified(Kind::AgentRun, &name),
                action.wire()
            ));
            Ok(())
        }
    }
}

/// How long one wait for a change of the run lasts in `logs -f` before it reads again.
const LOGS_POLL_SECONDS: &str = "30";

/// The most bytes of a line of live output held back while it is not complete: a longer one
/// is printed from the command's step when it finishes.
const MAX_PENDING_LINE: usize = 1 << 20;

/// One stream of one command as followed live in `logs -f`.
#[derive(Debug, Default)]
struct Streamed {
    /// Bytes printed, from the start of the stream.
    printed: u64,
    /// Bytes received after those, not printed yet: the start of a line.
    pending: Vec<u8>,
    /// A piece was missed: the rest is printed from the finished step.
    broken: bool,
}

/// The live output a follower of a run has seen, by step and stream.
#[derive(Debug, Default)]
struct LiveShown {
    streams: std::collections::HashMap<(u64, String), Streamed>,
}

impl LiveShown {
    /// The lines a piece of output (`{"seq", "stream", "offset", "bytes"}`) completes, to be
    /// printed now; none when the piece does not follow what came before (it is then
    /// printed from the finished step).
    fn take(&mut self, piece: &Value) -> String {
        let (Some(seq), Some(stream), Some(offset)) = (
            piece.get("seq").and_then(Value::as_u64),
            piece.get("stream").and_then(Value::as_str),
            piece.get("offset").and_then(Value::as_u64),
        ) else {
            return String::new();
        };
        let bytes = match piece.get("bytes") {
            Some(Value::String(text)) => text.as_bytes().to_vec(),
            Some(Value::Array(numbers)) => numbers
                .iter()
                .map(|n| {
                    n.as_u64()
                        .and_then(|n| u8::try_from(n).ok())
                        .unwrap_or(b'?')
                })
                .collect(),
            _ => return String::new(),
        };
        let entry = self.streams.entry((seq, stream.to_string())).or_default();
        if entry.broken {
            return String::new();
        }
        if offset != entry.printed + entry.pending.len() as u64 {
            entry.broken = true;
            entry.pending.clear();
            return String::new();
        }
        entry.pending.extend_from_slice(&bytes);
        let Some(end) = entry.pending.iter().rposition(|&b| b == b'\n') else {
            if entry.pending.len() > MAX_PENDING_LINE {
                entry.broken = true;
                entry.pending.clear();
            }
            return String::new();
        };
        let lines: Vec<u8> = entry.pending.drain(..=end).collect();
        entry.printed += lines.len() as u64;
        let text = String::from_utf8_lossy(&lines);
        if stream == "stderr" {
            text.lines()
                .map(|line| format!("stderr: {line}\n"))
                .collect()
        } else {
            text.into_owned()
        }
    }

    /// How many bytes of `stream` of step `seq` were printed live.
    fn printed(&self, seq: u64, stream: &str) -> u64 {
        self.streams
            .get(&(seq, stream.to_string()))
            .map_or(0, |s| s.printed)
    }
}

/// The next piece of a `…/logs?follow=true` stream; `None` once it has ended.
async fn next_piece(response: &mut reqwest::Response, buffer: &mut Vec<u8>) -> Option<Value> {
    loop {
        if let Some(end) = buffer.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            match serde_json::from_slice::<Value>(&line) {
                Ok(piece) if piece.get("seq").is_some() => return Some(piece),
                _ => continue,
            }
        }
        match response.chunk().await {
            Ok(Some(chunk)) => buffer.extend_from_slice(&chunk),
            _ => return None,
        }
    }
}

/// `agentrun logs NAME [-f]`: each step once it is seen (its number, kind, state and summary),
/// and each command's output once it has finished; with `follow`, waiting for the run to
/// change (the long poll of `GET …/agentruns/NAME?watch=true`) until it has finished and
/// everything it did is printed, and printing a running command's output line by line as it
/// comes (`GET …/agentruns/NAME/logs?follow=true`); what was printed live is not printed again.
async fn logs(client: &Client, name: &str, follow: bool, window: LogWindow) -> Result<()> {
    // Steps that finished before this are not printed (`--since`), by this machine's clock.
    let oldest = window.since.and_then(|since| {
        jiff::SignedDuration::try_from(since)
            .ok()
            .and_then(|since| jiff::Timestamp::now().checked_sub(since).ok())
    });
    let mut first_read = true;
    // Followed before the first read: a command that starts after it shows live. A server
    // without live output (or a stream that ends) leaves the finished steps to show it.
    let mut live = if follow {
        client
            .get_stream(&[RUNS, name, "logs"], &[("follow", "true")])
            .await
            .ok()
    } else {
        None
    };
    let mut buffer = Vec::new();
    let mut live_shown = LiveShown::default();
    // Live pieces of steps not listed yet.
    let mut early: Vec<Value> = Vec::new();
    // Per step seq: whether its end was printed.
    let mut shown: std::collections::HashMap<u64, bool> = std::collections::HashMap::new();
    loop {
        let run = client.get(&[RUNS, name]).await?;
        let steps = client
            .call(
                Method::GET,
                &[RUNS, name, "steps"],
                &[("payload", "true")],
                None,
            )
            .await?;
        let items = steps
            .get("items")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut text = String::new();
        for step in &items {
            let seq = step.get("seq").and_then(Value::as_u64).unwrap_or_default();
            let finished = step.get("finishedAt").is_some_and(|at| !at.is_null());
            match shown.get(&seq).copied() {
                None if finished && oldest.is_some_and(|oldest| finished_before(step, oldest)) => {
                    // Older than --since: as good as printed.
                    shown.insert(seq, true);
                }
                None => {
                    shown.insert(seq, finished);
                    text.push_str(&step_line(step));
                    if let Some(command) = step.pointer("/intent/command").and_then(Value::as_str) {
                        text.push_str(&format!("$ {command}\n"));
                    }
                    if finished {
                        text.push_str(&step_output(step, seq, &live_shown));
                    }
                }
                Some(false) if finished => {
                    shown.insert(seq, true);
                    text.push_str(&format!("{} (finished)\n", step_line(step).trim_end()));
                    text.push_str(&step_output(step, seq, &live_shown));
                }
                Some(_) => {}
            }
            // Pieces that came before their step was listed.
            if shown.get(&seq) == Some(&false) {
                for piece in early
                    .iter()
                    .filter(|p| p.get("seq").and_then(Value::as_u64) == Some(seq))
                {
                    text.push_str(&live_shown.take(piece));
                }
            }
        }
        early.retain(|p| {
            let seq = p.get("seq").and_then(Value::as_u64).unwrap_or_default();
            !shown.contains_key(&seq)
        });
        if std::mem::take(&mut first_read)
            && let Some(tail) = window.tail
        {
            text = last_lines(&text, tail);
        }
        out(&terminal::shown(&text, terminal::stdout_is_terminal()));
        let phase = run
            .pointer("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or("Pending");
        let ended = matches!(phase, "Succeeded" | "Failed" | "Cancelled");
        let all_shown = shown.len() == items.len() && shown.values().all(|end| *end);
        if !follow || (ended && all_shown) {
            if follow {
                outln(&format!("agentrun/{name} {phase}"));
            }
            return Ok(());
        }
        if ended {
            // Its last steps were written after the document: read once more.
            continue;
        }
        let version = run
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let path = [RUNS, name];
        let query = [
            ("watch", "true"),
            ("resourceVersion", version.as_str()),
            ("timeoutSeconds", LOGS_POLL_SECONDS),
        ];
        let poll = client.call(Method::GET, &path, &query, None);
        tokio::pin!(poll);
        loop {
            let piece = tokio::select! {
                changed = &mut poll => {
                    changed?;
                    break;
                }
                piece = async {
                    match live.as_mut() {
                        Some(response) => next_piece(response, &mut buffer).await,
                        None => std::future::pending().await,
                    }
                } => piece,
            };
            let Some(piece) = piece else {
                live = None;
                continue;
            };
            let seq = piece.get("seq").and_then(Value::as_u64).unwrap_or_default();
            match shown.get(&seq) {
                Some(false) => out(&terminal::shown(
                    &live_shown.take(&piece),
                    terminal::stdout_is_terminal(),
                )),
                Some(true) => {}
                None => {
                    // Its step is not listed yet: read the steps first.
                    early.push(piece);
                    break;
                }
            }
        }
    }
}

/// Which part of a run's log `agentrun logs` prints first: the last `tail` lines, of the steps
/// that finished within `since` (and those not finished).
#[derive(Debug, Clone, Copy, Default)]
pub struct LogWindow {
    /// `--tail`: the last this many lines of what is printed at first.
    pub tail: Option<u64>,
    /// `--since`: only steps that finished this long ago or later.
    pub since: Option<std::time::Duration>,
}

/// Whether a step finished before `oldest` (a step without a readable finish time did not).
fn finished_before(step: &Value, oldest: jiff::Timestamp) -> bool {
    step.get("finishedAt")
        .and_then(Value::as_str)
        .and_then(|at| at.parse::<jiff::Timestamp>().ok())
        .is_some_and(|finished| finished < oldest)
}

/// The last `count` lines of `text` (whose lines end with a newline).
fn last_lines(text: &str, count: u64) -> String {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let keep = usize::try_from(count)
        .unwrap_or(usize::MAX)
        .min(lines.len());
    lines[lines.len() - keep..].concat()
}

/// `[seq] Kind State: summary` of a step.
fn step_line(step: &Value) -> String {
    format!(
        "[{}] {} {}: {}\n",
        scalar_text(&step["seq"]),
        scalar_text(&step["kind"]),
        scalar_text(&step["state"]),
        scalar_text(&step["summary"]),
    )
}

/// A finished command's standard output and error, as recorded, but for what `live` printed
/// of them while it ran.
fn step_output(step: &Value, seq: u64, live: &LiveShown) -> String {
    let mut text = String::new();
    for stream in ["stdout", "stderr"] {
        let Some(output) = step.pointer(&format!("/outcome/output/{stream}/bytes")) else {
            continue;
        };
        let printed = usize::try_from(live.printed(seq, stream)).unwrap_or(usize::MAX);
        let bytes = match output {
            // Live output is printed in whole lines, so it ends on a character boundary.
            Value::String(text) => text.get(printed..).unwrap_or_default().to_string(),
            _ if printed > 0 => String::new(),
            other => format!(
                "({} bytes that are not text)",
                other.as_array().map_or(0, Vec::len)
            ),
        };
        if bytes.is_empty() {
            continue;
        }
        if stream == "stderr" {
            text.push_str("stderr:\n");
        }
        text.push_str(&bytes);
        if !bytes.ends_with('\n') {
            text.push('\n');
        }
    }
    text
}

/// What `agentrun answer` prints: the answer with a final newline, its control characters
/// escaped when `terminal` (standard output is one).
pub fn answer_text(answer: &str, terminal: bool) -> String {
    let mut text = terminal::shown(answer, terminal).into_owned();
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text
}

/// What `agentrun steps` prints: [`steps_table`], each cell's control characters escaped
/// when `terminal` (before the columns are measured, so that they stay aligned).
pub fn steps_text(items: &[Value], terminal: bool) -> String {
    let mut table = steps_table(items);
    for cell in table.rows.iter_mut().flatten() {
        if let std::borrow::Cow::Owned(shown) = terminal::shown(cell, terminal) {
            *cell = shown;
        }
    }
    table.render()
}

/// The steps as a table: SEQ, KIND, STATE, DURATION, SUMMARY.
pub fn steps_table(items: &[Value]) -> Table {
    let mut table = Table::new(&["SEQ", "KIND", "STATE", "DURATION", "SUMMARY"]);
    for item in items {
        let field = |name: &str| item.get(name).map(scalar_text).unwrap_or_default();
        let time = |name: &str| {
            item.get(name)
                .and_then(Value::as_str)
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        };
        let duration = match (time("startedAt"), time("finishedAt")) {
            (Some(start), Some(end)) => {
                let millis = end
                    .as_millisecond()
                    .saturating_sub(start.as_millisecond())
                    .max(0);
                if millis < 1000 {
                    format!("{millis}ms")
                } else {
                    format!("{}.{}s", millis / 1000, (millis % 1000) / 100)
                }
            }
            _ => "-".to_string(),
        };
        let summary = field("summary").replace('\n', " ");
        table.rows.push(vec![
            field("seq"),
            field("kind"),
            field("state"),
            duration,
            summary,
        ]);
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_show_in_order_with_their_duration() {
        let items = vec![
            json!({"seq": 0, "kind": "SandboxCreation", "state": "Completed", "startedAt": "2026-05-01T12:00:00Z", "finishedAt": "2026-05-01T12:00:00.040Z", "summary": "sandbox sb-1 (unisolated)"}),
            json!({"seq": 1, "kind": "Command", "state": "Completed", "startedAt": "2026-05-01T12:00:01Z", "finishedAt": "2026-05-01T12:00:03.250Z", "summary": "echo hello\n-> 0"}),
            json!({"seq": 2, "kind": "ModelCall", "state": "Started", "startedAt": "2026-05-01T12:00:04Z", "summary": "haiku"}),
        ];
        assert_eq!(
            steps_table(&items).render(),
            "SEQ   KIND              STATE       DURATION   SUMMARY\n\
             0     SandboxCreation   Completed   40ms       sandbox sb-1 (unisolated)\n\
             1     Command           Completed   2.2s       echo hello -> 0\n\
             2     ModelCall         Started     -          haiku\n"
        );
    }

    #[test]
    fn an_answer_with_escape_sequences_is_escaped_on_a_terminal_only() {
        let answer = "[offline model] I ran the commands you quoted.\n\u{1b}[2J\u{1b}]2;owned\u{7}\u{1b}[31mFAIL\u{1b}[0m";
        assert_eq!(
            answer_text(answer, true),
            "[offline model] I ran the commands you quoted.\n^[[2J^[]2;owned^G^[[31mFAIL^[[0m\n"
        );
        assert_eq!(answer_text(answer, false), format!("{answer}\n"));
        let items = vec![
            json!({"seq": 3, "kind": "Command", "state": "Completed", "summary": "printf '\u{1b}[2J'\n-> 0"}),
        ];
        assert!(steps_text(&items, false).contains("printf '\u{1b}[2J' -> 0"));
        let table = steps_text(&items, true);
        assert!(table.contains("printf '^[[2J' -> 0"), "{table}");
    }
}
