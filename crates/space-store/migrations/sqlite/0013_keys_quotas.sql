-- API keys get an id (the handle to list, revoke and rotate them by; keys from before get
-- one derived from their hash, which is portable SQL and reveals nothing of the secret), a
-- name, when they were last used (to the minute), an optional expiry and when they were
-- revoked. Revoked keys are kept, so a listing shows them and their hash never works again.
ALTER TABLE api_keys ADD COLUMN id TEXT;
ALTER TABLE api_keys ADD COLUMN name TEXT;
ALTER TABLE api_keys ADD COLUMN last_used_at BIGINT;
ALTER TABLE api_keys ADD COLUMN expires_at BIGINT;
ALTER TABLE api_keys ADD COLUMN revoked_at BIGINT;
UPDATE api_keys SET id = 'key_' || substr(hash, 1, 20) WHERE id IS NULL;
UPDATE api_keys SET name = 'admin' WHERE admin AND name IS NULL;
CREATE UNIQUE INDEX api_keys_id ON api_keys (id);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id, created_at);

-- Per-tenant limits; NULL is unlimited, and a tenant without a row has no limits. CPUs are
-- kept in thousandths so sums are exact.
CREATE TABLE tenant_quotas (
    tenant_id TEXT PRIMARY KEY REFERENCES tenants(id),
    max_sessions BIGINT,
    max_cpu_millis BIGINT,
    max_memory_mib BIGINT,
    max_disk_mib BIGINT,
    updated_at BIGINT NOT NULL
);
