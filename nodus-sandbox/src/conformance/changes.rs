//! What a backend tells of its working directory's changes ([`Sandbox::changes`]) agrees with
//! listing it: after each of a series of commands (files and directories made, written,
//! renamed, removed, modes changed, links, special files, a directory replaced by a link that
//! leads out), the last listing changed by what it told is the listing taken then.
//!
//! [`Sandbox::changes`]: nodus_core::Sandbox::changes

use std::collections::BTreeMap;

use nodus_core::snapshot::{Changes, FileStat};

use super::{Backend, destroy, exec, fresh};

/// Each command, and whether a backend that watches must tell its changes (`false`: it may
/// have lost track, a directory renamed, and say it cannot tell).
const SERIES: &[(&str, bool)] = &[
    ("true", true),
    (
        "mkdir -p a/b/c && echo 1 > a/b/c/f && echo 2 > g && ln -s g l",
        true,
    ),
    ("echo more >> g", true),
    // Into a directory made before the first answer (as staged files are).
    ("echo late > early/deeper/f", true),
    ("chmod 600 g", true),
    ("rm a/b/c/f", true),
    ("mv g h && touch a/b/new", true),
    ("rm -rf a", true),
    ("mkdir d && touch d/x && mv d e", false),
    (
        "touch e/y && printf 'same size' > h2 && printf 'same size' > h2",
        true,
    ),
    ("mkfifo q && rm l && ln -s /etc/passwd l", true),
    ("rm -rf e q && mkdir e && echo again > e/z", true),
    // A watched directory replaced by a link to the host's /etc, under a name /etc has: what
    // was under it is gone, never looked up through the link.
    ("mkdir s && touch s/passwd s/hostname", true),
    ("rm -rf s && ln -s /etc s", true),
    ("true", true),
];

/// Every backend: what it tells, when it tells, agrees with the listing.
pub async fn changes_agree_with_the_listing(b: &Backend) {
    told_changes(b, false).await;
}

/// A backend that watches its working directories tells every change after the first
/// answer (except where it says it may not), and they agree with the listing.
pub async fn changes_are_told(b: &Backend) {
    told_changes(b, true).await;
}

async fn told_changes(b: &Backend, watched: bool) {
    let id = fresh(b, "changes").await;
    let early = exec(b, &id, "mkdir -p early/deeper").await;
    assert_eq!(early.exit_code, Some(0), "{early:?}");
    let first = b.sandbox.changes(&id).await.expect("changes");
    let mut listed = by_path(b.sandbox.list_files(&id).await.expect("list"));
    match first {
        Changes::Listed(all) => assert_eq!(by_path(all), listed, "the first answer's listing"),
        Changes::Unknown => {}
        Changes::Known { .. } => panic!("the first answer cannot know what was there: {first:?}"),
    }
    for (command, must_tell) in SERIES {
        let out = exec(b, &id, command).await;
        assert_eq!(out.exit_code, Some(0), "{command}: {out:?}");
        let changes = b.sandbox.changes(&id).await.expect("changes");
        let now = by_path(b.sandbox.list_files(&id).await.expect("list"));
        match changes {
            Changes::Known { present, gone } => {
                if *command == "true" {
                    assert!(
                        present.is_empty() && gone.is_empty(),
                        "{present:?} {gone:?}"
                    );
                }
                for path in &gone {
                    let below = format!("{path}/");
                    listed.retain(|p, _| p != path && !p.starts_with(&below));
                }
                listed.extend(by_path(present));
                assert_eq!(
                    listed, now,
                    "after {command:?}, the last listing and what was told"
                );
            }
            Changes::Unknown => {
                assert!(
                    !(watched && *must_tell),
                    "after {command:?} the backend could not tell what changed"
                );
            }
            Changes::Listed(all) => {
                assert!(
                    !(watched && *must_tell),
                    "after {command:?} the backend could not tell what changed"
                );
                assert_eq!(by_path(all), now, "after {command:?}, the listing it told");
            }
        }
        listed = now;
    }
    destroy(b, &id).await;
}

fn by_path(stats: Vec<FileStat>) -> BTreeMap<String, FileStat> {
    stats.into_iter().map(|s| (s.path.clone(), s)).collect()
}
