//! A running command's output for the people following its run, as it arrives: the sandbox
//! reports it ([`Sandbox::exec_live`](crate::sandbox::Sandbox::exec_live)), and this engine
//! hands it to every follower of the run on this process ([`Engine::follow_output`]). Nothing
//! here is journaled: the command's step holds its whole output when it completes.
//!
//! Memory stays bounded and the run never waits for a follower: a run's output goes to a
//! broadcast channel of [`FOLLOW_CAPACITY`] chunks of at most [`MAX_CHUNK_BYTES`], which exists
//! only while someone follows the run; a follower that reads too slowly loses the oldest
//! chunks (the offsets show the gap) rather than holding the command up.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;
use tokio::sync::broadcast;

use super::{Engine, Result, run_uid};
use crate::sandbox::{LiveOutput, Stream};

/// How many chunks a follower may be behind before it loses the oldest.
pub const FOLLOW_CAPACITY: usize = 64;

/// The most bytes of output in one chunk: a larger report is cut into several.
pub const MAX_CHUNK_BYTES: usize = 16 << 10;

/// Output of a run's command, as it arrived.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputChunk {
    /// The command's step.
    pub seq: u32,
    /// Which of its streams.
    pub stream: Stream,
    /// Where these bytes start in what the command printed on that stream.
    pub offset: u64,
    /// The bytes.
    #[serde(skip)]
    pub bytes: Vec<u8>,
}

/// The runs followed on this process, by uid: each one's channel.
#[derive(Debug, Default)]
pub(super) struct Followed {
    runs: Mutex<HashMap<String, broadcast::Sender<OutputChunk>>>,
}

impl Followed {
    fn runs(&self) -> std::sync::MutexGuard<'_, HashMap<String, broadcast::Sender<OutputChunk>>> {
        self.runs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new follower of run `uid`. Channels nobody follows any more are dropped here.
    fn follow(&self, uid: &str) -> broadcast::Receiver<OutputChunk> {
        let mut runs = self.runs();
        runs.retain(|_, sender| sender.receiver_count() > 0);
        runs.entry(uid.to_string())
            .or_insert_with(|| broadcast::channel(FOLLOW_CAPACITY).0)
            .subscribe()
    }

    /// Hands output of step `seq` of run `uid` to its followers, if it has any.
    fn send(&self, uid: &str, seq: u32, stream: Stream, offset: u64, bytes: &[u8]) {
        let runs = self.runs();
        let Some(sender) = runs.get(uid) else {
            return;
        };
        let mut offset = offset;
        for piece in bytes.chunks(MAX_CHUNK_BYTES) {
            // No follower left: nothing to do; a full channel drops its oldest chunk.
            let _ = sender.send(OutputChunk {
                seq,
                stream,
                offset,
                bytes: piece.to_vec(),
            });
            offset += piece.len() as u64;
        }
    }
}

/// What a sandbox reports one command's output to.
pub(super) struct CommandOutput {
    pub(super) followed: Arc<Followed>,
    pub(super) uid: String,
    pub(super) seq: u32,
}

impl LiveOutput for CommandOutput {
    fn output(&self, stream: Stream, offset: u64, bytes: &[u8]) {
        self.followed
            .send(&self.uid, self.seq, stream, offset, bytes);
    }
}

impl Engine {
    /// Follow the output of run `name`'s commands, from the moment of this call, as this
    /// process runs them (a run driven by another replica shows its commands' output only in
    /// their completed steps). The receiver lags, losing the oldest chunks, when it reads
    /// too slowly.
    pub async fn follow_output(
        &self,
        project: &str,
        name: &str,
    ) -> Result<broadcast::Receiver<OutputChunk>> {
        let run = self.read_run(project, name).await?;
        Ok(self.followed.follow(run_uid(&run.object)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn followers_get_the_output_cut_into_bounded_chunks_and_lose_the_oldest_when_slow() {
        let followed = Followed::default();
        // Nobody follows: nothing is kept.
        followed.send("run", 1, Stream::Stdout, 0, b"unseen");
        assert!(followed.runs().is_empty());

        let mut follower = followed.follow("run");
        let big = vec![b'x'; MAX_CHUNK_BYTES + 10];
        followed.send("run", 3, Stream::Stdout, 5, &big);
        let first = follower.try_recv().expect("a chunk");
        assert_eq!(
            (first.seq, first.offset, first.bytes.len()),
            (3, 5, MAX_CHUNK_BYTES)
        );
        let second = follower.try_recv().expect("a chunk");
        assert_eq!(
            (second.offset, second.bytes.len()),
            (5 + MAX_CHUNK_BYTES as u64, 10)
        );

        // A slow follower: the run is never held up, and the follower lags.
        for i in 0..(FOLLOW_CAPACITY as u64 + 5) {
            followed.send("run", 4, Stream::Stderr, i, b"y");
        }
        assert!(matches!(
            follower.try_recv(),
            Err(broadcast::error::TryRecvError::Lagged(5))
        ));
        assert_eq!(follower.try_recv().expect("a chunk").offset, 5);

        // Once its last follower goes, the run's channel goes at the next follow.
        drop(follower);
        let _other = followed.follow("other");
        assert_eq!(followed.runs().len(), 1);
    }
}
