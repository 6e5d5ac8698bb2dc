-- The W3C `traceparent` of the request that started a run (runs) or queued its input
-- (queued_items, copied to the run when it is admitted), stored with the enqueue: the episode
-- span links to it whichever path a worker takes the run by (a wakeup, a poll, a takeover).
-- NULL where no sampled trace was current.
ALTER TABLE runs ADD COLUMN traceparent TEXT;
ALTER TABLE queued_items ADD COLUMN traceparent TEXT;
