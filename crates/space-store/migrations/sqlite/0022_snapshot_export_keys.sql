-- The data key a durable snapshot's objects are encrypted with in the blob store, sealed with
-- its tenant's key (docs/byok.md). NULL: an export made before exports were encrypted.
ALTER TABLE snapshots ADD COLUMN export_key_sealed BLOB;
