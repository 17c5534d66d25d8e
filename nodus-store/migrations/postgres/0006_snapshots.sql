-- Working-directory snapshots (`Store::put_snapshot`): each run's manifests by step, the
-- contents stored once by SHA-256, and which runs name which contents, so that removing a
-- run's snapshots removes the contents no other run names.
CREATE TABLE blobs (
    digest text PRIMARY KEY,
    size bigint NOT NULL,
    content bytea NOT NULL
);
CREATE TABLE snapshots (
    run_uid text NOT NULL,
    seq bigint NOT NULL,
    snapshot text NOT NULL,
    PRIMARY KEY (run_uid, seq)
);
CREATE TABLE snapshot_blobs (
    run_uid text NOT NULL,
    digest text NOT NULL,
    PRIMARY KEY (run_uid, digest)
);
CREATE INDEX snapshot_blobs_digest ON snapshot_blobs (digest);
