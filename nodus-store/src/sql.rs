//! What the SQL backends share: the one mapping of sqlx errors to portable store errors,
//! conversions between store values and column values, and how a journal write and an
//! idempotent batch are stored.

use std::collections::HashMap;
use std::num::NonZeroUsize;

use jiff::Timestamp;
use nodus_core::journal::{Completion, Step};
use nodus_core::resource::Kind;
use nodus_core::store::{Error, ObjectKey, Page, Position, Record, RunRewrite, Seen, Sparse};
use serde_json::{Value, json};

/// The one place where sqlx errors become store errors. Connection trouble, a database that
/// is shutting down or starting, lock timeouts and serialization failures are `Unavailable`
/// (a retry may help); data that cannot be decoded is `Corrupt`. Callers that expect a
/// unique violation (a create) check [`is_unique_violation`] first.
#[cfg(feature = "postgres")]
pub(crate) fn map_err(error: sqlx::Error) -> Error {
    use sqlx::Error as E;
    match error {
        E::Io(e) if e.kind() == std::io::ErrorKind::StorageFull => disk_full(&e.to_string()),
        E::Io(e) => Error::Unavailable(format!("database I/O: {e}")),
        E::PoolTimedOut => Error::Unavailable("no database connection in time".to_string()),
        E::PoolClosed => Error::Unavailable("the store was closed".to_string()),
        E::WorkerCrashed => Error::Unavailable("the database worker stopped".to_string()),
        E::Tls(e) => Error::Unavailable(format!("database TLS: {e}")),
        E::Protocol(e) => Error::Unavailable(format!("database protocol: {e}")),
        E::Configuration(e) => Error::Unavailable(format!("database configuration: {e}")),
        E::Database(db) => map_database(&*db),
        E::Migrate(e) => Error::Corrupt(format!("schema migration failed: {e}")),
        other => Error::Corrupt(format!("unreadable database data: {other}")),
    }
}

#[cfg(feature = "postgres")]
fn map_database(db: &dyn sqlx::error::DatabaseError) -> Error {
    let code = db.code().map(|c| c.to_string()).unwrap_or_default();
    let message = format!("{} (code {code})", db.message());
    // Postgres SQLSTATEs: 08 connection exceptions, 57P01-03 shutdown and start-up,
    // 53 insufficient resources, 40001/40P01 serialization failure and deadlock, 55P03 lock
    // not available, 25006 read-only transaction (a standby during fail-over).
    let postgres_retryable = code.starts_with("08")
        || code.starts_with("53")
        || matches!(
            code.as_str(),
            "57P01" | "57P02" | "57P03" | "40001" | "40P01" | "55P03" | "25006"
        );
    // SQLite result codes (primary code in the low byte): BUSY 5, LOCKED 6, IOERR 10,
    // FULL 13, CANTOPEN 14; CORRUPT 11 and NOTADB 26 mean the file is not ours to read.
    let sqlite_code = code.parse::<i64>().ok().map(|c| c & 0xff);
    if sqlite_code == Some(13) || code == "53100" {
        return disk_full(&message);
    }
    match sqlite_code {
        Some(11 | 26) => Error::Corrupt(format!("the database file is damaged: {message}")),
        Some(5 | 6 | 10 | 13 | 14) => Error::Unavailable(message),
        _ if postgres_retryable => Error::Unavailable(message),
        // Postgres class 22, data exceptions: a value the database cannot hold (a NUL byte
        // in text, say).
        _ if code.starts_with("22") => Error::Invalid(message),
        _ => Error::Corrupt(format!("the database refused a statement: {message}")),
    }
}

/// The database's disk is full (SQLite FULL, Postgres 53100 disk_full): nothing was written,
/// and the same request succeeds once there is room.
pub(crate) fn disk_full(message: &str) -> Error {
    Error::Unavailable(format!(
        "the disk is full, so nothing was written ({message}); retry once space is freed on \
         the server"
    ))
}

/// Whether an error is a unique-key violation (a create of something that exists).
#[cfg(feature = "postgres")]
pub(crate) fn is_unique_violation(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db) if db.is_unique_violation())
}

/// A version or fence for an `INTEGER`/`bigint` column; `None` when it cannot be stored
/// (and so cannot match a stored one).
pub(crate) fn to_i64(value: u64) -> Option<i64> {
    i64::try_from(value).ok()
}

/// A stored version or fence.
pub(crate) fn to_u64(value: i64, what: &str) -> Result<u64, Error> {
    u64::try_from(value).map_err(|_| Error::Corrupt(format!("{what} is negative: {value}")))
}

/// The next version after `version`, or `Corrupt` at the end of the range.
pub(crate) fn bump(key: &ObjectKey, version: i64) -> Result<i64, Error> {
    version
        .checked_add(1)
        .ok_or_else(|| Error::Corrupt(format!("{key}: version {version} cannot be bumped")))
}

/// A time as integer nanoseconds since the epoch, for ordered comparisons in SQL.
pub(crate) fn nanos(at: Timestamp) -> Result<i64, Error> {
    i64::try_from(at.as_nanosecond())
        .map_err(|_| Error::Invalid(format!("{at} is outside the store's time range")))
}

/// A time from integer nanoseconds since the epoch.
pub(crate) fn from_nanos(value: i64) -> Result<Timestamp, Error> {
    Timestamp::from_nanosecond(i128::from(value))
        .map_err(|e| Error::Corrupt(format!("stored time {value}: {e}")))
}

/// A stored time written as RFC 3339 (exact to the nanosecond).
pub(crate) fn parse_time(text: &str) -> Result<Timestamp, Error> {
    text.parse()
        .map_err(|e| Error::Corrupt(format!("stored time {text:?}: {e}")))
}

/// A stored JSON document.
pub(crate) fn parse_document(text: &str) -> Result<Value, Error> {
    serde_json::from_str(text).map_err(|e| Error::Corrupt(format!("stored document: {e}")))
}

/// The stored document of `key` from a row whose columns `at` and `at + 1` are its version
/// and its JSON text (a Postgres row; SQLite's are read by `stored_record`).
#[cfg(feature = "postgres")]
pub(crate) fn record_of<R>(key: ObjectKey, row: &R, at: usize) -> Result<Record, Error>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let version: i64 = row.try_get(at).map_err(map_err)?;
    let document: String = row.try_get(at + 1).map_err(map_err)?;
    stored_record(key, version, &document)
}

/// The document of `key` as stored: its version and its JSON text.
pub(crate) fn stored_record(key: ObjectKey, version: i64, text: &str) -> Result<Record, Error> {
    Ok(Record {
        key,
        version: to_u64(version, "a version")?,
        document: parse_document(text)?,
    })
}

/// A sparse record from a row of `name, version, value…`, one value (JSON text, or NULL when
/// absent) per path of `paths` from column `at + 1` on; `at` is the version's column.
#[cfg(feature = "postgres")]
pub(crate) fn sparse_record_of<R>(
    key: ObjectKey,
    row: &R,
    at: usize,
    paths: &[String],
) -> Result<Record, Error>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<String>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let version: i64 = row.try_get(at).map_err(map_err)?;
    let mut document = Value::Object(serde_json::Map::new());
    for (i, path) in paths.iter().enumerate() {
        let text: Option<String> = row.try_get(at + 1 + i).map_err(map_err)?;
        if let Some(text) = text {
            nodus_core::store::set_path(&mut document, path, parse_document(&text)?);
        }
    }
    Ok(Record {
        key,
        version: to_u64(version, "a version")?,
        document,
    })
}

/// The records of listed rows (`name` first, then what `record_of` reads from column 1 on)
/// that `selector` matches exactly.
#[cfg(feature = "postgres")]
pub(crate) fn selected<R>(
    project: &str,
    kind: Kind,
    selector: &nodus_core::store::Selector,
    rows: &[R],
    record_of: impl Fn(ObjectKey, &R, usize) -> Result<Record, Error>,
) -> Result<Vec<Record>, Error>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let mut records = Vec::with_capacity(rows.len());
    for row in rows {
        let name: String = row.try_get(0).map_err(map_err)?;
        let record = record_of(ObjectKey::new(project, kind, name), row, 1)?;
        if selector.matches(&record.document) {
            records.push(record);
        }
    }
    Ok(records)
}

/// A row of a listing's page: `name, version, document, ord`.
#[derive(Debug)]
pub(crate) struct PageRow {
    pub(crate) name: String,
    pub(crate) version: i64,
    pub(crate) document: String,
    pub(crate) ord: i64,
}

/// A page of a listing in creation order, read in as many fetches as it takes: each
/// [`PageReading::next_fetch`] names a cursor and a count (at most that many rows whose `ord`
/// comes after the cursor, from the first with `None`, in that order), and
/// [`PageReading::take`] takes what it read. Reads again while the exact match of the
/// selector drops some rows and the table holds more, until the page and one more are found
/// (to tell whether more remain).
pub(crate) struct PageReading<'s> {
    project: &'s str,
    kind: Kind,
    selector: &'s nodus_core::store::Selector,
    limit: NonZeroUsize,
    cursor: Option<i64>,
    asked: usize,
    found: Vec<(Position, Record)>,
    done: bool,
}

impl<'s> PageReading<'s> {
    pub(crate) fn new(
        project: &'s str,
        kind: Kind,
        selector: &'s nodus_core::store::Selector,
        after: Option<Position>,
        limit: NonZeroUsize,
    ) -> Self {
        let (cursor, done) = match after {
            None => (None, false),
            Some(Position(order)) => match to_i64(order) {
                Some(order) => (Some(order), false),
                // Past every order the table can hold (no store gave it): nothing follows.
                None => (None, true),
            },
        };
        PageReading {
            project,
            kind,
            selector,
            limit,
            cursor,
            asked: 0,
            found: Vec::new(),
            done,
        }
    }

    fn wanted(&self) -> usize {
        self.limit.get().saturating_add(1)
    }

    /// The next fetch (the cursor and the most rows to read), or `None` when the page is
    /// complete.
    pub(crate) fn next_fetch(&mut self) -> Option<(Option<i64>, i64)> {
        if self.done {
            return None;
        }
        self.asked = self.wanted() - self.found.len();
        Some((self.cursor, i64::try_from(self.asked).unwrap_or(i64::MAX)))
    }

    /// The rows the last fetch read.
    pub(crate) fn take(&mut self, rows: Vec<PageRow>) -> Result<(), Error> {
        let read = rows.len();
        for row in rows {
            let key = ObjectKey::new(self.project, self.kind, row.name);
            let record = stored_record(key, row.version, &row.document)?;
            self.cursor = Some(row.ord);
            if self.selector.matches(&record.document) {
                self.found
                    .push((Position(to_u64(row.ord, "a creation order")?), record));
            }
        }
        self.done = read < self.asked || self.found.len() >= self.wanted();
        Ok(())
    }

    /// The page.
    pub(crate) fn page(self) -> Page {
        Page::of(self.found, self.limit)
    }
}

/// A document as text for storage.
/// A group's counters (`group_phase_counts`, kept by the migrations' triggers) as
/// [`Store::group_phases`](nodus_core::Store::group_phases) answers them: `phase_key` is `-`
/// for no phase and `+` then the phase; counts of zero or less are left out (a trigger removes
/// them); in phase order, `None` first.
pub(crate) fn group_phases_of(
    rows: Vec<(String, i64)>,
) -> Result<Vec<(Option<String>, u64)>, Error> {
    let mut counts = Vec::with_capacity(rows.len());
    for (key, members) in rows {
        let phase = match key.split_at_checked(1) {
            Some(("-", "")) => None,
            Some(("+", phase)) => Some(phase.to_string()),
            _ => return Err(Error::Corrupt(format!("group phase counter key {key:?}"))),
        };
        if let Ok(members @ 1..) = u64::try_from(members) {
            counts.push((phase, members));
        }
    }
    counts.sort_unstable();
    Ok(counts)
}

pub(crate) fn document_text(document: &Value) -> String {
    document.to_string()
}

/// What a document's row carries beside its text, for look-ups and indexes: `metadata.uid`
/// (journal and inbox), `spec.group` (a group's members) and `status.phase` (claims), each
/// when it is a string.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Columns {
    pub(crate) uid: Option<String>,
    pub(crate) group: Option<String>,
    pub(crate) phase: Option<String>,
}

impl Columns {
    pub(crate) fn of(document: &Value) -> Self {
        let text = |value: &Value| value.as_str().map(str::to_string);
        Columns {
            uid: uid_of(document).map(str::to_string),
            group: text(&document["spec"]["group"]),
            phase: text(&document["status"]["phase"]),
        }
    }
}

/// The column that holds a selectable field (see [`Columns`]).
pub(crate) fn column_of(field: &str) -> Option<&'static str> {
    match field {
        "spec.group" => Some("group_name"),
        "status.phase" => Some("phase"),
        _ => None,
    }
}

/// Pushes ` AND <column> = value` when `field` has a column of its own (which holds the field
/// when it is text, all such a field may match), through its index. Answers whether it did;
/// other fields are the caller's to match in the document.
#[cfg(feature = "postgres")]
pub(crate) fn push_column_match<'a, DB>(
    query: &mut sqlx::QueryBuilder<'a, DB>,
    field: &str,
    value: &'a str,
) -> bool
where
    DB: sqlx::Database,
    &'a str: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
{
    let Some(column) = column_of(field) else {
        return false;
    };
    query.push(" AND ");
    query.push(column);
    query.push(" = ");
    query.push_bind(value);
    true
}

/// The run uid a document carries in `metadata.uid`.
pub(crate) fn uid_of(document: &Value) -> Option<&str> {
    document["metadata"]["uid"].as_str()
}

/// A step's intent as stored (the step without its completion).
pub(crate) fn step_text(step: &Step) -> Result<String, Error> {
    let mut bare = step.clone();
    bare.completion = None;
    serde_json::to_string(&bare).map_err(|e| Error::Invalid(format!("step {}: {e}", step.seq)))
}

/// A completion as stored.
pub(crate) fn completion_text(completion: &Completion) -> Result<String, Error> {
    serde_json::to_string(completion).map_err(|e| Error::Invalid(format!("completion: {e}")))
}

/// A step read back from its stored intent and completion.
pub(crate) fn read_step(run: &str, step: &str, completion: Option<&str>) -> Result<Step, Error> {
    let mut parsed: Step = serde_json::from_str(step)
        .map_err(|e| Error::Corrupt(format!("journal of run {run}: {e}")))?;
    parsed.completion = completion
        .map(serde_json::from_str)
        .transpose()
        .map_err(|e| Error::Corrupt(format!("journal of run {run}: {e}")))?;
    Ok(parsed)
}

/// A snapshot as stored.
pub(crate) fn snapshot_text(snapshot: &nodus_core::snapshot::Stored) -> Result<String, Error> {
    serde_json::to_string(snapshot).map_err(|e| Error::Invalid(format!("snapshot: {e}")))
}

/// A snapshot read back, with its step.
pub(crate) fn read_snapshot(
    run: &str,
    seq: i64,
    text: &str,
) -> Result<(u32, nodus_core::snapshot::Stored), Error> {
    let seq = u32::try_from(seq)
        .map_err(|_| Error::Corrupt(format!("snapshot of run {run}: step {seq}")))?;
    let snapshot = serde_json::from_str(text)
        .map_err(|e| Error::Corrupt(format!("snapshot of run {run} after step {seq}: {e}")))?;
    Ok((seq, snapshot))
}

/// An inbox message from a row of `seq, message_key, payload, received_at`.
#[cfg(feature = "postgres")]
pub(crate) fn message_of<R: sqlx::Row>(row: &R) -> Result<nodus_core::store::InboxMessage, Error>
where
    usize: sqlx::ColumnIndex<R>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let seq: i64 = row.try_get(0).map_err(map_err)?;
    let received_at: String = row.try_get(3).map_err(map_err)?;
    Ok(nodus_core::store::InboxMessage {
        seq: to_u64(seq, "a message number")?,
        key: row.try_get(1).map_err(map_err)?,
        payload: row.try_get(2).map_err(map_err)?,
        received_at: parse_time(&received_at)?,
    })
}

/// The records of an idempotent batch, as stored with its key.
pub(crate) fn batch_text(records: &[Record]) -> String {
    Value::Array(
        records
            .iter()
            .map(|r| json!({ "key": r.key, "version": r.version, "document": r.document }))
            .collect(),
    )
    .to_string()
}

/// A stored batch with `edit` applied to its copy of `run`, when it holds one.
pub(crate) fn edited_batch(
    text: &str,
    run: &ObjectKey,
    edit: &dyn Fn(&mut Value),
) -> Result<Option<String>, Error> {
    let mut records = parse_batch(text)?;
    let mut changed = false;
    for record in records.iter_mut().filter(|r| r.key == *run) {
        edit(&mut record.document);
        changed = true;
    }
    Ok(changed.then(|| batch_text(&records)))
}

/// The records of an idempotent batch, read back.
pub(crate) fn parse_batch(text: &str) -> Result<Vec<Record>, Error> {
    let corrupt = |what: &str| Error::Corrupt(format!("stored batch: {what}"));
    let value: Value = serde_json::from_str(text).map_err(|e| corrupt(&e.to_string()))?;
    value
        .as_array()
        .ok_or_else(|| corrupt("not a list"))?
        .iter()
        .map(|item| {
            Ok(Record {
                key: serde_json::from_value(item["key"].clone())
                    .map_err(|e| corrupt(&e.to_string()))?,
                version: item["version"]
                    .as_u64()
                    .ok_or_else(|| corrupt("a version"))?,
                document: item["document"].clone(),
            })
        })
        .collect()
}

/// The error for a journal write out of order.
pub(crate) fn journal_error(run: &str, message: String) -> Error {
    Error::Journal {
        run: run.to_string(),
        message,
    }
}

/// Why an append was refused, from the journal's state.
pub(crate) fn append_refused(run: &str, seq: u32, len: i64) -> Error {
    journal_error(
        run,
        format!(
            "step {seq} appended out of order (the journal has {len} steps, so the next is {len})"
        ),
    )
}

/// Why a completion was refused, from the journal's state.
pub(crate) fn complete_refused(run: &str, seq: u32, len: i64, completed: bool) -> Error {
    if completed {
        journal_error(run, format!("step {seq} is already completed"))
    } else {
        journal_error(
            run,
            format!("cannot complete step {seq}: the journal has {len} steps"),
        )
    }
}

/// A selector's conditions that a query can carry: those without a NUL character, which no
/// query can bind (Postgres refuses such text, SQLite cuts a JSON path at it). The others are
/// left to the in-process filter, [`Selector::matches`](nodus_core::store::Selector::matches),
/// which every listing applies afterwards.
pub(crate) fn bindable(
    conditions: &std::collections::BTreeMap<String, String>,
) -> impl Iterator<Item = (&String, &String)> {
    conditions
        .iter()
        .filter(|(key, value)| !key.contains('\0') && !value.contains('\0'))
}

/// The path parts of a dotted selector field, or `None` when a part cannot be written as a
/// quoted JSON-path label (empty, or holding a double quote); such conditions are left to
/// the in-process filter.
#[cfg(feature = "sqlite")]
pub(crate) fn path_parts(path: &str) -> Option<Vec<&str>> {
    let parts: Vec<&str> = path.split('.').collect();
    parts
        .iter()
        .all(|p| !p.is_empty() && !p.contains('"'))
        .then_some(parts)
}

/// The uid of a run a message is posted to (its inbox is keyed by it); a run without one is
/// refused.
pub(crate) fn message_run_uid(run: &ObjectKey, uid: Option<String>) -> Result<String, Error> {
    uid.ok_or_else(|| journal_error(&run.to_string(), "the run has no metadata.uid".to_string()))
}

/// The version a message posts with, to a run stored at `current` by a sender who read
/// `expected`: the next one, or `Conflict` when the run moved on.
pub(crate) fn message_version(run: &ObjectKey, expected: u64, current: i64) -> Result<i64, Error> {
    if to_i64(expected) != Some(current) {
        return Err(Error::Conflict {
            key: run.clone(),
            expected,
            actual: to_u64(current, "a version")?,
        });
    }
    bump(run, current)
}

/// The run document of a rewrite, read inside its write: refused with `Conflict` unless still
/// at the rewrite's version, then edited and given its next version. Answers the run's uid
/// as it was (whose journal and inbox the rewrite edits too) and the version to store.
pub(crate) fn rewrite_document(
    rewrite: &RunRewrite,
    record: &mut Record,
) -> Result<(Option<String>, i64), Error> {
    let run = &rewrite.run;
    if record.version != rewrite.expected_version {
        return Err(Error::Conflict {
            key: run.clone(),
            expected: rewrite.expected_version,
            actual: record.version,
        });
    }
    let uid = uid_of(&record.document).map(str::to_string);
    (rewrite.document)(&mut record.document);
    let stored = to_i64(record.version)
        .ok_or_else(|| Error::Corrupt(format!("{run}: version {} too large", record.version)))?;
    let version = bump(run, stored)?;
    record.version = to_u64(version, "a version")?;
    Ok((uid, version))
}

/// A stored step of run `uid` as a rewrite leaves it: its number, its text and its
/// completion's text.
pub(crate) fn rewrite_step(
    rewrite: &RunRewrite,
    uid: &str,
    step: &str,
    completion: Option<&str>,
) -> Result<(i64, String, Option<String>), Error> {
    let mut step = read_step(uid, step, completion)?;
    (rewrite.step)(&mut step);
    let completion = step.completion.as_ref().map(completion_text).transpose()?;
    Ok((i64::from(step.seq), step_text(&step)?, completion))
}

/// The names of a listing (`listed`: each document's name, place and version, in creation
/// order) that `known` does not hold at that place and version: the documents
/// [`Store::list_sparse_known`](nodus_core::store::Store::list_sparse_known) reads.
pub(crate) fn unknown<'a>(
    listed: &'a [(String, Seen)],
    known: &HashMap<String, Seen>,
) -> Vec<&'a str> {
    listed
        .iter()
        .filter(|(name, seen)| known.get(name) != Some(seen))
        .map(|(name, _)| name.as_str())
        .collect()
}

/// [`Store::list_sparse_known`](nodus_core::store::Store::list_sparse_known)'s answer from
/// the listing of names, places and versions and the documents then read by the names
/// [`unknown`] gave: in the listing's order, a known document by its name, the others as
/// read (at that version or a later one), and one not read (gone, or no longer matching,
/// meanwhile) left out. A document read is answered at the place listed: one deleted and
/// created again between the two reads is answered at its old place, which the next listing
/// does not take for its own, so it is read again then.
pub(crate) fn known_or_read(
    listed: Vec<(String, Seen)>,
    known: &HashMap<String, Seen>,
    read: Vec<Record>,
) -> Vec<Sparse> {
    let mut read: HashMap<String, Record> = read
        .into_iter()
        .map(|record| (record.key.name.clone(), record))
        .collect();
    listed
        .into_iter()
        .filter_map(|(name, seen)| {
            if known.get(&name) == Some(&seen) {
                // Known there at this version: it matched the selector when it was read.
                return Some(Sparse::Known(name));
            }
            read.remove(&name).map(|record| Sparse::Read {
                at: seen.at,
                record,
            })
        })
        .collect()
}
