-- JSON of the session's idle timeout and maximum age (space_api::SessionLifetime).
ALTER TABLE sessions ADD COLUMN lifetime TEXT;
