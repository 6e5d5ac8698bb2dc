-- Tokens may expire, and may be revoked; both refuse the token from then on (issue 10).
ALTER TABLE api_tokens ADD COLUMN expires_at DOUBLE PRECISION;
ALTER TABLE api_tokens ADD COLUMN revoked_at DOUBLE PRECISION;
