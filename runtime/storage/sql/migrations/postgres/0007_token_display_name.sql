-- A token may carry a display name: what presence shows instead of its subject (issue 13).
ALTER TABLE api_tokens ADD COLUMN display_name TEXT;
