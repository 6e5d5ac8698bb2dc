-- When a token was last used (to the minute): what `threadline token list` shows (issue 28).
ALTER TABLE api_tokens ADD COLUMN last_used_at DOUBLE PRECISION;
