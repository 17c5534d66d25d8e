//! The attachment to a Docker sandbox's first process, over which the shared [command
//! channel](crate::channel) runs: its stdin takes the frames, its stdout and stderr come back
//! as the engine's multiplexed stream.

use std::pin::Pin;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::query_parameters::AttachContainerOptionsBuilder;
use futures_util::{Stream, StreamExt};
use nodus_core::sandbox::Error;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::channel::Reading;

type OutputStream = Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>;

/// An attachment to a container's first process: its stdin, and its stdout and stderr.
pub(super) struct Channel {
    input: Pin<Box<dyn AsyncWrite + Send>>,
    output: OutputStream,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Channel")
    }
}

/// What the channel said next.
pub(super) enum Next {
    /// More output of the first process.
    Chunk(LogOutput),
    /// The first process's streams ended: it exited or the container stopped.
    Closed,
}

impl Channel {
    /// Attaches to the container `name` (created, running or not).
    pub(super) async fn attach(
        docker: &Docker,
        name: &str,
    ) -> Result<Self, bollard::errors::Error> {
        let options = AttachContainerOptionsBuilder::new()
            .stdin(true)
            .stdout(true)
            .stderr(true)
            .stream(true)
            .logs(false)
            .build();
        let attached = docker.attach_container(name, Some(options)).await?;
        Ok(Channel {
            input: attached.input,
            output: attached.output,
        })
    }

    /// Sends one frame to the first process.
    pub(super) async fn send(&mut self, frame: &[u8]) -> std::io::Result<()> {
        self.input.write_all(frame).await?;
        self.input.flush().await
    }

    /// The next output of the first process.
    pub(super) async fn next(&mut self) -> Result<Next, bollard::errors::Error> {
        match self.output.next().await {
            Some(Ok(chunk)) => Ok(Next::Chunk(chunk)),
            Some(Err(e)) => Err(e),
            None => Ok(Next::Closed),
        }
    }
}

/// Gives one chunk of the first process's output to the command being read.
pub(super) fn feed(reading: &mut Reading, chunk: &LogOutput) -> Result<(), Error> {
    match chunk {
        LogOutput::StdOut { message } => reading.stdout.feed(message),
        LogOutput::StdErr { message } => reading.stderr.feed(message),
        _ => Ok(()),
    }
}
