-- Versions of global templates deleted through the API: a node that was down during the delete
-- still holds its copy, which must neither come back to the other nodes nor stay on it.
CREATE TABLE deleted_templates (
    name TEXT NOT NULL,
    version BIGINT NOT NULL,
    deleted_at BIGINT NOT NULL,
    PRIMARY KEY (name, version)
);
