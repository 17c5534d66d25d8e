//! The README's CLI walkthrough, run as written: the commands of the `sh` blocks of its
//! "## CLI" section are read from README.md when the test runs (so the test breaks when the
//! README drifts) and each is run by `sh -c` with the real `nodus` binary first on PATH,
//! against a real `nodus server` (SQLite in a temporary data directory, the bubblewrap
//! sandbox, the offline model).
//!
//! Two lines are replaced by the test's own equivalents: `nodus server &` by the test's server
//! (on a free port, with a known admin token), and `nodus login` by a login to that server
//! with that token. Every other line must exit 0. The working directory is a temporary one
//! with `examples` linked to the repository's, so files the walkthrough writes land there.

mod support;

use std::path::Path;
use std::process::Command;

use support::{NODUS, ROOT, login, start_server, text};

/// The commands of the `sh` code blocks in the README's `## CLI` section, in order.
fn walkthrough(readme: &str) -> Vec<String> {
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("CLI\n"))
        .expect("README.md has a ## CLI section");
    let mut commands = Vec::new();
    let mut in_block = false;
    for line in section.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            in_block = !in_block && trimmed == "```sh";
            continue;
        }
        if in_block && !trimmed.is_empty() && !trimmed.starts_with('#') {
            commands.push(trimmed.to_string());
        }
    }
    commands
}

fn run_line(dir: &Path, line: &str) -> std::process::Output {
    let bin = Path::new(NODUS).parent().expect("the binary's directory");
    let path = std::env::var("PATH").unwrap_or_default();
    Command::new("sh")
        .args(["-c", line])
        .current_dir(dir.join("work"))
        .env("PATH", format!("{}:{path}", bin.display()))
        .env("XDG_CONFIG_HOME", dir.join("config"))
        .env_remove("NODUS_CONFIG")
        .env_remove("NODUS_SERVER")
        .env_remove("NODUS_TOKEN")
        .env_remove("NODUS_PROJECT")
        .env_remove("ANTHROPIC_API_KEY")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("sh runs")
}

#[test]
fn the_readme_cli_walkthrough_runs_as_written() {
    let readme = std::fs::read_to_string(format!("{ROOT}/README.md")).expect("README.md");
    let commands = walkthrough(&readme);
    // The walkthrough is all there: the run, its working directory, and the group to its end.
    for expected in [
        "nodus apply -f examples/agent.yaml -f examples/run.yaml",
        "nodus agentrun workdir review-config review-config.tar",
        "nodus patch ag/parallel-agents --patch '{\"spec\":{\"sealed\":true}}'",
        "nodus agentrun answer parallel-agents-c",
    ] {
        assert!(
            commands.iter().any(|c| c.starts_with(expected)),
            "{expected} in {commands:#?}"
        );
    }

    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path();
    std::fs::create_dir_all(dir.join("work")).expect("mkdir");
    std::os::unix::fs::symlink(format!("{ROOT}/examples"), dir.join("work/examples"))
        .expect("link examples");
    let mut server = None;
    let mut outputs = Vec::new();
    for line in &commands {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["nodus", "server", ..] => {
                server = Some(start_server(dir, None, "process"));
                continue;
            }
            ["nodus", "login", ..] => {
                login(dir, server.as_ref().expect("the server line comes first"));
                continue;
            }
            _ => {}
        }
        let output = run_line(dir, line);
        assert!(
            output.status.success(),
            "{line}\nexited {}:\nstdout: {}\nstderr: {}\nserver log:\n{}",
            output.status,
            text(&output.stdout),
            text(&output.stderr),
            server.as_ref().map(|s| s.log()).unwrap_or_default()
        );
        outputs.push((line.clone(), text(&output.stdout)));
    }
    let said = |prefix: &str| {
        outputs
            .iter()
            .find(|(line, _)| line.starts_with(prefix))
            .map(|(_, out)| out.clone())
            .unwrap_or_default()
    };

    // The offline model ran the command run.yaml quotes, in the sandbox.
    let answer = said("nodus agentrun answer hello-agent-run");
    assert!(answer.contains("python3 --version"), "{answer}");
    assert!(answer.contains("Python 3."), "{answer}");
    let archive = std::fs::metadata(dir.join("work/review-config.tar")).expect("the archive");
    assert!(archive.len() > 0);
    // The group ends where the spec says: Succeeded, every run with an answer.
    let groups = said("nodus get ag");
    assert!(
        groups.lines().any(|l| l.starts_with("parallel-agents ")
            && l.contains("Succeeded")
            && l.contains("3/3")),
        "{groups}"
    );
    let runs = said("nodus get ar --field-selector spec.group=parallel-agents");
    assert_eq!(runs.lines().count(), 4, "a header and three runs: {runs}");
    assert!(said("nodus agentrun answer parallel-agents-c").contains("[offline model]"));
}
