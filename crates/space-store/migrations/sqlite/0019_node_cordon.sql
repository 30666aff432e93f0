-- A cordoned node takes no new sessions, and resumes and forks from durable snapshots kept on
-- it start on another node (`space node cordon`, `space node drain`). 1: cordoned.
ALTER TABLE nodes ADD COLUMN cordoned BIGINT NOT NULL DEFAULT 0;
