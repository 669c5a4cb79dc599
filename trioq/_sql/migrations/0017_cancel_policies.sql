-- trioq schema, version 17: what cancelling a parent does to each child (`ctx.spawn(...,
-- on_parent_cancel=...)`), and `client.cancel(id, tree=True)`.
--
-- cancel  (the default, the behaviour before this version): the child is cancelled with it;
-- abandon: the child runs on, detached from the cancellation (its parent does not wait for it);
-- wait:    the child runs on, and the cancelled parent becomes final only after it.
-- A cancel with whole_tree = true cancels every descendant whatever its policy.
ALTER TABLE {schema}.jobs ADD COLUMN on_parent_cancel text NOT NULL DEFAULT 'cancel'
    CHECK (on_parent_cancel IN ('cancel', 'abandon', 'wait'));

-- job_cancel_tree(): its current body is trioq/_sql/functions/job_cancel_tree.sql.

-- job_cancel_tree(): its current body is trioq/_sql/functions/job_cancel_tree.sql.
