//! The engine's verbs on a kind known only at run time (the API's `{plural}` paths), on
//! documents as users write and read them: one match from a [`Kind`] to its [`Writable`] type
//! ([`documents_of`]), then the generic verbs of [`super::kinds`]; nothing here is a second
//! implementation of a verb.

use std::marker::PhantomData;

use async_trait::async_trait;
use serde_json::Value;

use super::kinds::{Writable, expected_version, without_assigned};
use super::{Engine, Error, Result};
use crate::resource::{
    Agent, AgentEnvironment, AgentGroup, AgentRun, Budget, Environment, FileSet, Kind, Secret,
};
use crate::store::{Position, Record, Selector};
use crate::validate::Invalid;

/// The generic verbs of one [`Writable`] kind, on documents.
#[async_trait]
trait Documents: Send + Sync {
    /// The kind (for the test that the dispatch agrees with the registry).
    #[cfg(test)]
    fn kind(&self) -> Kind;

    /// [`Engine::create`] of a document.
    async fn create(&self, engine: &Engine, project: &str, document: Value) -> Result<Value>;

    /// [`Engine::replace`] with a document.
    async fn replace(
        &self,
        engine: &Engine,
        project: &str,
        name: &str,
        document: Value,
        expected_version: Option<u64>,
    ) -> Result<Value>;

    /// [`Engine::patch`].
    async fn patch(
        &self,
        engine: &Engine,
        project: &str,
        name: &str,
        patch: &Value,
    ) -> Result<Value>;

    /// [`Engine::apply`] of a document.
    async fn apply(&self, engine: &Engine, project: &str, document: Value) -> Result<Value>;

    /// [`Engine::delete`].
    async fn delete(&self, engine: &Engine, project: &str, name: &str) -> Result<()>;

    /// One object as reading shows it.
    async fn get(&self, engine: &Engine, project: &str, name: &str) -> Result<Value>;

    /// A stored record as reading shows it.
    fn shown(&self, record: Record) -> Result<Value>;
}

/// [`Documents`] of the kind `K`.
struct Of<K>(PhantomData<fn() -> K>);

impl<K: Writable> Of<K> {
    const DOCUMENTS: &'static dyn Documents = &Of::<K>(PhantomData);
}

#[async_trait]
impl<K: Writable> Documents for Of<K> {
    #[cfg(test)]
    fn kind(&self) -> Kind {
        K::KIND
    }

    async fn create(&self, engine: &Engine, project: &str, document: Value) -> Result<Value> {
        let object = K::parse(document)?;
        engine.create(project, object).await?.shown()
    }

    async fn replace(
        &self,
        engine: &Engine,
        project: &str,
        name: &str,
        document: Value,
        expected_version: Option<u64>,
    ) -> Result<Value> {
        let object = K::parse(document)?;
        engine
            .replace(project, name, object, expected_version)
            .await?
            .shown()
    }

    async fn patch(
        &self,
        engine: &Engine,
        project: &str,
        name: &str,
        patch: &Value,
    ) -> Result<Value> {
        engine.patch::<K>(project, name, patch).await?.shown()
    }

    async fn apply(&self, engine: &Engine, project: &str, document: Value) -> Result<Value> {
        let object = K::parse(document)?;
        engine.apply(project, object).await?.shown()
    }

    async fn delete(&self, engine: &Engine, project: &str, name: &str) -> Result<()> {
        engine.delete::<K>(project, name).await
    }

    async fn get(&self, engine: &Engine, project: &str, name: &str) -> Result<Value> {
        engine.read_writable::<K>(project, name).await?.0.shown()
    }

    fn shown(&self, record: Record) -> Result<Value> {
        K::decode(record)?.shown()
    }
}

/// The documents of `kind`: the one place a kind named at run time becomes its type. A kind
/// users do not write ([`Kind::is_writable`]) is refused, naming the kinds they do.
fn documents_of(kind: Kind) -> Result<&'static dyn Documents> {
    Ok(match kind {
        Kind::Agent => Of::<Agent>::DOCUMENTS,
        Kind::AgentRun => Of::<AgentRun>::DOCUMENTS,
        Kind::AgentGroup => Of::<AgentGroup>::DOCUMENTS,
        Kind::Secret => Of::<Secret>::DOCUMENTS,
        Kind::Budget => Of::<Budget>::DOCUMENTS,
        Kind::FileSet => Of::<FileSet>::DOCUMENTS,
        Kind::AgentEnvironment => Of::<AgentEnvironment>::DOCUMENTS,
        Kind::Environment => Of::<Environment>::DOCUMENTS,
        Kind::Account
        | Kind::BatchRecord
        | Kind::WorkdirArchive
        | Kind::EvaluationCase
        | Kind::EgressLog
        | Kind::Extension(_) => return Err(not_writable(kind)),
    })
}

fn not_writable(kind: Kind) -> Error {
    let written: Vec<&str> = Kind::WRITABLE
        .into_iter()
        .filter_map(|kind| kind.info())
        .map(|info| info.name)
        .collect();
    Invalid::new(
        "kind",
        format!("must be a kind users write ({})", written.join(", ")),
        kind.to_string(),
    )
    .into()
}

impl Engine {
    /// [`Engine::create`] of a document of `kind` as a user wrote it; the created object as
    /// reading shows it.
    pub async fn create_document(
        &self,
        project: &str,
        kind: Kind,
        document: Value,
    ) -> Result<Value> {
        documents_of(kind)?.create(self, project, document).await
    }

    /// [`Engine::replace`] with a document of `kind` as a user wrote it (its
    /// `metadata.resourceVersion`, if any, the version expected); `status` and the metadata
    /// the store assigns are ignored.
    pub async fn replace_document(
        &self,
        project: &str,
        kind: Kind,
        name: &str,
        document: Value,
    ) -> Result<Value> {
        let expected = expected_version(&document)?;
        documents_of(kind)?
            .replace(self, project, name, without_assigned(document), expected)
            .await
    }

    /// [`Engine::patch`] of an object of `kind`.
    pub async fn patch_document(
        &self,
        project: &str,
        kind: Kind,
        name: &str,
        patch: &Value,
    ) -> Result<Value> {
        documents_of(kind)?.patch(self, project, name, patch).await
    }

    /// [`Engine::apply`] of a document of `kind` as a user wrote it.
    pub async fn apply_document(
        &self,
        project: &str,
        kind: Kind,
        document: Value,
    ) -> Result<Value> {
        documents_of(kind)?
            .apply(self, project, without_assigned(document))
            .await
    }

    /// [`Engine::delete`] of an object of `kind`.
    pub async fn delete_document(&self, project: &str, kind: Kind, name: &str) -> Result<()> {
        documents_of(kind)?.delete(self, project, name).await
    }

    /// One object of `kind` as reading shows it.
    pub async fn get_document(&self, project: &str, kind: Kind, name: &str) -> Result<Value> {
        documents_of(kind)?.get(self, project, name).await
    }

    /// The objects of `kind` that match `selector`, as reading shows them, in creation order.
    pub async fn list_documents(
        &self,
        project: &str,
        kind: Kind,
        selector: &Selector,
    ) -> Result<Vec<Value>> {
        let documents = documents_of(kind)?;
        let records = self.deps.store.list(project, kind, selector).await?;
        records
            .into_iter()
            .map(|record| documents.shown(record))
            .collect()
    }

    /// A page of [`Engine::list_documents`]: at most `limit` objects after `after`, and where
    /// the next page starts when more remain (see [`crate::Store::list_page`]).
    pub async fn list_documents_page(
        &self,
        project: &str,
        kind: Kind,
        selector: &Selector,
        after: Option<Position>,
        limit: std::num::NonZeroUsize,
    ) -> Result<(Vec<Value>, Option<Position>)> {
        let documents = documents_of(kind)?;
        let page = self
            .deps
            .store
            .list_page(project, kind, selector, after, limit)
            .await?;
        let items = page
            .records
            .into_iter()
            .map(|record| documents.shown(record))
            .collect::<Result<Vec<Value>>>()?;
        Ok((items, page.next))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The match above and the registry agree: every kind users write has its type, of that
    /// kind, and no other kind has one.
    #[test]
    fn every_writable_kind_and_only_those_dispatch_to_their_type() {
        for kind in Kind::ALL.into_iter().chain([Kind::extension("tokens")]) {
            match documents_of(kind) {
                Ok(documents) => {
                    assert!(kind.is_writable(), "{kind} is not written by users");
                    assert_eq!(documents.kind(), kind);
                }
                Err(error) => {
                    assert!(!kind.is_writable(), "{kind} has no type");
                    assert!(
                        error.to_string().contains(
                            "must be a kind users write (Agent, AgentRun, AgentGroup, Secret, \
                             Budget, FileSet, AgentEnvironment, Environment)"
                        ),
                        "{error}"
                    );
                }
            }
        }
    }
}
