-- Threadline schema v1 (Postgres). Timestamps are epoch seconds from the database clock,
-- JSON is stored as TEXT (orjson) so both backends share one codec.

CREATE TABLE threads (
    id               TEXT PRIMARY KEY,
    scope            TEXT NOT NULL,
    title            TEXT NOT NULL,
    version          BIGINT NOT NULL,
    metadata         TEXT NOT NULL,
    private_metadata TEXT NOT NULL,
    created_at       DOUBLE PRECISION NOT NULL,
    updated_at       DOUBLE PRECISION NOT NULL
);
CREATE INDEX threads_scope_updated ON threads (scope, updated_at DESC);

CREATE TABLE messages (
    id                TEXT PRIMARY KEY,
    thread_id         TEXT NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    position          BIGINT NOT NULL,
    role              TEXT NOT NULL,
    parts             TEXT NOT NULL,
    visibility        TEXT NOT NULL,
    run_id            TEXT,
    client_request_id TEXT,
    created_at        DOUBLE PRECISION NOT NULL,
    updated_at        DOUBLE PRECISION NOT NULL,
    UNIQUE (thread_id, position)
);
CREATE UNIQUE INDEX messages_request ON messages (thread_id, client_request_id)
    WHERE client_request_id IS NOT NULL;

CREATE TABLE runs (
    id               TEXT PRIMARY KEY,
    thread_id        TEXT NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    status           TEXT NOT NULL,
    trigger          TEXT NOT NULL,
    started_by       TEXT NOT NULL,
    input_message_id TEXT,
    episode          BIGINT NOT NULL DEFAULT 0,
    next_seq         BIGINT NOT NULL DEFAULT 0,
    stop_requested   BOOLEAN NOT NULL DEFAULT FALSE,
    error            TEXT,
    client_tools     TEXT NOT NULL,
    -- Thread version of the transaction that created the run: a strict order per thread.
    created_version  BIGINT NOT NULL,
    created_at       DOUBLE PRECISION NOT NULL,
    updated_at       DOUBLE PRECISION NOT NULL
);
CREATE INDEX runs_thread ON runs (thread_id, created_version);
CREATE INDEX runs_input_message ON runs (input_message_id);
CREATE INDEX runs_runnable ON runs (created_at) WHERE status IN ('queued', 'running', 'waiting');
-- At most one active run per thread, whatever the application does.
CREATE UNIQUE INDEX runs_one_active ON runs (thread_id)
    WHERE status IN ('queued', 'running', 'waiting');

CREATE TABLE queued_items (
    id                TEXT PRIMARY KEY,
    thread_id         TEXT NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    text              TEXT NOT NULL,
    submitted_by      TEXT NOT NULL,
    client_request_id TEXT,
    status            TEXT NOT NULL,
    interrupt         BOOLEAN NOT NULL DEFAULT FALSE,
    client_tools      TEXT NOT NULL,
    position          BIGINT NOT NULL,
    created_at        DOUBLE PRECISION NOT NULL,
    UNIQUE (thread_id, position)
);
CREATE UNIQUE INDEX queued_items_request ON queued_items (thread_id, client_request_id)
    WHERE client_request_id IS NOT NULL;

CREATE TABLE leases (
    kind        TEXT NOT NULL,
    resource_id TEXT NOT NULL,
    thread_id   TEXT NOT NULL,
    owner       TEXT NOT NULL,
    token       BIGINT NOT NULL,
    expires_at  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (kind, resource_id)
);
CREATE INDEX leases_thread ON leases (thread_id, kind);

-- Fencing tokens: one row, only ever incremented.
CREATE TABLE fencing_counter (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    value BIGINT NOT NULL
);
INSERT INTO fencing_counter (id, value) VALUES (1, 0);

CREATE TABLE api_tokens (
    token_hash TEXT PRIMARY KEY,
    subject    TEXT NOT NULL,
    role       TEXT NOT NULL,
    scopes     TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);
