//! Commands in a Docker sandbox: attaching to the container's first process and running a
//! command through its channel, within its bounds.

use std::path::Path;
use std::sync::Arc;

use nodus_core::sandbox::{Error, ExecOutput, ExecRequest, LiveOutput, SandboxId};
use tracing::debug;

use super::channel::{Channel, Next};
use super::{
    Bounds, DRAIN_GRACE, DockerSandbox, KillOnDrop, Ran, Turn, api_error, channel, status,
};
use crate::channel::{self as framing, Reading};
use crate::{capped, paths};

impl DockerSandbox {
    /// Attaches to the container's first process, starting the container if it stopped.
    async fn attach(&self, id: &SandboxId) -> Result<Channel, Error> {
        let name = &id.0;
        let found = match self.docker.inspect_container(name, None).await {
            Ok(found) => found,
            Err(e) if status(&e) == Some(404) => return Err(Error::NotFound(id.clone())),
            Err(e) => return Err(api_error("inspecting the container", e)),
        };
        let channel = Channel::attach(&self.docker, name)
            .await
            .map_err(|e| api_error("attaching to the container", e))?;
        if found.state.as_ref().and_then(|s| s.running) != Some(true) {
            self.start(name).await?;
        }
        Ok(channel)
    }

    /// [`Sandbox::exec`], reporting the command's output to `live` when given.
    pub(super) async fn exec_reporting(
        &self,
        id: &SandboxId,
        request: &ExecRequest,
        live: Option<&Arc<dyn LiveOutput>>,
    ) -> Result<ExecOutput, Error> {
        let limits = self.limits_of(id)?;
        let request = request.within(&limits)?;
        let shown_cwd = request.cwd.clone().unwrap_or_default();
        let rel = paths::relative(Path::new(&shown_cwd))
            .map_err(|why| Error::Refused(format!("working directory {shown_cwd:?} {why}")))?;
        let dir = self.inside(&rel)?;
        let slot = self.slot_of(id);
        let mut held = slot.lock().await;
        let cap = capped::cap_len(request.output_cap);
        let watch = self.disk_watch(id, &limits).await;
        let start = match &watch {
            Some(watch) => watch.start().await,
            None => 0,
        };
        let ran = self
            .run_command(
                id,
                &mut held,
                &dir,
                &request.command,
                Bounds {
                    timeout: request.timeout,
                    cap,
                    watch: watch.as_ref().map(|w| (w, start)),
                    live,
                },
            )
            .await?;
        let mut stopped = None;
        let (exit_code, reading) = match ran {
            Ran::Ended(reading) => {
                let status = reading.status()?;
                (Some(status), reading)
            }
            Ran::TimedOut(reading) => (None, reading),
            Ran::Stopped(reading, reason) => {
                stopped = Some(reason);
                (None, reading)
            }
            Ran::Closed(_) => {
                return Err(Error::Unavailable(format!(
                    "the first process of {id} ended while a command ran"
                )));
            }
        };
        let exit_code = exit_code.map(|s| s.exit_code(&shown_cwd)).transpose()?;
        if let (Some(watch), None, Some(_)) = (&watch, &stopped, exit_code) {
            stopped = watch.reached(start).await;
        }
        Ok(reading.into_exec_output(exit_code, stopped))
    }

    /// Runs `command` in the container directory `dir` through the channel in `held` (the
    /// caller holds the sandbox's slot), attaching when there is none. The channel leaves the
    /// slot while the command runs and goes back only when it ended cleanly: a future dropped
    /// half-way leaves the next command a fresh attachment. Once more on a fresh attachment
    /// when the stream closed before the command began (the container restarted since).
    pub(super) async fn run_command(
        &self,
        id: &SandboxId,
        held: &mut Turn,
        dir: &str,
        command: &str,
        bounds: Bounds<'_>,
    ) -> Result<Ran, Error> {
        let nonce = framing::nonce();
        let frame = framing::frame(&nonce, dir, command)?;
        if let Some(killing) = held.killing.take() {
            // Whatever it answers, the kill is over: nothing of the dropped command is left.
            let _ = killing.await;
        }
        let mut guard = KillOnDrop {
            sandbox: None,
            name: id.0.clone(),
            killing: &mut held.killing,
        };
        let mut fresh = false;
        loop {
            let channel = match held.channel.take() {
                Some(channel) => channel,
                None => {
                    fresh = true;
                    self.attach(id).await?
                }
            };
            let (ran, channel) = self
                .run_in(&mut guard, channel, &nonce, &frame, bounds)
                .await?;
            held.channel = channel;
            match ran {
                Ran::Closed(reading) if !reading.begun() && !fresh => {}
                ran => return Ok(ran),
            }
        }
    }

    /// Sends one command's frame through `channel` and reads its output until both end
    /// markers or the timeout (which kills the command's processes, after which output is
    /// still read for a moment), or until the disk `watch` (with the working directory's size
    /// at the start) stops the command the same way. Gives the channel back when it can serve
    /// another command.
    async fn run_in(
        &self,
        guard: &mut KillOnDrop<'_>,
        mut channel: Channel,
        nonce: &str,
        frame: &[u8],
        bounds: Bounds<'_>,
    ) -> Result<(Ran, Option<Channel>), Error> {
        let Bounds {
            timeout,
            cap,
            watch,
            live,
        } = bounds;
        let name = guard.name.clone();
        let mut reading = Reading::live(nonce, cap, live.cloned());
        if let Err(e) = channel.send(frame).await {
            // The attachment is gone (the container stopped): the command did not begin.
            debug!(container = %name, error = %e, "cannot send a command");
            return Ok((Ran::Closed(reading), None));
        }
        guard.sandbox = Some(self.clone());
        let deadline = tokio::time::Instant::now() + timeout;
        let watchdog = async {
            match watch {
                Some((watch, start)) => watch.until_stopped(start).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(watchdog);
        let mut stopped = None;
        while !reading.done() {
            // Reading the stream is cancel-safe: a chunk not yet taken stays in it.
            let next = tokio::select! {
                next = tokio::time::timeout_at(deadline, channel.next()) => next,
                reason = &mut watchdog => {
                    stopped = Some(reason);
                    break;
                }
            };
            match next {
                Ok(Ok(Next::Chunk(chunk))) => channel::feed(&mut reading, &chunk)?,
                Ok(Ok(Next::Closed)) => {
                    guard.sandbox = None;
                    return Ok((Ran::Closed(reading), None));
                }
                Ok(Err(e)) => return Err(api_error("reading the command's output", e)),
                Err(_) => break,
            }
        }
        guard.sandbox = None;
        if reading.done() {
            return Ok((Ran::Ended(reading), Some(channel)));
        }
        let restarted = self.kill_all(&name).await;
        let grace = tokio::time::Instant::now() + DRAIN_GRACE;
        let mut usable = false;
        while let Ok(Ok(Next::Chunk(chunk))) = tokio::time::timeout_at(grace, channel.next()).await
        {
            if channel::feed(&mut reading, &chunk).is_err() {
                break;
            }
            if reading.done() {
                usable = true;
                break;
            }
        }
        let ran = match stopped {
            Some(reason) => Ran::Stopped(reading, reason),
            None => Ran::TimedOut(reading),
        };
        Ok((ran, (usable && !restarted).then_some(channel)))
    }
}
