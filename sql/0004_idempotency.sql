-- Idempotency toolkit (DESIGN sections 3 and 8).
--
-- Append keys remember a fingerprint of the events they appended, so a retry with the same key
-- but different events is refused instead of answered with the first result. Keys written
-- before this migration have none and are honoured as before until they expire.
ALTER TABLE append_idempotency_keys
    ADD COLUMN fingerprint bytea;

-- Consumer claims keep where the message came from (forensic only: never part of the key).
ALTER TABLE consumer_claims
    ADD COLUMN source_topic     text,
    ADD COLUMN source_partition integer,
    ADD COLUMN source_offset    bigint;

COMMENT ON COLUMN consumer_claims.bucket IS
    'Monday (UTC) of the week holding event_time; the claim covers that week';
