-- A snapshot that outlives its session: destroying the session leaves it (and its files on the
-- node) until it is deleted, and the retention schedule never prunes it. 0 or 1.
ALTER TABLE snapshots ADD COLUMN outlives_session BIGINT NOT NULL DEFAULT 0;
