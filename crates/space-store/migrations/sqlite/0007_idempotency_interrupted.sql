-- A key whose request was still running when the server stopped: its request may or may not
-- have taken effect (a session may exist), so a retry must neither run it again (a duplicate)
-- nor wait for it for ever. Such records are marked at start-up and answered with a conflict
-- that says so.
ALTER TABLE idempotency ADD COLUMN interrupted INTEGER NOT NULL DEFAULT 0;
