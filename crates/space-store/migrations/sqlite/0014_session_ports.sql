-- Ports of a session made reachable without the API key: by a token (its SHA-256 is kept,
-- the token itself only shown when made) or by anyone (`public`).
CREATE TABLE session_ports (
    session_id TEXT NOT NULL REFERENCES sessions(id),
    port INTEGER NOT NULL,
    public INTEGER NOT NULL,
    token_hash TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (session_id, port)
);
