-- Session-scoped tokens for sub-agents: an API key limited to one session and the sessions
-- forked from it (scope_session), and to what scope_permissions (a JSON array of read, exec,
-- fork, snapshot, destroy) allows. NULL for a tenant's ordinary keys.
ALTER TABLE api_keys ADD COLUMN scope_session TEXT;
ALTER TABLE api_keys ADD COLUMN scope_permissions TEXT;
