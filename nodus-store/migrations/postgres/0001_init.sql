-- Nodus store, Postgres: resources, idempotent batches, leases and fences, journals, inboxes.
-- Documents are `json` (not `jsonb`): the text is kept exactly as written, so money in
-- decimal strings and every number come back digit for digit.

CREATE TABLE resources (
    ord bigserial PRIMARY KEY,                  -- creation order, for list
    project text NOT NULL,
    kind text NOT NULL,
    name text NOT NULL,
    version bigint NOT NULL,
    uid text,                                   -- metadata.uid, keys journal and inbox
    document json NOT NULL,
    UNIQUE (project, kind, name)
);
CREATE INDEX resources_uid ON resources (uid);
CREATE INDEX resources_kind_ord ON resources (kind, ord);

CREATE TABLE batches (
    project text NOT NULL,
    idempotency_key text NOT NULL,
    records json NOT NULL,
    PRIMARY KEY (project, idempotency_key)
);

-- Kept after a run is deleted, so that no fence is ever issued twice.
CREATE TABLE leases (
    run_uid text PRIMARY KEY,
    fence bigint NOT NULL,
    owner text,                                 -- NULL once released or deleted
    expires_at bigint NOT NULL                  -- nanoseconds since the epoch
);

CREATE TABLE steps (
    run_uid text NOT NULL,
    seq bigint NOT NULL,
    step json NOT NULL,                         -- the step's intent and start
    completion json,                            -- its outcome
    PRIMARY KEY (run_uid, seq)
);

CREATE TABLE inbox (
    run_uid text NOT NULL,
    seq bigint NOT NULL,
    message_key text,
    payload text NOT NULL,
    received_at text NOT NULL,                  -- RFC 3339, to the nanosecond
    PRIMARY KEY (run_uid, seq)
);
CREATE UNIQUE INDEX inbox_keys ON inbox (run_uid, message_key) WHERE message_key IS NOT NULL;
