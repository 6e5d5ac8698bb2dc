-- +1 on every history rewrite (regenerate, retry, visibility): the only changes to messages
-- other than appends and tail updates. A reader that cached a thread's parsed messages keeps
-- every one before the tail while the epoch stays the same (runtime/history.py).
ALTER TABLE threads ADD COLUMN history_epoch BIGINT NOT NULL DEFAULT 0;
