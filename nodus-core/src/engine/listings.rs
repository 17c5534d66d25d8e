//! What the group controller listed last, kept by version: a reconcile reads again only the
//! members (and evaluation cases) written since ([`Store::list_sparse_known`]).
//!
//! Every reconcile of a group lists all its members; most have not changed since the last
//! one. Each listing is kept here with the version of each document it read, and the next
//! listing of the same group is answered with the changed documents alone: a document the
//! store says is still the one kept, at the version kept, is taken from here, already parsed.
//! Nothing here is trusted beyond its place in creation order and its version: a document
//! written meanwhile is read again, and so is one deleted and created again under the same
//! name (at version 1 again, but created later); one deleted is simply not listed; and a
//! listing that fails leaves nothing behind.
//!
//! [`Store::list_sparse_known`]: crate::store::Store::list_sparse_known

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::resource::Kind;
use crate::store::{Record, Seen, Selector, Sparse, Store};

use super::{Error, Result};

/// The last listing of each group, by project and group name, of one kind of document parsed
/// into `T`.
pub(crate) struct Listings<T> {
    groups: Mutex<HashMap<(String, String), Shared<T>>>,
}

/// A group's listing, taken by one listing at a time.
type Shared<T> = Arc<tokio::sync::Mutex<Listing<T>>>;

impl<T> Default for Listings<T> {
    fn default() -> Self {
        Listings {
            groups: Mutex::default(),
        }
    }
}

/// One group's last listing: where each document was created, its version, and what it was
/// parsed into.
struct Listing<T> {
    documents: HashMap<String, (Seen, Arc<T>)>,
}

impl<T> Listings<T> {
    /// The documents of `kind` in `group`, in creation order, each parsed by `parse` (called
    /// only for those written since the last listing). Listings of one group are taken in
    /// turn, so that each starts from what the last one kept.
    pub(crate) async fn list(
        &self,
        store: &dyn Store,
        project: &str,
        kind: Kind,
        group: &str,
        paths: &[&str],
        parse: impl Fn(Record) -> Result<T>,
    ) -> Result<Vec<Arc<T>>> {
        let entry = self
            .groups
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry((project.to_string(), group.to_string()))
            .or_insert_with(|| {
                Arc::new(tokio::sync::Mutex::new(Listing {
                    documents: HashMap::new(),
                }))
            })
            .clone();
        let mut listing = entry.lock().await;
        // Taken out: a listing that fails keeps nothing (the next one reads every document).
        let mut kept = std::mem::take(&mut listing.documents);
        let known: HashMap<String, Seen> = kept
            .iter()
            .map(|(name, (seen, _))| (name.clone(), *seen))
            .collect();
        let selector = Selector::in_group(group);
        let answer = store
            .list_sparse_known(project, kind, &selector, paths, &known)
            .await?;
        let mut documents = HashMap::with_capacity(answer.len());
        let mut listed = Vec::with_capacity(answer.len());
        for sparse in answer {
            let (name, seen, parsed) = match sparse {
                Sparse::Known(name) => {
                    let Some((seen, parsed)) = kept.remove(&name) else {
                        // Only the versions given can come back known.
                        return Err(Error::Corrupt {
                            key: format!("{project}/{}/{name}", kind.plural()),
                            message: "the store answered a document the listing never read \
                                      as known"
                                .to_string(),
                        });
                    };
                    (name, seen, parsed)
                }
                Sparse::Read { at, record } => {
                    let seen = Seen {
                        at,
                        version: record.version,
                    };
                    (record.key.name.clone(), seen, Arc::new(parse(record)?))
                }
            };
            listed.push(parsed.clone());
            documents.insert(name, (seen, parsed));
        }
        listing.documents = documents;
        Ok(listed)
    }

    /// Keep nothing of `group` (it finished, or is gone).
    pub(crate) fn forget(&self, project: &str, group: &str) {
        self.groups
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&(project.to_string(), group.to_string()));
    }

    /// How many groups' listings are kept.
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn kept(&self) -> usize {
        self.groups
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use serde_json::json;

    use super::*;
    use crate::store::{MemoryStore, ObjectKey};

    fn member(name: &str, group: &str, phase: &str) -> serde_json::Value {
        json!({
            "apiVersion": "nodus.dev/v1",
            "kind": "AgentRun",
            "metadata": {"name": name},
            "spec": {"group": group},
            "status": {"phase": phase},
        })
    }

    /// Lists group `g`, counting the documents parsed; answers each one's name and phase.
    async fn list(
        listings: &Listings<String>,
        store: &MemoryStore,
        parsed: &AtomicUsize,
    ) -> Result<Vec<String>> {
        let listed = listings
            .list(
                store,
                "p",
                Kind::AgentRun,
                "g",
                &["status.phase"],
                |record| {
                    parsed.fetch_add(1, Ordering::SeqCst);
                    match record.document["status"]["phase"].as_str() {
                        Some("Broken") => Err(Error::Corrupt {
                            key: record.key.to_string(),
                            message: "broken".to_string(),
                        }),
                        phase => Ok(format!("{} {}", record.key.name, phase.unwrap_or("?"))),
                    }
                },
            )
            .await?;
        Ok(listed.iter().map(|s| (**s).clone()).collect())
    }

    #[tokio::test]
    async fn a_listing_parses_only_what_was_written_since_the_last() {
        let store = MemoryStore::new();
        let key = |name: &str| ObjectKey::new("p", Kind::AgentRun, name);
        for (name, group) in [("a", "g"), ("b", "g"), ("x", "h"), ("c", "g")] {
            store
                .create(&key(name), member(name, group, "Pending"))
                .await
                .expect("create");
        }
        let listings = Listings::default();
        let parsed = AtomicUsize::new(0);
        let all = ["a Pending", "b Pending", "c Pending"];
        assert_eq!(list(&listings, &store, &parsed).await.expect("list"), all);
        assert_eq!(parsed.swap(0, Ordering::SeqCst), 3, "the first reads all");
        assert_eq!(list(&listings, &store, &parsed).await.expect("list"), all);
        assert_eq!(parsed.swap(0, Ordering::SeqCst), 0, "nothing changed");

        // b written, a deleted, d created: those two parsed, c kept, a gone.
        let b = store.get(&key("b")).await.expect("b");
        store
            .update(&key("b"), b.version, member("b", "g", "Running"))
            .await
            .expect("update b");
        store.delete(&key("a")).await.expect("delete a");
        store
            .create(&key("d"), member("d", "g", "Pending"))
            .await
            .expect("create d");
        assert_eq!(
            list(&listings, &store, &parsed).await.expect("list"),
            ["b Running", "c Pending", "d Pending"]
        );
        assert_eq!(parsed.swap(0, Ordering::SeqCst), 2);

        // A listing that fails keeps nothing: the next one parses every document again.
        let c = store.get(&key("c")).await.expect("c");
        store
            .update(&key("c"), c.version, member("c", "g", "Broken"))
            .await
            .expect("break c");
        assert!(list(&listings, &store, &parsed).await.is_err());
        let c = store.get(&key("c")).await.expect("c");
        store
            .update(&key("c"), c.version, member("c", "g", "Succeeded"))
            .await
            .expect("mend c");
        parsed.store(0, Ordering::SeqCst);
        assert_eq!(
            list(&listings, &store, &parsed).await.expect("list"),
            ["b Running", "c Succeeded", "d Pending"]
        );
        assert_eq!(parsed.swap(0, Ordering::SeqCst), 3, "after a failure, all");

        // Forgotten: all again.
        listings.forget("p", "g");
        list(&listings, &store, &parsed).await.expect("list");
        assert_eq!(parsed.load(Ordering::SeqCst), 3, "forgotten, all");
    }

    #[tokio::test]
    async fn a_document_created_again_under_its_name_is_read_again_at_the_same_version() {
        let store = MemoryStore::new();
        let key = ObjectKey::new("p", Kind::AgentRun, "a");
        store
            .create(&key, member("a", "g", "Pending"))
            .await
            .expect("create a");
        let listings = Listings::default();
        let parsed = AtomicUsize::new(0);
        assert_eq!(
            list(&listings, &store, &parsed).await.expect("list"),
            ["a Pending"]
        );

        // Deleted and created again: version 1 both times, but not the document kept.
        store.delete(&key).await.expect("delete a");
        let again = store
            .create(&key, member("a", "g", "Queued"))
            .await
            .expect("create a again");
        assert_eq!(again.version, 1, "a document created again starts at 1");
        parsed.store(0, Ordering::SeqCst);
        assert_eq!(
            list(&listings, &store, &parsed).await.expect("list"),
            ["a Queued"]
        );
        assert_eq!(parsed.load(Ordering::SeqCst), 1, "the new document parsed");
    }
}
