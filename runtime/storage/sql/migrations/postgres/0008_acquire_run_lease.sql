-- acquire_run_lease in one statement (one round trip instead of five: BEGIN with the key
-- claim, the thread lock, the reads after it, the grant, COMMIT), called outside BEGIN ...
-- COMMIT: the statement's own transaction is the one the Python path ran. Same steps, same
-- order, same decisions (runtime/storage/decisions.py: run_leasable, lease_free), same rows
-- written (runtime/storage/sql_leases.py: _grant). Each statement of a VOLATILE function takes
-- a new snapshot under READ COMMITTED, so the reads after the lock see what it protects.
--
-- outcome: 'granted' (the lease's columns set; taken_over: an expired lease row was
-- replaced), 'busy' (not leasable now; nothing but the key written), 'replayed' (the key was
-- claimed by an earlier attempt of this call that committed: the lease columns are the run's
-- live lease if that attempt granted it to this owner, else NULL). A run that does not exist
-- raises SQLSTATE P0002 (no_data_found): nothing is written.
CREATE FUNCTION threadline_acquire_run_lease(
    p_key TEXT, p_run_id TEXT, p_owner TEXT, p_ttl DOUBLE PRECISION
) RETURNS TABLE (
    outcome TEXT, kind TEXT, resource_id TEXT, thread_id TEXT, owner TEXT, token BIGINT,
    expires_at DOUBLE PRECISION, taken_over BOOLEAN
) LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_now DOUBLE PRECISION;
    v_thread threads%ROWTYPE;
    v_status TEXT;
    v_stop BOOLEAN;
    v_admin DOUBLE PRECISION;
    v_held DOUBLE PRECISION;
    v_held_exists BOOLEAN;
    v_token BIGINT;
    v_lease leases%ROWTYPE;
BEGIN
    -- The key claim first (sql_keys.claim): an earlier attempt still committing makes it wait.
    INSERT INTO commit_keys (key, created_at)
    VALUES (p_key, extract(epoch from clock_timestamp())::double precision)
    ON CONFLICT (key) DO NOTHING;
    IF NOT FOUND THEN
        v_now := extract(epoch from clock_timestamp())::double precision;
        SELECT * INTO v_lease FROM leases l
        WHERE l.kind = 'run' AND l.resource_id = p_run_id AND l.owner = p_owner
            AND l.expires_at > v_now;
        RETURN QUERY SELECT 'replayed'::text, v_lease.kind, v_lease.resource_id,
            v_lease.thread_id, v_lease.owner, v_lease.token, v_lease.expires_at, FALSE;
        RETURN;
    END IF;
    -- The thread lock, found through the run (a run never changes threads).
    SELECT * INTO v_thread FROM threads
    WHERE id = (SELECT r.thread_id FROM runs r WHERE r.id = p_run_id) FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % not found', p_run_id USING ERRCODE = 'no_data_found';
    END IF;
    -- After the lock: the run, the clock, the thread's admin lease and the run's lease.
    SELECT r.status, r.stop_requested, admin.expires_at, held.expires_at,
        held.resource_id IS NOT NULL, extract(epoch from clock_timestamp())::double precision
    INTO v_status, v_stop, v_admin, v_held, v_held_exists, v_now
    FROM runs r
    LEFT JOIN leases admin ON admin.kind = 'admin' AND admin.resource_id = r.thread_id
    LEFT JOIN leases held ON held.kind = 'run' AND held.resource_id = r.id
    WHERE r.id = p_run_id;
    -- run_leasable: not ended; a waiting run only to be finalised for a stop.
    IF v_status IN ('completed', 'failed', 'cancelled') OR (v_status = 'waiting' AND NOT v_stop)
    -- lease_free: no admin lease, or an expired one; likewise the run's own lease.
        OR (v_admin IS NOT NULL AND v_admin > v_now)
        OR (v_held IS NOT NULL AND v_held > v_now) THEN
        RETURN QUERY SELECT 'busy'::text, NULL::text, NULL::text, NULL::text, NULL::text,
            NULL::bigint, NULL::double precision, FALSE;
        RETURN;
    END IF;
    -- The grant: the next fencing token, the scope's turn, the lease.
    UPDATE fencing_counter SET value = value + 1 WHERE id = 1 RETURNING value INTO v_token;
    INSERT INTO scope_turns (scope, served_at) VALUES (v_thread.scope, v_now)
    ON CONFLICT (scope) DO UPDATE SET served_at = excluded.served_at;
    INSERT INTO leases AS l (kind, resource_id, thread_id, owner, token, expires_at)
    VALUES ('run', p_run_id, v_thread.id, p_owner, v_token, v_now + p_ttl)
    ON CONFLICT (kind, resource_id) DO UPDATE SET
        thread_id = excluded.thread_id, owner = excluded.owner, token = excluded.token,
        expires_at = excluded.expires_at
    RETURNING l.* INTO v_lease;
    RETURN QUERY SELECT 'granted'::text, v_lease.kind, v_lease.resource_id, v_lease.thread_id,
        v_lease.owner, v_lease.token, v_lease.expires_at, v_held_exists;
END
$$;
