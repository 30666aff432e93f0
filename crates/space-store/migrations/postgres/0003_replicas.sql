-- Several control replicas over one database. An operation a replica claims carries its name
-- and a lease the replica renews while it lives; one whose lease ran out is claimed again by
-- another (docs/control-plane.md, "Replicas").
ALTER TABLE operations ADD COLUMN claimed_by TEXT;
ALTER TABLE operations ADD COLUMN lease_expires_at BIGINT;
-- Named leases: the work one replica at a time does (a node's recovery and exit watches, the
-- scheduler) and each replica's own liveness ("replica:NAME").
CREATE TABLE leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at BIGINT NOT NULL
);
-- The replica that began an idempotent request: only its death interrupts the request.
ALTER TABLE idempotency ADD COLUMN replica TEXT;
