//! Group commit: callers queue their write and wait; one writer task takes everything queued,
//! writes it in one transaction and acknowledges each write only after that transaction is
//! durable. Under load, many runs' steps share one commit (one fsync); alone, a write costs
//! one transaction as before. Postgres group-commits journal writes and atomic edits; SQLite
//! every write but batches of creates, deletes, messages and rewrites.

use async_trait::async_trait;
use nodus_core::journal::{Completion, Step};
use nodus_core::store::{Error, Fence};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

/// At most this many writes share one transaction.
pub(crate) const MAX_BATCH: usize = 512;

/// How many writes may wait for the writer before callers wait to queue.
const QUEUE: usize = 4096;

/// A journal write, checked against the run's fence and journal inside the transaction.
#[derive(Debug)]
pub(crate) enum JournalWrite {
    /// Append a step's intent.
    Append {
        /// The run's uid.
        run: String,
        /// The writer's fence.
        fence: Fence,
        /// The step (without completion).
        step: Step,
    },
    /// Record step `seq`'s outcome.
    Complete {
        /// The run's uid.
        run: String,
        /// The writer's fence.
        fence: Fence,
        /// The step.
        seq: u32,
        /// The outcome.
        completion: Completion,
    },
}

impl JournalWrite {
    /// The run written.
    pub(crate) fn run(&self) -> &str {
        match self {
            JournalWrite::Append { run, .. } | JournalWrite::Complete { run, .. } => run,
        }
    }

    /// The fence it is checked against.
    #[cfg(feature = "sqlite")]
    pub(crate) fn fence(&self) -> Fence {
        match self {
            JournalWrite::Append { fence, .. } | JournalWrite::Complete { fence, .. } => *fence,
        }
    }
}

/// Writes a batch of writes in one transaction, for the writer task that owns it.
#[async_trait]
pub(crate) trait Committer<W: Send + 'static>: Send + 'static {
    /// What a write answers when it is done (a fence for a claim, say).
    type Output: Send + 'static;
    /// Each write's own result, in order, or one error when nothing was written.
    async fn commit(&mut self, writes: Vec<W>) -> Result<Vec<Result<Self::Output, Error>>, Error>;
}

struct Queued<W, O> {
    write: W,
    done: oneshot::Sender<Result<O, Error>>,
}

/// The handle callers queue writes on. Dropping every handle stops the writer task.
#[derive(Debug)]
pub(crate) struct GroupCommit<W = JournalWrite, O = ()> {
    queue: mpsc::Sender<Box<Queued<W, O>>>,
}

impl<W, O> Clone for GroupCommit<W, O> {
    fn clone(&self) -> Self {
        GroupCommit {
            queue: self.queue.clone(),
        }
    }
}

impl<W: std::fmt::Debug, O> std::fmt::Debug for Queued<W, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.write.fmt(f)
    }
}

impl<W: Send + 'static, O: Send + 'static> GroupCommit<W, O> {
    /// Start the writer task. The committer writes a batch in one transaction and returns
    /// each write's own result (a refused write does not fail the others), or one error for
    /// all when the transaction failed and nothing was written.
    pub(crate) fn spawn(mut committer: impl Committer<W, Output = O>) -> Self {
        let (queue, mut receiver) = mpsc::channel::<Box<Queued<W, O>>>(QUEUE);
        tokio::spawn(async move {
            let mut batch: Vec<Box<Queued<W, O>>> = Vec::with_capacity(MAX_BATCH);
            let mut last_count = 0;
            while receiver.recv_many(&mut batch, MAX_BATCH).await > 0 {
                gather(&mut receiver, &mut batch, last_count).await;
                let (writes, waiters): (Vec<_>, Vec<_>) =
                    batch.drain(..).map(|q| (q.write, q.done)).unzip();
                let count = writes.len();
                last_count = count;
                let committed = committer.commit(writes).await;
                match committed {
                    Ok(results) if results.len() == count => {
                        for (done, result) in waiters.into_iter().zip(results) {
                            let _ = done.send(result);
                        }
                    }
                    Ok(results) => {
                        let error = Error::Corrupt(format!(
                            "group commit answered {} of {count} writes",
                            results.len()
                        ));
                        for done in waiters {
                            let _ = done.send(Err(error.clone()));
                        }
                    }
                    Err(error) => {
                        for done in waiters {
                            let _ = done.send(Err(error.clone()));
                        }
                    }
                }
            }
        });
        GroupCommit { queue }
    }

    /// Queue a write and wait until it is durable (or refused).
    pub(crate) async fn write(&self, write: W) -> Result<O, Error> {
        let (done, result) = oneshot::channel();
        let stopped = || Error::Unavailable("the store's writer stopped".to_string());
        self.queue
            .send(Box::new(Queued { write, done }))
            .await
            .map_err(|_| stopped())?;
        result.await.map_err(|_| stopped())?
    }
}

/// The longest a batch waits for the writers of the previous batch to queue again.
const GATHER: Duration = Duration::from_micros(300);

/// When fewer writes are queued than the previous batch had, give their writers a moment
/// (at most [`GATHER`]) to queue again: the writers just acknowledged are usually about to
/// write once more, and one commit for all of them is cheaper than several. A lone writer
/// (a previous batch of one) never waits.
async fn gather<T>(receiver: &mut mpsc::Receiver<T>, batch: &mut Vec<T>, last_count: usize) {
    let want = last_count.min(MAX_BATCH);
    if batch.len() >= want {
        return;
    }
    let until = Instant::now() + GATHER;
    while batch.len() < want && Instant::now() < until {
        tokio::task::yield_now().await;
        while batch.len() < MAX_BATCH {
            match receiver.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
    }
}

/// Split a batch into rounds in which each run appears at most once, keeping each run's
/// writes in order; returns, per round, the indexes of its writes in the batch.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) fn rounds(writes: &[JournalWrite]) -> Vec<Vec<usize>> {
    let mut rounds: Vec<Vec<usize>> = Vec::new();
    let mut next_round: std::collections::HashMap<&str, usize> = Default::default();
    for (index, write) in writes.iter().enumerate() {
        let round = next_round.entry(write.run()).or_insert(0);
        if rounds.len() <= *round {
            rounds.push(Vec::new());
        }
        if let Some(r) = rounds.get_mut(*round) {
            r.push(index);
        }
        *round += 1;
    }
    rounds
}
