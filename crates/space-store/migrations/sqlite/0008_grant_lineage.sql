-- A fork's grants follow its parent's: `inherited_from` names the session a grant was copied
-- from when the session was forked, so revoking that session's grant revokes this one too
-- (and, through it, its own forks'). NULL: the session's own grant (granted on it, or
-- detached), which only a revoke on the session itself removes.
ALTER TABLE grants ADD COLUMN inherited_from TEXT;
CREATE INDEX grants_inherited ON grants(credential_id, inherited_from);

-- Forks made before this column existed: a grant that the parent (the session of the
-- snapshot the fork started from) holds too was copied from it at the fork.
UPDATE grants SET inherited_from = (
    SELECT sn.session_id FROM sessions s JOIN snapshots sn ON sn.id = s.source_snapshot
    WHERE s.id = grants.session_id
)
WHERE EXISTS (
    SELECT 1 FROM sessions s
    JOIN snapshots sn ON sn.id = s.source_snapshot
    JOIN grants p ON p.session_id = sn.session_id AND p.credential_id = grants.credential_id
    WHERE s.id = grants.session_id AND sn.session_id != grants.session_id
);
