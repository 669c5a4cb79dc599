-- trioq schema, version 6: the payload CHECK agrees with trioq's one payload limit.
-- The limit is 1,000,000 bytes of compact JSON text (trioq/_core/codec.py, MAX_PAYLOAD_BYTES),
-- checked in Python before any SQL. The table can only measure the stored jsonb, which for the
-- same text is up to six times larger (an array of single-digit numbers: 4 bytes of entry
-- header plus 8 of aligned numeric per 2 characters of text), so the old 4,000,000-byte CHECK
-- refused payloads that trioq had accepted, aborting the caller's transaction. The new bound is
-- the jsonb size of the worst case at the limit (6 x 1,000,000 plus the container headers):
-- everything trioq accepts fits, and a raw INSERT is still bounded.
-- NOT VALID: every existing row passed the tighter old bound, so no table scan is needed.
ALTER TABLE {schema}.jobs DROP CONSTRAINT IF EXISTS jobs_payload_check;
ALTER TABLE {schema}.jobs ADD CONSTRAINT jobs_payload_check
    CHECK (pg_column_size(payload) <= 6000064) NOT VALID;
