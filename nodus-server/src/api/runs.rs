//! Run and group sub-resources: messages, steps, answer, cancel, close, resolve, an
//! evaluation group's results and retry.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use nodus_core::engine::{AtStep, ForkRequest, OutputWorkdir};
use nodus_core::evaluation::retry::RetryRequest;
use nodus_core::lifecycle::Resolution;
use nodus_core::store::Delivery;
use nodus_core::validate::{self, Invalid};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{caller, json_body, reply, shaped_body};
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// A message to a keepAlive run.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct MessageBody {
    /// The message.
    payload: String,
    /// Delivers the message once: a second message with this key answers the first's `seq`.
    #[serde(default)]
    message_key: Option<String>,
}

/// `POST …/agentruns/{name}/messages` with `{"payload": "…", "messageKey": "…"}`.
pub async fn send_message(
    State(state): State<Arc<AppState>>,
    Path((project, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    caller(&state, &headers).await?.check_write(&project)?;
    let message: MessageBody = shaped_body(
        &body,
        "a message is {\"payload\": \"…\", \"messageKey\": \"…\"}",
    )?;
    let delivery = state
        .engine
        .send_message(
            &project,
            &name,
            &message.payload,
            message.message_key.as_deref(),
        )
        .await?;
    let (status, seq, duplicate) = match delivery {
        Delivery::Delivered(seq) => (StatusCode::CREATED, seq, false),
        Delivery::Duplicate(seq) => (StatusCode::OK, seq, true),
    };
    Ok(reply(
        status,
        json!({"seq": seq, "duplicate": duplicate, "messageKey": message.message_key}),
    ))
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct StepsQuery {
    /// With the full payload of each step.
    #[serde(default)]
    payload: bool,
}

/// `GET …/agentruns/{name}/steps[?payload=true]`
pub async fn steps(
    State(state): State<Arc<AppState>>,
    Path((project, name)): Path<(String, String)>,
    Query(query): Query<StepsQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    caller(&state, &headers).await?.check_read(&project)?;
    let items = step_values(&state, &project, &name, query.payload).await?;
    Ok(reply(
        StatusCode::OK,
        json!({"kind": "StepList", "items": items}),
    ))
}

/// The run's steps as `GET …/steps` answers them; with `payload`, each with its intent and
/// outcome (the recorded output of a command is in its outcome).
async fn step_values(
    state: &AppState,
    project: &str,
    name: &str,
    payload: bool,
) -> ApiResult<Vec<Value>> {
    Ok(if payload {
        let steps = state.engine.steps(project, name).await?;
        let journal = state.engine.journal(project, name).await?;
        steps
            .into_iter()
            .zip(journal)
            .map(|(view, step)| {
                let mut value = serde_json::to_value(view).unwrap_or(Value::Null);
                value["intent"] = serde_json::to_value(&step.intent).unwrap_or(Value::Null);
                value["outcome"] = serde_json::to_value(step.outcome()).unwrap_or(Value::Null);
                value
            })
            .collect()
    } else {
        state
            .engine
            .steps(project, name)
            .await?
            .into_iter()
            .map(|view| serde_json::to_value(view).unwrap_or(Value::Null))
            .collect()
    })
}

/// `GET …/agentruns/{name}/answer`: the whole answer of the last answered turn.
pub async fn answer(
    State(state): State<Arc<AppState>>,
    Path((project, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    caller(&state, &headers).await?.check_read(&project)?;
    let run = state.engine.get_run(&project, &name).await?;
    let answer = state.engine.answer(&project, &name).await?;
    Ok(reply(
        StatusCode::OK,
        json!({"answer": answer, "phase": run.status.phase.map(|p| p.name())}),
    ))
}

/// `GET …/agentruns/{name}/workdir`: the run's final working directory as a tar archive
/// (`application/x-tar`), kept when the run ended.
pub async fn workdir(
    State(state): State<Arc<AppState>>,
    Path((project, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    caller(&state, &headers).await?.check_read(&project)?;
    match state.engine.output_workdir(&project, &name).await? {
        Some(OutputWorkdir::Archive(tar)) => Ok((
            StatusCode::OK,
            [(axum::http::header::CONTENT_TYPE, "application/x-tar")],
            tar,
        )
            .into_response()),
        Some(OutputWorkdir::Omitted(reason)) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            nodus_core::engine::Reason::WorkdirNotKept,
            format!("the final working directory of {name:?} was not kept: {reason}"),
        )),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            nodus_core::engine::Reason::NotFound,
            format!(
                "{name:?} has no final working directory: a run keeps one when it ends, for \
                 the payload retention period"
            ),
        )),
    }
}

/// `GET …/agentruns/{name}/results`: the results of a finished run, with their sizes (none
/// before it finishes).
pub async fn results(
    State(state): State<Arc<AppState>>,
    Path((project, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    caller(&state, &headers).await?.check_read(&project)?;
    let run = state.engine.get_run(&project, &name).await?;
    let items = state.engine.results(&project, &name).await?;
    Ok(reply(
        StatusCode::OK,
        json!({
            "kind": "RunResultList",
            "phase": run.status.phase.map(|p| p.name()),
            "items": items,
        }),
    ))
}

/// `GET …/agentruns/{name}/results/{result}`: one result's bytes (`application/gzip` for a
/// directory, `application/json` for a record).
pub async fn result(
    State(state): State<Arc<AppState>>,
    Path((project, name, result)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    caller(&state, &headers).await?.check_read(&project)?;
    let found = state.engine.result(&project, &name, &result).await?;
    Ok(crate::download::result_download(found))
}

/// `POST …/agentruns/{name}/cancel`: the run is cancelled and its sandbox deleted.
pub async fn cancel(
    State(state): State<Arc<AppState>>,
    Path((project, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    caller(&state, &headers).await?.check_write(&project)?;
    let run = state.engine.cancel_run_and_wait(&project, &name).await?;
    Ok(reply(StatusCode::OK, run))
}

/// Where a fork starts: a step's sequence number, or `"last-good"`.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub(crate) enum AtStepBody {
    /// A journal sequence number (a command step).
    Seq(u32),
    /// `"last-good"`: the last completed command before the first failed or uncertain step.
    Named(String),
}

/// A request for forks of a run.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ForkBody {
    /// The command step to continue after.
    at_step: AtStepBody,
    /// How many forks (default 1, at most 100).
    #[serde(default)]
    count: Option<u32>,
    /// The fork's name (`-1`, `-2`… appended when several); `SOURCE-fork-STEP` by default.
    #[serde(default)]
    name: Option<String>,
    /// A new user message the fork's next model call sees after the conversation as it
    /// stood after the step.
    #[serde(default)]
    input: Option<String>,
    /// Another agent to continue with: its model and system prompt.
    #[serde(default)]
    agent: Option<String>,
    /// Cancel the source once the forks exist; its `status.replacedBy` names the first.
    #[serde(default)]
    replace: bool,
}

/// `POST …/agentruns/{name}/fork`: new runs that continue this one from a command step,
/// created all or nothing; answers them as an `AgentRunList`.
pub async fn fork(
    State(state): State<Arc<AppState>>,
    Path((project, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    caller(&state, &headers).await?.check_write(&project)?;
    let body: ForkBody = shaped_body(
        &body,
        "a fork is {\"atStep\": N | \"last-good\", \"count\": K, \"name\": \"…\", \
             \"input\": \"…\", \"agent\": \"…\", \"replace\": false}",
    )?;
    let at = match body.at_step {
        AtStepBody::Seq(seq) => AtStep::Seq(seq),
        AtStepBody::Named(name) if name == "last-good" => AtStep::LastGood,
        AtStepBody::Named(other) => {
            return Err(Invalid::new(
                "atStep",
                "must be a step number or \"last-good\"",
                format!("{other:?}"),
            )
            .into());
        }
    };
    let request = ForkRequest {
        at,
        count: body.count.unwrap_or(1),
        name: body.name,
        agent: body.agent,
        input: body.input,
        replace: body.replace,
    };
    let runs = state.engine.fork(&project, &name, request).await?;
    Ok(reply(
        StatusCode::CREATED,
        json!({
            "apiVersion": nodus_core::resource::API_VERSION,
            "kind": "AgentRunList",
            "items": runs,
        }),
    ))
}

/// `POST …/agentruns/{name}/close`: a keepAlive conversation ends after its current turn;
/// the run succeeds with its answer and its sandbox is deleted.
pub async fn close(
    State(state): State<Arc<AppState>>,
    Path((project, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    caller(&state, &headers).await?.check_write(&project)?;
    // The runner carries it out (finishes the turn, deletes the sandbox, ends the run).
    let run = state.engine.close_run(&project, &name).await?;
    Ok(reply(StatusCode::OK, run))
}

/// How to resolve a run's uncertain step.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResolveBody {
    /// Run the step again, record it as failed, or cancel the run.
    action: Resolution,
}

/// `POST …/agentruns/{name}/resolve` with `{"action": "retry" | "recordFailed" | "cancel"}`.
pub async fn resolve(
    State(state): State<Arc<AppState>>,
    Path((project, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    caller(&state, &headers).await?.check_write(&project)?;
    let body: ResolveBody = serde_json::from_value(json_body(&body)?).map_err(|_| {
        ApiError::from(Invalid::new(
            "action",
            "is one of retry, recordFailed, cancel",
            "another value",
        ))
    })?;
    // The runner drives the run on from the resolution.
    state.engine.resolve(&project, &name, body.action).await?;
    Ok(reply(
        StatusCode::OK,
        state.engine.get_run(&project, &name).await?,
    ))
}

/// `POST …/agentgroups/{name}/cancel`: every unfinished run is cancelled; finished runs keep
/// their answers.
pub async fn cancel_group(
    State(state): State<Arc<AppState>>,
    Path((project, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    caller(&state, &headers).await?.check_write(&project)?;
    Ok(reply(
        StatusCode::OK,
        state.engine.cancel_group(&project, &name).await?,
    ))
}

/// `POST …/agentgroups/{name}/retry` with `{"reasons": [...], "tasks": [...]}` (both
/// optional; no body retries every unscored case): a new attempt for each unscored case of a
/// finished evaluation group, recorded in the same group. Answers the retried cases.
pub async fn retry_group(
    State(state): State<Arc<AppState>>,
    Path((project, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    caller(&state, &headers).await?.check_write(&project)?;
    let request: RetryRequest = if body.iter().all(u8::is_ascii_whitespace) {
        RetryRequest::default()
    } else {
        shaped_body(
            &body,
            "the body must be {\"reasons\": [reason…], \"tasks\": [task id…]}",
        )?
    };
    let retried = state
        .engine
        .retry_evaluation(&project, &name, &request)
        .await?;
    Ok(reply(
        StatusCode::OK,
        json!({
            "apiVersion": nodus_core::resource::API_VERSION,
            "kind": "EvaluationRetry",
            "group": name,
            "retried": retried,
        }),
    ))
}

/// What `POST …/agentgroups/{name}/rescore` asks for.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct RescoreBody {
    /// The Environment version whose grader grades (`name@version`).
    environment: String,
    /// The new group's name (default `<group>-rescore`).
    #[serde(default)]
    name: Option<String>,
}

/// `POST …/agentgroups/{name}/rescore` with `{"environment": "N@V", "name": "…"}`: a new
/// evaluation group grading this finished group's kept answers and working directories with
/// another Environment version's grader. Answers the new group (201).
pub async fn rescore_group(
    State(state): State<Arc<AppState>>,
    Path((project, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    caller(&state, &headers).await?.check_write(&project)?;
    let body: RescoreBody = shaped_body(
        &body,
        "the body must be {\"environment\": \"name@version\", \"name\": \"…\"}",
    )?;
    let group = state
        .engine
        .rescore_evaluation(&project, &name, &body.environment, body.name.as_deref())
        .await?;
    Ok(reply(StatusCode::CREATED, group))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
/// The query of `results`.
pub struct ResultsQuery {
    #[serde(default)]
    format: Option<String>,
}

/// `GET …/agentgroups/{name}/results`: an evaluation group's per-case records, in batch order:
/// a JSON list, or JSON Lines (one record a line) with `Accept: application/x-ndjson` or
/// `?format=jsonl`.
pub async fn group_results(
    State(state): State<Arc<AppState>>,
    Path((project, name)): Path<(String, String)>,
    Query(query): Query<ResultsQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    caller(&state, &headers).await?.check_read(&project)?;
    let lines = match query.format.as_deref() {
        None | Some("json") => headers
            .get(axum::http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("application/x-ndjson") || v.contains("application/jsonl")),
        Some("jsonl") => true,
        Some(other) => {
            return Err(
                Invalid::new("format", "must be json or jsonl", format!("{other:?}")).into(),
            );
        }
    };
    let results = state.engine.evaluation_results(&project, &name).await?;
    if lines {
        let mut body = String::new();
        for result in &results {
            body.push_str(
                &serde_json::to_string(result).map_err(|e| ApiError::internal(e.to_string()))?,
            );
            body.push('\n');
        }
        return Ok((
            [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
            body,
        )
            .into_response());
    }
    Ok(reply(
        StatusCode::OK,
        json!({
            "apiVersion": nodus_core::resource::API_VERSION,
            "kind": "EvaluationResultList",
            "group": name,
            "items": results,
        }),
    ))
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct LogsQuery {
    /// `true`: stream the output while the run goes on.
    follow: Option<String>,
    /// Only the last this many lines of the recorded output.
    tail_lines: Option<String>,
    /// Only the recorded output of commands that finished this many seconds ago or later.
    since_seconds: Option<String>,
}

/// What a log request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LogsAsked {
    /// Go on with the live output until the run ends.
    follow: bool,
    /// The recorded output to answer first; `None`: none (`follow` alone, from now on).
    recorded: Option<Recorded>,
}

/// Which lines of the recorded output a log answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Recorded {
    /// The last this many lines (after `since`).
    tail: Option<u64>,
    /// Lines of commands whose step finished at most this many seconds ago.
    since: Option<u64>,
}

impl LogsQuery {
    /// What is asked, or an error naming the parameter, its rule and its value.
    fn asked(&self) -> Result<LogsAsked, Invalid> {
        let follow = match self.follow.as_deref() {
            None | Some("false" | "0") => false,
            Some("true" | "1") => true,
            Some(other) => {
                return Err(Invalid::new(
                    "follow",
                    "is true or false",
                    validate::shown(other),
                ));
            }
        };
        let number = |parameter: &str, given: &Option<String>, least: u64, rule: &str| {
            given
                .as_deref()
                .map(|text| {
                    text.parse::<u64>()
                        .ok()
                        .filter(|n| *n >= least)
                        .ok_or_else(|| Invalid::new(parameter, rule, validate::shown(text)))
                })
                .transpose()
        };
        let tail = number(
            "tailLines",
            &self.tail_lines,
            0,
            "is a whole number of lines, 0 or more",
        )?;
        let since = number(
            "sinceSeconds",
            &self.since_seconds,
            1,
            "is a whole number of seconds, 1 or more",
        )?;
        let recorded =
            (!follow || tail.is_some() || since.is_some()).then_some(Recorded { tail, since });
        Ok(LogsAsked { follow, recorded })
    }
}

/// The lines of the recorded output of finished commands, from the steps as `GET
/// …/steps?payload=true` answers them, in step order (a command's standard output, then its
/// standard error: their interleaving is not recorded), each `{"seq", "stream", "offset",
/// "bytes", "finishedAt"}` (a line with its newline, at its offset in the stream; `bytes` an
/// array of numbers when not UTF-8). Lines carry no time of their own: `since` keeps the
/// lines of steps that finished at `now - since` or later; `tail` then keeps the last lines.
fn recorded_lines(steps: &[Value], recorded: Recorded, now: jiff::Timestamp) -> Vec<Value> {
    let oldest = recorded.since.map(|seconds| {
        now.checked_sub(jiff::SignedDuration::from_secs(
            i64::try_from(seconds).unwrap_or(i64::MAX),
        ))
        .unwrap_or(jiff::Timestamp::MIN)
    });
    let mut lines = Vec::new();
    for step in steps {
        let Some(finished) = step
            .get("finishedAt")
            .and_then(Value::as_str)
            .and_then(|at| at.parse::<jiff::Timestamp>().ok())
        else {
            continue;
        };
        if oldest.is_some_and(|oldest| finished < oldest) {
            continue;
        }
        for stream in ["stdout", "stderr"] {
            let bytes: Vec<u8> = match step.pointer(&format!("/outcome/output/{stream}/bytes")) {
                Some(Value::String(text)) => text.as_bytes().to_vec(),
                Some(Value::Array(numbers)) => numbers
                    .iter()
                    .map(|n| {
                        n.as_u64()
                            .and_then(|n| u8::try_from(n).ok())
                            .unwrap_or(b'?')
                    })
                    .collect(),
                _ => continue,
            };
            let mut offset = 0usize;
            for line in bytes.split_inclusive(|b| *b == b'\n') {
                let shown = match std::str::from_utf8(line) {
                    Ok(text) => json!(text),
                    Err(_) => json!(line),
                };
                lines.push(
                    json!({"seq": step["seq"], "stream": stream, "offset": offset,
                                  "bytes": shown, "finishedAt": step["finishedAt"]}),
                );
                offset += line.len();
            }
        }
    }
    if let Some(tail) = recorded.tail {
        let keep = usize::try_from(tail).unwrap_or(usize::MAX);
        lines.drain(..lines.len().saturating_sub(keep));
    }
    lines
}

/// How often a log stream with nothing to say looks whether its run has ended.
const LOGS_CHECK: std::time::Duration = std::time::Duration::from_secs(2);

/// `GET …/agentruns/{name}/logs[?follow=true][&tailLines=N][&sinceSeconds=S]`, as
/// newline-delimited JSON (`application/x-ndjson`). The recorded output of finished commands
/// ([`recorded_lines`], filtered by `tailLines` and `sinceSeconds`), one line a line; with
/// `follow=true`, first `{"following": NAME}`, then those lines (only when `tailLines` or
/// `sinceSeconds` is given: `follow` alone starts from now), then the output of the run's
/// commands as this server runs them, per piece of output `{"seq", "stream", "offset",
/// "bytes"}` (`bytes` a string when the piece is UTF-8, an array of numbers otherwise), until
/// the run has ended or the server stops. A follower that reads too slowly misses pieces (the
/// offsets show where); the completed steps hold everything.
pub async fn logs(
    State(state): State<Arc<AppState>>,
    Path((project, name)): Path<(String, String)>,
    Query(query): Query<LogsQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    caller(&state, &headers).await?.check_read(&project)?;
    let asked = query.asked()?;
    if !asked.follow {
        state.engine.get_run(&project, &name).await?;
        let steps = step_values(&state, &project, &name, true).await?;
        let recorded = asked.recorded.unwrap_or_default();
        let mut body = String::new();
        for line in recorded_lines(&steps, recorded, jiff::Timestamp::now()) {
            body.push_str(&format!("{line}\n"));
        }
        return Ok((
            [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
            body,
        )
            .into_response());
    }
    // Both subscribed before the run is read: no output and no end is missed.
    let changes = state.watches.subscribe(state.store.as_ref());
    let output = state.engine.follow_output(&project, &name).await?;
    let mut first = format!("{}\n", json!({"following": name}));
    // The steps finished by now: their live pieces (sent before they finished) are not sent
    // again after their recorded lines.
    let mut finished = std::collections::HashSet::new();
    if let Some(recorded) = asked.recorded {
        let steps = step_values(&state, &project, &name, true).await?;
        finished.extend(
            steps
                .iter()
                .filter(|step| step.get("finishedAt").is_some_and(|at| !at.is_null()))
                .filter_map(|step| step["seq"].as_u64()),
        );
        for line in recorded_lines(&steps, recorded, jiff::Timestamp::now()) {
            first.push_str(&format!("{line}\n"));
        }
    }
    let first = Bytes::from(first);
    let key = nodus_core::store::ObjectKey::new(
        project.clone(),
        nodus_core::resource::Kind::AgentRun,
        name.clone(),
    );
    let start = (Some(first), output, changes, state, key, finished);
    let stream = futures_util::stream::unfold(
        start,
        |(first, mut output, mut changes, state, key, finished)| async move {
            if let Some(first) = first {
                return Some((Ok(first), (None, output, changes, state, key, finished)));
            }
            loop {
                let deadline = tokio::time::Instant::now() + LOGS_CHECK;
                let concerns = |changed: &nodus_core::store::ObjectKey| *changed == key;
                tokio::select! {
                    chunk = output.recv() => match chunk {
                        Ok(chunk) if finished.contains(&u64::from(chunk.seq)) => {}
                        Ok(chunk) => {
                            let bytes = match std::str::from_utf8(&chunk.bytes) {
                                Ok(text) => json!(text),
                                Err(_) => json!(chunk.bytes),
                            };
                            let mut line = serde_json::to_value(&chunk).unwrap_or(Value::Null);
                            line["bytes"] = bytes;
                            let line = Bytes::from(format!("{line}\n"));
                            return Some((Ok::<_, std::convert::Infallible>(line), (None, output, changes, state, key, finished)));
                        }
                        // Too slow: the oldest pieces are gone; the offsets show it.
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                    },
                    woken = changes.next(&concerns, deadline) => {
                        if woken == crate::watch::Woken::Ended
                            && tokio::time::Instant::now() < deadline
                        {
                            // The server is stopping.
                            return None;
                        }
                        let ended = match state.engine.get_run(&key.project, &key.name).await {
                            Ok(run) => run.status.phase.is_some_and(|phase| phase.is_finished()),
                            Err(_) => true,
                        };
                        if ended {
                            return None;
                        }
                    }
                }
            }
        },
    );
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/x-ndjson")
        .body(axum::body::Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(follow: Option<&str>, tail: Option<&str>, since: Option<&str>) -> LogsQuery {
        LogsQuery {
            follow: follow.map(str::to_string),
            tail_lines: tail.map(str::to_string),
            since_seconds: since.map(str::to_string),
        }
    }

    #[test]
    fn log_parameters_are_checked_and_named() {
        assert_eq!(
            query(Some("true"), None, None).asked(),
            Ok(LogsAsked {
                follow: true,
                recorded: None
            })
        );
        assert_eq!(
            query(None, Some("0"), Some("300")).asked(),
            Ok(LogsAsked {
                follow: false,
                recorded: Some(Recorded {
                    tail: Some(0),
                    since: Some(300)
                })
            })
        );
        for (bad, field, value) in [
            (query(Some("yes"), None, None), "follow", "\"yes\""),
            (query(None, Some("-1"), None), "tailLines", "\"-1\""),
            (query(None, Some("ten"), None), "tailLines", "\"ten\""),
            (
                query(Some("true"), None, Some("0")),
                "sinceSeconds",
                "\"0\"",
            ),
            (query(None, None, Some("5m")), "sinceSeconds", "\"5m\""),
        ] {
            let error = bad.asked().expect_err(field);
            assert_eq!((error.field.as_str(), error.value.as_str()), (field, value));
            assert!(!error.rule.is_empty());
        }
    }

    #[test]
    fn recorded_lines_are_cut_by_the_steps_finish_time_then_by_their_count() {
        let step = |seq: u32, finished: Option<&str>, stdout: &str, stderr: Value| {
            json!({"seq": seq, "finishedAt": finished,
                   "outcome": {"output": {"stdout": {"bytes": stdout}, "stderr": {"bytes": stderr}}}})
        };
        let steps = [
            step(0, Some("2026-01-01T10:00:00Z"), "old-1\nold-2\n", json!("")),
            step(
                1,
                Some("2026-01-01T10:09:00Z"),
                "new-1\nnew-2",
                json!([0xff, b'\n']),
            ),
            step(2, None, "running\n", json!("")),
        ];
        let now: jiff::Timestamp = "2026-01-01T10:10:00Z".parse().expect("a time");
        let texts = |recorded: Recorded| -> Vec<(Value, Value, Value)> {
            recorded_lines(&steps, recorded, now)
                .into_iter()
                .map(|line| {
                    (
                        line["seq"].clone(),
                        line["offset"].clone(),
                        line["bytes"].clone(),
                    )
                })
                .collect()
        };
        assert_eq!(
            texts(Recorded::default()),
            [
                (json!(0), json!(0), json!("old-1\n")),
                (json!(0), json!(6), json!("old-2\n")),
                (json!(1), json!(0), json!("new-1\n")),
                (json!(1), json!(6), json!("new-2")),
                (json!(1), json!(0), json!([0xff, b'\n'])),
            ]
        );
        // Five minutes: only the step that finished a minute ago.
        let since = Recorded {
            since: Some(300),
            tail: None,
        };
        assert_eq!(texts(since).len(), 3);
        assert!(texts(since).iter().all(|(seq, _, _)| *seq == json!(1)));
        let both = Recorded {
            since: Some(300),
            tail: Some(2),
        };
        assert_eq!(
            texts(both),
            [
                (json!(1), json!(6), json!("new-2")),
                (json!(1), json!(0), json!([0xff, b'\n'])),
            ]
        );
        assert!(
            texts(Recorded {
                tail: Some(0),
                since: None
            })
            .is_empty()
        );
    }
}
