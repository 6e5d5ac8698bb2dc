-- Numbered like Postgres's 0013 (the GIN index on thread metadata) so both backends list the
-- same migrations. SQLite cannot index inside JSON by key without knowing the key: its
-- metadata filter (`json_each`) reads the scope's threads through threads_scope_updated.
SELECT 1;
