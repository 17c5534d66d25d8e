//! What the conformance suite does not cover of the Docker backend: re-attaching after a
//! restart (to a running or a stopped container), the command channel's fidelity, removing orphans, the limits and labels a
//! container gets, the CPUs it runs on (`nproc`), the image a spec names, and the error when the engine cannot be reached.
//!
//! Needs `NODUS_TEST_DOCKER_IMAGE` (set by `scripts/test-env`) and a reachable engine; fails
//! and says so otherwise.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use nodus_core::Sandbox;
use nodus_core::sandbox::{Error, SandboxSpec};
use nodus_sandbox::conformance::{request, test_limits, unique_key};
use nodus_sandbox::{DockerConfig, DockerSandbox};

fn image() -> String {
    std::env::var("NODUS_TEST_DOCKER_IMAGE").unwrap_or_else(|_| {
        panic!(
            "NODUS_TEST_DOCKER_IMAGE is not set: run `eval \"$(scripts/test-env start)\"` first \
             (it starts dockerd and builds the test image)"
        )
    })
}

async fn backend(prefix: &str) -> DockerSandbox {
    let mut config = DockerConfig::new(image());
    config.name_prefix = prefix.to_owned();
    DockerSandbox::connect(config)
        .await
        .unwrap_or_else(|e| panic!("Docker is not reachable: {e}"))
}

fn spec(key: &str) -> SandboxSpec {
    SandboxSpec {
        key: key.to_owned(),
        image: None,
        env: BTreeMap::new(),
        limits: test_limits(),
        network: false,
        egress: None,
        egress_headers: Vec::new(),
        links: Default::default(),
    }
}

/// `docker inspect -f FORMAT NAME`, or `None` when there is no such object.
fn inspect(kind: &str, format: &str, name: &str) -> Option<String> {
    let out = Command::new("docker")
        .args([kind, "inspect", "-f", format, name])
        .output()
        .expect("run docker");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[tokio::test]
async fn a_restarted_server_reattaches_to_running_and_stopped_containers() {
    let key = unique_key("reattach");
    let first = backend("nodus-").await;
    let id = first.create(&spec(&key)).await.expect("create").id;
    let container = inspect("container", "{{.Id}}", &id.0).expect("the container");
    let out = first
        .exec(&id, &request("echo kept > state"))
        .await
        .expect("exec");
    assert_eq!(out.exit_code, Some(0));
    drop(first);

    // A new backend value, as after a restart: exec needs create first.
    let again = backend("nodus-").await;
    assert_eq!(
        again.exec(&id, &request("true")).await,
        Err(Error::NotFound(id.clone()))
    );
    assert_eq!(again.create(&spec(&key)).await.expect("re-attach").id, id);
    assert_eq!(
        inspect("container", "{{.Id}}", &id.0).as_deref(),
        Some(container.as_str()),
        "the same container"
    );
    let out = again.exec(&id, &request("cat state")).await.expect("exec");
    assert_eq!(out.stdout.bytes, b"kept\n");

    // A container that stopped (an engine restart) is started again, files and all.
    let stopped = Command::new("docker")
        .args(["stop", "-t", "0", &id.0])
        .output()
        .expect("docker stop");
    assert!(stopped.status.success(), "{stopped:?}");
    let again = backend("nodus-").await;
    again
        .create(&spec(&key))
        .await
        .expect("re-attach to a stopped one");
    let out = again.exec(&id, &request("cat state")).await.expect("exec");
    assert_eq!(out.stdout.bytes, b"kept\n");

    again.destroy(&id).await.expect("destroy");
    assert_eq!(inspect("container", "{{.Id}}", &id.0), None);
    assert_eq!(inspect("volume", "{{.Name}}", &id.0), None);
}

/// Commands reach the container's first process over its stdin, byte for byte; a container
/// restarted behind the backend's back (which ends that attachment) serves the next command.
#[tokio::test]
async fn commands_travel_byte_for_byte_and_survive_a_container_restart() {
    let sandbox = backend("nodus-").await;
    let id = sandbox
        .create(&spec(&unique_key("channel")))
        .await
        .expect("create")
        .id;
    let command =
        "cat <<'EOF'\nquote ' double \" back \\ tab \t bell \u{7} \u{10}\u{11} é\n  $HOME `x`\nEOF";
    let out = sandbox.exec(&id, &request(command)).await.expect("exec");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout.bytes),
        "quote ' double \" back \\ tab \t bell \u{7} \u{10}\u{11} é\n  $HOME `x`\n"
    );
    assert_eq!(out.exit_code, Some(0));
    let no_newline = sandbox
        .exec(
            &id,
            &request("printf 'no newline'; printf 'err' >&2; exit 7"),
        )
        .await
        .expect("exec");
    assert_eq!(
        (
            no_newline.stdout.bytes,
            no_newline.stderr.bytes,
            no_newline.exit_code
        ),
        (b"no newline".to_vec(), b"err".to_vec(), Some(7))
    );

    let restarted = Command::new("docker")
        .args(["restart", "-t", "0", &id.0])
        .output()
        .expect("docker restart");
    assert!(restarted.status.success(), "{restarted:?}");
    let out = sandbox
        .exec(&id, &request("echo after"))
        .await
        .expect("exec after a restart");
    assert_eq!(out.stdout.bytes, b"after\n");
    sandbox.destroy(&id).await.expect("destroy");
}

#[tokio::test]
async fn orphans_are_removed_and_live_sandboxes_kept() {
    // A prefix of its own, so that the sandboxes of tests running alongside are not touched.
    let prefix = format!("{}-", unique_key("orphans"));
    let sandbox = backend(&prefix).await;
    let live = sandbox.create(&spec("live")).await.expect("create").id;
    let orphan = sandbox.create(&spec("orphan")).await.expect("create").id;
    // An orphan whose container is gone but whose volume is left.
    let half = sandbox.create(&spec("half")).await.expect("create").id;
    let removed = Command::new("docker")
        .args(["rm", "-f", &half.0])
        .output()
        .expect("docker rm");
    assert!(removed.status.success());

    let live_keys = BTreeSet::from(["live".to_owned()]);
    let gone = sandbox
        .remove_orphans(&live_keys)
        .await
        .expect("remove orphans");
    assert_eq!(gone, ["half", "orphan"]);
    for id in [&orphan, &half] {
        assert_eq!(inspect("container", "{{.Id}}", &id.0), None, "{id}");
        assert_eq!(inspect("volume", "{{.Name}}", &id.0), None, "{id}");
    }
    let out = sandbox
        .exec(&live, &request("echo alive"))
        .await
        .expect("exec");
    assert_eq!(out.stdout.bytes, b"alive\n");
    assert_eq!(
        sandbox.remove_orphans(&live_keys).await.expect("again"),
        Vec::<String>::new()
    );
    sandbox.destroy(&live).await.expect("destroy");
}

/// Two installations on one engine (the same name prefix, two owners): neither's orphan
/// removal touches the other's sandboxes; its own orphans go.
#[tokio::test]
async fn another_owner_s_sandboxes_are_never_orphans() {
    let prefix = format!("{}-", unique_key("owners"));
    let owned = |owner: &str| {
        let mut config = DockerConfig::new(image());
        config.name_prefix = prefix.clone();
        config.owner = Some(owner.to_owned());
        async move {
            DockerSandbox::connect(config)
                .await
                .unwrap_or_else(|e| panic!("Docker is not reachable: {e}"))
        }
    };
    let (a, b) = (owned("installation-a").await, owned("installation-b").await);
    let of_a = a.create(&spec("of-a")).await.expect("create").id;
    let of_b = b.create(&spec("of-b")).await.expect("create").id;
    assert_eq!(
        inspect(
            "container",
            "{{index .Config.Labels \"nodus.sandbox.owner\"}}",
            &of_a.0
        )
        .as_deref(),
        Some("installation-a")
    );
    assert_eq!(
        inspect(
            "volume",
            "{{index .Labels \"nodus.sandbox.owner\"}}",
            &of_a.0
        )
        .as_deref(),
        Some("installation-a")
    );

    // B knows no live run: only its own sandbox is an orphan.
    let gone = b
        .remove_orphans(&BTreeSet::new())
        .await
        .expect("B's orphans");
    assert_eq!(gone, ["of-b"]);
    assert_eq!(inspect("container", "{{.Id}}", &of_b.0), None);
    let out = a.exec(&of_a, &request("echo kept")).await.expect("exec");
    assert_eq!(out.stdout.bytes, b"kept\n", "A's sandbox untouched");
    let gone = a
        .remove_orphans(&BTreeSet::new())
        .await
        .expect("A's orphans");
    assert_eq!(gone, ["of-a"]);
    assert_eq!(inspect("container", "{{.Id}}", &of_a.0), None);
    assert_eq!(inspect("volume", "{{.Name}}", &of_a.0), None);
}

#[tokio::test]
async fn containers_carry_limits_labels_and_no_network() {
    let sandbox = backend("nodus-").await;
    let key = unique_key("config");
    let mut with_env = spec(&key);
    with_env.env.insert("GREETING".to_owned(), "hi".to_owned());
    let id = sandbox.create(&with_env).await.expect("create").id;
    let format = "{{.HostConfig.Memory}} {{.HostConfig.MemorySwap}} {{.HostConfig.NanoCpus}} \
                  {{.HostConfig.PidsLimit}} {{.HostConfig.NetworkMode}} \
                  {{.HostConfig.ReadonlyRootfs}} {{index .Config.Labels \"nodus.sandbox.key\"}}";
    let seen = inspect("container", format, &id.0).expect("inspect");
    let memory = 256u64 << 20;
    assert_eq!(
        seen,
        format!("{memory} {memory} 1000000000 64 none true {key}")
    );
    let out = sandbox
        .exec(&id, &request("echo \"$GREETING $HOME\"; pwd"))
        .await
        .expect("exec");
    assert_eq!(out.stdout.bytes, b"hi /work\n/work\n");
    sandbox.destroy(&id).await.expect("destroy");
}

/// A container runs on as many of the engine's CPUs as its CPU limit rounds up to, so that
/// `nproc` inside agrees with the limit, and keeps its CPU quota: with 1 CPU (1000 millis)
/// `nproc` prints 1 on a host of more; with as many as the host has, nothing is pinned.
#[tokio::test]
async fn nproc_shows_the_cpus_the_limit_rounds_up_to() {
    let host_cpus: usize = Command::new("docker")
        .args(["info", "-f", "{{.NCPU}}"])
        .output()
        .ok()
        .and_then(|out| String::from_utf8_lossy(&out.stdout).trim().parse().ok())
        .expect("the engine's CPU count");
    assert!(
        host_cpus >= 2,
        "this test needs an engine with at least 2 CPUs, not {host_cpus}"
    );
    let sandbox = backend("nodus-").await;
    let nproc = |millis: u32| {
        let sandbox = sandbox.clone();
        async move {
            let mut limited = spec(&unique_key("nproc"));
            limited.limits.cpu_millis = millis;
            let id = sandbox.create(&limited).await.expect("create").id;
            let out = sandbox.exec(&id, &request("nproc")).await.expect("exec");
            let seen = inspect(
                "container",
                "{{.HostConfig.NanoCpus}} {{.HostConfig.CpusetCpus}}",
                &id.0,
            )
            .expect("inspect");
            sandbox.destroy(&id).await.expect("destroy");
            (
                String::from_utf8_lossy(&out.stdout.bytes).into_owned(),
                seen,
            )
        }
    };
    let (printed, seen) = nproc(1000).await;
    assert_eq!(printed, "1\n", "{seen}");
    let (quota, cpuset) = seen.split_once(' ').expect("two fields");
    assert_eq!(quota, "1000000000", "the quota is kept");
    let cpu: usize = cpuset.parse().expect("one CPU");
    assert!(cpu < host_cpus, "{cpuset}");
    let (printed, seen) = nproc(u32::try_from(host_cpus * 1000).expect("millis")).await;
    assert_eq!(printed, format!("{host_cpus}\n"), "{seen}");
    assert_eq!(
        seen,
        (host_cpus * 1_000_000_000).to_string(),
        "as many CPUs as the host has: nothing is pinned"
    );
}

/// A sandbox whose spec names an image runs in that image, not in the default one: the
/// container is created from a second tag of the test image (and the backend says it runs
/// images, so the engine lets runs name one).
#[tokio::test]
async fn a_sandbox_runs_in_the_image_its_spec_names() {
    let sandbox = backend("nodus-").await;
    assert!(sandbox.supports_image());
    let key = unique_key("image");
    let named = format!("nodus-test-named:{key}");
    let tagged = Command::new("docker")
        .args(["tag", &image(), &named])
        .status()
        .expect("run docker");
    assert!(tagged.success(), "docker tag {named}");
    let mut in_named = spec(&key);
    in_named.image = Some(named.clone());
    let id = sandbox.create(&in_named).await.expect("create").id;
    assert_eq!(
        inspect("container", "{{.Config.Image}}", &id.0).as_deref(),
        Some(named.as_str())
    );
    let out = sandbox.exec(&id, &request("echo ran")).await.expect("exec");
    assert_eq!(out.stdout.bytes, b"ran\n");
    sandbox.destroy(&id).await.expect("destroy");
    // Without a name the default image is used.
    let default_key = unique_key("image");
    let id = sandbox
        .create(&spec(&default_key))
        .await
        .expect("create")
        .id;
    assert_eq!(
        inspect("container", "{{.Config.Image}}", &id.0),
        Some(image())
    );
    sandbox.destroy(&id).await.expect("destroy");
    let removed = Command::new("docker")
        .args(["rmi", &named])
        .output()
        .expect("run docker");
    assert!(removed.status.success(), "docker rmi {named}");
}

#[tokio::test]
async fn no_file_grows_past_the_disk_limit() {
    let sandbox = backend("nodus-").await;
    let id = sandbox
        .create(&spec(&unique_key("fsize")))
        .await
        .expect("create")
        .id;
    let limit = test_limits().disk_bytes;
    let out = sandbox
        .exec(
            &id,
            &request("dd if=/dev/zero of=big bs=1M count=100 2>/dev/null; wc -c < big"),
        )
        .await
        .expect("exec");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout.bytes).trim(),
        limit.to_string(),
        "{out:?}"
    );
    sandbox.destroy(&id).await.expect("destroy");
}

#[tokio::test]
async fn an_unreachable_engine_is_reported() {
    let mut config = DockerConfig::new(image());
    config.endpoint =
        nodus_sandbox::docker::Endpoint::Socket(PathBuf::from("/nonexistent/docker.sock"));
    match DockerSandbox::connect(config).await {
        Err(e @ Error::Unavailable(_)) => {
            assert!(e.to_string().contains("/nonexistent/docker.sock"), "{e}");
            assert!(e.is_retryable());
        }
        other => panic!("{:?}", other.map(|_| "connected")),
    }
}

/// What a command prints reaches the backend only: the engine keeps no log of the container on
/// the host's disk, where a command printing without end would fill it past the sandbox's
/// disk limit (the engine's default `json-file` log grew by 6 bytes per byte printed).
#[tokio::test]
async fn output_leaves_no_log_on_the_host() {
    let sandbox = backend("nodus-").await;
    let id = sandbox
        .create(&spec(&unique_key("nolog")))
        .await
        .expect("create")
        .id;
    let out = sandbox
        .exec(&id, &request("head -c 33554432 /dev/zero; echo done >&2"))
        .await
        .expect("exec");
    assert_eq!(out.exit_code, Some(0), "{:?}", out.stderr);
    assert_eq!(out.stderr.bytes, b"done\n");
    let log = inspect("container", "{{.LogPath}}", &id.0).expect("the container");
    let logged = std::fs::metadata(&log).map_or(0, |m| m.len());
    assert!(logged < 1 << 20, "{log} holds {logged} bytes of output");
    assert_eq!(
        inspect("container", "{{.HostConfig.LogConfig.Type}}", &id.0).as_deref(),
        Some("none")
    );
    sandbox.destroy(&id).await.expect("destroy");
}

/// A working directory made again over a command's files (its container gone, its volume
/// kept) whose linked directory is now a symbolic link to `/` does not lead the bind out of
/// the volume: the engine would follow a link on its own host, so the backend makes the
/// directory again (the upload replaces what is not a directory) and checks every directory
/// on the way before binding it.
#[tokio::test]
async fn a_link_planted_in_the_workdir_does_not_lead_the_bind_out_of_the_volume() {
    let key = unique_key("link-escape");
    let sandbox = backend("nodus-").await;
    let mut linked = spec(&key);
    linked.links = BTreeMap::from([("/grading".to_owned(), "grading".to_owned())]);
    let id = sandbox.create(&linked).await.expect("create").id;
    let out = sandbox
        .exec(
            &id,
            &request("rmdir grading && ln -s / grading && echo planted"),
        )
        .await
        .expect("exec");
    assert_eq!(out.stdout.bytes, b"planted\n", "{out:?}");
    let removed = Command::new("docker")
        .args(["rm", "-f", &id.0])
        .output()
        .expect("docker rm");
    assert!(removed.status.success());
    sandbox.create(&linked).await.expect("made again");
    let out = sandbox
        .exec(
            &id,
            &request("test -L grading && echo link; ls -A /grading | wc -l; test -e /grading/etc && echo host"),
        )
        .await
        .expect("exec");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout.bytes).trim(),
        "0",
        "the linked directory is an empty directory of the volume again, not the host's root: {out:?}"
    );
    sandbox.destroy(&id).await.expect("destroy");
}
