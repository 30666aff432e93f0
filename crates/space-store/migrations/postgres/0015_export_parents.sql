-- The snapshot an export's root stream was sent against (its `disk.parent`), so the parent's
-- export is kept while an export needs it: a deleted snapshot that an export still needs is
-- kept, hidden, in state 'retired' (only its export and key), and goes with the last export
-- that needs it.
ALTER TABLE snapshots ADD COLUMN export_parent TEXT;
CREATE INDEX snapshots_export_parent ON snapshots(export_parent);
