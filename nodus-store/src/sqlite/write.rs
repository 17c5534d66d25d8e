//! The writes the one writer task takes and what it answers: data only, so that the
//! documents, journal and leases queue writes and the writer carries them out without
//! either importing the other.

use nodus_core::store::{Edit, Error, Fence, Lease, MemberCap, ObjectKey, Record};

use crate::commit::JournalWrite;
use crate::sql;

/// A document update, checked against the version its writer read.
#[derive(Debug)]
pub(super) struct DocumentUpdate {
    pub(super) key: ObjectKey,
    pub(super) expected: u64,
    pub(super) columns: sql::Columns,
    pub(super) text: String,
}

/// A snapshot kept with a step's outcome ([`Store::complete_step_with`]): its record names no
/// contents, so it is one row.
///
/// [`Store::complete_step_with`]: nodus_core::Store::complete_step_with
#[derive(Debug)]
pub(super) struct SnapshotRow {
    pub(super) run: String,
    pub(super) seq: u32,
    pub(super) text: String,
}

/// What a journal write carries out once it is done, in the same transaction.
#[derive(Debug)]
pub(super) struct Then {
    /// The snapshot after the step.
    pub(super) snapshot: Option<SnapshotRow>,
    /// The document replaced.
    pub(super) update: Option<DocumentUpdate>,
    /// The run's next step, appended once the document is replaced (or when there is none).
    pub(super) next: Option<nodus_core::journal::Step>,
}

/// Every write but batches of creates, deletes, messages and rewrites: queued for the one
/// writer task, which group-commits whatever is queued in one transaction (one fsync) and
/// answers each after the commit.
pub(super) enum Write {
    /// A document created ([`Store::create`]): refused if the key is taken, or if a cap of
    /// the groups it joins would not hold ([`Store::create_batch_within`]).
    Create {
        /// The document's key.
        key: ObjectKey,
        /// The document.
        document: serde_json::Value,
        /// What its creation must keep.
        caps: Vec<MemberCap>,
    },
    /// A journal write.
    Journal(JournalWrite),
    /// A journal write and, once it is done, a snapshot kept, a document replaced and the
    /// next step appended ([`Store::complete_step_with`]).
    JournalThen(JournalWrite, Then),
    /// A document replaced if still at the version its writer read.
    Replace(DocumentUpdate),
    /// A document edited in place ([`Store::modify`]).
    Edit {
        /// The document.
        key: ObjectKey,
        /// The edit.
        edit: Edit,
    },
    /// A lease granted ([`Store::claim`]).
    Claim {
        /// The run's uid.
        run: String,
        /// The lease.
        lease: Lease,
    },
    /// A lease extended or given up ([`Store::renew`], [`Store::release`]).
    Lease {
        /// The run's uid.
        run: String,
        /// The holder's fence.
        fence: Fence,
        /// The new owner and expiry; `None` gives the lease up.
        renewal: Option<Lease>,
    },
}

/// What became of the document and the next step a journal write carried.
pub(super) type ThenWritten = (Result<(), Error>, Option<Result<(), Error>>);

/// What a write answers.
#[derive(Debug)]
pub(super) enum Written {
    /// Done.
    Done,
    /// The edited document.
    Document(Record),
    /// The new fence.
    Fence(Fence),
    /// The journal write done, what became of the document replaced after it (`Ok` when
    /// there was none) and of the next step (`None` when there was none or the document was
    /// refused).
    Then(Result<(), Error>, Option<Result<(), Error>>),
}

impl Written {
    pub(super) fn fence(self) -> Result<Fence, Error> {
        match self {
            Written::Fence(fence) => Ok(fence),
            _ => Err(Error::Corrupt(
                "a claim answered without a fence".to_string(),
            )),
        }
    }

    pub(super) fn then(self) -> Result<ThenWritten, Error> {
        match self {
            Written::Then(replaced, next) => Ok((replaced, next)),
            _ => Err(Error::Corrupt(
                "a journal write with a document answered without it".to_string(),
            )),
        }
    }

    pub(super) fn document(self) -> Result<Record, Error> {
        match self {
            Written::Document(record) => Ok(record),
            _ => Err(Error::Corrupt(
                "an edit answered without its document".to_string(),
            )),
        }
    }
}

impl Write {
    pub(super) fn is_journal(&self) -> bool {
        matches!(self, Write::Journal(_) | Write::JournalThen(..))
    }
}

impl std::fmt::Debug for Write {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Write::Journal(write) => write.fmt(f),
            Write::JournalThen(write, then) => write!(f, "{write:?} then {then:?}"),
            Write::Create { key, .. } => write!(f, "Create({key})"),
            Write::Replace(update) => update.fmt(f),
            Write::Edit { key, .. } => write!(f, "Edit({key})"),
            Write::Claim { run, .. } => write!(f, "Claim({run})"),
            Write::Lease { run, .. } => write!(f, "Lease({run})"),
        }
    }
}
