//! Reading resources, and deleting runs and groups: the delete hooks of those kinds
//! ([`super::Writable::remove`]), reached through [`Engine::delete`].

use super::{Engine, Error, Result, Versioned, typed};
use crate::lifecycle::RunPhase;
use crate::resource::{AgentGroupSpec, AgentRunSpec, Kind, Object, Spec};
use crate::store::{ObjectKey, Selector};

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

    /// Delete a run: a started run is cancelled first, so its sandbox is deleted.
    pub(super) async fn delete_run(&self, project: &str, name: &str) -> Result<()> {
        self.delete_one_run(project, name, true).await
    }

    /// [`delete_run`](Engine::delete_run), reconciling the run's group afterwards or not (a
    /// group being deleted is not).
    async fn delete_one_run(&self, project: &str, name: &str, reconcile: bool) -> Result<()> {
        let run = self.read_run(project, name).await?;
        let phase = run.object.status.current_phase();
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
        let archive = super::workdir_archive_key(&ObjectKey::new(project, Kind::AgentRun, name));
        match self.deps.store.delete(&archive).await {
            Ok(()) | Err(crate::store::Error::NotFound(_)) => {}
            Err(e) => return Err(e.into()),
        }
        crate::egress_log::delete(self.deps.store.as_ref(), super::run_uid(&run.object)).await?;
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
    pub(super) async fn delete_group(&self, project: &str, name: &str) -> Result<()> {
        self.get::<AgentGroupSpec>(project, name).await?;
        self.delete_members(project, name).await?;
        let key = ObjectKey::new(project, Kind::AgentGroup, name);
        self.deps.store.delete(&key).await?;
        self.delete_members(project, name).await?;
        self.delete_cases(project, name).await
    }

    /// Delete every run of a group.
    async fn delete_members(&self, project: &str, group: &str) -> Result<()> {
        let selector = Selector::in_group(group);
        for run in self.list::<AgentRunSpec>(project, &selector).await? {
            match self.delete_one_run(project, run.name(), false).await {
                Ok(()) | Err(Error::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}
