-- Worker groups (S35): each recorded projector is served by one group of workers. `default`
-- claims the work rows (every projector recorded before groups is there); a projector of any
-- other group has a queue of its own, its holds (S24): the append writes one on a campaign
-- that has none, at the first event it owes, and the group's workers claim them, so that a
-- projector served by a Python group and one served by a SQL group each apply at their own
-- pace, neither waiting for the other.
--
-- Run under the previous release's processes (a rolling upgrade): the two tables are locked
-- first, in the order a worker's batch takes them (its claim reads the holds, its settle reads
-- the record and then writes holds), so that no batch holds one while waiting for the other.
LOCK TABLE projection_holds IN ACCESS EXCLUSIVE MODE;
LOCK TABLE outbox_projectors IN ACCESS EXCLUSIVE MODE;

ALTER TABLE outbox_projectors ADD COLUMN group_name text NOT NULL DEFAULT 'default';

-- The append's look for projectors served outside the default group: an empty index range
-- in an install without groups.
CREATE INDEX outbox_projectors_grouped_idx ON outbox_projectors (projector)
    WHERE group_name <> 'default';

-- A group's claim: its projectors' holds that are due, oldest first.
CREATE INDEX projection_holds_due_idx ON projection_holds (projector, next_attempt_at)
    WHERE status <> 'dead';

-- A group's hold stands at seq 0, as a catch-up hold does (never at a work row's seq: the
-- default group's rows are not its), and says at which event in `from_seq`: the first it owes
-- (where a projector that starts now begins on a campaign it has no checkpoint on), or the one
-- it failed on.
ALTER TABLE projection_holds ADD COLUMN from_seq bigint;
