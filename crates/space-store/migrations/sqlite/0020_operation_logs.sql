-- The output of long operations (Dockerfile builds), line by line, so that any replica can
-- serve it (`GET /v1/operations/{id}/logs`). `seq` counts from 0 per operation.
CREATE TABLE operation_logs (
    operation_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    line TEXT NOT NULL,
    PRIMARY KEY (operation_id, seq)
);
