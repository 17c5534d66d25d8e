//! `nodus quickstart`: the first thing a newcomer runs. It starts the embedded default
//! (SQLite in the data directory, the bubblewrap sandbox, the model from `ANTHROPIC_API_KEY`
//! or the offline model) in this process, applies the spec's hello-agent and a run, waits for
//! it, and prints the answer, the turns with their cost, and the journaled steps.

use std::time::{Duration, Instant};

use nodus_core::engine::Reason;
use nodus_server::{Options, Server};
use serde_json::{Value, json};

use super::runs::{answer_text, steps_text};
use super::{out, outln};
use crate::cli::QuickstartArgs;
use crate::client::Client;
use crate::error::{Error, Result};

/// The prompt: it quotes its command in backticks, so the offline model can run it too.
const PROMPT: &str = "Use the shell to print the Python version: run `python3 --version`, then tell me which one it is.";

pub async fn run(args: QuickstartArgs) -> Result<()> {
    let data_dir = args.data_dir.unwrap_or_else(nodus_server::default_data_dir);
    let mut options = Options::new(data_dir.clone());
    // Any free port, so that a server already on 7070 does not get in the way.
    options.listen = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    // The launcher starts the sandboxes (bubblewrap where it cannot).
    options.sandbox_launcher = super::server::sandbox_launcher("launcher")?;
    let server = Server::build(options)
        .await
        .map_err(|e| Error::Start(format!("the embedded server cannot start: {e}")))?;
    for line in &server.announcements {
        eprintln!("quickstart: {line}");
    }
    let token_file = data_dir.join(nodus_server::auth::ADMIN_TOKEN_FILE);
    let token = std::fs::read_to_string(&token_file)
        .map(|t| t.trim().to_string())
        .map_err(|e| Error::Start(format!("cannot read {}: {e}", token_file.display())))?;
    let bound = server
        .bind()
        .await
        .map_err(|e| Error::Start(format!("the embedded server cannot listen: {e}")))?;
    let address = bound.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(bound.serve(async move {
        let _ = stopped.await;
    }));
    let result = walk(&Client::new(
        &format!("http://{address}"),
        &token,
        "default",
    )?)
    .await;
    let _ = stop.send(());
    let _ = serving.await;
    result
}

async fn walk(client: &Client) -> Result<()> {
    let agent = json!({
        "apiVersion": "nodus.dev/v1", "kind": "Agent", "metadata": {"name": "hello-agent"},
        "spec": {
            "system": "You are a careful assistant. Run shell commands in your sandbox to check your work, and answer in one short paragraph.\n",
            "model": {"access": "Nodus"},
            "perRunMaxCostUSD": "0.50"
        }
    });
    match client.post(&["agents"], agent).await {
        Ok(_) => eprintln!("quickstart: agent.nodus.dev/hello-agent created"),
        // Someone's own hello-agent is theirs: the quickstart runs it as it is.
        Err(error) if error.reason() == Some(Reason::AlreadyExists) => eprintln!(
            "quickstart: agent.nodus.dev/hello-agent exists already; it is used as it is, not \
             changed"
        ),
        Err(e) => return Err(e),
    }
    let mut name = run_name(jiff::Timestamp::now());
    for attempt in 1.. {
        let run = json!({
            "apiVersion": "nodus.dev/v1", "kind": "AgentRun", "metadata": {"name": name},
            "spec": {"agent": "hello-agent", "input": PROMPT}
        });
        match client.post(&["agentruns"], run).await {
            Err(error) if error.reason() == Some(Reason::AlreadyExists) && attempt < 100 => {
                name = format!("{}-{attempt}", run_name(jiff::Timestamp::now()));
            }
            Err(e) => return Err(e),
            Ok(_) => break,
        }
    }
    eprintln!("quickstart: agentrun.nodus.dev/{name} created; waiting for it");
    let started = Instant::now();
    let finished = loop {
        let run = client.get(&["agentruns", &name]).await?;
        let phase = run["status"]["phase"]
            .as_str()
            .unwrap_or("Pending")
            .to_string();
        if matches!(
            phase.as_str(),
            "Succeeded" | "Failed" | "Cancelled" | "NeedsResolution"
        ) || (phase == "Waiting" && run["status"]["reason"] != "AwaitingMessage")
        {
            break run;
        }
        if started.elapsed() > Duration::from_secs(8 * 60) {
            return Err(Error::Timeout(format!(
                "the run {name} is still {phase} after 8 minutes"
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    print_run(client, &name, &finished).await
}

/// A run name of its own for each quickstart: the time to the microsecond.
fn run_name(now: jiff::Timestamp) -> String {
    format!(
        "hello-agent-run-{}-{:06}",
        now.as_second(),
        now.subsec_microsecond()
    )
}

async fn print_run(client: &Client, name: &str, run: &Value) -> Result<()> {
    let status = &run["status"];
    outln(&format!(
        "run {name}: {}{}",
        status["phase"].as_str().unwrap_or("?"),
        status["reason"]
            .as_str()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default()
    ));
    outln("");
    outln("answer:");
    let answer = client.get(&["agentruns", name, "answer"]).await?;
    let terminal = crate::terminal::stdout_is_terminal();
    out(&answer_text(
        answer["answer"].as_str().unwrap_or("(no answer)"),
        terminal,
    ));
    outln("");
    outln("turns:");
    for (index, turn) in status["turns"].as_array().into_iter().flatten().enumerate() {
        outln(&format!(
            "  {index}: {} (chosen by {}), {} commands, ${}",
            turn["model"].as_str().unwrap_or("?"),
            turn["chosenBy"].as_str().unwrap_or("?"),
            turn["commands"],
            turn["costUSD"].as_str().unwrap_or("0")
        ));
    }
    outln(&format!(
        "  total: ${} of the run's cap ${}",
        status["cost"]["totalUSD"].as_str().unwrap_or("0"),
        status["cost"]["limitUSD"].as_str().unwrap_or("-")
    ));
    outln("");
    outln("steps:");
    let steps = client.get(&["agentruns", name, "steps"]).await?;
    let items = steps["items"].as_array().cloned().unwrap_or_default();
    out(&steps_text(&items, terminal));
    if status["phase"] != "Succeeded" {
        return Err(Error::Start(format!("the run ended {}", status["phase"])));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_quickstarts_in_one_second_name_their_runs_apart() {
        let first: jiff::Timestamp = "2026-05-01T12:00:00.100Z".parse().expect("time");
        let second: jiff::Timestamp = "2026-05-01T12:00:00.900Z".parse().expect("time");
        assert_ne!(run_name(first), run_name(second));
        assert_eq!(run_name(first), "hello-agent-run-1777636800-100000");
        assert!(run_name(first).len() <= 63, "a DNS label");
    }
}
