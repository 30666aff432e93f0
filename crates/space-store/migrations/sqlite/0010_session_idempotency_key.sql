-- The Idempotency-Key a session was created under, written in the transaction that creates
-- it: a retry after a crash finds the session instead of creating a second one.
ALTER TABLE sessions ADD COLUMN idempotency_key TEXT;
CREATE UNIQUE INDEX sessions_idempotency_key ON sessions (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
