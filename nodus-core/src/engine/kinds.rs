//! The kinds users write (Agents, AgentRuns, AgentGroups, FileSets, AgentEnvironments,
//! Secrets, Budgets, Environments: [`Kind::WRITABLE`]) and the one path through which each is
//! created, replaced, merge-patched, applied and deleted, so that a rule a kind states here
//! holds for every verb.
//!
//! A kind is a [`Writable`]: how its documents read ([`Writable::parse`]), the rules every
//! write obeys ([`Writable::check`]), which changes a live object takes
//! ([`Writable::replaced`]), and what its creation, a write and its deletion do besides
//! storing (hooks: a run is admitted to its group, a group reconciled, a Secret sealed, a
//! run's sandbox and payloads go with it). The engine's verbs ([`Engine::create`],
//! [`Engine::replace`], [`Engine::patch`], [`Engine::apply`], [`Engine::delete`]) are written
//! once over it; [`super::documents`] takes the kind at run time, for the API. What Nodus
//! knows of a kind besides (its names, its place in an apply) is the registry,
//! [`Kind::info`].

use async_trait::async_trait;
use serde_json::Value;

use super::{Engine, Error, Result, typed};
use crate::resource::{
    AgentEnvironmentSpec, AgentGroupSpec, AgentRunSpec, AgentSpec, BudgetSpec, FileSetSpec, Kind,
    Object, ObjectMeta, Secret, SecretDocument, Spec,
};
use crate::store::{ObjectKey, Record};
use crate::validate::{self, Invalid, Validate};

/// How many times a write that found the object changed since it was read is tried again
/// (when the caller named no version: the change applies to the object as it is now).
const STALE_ATTEMPTS: u32 = 20;

/// A kind users write, and the rules of writing it.
#[async_trait]
pub trait Writable: Clone + std::fmt::Debug + Send + Sync + Sized + 'static {
    /// The kind.
    const KIND: Kind;

    /// Its metadata.
    fn metadata(&self) -> &ObjectMeta;

    /// Its metadata, to change.
    fn metadata_mut(&mut self) -> &mut ObjectMeta;

    /// The name it is stored and addressed under: its `metadata.name` (an Environment's is
    /// `NAME@VERSION`).
    fn key_name(&self) -> String {
        name_of(self.metadata()).to_string()
    }

    /// Reads a document as a user writes it (unknown fields refused) and checks the rules
    /// that need nothing but the document.
    fn parse(document: Value) -> Result<Self, Invalid>;

    /// What reading shows of it (a Secret's keys, never its values).
    fn shown(&self) -> Result<Value>;

    /// The document a merge patch applies to: as reading shows it, but a Secret with its
    /// values (opened here, never answered), so that a patch of its labels keeps them.
    fn editable(&self, engine: &Engine) -> Result<Value> {
        let _ = engine;
        self.shown()
    }

    /// Fills in what a document may leave out (a group task's name).
    fn prepare(&mut self) {}

    /// The rules every write obeys — create, replace, merge patch, apply, one run of a batch:
    /// the kind's validation, and what this engine refuses of an object of `project`.
    fn check(&self, engine: &Engine, project: &str) -> Result<()>;

    /// What to store when `new` replaces `current` (both checked), or why the kind refuses
    /// this change of a live object.
    fn replaced(current: Self, new: Self) -> Result<Self>;

    /// The document to store.
    fn encode(&self, engine: &Engine, key: &ObjectKey) -> Result<Value>;

    /// A stored record as this kind (its `metadata.resourceVersion` set).
    fn decode(record: Record) -> Result<Self>;

    /// Stores a new, checked object (stamped with its project, uid and creation time) and
    /// does what its creation does besides.
    async fn insert(engine: &Engine, project: &str, object: Self) -> Result<Self> {
        let mut object = object;
        let key = ObjectKey::new(project, Self::KIND, object.key_name());
        engine.stamp_meta(project, object.metadata_mut());
        let record = engine
            .deps
            .store
            .create(&key, object.encode(engine, &key)?)
            .await?;
        Self::decode(record)
    }

    /// What a create or replace does after its write; the object to answer.
    async fn written(engine: &Engine, project: &str, object: Self) -> Result<Self> {
        let _ = (engine, project);
        Ok(object)
    }

    /// Held by [`Engine::replace`] from its read of the object to its write, so that the
    /// write comes between no other task's read and write that depend on what it changes.
    /// Nothing by default.
    async fn hold_to_replace(engine: &Engine, project: &str, name: &str) -> Option<Held> {
        let _ = (engine, project, name);
        None
    }

    /// Deletes the object and what goes with it.
    async fn remove(engine: &Engine, project: &str, name: &str) -> Result<()> {
        engine.remove_document(project, Self::KIND, name).await
    }
}

/// What [`Writable::hold_to_replace`] holds: one of the engine's keyed locks.
pub(super) type Held = tokio::sync::OwnedMutexGuard<()>;

/// `object` as JSON (a failure is a bug in a kind's types, reported as corrupt).
fn shown(kind: Kind, name: &str, object: &impl serde::Serialize) -> Result<Value> {
    serde_json::to_value(object).map_err(|e| Error::Corrupt {
        key: format!("{kind}/{name}"),
        message: e.to_string(),
    })
}

fn name_of(metadata: &ObjectMeta) -> &str {
    metadata.name.as_deref().unwrap_or_default()
}

/// The rules of a kind written as an [`Object`] (`apiVersion`, `kind`, `metadata`, `spec`,
/// `status`), beyond its [`Validate`] rules.
#[async_trait]
pub trait SpecRules: Validate {
    /// The name an object is stored and addressed under (its `metadata.name`).
    fn key_name(object: &Object<Self>) -> String {
        object.name().to_string()
    }

    /// Fills in what a document may leave out.
    fn prepare(object: &mut Object<Self>) {
        let _ = object;
    }

    /// What this engine refuses of an object of this kind in `project`, however it is
    /// written.
    fn refuse(object: &Object<Self>, engine: &Engine, project: &str) -> Result<()> {
        let _ = (object, engine, project);
        Ok(())
    }

    /// The spec to store when `new` replaces `current`'s, or why it may not.
    fn replaced(current: &Object<Self>, new: Self) -> Result<Self> {
        let _ = current;
        Ok(new)
    }

    /// Stores a new object (stamped, its status empty) and does what creating it does.
    async fn insert(engine: &Engine, project: &str, object: Object<Self>) -> Result<Object<Self>> {
        engine.insert_object(project, object).await
    }

    /// What a create or replace does after its write; the object to answer.
    async fn written(engine: &Engine, project: &str, object: Object<Self>) -> Result<Object<Self>> {
        let _ = (engine, project);
        Ok(object)
    }

    /// [`Writable::hold_to_replace`].
    async fn hold_to_replace(engine: &Engine, project: &str, name: &str) -> Option<Held> {
        let _ = (engine, project, name);
        None
    }

    /// Deletes the object and what goes with it.
    async fn remove(engine: &Engine, project: &str, name: &str) -> Result<()> {
        engine.remove_document(project, Self::KIND, name).await
    }
}

#[async_trait]
impl<S: SpecRules> Writable for Object<S> {
    const KIND: Kind = S::KIND;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }

    fn key_name(&self) -> String {
        S::key_name(self)
    }

    fn parse(document: Value) -> Result<Self, Invalid> {
        validate::parse(document)
    }

    fn shown(&self) -> Result<Value> {
        shown(S::KIND, self.name(), self)
    }

    fn prepare(&mut self) {
        S::prepare(self);
    }

    fn check(&self, engine: &Engine, project: &str) -> Result<()> {
        validate::validate(self)?;
        S::refuse(self, engine, project)
    }

    async fn hold_to_replace(engine: &Engine, project: &str, name: &str) -> Option<Held> {
        S::hold_to_replace(engine, project, name).await
    }

    fn replaced(current: Self, new: Self) -> Result<Self> {
        let spec = S::replaced(&current, new.spec)?;
        let mut updated = current;
        updated.spec = spec;
        updated.metadata.labels = new.metadata.labels;
        updated.metadata.annotations = new.metadata.annotations;
        Ok(updated)
    }

    fn encode(&self, _: &Engine, key: &ObjectKey) -> Result<Value> {
        typed::encode(key, self)
    }

    fn decode(record: Record) -> Result<Self> {
        Ok(typed::decode(record)?.object)
    }

    async fn insert(engine: &Engine, project: &str, object: Self) -> Result<Self> {
        S::insert(engine, project, object).await
    }

    async fn written(engine: &Engine, project: &str, object: Self) -> Result<Self> {
        S::written(engine, project, object).await
    }

    async fn remove(engine: &Engine, project: &str, name: &str) -> Result<()> {
        S::remove(engine, project, name).await
    }
}

impl SpecRules for AgentSpec {
    /// Every post-run action the agent declares must be installed, and the AgentEnvironment
    /// it names must be one of its own project's.
    fn refuse(object: &Object<Self>, engine: &Engine, project: &str) -> Result<()> {
        engine.check_agent(&object.spec)?;
        super::environment::check_reference(project, object.spec.environment.as_ref())
    }
}

/// Runs keep their snapshot of an environment, so it may change freely.
impl SpecRules for AgentEnvironmentSpec {}

impl SpecRules for FileSetSpec {}

impl SpecRules for BudgetSpec {}

#[async_trait]
impl SpecRules for AgentGroupSpec {
    /// A live group takes a raised cap, another `maxActive` and sealing (see
    /// [`crate::group::check_update`]); an evaluation group's `spec.evaluation` never changes.
    fn replaced(current: &Object<Self>, new: Self) -> Result<Self> {
        super::evaluation::check_unchanged(&current.spec, &new)?;
        crate::group::check_update(&current.spec, &new)?;
        Ok(new)
    }

    /// A group's agent must exist when it is created; an evaluation group is created with its
    /// runs and cases.
    async fn insert(engine: &Engine, project: &str, object: Object<Self>) -> Result<Object<Self>> {
        if object.spec.evaluation.is_some() {
            return engine.create_evaluation_group(project, object).await;
        }
        engine.resolve_agent(project, &object.spec.agent).await?;
        engine.insert_object(project, object).await
    }

    /// A group is reconciled after every write: what it starts or cancels, and its status.
    async fn written(engine: &Engine, project: &str, object: Object<Self>) -> Result<Object<Self>> {
        engine.reconcile_group(project, object.name()).await
    }

    /// A group changes while no batch of this process joins it (the engine's `joining`
    /// lock): a batch admitted to the group as it was (unsealed, say) is written before the
    /// change, never after it.
    async fn hold_to_replace(engine: &Engine, project: &str, name: &str) -> Option<Held> {
        Some(
            engine
                .joining
                .lock(&super::joining_key(project, name))
                .await,
        )
    }

    /// A group goes with all of its runs.
    async fn remove(engine: &Engine, project: &str, name: &str) -> Result<()> {
        engine.delete_group(project, name).await
    }
}

#[async_trait]
impl SpecRules for AgentRunSpec {
    /// A group task written without a name is named `<group>-<taskKey>`.
    fn prepare(run: &mut Object<Self>) {
        if let (Some(group), Some(task)) = (&run.spec.group, &run.spec.task_key)
            && run.metadata.name.is_none()
        {
            run.metadata.name = Some(validate::task_run_name(group, task));
        }
    }

    /// A run's spec never changes. A run whose payloads the retention sweep removed lacks its
    /// input: the same spec applied again (with its input) is no change, and the input stays
    /// removed.
    fn replaced(current: &Object<Self>, mut new: Self) -> Result<Self> {
        if current.status.payloads_removed_at.is_some() {
            new.input.clone_from(&current.spec.input);
        }
        if current.spec != new {
            return Err(Invalid::new(
                "spec",
                "cannot change once the run exists (only labels can); delete the run first, or \
                 start the new one under another name",
                "a changed spec",
            )
            .into());
        }
        Ok(new)
    }

    /// A run is created with its agent resolved and snapshotted, and admitted to its group.
    async fn insert(engine: &Engine, project: &str, run: Object<Self>) -> Result<Object<Self>> {
        engine.insert_run(project, run).await
    }

    /// A started run is cancelled first, so its sandbox is deleted.
    async fn remove(engine: &Engine, project: &str, name: &str) -> Result<()> {
        engine.delete_run(project, name).await
    }
}

#[async_trait]
impl Writable for Secret {
    const KIND: Kind = Kind::Secret;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }

    fn parse(document: Value) -> Result<Self, Invalid> {
        validate::parse_secret(document)
    }

    fn shown(&self) -> Result<Value> {
        shown(Kind::Secret, self.name(), self)
    }

    fn editable(&self, engine: &Engine) -> Result<Value> {
        let values = match &self.sealed {
            Some(sealed) => engine.deps.secrets.open(sealed)?,
            None => self.values.clone(),
        };
        let mut document = self.shown()?;
        document["stringData"] = values
            .iter()
            .map(|(key, value)| (key.clone(), Value::String(value.expose().to_string())))
            .collect::<serde_json::Map<_, _>>()
            .into();
        if let Some(object) = document.as_object_mut() {
            object.remove("keys");
        }
        Ok(document)
    }

    fn check(&self, _: &Engine, _: &str) -> Result<()> {
        Ok(validate::check_secret(self)?)
    }

    /// A Secret's values, type and labels are replaced as a whole.
    fn replaced(current: Self, new: Self) -> Result<Self> {
        let mut updated = current;
        updated.keys = new.values.keys().cloned().collect();
        updated.values = new.values;
        updated.sealed = None;
        updated.secret_type = new.secret_type;
        updated.metadata.labels = new.metadata.labels;
        updated.metadata.annotations = new.metadata.annotations;
        Ok(updated)
    }

    /// The values sealed by the engine's secret source; never in clear.
    fn encode(&self, engine: &Engine, _: &ObjectKey) -> Result<Value> {
        let sealed = engine.deps.secrets.seal(&self.values)?;
        let mut secret = self.clone();
        secret.keys = self.values.keys().cloned().collect();
        secret.metadata.resource_version = None;
        shown(
            Kind::Secret,
            self.name(),
            &SecretDocument::of(&secret, Some(sealed)),
        )
    }

    fn decode(record: Record) -> Result<Self> {
        let document: SecretDocument =
            serde_json::from_value(record.document).map_err(|e| Error::Corrupt {
                key: record.key.to_string(),
                message: e.to_string(),
            })?;
        let mut secret = document.into_secret();
        secret.metadata.resource_version = Some(record.version.to_string());
        Ok(secret)
    }
}

/// `metadata.resourceVersion` of a document: the version a write expects, if it names one.
pub(super) fn expected_version(document: &Value) -> Result<Option<u64>, Invalid> {
    match document.pointer("/metadata/resourceVersion") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => text.parse().map(Some).map_err(|_| {
            Invalid::new(
                "metadata.resourceVersion",
                "is the version read from the server",
                format!("{text:?}"),
            )
        }),
        Some(other) => Err(Invalid::new(
            "metadata.resourceVersion",
            "is a string",
            other.to_string(),
        )),
    }
}

/// A document as a replace reads it: without `status` and the metadata the store assigns.
pub(super) fn without_assigned(mut document: Value) -> Value {
    if let Some(object) = document.as_object_mut() {
        object.remove("status");
    }
    if let Some(metadata) = document.get_mut("metadata").and_then(Value::as_object_mut) {
        for field in ["resourceVersion", "uid", "creationTimestamp"] {
            metadata.remove(field);
        }
    }
    document
}

impl Engine {
    /// Stamps metadata of a new object: its project, a uid, the creation time.
    pub(super) fn stamp_meta(&self, project: &str, metadata: &mut ObjectMeta) {
        metadata.project = Some(project.to_string());
        metadata.uid = Some(self.new_uid());
        metadata.creation_timestamp = Some(self.deps.clock.now());
        metadata.resource_version = None;
    }

    /// Stores a new object, stamped and with an empty status.
    async fn insert_object<S: Spec>(
        &self,
        project: &str,
        mut object: Object<S>,
    ) -> Result<Object<S>> {
        let key = ObjectKey::new(project, S::KIND, object.name());
        self.stamp(project, &mut object);
        object.status = Default::default();
        let record = self
            .deps
            .store
            .create(&key, typed::encode(&key, &object)?)
            .await?;
        Ok(typed::decode(record)?.object)
    }

    /// Deletes one stored document; a missing one is `NotFound`.
    async fn remove_document(&self, project: &str, kind: Kind, name: &str) -> Result<()> {
        let key = ObjectKey::new(project, kind, name);
        match self.deps.store.delete(&key).await {
            Err(crate::store::Error::NotFound(_)) => Err(Error::NotFound {
                kind,
                name: name.to_string(),
            }),
            other => Ok(other?),
        }
    }

    /// Reads an object of a kind users write, with the version it was read at.
    pub(super) async fn read_writable<K: Writable>(
        &self,
        project: &str,
        name: &str,
    ) -> Result<(K, u64)> {
        let key = ObjectKey::new(project, K::KIND, name);
        match self.deps.store.get(&key).await {
            Ok(record) => {
                let version = record.version;
                Ok((K::decode(record)?, version))
            }
            Err(crate::store::Error::NotFound(_)) => Err(Error::NotFound {
                kind: K::KIND,
                name: name.to_string(),
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// Create an object; an existing name is refused. Every rule of its kind is checked
    /// first, and nothing is written when one fails.
    pub async fn create<K: Writable>(&self, project: &str, mut object: K) -> Result<K> {
        object.prepare();
        object.check(self, project)?;
        let created = K::insert(self, project, object).await?;
        K::written(self, project, created).await
    }

    /// Replace an object's spec and labels (what its kind lets change on a live object).
    /// With `expected_version`, the write is refused unless the object is still at that
    /// version; without, it applies to the object as it is now. Replacing with what is
    /// stored writes nothing.
    pub async fn replace<K: Writable>(
        &self,
        project: &str,
        name: &str,
        mut new: K,
        expected_version: Option<u64>,
    ) -> Result<K> {
        new.prepare();
        new.check(self, project)?;
        let given = new.key_name();
        if given != name {
            return Err(Invalid::new(
                "metadata.name",
                format!("must match the name in the path, {name:?}"),
                format!("{given:?}"),
            )
            .into());
        }
        let key = ObjectKey::new(project, K::KIND, name);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let held = K::hold_to_replace(self, project, name).await;
            let (current, version) = self.read_writable::<K>(project, name).await?;
            if let Some(expected) = expected_version
                && expected != version
            {
                return Err(crate::store::Error::Conflict {
                    key,
                    expected,
                    actual: version,
                }
                .into());
            }
            let unchanged = current.encode(self, &key)?;
            let updated = K::replaced(current.clone(), new.clone())?;
            let document = updated.encode(self, &key)?;
            if document == unchanged {
                // Nothing to write (a server starting on a full disk applies its template
                // again). A Secret is sealed afresh every time, so it is always written.
                drop(held);
                return K::written(self, project, current).await;
            }
            let written = self.deps.store.update(&key, version, document).await;
            drop(held);
            match written {
                Err(crate::store::Error::Conflict { .. })
                    if expected_version.is_none() && attempt < STALE_ATTEMPTS =>
                {
                    continue;
                }
                Err(error) => return Err(error.into()),
                Ok(record) => return K::written(self, project, K::decode(record)?).await,
            }
        }
    }

    /// Apply a JSON merge patch (RFC 7396) to an object as [`Writable::editable`] shows it,
    /// and replace the object with the result. A patch naming `metadata.resourceVersion`
    /// applies only to that version; without, to the object as it is now.
    pub async fn patch<K: Writable>(&self, project: &str, name: &str, patch: &Value) -> Result<K> {
        if !patch.is_object() {
            return Err(Invalid::new("", "a merge patch is a JSON object", "another shape").into());
        }
        if patch.get("status").is_some() {
            return Err(Invalid::new(
                "status",
                "is written by Nodus, not patched",
                "a status patch",
            )
            .into());
        }
        let pinned = expected_version(patch)?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (current, version) = self.read_writable::<K>(project, name).await?;
            let mut document = current.editable(self)?;
            crate::patch::merge(&mut document, patch);
            let new = K::parse(without_assigned(document))?;
            match self
                .replace(project, name, new, Some(pinned.unwrap_or(version)))
                .await
            {
                Err(error)
                    if error.is_stale_version() && pinned.is_none() && attempt < STALE_ATTEMPTS =>
                {
                    continue;
                }
                other => return other,
            }
        }
    }

    /// Create an object, or replace the existing one's spec and labels.
    pub async fn apply<K: Writable>(&self, project: &str, mut object: K) -> Result<K> {
        object.prepare();
        let name = object.key_name();
        loop {
            match self.read_writable::<K>(project, &name).await {
                Ok(_) => match self.replace(project, &name, object.clone(), None).await {
                    // Deleted meanwhile: create it.
                    Err(Error::NotFound { .. }) => continue,
                    other => return other,
                },
                Err(Error::NotFound { .. }) => match self.create(project, object.clone()).await {
                    // Created meanwhile: replace it.
                    Err(Error::Store(crate::store::Error::AlreadyExists(_))) => continue,
                    other => return other,
                },
                Err(error) => return Err(error),
            }
        }
    }

    /// Delete an object and what goes with it (a group's runs; a started run is cancelled
    /// first).
    pub async fn delete<K: Writable>(&self, project: &str, name: &str) -> Result<()> {
        K::remove(self, project, name).await
    }
}
