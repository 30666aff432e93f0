-- Retention deletes the oldest audit events by time.
CREATE INDEX audit_events_time ON audit_events(time);
