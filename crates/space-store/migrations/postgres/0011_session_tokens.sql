-- Session-scoped tokens for sub-agents: an API key limited to one session and the sessions
-- forked from it (scope_session), and to what scope_permissions (a JSON array of read, exec,
-- fork, snapshot, destroy) allows. NULL for a tenant's ordinary keys.
ALTER TABLE api_keys ADD COLUMN scope_session TEXT;
ALTER TABLE api_keys ADD COLUMN scope_permissions TEXT;
-- The session a fork was made from, kept for good (its source snapshot may be deleted): what
-- tells a token's forks, at any depth, from the tenant's other sessions.
ALTER TABLE sessions ADD COLUMN forked_from TEXT;
UPDATE sessions SET forked_from = (SELECT session_id FROM snapshots WHERE snapshots.id = sessions.source_snapshot)
WHERE source_snapshot IS NOT NULL;
