-- A token's groups (a JSON list of names): what approval policies route by, as a JWT's
-- `groups` claim names them for OIDC callers. Tokens minted before carry none.
ALTER TABLE api_tokens ADD COLUMN groups TEXT NOT NULL DEFAULT '[]';
