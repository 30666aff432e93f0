-- The PostgreSQL schema: what the SQLite migrations 0001 to 0014 (../sqlite) build, in one
-- step, since no PostgreSQL database predates it. The tables, columns and indexes are the
-- same (the statements in src/ run unchanged on both); only the types SQLite spells
-- differently differ: BYTEA for BLOB, identity columns for AUTOINCREMENT, BIGINT for every
-- integer. A change to the schema from now on is one migration in each directory.
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
    created_at BIGINT NOT NULL,
    id TEXT,
    name TEXT,
    last_used_at BIGINT,
    expires_at BIGINT,
    revoked_at BIGINT
);
CREATE UNIQUE INDEX api_keys_id ON api_keys (id);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id, created_at);

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
    updated_at BIGINT NOT NULL,
    source_snapshot TEXT,
    snapshot_policy TEXT,
    lifetime TEXT,
    network_policy TEXT NOT NULL DEFAULT '{}',
    ca_cert TEXT,
    ca_key_sealed BYTEA,
    idempotency_key TEXT,
    runtime TEXT NOT NULL DEFAULT 'linux',
    name TEXT,
    labels TEXT NOT NULL DEFAULT '{}',
    metadata TEXT NOT NULL DEFAULT '{}',
    auto_resume BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE INDEX sessions_tenant ON sessions(tenant_id, created_at);
CREATE INDEX sessions_state ON sessions(state);
CREATE UNIQUE INDEX sessions_idempotency_key ON sessions (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL;

CREATE TABLE session_labels (
    session_id TEXT NOT NULL REFERENCES sessions(id),
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (session_id, key)
);
CREATE INDEX session_labels_key_value ON session_labels (key, value);

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
    updated_at BIGINT NOT NULL,
    error_code TEXT
);
CREATE INDEX operations_state ON operations(state, created_at);

CREATE TABLE events (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
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
    status BIGINT,
    body TEXT,
    created_at BIGINT NOT NULL,
    interrupted BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, key)
);

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

CREATE TABLE credentials (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL REFERENCES tenants(id),
    name TEXT NOT NULL,
    hosts TEXT NOT NULL,
    header TEXT NOT NULL,
    value_sealed BYTEA NOT NULL,
    expires_at BIGINT,
    rate_limit_per_min BIGINT,
    placeholder_env TEXT,
    version BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    UNIQUE (tenant_id, name)
);

CREATE TABLE grants (
    session_id TEXT NOT NULL REFERENCES sessions(id),
    credential_id TEXT NOT NULL REFERENCES credentials(id),
    created_at BIGINT NOT NULL,
    inherited_from TEXT,
    PRIMARY KEY (session_id, credential_id)
);
CREATE INDEX grants_credential ON grants(credential_id);
CREATE INDEX grants_inherited ON grants(credential_id, inherited_from);

CREATE TABLE audit_events (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id TEXT NOT NULL,
    time BIGINT NOT NULL,
    decision TEXT NOT NULL,
    reason TEXT,
    protocol TEXT NOT NULL,
    host TEXT NOT NULL,
    port BIGINT NOT NULL,
    method TEXT,
    path TEXT,
    credential TEXT,
    bytes_sent BIGINT NOT NULL,
    bytes_received BIGINT NOT NULL
);
CREATE INDEX audit_events_session ON audit_events(session_id, time);
CREATE INDEX audit_events_time ON audit_events(time);

CREATE TABLE tenant_quotas (
    tenant_id TEXT PRIMARY KEY REFERENCES tenants(id),
    max_sessions BIGINT,
    max_cpu_millis BIGINT,
    max_memory_mib BIGINT,
    max_disk_mib BIGINT,
    updated_at BIGINT NOT NULL
);

CREATE TABLE session_ports (
    session_id TEXT NOT NULL REFERENCES sessions(id),
    port BIGINT NOT NULL,
    public BIGINT NOT NULL,
    token_hash TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (session_id, port)
);
