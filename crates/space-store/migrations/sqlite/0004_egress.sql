-- Egress: a session's network policy (JSON of space_api::egress::NetworkPolicy; '{}' denies
-- everything), its certificate authority (the certificate in PEM; the key sealed by
-- space-keys), credentials (values sealed, never in clear), grants and the gateway's audit.
ALTER TABLE sessions ADD COLUMN network_policy TEXT NOT NULL DEFAULT '{}';
ALTER TABLE sessions ADD COLUMN ca_cert TEXT;
ALTER TABLE sessions ADD COLUMN ca_key_sealed BLOB;

CREATE TABLE credentials (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL REFERENCES tenants(id),
    name TEXT NOT NULL,
    hosts TEXT NOT NULL,
    header TEXT NOT NULL,
    value_sealed BLOB NOT NULL,
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
    PRIMARY KEY (session_id, credential_id)
);
CREATE INDEX grants_credential ON grants(credential_id);

CREATE TABLE audit_events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    time BIGINT NOT NULL,
    decision TEXT NOT NULL,
    reason TEXT,
    protocol TEXT NOT NULL,
    host TEXT NOT NULL,
    port INTEGER NOT NULL,
    method TEXT,
    path TEXT,
    credential TEXT,
    bytes_sent BIGINT NOT NULL,
    bytes_received BIGINT NOT NULL
);
CREATE INDEX audit_events_session ON audit_events(session_id, time);
