-- A session's node is the node of its newest sandbox (its snapshots are kept there too):
-- read with every session, so found by index.
CREATE INDEX sandboxes_session ON sandboxes(session_id, created_at);
