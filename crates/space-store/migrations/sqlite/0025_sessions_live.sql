-- The sessions not destroyed, by tenant: what lists, quota checks and placement read. Without
-- it they walk every session a tenant ever had (destroyed ones are kept, with their events).
CREATE INDEX sessions_live ON sessions (tenant_id, created_at) WHERE state <> 'destroyed';
