-- Every action id a message holds, pending or resolved (sql_actions.py): resolving an action
-- that is no longer in the thread's tail reads one indexed row instead of scanning the thread.
-- Written in the step commit that writes the message; deleted with the message.
CREATE TABLE message_actions (
    thread_id  TEXT NOT NULL,
    action_id  TEXT NOT NULL,
    message_id TEXT NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    PRIMARY KEY (thread_id, action_id)
);
CREATE INDEX message_actions_message ON message_actions (message_id);
INSERT OR IGNORE INTO message_actions (thread_id, action_id, message_id)
    SELECT m.thread_id, json_extract(p.value, '$.waiting.action_id'), m.id
    FROM messages m, json_each(m.parts) AS p
    WHERE m.parts LIKE '%"action_id"%'
      AND json_type(p.value, '$.waiting.action_id') = 'text';

-- When a worker last took a run of each scope (sql_runs.find_runnable_runs): of scopes whose
-- next run has the same turn, the one served longest ago goes first (round robin).
CREATE TABLE scope_turns (
    scope     TEXT PRIMARY KEY,
    served_at REAL NOT NULL
);
