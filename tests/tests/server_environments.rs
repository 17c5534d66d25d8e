//! AgentEnvironments through a real `nodus server` and the CLI, on SQLite and on Postgres,
//! with the offline model (it runs the commands a prompt quotes in backticks): a Secret bound
//! to a variable reaches the command's environment and shows nowhere else (the run, its steps
//! with payloads, its answer, the environment as read back, the server's log); a plain
//! variable arrives; compute becomes the sandbox's limits (a command over its memory is
//! killed, one within it is not; `nproc` shows the environment's CPUs; on Docker the
//! container's CPU quota and memory are the environment's, and a command over its memory is
//! killed);
//! a reserved name, an unknown compute key and a GPU on the process sandbox are refused
//! naming the field, with nothing written; a Secret changed and then deleted after a run was
//! created (the run held back by its group) does not change the run, which sees the value it
//! was created with, and neither value shows anywhere either (the store keeps it sealed in the
//! run's private document, deleted with the run).

#[path = "support/server.rs"]
mod server;

use server::{Backend, ServerProcess};

const PLANTED: &str = "ghp-planted-value-5d1c9e7a33";

/// The value a held run's Secret has when the run is created, what it is changed to after,
/// and the SHA-256 of each (from `printf %s VALUE | sha256sum`).
const ORIGINAL: &str = "pinned-original-3f9a61c2";
const CHANGED: &str = "pinned-changed-77d0b4e8";
const ORIGINAL_SHA256: &str = "77d91ae4db08e5bb60caef9b05343d40b1cbfcd41008638b9c2ab0f7474715a1";
const CHANGED_SHA256: &str = "1aaa1def30429847c50bf6bb480a4eff7733664f327eaa9ed51086f09519b9d1";

const RESOURCES: &str = "apiVersion: nodus.dev/v1\nkind: Secret\nmetadata:\n  name: github\nstringData:\n  token: \"ghp-planted-value-5d1c9e7a33\"\n---\napiVersion: nodus.dev/v1\nkind: AgentEnvironment\nmetadata:\n  name: research\nspec:\n  env:\n  - {name: LOG_LEVEL, value: debug}\n  - name: GITHUB_TOKEN\n    valueFrom: {secretKeyRef: {name: github, key: token}}\n  compute: {cpu: \"1\", memory: 64Mi, nvidia.com/gpu: 0}\n---\napiVersion: nodus.dev/v1\nkind: AgentEnvironment\nmetadata:\n  name: two-cpus\nspec:\n  compute: {cpu: \"2\"}\n---\napiVersion: nodus.dev/v1\nkind: Agent\nmetadata:\n  name: env-agent\nspec:\n  system: You are a careful assistant.\n  perRunMaxCostUSD: \"0.50\"\n";

/// The rows `sql` selects from the server's store, one a line (sqlite3 or psql on it).
fn query(store: &str, sql: &str) -> String {
    let output = match store.strip_prefix("sqlite://") {
        Some(path) => std::process::Command::new("sqlite3")
            .args([path, sql])
            .output(),
        // The server keeps its tables in the schema `nodus`.
        None => std::process::Command::new("psql")
            .args([store, "-At", "-c", sql])
            .env("PGOPTIONS", "-c search_path=nodus")
            .output(),
    }
    .expect("the database client runs");
    assert!(output.status.success(), "{sql}: {output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Create run `name` of `env-agent` with `prompt` (and `--environment` when given), wait
/// until it ends, and return its answer.
fn run(server: &ServerProcess, name: &str, prompt: &str, environment: Option<&str>) -> String {
    let mut create = vec![
        "create",
        "agentrun",
        name,
        "--agent",
        "env-agent",
        "--prompt",
        prompt,
    ];
    if let Some(environment) = environment {
        create.extend(["--environment", environment]);
    }
    server.ok(&create);
    server.ok(&[
        "wait",
        &format!("agentrun/{name}"),
        "--for=jsonpath={.status.phase}=Succeeded",
        "--timeout=2m",
    ]);
    server.ok(&["agentrun", "answer", name])
}

fn environments(backend: Backend) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = backend.store_url(dir.path());
    let server = ServerProcess::start_in_env(
        &store,
        dir.path(),
        "process",
        &[],
        &[("NODUS_LOG", "debug")],
    );
    let output = server.cli_in(&["apply", "-f", "-"], Some(RESOURCES));
    assert!(output.status.success(), "{output:?}");

    // The Secret and the plain variable reach the command; the value is compared inside the
    // sandbox, so the run's output does not hold it.
    let answer = run(
        &server,
        "secret-run",
        "Run `printf 'reversed=%s\\n' \"$(printf %s \"$GITHUB_TOKEN\" | rev)\"; echo level=$LOG_LEVEL` \
         and tell me.",
        Some("research"),
    );
    let reversed: String = PLANTED.chars().rev().collect();
    assert!(answer.contains(&format!("reversed={reversed}")), "{answer}");
    assert!(answer.contains("level=debug"), "{answer}");
    let created: serde_json::Value =
        serde_json::from_str(&server.ok(&["get", "agentrun/secret-run", "-o", "json"]))
            .expect("JSON");
    let snapshot = &created["status"]["snapshot"]["environment"];
    assert_eq!(snapshot["environmentRef"], "default/research", "{created}");
    assert_eq!(snapshot["secrets"][0]["name"], "github", "{created}");
    assert!(
        snapshot["secrets"][0]["resourceVersion"].is_string(),
        "{created}"
    );

    // Within its memory a command runs; past it, it is killed (the environment's 64 MiB, not
    // the server's 1 GiB).
    let answer = run(
        &server,
        "small-enough",
        "Run `head -c 16000000 /dev/zero | tail -c 16000000 | wc -c | sed s/^/bytes=/; echo cpus=$(nproc)` and tell me.",
        Some("research"),
    );
    assert!(answer.contains("bytes=16000000"), "{answer}");
    // `nproc` shows the environment's CPUs (the sandbox is pinned to that many of the host's).
    let host = std::thread::available_parallelism().map_or(1, |n| n.get());
    // The figure `nproc` printed (on a line of its own, unlike the command's text).
    let cpus = |text: &str| {
        text.split("\ncpus=").nth(1).map(|rest| {
            rest.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        })
    };
    assert_eq!(cpus(&answer).as_deref(), Some("1"), "{answer}");
    let answer = run(
        &server,
        "memory-hog",
        "Run `head -c 200000000 /dev/zero | tail -c 200000000 | wc -c | sed s/^/bytes=/` and tell me.",
        Some("research"),
    );
    // wc's output line (the quoted command names `bytes=` too).
    assert!(answer.lines().any(|l| l.starts_with("bytes=")), "{answer}");
    assert!(!answer.contains("bytes=200000000"), "{answer}");
    let roomy = run(
        &server,
        "roomy",
        "Run `head -c 200000000 /dev/zero | tail -c 200000000 | wc -c | sed s/^/bytes=/; echo cpus=$(nproc)` and tell me.",
        Some("two-cpus"),
    );
    assert!(roomy.contains("bytes=200000000"), "{roomy}");
    assert_eq!(cpus(&roomy), Some(host.min(2).to_string()), "{roomy}");

    // A Secret changed and then deleted after a run was created (held back by its group
    // until a dependency ends) does not change the run: it sees the value it was created
    // with. The command prints only a hash of it.
    let output = server.cli_in(
        &["apply", "-f", "-"],
        Some(&format!(
            "apiVersion: nodus.dev/v1\nkind: Secret\nmetadata:\n  name: pinned\nstringData:\n  token: \"{ORIGINAL}\"\n---\napiVersion: nodus.dev/v1\nkind: AgentGroup\nmetadata:\n  name: hold\nspec:\n  agent: env-agent\n  maxCostUSD: \"5.00\"\n---\napiVersion: nodus.dev/v1\nkind: AgentRun\nmetadata:\n  name: hold-holder\nspec:\n  agent: env-agent\n  group: hold\n  taskKey: holder\n  keepAlive: true\n  input: Run `echo holding` and tell me.\n"
        )),
    );
    assert!(output.status.success(), "{output:?}");
    server.ok(&[
        "wait",
        "agentrun/hold-holder",
        "--for=jsonpath={.status.phase}=Waiting",
        "--timeout=2m",
    ]);
    let output = server.cli_in(
        &["apply", "-f", "-"],
        Some(
            "apiVersion: nodus.dev/v1\nkind: AgentRun\nmetadata:\n  name: hold-pinned\nspec:\n  agent: env-agent\n  group: hold\n  taskKey: pinned\n  dependsOn: [holder]\n  environment:\n    env:\n    - name: TOKEN\n      valueFrom: {secretKeyRef: {name: pinned, key: token}}\n  input: Run `printf %s \"$TOKEN\" | sha256sum | sed s/^/hash=/` and tell me.\n",
        ),
    );
    assert!(output.status.success(), "{output:?}");
    let output = server.cli_in(
        &["apply", "-f", "-"],
        Some(&format!(
            "apiVersion: nodus.dev/v1\nkind: Secret\nmetadata:\n  name: pinned\nstringData:\n  token: \"{CHANGED}\"\n"
        )),
    );
    assert!(output.status.success(), "{output:?}");
    let held: serde_json::Value =
        serde_json::from_str(&server.ok(&["get", "agentrun/hold-pinned", "-o", "json"]))
            .expect("JSON");
    assert_eq!(held["status"]["phase"], "Pending", "still held: {held}");
    server.ok(&["delete", "secret/pinned"]);
    server.ok(&["agentrun", "close", "hold-holder"]);
    server.ok(&[
        "wait",
        "agentrun/hold-pinned",
        "--for=jsonpath={.status.phase}=Succeeded",
        "--timeout=2m",
    ]);
    let answer = server.ok(&["agentrun", "answer", "hold-pinned"]);
    assert!(
        answer.contains(&format!("hash={ORIGINAL_SHA256}")),
        "{answer}"
    );
    assert!(!answer.contains(CHANGED_SHA256), "{answer}");

    // The values show nowhere but in the sandbox.
    let mut seen: Vec<(String, String)> = Vec::new();
    for name in ["secret-run", "small-enough", "memory-hog", "hold-pinned"] {
        seen.extend(server.run_texts(name, dir.path()));
    }
    seen.push((
        "the environment".to_string(),
        server.ok(&["get", "agentenvironment/research", "-o", "yaml"]),
    ));
    seen.push((
        "the server's log".to_string(),
        std::fs::read_to_string(&server.log).expect("log"),
    ));
    for (place, text) in &seen {
        for value in [PLANTED, ORIGINAL, CHANGED] {
            assert!(
                !text.contains(value),
                "the Secret's {value} shows in {place}:\n{text}"
            );
        }
    }

    // In the store the values are only sealed, in the run's private document, which goes
    // with the run.
    let private = "SELECT count(*) FROM resources WHERE kind = 'workdirarchives' AND name = \
                   'hold-pinned' AND CAST(document AS TEXT) LIKE '%pinnedSecrets%'";
    assert_eq!(query(&store, private).trim(), "1");
    for value in [PLANTED, ORIGINAL, CHANGED] {
        let anywhere =
            format!("SELECT count(*) FROM resources WHERE CAST(document AS TEXT) LIKE '%{value}%'");
        assert_eq!(query(&store, &anywhere).trim(), "0", "{value} in the store");
    }
    server.ok(&["delete", "agentrun/hold-pinned"]);
    assert_eq!(query(&store, private).trim(), "0", "kept after the run");

    // Refused at creation, naming the field, with nothing written.
    let refusals = [
        (
            "apiVersion: nodus.dev/v1\nkind: AgentEnvironment\nmetadata:\n  name: reserved\nspec:\n  env:\n  - {name: PATH, value: /tmp}\n",
            "spec.env[0].name",
            "agentenvironment/reserved",
        ),
        (
            "apiVersion: nodus.dev/v1\nkind: AgentEnvironment\nmetadata:\n  name: tpu\nspec:\n  compute: {tpu: 1}\n",
            "spec.compute.tpu",
            "agentenvironment/tpu",
        ),
        (
            "apiVersion: nodus.dev/v1\nkind: AgentRun\nmetadata:\n  name: gpu-run\nspec:\n  agent: env-agent\n  input: hello\n  environment:\n    compute: {nvidia.com/gpu: 1}\n",
            "spec.environment.compute.nvidia.com/gpu",
            "agentrun/gpu-run",
        ),
        (
            "apiVersion: nodus.dev/v1\nkind: AgentRun\nmetadata:\n  name: no-secret\nspec:\n  agent: env-agent\n  input: hello\n  environment:\n    env:\n    - name: TOKEN\n      valueFrom: {secretKeyRef: {name: github, key: missing}}\n",
            "spec.environment.env[0].valueFrom.secretKeyRef",
            "agentrun/no-secret",
        ),
        (
            "apiVersion: nodus.dev/v1\nkind: AgentEnvironment\nmetadata:\n  name: inject\nspec:\n  network:\n    egress: allowlist\n    inject:\n    - host: api.github.com\n      header: Authorization\n      valueFrom: {secretKeyRef: {name: github, key: token}}\n",
            "spec.network.inject[0]",
            "agentenvironment/inject",
        ),
        (
            "apiVersion: nodus.dev/v1\nkind: AgentRun\nmetadata:\n  name: wide-cidr\nspec:\n  agent: env-agent\n  input: hello\n  environment:\n    network:\n      egress: allowlist\n      allow:\n      - cidr: 10.0.0.0/8\n",
            "spec.environment.network.allow[0].cidr",
            "agentrun/wide-cidr",
        ),
    ];
    for (document, field, object) in refusals {
        let output = server.cli_in(&["apply", "-f", "-"], Some(document));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{document} was accepted");
        assert!(stderr.contains(field), "{field} not named: {stderr}");
        let missing = server.cli(&["get", object]);
        assert!(!missing.status.success(), "{object} was written");
    }
}

#[test]
fn environments_on_sqlite() {
    environments(Backend::Sqlite);
}

#[test]
fn environments_on_postgres() {
    environments(Backend::Postgres);
}

/// On Docker the container gets the environment's CPU quota and memory.
#[test]
fn compute_is_the_containers_limits_on_docker() {
    let image = std::env::var("NODUS_TEST_DOCKER_IMAGE").unwrap_or_else(|_| {
        panic!("NODUS_TEST_DOCKER_IMAGE is not set: run the tests with ./scripts/test, which builds the test image")
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Backend::Sqlite.store_url(dir.path());
    let server =
        ServerProcess::start_with(&store, dir.path(), "docker", &["--default-image", &image]);
    let output = server.cli_in(
        &["apply", "-f", "-"],
        Some(
            "apiVersion: nodus.dev/v1\nkind: AgentEnvironment\nmetadata:\n  name: half\nspec:\n  compute: {cpu: 500m, memory: 96Mi}\n---\napiVersion: nodus.dev/v1\nkind: Agent\nmetadata:\n  name: env-agent\nspec:\n  system: You are a careful assistant.\n",
        ),
    );
    assert!(output.status.success(), "{output:?}");
    let answer = run(
        &server,
        "cpu-run",
        "Run `cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/cpu.max /sys/fs/cgroup/memory.max` and tell me.",
        Some("half"),
    );
    // The command names neither figure, so they come from its output.
    assert!(answer.contains("50000"), "{answer}");
    assert!(answer.contains(&(96u64 << 20).to_string()), "{answer}");
    // Over its memory a command is killed; within it, it runs.
    let answer = run(
        &server,
        "docker-hog",
        "Run `head -c 200000000 /dev/zero | tail -c 200000000 | wc -c | sed s/^/bytes=/; head -c 16000000 /dev/zero | tail -c 16000000 | wc -c | sed s/^/small=/` and tell me.",
        Some("half"),
    );
    assert!(answer.contains("small=16000000"), "{answer}");
    assert!(!answer.contains("bytes=200000000"), "{answer}");
}
