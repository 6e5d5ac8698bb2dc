-- Postgres adds a function here (acquire_run_lease in one round trip); SQLite keeps the
-- transaction of runtime/storage/sql_leases.py (its statements are local calls, not round
-- trips), so nothing changes. Kept so both backends list the same migrations.
SELECT 1;
