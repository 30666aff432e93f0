-- Which runtime a session's sandboxes run in; sessions from before runtimes were a choice
-- ran in the linux one.
ALTER TABLE sessions ADD COLUMN runtime TEXT NOT NULL DEFAULT 'linux';
