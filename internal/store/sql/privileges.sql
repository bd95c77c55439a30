-- The relay's own check of its grants (privileges.go; the root's grants.go),
-- before its first pass: docs/security.md lists what each part needs.

-- name: privileges @table @update
-- The role the session runs as, whether it may SELECT the table @table, and
-- which of the columns @update it may not UPDATE, in their order.
SELECT current_user::text, has_table_privilege(to_regclass(@table), 'SELECT'),
  coalesce((SELECT array_agg(u.c ORDER BY u.n) FROM unnest(@update::text[]) WITH ORDINALITY u(c, n)
    WHERE NOT has_column_privilege(to_regclass(@table), u.c, 'UPDATE')), '{}')
