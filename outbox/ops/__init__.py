"""Operators' operations: report (`report`), health (`health`), requeues of dead rows and
retries of failed ones (`requeue`),
replay of one row (`replay`), reconcile of unqueued journal events (`reconcile`), cleanup
(`cleanup`). Schema migrations are `outbox.schema`; projection rebuilds
`outbox.projection.rebuild`.

Each function takes an executor first and returns a typed result (a dataclass whose fields,
in order, are the CLI's `--json` keys): the plain-data API for scripts and consoles. Nothing
here parses options, renders or prints (`outbox.cli` does), and nothing here holds SQL: the
statements live with their tables' owners.
"""
