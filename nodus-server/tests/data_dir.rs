//! The data directory: owner-only when made (whatever the umask), refused when other users
//! can read or write it or the server key, and tokens stored under a keyed hash.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use nodus_core::resource::Kind;
use nodus_core::store::{ObjectKey, Selector, Store};
use nodus_server::auth::SYSTEM_PROJECT;
use nodus_server::{Options, SandboxKind, Server, StartError};
use tower::ServiceExt;

const TOKEN: &str = "nodus_data_dir_test_token_0123456789abcdef";

fn options(dir: &Path) -> Options {
    let mut options = Options::new(dir.to_path_buf());
    options.sandbox = SandboxKind::Unisolated;
    options
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .expect("metadata")
        .permissions()
        .mode()
        & 0o7777
}

/// The names of the entries of `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

fn refusal(result: Result<Server, StartError>) -> String {
    match result {
        Ok(_) => panic!("the server started"),
        Err(error) => error.to_string(),
    }
}

/// A fresh data directory is 0700 and every file in it 0600 (the SQLite database, its WAL
/// and shared-memory files and its reserve, the server key, the replica name, the admin
/// token), even with a umask of 0.
#[tokio::test]
async fn a_fresh_data_directory_is_owner_only_whatever_the_umask() {
    let parent = tempfile::tempdir().expect("tempdir");
    let dir = parent.path().join("data");
    let before = rustix::process::umask(rustix::fs::Mode::empty());
    let server = Server::build(options(&dir)).await;
    rustix::process::umask(before);
    let server = server.expect("the server builds");
    // A write, so that the database's WAL holds something.
    server
        .state()
        .ledger
        .open("other", nodus_core::Usd::ZERO)
        .await
        .expect("a write");
    assert_eq!(mode(&dir), 0o700, "the data directory");
    let names = names(&dir);
    for expected in [
        "admin-token",
        "nodus.db",
        "nodus.lock",
        "nodus.db.reserve",
        "nodus.db-shm",
        "nodus.db-wal",
        "replica-name",
        "secret.key",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} in {names:?}"
        );
    }
    for name in &names {
        let path = dir.join(name);
        let meta = std::fs::symlink_metadata(&path).expect("metadata");
        if meta.is_file() {
            assert_eq!(mode(&path), 0o600, "{name}");
        } else {
            assert_eq!(mode(&path) & 0o077, 0, "{name}");
        }
    }
    drop(server);
}

/// A data directory that other users can read is refused, naming it, its mode and the fix;
/// nothing is written into it.
#[tokio::test]
async fn a_data_directory_others_can_read_is_refused() {
    let parent = tempfile::tempdir().expect("tempdir");
    let dir = parent.path().join("data");
    std::fs::create_dir(&dir).expect("dir");
    for open in [0o755, 0o750, 0o702] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(open)).expect("chmod");
        let message = refusal(Server::build(options(&dir)).await);
        let shown = dir.display().to_string();
        assert!(message.contains(&shown), "{message}");
        assert!(message.contains(&format!("{open:04o}")), "{message}");
        assert!(
            message.contains(&format!("`chmod 700 {shown}`")),
            "{message}"
        );
        assert!(names(&dir).is_empty(), "nothing written: {:?}", names(&dir));
    }
    // Owner-only, or traversable but not readable by others: fine.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).expect("chmod");
    Server::build(options(&dir))
        .await
        .expect("the server builds");
}

/// A server key that other users can write (one planted by someone else) or read is
/// refused, naming the file, its mode and the fix; the store is not touched.
#[tokio::test]
async fn a_server_key_others_can_read_or_write_is_refused() {
    let parent = tempfile::tempdir().expect("tempdir");
    let dir = parent.path().join("data");
    std::fs::create_dir(&dir).expect("dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let key = dir.join("secret.key");
    std::fs::write(&key, "ab".repeat(32)).expect("a planted key");
    for open in [0o666, 0o644, 0o602] {
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(open)).expect("chmod");
        let message = refusal(Server::build(options(&dir)).await);
        let shown = key.display().to_string();
        assert!(message.contains(&shown), "{message}");
        assert!(message.contains(&format!("{open:04o}")), "{message}");
        assert!(
            message.contains(&format!("`chmod 600 {shown}`")),
            "{message}"
        );
        assert_eq!(
            names(&dir),
            vec!["secret.key".to_string()],
            "nothing else written"
        );
    }
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    Server::build(options(&dir))
        .await
        .expect("the server builds");
}

/// A `--bootstrap-token` shorter than 32 characters is refused before anything is written,
/// and the message does not show it.
#[tokio::test]
async fn a_short_bootstrap_token_is_refused() {
    let parent = tempfile::tempdir().expect("tempdir");
    let dir = parent.path().join("data");
    let mut short = options(&dir);
    let weak = "letmein-letmein-letmein-letmein";
    short.bootstrap_token = Some(weak.to_string());
    let message = refusal(Server::build(short).await);
    assert!(message.contains("--bootstrap-token"), "{message}");
    assert!(
        message.contains("at least 32 characters, not 31"),
        "{message}"
    );
    assert!(!message.contains(weak), "{message}");
    assert!(!dir.exists(), "nothing written");
    let mut long = options(&dir);
    long.bootstrap_token = Some(format!("{weak}!"));
    Server::build(long).await.expect("32 characters are enough");
}

async fn token_names(store: &dyn Store) -> Vec<String> {
    store
        .list(
            SYSTEM_PROJECT,
            nodus_server::auth::TOKEN,
            &Selector::default(),
        )
        .await
        .expect("tokens")
        .into_iter()
        .map(|record| record.key.name)
        .collect()
}

async fn status_with(server: &Server, token: &str) -> StatusCode {
    let request = Request::builder()
        .uri("/apis/nodus.dev/v1/projects/default/agents")
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .body(Body::empty())
        .expect("request");
    nodus_server::router(server.state())
        .oneshot(request)
        .await
        .expect("response")
        .status()
}

/// Tokens are stored under an HMAC keyed by the server's key, not their plain SHA-256: the
/// same token has another name on a server with another key. A token stored the old way
/// still works, and is stored again under the keyed hash.
#[tokio::test]
async fn tokens_are_stored_under_a_keyed_hash_and_old_ones_still_work() {
    let parent = tempfile::tempdir().expect("tempdir");
    let mut named = Vec::new();
    for data in ["one", "two"] {
        let mut options = options(&parent.path().join(data));
        options.bootstrap_token = Some(TOKEN.to_string());
        let server = Server::build(options).await.expect("the server builds");
        let names = token_names(server.state().store.as_ref()).await;
        assert_eq!(names.len(), 1, "{names:?}");
        assert_ne!(
            names[0],
            nodus_core::digest::sha256_hex(TOKEN.as_bytes()),
            "not the plain SHA-256"
        );
        assert_eq!(status_with(&server, TOKEN).await, StatusCode::OK);
        named.push(names[0].clone());
    }
    assert_ne!(named[0], named[1], "another key, another name");

    // A token stored by its plain SHA-256 before tokens were keyed.
    let mut options = options(&parent.path().join("one"));
    options.bootstrap_token = Some(TOKEN.to_string());
    let server = Server::build(options)
        .await
        .expect("the server builds again");
    let store = server.state().store.clone();
    let old = "nodus_0123456789abcdef0123456789abcdef0123456789abcdef";
    let legacy = ObjectKey::new(
        SYSTEM_PROJECT,
        nodus_server::auth::TOKEN,
        nodus_core::digest::sha256_hex(old.as_bytes()),
    );
    store
        .create(
            &legacy,
            serde_json::json!({
                "apiVersion": "nodus.dev/v1", "kind": "Token",
                "metadata": {"name": legacy.name},
                "spec": {"projects": ["default"], "admin": false},
            }),
        )
        .await
        .expect("an old token");
    assert_eq!(status_with(&server, old).await, StatusCode::OK);
    let names = token_names(store.as_ref()).await;
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(
        !names.contains(&legacy.name),
        "the plain hash is gone: {names:?}"
    );
    assert_eq!(
        status_with(&server, old).await,
        StatusCode::OK,
        "and still works"
    );
    assert_eq!(
        status_with(&server, "nodus_wrong").await,
        StatusCode::UNAUTHORIZED
    );
}

/// The versions of everything the first start bootstraps.
async fn bootstrapped_versions(store: &dyn Store) -> Vec<(String, u64)> {
    let mut versions = Vec::new();
    for (project, kind) in [
        (SYSTEM_PROJECT, nodus_server::auth::TOKEN),
        ("default", nodus_server::auth::TOKEN),
        ("nodus", Kind::Agent),
        (SYSTEM_PROJECT, Kind::Account),
    ] {
        for record in store
            .list(project, kind, &Selector::default())
            .await
            .expect("list")
        {
            versions.push((record.key.to_string(), record.version));
        }
    }
    versions.sort();
    versions
}

/// A second start finds everything the first one bootstrapped and writes none of it again
/// (which lets a server start on a full disk).
#[tokio::test]
async fn a_second_start_writes_nothing_that_is_there() {
    let parent = tempfile::tempdir().expect("tempdir");
    let dir = parent.path().join("data");
    let mut first = options(&dir);
    first.bootstrap_token = Some(TOKEN.to_string());
    let server = Server::build(first.clone()).await.expect("first start");
    let before = bootstrapped_versions(server.state().store.as_ref()).await;
    assert!(before.len() >= 4, "{before:?}");
    drop(server);
    let server = Server::build(first).await.expect("second start");
    let after = bootstrapped_versions(server.state().store.as_ref()).await;
    assert_eq!(before, after);
}

/// A second server on a data directory in use is refused, naming the first one's pid and
/// command and the way out, and writes nothing; once the first stops, it starts.
#[tokio::test]
async fn a_data_directory_in_use_is_refused_until_its_server_stops() {
    let parent = tempfile::tempdir().expect("tempdir");
    let dir = parent.path().join("data");
    let first = Server::build(options(&dir))
        .await
        .expect("the first server");
    let before = names(&dir);
    let message = refusal(Server::build(options(&dir)).await);
    let pid = format!("(pid {})", std::process::id());
    assert!(message.contains(&dir.display().to_string()), "{message}");
    assert!(message.contains("is in use by `"), "{message}");
    assert!(message.contains(&pid), "{message}");
    assert!(message.contains("--data-dir"), "{message}");
    assert_eq!(names(&dir), before, "the refused server wrote nothing");
    // With an in-memory store too: the data directory still holds the key and the sandboxes.
    let mut memory = options(&dir);
    memory.store = Some(nodus_server::StoreUrl::Memory);
    assert!(refusal(Server::build(memory).await).contains(&pid));
    drop(first);
    let second = Server::build(options(&dir))
        .await
        .expect("the second server");
    drop(second);
}

/// The lock file of a process that died (its lock went with it) does not block a start.
#[tokio::test]
async fn a_lock_file_left_by_a_dead_process_does_not_block() {
    let parent = tempfile::tempdir().expect("tempdir");
    let dir = parent.path().join("data");
    std::fs::create_dir(&dir).expect("dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let lock = dir.join(nodus_server::lock::LOCK_FILE);
    std::fs::write(&lock, "999999\nnodus server\n").expect("a stale lock file");
    std::fs::set_permissions(&lock, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let server = Server::build(options(&dir))
        .await
        .expect("the server starts");
    let holder = std::fs::read_to_string(&lock).expect("the lock file");
    assert!(
        holder.starts_with(&format!("{}\n", std::process::id())),
        "{holder:?}"
    );
    drop(server);
}

/// A holder that has not written its name yet is "another process", not the dead one whose
/// pid is still in the file.
#[tokio::test]
async fn a_holder_that_has_not_written_its_name_is_not_named_after_a_dead_one() {
    let parent = tempfile::tempdir().expect("tempdir");
    let dir = parent.path().join("data");
    std::fs::create_dir(&dir).expect("dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let lock = dir.join(nodus_server::lock::LOCK_FILE);
    std::fs::write(&lock, "999999\nnodus server\n").expect("a stale lock file");
    std::fs::set_permissions(&lock, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let held = std::fs::File::open(&lock).expect("open");
    rustix::fs::flock(&held, rustix::fs::FlockOperation::NonBlockingLockExclusive)
        .expect("the lock, as a new holder takes it");
    let message = refusal(Server::build(options(&dir)).await);
    assert!(message.contains("in use by another process"), "{message}");
    assert!(!message.contains("999999"), "{message}");
    drop(held);
}
