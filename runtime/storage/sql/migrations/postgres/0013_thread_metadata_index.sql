-- Threads found by their public metadata (`GET /v1/threads?metadata.owner=alice`): a GIN
-- index over the metadata as jsonb, which `metadata::jsonb @> '{"owner": "alice"}'` uses.
-- jsonb_path_ops: smaller and faster for containment, the only operator the list asks.
CREATE INDEX threads_metadata ON threads USING GIN ((metadata::jsonb) jsonb_path_ops);
