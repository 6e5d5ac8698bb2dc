-- Postgres adds a function here (start_run: the run lease and start_episode in one round
-- trip); SQLite starts the episode in its own transaction after the lease (Store.start_run:
-- its statements are local calls, not round trips), so nothing changes. Kept so both backends
-- list the same migrations.
SELECT 1;
