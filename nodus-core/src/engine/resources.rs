//! Reading, replacing and deleting resources with optimistic concurrency, for the API.

use super::{Engine, Error, Result, Versioned, typed};
use crate::lifecycle::{PendingReason, RunPhase};
use crate::resource::{AgentGroupSpec, AgentRunSpec, AgentSpec, Kind, Object, Spec};
use crate::store::{ObjectKey, Selector};
use crate::validate::{self, Invalid, Validate};

impl Engine {
    /// Read one object.
    pub async fn get<S: Spec>(&self, project: &str, name: &str) -> Result<Object<S>> {
        Ok(self.read::<S>(project, name).await?.object)
    }

    /// Read one object with the version it was read at.
    pub(super) async fn read<S: Spec>(&self, project: &str, name: &str) -> Result<Versioned<S>> {
        let key = ObjectKey::new(project, S::KIND, name);
        match self.deps.store.get(&key).await {
            Ok(record) => typed::decode(record),
            Err(crate::store::Error::NotFound(_)) => Err(Error::NotFound {
                kind: S::KIND,
                name: name.to_string(),
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// Objects of a kind that match a selector, in creation order.
    pub async fn list<S: Spec>(
        &self,
        project: &str,
        selector: &Selector,
    ) -> Result<Vec<Object<S>>> {
        let records = self.deps.store.list(project, S::KIND, selector).await?;
        records
            .into_iter()
            .map(|record| typed::decode(record).map(|v| v.object))
            .collect()
    }

    /// Create an agent; an existing name is refused.
    pub async fn create_agent(
        &self,
        project: &str,
        agent: Object<AgentSpec>,
    ) -> Result<Object<AgentSpec>> {
        self.create(project, agent).await
    }

    /// Create an object of a kind that does nothing on creation (an agent, a FileSet); an
    /// existing name is refused.
    pub async fn create<S: validate::Validate>(
        &self,
        project: &str,
        mut object: Object<S>,
    ) -> Result<Object<S>> {
        validate::validate(&object)?;
        let key = ObjectKey::new(project, S::KIND, object.name());
        self.stamp(project, &mut object);
        let record = self
            .deps
            .store
            .create(&key, typed::encode(&key, &object)?)
            .await?;
        Ok(typed::decode(record)?.object)
    }

    /// Create a group; an existing name is refused.
    pub async fn create_group(
        &self,
        project: &str,
        mut group: Object<AgentGroupSpec>,
    ) -> Result<Object<AgentGroupSpec>> {
        validate::validate(&group)?;
        if group.spec.evaluation.is_some() {
            return self.create_evaluation_group(project, group).await;
        }
        self.resolve_agent(project, &group.spec.agent).await?;
        let name = group.name().to_string();
        let key = ObjectKey::new(project, Kind::AgentGroup, &name);
        self.stamp(project, &mut group);
        group.status = Default::default();
        self.deps
            .store
            .create(&key, typed::encode(&key, &group)?)
            .await?;
        self.reconcile_group(project, &name).await
    }

    /// Replace an object's spec and labels. With `expected_version`, the write is refused
    /// unless the object is still at that version. Each kind says which changes it allows:
    /// an agent any (its runs keep their snapshot), a group only raising its cap, changing
    /// `maxActive` and sealing, a run only its labels.
    pub async fn replace<S: Validate + Replaceable>(
        &self,
        project: &str,
        name: &str,
        new: Object<S>,
        expected_version: Option<u64>,
    ) -> Result<Object<S>> {
        validate::validate(&new)?;
        if new.name() != name {
            return Err(Invalid::new(
                "metadata.name",
                format!("must match the name in the path, {name:?}"),
                format!("{:?}", new.name()),
            )
            .into());
        }
        let key = ObjectKey::new(project, S::KIND, name);
        let current = self.read::<S>(project, name).await?;
        if let Some(expected) = expected_version
            && expected != current.version
        {
            return Err(crate::store::Error::Conflict {
                key,
                expected,
                actual: current.version,
            }
            .into());
        }
        let spec = S::replaced(&current.object, new.spec)?;
        let mut updated = current.object;
        updated.spec = spec;
        updated.metadata.labels = new.metadata.labels;
        updated.metadata.annotations = new.metadata.annotations;
        let record = self
            .deps
            .store
            .update(&key, current.version, typed::encode(&key, &updated)?)
            .await?;
        let replaced = typed::decode::<S>(record)?.object;
        if S::KIND == Kind::AgentGroup {
            self.reconcile_group(project, name).await?;
            return self.get(project, name).await;
        }
        Ok(replaced)
    }

    /// Delete a run: a started run is cancelled first, so its sandbox is deleted.
    pub async fn delete_run(&self, project: &str, name: &str) -> Result<()> {
        self.delete_one_run(project, name, true).await
    }

    /// [`delete_run`](Engine::delete_run), reconciling the run's group afterwards or not (a
    /// group being deleted is not).
    async fn delete_one_run(&self, project: &str, name: &str, reconcile: bool) -> Result<()> {
        let run = self.read_run(project, name).await?;
        let phase = run
            .object
            .status
            .phase
            .unwrap_or(RunPhase::Pending(PendingReason::Queued));
        if !phase.is_finished() {
            self.request_cancel(
                project,
                name,
                crate::lifecycle::CancelReason::CancelRequested,
            )
            .await?;
            // A run that had not started is cancelled now; a started one is ended by the
            // runner (its command stopped, its sandbox deleted), whichever replica drives it:
            // no request drives a run itself.
            let run = self
                .finished_run(project, name, self.config.delete_wait)
                .await?;
            if !run.status.phase.is_some_and(RunPhase::is_finished) {
                return Err(Error::RunBusy {
                    run: name.to_string(),
                });
            }
        }
        self.deps
            .store
            .delete(&ObjectKey::new(project, Kind::AgentRun, name))
            .await?;
        match self
            .deps
            .store
            .delete(&super::workdir_archive_key(&ObjectKey::new(
                project,
                Kind::AgentRun,
                name,
            )))
            .await
        {
            Ok(()) | Err(crate::store::Error::NotFound(_)) => {}
            Err(e) => return Err(e.into()),
        }
        if let Some(group) = run.object.spec.group.as_ref().filter(|_| reconcile) {
            match self.reconcile_group(project, group).await {
                Ok(_) | Err(Error::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Delete a group together with all of its runs: the runs first, so that a run that
    /// cannot go yet (another replica is ending it) leaves the group there to delete again;
    /// then the group, then any run created into it meanwhile.
    pub async fn delete_group(&self, project: &str, name: &str) -> Result<()> {
        self.get::<AgentGroupSpec>(project, name).await?;
        self.delete_members(project, name).await?;
        let key = ObjectKey::new(project, Kind::AgentGroup, name);
        self.deps.store.delete(&key).await?;
        self.delete_members(project, name).await?;
        self.delete_cases(project, name).await
    }

    /// Delete every run of a group.
    async fn delete_members(&self, project: &str, group: &str) -> Result<()> {
        let selector = Selector {
            fields: [("spec.group".to_string(), group.to_string())].into(),
            ..Selector::default()
        };
        for run in self.list::<AgentRunSpec>(project, &selector).await? {
            match self.delete_one_run(project, run.name(), false).await {
                Ok(()) | Err(Error::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Delete an agent (its runs keep their snapshot and go on).
    pub async fn delete_agent(&self, project: &str, name: &str) -> Result<()> {
        self.delete::<AgentSpec>(project, name).await
    }

    /// Delete an object of a kind that does nothing on deletion (an agent, a FileSet: runs
    /// keep their snapshot of an agent, and a FileSet is read when a sandbox is created).
    pub async fn delete<S: Spec>(&self, project: &str, name: &str) -> Result<()> {
        let key = ObjectKey::new(project, S::KIND, name);
        match self.deps.store.delete(&key).await {
            Err(crate::store::Error::NotFound(_)) => Err(Error::NotFound {
                kind: S::KIND,
                name: name.to_string(),
            }),
            other => Ok(other?),
        }
    }
}

/// Which changes of its spec a kind allows on a live object.
pub trait Replaceable: Spec {
    /// The spec to store when `new` replaces `current`'s, or why it may not.
    fn replaced(current: &Object<Self>, new: Self) -> Result<Self>;
}

impl Replaceable for AgentSpec {
    fn replaced(_: &Object<Self>, new: Self) -> Result<Self> {
        Ok(new)
    }
}

impl Replaceable for crate::resource::FileSetSpec {
    fn replaced(_: &Object<Self>, new: Self) -> Result<Self> {
        Ok(new)
    }
}

impl Replaceable for AgentGroupSpec {
    fn replaced(current: &Object<Self>, new: Self) -> Result<Self> {
        super::evaluation::check_unchanged(&current.spec, &new)?;
        crate::group::check_update(&current.spec, &new)?;
        Ok(new)
    }
}

impl Replaceable for AgentRunSpec {
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
}
