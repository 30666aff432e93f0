-- The API error code of a failed operation, so callers waiting for it answer with the code
-- of what went wrong (e.g. storage_full) instead of a generic one.
ALTER TABLE operations ADD COLUMN error_code TEXT;
