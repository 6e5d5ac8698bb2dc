-- Thread retention (docs/operations.md, "Thread retention"): the job reads the oldest threads
-- of every scope, which threads_scope_updated (scope first) cannot serve without a scan.
CREATE INDEX threads_updated ON threads (updated_at, id);
