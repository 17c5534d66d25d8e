-- Nodus store, SQLite: resources, idempotent batches, leases and fences, journals, inboxes.

CREATE TABLE resources (
    ord INTEGER PRIMARY KEY AUTOINCREMENT,      -- creation order, for list
    project TEXT NOT NULL,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    version INTEGER NOT NULL,
    uid TEXT,                                   -- metadata.uid, keys journal and inbox
    document TEXT NOT NULL,                     -- the JSON document, exactly as written
    UNIQUE (project, kind, name)
);
CREATE INDEX resources_uid ON resources (uid);

CREATE TABLE batches (
    project TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    records TEXT NOT NULL,
    PRIMARY KEY (project, idempotency_key)
);

-- Kept after a run is deleted, so that no fence is ever issued twice.
CREATE TABLE leases (
    run_uid TEXT PRIMARY KEY,
    fence INTEGER NOT NULL,
    owner TEXT,                                 -- NULL once released or deleted
    expires_at INTEGER NOT NULL                 -- nanoseconds since the epoch
);

CREATE TABLE steps (
    run_uid TEXT NOT NULL,
    seq INTEGER NOT NULL,
    step TEXT NOT NULL,                         -- the step's intent and start, JSON
    completion TEXT,                            -- its outcome, JSON
    PRIMARY KEY (run_uid, seq)
) WITHOUT ROWID;

CREATE TABLE inbox (
    run_uid TEXT NOT NULL,
    seq INTEGER NOT NULL,
    message_key TEXT,
    payload TEXT NOT NULL,
    received_at TEXT NOT NULL,                  -- RFC 3339, to the nanosecond
    PRIMARY KEY (run_uid, seq)
);
CREATE UNIQUE INDEX inbox_keys ON inbox (run_uid, message_key) WHERE message_key IS NOT NULL;
