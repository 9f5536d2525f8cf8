-- SQL projectors (`sql_projectors.py`): the calls of the application's functions, through the
-- server functions of `sql_projectors_fn.sql`, and the check that they exist.

-- name: apply_sql_projector
-- SQL projector $1 (`schema.fn(jsonb)`) on the events at keys ($2[i], $3[i]), upcast by the
-- SQL upcasters $4 ({type: {from version: function}}; null: none).
SELECT @extschema@.outbox_run_sql_projector(
    CAST(CAST($1 AS text) AS regprocedure), CAST($2 AS text[]), CAST($3 AS bigint[]),
    CAST($4 AS jsonb))

-- name: apply_sql_hook
-- A SQL projector's hook $1: a reset (`schema.fn(text)`) on campaign $2, or a drop
-- (`schema.fn()`) when $2 is NULL.
SELECT @extschema@.outbox_run_sql_hook(CAST(CAST($1 AS text) AS regprocedure), CAST($2 AS text))

-- name: list_missing_functions
-- Of the signatures $1 (`schema.fn(jsonb)`, ...), those no function of this database has
-- (procedures and aggregates are not functions a projector can be).
SELECT s.signature
FROM unnest($1::text[]) AS s(signature)
WHERE NOT EXISTS (
    SELECT 1 FROM pg_proc p
    WHERE p.oid = to_regprocedure(s.signature) AND p.prokind = 'f'
)
ORDER BY s.signature
