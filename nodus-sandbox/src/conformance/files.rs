//! Common cases about files: staging a working directory and reading it back as archives,
//! hostile archives, recreating a sandbox, and symbolic links.

use std::collections::BTreeMap;
use std::path::Path;

use nodus_core::sandbox::{Error, MAX_ARCHIVE_BYTES};

use super::{
    Backend, archive, create, destroy, exec, fresh, listing, raw_entry, spec, text_of, unique_key,
};

/// A working directory staged from an archive before the first command comes back, changed,
/// as an archive at the end; single paths come back named relative to the working directory.
pub async fn files_round_trip(b: &Backend) {
    let id = fresh(b, "files").await;
    let binary: Vec<u8> = (0..=255).collect();
    let files: [(&str, &[u8]); 3] = [
        ("a.txt", b"alpha\n"),
        ("dir/b.bin", &binary),
        ("dir/deeper/c", b""),
    ];
    b.sandbox
        .put_files(&id, archive(&files))
        .await
        .expect("stage");

    let out = exec(
        b,
        &id,
        "cat a.txt; wc -c < dir/b.bin; ln -s ../a.txt dir/link; echo new > made-here",
    )
    .await;
    assert_eq!(text_of(&out).replace(' ', ""), "alpha\n256\n");

    let all = listing(
        &b.sandbox
            .get_files(&id, ".", MAX_ARCHIVE_BYTES)
            .await
            .expect("get all"),
    );
    assert_eq!(
        all,
        [
            ("a.txt".to_owned(), b"alpha\n".to_vec()),
            ("dir".to_owned(), b"<dir>".to_vec()),
            ("dir/b.bin".to_owned(), binary.clone()),
            ("dir/deeper".to_owned(), b"<dir>".to_vec()),
            ("dir/deeper/c".to_owned(), Vec::new()),
            ("dir/link".to_owned(), b"-> ../a.txt".to_vec()),
            ("made-here".to_owned(), b"new\n".to_vec()),
        ]
    );
    let one = listing(
        &b.sandbox
            .get_files(&id, "dir/b.bin", MAX_ARCHIVE_BYTES)
            .await
            .expect("get one"),
    );
    assert_eq!(one, [("dir/b.bin".to_owned(), binary.clone())]);

    // What comes out goes back in, into another sandbox.
    let other = fresh(b, "files2").await;
    let sub = b
        .sandbox
        .get_files(&id, "dir", MAX_ARCHIVE_BYTES)
        .await
        .expect("get dir");
    b.sandbox.put_files(&other, sub).await.expect("put back");
    let out = exec(b, &other, "wc -c < dir/b.bin; cat dir/deeper/c").await;
    assert_eq!(text_of(&out).trim(), "256");

    for (bad, expected) in [
        ("/etc/passwd", "is absolute"),
        ("../x", "contains `..`"),
        ("missing", "does not exist"),
    ] {
        match b.sandbox.get_files(&id, bad, MAX_ARCHIVE_BYTES).await {
            Err(Error::Refused(why)) => assert!(why.contains(expected), "{bad}: {why}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
    exec(b, &id, "ln -s /etc escape").await;
    match b
        .sandbox
        .get_files(&id, "escape/passwd", MAX_ARCHIVE_BYTES)
        .await
    {
        Err(Error::Refused(why)) => assert!(why.contains("outside"), "{why}"),
        other => panic!("through a link to /etc: {other:?}"),
    }
    // A link that leads outside is not handed out: refused by name, left out of the whole.
    match b.sandbox.get_files(&id, "escape", MAX_ARCHIVE_BYTES).await {
        Err(Error::Refused(why)) => assert!(why.contains("leads outside"), "{why}"),
        other => panic!("a link to /etc: {other:?}"),
    }
    let all = listing(
        &b.sandbox
            .get_files(&id, ".", MAX_ARCHIVE_BYTES)
            .await
            .expect("get all"),
    );
    assert!(all.iter().all(|(path, _)| path != "escape"), "{all:?}");
    destroy(b, &id).await;
    destroy(b, &other).await;
}

/// Archives that come out carry permission bits only (no set-uid, set-gid or sticky bit) and
/// no symbolic link that leads outside the working directory, so that extracting one cannot
/// plant a set-uid program or a link to the host; packing stops at the caller's cap.
pub async fn archives_out_are_clean_and_capped(b: &Backend) {
    let id = fresh(b, "clean").await;
    let out = exec(
        b,
        &id,
        "printf x > suid; chmod 4755 suid; printf y > sgid; chmod 2750 sgid; \
         mkdir sticky; chmod 1777 sticky; ln -s /etc/passwd abs; ln -s ../../x up; \
         ln -s suid near; dd if=/dev/zero of=big bs=1024 count=64 2>/dev/null",
    )
    .await;
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    let tar = b
        .sandbox
        .get_files(&id, ".", MAX_ARCHIVE_BYTES)
        .await
        .expect("get all");
    let mut modes = BTreeMap::new();
    let mut archive = tar::Archive::new(tar.as_slice());
    for entry in archive.entries().expect("entries") {
        let entry = entry.expect("entry");
        let path = entry.path().expect("path").display().to_string();
        let mode = entry.header().mode().expect("mode");
        modes.insert(path.trim_end_matches('/').to_owned(), mode);
    }
    assert_eq!(modes.get("suid"), Some(&0o755), "{modes:?}");
    assert_eq!(modes.get("sgid"), Some(&0o750), "{modes:?}");
    assert_eq!(modes.get("sticky"), Some(&0o777), "{modes:?}");
    assert!(modes.contains_key("near"), "a link inside stays: {modes:?}");
    assert!(!modes.contains_key("abs"), "{modes:?}");
    assert!(!modes.contains_key("up"), "{modes:?}");

    // 64 KiB of `big` cannot fit into 32 KiB: refused, naming the cap.
    match b.sandbox.get_files(&id, ".", 32 << 10).await {
        Err(Error::Refused(why)) => assert!(why.contains("larger than 32768 bytes"), "{why}"),
        other => panic!("over the cap: {other:?}"),
    }
    let small = b
        .sandbox
        .get_files(&id, "suid", 32 << 10)
        .await
        .expect("a small file fits");
    assert!(small.len() <= 32 << 10);
    destroy(b, &id).await;
}

/// Archive entries every backend refuses whole: the entry's path, its type, its link target,
/// and what the refusal says (besides the path).
pub const HOSTILE_ARCHIVES: [(&str, tar::EntryType, &str, &str); 5] = [
    (
        "/tmp/nodus-hostile-abs",
        tar::EntryType::Regular,
        "",
        "is absolute",
    ),
    (
        "../../outside/dotdot",
        tar::EntryType::Regular,
        "",
        "contains `..`",
    ),
    (
        "link",
        tar::EntryType::Symlink,
        "../../outside",
        "outside the working directory",
    ),
    ("abs-link", tar::EntryType::Symlink, "/tmp", "absolute path"),
    (
        "hard",
        tar::EntryType::Link,
        "../../outside/x",
        "contains `..`",
    ),
];

/// Archives with absolute paths, `..`, or links that point outside are refused whole: not
/// even their harmless entries are written. Nothing is written through a link that a command
/// left in the working directory.
pub async fn hostile_archives_refused(b: &Backend) {
    let id = fresh(b, "hostile").await;
    for (path, kind, target, expected) in HOSTILE_ARCHIVES {
        let mut tar = Vec::new();
        raw_entry(&mut tar, "harmless.txt", tar::EntryType::Regular, "", b"hi");
        raw_entry(&mut tar, path, kind, target, b"pwned");
        tar.extend_from_slice(&[0; 1024]);
        match b.sandbox.put_files(&id, tar).await {
            Err(Error::Refused(why)) => {
                assert!(why.contains(path), "{why} names {path}");
                assert!(why.contains(expected), "{why}");
            }
            other => panic!("{path}: {other:?}"),
        }
        let out = exec(b, &id, "ls -A").await;
        assert_eq!(text_of(&out), "", "{path}: nothing was written");
    }
    assert!(!Path::new("/tmp/nodus-hostile-abs").exists());

    exec(b, &id, "ln -s /tmp out").await;
    let mut tar = Vec::new();
    raw_entry(&mut tar, "out/x", tar::EntryType::Regular, "", b"pwned");
    tar.extend_from_slice(&[0; 1024]);
    match b.sandbox.put_files(&id, tar).await {
        Err(Error::Refused(why)) => assert!(why.contains("symbolic link \"out\""), "{why}"),
        other => panic!("through an existing link: {other:?}"),
    }
    assert!(matches!(
        b.sandbox
            .put_files(&id, b"not a tar archive at all".repeat(40))
            .await,
        Err(Error::Refused(_))
    ));
    let too_large = vec![0u8; nodus_core::sandbox::MAX_ARCHIVE_BYTES + 1];
    assert!(matches!(
        b.sandbox.put_files(&id, too_large).await,
        Err(Error::Refused(_))
    ));
    destroy(b, &id).await;
}

/// Creating again with the same key re-attaches to the same sandbox and its files.
pub async fn recreate_keeps_files(b: &Backend) {
    let s = spec(b, &unique_key("recreate"));
    let id = create(b, &s).await.id;
    exec(b, &id, "echo kept > state").await;
    let again = create(b, &s).await.id;
    assert_eq!(again, id);
    assert_eq!(exec(b, &id, "cat state").await.stdout.bytes, b"kept\n");
    destroy(b, &id).await;
}

/// A spec's links ([`SandboxSpec::links`]) are checked by every backend: a path that is not
/// one name below `/`, that a system directory takes, or a target that leaves the working
/// directory is refused before anything is made.
pub async fn bad_links_refused(b: &Backend) {
    for (path, target) in [
        ("/usr", "grading"),
        ("/tmp", "grading"),
        ("/proc", "grading"),
        ("/a/b", "grading"),
        ("relative", "grading"),
        ("/..", "grading"),
        ("/grading", "../outside"),
        ("/grading", "/etc"),
        ("/grading", ""),
    ] {
        let mut s = spec(b, &unique_key("bad-link"));
        s.links = BTreeMap::from([(path.to_owned(), target.to_owned())]);
        match b.sandbox.create(&s).await {
            Err(Error::Refused(why)) => assert!(why.contains(path), "{path} -> {target}: {why}"),
            other => panic!("{path} -> {target} was not refused: {other:?}"),
        }
    }
}

/// A spec's links show directories of the working directory at absolute paths, as a command
/// grader finds `/grading` and `/grader`: made before the directory exists, they lead to what
/// is put there afterwards, both ways, and outlive a restart of the sandbox.
pub async fn links_lead_into_the_workdir(b: &Backend) {
    let mut s = spec(b, &unique_key("links"));
    s.links = BTreeMap::from([
        ("/grading".to_owned(), "grading".to_owned()),
        ("/nodus-deep".to_owned(), "a/b".to_owned()),
    ]);
    let id = create(b, &s).await.id;
    b.sandbox
        .put_files(
            &id,
            archive(&[("grading/answer.txt", b"42"), ("a/b/c.txt", b"deep")]),
        )
        .await
        .expect("put files");
    let out = exec(
        b,
        &id,
        "cat /grading/answer.txt; echo; cat /nodus-deep/c.txt",
    )
    .await;
    assert_eq!(text_of(&out), "42\ndeep", "{out:?}");
    exec(b, &id, "echo written > /grading/out.txt").await;
    assert_eq!(
        text_of(&exec(b, &id, "cat grading/out.txt").await),
        "written\n"
    );
    // Created again over the same working directory: the links are there still.
    create(b, &s).await;
    let out = exec(b, &id, "cat /grading/answer.txt").await;
    assert_eq!(text_of(&out), "42", "{out:?}");
    destroy(b, &id).await;
}
