-- The nodes the control plane drives: what each said of itself in its last heartbeat, and
-- until when its lease holds (a node whose lease has run out is lost).
CREATE TABLE nodes (
    id TEXT PRIMARY KEY,
    address TEXT,
    version TEXT NOT NULL,
    cpus BIGINT NOT NULL,
    memory_mib BIGINT NOT NULL,
    pool TEXT NOT NULL,
    joined_at BIGINT NOT NULL,
    heartbeat_at BIGINT NOT NULL,
    lease_expires_at BIGINT NOT NULL
);
