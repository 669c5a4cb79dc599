-- What the Python producers refuse before any SQL (trioq/_core/codec.py), refused here for the
-- SQL entry points (enqueue, send, event_emit), with the same text: a value nested deeper than
-- 64 levels (a 3,000-deep array from SQL once stopped every worker that claimed its job), and
-- one whose compact JSON text is over 1,000,000 bytes. `root` names the value as the Python
-- error does ('$' for a job's payload, 'payload' for an event's or a message's).
--
-- Depth: an item at level 65 (the value itself is level 0) is what codec.MAX_DEPTH refuses;
-- the jsonpath walk stops at that level, and at the first such item.
-- Size: PostgreSQL writes ', ' and ': ' where compact JSON has ',' and ':'. The rendered text
-- is measured first (at most the compact size plus one byte per separator, so a value under
-- the limit there is under it compacted); only a longer one is measured again without the
-- separators' spaces (every space outside a string is one; numbers are counted as PostgreSQL
-- writes them, which can be longer than Python's exponent form: such a value at the very limit
-- may be refused here and not there).
CREATE OR REPLACE FUNCTION {schema}.payload_check(value jsonb, root text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    rendered text;
    outside_strings text;
    compact bigint;
BEGIN
    IF jsonb_path_exists(value, 'strict $.**{65}') THEN
        RAISE EXCEPTION 'payload %: nested deeper than 64 levels', root
            USING ERRCODE = '22023';
    END IF;
    rendered := value::text;
    IF octet_length(rendered) <= 1000000 THEN
        RETURN;
    END IF;
    outside_strings := regexp_replace(rendered, '"([^"\\]|\\.)*"', '', 'g');
    compact := octet_length(rendered)
               - (length(outside_strings) - length(replace(outside_strings, ' ', '')));
    IF compact > 1000000 THEN
        RAISE EXCEPTION 'payload %: encodes to % bytes, more than the limit of 1000000',
            root, compact USING ERRCODE = '22023';
    END IF;
END
$$;
