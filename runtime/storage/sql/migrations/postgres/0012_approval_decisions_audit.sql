-- Approvals as a workflow (issue 29; docs/operations.md, "Approvals and the audit log").

-- Each decision on an approval is its own committed row, written in the transaction that adds
-- it to the action's progress; one per decider (distinct deciders make a quorum).
CREATE TABLE action_decisions (
    thread_id    TEXT NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    action_id    TEXT NOT NULL,
    subject      TEXT NOT NULL,
    display_name TEXT NOT NULL,
    approved     BOOLEAN NOT NULL,
    payload      TEXT NOT NULL,
    decided_at   DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (thread_id, action_id, subject)
);

-- The audit log: append-only, one hash chain per scope. `hash` is sha256 over the entry's
-- fields and `prev_hash` (the previous entry's hash in the scope, '' for the first), so an
-- edited row breaks its own hash and a deleted one breaks the next entry's link.
CREATE TABLE audit_log (
    scope          TEXT NOT NULL,
    seq            BIGINT NOT NULL,
    event          TEXT NOT NULL,
    thread_id      TEXT NOT NULL,
    action_id      TEXT NOT NULL,
    subject        TEXT NOT NULL,
    token_id       TEXT,
    display_name   TEXT NOT NULL,
    transport      TEXT,
    client_address TEXT,
    user_agent     TEXT,
    at             DOUBLE PRECISION NOT NULL,
    detail         TEXT NOT NULL,
    payload_hash   TEXT NOT NULL,
    prev_hash      TEXT NOT NULL,
    hash           TEXT NOT NULL,
    PRIMARY KEY (scope, seq)
);
CREATE INDEX audit_log_thread ON audit_log (thread_id, seq);
