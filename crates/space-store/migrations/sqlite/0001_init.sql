-- Portable SQL: the PostgreSQL backend runs the same statements.
CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE tenants (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    created_at BIGINT NOT NULL
);

CREATE TABLE api_keys (
    hash TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL REFERENCES tenants(id),
    admin BOOLEAN NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL REFERENCES tenants(id),
    template TEXT NOT NULL,
    template_version BIGINT,
    state TEXT NOT NULL,
    resources TEXT NOT NULL,
    env TEXT NOT NULL,
    error TEXT,
    sandbox_id TEXT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX sessions_tenant ON sessions(tenant_id, created_at);
CREATE INDEX sessions_state ON sessions(state);

-- A sandbox row is written before any node-side effect (intent first), so a crash leaves
-- a record of everything that may need cleaning up.
CREATE TABLE sandboxes (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    node_id TEXT NOT NULL,
    state TEXT NOT NULL,
    pid BIGINT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX sandboxes_state ON sandboxes(state);

CREATE TABLE operations (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    session_id TEXT,
    kind TEXT NOT NULL,
    state TEXT NOT NULL,
    input TEXT,
    error TEXT,
    progress TEXT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX operations_state ON operations(state, created_at);

CREATE TABLE events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    at BIGINT NOT NULL,
    kind TEXT NOT NULL,
    from_state TEXT,
    to_state TEXT,
    message TEXT
);
CREATE INDEX events_session ON events(session_id, seq);

CREATE TABLE idempotency (
    tenant_id TEXT NOT NULL,
    key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    status INTEGER,
    body TEXT,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, key)
);
