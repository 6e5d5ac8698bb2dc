-- The thread's owner: the subject of the principal that created it (an authorization hook
-- may ask for it, docs/authorization.md). Threads created before this migration have none.
ALTER TABLE threads ADD COLUMN owner TEXT;
