//! Sandboxes spread over several Docker engines (`--docker-host URL[=capacity]`, repeatable):
//! a new sandbox goes to the engine that answers and has the most room (its capacity less the
//! containers of this backend it holds, whoever made them; while none has room the sandbox
//! waits, up to [`ROOM_WAIT`], then [`Error::Unavailable`]); a sandbox this process placed whose engine was lost goes to the
//! engine least over its capacity even when all are full (the replica's own capacity still
//! bounds its live sandboxes); a sandbox's container keeps its
//! name, so any replica finds it again by asking the engines. An engine that stops answering
//! fails over like a dead sandbox process: before a command, a transfer or a deletion the
//! engine of the sandbox is pinged, and one that does not answer makes the sandbox
//! [`Error::NotFound`], which the run engine answers by creating it again (on an engine that
//! answers) and running the command there; the command did not start. An engine that dies
//! during a command leaves that command's outcome unknown ([`Error::Unavailable`]): the run
//! parks, as after any interrupted command. A failed-over sandbox starts from an empty working
//! directory: what was in it lived on the lost engine.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use nodus_core::Sandbox;
use nodus_core::sandbox::{
    Error, ExecOutput, ExecRequest, LiveOutput, SandboxId, SandboxInfo, SandboxSpec,
};
use tracing::warn;

use super::DockerSandbox;

/// How long a new sandbox waits for an engine with room before its creation fails.
const ROOM_WAIT: Duration = Duration::from_secs(600);

/// How long an engine has to answer a ping before it counts as gone.
const PING: Duration = Duration::from_secs(2);

/// One engine and how many of this backend's containers it may hold.
#[derive(Debug, Clone)]
pub struct DockerHost {
    /// The engine.
    pub sandbox: DockerSandbox,
    /// The most containers of this backend it holds at once.
    pub capacity: usize,
}

impl DockerHost {
    /// Its name in `status.sandbox.host`: where it listens.
    fn name(&self) -> String {
        self.sandbox.endpoint().to_string()
    }
}

/// Sandboxes on several Docker engines. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct DockerHosts {
    hosts: Arc<Vec<DockerHost>>,
    /// The engine each sandbox is on, by index in `hosts`, as far as this process knows.
    placed: Arc<Mutex<HashMap<SandboxId, usize>>>,
    /// Sandboxes this process is making on each engine now (not counted by the engine yet):
    /// creations at the same moment see each other's.
    making: Arc<Mutex<Vec<usize>>>,
    /// Sandboxes whose engine stopped answering, until they are made again: they fail over
    /// even when every engine is full.
    lost: Arc<Mutex<HashSet<SandboxId>>>,
}

impl DockerHosts {
    /// Sandboxes placed on `hosts` (at least one).
    pub fn new(hosts: Vec<DockerHost>) -> Result<Self, Error> {
        if hosts.is_empty() {
            return Err(Error::Refused(
                "no Docker host to place sandboxes on".into(),
            ));
        }
        Ok(DockerHosts {
            making: Arc::new(Mutex::new(vec![0; hosts.len()])),
            hosts: Arc::new(hosts),
            placed: Arc::default(),
            lost: Arc::default(),
        })
    }

    fn remember(&self, id: &SandboxId, host: Option<usize>) {
        let mut placed = self.placed.lock().unwrap_or_else(PoisonError::into_inner);
        match host {
            Some(host) => placed.insert(id.clone(), host),
            None => placed.remove(id),
        };
    }

    /// The engine that holds `id` and answers, or [`Error::NotFound`]: the sandbox is on no
    /// engine that answers (its engine is gone), so it may be made again elsewhere.
    async fn host_of(&self, id: &SandboxId) -> Result<usize, Error> {
        let known = self
            .placed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .copied();
        if let Some(index) = known {
            let host = &self.hosts[index];
            if host.sandbox.answers(PING).await {
                return Ok(index);
            }
            warn!(sandbox = %id.0, host = %host.name(), "the sandbox's Docker host does not answer: it fails over");
            self.remember(id, None);
            self.lost
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(id.clone());
            return Err(Error::NotFound(id.clone()));
        }
        // Placed by another replica, or before a restart: ask the engines.
        for (index, host) in self.hosts.iter().enumerate() {
            if host.sandbox.answers(PING).await && host.sandbox.holds(id).await? {
                self.remember(id, Some(index));
                return Ok(index);
            }
        }
        Err(Error::NotFound(id.clone()))
    }

    /// The engine with the most room among those that answer (the first on a tie); with
    /// `failing_over`, one that is full too (the one least over its capacity): a sandbox whose
    /// engine was lost is made again at once rather than left without a place.
    /// The engine is counted as making one more sandbox until [`DockerHosts::made`].
    async fn roomiest(&self, failing_over: bool) -> Result<usize, Error> {
        let mut held = Vec::new();
        for (index, host) in self.hosts.iter().enumerate() {
            if host.sandbox.answers(PING).await
                && let Ok(count) = host.sandbox.count().await
            {
                held.push((index, count));
            }
        }
        let mut making = self.making.lock().unwrap_or_else(PoisonError::into_inner);
        let mut best: Option<(usize, i128)> = None;
        for (index, count) in held {
            let used = count.saturating_add(making[index]);
            let room = self.hosts[index].capacity as i128 - used as i128;
            if (room > 0 || failing_over) && best.is_none_or(|(_, most)| room > most) {
                best = Some((index, room));
            }
        }
        let (index, _) = best.ok_or_else(|| {
            Error::Unavailable(
                "no Docker host that answers has room for another sandbox".to_string(),
            )
        })?;
        making[index] += 1;
        Ok(index)
    }

    /// [`DockerHosts::roomiest`], waiting for room while every engine is full (the replica's
    /// capacity bounds how many wait), for at most [`ROOM_WAIT`].
    async fn place(&self, failing_over: bool) -> Result<usize, Error> {
        let deadline = tokio::time::Instant::now() + ROOM_WAIT;
        loop {
            match self.roomiest(failing_over).await {
                Err(Error::Unavailable(_)) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                placed => return placed,
            }
        }
    }

    /// Whether `id` is a sandbox this process placed whose engine was lost: its engine does
    /// not answer now, or did not when a call found it gone (the call that makes it again
    /// comes after). Asking forgets the second: the sandbox is being made again.
    fn failing_over(&self, id: &SandboxId) -> bool {
        let known = self
            .placed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(id);
        let lost = self
            .lost
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
        known || lost
    }

    /// A sandbox [`DockerHosts::roomiest`] chose `index` for was made (or not): the engine
    /// counts it now.
    fn made(&self, index: usize) {
        let mut making = self.making.lock().unwrap_or_else(PoisonError::into_inner);
        making[index] = making[index].saturating_sub(1);
    }
}

#[async_trait]
impl Sandbox for DockerHosts {
    /// Made again on the engine that holds it (a re-attachment), else on the engine with the
    /// most room.
    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo, Error> {
        let id = self.hosts[0].sandbox.id_of(&spec.key);
        let failing_over = self.failing_over(&id);
        let (index, placing) = match self.host_of(&id).await {
            Ok(index) => (index, false),
            Err(Error::NotFound(_)) => (self.place(failing_over).await?, true),
            Err(error) => return Err(error),
        };
        let host = &self.hosts[index];
        let created = host.sandbox.create(spec).await;
        if placing {
            self.made(index);
        }
        let mut info = created?;
        self.remember(&info.id, Some(index));
        info.host = Some(host.name());
        Ok(info)
    }

    async fn exec(&self, id: &SandboxId, request: &ExecRequest) -> Result<ExecOutput, Error> {
        self.hosts[self.host_of(id).await?]
            .sandbox
            .exec(id, request)
            .await
    }

    async fn exec_live(
        &self,
        id: &SandboxId,
        request: &ExecRequest,
        live: Arc<dyn LiveOutput>,
    ) -> Result<ExecOutput, Error> {
        self.hosts[self.host_of(id).await?]
            .sandbox
            .exec_live(id, request, live)
            .await
    }

    async fn put_files(&self, id: &SandboxId, tar: Vec<u8>) -> Result<(), Error> {
        self.hosts[self.host_of(id).await?]
            .sandbox
            .put_files(id, tar)
            .await
    }

    async fn get_files(
        &self,
        id: &SandboxId,
        path: &str,
        max_bytes: usize,
    ) -> Result<Vec<u8>, Error> {
        self.hosts[self.host_of(id).await?]
            .sandbox
            .get_files(id, path, max_bytes)
            .await
    }

    async fn list_files(
        &self,
        id: &SandboxId,
    ) -> Result<Vec<nodus_core::snapshot::FileStat>, Error> {
        self.hosts[self.host_of(id).await?]
            .sandbox
            .list_files(id)
            .await
    }

    async fn changes(&self, id: &SandboxId) -> Result<nodus_core::snapshot::Changes, Error> {
        self.hosts[self.host_of(id).await?]
            .sandbox
            .changes(id)
            .await
    }

    /// A sandbox whose engine is gone is deleted as far as this process can: nothing is left
    /// to do here (the engine's own restart policy is the operator's).
    async fn destroy(&self, id: &SandboxId) -> Result<(), Error> {
        match self.host_of(id).await {
            Ok(index) => {
                self.hosts[index].sandbox.destroy(id).await?;
                self.remember(id, None);
                Ok(())
            }
            Err(Error::NotFound(_)) => Ok(()),
            Err(error) => Err(error),
        }
    }

    async fn suspend(&self, id: &SandboxId) -> Result<(), Error> {
        self.hosts[self.host_of(id).await?]
            .sandbox
            .suspend(id)
            .await
    }

    fn supports_image(&self) -> bool {
        true
    }

    /// The digest the first engine that answers gives (an image's ID is its content's
    /// digest, the same on every engine).
    async fn resolve_image(&self, reference: &str) -> Result<String, Error> {
        let mut last = None;
        for host in self.hosts.iter() {
            if !host.sandbox.answers(PING).await {
                continue;
            }
            match host.sandbox.resolve_image(reference).await {
                Ok(digest) => return Ok(digest),
                Err(error) => last = Some(error),
            }
        }
        Err(last.unwrap_or_else(|| Error::Unavailable("no Docker host answers".to_string())))
    }

    fn supports_gpu(&self) -> bool {
        self.hosts.iter().all(|host| host.sandbox.supports_gpu())
    }

    /// Only when every engine can: a remote one's containers cannot reach this server's
    /// egress proxy, and a run is not held back for the local ones.
    fn supports_egress(&self) -> bool {
        self.hosts.iter().all(|host| host.sandbox.supports_egress())
    }
}
