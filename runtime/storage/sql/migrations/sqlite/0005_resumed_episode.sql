-- The run's episode count when it was last resumed from waiting: an episode that finds the run
-- running with a higher count follows one that died (a takeover), even of a resuming run.
ALTER TABLE runs ADD COLUMN resumed_episode BIGINT NOT NULL DEFAULT 0;
