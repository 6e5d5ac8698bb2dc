-- Durable timers, schedules and webhooks (issue 30; docs/operations.md, "Schedules" and
-- "Webhooks"). Timestamps are epoch seconds from the database clock, as everywhere.

-- Due work any worker may claim: a lease (owner, fencing token from fencing_counter, expiry by
-- the database clock) while it fires; firing is one transaction that checks the token. A kind
-- (a schedule's next fire, an approval deadline) names what to do; `ref` is its row.
CREATE TABLE timers (
    id          TEXT PRIMARY KEY,
    kind        TEXT NOT NULL,
    ref         TEXT NOT NULL,
    due_at      DOUBLE PRECISION NOT NULL,
    owner       TEXT,
    token       BIGINT,
    lease_until DOUBLE PRECISION,
    UNIQUE (kind, ref)
);
CREATE INDEX timers_due ON timers (due_at);

CREATE TABLE schedules (
    id            TEXT PRIMARY KEY,
    scope         TEXT NOT NULL,
    -- NULL with new_thread: every fire creates a thread of its own.
    thread_id     TEXT REFERENCES threads (id) ON DELETE CASCADE,
    new_thread    BOOLEAN NOT NULL,
    title         TEXT NOT NULL,
    cron          TEXT,
    timezone      TEXT NOT NULL,
    run_at        DOUBLE PRECISION,
    text          TEXT NOT NULL,
    policy        TEXT NOT NULL,
    missed        TEXT NOT NULL,
    misfire_grace DOUBLE PRECISION NOT NULL,
    status        TEXT NOT NULL,
    created_by    TEXT NOT NULL,
    next_fire_at  DOUBLE PRECISION,
    last_fire_at  DOUBLE PRECISION,
    created_at    DOUBLE PRECISION NOT NULL,
    updated_at    DOUBLE PRECISION NOT NULL
);
CREATE INDEX schedules_scope ON schedules (scope, created_at);

-- One row per fire time: the key that makes a fire an idempotent admission.
CREATE TABLE schedule_fires (
    schedule_id    TEXT NOT NULL REFERENCES schedules (id) ON DELETE CASCADE,
    fire_at        DOUBLE PRECISION NOT NULL,
    fired_at       DOUBLE PRECISION NOT NULL,
    outcome        TEXT NOT NULL,
    thread_id      TEXT,
    run_id         TEXT,
    queued_item_id TEXT,
    detail         TEXT,
    PRIMARY KEY (schedule_id, fire_at)
);

CREATE TABLE webhook_subscriptions (
    id         TEXT PRIMARY KEY,
    scope      TEXT NOT NULL,
    url        TEXT NOT NULL,
    -- ',run.completed,run.failed,': matched with a comma on each side.
    events     TEXT NOT NULL,
    secret     TEXT NOT NULL,
    enabled    BOOLEAN NOT NULL,
    created_by TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX webhook_subscriptions_scope ON webhook_subscriptions (scope);

-- The outbox: one row per (event, subscription), written by the transaction that made the
-- change (the triggers below, and actions_tx for action.resolved); its id is the webhook-id.
CREATE TABLE webhook_deliveries (
    id              TEXT PRIMARY KEY,
    subscription_id TEXT NOT NULL REFERENCES webhook_subscriptions (id) ON DELETE CASCADE,
    scope           TEXT NOT NULL,
    event_type      TEXT NOT NULL,
    thread_id       TEXT,
    run_id          TEXT,
    action_id       TEXT,
    message_id      TEXT,
    detail          TEXT,
    occurred_at     DOUBLE PRECISION NOT NULL,
    state           TEXT NOT NULL DEFAULT 'pending',
    attempts        BIGINT NOT NULL DEFAULT 0,
    next_attempt_at DOUBLE PRECISION NOT NULL,
    owner           TEXT,
    token           BIGINT,
    lease_until     DOUBLE PRECISION,
    last_status     BIGINT,
    last_error      TEXT,
    delivered_at    DOUBLE PRECISION,
    -- Where the retry age counts from (NULL: occurred_at); a redelivery restarts it.
    retry_from      DOUBLE PRECISION
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_subscription ON webhook_deliveries (subscription_id, occurred_at);

-- The delivery log: one row per attempt that got an answer or an error.
CREATE TABLE webhook_attempts (
    delivery_id TEXT NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
    attempt     BIGINT NOT NULL,
    started_at  DOUBLE PRECISION NOT NULL,
    status_code BIGINT,
    latency_ms  DOUBLE PRECISION,
    error       TEXT,
    owner       TEXT NOT NULL,
    PRIMARY KEY (delivery_id, attempt)
);

-- The events a change reports, inserted by the change's own statement: an event exists if
-- and only if its change committed, whichever code path (or database function) made it.
CREATE FUNCTION webhook_run_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_deliveries (id, subscription_id, scope, event_type, thread_id, run_id,
        action_id, message_id, detail, occurred_at, next_attempt_at)
    SELECT 'msg_' || replace(gen_random_uuid()::text, '-', ''), s.id, s.scope, CASE WHEN NEW.status = 'running' THEN 'run.started' ELSE 'run.' || NEW.status END, NEW.thread_id, NEW.id, NULL, NULL, NEW.error,
        extract(epoch from clock_timestamp())::double precision, extract(epoch from clock_timestamp())::double precision
    FROM webhook_subscriptions s JOIN threads t ON t.id = NEW.thread_id
    WHERE s.scope = t.scope AND s.enabled = TRUE AND position(',' || CASE WHEN NEW.status = 'running' THEN 'run.started' ELSE 'run.' || NEW.status END || ',' in s.events) > 0;
    RETURN NULL;
END
$$;
CREATE TRIGGER webhook_run_events AFTER UPDATE OF status ON runs FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status AND (NEW.status IN ('completed', 'failed', 'cancelled') OR (NEW.status = 'running' AND OLD.status = 'queued')))
    EXECUTE FUNCTION webhook_run_event();
CREATE FUNCTION webhook_message_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_deliveries (id, subscription_id, scope, event_type, thread_id, run_id,
        action_id, message_id, detail, occurred_at, next_attempt_at)
    SELECT 'msg_' || replace(gen_random_uuid()::text, '-', ''), s.id, s.scope, 'message.committed', NEW.thread_id, NEW.run_id, NULL, NEW.id, NEW.role,
        extract(epoch from clock_timestamp())::double precision, extract(epoch from clock_timestamp())::double precision
    FROM webhook_subscriptions s JOIN threads t ON t.id = NEW.thread_id
    WHERE s.scope = t.scope AND s.enabled = TRUE AND position(',' || 'message.committed' || ',' in s.events) > 0;
    RETURN NULL;
END
$$;
CREATE TRIGGER webhook_message_events AFTER INSERT ON messages FOR EACH ROW
    EXECUTE FUNCTION webhook_message_event();
CREATE FUNCTION webhook_action_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_deliveries (id, subscription_id, scope, event_type, thread_id, run_id,
        action_id, message_id, detail, occurred_at, next_attempt_at)
    SELECT 'msg_' || replace(gen_random_uuid()::text, '-', ''), s.id, s.scope, 'action.created', NEW.thread_id, (SELECT m.run_id FROM messages m WHERE m.id = NEW.message_id), NEW.action_id, NEW.message_id, NULL,
        extract(epoch from clock_timestamp())::double precision, extract(epoch from clock_timestamp())::double precision
    FROM webhook_subscriptions s JOIN threads t ON t.id = NEW.thread_id
    WHERE s.scope = t.scope AND s.enabled = TRUE AND position(',' || 'action.created' || ',' in s.events) > 0;
    RETURN NULL;
END
$$;
CREATE TRIGGER webhook_action_events AFTER INSERT ON message_actions FOR EACH ROW
    EXECUTE FUNCTION webhook_action_event();
