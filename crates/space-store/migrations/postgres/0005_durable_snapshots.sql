-- Where a snapshot was taken (NULL before several nodes: its session's node), and what it
-- became in the blob store (JSON of space_api::durable::SnapshotExport; NULL: not durable,
-- it lives on its node's disk only).
ALTER TABLE snapshots ADD COLUMN node_id TEXT;
ALTER TABLE snapshots ADD COLUMN export TEXT;
