-- How many tokens were ever revoked: one row, bumped in the transaction that revokes one.
-- A gateway rechecking its connections' tokens reads it first and reads the tokens themselves
-- only when it moved (or for connections it has not checked yet), so the recheck costs one
-- row read however many connections are open. Tokens are never deleted or un-revoked.
CREATE TABLE token_revocations (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    total BIGINT NOT NULL
);
INSERT INTO token_revocations (id, total)
SELECT 1, count(*) FROM api_tokens WHERE revoked_at IS NOT NULL;
