//! The CLI as a user meets it, through the real binaries (`nodus server` on an in-memory
//! store, the unisolated sandbox, the offline model): apply of the whole examples directory,
//! delete and get that go on past a missing object, re-applying a sealed group, cancel with
//! KIND NAME, and the server's --listen.

mod support;

use std::process::Command;
use std::time::Duration;

use support::{ROOT, Server, TOKEN, login, nodus, ok, start_server, text};

fn lines(text: &str) -> Vec<&str> {
    text.lines().collect()
}

#[test]
fn apply_of_the_examples_directory_works_on_an_empty_server_and_delete_goes_on_past_misses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path();
    let server = start_server(dir, Some("memory:"), "unisolated");
    login(dir, &server);
    let examples = format!("{ROOT}/examples/");

    // Secrets, FileSets and Agents before the group, the group before the runs; each kind in
    // file order (runs.yaml's c after the a and b it depends on).
    let applied = ok(dir, &["apply", "-f", &examples]);
    assert_eq!(
        lines(&applied),
        [
            "secret.nodus.dev/anthropic-key created",
            "secret.nodus.dev/github created",
            "agentenvironment.nodus.dev/research created",
            "fileset.nodus.dev/project-source created",
            "agent.nodus.dev/hello-agent created",
            "agent.nodus.dev/my-key-agent created",
            "agent.nodus.dev/parallel-agents-worker created",
            "agentgroup.nodus.dev/parallel-agents created",
            "agentrun.nodus.dev/hello-agent-run created",
            "agentrun.nodus.dev/parallel-agents-a created",
            "agentrun.nodus.dev/parallel-agents-b created",
            "agentrun.nodus.dev/parallel-agents-c created",
            "agentrun.nodus.dev/review-config created",
        ],
        "{applied}"
    );

    // Re-applying the unchanged group manifest to the sealed group leaves it sealed.
    let group = format!("{ROOT}/examples/group.yaml");
    ok(
        dir,
        &[
            "patch",
            "ag/parallel-agents",
            "--patch",
            r#"{"spec":{"sealed":true}}"#,
        ],
    );
    assert_eq!(
        ok(dir, &["apply", "-f", &group]),
        "agentgroup.nodus.dev/parallel-agents unchanged\n"
    );
    let wider = dir.join("wider-group.yaml");
    let manifest = std::fs::read_to_string(&group).expect("group.yaml");
    std::fs::write(&wider, manifest.replace("maxActive: 2 ", "maxActive: 3 ")).expect("write");
    assert_eq!(
        ok(dir, &["apply", "-f", wider.to_str().expect("utf-8")]),
        "agentgroup.nodus.dev/parallel-agents configured\n"
    );
    let spec = ok(
        dir,
        &[
            "get",
            "ag/parallel-agents",
            "-o",
            "jsonpath={.spec.sealed} {.spec.limits.maxActive}",
        ],
    );
    assert_eq!(spec, "true 3");

    // An error names the file and the document.
    let broken = dir.join("broken.yaml");
    std::fs::write(
        &broken,
        "apiVersion: nodus.dev/v1\nkind: Agent\nmetadata: {name: fine}\nspec:\n  system: s\n  model: {access: Nodus}\n  perRunMaxCostUSD: \"0.10\"\n---\napiVersion: nodus.dev/v1\nkind: Agent\nmetadata: {name: broken}\nspec:\n  system: s\n  model: {access: Nodus}\n  perRunMaxCostUSD: \"-1\"\n",
    )
    .expect("write");
    let broken = broken.to_str().expect("utf-8");
    let output = nodus(dir, &["apply", "-f", broken]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(text(&output.stdout), "agent.nodus.dev/fine created\n");
    let said = text(&output.stderr);
    assert!(
        said.starts_with(&format!(
            "Error from server (Invalid): {broken}: document 2: "
        )),
        "{said}"
    );
    assert!(said.contains("perRunMaxCostUSD"), "{said}");

    // get: the found ones are printed, each missing one is an error, exit 1.
    let output = nodus(
        dir,
        &[
            "get",
            "ar",
            "parallel-agents-a",
            "nope",
            "parallel-agents-b",
            "-o",
            "name",
        ],
    );
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    assert_eq!(
        lines(&text(&output.stdout)),
        [
            "agentrun.nodus.dev/parallel-agents-a",
            "agentrun.nodus.dev/parallel-agents-b"
        ]
    );
    assert_eq!(
        text(&output.stderr),
        "Error from server (NotFound): AgentRun \"nope\" not found\n"
    );

    // Every kind says when there is nothing.
    for kind in ["budgets", "secrets", "filesets"] {
        let output = nodus(dir, &["get", kind, "-l", "none=here"]);
        assert!(output.status.success());
        assert_eq!(
            text(&output.stderr),
            "No resources found in project default.\n",
            "{kind}"
        );
    }

    // Piped, an answer keeps the bytes of command output as they are (escape sequences
    // included); a terminal gets them escaped (unit tests of answer_text and steps_text).
    ok(
        dir,
        &[
            "create",
            "agentrun",
            "colours",
            "--agent",
            "hello-agent",
            "--prompt",
            r"Run `printf '\033[2J\033[31mred'`",
        ],
    );
    ok(
        dir,
        &[
            "wait",
            "agentrun/colours",
            "--for=jsonpath={.status.phase}=Succeeded",
            "--timeout=1m",
        ],
    );
    let answer = ok(dir, &["agentrun", "answer", "colours"]);
    assert!(answer.contains("\u{1b}[2J\u{1b}[31mred"), "{answer:?}");

    // cancel takes KIND NAME as get and delete do.
    ok(
        dir,
        &[
            "create",
            "agentrun",
            "long",
            "--agent",
            "hello-agent",
            "--prompt",
            "Run `sleep 30`",
        ],
    );
    assert_eq!(
        ok(dir, &["cancel", "agentrun", "long"]),
        "agentrun.nodus.dev/long cancelled\n"
    );

    // delete -f goes on past a missing object, reports it, and exits 1 at the end.
    let three = dir.join("three.yaml");
    std::fs::write(
        &three,
        "apiVersion: nodus.dev/v1\nkind: Agent\nmetadata: {name: hello-agent}\n---\napiVersion: nodus.dev/v1\nkind: Agent\nmetadata: {name: never-made}\n---\napiVersion: nodus.dev/v1\nkind: Agent\nmetadata: {name: fine}\n",
    )
    .expect("write");
    let three = three.to_str().expect("utf-8");
    let output = nodus(dir, &["delete", "-f", three]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    assert_eq!(
        lines(&text(&output.stdout)),
        [
            "agent.nodus.dev/hello-agent deleted",
            "agent.nodus.dev/fine deleted"
        ]
    );
    assert_eq!(
        text(&output.stderr),
        format!(
            "Error from server (NotFound): {three}: document 2: Agent \"never-made\" not found\n"
        )
    );

    // delete -f of the examples takes the runs before their group: nothing is missing but
    // what the test deleted already.
    let output = nodus(dir, &["delete", "-f", &examples]);
    let said = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{said}");
    assert_eq!(said.lines().count(), 1, "only hello-agent was gone: {said}");
    assert!(said.contains("Agent \"hello-agent\" not found"), "{said}");
    let deleted = text(&output.stdout);
    assert_eq!(deleted.lines().count(), 12, "{deleted}");
    assert!(
        deleted.find("agentrun.nodus.dev/parallel-agents-c deleted")
            < deleted.find("agentgroup.nodus.dev/parallel-agents deleted"),
        "{deleted}"
    );
}

#[test]
fn the_server_listens_on_a_host_name_and_a_busy_port_is_an_error_before_serving() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first_dir = dir.path().join("first");
    let second_dir = dir.path().join("second");
    std::fs::create_dir_all(&first_dir).expect("mkdir");
    std::fs::create_dir_all(&second_dir).expect("mkdir");
    let port = support::free_port();
    let listen = format!("localhost:{port}");
    let child = support::spawn_server(&first_dir, Some("memory:"), "unisolated", &listen);
    let first = support::wait_healthy(Server {
        child,
        log: first_dir.join("server.log"),
        port,
    });
    assert!(
        first
            .log()
            .contains(&format!("serving the API on http://127.0.0.1:{port}")),
        "{}",
        first.log()
    );

    let mut second = support::spawn_server(&second_dir, Some("memory:"), "unisolated", &listen);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = second.try_wait().expect("wait") {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the second server kept running"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let said = std::fs::read_to_string(second_dir.join("server.log")).expect("log");
    assert_eq!(status.code(), Some(1), "{said}");
    assert!(said.contains("cannot listen on"), "{said}");
    assert!(!said.contains("serving"), "{said}");
    assert!(!said.contains(TOKEN), "{said}");
}

/// `nodus server` on the SQLite store of `data` with the bubblewrap sandbox and its own
/// token file (the one the quickstart made), on a free port.
fn server_on(dir: &std::path::Path, data: &std::path::Path) -> Server {
    let port = support::free_port();
    let log = dir.join("server.log");
    let child = std::process::Command::new(support::NODUS)
        .args(["server", "--data-dir"])
        .arg(data)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("NODUS_BOOTSTRAP_TOKEN")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("nodus server starts");
    support::wait_healthy(Server { child, log, port })
}

#[test]
fn the_quickstart_survives_a_closed_stdout_and_leaves_an_existing_hello_agent_alone() {
    use std::io::BufRead as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path();
    let data = dir.join("data");
    let data_arg = data.to_str().expect("utf-8");

    // It runs its own server: --project and --context are refused, nothing is made.
    let output = nodus(
        dir,
        &["quickstart", "--project", "team", "--data-dir", data_arg],
    );
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("does not take --project"),
        "{}",
        text(&output.stderr)
    );
    assert!(!data.exists());

    // `nodus quickstart | head -1`: the first line is read, then the pipe closes.
    let mut child = support::command(dir)
        .args(["quickstart", "--data-dir", data_arg])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("quickstart starts");
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("a first line");
    let output = child.wait_with_output().expect("quickstart ends");
    let said = text(&output.stderr);
    assert!(first.starts_with("run hello-agent-run-"), "{first}\n{said}");
    assert!(first.trim_end().ends_with(": Succeeded"), "{first}\n{said}");
    assert_eq!(output.status.code(), Some(0), "{said}");
    assert!(!said.contains("panicked"), "{said}");

    // Someone changes hello-agent; the next quickstart uses it as it is.
    {
        let server = server_on(dir, &data);
        ok(
            dir,
            &["login", "--server", &server.url(), "--data-dir", data_arg],
        );
        let agent = std::fs::read_to_string(format!("{ROOT}/examples/agent.yaml"))
            .expect("agent.yaml")
            .replace("perRunMaxCostUSD: \"0.50\"", "perRunMaxCostUSD: \"0.40\"");
        let mine = dir.join("mine.yaml");
        std::fs::write(&mine, agent).expect("write");
        assert_eq!(
            ok(dir, &["apply", "-f", mine.to_str().expect("utf-8")]),
            "agent.nodus.dev/hello-agent configured\n"
        );
    }
    let output = nodus(dir, &["quickstart", "--data-dir", data_arg]);
    let said = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{said}");
    assert!(
        said.contains("agent.nodus.dev/hello-agent exists already; it is used as it is"),
        "{said}"
    );
    let server = server_on(dir, &data);
    ok(
        dir,
        &["login", "--server", &server.url(), "--data-dir", data_arg],
    );
    assert_eq!(
        ok(
            dir,
            &[
                "get",
                "agent/hello-agent",
                "-o",
                "jsonpath={.spec.perRunMaxCostUSD}"
            ]
        ),
        "0.40"
    );
    let runs = ok(dir, &["get", "ar", "-o", "name"]);
    assert_eq!(runs.lines().count(), 2, "two runs of their own: {runs}");
}

/// The server's count of answered requests (`nodus_http_requests_total`).
fn requests_answered(server: &Server) -> u64 {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", server.port)).expect("connects");
    let request = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    stream.write_all(request.as_bytes()).expect("writes");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("reads");
    answer
        .lines()
        .find_map(|line| line.strip_prefix("nodus_http_requests_total "))
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or_else(|| panic!("no request count in {answer}"))
}

#[test]
fn wait_waits_on_the_servers_long_poll_instead_of_polling() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path();
    let server = start_server(dir, Some("memory:"), "unisolated");
    login(dir, &server);
    let agent = dir.join("agent.yaml");
    std::fs::write(
        &agent,
        "apiVersion: nodus.dev/v1\nkind: Agent\nmetadata: {name: watched}\nspec: {system: You are careful., model: {access: Nodus}, perRunMaxCostUSD: \"0.50\"}\n",
    )
    .expect("write");
    ok(dir, &["apply", "-f", agent.to_str().expect("utf-8")]);
    let condition = "--for=jsonpath={.metadata.labels.team}=a";

    // Nothing changes for 3 s: a read and one long poll, not a dozen reads.
    let before = requests_answered(&server);
    let started = std::time::Instant::now();
    let output = nodus(dir, &["wait", "agent/watched", condition, "--timeout=3s"]);
    let took = started.elapsed();
    assert_eq!(output.status.code(), Some(4), "{}", text(&output.stderr));
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(6),
        "{took:?}"
    );
    let requests = requests_answered(&server) - before;
    assert!(requests <= 4, "{requests} requests in 3 s");

    // A change answers the wait at once.
    let mut waiting = support::command(dir)
        .args(["wait", "agent/watched", condition, "--timeout=60s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("wait starts");
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        waiting.try_wait().expect("wait").is_none(),
        "nothing changed yet"
    );
    let changed = std::time::Instant::now();
    ok(
        dir,
        &[
            "patch",
            "agent/watched",
            "--patch",
            r#"{"metadata":{"labels":{"team":"a"}}}"#,
        ],
    );
    let output = waiting.wait_with_output().expect("wait ends");
    assert!(
        changed.elapsed() < Duration::from_secs(3),
        "{:?} after the change",
        changed.elapsed()
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(
        text(&output.stdout),
        "agent.nodus.dev/watched condition met\n"
    );
}

/// Through the CLI and the real server: an agent whose contextSchema is not a valid JSON
/// Schema is refused at apply naming the path in the schema, and a run whose context fails
/// the schema is refused naming the path in the context, the keyword and the value; the
/// agent's runs are listed with `--field-selector status.snapshot.agentRef=PROJECT/NAME`.
#[test]
fn a_context_that_fails_the_agents_schema_is_refused_naming_the_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path();
    let server = start_server(dir, Some("memory:"), "unisolated");
    login(dir, &server);
    let agent = |schema: &str| {
        format!(
            "apiVersion: nodus.dev/v1\nkind: Agent\nmetadata: {{name: typed}}\nspec:\n  system: s\n  \
             model: {{access: Nodus}}\n  perRunMaxCostUSD: \"0.10\"\n  contextSchema: {schema}\n"
        )
    };
    let file = dir.join("agent.yaml");
    let path = file.to_str().expect("utf-8");
    std::fs::write(
        &file,
        agent("{type: object, properties: {ticket: {type: objekt}}}"),
    )
    .expect("write");
    let output = nodus(dir, &["apply", "-f", path]);
    assert_eq!(output.status.code(), Some(1));
    let said = text(&output.stderr);
    assert!(
        said.contains("spec.contextSchema.properties.ticket.type"),
        "{said}"
    );
    assert!(said.contains("JSON Schema 2020-12"), "{said}");

    std::fs::write(
        &file,
        agent(
            "{type: object, properties: {ticket: {type: object, properties: {id: {type: integer}}}}, required: [ticket]}",
        ),
    )
    .expect("write");
    assert_eq!(
        ok(dir, &["apply", "-f", path]),
        "agent.nodus.dev/typed created\n"
    );
    let run = dir.join("run.yaml");
    std::fs::write(
        &run,
        "apiVersion: nodus.dev/v1\nkind: AgentRun\nmetadata: {name: typed-run}\nspec:\n  agent: typed\n  \
         input: hi\n  context: {ticket: {id: seven}}\n",
    )
    .expect("write");
    let output = nodus(dir, &["apply", "-f", run.to_str().expect("utf-8")]);
    assert_eq!(output.status.code(), Some(1));
    let said = text(&output.stderr);
    for part in [
        "spec.context.ticket.id",
        "\"type\" at contextSchema#/properties/ticket/properties/id/type",
        "\"seven\"",
    ] {
        assert!(said.contains(part), "{part}: {said}");
    }
    let output = nodus(dir, &["get", "ar", "typed-run"]);
    assert_eq!(output.status.code(), Some(1), "nothing was written");

    // The agent's runs, listed by the reference they resolved to.
    std::fs::write(
        &run,
        "apiVersion: nodus.dev/v1\nkind: AgentRun\nmetadata: {name: typed-run}\nspec:\n  agent: default/typed\n  \
         input: hi\n  context: {ticket: {id: 7}}\n",
    )
    .expect("write");
    ok(dir, &["apply", "-f", run.to_str().expect("utf-8")]);
    let selected = |selector: &str| {
        ok(
            dir,
            &["get", "ar", "--field-selector", selector, "-o", "name"],
        )
    };
    assert_eq!(
        selected("status.snapshot.agentRef=default/typed"),
        "agentrun.nodus.dev/typed-run\n"
    );
    assert_eq!(selected("spec.agent=typed"), "");
}

/// Most people first run Nodus as themselves: the quickstart as an ordinary user (uid 65534
/// through `setpriv` when the tests run as root) with its own home and data directory runs its
/// command in bubblewrap and succeeds, on the limits that user may have (cgroups it cannot
/// make give way to rlimits, said at start), instead of failing with SandboxFailed.
#[test]
fn the_quickstart_runs_as_an_unprivileged_user() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    std::fs::create_dir(&home).expect("home");
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let mut command = if root {
        // The user's own directories: readable on the way down, its home its own.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let chowned = Command::new("chown")
            .args(["65534:65534"])
            .arg(&home)
            .status()
            .expect("chown");
        assert!(chowned.success());
        let mut command = Command::new("setpriv");
        command.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            support::NODUS,
        ]);
        command
    } else {
        Command::new(support::NODUS)
    };
    let output = command
        .arg("quickstart")
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
        .env("HOME", &home)
        .env("XDG_DATA_HOME", home.join(".local/share"))
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .current_dir(&home)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("quickstart runs");
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("run hello-agent-run-"), "{stdout}");
    assert!(
        stdout
            .lines()
            .next()
            .is_some_and(|l| l.ends_with(": Succeeded")),
        "{stdout}\n{stderr}"
    );
    assert!(stdout.contains("Python 3"), "{stdout}");
    // Its data directory is its own, and it says at start which limits hold.
    assert!(
        home.join(".local/share/nodus/nodus.db").exists(),
        "{stderr}"
    );
    assert!(stderr.contains("quickstart: sandbox limits: "), "{stderr}");
}

/// The lines a child prints on standard output, as they come.
fn stdout_lines(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead as _;
    let stdout = child.stdout.take().expect("piped");
    let (send, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if send.send(line).is_err() {
                return;
            }
        }
    });
    lines
}

#[test]
fn get_watch_prints_the_list_then_each_change_as_it_comes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path();
    let server = start_server(dir, Some("memory:"), "unisolated");
    login(dir, &server);
    let agent = |name: &str| {
        let path = dir.join(format!("{name}.yaml"));
        std::fs::write(
            &path,
            format!("apiVersion: nodus.dev/v1\nkind: Agent\nmetadata: {{name: {name}}}\nspec: {{system: You are careful., model: {{access: Nodus}}, perRunMaxCostUSD: \"0.50\"}}\n"),
        )
        .expect("write");
        ok(dir, &["apply", "-f", path.to_str().expect("utf-8")]);
    };
    agent("first");
    let patience = Duration::from_secs(20);

    let mut list = support::command(dir)
        .args(["get", "agents", "-w"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("get -w starts");
    let lines = stdout_lines(&mut list);
    let mut one = support::command(dir)
        .args([
            "get",
            "agent",
            "first",
            "-w",
            "-o",
            "jsonpath={.metadata.labels.team}{\"\\n\"}",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("get NAME -w starts");
    let labels = stdout_lines(&mut one);
    let header = lines.recv_timeout(patience).expect("the table's header");
    assert!(header.starts_with("NAME"), "{header}");
    let row = lines.recv_timeout(patience).expect("the agent there is");
    assert!(row.starts_with("first "), "{row}");
    assert_eq!(labels.recv_timeout(patience).expect("the object"), "");

    // Each change, as a row without the header.
    agent("second");
    let row = lines
        .recv_timeout(patience)
        .expect("a row for the new agent");
    assert!(row.starts_with("second "), "{row}");
    ok(
        dir,
        &[
            "patch",
            "agent/first",
            "--patch",
            r#"{"metadata":{"labels":{"team":"a"}}}"#,
        ],
    );
    let row = lines.recv_timeout(patience).expect("a row for the change");
    assert!(row.starts_with("first "), "{row}");
    // The watch of one object prints its changes only.
    assert_eq!(labels.recv_timeout(patience).expect("the change"), "a");
    for mut child in [list, one] {
        let _ = child.kill();
        let _ = child.wait();
    }
}
