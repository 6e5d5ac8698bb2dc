-- Idempotency keys of write transactions (sql_keys.py): every keyed write inserts its key in
-- the same transaction, so a retry after an unknown COMMIT outcome can tell that it committed.
CREATE TABLE commit_keys (
    key        TEXT PRIMARY KEY,
    created_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX commit_keys_created ON commit_keys (created_at);
