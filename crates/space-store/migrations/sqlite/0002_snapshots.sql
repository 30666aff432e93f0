-- Sessions forked from a snapshot start from it instead of their template.
ALTER TABLE sessions ADD COLUMN source_snapshot TEXT;
-- JSON of the session's snapshot policy (space_api::SnapshotPolicy).
ALTER TABLE sessions ADD COLUMN snapshot_policy TEXT;

-- A row is written (state 'creating') before the snapshot is taken, so a crash leaves a
-- record of what to clean up; only 'ready' snapshots are listed and restorable.
CREATE TABLE snapshots (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    tenant_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    name TEXT,
    parent TEXT,
    state TEXT NOT NULL,
    size_bytes BIGINT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX snapshots_session ON snapshots(session_id, created_at);
