-- Working-directory snapshots (`Store::put_snapshot`): each run's manifests by step, the
-- contents stored once by SHA-256, and which runs name which contents, so that removing a
-- run's snapshots removes the contents no other run names.
CREATE TABLE blobs (
    digest TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    content BLOB NOT NULL
);
CREATE TABLE snapshots (
    run_uid TEXT NOT NULL,
    seq INTEGER NOT NULL,
    snapshot TEXT NOT NULL,
    PRIMARY KEY (run_uid, seq)
);
CREATE TABLE snapshot_blobs (
    run_uid TEXT NOT NULL,
    digest TEXT NOT NULL,
    PRIMARY KEY (run_uid, digest)
);
CREATE INDEX snapshot_blobs_digest ON snapshot_blobs (digest);
