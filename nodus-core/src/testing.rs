//! Test doubles for code built on nodus-core: a manual clock and a recording sandbox; and
//! [`process_cpu`], which benchmarks read their CPU time from.
//!
//! They stand in for the `Clock` and `Sandbox` traits in tests of the engine and of what is
//! built above it, never in place of a backend's own tests.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use jiff::{SignedDuration, Timestamp};

use crate::clock::Clock;
use crate::engine::{Driven, Engine};
use crate::output::Output;
use crate::sandbox::{self, ExecOutput, ExecRequest, Sandbox, SandboxId, SandboxInfo, SandboxSpec};

/// A clock that moves only when told. `sleep` moves it forward at once (a pause the code
/// takes is over at once); `sleep_until` waits until [`advance`](ManualClock::advance) moves
/// the clock to the time it waits for (a deadline comes when the test says so). It knows the
/// times waited for ([`waited_for`](ManualClock::waited_for)), so that a test can wait for a
/// settled state (the runner's alarm set at a deadline) instead of sleeping real time.
#[derive(Debug)]
pub struct ManualClock {
    now: tokio::sync::watch::Sender<Timestamp>,
    /// The times `sleep_until` waits for now, each with how many wait for it.
    waits: tokio::sync::watch::Sender<BTreeMap<Timestamp, usize>>,
}

impl ManualClock {
    /// A clock at `start`.
    pub fn new(start: Timestamp) -> Self {
        ManualClock {
            now: tokio::sync::watch::Sender::new(start),
            waits: tokio::sync::watch::Sender::new(BTreeMap::new()),
        }
    }

    /// The times something waits for now (`sleep_until`), earliest first.
    pub fn waited_for(&self) -> Vec<Timestamp> {
        self.waits.borrow().keys().copied().collect()
    }

    /// Once something waits for `at` (`sleep_until(at)`): with the clock before `at`, what
    /// waits for it sleeps until the test advances the clock past it.
    pub async fn until_waited_for(&self, at: Timestamp) {
        let mut waits = self.waits.subscribe();
        // The sender lives as long as the clock, which outlives this borrow of it.
        let _ = waits.wait_for(|waits| waits.contains_key(&at)).await;
    }

    /// Move the clock forward (waking what waits for a time it passes).
    pub fn advance(&self, by: Duration) {
        let by = SignedDuration::try_from(by).unwrap_or(SignedDuration::MAX);
        self.now
            .send_modify(|now| *now = now.checked_add(by).unwrap_or(Timestamp::MAX));
    }
}

impl Default for ManualClock {
    /// A clock at 2026-01-01T00:00:00Z.
    fn default() -> Self {
        ManualClock::new(Timestamp::from_second(1_767_225_600).unwrap_or(Timestamp::UNIX_EPOCH))
    }
}

#[async_trait]
impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.now.borrow()
    }

    async fn sleep(&self, duration: Duration) {
        self.advance(duration);
    }

    async fn sleep_until(&self, at: Timestamp) {
        /// Counts a wait while it lasts (also when the waiting future is dropped).
        struct Waiting<'c>(
            &'c tokio::sync::watch::Sender<BTreeMap<Timestamp, usize>>,
            Timestamp,
        );
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.send_modify(|waits| {
                    if let Some(count) = waits.get_mut(&self.1) {
                        *count -= 1;
                        if *count == 0 {
                            waits.remove(&self.1);
                        }
                    }
                });
            }
        }
        self.waits
            .send_modify(|waits| *waits.entry(at).or_default() += 1);
        let _waiting = Waiting(&self.waits, at);
        let mut now = self.now.subscribe();
        // The sender lives as long as the clock, which outlives this borrow of it.
        let _ = now.wait_for(|now| *now >= at).await;
    }
}

/// Driving a run or reconciling a group by hand, for tests of the engine and benchmarks: an
/// embedder's runs and groups are driven by the [`Runner`](crate::Runner) only, so the
/// engine's own `drive` and `reconcile_group` are not public.
#[async_trait]
pub trait Drive {
    /// Drive a run as far as it goes now, as the runner does: until it finishes, waits,
    /// parks, or is not admitted yet. Completed steps are taken from the journal, never
    /// repeated.
    async fn drive(&self, project: &str, name: &str) -> crate::engine::Result<Driven>;

    /// Reconcile a group as the runner does: start the queued runs that may start, cancel
    /// those whose dependencies failed, and write the group's status.
    async fn reconcile_group(
        &self,
        project: &str,
        name: &str,
    ) -> crate::engine::Result<crate::resource::AgentGroup>;

    /// How many tasks of this process wait now to write the run whose uid is `uid` (a drive
    /// or a resolution held back while another writes it): a test that must know a writer
    /// is held back waits for this instead of sleeping.
    fn writers_waiting(&self, uid: &str) -> usize;

    /// How many batches of new runs of this process wait now to join `group` of `project`
    /// (held back while another batch joins it).
    fn joining_waiting(&self, project: &str, group: &str) -> usize;
}

#[async_trait]
impl Drive for Engine {
    async fn drive(&self, project: &str, name: &str) -> crate::engine::Result<Driven> {
        Engine::drive(self, project, name).await
    }

    async fn reconcile_group(
        &self,
        project: &str,
        name: &str,
    ) -> crate::engine::Result<crate::resource::AgentGroup> {
        Engine::reconcile_group(self, project, name).await
    }

    fn writers_waiting(&self, uid: &str) -> usize {
        Engine::writers_waiting(self, uid)
    }

    fn joining_waiting(&self, project: &str, group: &str) -> usize {
        Engine::joining_waiting(self, project, group)
    }
}

#[derive(Debug, Default)]
struct RecordingState {
    live: BTreeSet<String>,
    created: u32,
    destroyed: u32,
    executions: Vec<String>,
    suspended: BTreeSet<String>,
    files: BTreeMap<String, Vec<u8>>,
    failures: Vec<sandbox::Error>,
}

/// A sandbox that runs no process: `echo TEXT` prints `TEXT`, `exit N` exits with `N`, and
/// every other command prints `ran: COMMAND`. It records every command it "executes", so tests
/// can count side effects, and can be told to fail its next commands.
#[derive(Debug, Default)]
pub struct RecordingSandbox {
    state: Mutex<RecordingState>,
}

impl RecordingSandbox {
    /// An empty recorder.
    pub fn new() -> Self {
        RecordingSandbox::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, RecordingState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The last archive put into sandbox `id`.
    pub fn archive(&self, id: &str) -> Option<Vec<u8>> {
        self.state().files.get(id).cloned()
    }

    /// Every command executed, in order (repeats included).
    pub fn executions(&self) -> Vec<String> {
        self.state().executions.clone()
    }

    /// How many times `command` was executed.
    pub fn count(&self, command: &str) -> usize {
        self.state()
            .executions
            .iter()
            .filter(|c| c.as_str() == command)
            .count()
    }

    /// Sandboxes that exist now.
    pub fn live(&self) -> Vec<String> {
        self.state().live.iter().cloned().collect()
    }

    /// Sandboxes suspended since their last command.
    pub fn suspended(&self) -> Vec<String> {
        self.state().suspended.iter().cloned().collect()
    }

    /// (created, destroyed) counts.
    pub fn lifecycle_counts(&self) -> (u32, u32) {
        let state = self.state();
        (state.created, state.destroyed)
    }

    /// Make the next `exec` fail with `error` (the command is recorded as executed first when
    /// the error is `Unavailable` or `Failed`: its outcome is then truly unknown).
    pub fn fail_next_exec(&self, error: sandbox::Error) {
        self.state().failures.push(error);
    }

    fn run(command: &str) -> ExecOutput {
        let (exit_code, stdout) = if let Some(text) = command.strip_prefix("echo ") {
            (0, format!("{text}\n"))
        } else if let Some(code) = command.strip_prefix("exit ") {
            (code.trim().parse().unwrap_or(1), String::new())
        } else {
            (0, format!("ran: {command}\n"))
        };
        ExecOutput {
            exit_code: Some(exit_code),
            stdout: Output::complete(stdout),
            stderr: Output::default(),
            timed_out: false,
            stopped: None,
        }
    }
}

#[async_trait]
impl Sandbox for RecordingSandbox {
    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo, sandbox::Error> {
        let mut state = self.state();
        if state.live.insert(spec.key.clone()) {
            state.created += 1;
        }
        Ok(SandboxInfo {
            id: SandboxId(spec.key.clone()),
            isolated: true,
            host: None,
        })
    }

    async fn exec(
        &self,
        id: &SandboxId,
        request: &ExecRequest,
    ) -> Result<ExecOutput, sandbox::Error> {
        let mut state = self.state();
        if !state.live.contains(&id.0) {
            return Err(sandbox::Error::NotFound(id.clone()));
        }
        if !state.failures.is_empty() {
            let error = state.failures.remove(0);
            if matches!(
                error,
                sandbox::Error::Unavailable(_) | sandbox::Error::Failed(_)
            ) {
                state.executions.push(request.command.clone());
            }
            return Err(error);
        }
        state.executions.push(request.command.clone());
        state.suspended.remove(&id.0);
        Ok(Self::run(&request.command))
    }

    async fn put_files(&self, id: &SandboxId, tar: Vec<u8>) -> Result<(), sandbox::Error> {
        if tar.len() > sandbox::MAX_ARCHIVE_BYTES {
            return Err(sandbox::Error::Refused(format!(
                "an archive of {} bytes is larger than {} bytes",
                tar.len(),
                sandbox::MAX_ARCHIVE_BYTES
            )));
        }
        self.state().files.insert(id.0.clone(), tar);
        Ok(())
    }

    async fn get_files(
        &self,
        id: &SandboxId,
        _path: &str,
        _max_bytes: usize,
    ) -> Result<Vec<u8>, sandbox::Error> {
        Ok(self.state().files.get(&id.0).cloned().unwrap_or_default())
    }

    async fn suspend(&self, id: &SandboxId) -> Result<(), sandbox::Error> {
        let mut state = self.state();
        if state.live.contains(&id.0) {
            state.suspended.insert(id.0.clone());
        }
        Ok(())
    }

    async fn destroy(&self, id: &SandboxId) -> Result<(), sandbox::Error> {
        let mut state = self.state();
        state.suspended.remove(&id.0);
        if state.live.remove(&id.0) {
            state.destroyed += 1;
        }
        Ok(())
    }
}

/// The CPU time this process has used so far, user and system, all its threads (from
/// `/proc/self/stat`, in clock ticks of 10 ms; zero where it cannot be read): what benchmarks
/// report beside wall time.
pub fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which ends with the last ')'): utime is the 12th,
    // stime the 13th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}
