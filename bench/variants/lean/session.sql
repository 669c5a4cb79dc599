-- The claim deletes its entries by address in the statement (no ready_ring_take() and its
-- SET clause): a plan made on the empty ring must not scan it.
SET enable_seqscan = off
