-- tower-redlock: the idempotency keys' table (durable replay, `tower_redlock::durable`).
-- Apply it with your own migration tool; `Table::migration` gives it for another name.
-- One row per completed key: inserted by the handler as the first statement of its own
-- transaction (so it exists if and only if the work committed), its response stored right
-- after the commit by the middleware. No raw key: `key_hash` is the SHA-256 of the
-- middleware's (hashed, scoped) lock key. `run_id` names the execution that wrote the row,
-- so that only it stores its response there.
CREATE TABLE IF NOT EXISTS tower_redlock_keys (
    key_hash    bytea       PRIMARY KEY CHECK (octet_length(key_hash) = 32),
    fingerprint bytea       NOT NULL,
    record      bytea,
    run_id      bytea       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);
-- The retention sweep deletes expired rows in batches, oldest first.
CREATE INDEX IF NOT EXISTS tower_redlock_keys_expires_at ON tower_redlock_keys (expires_at);
