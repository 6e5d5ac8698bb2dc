-- start_run: acquire_run_lease and start_episode in one statement, the statement's own
-- transaction (one round trip instead of four: the lease function, then BEGIN with the key
-- claim and the thread lock, the fence read, the start's writes with COMMIT). The grant is
-- threadline_acquire_run_lease's (0008), called first: it claims the key and takes the thread
-- lock, which this transaction then holds to its end. The start is sql_runs._start's: +1
-- episode; queued -> running (+1 thread version); another active status stays (a granted
-- lease means the run has not ended). Each statement of a VOLATILE function takes a new
-- snapshot under READ COMMITTED, so the reads after the grant see what the lock protects.
--
-- The key's row keeps the run as it was before the start (commit_keys.result): a retry after
-- an unknown outcome ('replayed') gets it back with the run and thread as they are now, so it
-- can tell how the episode began (runtime/episode.py, start_kind) as the first attempt could.
--
-- With p_thread_id naming the run's thread (as the caller's wakeup said), the thread's
-- messages from position p_history_from on are read too, after the start (the worker's cached
-- tail: runtime/history.py), in `messages`; NULL where they were not read.
--
-- outcome: 'granted' (the lease's columns, before_run, run, thread: the run before and after
-- the start and the thread after it, as JSON objects of their rows; messages: a JSON array of
-- message rows in position order), 'busy' (not leasable now; the lease columns and rows NULL),
-- 'replayed' (an earlier attempt of this call committed: as 'granted' if the lease it granted
-- this owner is still live, else as 'busy').
-- A run that does not exist raises SQLSTATE P0002 (no_data_found): nothing is written.
ALTER TABLE commit_keys ADD COLUMN result TEXT;

CREATE FUNCTION threadline_start_run(
    p_key TEXT, p_run_id TEXT, p_owner TEXT, p_ttl DOUBLE PRECISION,
    p_thread_id TEXT DEFAULT NULL, p_history_from BIGINT DEFAULT 0
) RETURNS TABLE (
    outcome TEXT, kind TEXT, resource_id TEXT, thread_id TEXT, owner TEXT, token BIGINT,
    expires_at DOUBLE PRECISION, taken_over BOOLEAN, before_run TEXT, run TEXT, thread TEXT,
    messages TEXT
) LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_grant RECORD;
    v_before runs%ROWTYPE;
    v_after runs%ROWTYPE;
    v_thread threads%ROWTYPE;
    v_before_json TEXT;
    v_messages TEXT;
    v_now DOUBLE PRECISION;
BEGIN
    SELECT * INTO v_grant FROM threadline_acquire_run_lease(p_key, p_run_id, p_owner, p_ttl);
    IF v_grant.token IS NULL THEN  -- busy, or replayed without a live lease for this owner
        RETURN QUERY SELECT 'busy'::text, NULL::text, NULL::text, NULL::text, NULL::text,
            NULL::bigint, NULL::double precision, FALSE, NULL::text, NULL::text, NULL::text,
            NULL::text;
        RETURN;
    END IF;
    IF v_grant.outcome = 'replayed' THEN
        SELECT k.result INTO v_before_json FROM commit_keys k WHERE k.key = p_key;
        SELECT * INTO v_after FROM runs r WHERE r.id = p_run_id;
        SELECT * INTO v_thread FROM threads t WHERE t.id = v_after.thread_id;
    ELSE
        -- Granted: the thread lock is held. The run as it is, then the start.
        SELECT * INTO v_before FROM runs r WHERE r.id = p_run_id;
        v_now := extract(epoch from clock_timestamp())::double precision;
        UPDATE runs r SET episode = r.episode + 1,
            status = CASE WHEN r.status = 'queued' THEN 'running' ELSE r.status END,
            updated_at = v_now
        WHERE r.id = p_run_id RETURNING r.* INTO v_after;
        IF v_after.status <> v_before.status THEN
            UPDATE threads t SET version = t.version + 1, updated_at = v_now
            WHERE t.id = v_after.thread_id RETURNING t.* INTO v_thread;
        ELSE
            SELECT * INTO v_thread FROM threads t WHERE t.id = v_after.thread_id;
        END IF;
        v_before_json := row_to_json(v_before)::text;
        UPDATE commit_keys k SET result = v_before_json WHERE k.key = p_key;
    END IF;
    IF p_thread_id IS NOT NULL AND p_thread_id = v_after.thread_id THEN
        SELECT COALESCE(json_agg(m ORDER BY m.position), '[]')::text INTO v_messages
        FROM messages m WHERE m.thread_id = p_thread_id AND m.position >= p_history_from;
    END IF;
    RETURN QUERY SELECT v_grant.outcome, v_grant.kind, v_grant.resource_id, v_grant.thread_id,
        v_grant.owner, v_grant.token, v_grant.expires_at, v_grant.taken_over, v_before_json,
        row_to_json(v_after)::text, row_to_json(v_thread)::text, v_messages;
END
$$;
