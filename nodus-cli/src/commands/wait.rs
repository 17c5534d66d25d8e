//! `nodus wait KIND/NAME --for=jsonpath='{…}'=VALUE --timeout=…`: reads the object, then
//! waits for each change of it with the API's long poll (`?watch=true&resourceVersion=…`),
//! until the condition holds, the timeout passes, or the object finishes in a state that can
//! never meet it. On a terminal it keeps one live progress line (phase, turns, cost, the time
//! waited); otherwise it prints no progress, so a script's standard error holds only what
//! went wrong.

use std::io::{IsTerminal as _, Write as _};
use std::time::{Duration, Instant};

use nodus_core::resource::Kind;
use reqwest::Method;
use serde_json::Value;

use super::outln;
use crate::cli::WaitArgs;
use crate::client::Client;
use crate::duration;
use crate::error::{Error, Result};
use crate::jsonpath::Path;
use crate::kinds::{parse_target, qualified};

/// The pause before reading again after an answer that did not change (a server that does
/// not wait, or one that is stopping) or after the server could not be reached.
const POLL: Duration = Duration::from_millis(250);
/// The longest wait asked of the server in one request (well within the client's timeout).
const LONG_POLL: Duration = Duration::from_secs(30);
/// How often the live progress line's time is redrawn while a long poll waits.
const TICK: Duration = Duration::from_secs(1);

/// A parsed `--for`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// The path read.
    pub path: Path,
    /// The value it must have.
    pub value: String,
}

/// Parses `jsonpath={.status.phase}=Succeeded` (the braces may be left out, and quotes the
/// shell left in are taken off).
pub fn parse_condition(text: &str) -> Result<Condition> {
    let usage = || {
        Error::usage(format!(
            "--for takes jsonpath='{{.status.phase}}'=VALUE, not {text:?}"
        ))
    };
    let rest = text.strip_prefix("jsonpath=").ok_or_else(usage)?;
    let (expression, after) =
        if let Some(quote) = rest.chars().next().filter(|c| *c == '\'' || *c == '"') {
            let inner = &rest[1..];
            let end = inner.find(quote).ok_or_else(usage)?;
            (&inner[..end], &inner[end + 1..])
        } else if rest.starts_with('{') {
            let end = rest.find('}').ok_or_else(usage)?;
            (&rest[..=end], &rest[end + 1..])
        } else {
            let end = rest.find('=').ok_or_else(usage)?;
            (&rest[..end], &rest[end..])
        };
    let value = after
        .strip_prefix('=')
        .ok_or_else(|| Error::usage(format!("--for needs the value to wait for: {text}=VALUE")))?;
    let expression = expression.trim();
    let expression = expression
        .strip_prefix('{')
        .and_then(|e| e.strip_suffix('}'))
        .unwrap_or(expression);
    let path = Path::parse(expression.trim()).map_err(Error::usage)?;
    Ok(Condition {
        path,
        value: value.to_string(),
    })
}

/// Whether an object's phase is one it never leaves.
fn finished_phase(object: &Value) -> Option<&str> {
    object
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .filter(|phase| matches!(*phase, "Succeeded" | "Failed" | "Cancelled"))
}

/// The progress line: `agentrun/NAME  Running  turns 2  $0.0012/$0.50` (without the time).
pub fn progress_line(kind: Kind, name: &str, object: &Value) -> String {
    let text = |pointer: &str| object.pointer(pointer).and_then(Value::as_str);
    let mut parts = vec![format!("{}/{name}", kind.singular())];
    if let Some(phase) = text("/status/phase") {
        match text("/status/reason") {
            Some(reason) => parts.push(format!("{phase} ({reason})")),
            None => parts.push(phase.to_string()),
        }
    }
    let count = |pointer: &str| object.pointer(pointer).and_then(Value::as_u64).unwrap_or(0);
    match kind {
        Kind::AgentRun => {
            let turns = object
                .pointer("/status/turns")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            parts.push(format!("turns {turns}"));
        }
        Kind::AgentGroup => {
            let total: u64 = [
                "queued",
                "active",
                "waiting",
                "succeeded",
                "failed",
                "cancelled",
            ]
            .iter()
            .map(|c| count(&format!("/status/counts/{c}")))
            .sum();
            parts.push(format!(
                "runs {}/{total}",
                count("/status/counts/succeeded")
            ));
            parts.push(format!("active {}", count("/status/counts/active")));
        }
        _ => {}
    }
    if text("/status/phase") == Some("NeedsResolution") {
        parts.push(format!(
            "(see nodus agentrun steps {name}, then nodus agentrun resolve {name} --action …)"
        ));
    }
    if let Some(cost) = text("/status/cost/totalUSD") {
        match text("/status/cost/limitUSD") {
            Some(limit) => parts.push(format!("${cost}/${limit}")),
            None => parts.push(format!("${cost}")),
        }
    }
    parts.join("  ")
}

/// Where progress goes: a live line when standard error is a terminal, nowhere otherwise
/// (the server being unreachable is still said, once per reason).
struct Progress {
    live: bool,
    last: String,
    width: usize,
}

impl Progress {
    fn new() -> Progress {
        let width = std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.parse::<usize>().ok())
            .unwrap_or(80)
            .max(20);
        Progress {
            live: std::io::stderr().is_terminal(),
            last: String::new(),
            width,
        }
    }

    fn show(&mut self, line: &str, elapsed: Duration) {
        if self.live {
            let mut stderr = std::io::stderr().lock();
            let full = format!(
                "{line}  {}",
                duration::display(Duration::from_secs(elapsed.as_secs()))
            );
            let shown: String = full.chars().take(self.width - 1).collect();
            let _ = write!(stderr, "\r\x1b[2K{shown}");
            let _ = stderr.flush();
        }
        self.last = line.to_string();
    }

    /// A note that is not progress (the server unreachable): the live line on a terminal,
    /// otherwise a line of its own when it changes.
    fn note(&mut self, line: &str, elapsed: Duration) {
        if !self.live && line != self.last {
            let _ = writeln!(std::io::stderr().lock(), "{line}");
        }
        self.show(line, elapsed);
    }

    fn clear(&self) {
        if self.live {
            let mut stderr = std::io::stderr().lock();
            let _ = write!(stderr, "\r\x1b[2K");
            let _ = stderr.flush();
        }
    }
}

pub async fn run(client: &Client, args: WaitArgs) -> Result<()> {
    let (kind, name) = parse_target(&args.target)?;
    let condition = parse_condition(&args.condition)?;
    let timeout = duration::parse(&args.timeout).map_err(Error::usage)?;
    let started = Instant::now();
    let deadline = started + timeout;
    let mut progress = Progress::new();
    let mut seen = false;
    let mut last_value: Option<String> = None;
    let mut last_line: Option<String> = None;
    // The version read last: the next request waits for a newer one.
    let mut version: Option<String> = None;
    let timed_out = |last_value: Option<String>| {
        Error::Timeout(format!(
            "timed out after {} waiting for {}/{name}: {} is {}, not {:?}",
            duration::display(timeout),
            kind.singular(),
            condition.path.display(),
            last_value.map_or_else(|| "not set".to_string(), |v| format!("{v:?}")),
            condition.value,
        ))
    };
    loop {
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .min(LONG_POLL)
            .as_secs()
            .max(1)
            .to_string();
        let query: Vec<(&str, &str)> = match &version {
            Some(version) => vec![
                ("watch", "true"),
                ("resourceVersion", version),
                ("timeoutSeconds", &wait),
            ],
            None => Vec::new(),
        };
        let answer = {
            let path = [kind.plural(), name.as_str()];
            let request = client.call(Method::GET, &path, &query, None);
            tokio::pin!(request);
            let mut tick = tokio::time::interval(TICK);
            tick.tick().await;
            loop {
                tokio::select! {
                    answer = &mut request => break Some(answer),
                    () = tokio::time::sleep_until(deadline.into()) => break None,
                    _ = tick.tick() => {
                        if let Some(line) = &last_line {
                            progress.show(line, started.elapsed());
                        }
                    }
                }
            }
        };
        let unchanged = match answer {
            None => {
                progress.clear();
                return Err(timed_out(last_value));
            }
            Some(Ok(object)) => {
                seen = true;
                let actual = condition.path.text(&object);
                if actual.as_deref() == Some(condition.value.as_str()) {
                    progress.clear();
                    outln(&format!("{} condition met", qualified(kind, &name)));
                    return Ok(());
                }
                if condition.path.reads_status()
                    && let Some(phase) = finished_phase(&object)
                {
                    progress.clear();
                    return Err(Error::NeverMet(never_message(
                        kind, &name, phase, &object, &condition,
                    )));
                }
                let line = progress_line(kind, &name, &object);
                progress.show(&line, started.elapsed());
                last_line = Some(line);
                last_value = actual;
                let read = object
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                let unchanged = read.is_none() || read == version;
                version = read;
                unchanged
            }
            Some(Err(Error::Unreachable { reason, .. })) if seen => {
                let line = format!(
                    "{}/{name}  server unreachable ({reason}); retrying",
                    kind.singular()
                );
                progress.note(&line, started.elapsed());
                last_line = Some(line);
                true
            }
            Some(Err(error)) => {
                progress.clear();
                return Err(error);
            }
        };
        let now = Instant::now();
        if now >= deadline {
            progress.clear();
            return Err(timed_out(last_value));
        }
        if unchanged {
            tokio::time::sleep(POLL.min(deadline - now)).await;
        }
    }
}

fn never_message(
    kind: Kind,
    name: &str,
    phase: &str,
    object: &Value,
    condition: &Condition,
) -> String {
    let text = |pointer: &str| object.pointer(pointer).and_then(Value::as_str);
    let mut why = phase.to_string();
    if let Some(reason) = text("/status/reason") {
        why.push_str(&format!(" ({reason})"));
    }
    if let Some(message) = text("/status/message") {
        why.push_str(&format!(": {message}"));
    }
    format!(
        "{}/{name} finished as {why}; {} will never be {:?}",
        kind.singular(),
        condition.path.display(),
        condition.value
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn conditions_parse_in_the_forms_shells_leave() {
        for text in [
            "jsonpath={.status.phase}=Succeeded",
            "jsonpath='{.status.phase}'=Succeeded",
            "jsonpath=\"{.status.phase}\"=Succeeded",
            "jsonpath=.status.phase=Succeeded",
            "jsonpath='.status.phase'=Succeeded",
        ] {
            let condition = parse_condition(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(condition.path.display(), "{.status.phase}", "{text}");
            assert_eq!(condition.value, "Succeeded", "{text}");
        }
        let labels = parse_condition("jsonpath={.metadata.labels['a=b']}=x=y").expect("valid");
        assert_eq!(labels.value, "x=y");
        for bad in [
            "condition=Ready",
            "jsonpath={.status.phase}",
            "jsonpath='{.status.phase}",
            "jsonpath={.status[?(@)]}=x",
        ] {
            assert!(parse_condition(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn progress_shows_phase_turns_and_cost() {
        let run = json!({"status": {"phase": "Running", "turns": [{}, {}], "cost": {"totalUSD": "0.0012", "limitUSD": "0.50"}}});
        assert_eq!(
            progress_line(Kind::AgentRun, "hello", &run),
            "agentrun/hello  Running  turns 2  $0.0012/$0.50"
        );
        let group = json!({"status": {"phase": "Running", "counts": {"queued": 1, "active": 2, "succeeded": 1}, "cost": {"totalUSD": "0.01"}}});
        assert_eq!(
            progress_line(Kind::AgentGroup, "g", &group),
            "agentgroup/g  Running  runs 1/4  active 2  $0.01"
        );
        let queued = json!({"status": {"phase": "Pending", "reason": "GroupWait"}});
        assert_eq!(
            progress_line(Kind::AgentRun, "q", &queued),
            "agentrun/q  Pending (GroupWait)  turns 0"
        );
    }

    #[test]
    fn a_finished_object_that_misses_the_condition_says_how_it_ended() {
        let failed = json!({"status": {"phase": "Failed", "reason": "DeadlineExceeded", "message": "the deadline passed"}});
        assert_eq!(finished_phase(&failed), Some("Failed"));
        assert_eq!(
            finished_phase(&json!({"status": {"phase": "NeedsResolution"}})),
            None
        );
        let condition = parse_condition("jsonpath={.status.phase}=Succeeded").expect("valid");
        assert_eq!(
            never_message(Kind::AgentRun, "r", "Failed", &failed, &condition),
            "agentrun/r finished as Failed (DeadlineExceeded): the deadline passed; {.status.phase} will never be \"Succeeded\""
        );
    }
}
