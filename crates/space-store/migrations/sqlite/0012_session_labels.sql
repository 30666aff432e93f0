-- A session's name, labels, metadata and whether calls that need its sandbox resume it
-- when suspended. Labels are kept twice: as JSON in the row (read with the session) and one
-- row each in session_labels, which `GET /v1/sessions?label=k=v` filters on through an
-- index (portable: no JSON operators).
ALTER TABLE sessions ADD COLUMN name TEXT;
ALTER TABLE sessions ADD COLUMN labels TEXT NOT NULL DEFAULT '{}';
ALTER TABLE sessions ADD COLUMN metadata TEXT NOT NULL DEFAULT '{}';
ALTER TABLE sessions ADD COLUMN auto_resume BOOLEAN NOT NULL DEFAULT FALSE;

CREATE TABLE session_labels (
    session_id TEXT NOT NULL REFERENCES sessions(id),
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (session_id, key)
);
CREATE INDEX session_labels_key_value ON session_labels (key, value);
