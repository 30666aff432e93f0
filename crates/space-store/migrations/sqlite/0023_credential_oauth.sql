-- OAuth 2.0 credentials (kind oauth2): their settings (JSON, no secret) and the state of
-- their tokens. The client secret and refresh token are the credential's sealed value
-- (credentials.value_sealed, re-wrapped with the rest on a tenant key change); the current
-- access token is sealed here for the tenant: a cache every replica may use, refetched when
-- it no longer opens. claim_until is the lease of the replica refreshing it, so that one
-- refresh token is never spent twice.
CREATE TABLE credential_oauth (
    credential_id TEXT PRIMARY KEY,
    settings TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT,
    refreshed_at BIGINT,
    access_sealed BLOB,
    access_expires_at BIGINT,
    failures BIGINT NOT NULL DEFAULT 0,
    retry_at BIGINT,
    claim_until BIGINT
);
-- Sign-ins waiting for the provider's redirect, by the state it hands back (single use).
CREATE TABLE oauth_logins (
    state TEXT PRIMARY KEY,
    credential_id TEXT NOT NULL,
    verifier_sealed BLOB NOT NULL,
    redirect_uri TEXT NOT NULL,
    expires_at BIGINT NOT NULL
);
