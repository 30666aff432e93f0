-- Idempotency records written before this migration hold what must not be at rest: their
-- fingerprints are plain SHA-256 hashes of request bodies (which may contain a credential
-- value: anyone with the database could test guesses of it offline), and the recorded
-- responses include those of `POST /v1/keys` (plaintext API keys). Fingerprints are keyed
-- from now on and such responses are never recorded; the old records cannot be told apart
-- or made safe, so they go. A retry of a request made before the upgrade runs it again.
DELETE FROM idempotency;
