-- Tenants' own key-encryption keys (BYOK): a key in the tenant's KMS (an OpenBao/Vault
-- transit key) that wraps the data keys of what is sealed for the tenant (credential values,
-- session CA keys). A row never changes: a new key is a new row, and the tenant's current one
-- is tenants.key_ref (NULL: the server's local key). Old rows stay while values may name them.
-- The token that lets space use the key is sealed by the server's local key. Rows no sealed
-- value names any more are deleted after a key change that moved everything.
CREATE TABLE tenant_keys (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    provider TEXT NOT NULL,
    address TEXT NOT NULL,
    mount TEXT NOT NULL,
    key_name TEXT NOT NULL,
    token_sealed BYTEA NOT NULL,
    -- 1 for a key a tenant set (not the operator): it may not be at a loopback or private
    -- address, and network errors are reported without detail.
    public_only BIGINT NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL
);
CREATE INDEX tenant_keys_by_tenant ON tenant_keys (tenant_id);
ALTER TABLE tenants ADD COLUMN key_ref TEXT;
